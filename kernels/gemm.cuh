/* gemm.cuh - the linear layers through cuBLAS. defines: act_k_linear, KCUBLAS */
#ifndef ACT_KERNELS_GEMM_CUH
#define ACT_KERNELS_GEMM_CUH
#include "common.cuh"
#include <cublas_v2.h>
#ifdef __cplusplus
extern "C" {
#endif

#define KCUBLAS(call) do { cublasStatus_t s_ = (call); \
    if (s_ != CUBLAS_STATUS_SUCCESS) return act_kerr(err, errlen, __FILE__, __LINE__, #call, cublasGetStatusString(s_)); \
} while (0)

/* y[M][out] = x[M][in] W^T with W [out][in] row-major (no bias: the epilogue adds it).
 * wdt == xdt (F32, BF16 or F16); ydt is xdt or F32; tf32 = 1 allows TF32 for F32 data.
 * Accumulation is fp32 in every case. */
int act_k_linear(cublasHandle_t h, const void *W, int wdt, const void *x, int xdt, void *y,
                 int ydt, int M, int out, int in, int tf32, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
