/* cpu_gemm.c - the one matrix product of the CPU backend (convolutions and linears).
 * defines: act_cpu_sgemm, act_cpu_blas_init
 *
 * With OpenBLAS (ACT_WITH_BLAS) it is cblas_sgemm, which threads over the machine's cores.
 * A DYNAMIC_ARCH OpenBLAS picks its kernels from the CPU model number; a model newer than the
 * library (Debian 12's 0.3.21 on Emerald Rapids) falls back to the SSE3 "Prescott" kernels, 3-4x
 * slower than its AVX2/AVX-512 ones. act_cpu_blas_init repairs that the way OpenBLAS documents
 * (OPENBLAS_CORETYPE), re-running OpenBLAS's own core selection, and only when the user has not
 * chosen a core and the CPU has the instructions the chosen kernels need.
 * Built without a BLAS: a cache-blocked triple loop: slow but exact enough (fp32 accumulation in the same
 * order for every element), so a machine without a BLAS still runs and passes the tests. */
#define _POSIX_C_SOURCE 200809L   /* setenv, strcasecmp */
#include "cpu_ops.h"

#ifdef ACT_WITH_BLAS
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

/* OpenBLAS's DYNAMIC_ARCH entry points; weak, so any other BLAS links too (and is left alone) */
char *openblas_get_corename(void) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));

static char g_core[64] = "OpenBLAS";
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void blas_init_once(void) {
    if (!openblas_get_corename) return;
    const char *core = openblas_get_corename();
    static const char *const pre_avx2[] = {"prescott", "core2", "penryn", "dunnington", "nehalem",
                                           "sandybridge", "atom", "katmai", "northwood", "banias"};
    int old = 0;
    for (size_t i = 0; i < sizeof pre_avx2 / sizeof pre_avx2[0]; i++)
        old |= !strcasecmp(core, pre_avx2[i]);
#if defined(__x86_64__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
    int avx2 = 0, avx512 = 0;   /* the x86 core names above never match elsewhere */
#endif
    if (old && avx2 && !getenv("OPENBLAS_CORETYPE") && gotoblas_dynamic_init && gotoblas_dynamic_quit) {
        setenv("OPENBLAS_CORETYPE", avx512 ? "SkylakeX" : "Haswell", 1);
        gotoblas_dynamic_quit();
        gotoblas_dynamic_init();
        core = openblas_get_corename();
    }
    snprintf(g_core, sizeof g_core, "OpenBLAS %s", core);
}

const char *act_cpu_blas_init(void) {
    pthread_once(&g_once, blas_init_once);
    return g_core;
}

void act_cpu_sgemm(int trans_b, int M, int N, int K, const float *A, int lda, const float *B,
                   int ldb, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, 1.0f,
                A, lda, B, ldb, 0.0f, C, ldc);
}

static int blas_threads(void) { return openblas_get_num_threads ? openblas_get_num_threads() : 0; }

#else

const char *act_cpu_blas_init(void) { return "built-in GEMM"; }
static int blas_threads(void) { return 0; }

enum { BLK_M = 64, BLK_N = 256, BLK_K = 256 };

void act_cpu_sgemm(int trans_b, int M, int N, int K, const float *A, int lda, const float *B,
                   int ldb, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += BLK_K) {
        int k1 = k0 + BLK_K < K ? k0 + BLK_K : K;
        for (int i0 = 0; i0 < M; i0 += BLK_M) {
            int i1 = i0 + BLK_M < M ? i0 + BLK_M : M;
            for (int j0 = 0; j0 < N; j0 += BLK_N) {
                int j1 = j0 + BLK_N < N ? j0 + BLK_N : N;
                for (int i = i0; i < i1; i++) {
                    float *c = C + (size_t)i * ldc;
                    for (int k = k0; k < k1; k++) {
                        float a = A[(size_t)i * lda + k];
                        if (trans_b) {
                            for (int j = j0; j < j1; j++) c[j] += a * B[(size_t)j * ldb + k];
                        } else {
                            const float *b = B + (size_t)k * ldb;
                            for (int j = j0; j < j1; j++) c[j] += a * b[j];
                        }
                    }
                }
            }
        }
    }
}

#endif

int act_cpu_threads(void) {
    int blas = blas_threads();
    return act_pool_env_threads("ACT_CPU_THREADS", blas > 0 ? blas : act_pool_cores());
}
