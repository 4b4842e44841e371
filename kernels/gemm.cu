/* gemm.cu - row-major Y = X W^T is column-major Y^T = W X^T: cuBLAS sees W (stored [out][in]
 * row-major = [in][out] column-major) transposed, X untransposed, and writes Y^T column-major,
 * which is Y row-major. No copies, no transposes.
 * Precision: fp32 parity mode uses CUBLAS_COMPUTE_32F_PEDANTIC (no TF32, no reduced-precision
 * reductions); tf32 uses CUBLAS_COMPUTE_32F_FAST_TF32; bf16/fp16 inputs use fp32 accumulation
 * (CUBLAS_COMPUTE_32F). The bias/activation epilogue is our own kernel (elementwise.cu):
 * cuBLASLt's GELU epilogue is the tanh approximation, and the model needs exact erf GELU. */
#include "gemm.cuh"
#include <library_types.h>

static cudaDataType_t cuda_type(int dt) {
    return dt == KDT_BF16 ? CUDA_R_16BF : dt == KDT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

int act_k_linear(cublasHandle_t h, const void *W, int wdt, const void *x, int xdt, void *y,
                 int ydt, int M, int out, int in, int tf32, char *err, size_t errlen) {
    if (wdt != xdt || (ydt != xdt && ydt != KDT_F32)) {
        snprintf(err, errlen, "linear: unsupported dtypes weight %d, input %d, output %d",
                 wdt, xdt, ydt);
        return -1;
    }
    if (M == 0) return 0;
    const float alpha = 1.0f, beta = 0.0f;
    cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
    if (wdt == KDT_F32) ct = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC;
    KCUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, M, in, &alpha, W, cuda_type(wdt), in,
                         x, cuda_type(xdt), in, &beta, y, cuda_type(ydt), out, ct,
                         CUBLAS_GEMM_DEFAULT));
    return 0;
}
