/* emu_blas.cc (CUDA emulator) - cuBLAS's handle calls and cublasGemmEx on the host.
 *
 * Arguments are checked at the call, as the real library does before it launches anything:
 * bad dimensions give INVALID_VALUE, type combinations cuBLAS has no kernel for give
 * NOT_SUPPORTED, and an operand outside device memory is a fault (on a GPU the kernel would
 * read a host address). The product itself is queued on the handle's stream with emu_enqueue,
 * so it runs in stream order and is recorded when the stream is being captured into a graph;
 * the operands and the workspace are re-checked at every run (a replay after a free faults).
 *
 * Numerics: operands are widened to fp32 - after rounding fp32 operands to TF32 (or fp16/bf16
 * for the FAST_16F/16BF compute types) the way tensor cores read them - and multiplied with
 * OpenBLAS sgemm. A product of two values with at most 11 significant bits is exact in fp32,
 * so this matches an fp32-accumulating tensor-core GEMM up to summation order. */
#include <cblas.h>
#include <stdint.h>
#include <stdlib.h>
#include <vector>
#include "cublas_v2.h"
#include "emu_internal.h"

struct emu_blas_handle {
    cudaStream_t stream;
    void *ws;
    size_t ws_bytes;
    cublasMath_t math;
};

static size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

static int is_data_type(cudaDataType_t t) {
    return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF;
}

/* bytes spanned by a rows x cols column-major matrix with leading dimension ld */
static size_t extent(int rows, int cols, int ld, cudaDataType_t t) {
    if (rows == 0 || cols == 0) return 0;
    return ((size_t)(cols - 1) * ld + rows) * type_size(t);
}

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = (cublasHandle_t)calloc(1, sizeof(emu_blas_handle));
    return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((uintptr_t)workspace % 256 != 0 || (!workspace && bytes > 0))
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->ws = workspace;
    handle->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    /* the reduction flag may be or-ed in; the emulated GEMMs never split K, so it changes nothing */
    int base = mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base < CUBLAS_DEFAULT_MATH || base > CUBLAS_TF32_TENSOR_OP_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->math = (cublasMath_t)base;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
    (void)algo; /* every algorithm computes the same product; only speed would differ */
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (transa < CUBLAS_OP_N || transa > CUBLAS_OP_C || transb < CUBLAS_OP_N ||
        transb > CUBLAS_OP_C || m < 0 || n < 0 || k < 0 || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* A and B as stored: op N keeps the shape, T and C (real data: same as T) swap it */
    int ar = transa == CUBLAS_OP_N ? m : k, ac = transa == CUBLAS_OP_N ? k : m;
    int br = transb == CUBLAS_OP_N ? k : n, bc = transb == CUBLAS_OP_N ? n : k;
    if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!is_data_type(Atype) || Btype != Atype || (Ctype != Atype && Ctype != CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    emu_rounding rnd = EMU_ROUND_NONE;
    switch (computeType) {
    case CUBLAS_COMPUTE_32F:
        if (handle->math == CUBLAS_TF32_TENSOR_OP_MATH) rnd = EMU_ROUND_TF32;
        break;
    case CUBLAS_COMPUTE_32F_PEDANTIC: break;
    case CUBLAS_COMPUTE_32F_FAST_TF32: rnd = EMU_ROUND_TF32; break;
    case CUBLAS_COMPUTE_32F_FAST_16F: rnd = EMU_ROUND_F16; break;
    case CUBLAS_COMPUTE_32F_FAST_16BF: rnd = EMU_ROUND_BF16; break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (Atype != CUDA_R_32F) rnd = EMU_ROUND_NONE; /* 16-bit operands are exact in any of them */
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    int kk = k > 0;
    const char *call = "cublasGemmEx";
    emu_operands used;
    if (!emu_on_device(call, "operand A", A, kk ? extent(ar, ac, lda, Atype) : 0, &used) ||
        !emu_on_device(call, "operand B", B, kk ? extent(br, bc, ldb, Btype) : 0, &used) ||
        !emu_on_device(call, "operand C", C, extent(m, n, ldc, Ctype), &used) ||
        !emu_on_device(call, "the workspace", handle->ws, handle->ws_bytes, &used))
        return CUBLAS_STATUS_EXECUTION_FAILED;

    const float al = *(const float *)alpha, be = *(const float *)beta;
    auto op = [=]() {
        /* fp32 C is updated in place by sgemm; 16-bit C goes through an fp32 copy */
        std::vector<float> c32;
        float *c = (float *)C;
        int cld = ldc;
        if (Ctype != CUDA_R_32F) {
            c32 = be != 0.0f ? emu_widen(C, Ctype, m, n, ldc, EMU_ROUND_NONE)
                             : std::vector<float>((size_t)m * n, 0.0f);
            c = c32.data();
            cld = m;
        }
        if (k == 0) {
            /* C = beta C; beta 0 writes zeros without reading C (NaN there does not survive) */
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++)
                    c[(size_t)j * cld + i] = be != 0.0f ? be * c[(size_t)j * cld + i] : 0.0f;
        } else {
            std::vector<float> a32, b32;
            const float *a = (const float *)A, *b = (const float *)B;
            int alda = lda, bldb = ldb;
            if (Atype != CUDA_R_32F || rnd != EMU_ROUND_NONE) {
                a32 = emu_widen(A, Atype, ar, ac, lda, rnd);
                b32 = emu_widen(B, Btype, br, bc, ldb, rnd);
                a = a32.data();
                b = b32.data();
                alda = ar;
                bldb = br;
            }
            cblas_sgemm(CblasColMajor, transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                        transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, al, a, alda,
                        b, bldb, be, c, cld);
        }
        if (Ctype != CUDA_R_32F)
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++)
                    emu_store(C, Ctype, (size_t)j * ldc + i, c32[(size_t)j * m + i]);
    };
    return emu_enqueue(handle->stream, call, op, std::move(used)) == cudaSuccess
               ? CUBLAS_STATUS_SUCCESS
               : CUBLAS_STATUS_EXECUTION_FAILED;
}

const char *cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

}
