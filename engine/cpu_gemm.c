/* cpu_gemm.c - the one matrix product of the CPU backend (convolutions and linears).
 * defines: act_cpu_sgemm
 *
 * With OpenBLAS (ACT_WITH_BLAS) it is cblas_sgemm, which threads over the machine's cores.
 * Without it, a cache-blocked triple loop: slow but exact enough (fp32 accumulation in the same
 * order for every element), so a machine without a BLAS still runs and passes the tests. */
#include "cpu_ops.h"

#ifdef ACT_WITH_BLAS
#include <cblas.h>

void act_cpu_sgemm(int trans_b, int M, int N, int K, const float *A, int lda, const float *B,
                   int ldb, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, 1.0f,
                A, lda, B, ldb, 0.0f, C, ldc);
}

#else

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
