/* cublas_v2.h (CUDA emulator) - the subset of cuBLAS act-engine calls (kernels/gemm.cu,
 * engine/backend_cuda.c), implemented on the host by tests/cuda_emu/emu_blas.cc.
 * Enum values are those of the real cuBLAS 12/13 headers, so code that prints or stores them
 * behaves the same. The real header maps cublasCreate & co. to *_v2 symbols; nothing here
 * depends on that, so the plain names are the symbols. */
#ifndef EMU_CUBLAS_V2_H
#define EMU_CUBLAS_V2_H

#include <stddef.h>
#include "cuda_runtime.h"
#include "library_types.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;

typedef struct emu_blas_handle *cublasHandle_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;

typedef enum {
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_TENSOR_OP_MATH = 1,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
    /* a flag or-ed into any of the above: split-K partial sums stay in the compute type */
    CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
} cublasMath_t;

typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_16F_PEDANTIC = 65,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77
} cublasComputeType_t;

typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

#ifdef __cplusplus
extern "C" {
#endif
cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
/* workspace must be 256-byte aligned, as the real library requires; it is range-checked
 * against device memory at each GEMM, not here (the real library never reads it here either) */
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
/* column-major C = alpha op(A) op(B) + beta C; alpha and beta are host floats read at the call */
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
const char *cublasGetStatusString(cublasStatus_t status);
#ifdef __cplusplus
}
#endif

#endif
