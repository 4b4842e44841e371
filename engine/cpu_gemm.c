/* cpu_gemm.c - the one matrix product of the CPU backend (convolutions and linears).
 * defines: act_cpu_sgemm, act_cpu_sgemm_split, act_cpu_gemm_split_on, act_cpu_blas_init,
 *          act_cpu_threads, act_cpu_spin_us
 *
 * With OpenBLAS (ACT_WITH_BLAS) it is cblas_sgemm. The backend threads the products itself
 * (act_cpu_sgemm_split: rows or columns over its pool; the Winograd convs: their independent
 * products): act_cpu_blas_init turns OpenBLAS to one thread, because its idle workers spin
 * (sched_yield) for a while after every product and took a core from the backend's own loops
 * (15-20% of a 2-core step's samples in the scheduler, and steps that ran 2x slower at random).
 * ACT_CPU_SPLIT_GEMM=0 leaves OpenBLAS's threading on instead (the behaviour before).
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
void openblas_set_num_threads(int) __attribute__((weak));
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));

static char g_core[64] = "OpenBLAS";
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_blas_threads;   /* OpenBLAS's thread count at start (0: not OpenBLAS) */
static int g_split;          /* the backend threads the products; OpenBLAS runs on one thread */
static int g_blas_asked;     /* its count came from OPENBLAS_/GOTO_/OMP_NUM_THREADS */

/* OpenBLAS's threads off when the backend splits the products; another BLAS (no
 * openblas_set_num_threads) keeps its own threading */
/* a thread count asked of OpenBLAS by name (it reads these three at start) */
/* read as OpenBLAS reads them (atoi; 0, negative or not a number counts as unset): a value it
 * ignores (OPENBLAS_NUM_THREADS=0, OMP_NUM_THREADS=abc) asked for nothing, so the cgroup quota
 * still holds its default count down */
static int blas_threads_asked(void) {
    static const char *const vars[] = {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *e = getenv(vars[i]);
        if (e && atoi(e) > 0) return 1;
    }
    return 0;
}

static void threads_init(void) {
    g_blas_threads = openblas_get_num_threads ? openblas_get_num_threads() : 0;
    g_blas_asked = blas_threads_asked();
    g_split = act_cpu_switch_on("ACT_CPU_SPLIT_GEMM") && openblas_set_num_threads;
    if (g_split) openblas_set_num_threads(1);
    /* threading its own GEMMs, OpenBLAS by default counts the affinity mask's CPUs but not a
     * cgroup quota: held to the usable cores, as the backend's pool is (act_cpu_threads); a
     * count asked for by name stays */
    else if (openblas_set_num_threads && !g_blas_asked && g_blas_threads > act_pool_cores())
        openblas_set_num_threads(act_pool_cores());
}

static void blas_init_once(void) {
    threads_init();
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

static int blas_threads(void) {
    act_cpu_blas_init();
    return g_blas_threads;
}

int act_cpu_gemm_split_on(void) {
    act_cpu_blas_init();
    return g_split;
}

int act_cpu_blas_is_openblas(void) { return openblas_get_num_threads != NULL; }

int act_cpu_blas_threads_now(void) {
    act_cpu_blas_init();
    return openblas_get_num_threads ? openblas_get_num_threads() : 0;
}

#else

const char *act_cpu_blas_init(void) { return "built-in GEMM"; }
static int blas_threads(void) { return 0; }
static int g_split = -1;
int act_cpu_gemm_split_on(void) {
    if (g_split < 0) g_split = act_cpu_switch_on("ACT_CPU_SPLIT_GEMM");   /* read once, as with OpenBLAS */
    return g_split;
}
int act_cpu_blas_is_openblas(void) { return 0; }
int act_cpu_blas_threads_now(void) { return 0; }

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

/* Products smaller than this run on the calling thread: waking the pool costs more. */
#define SPLIT_MIN_FLOP (1 << 21)
/* Rows or columns per piece: whole register blocks of the GEMM kernels. */
#define SPLIT_STEP 16

typedef struct split_job {
    int trans_b, M, N, K, lda, ldb, ldc, by_rows;
    const float *A, *B;
    float *C;
} split_job;

/* pieces [lo, hi) of SPLIT_STEP rows (by_rows) or columns of C */
static void split_task(void *arg, int t, int lo, int hi) {
    const split_job *q = arg;
    int dim = q->by_rows ? q->M : q->N, a = lo * SPLIT_STEP, b = hi * SPLIT_STEP;
    if (b > dim) b = dim;
    if (a >= b) return;
    if (q->by_rows)
        act_cpu_sgemm(q->trans_b, b - a, q->N, q->K, q->A + (size_t)a * q->lda, q->lda, q->B, q->ldb,
                      q->C + (size_t)a * q->ldc, q->ldc);
    else
        act_cpu_sgemm(q->trans_b, q->M, b - a, q->K, q->A, q->lda,
                      q->trans_b ? q->B + (size_t)a * q->ldb : q->B + a, q->ldb, q->C + a, q->ldc);
}

/* Each thread computes a block of C's rows or columns with a one-thread product. Splitting the
 * rows makes every thread pack all of B, the columns all of A: the larger side is split, so the
 * operand packed twice is the smaller. */
void act_cpu_sgemm_split(act_pool *pool, int trans_b, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc) {
    int by_rows = M >= N, dim = by_rows ? M : N, pieces = (dim + SPLIT_STEP - 1) / SPLIT_STEP;
    if (!act_cpu_gemm_split_on() || act_pool_threads(pool) < 2 || pieces < 2 ||
        2.0 * M * N * K < SPLIT_MIN_FLOP) {
        act_cpu_sgemm(trans_b, M, N, K, A, lda, B, ldb, C, ldc);
        return;
    }
    split_job q = {trans_b, M, N, K, lda, ldb, ldc, by_rows, A, B, C};
    act_pool_run(pool, split_task, &q, pieces);
}

long act_cpu_spin_us(void) {
    const char *e = getenv("ACT_POOL_SPIN_US");
    char *end;
    /* with OpenBLAS threading the GEMMs, its workers need the cores between loops: no spin */
    long dflt = act_cpu_gemm_split_on() ? 100 : 0;
    long us = e && *e ? strtol(e, &end, 10) : dflt;
    if (e && *e && (*end || us < 0 || us > 10000)) {
        act_env_ignored("ACT_POOL_SPIN_US", e, "0..10000 microseconds");
        return dflt;
    }
    return us;
}

/* OpenBLAS's own count when one was asked for by name (OPENBLAS_NUM_THREADS and the like), else
 * the smaller of its default (the affinity mask's CPUs; it does not read a cgroup quota) and the
 * usable cores (pool.h) */
int act_cpu_threads(void) {
    int blas = blas_threads(), cores = act_pool_cores();
    int n = blas <= 0 ? cores : g_blas_asked || blas < cores ? blas : cores;
    return act_pool_env_threads("ACT_CPU_THREADS", n);
}
