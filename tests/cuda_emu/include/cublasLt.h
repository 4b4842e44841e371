/* cublasLt.h (CUDA emulator) - the subset of cuBLASLt act-engine calls (kernels/gemm.cu),
 * implemented on the host by tests/cuda_emu/emu_blaslt.cc.
 * Signatures, struct layouts and enum values are those of the real CUDA 13 cublasLt.h, so the
 * plugin compiles against either header unchanged. Only the attributes gemm.cu sets exist
 * here; the emulator answers any other attribute with CUBLAS_STATUS_INVALID_VALUE. */
#ifndef EMU_CUBLASLT_H
#define EMU_CUBLASLT_H

#include <stddef.h>
#include <stdint.h>
#include "cublas_v2.h"

/* the real library_types.h names the enum both ways; cublasLtMatrixLayoutCreate uses this one */
typedef cudaDataType_t cudaDataType;

typedef struct cublasLtContext *cublasLtHandle_t;

typedef struct { uint64_t data[8]; } cublasLtMatrixLayoutOpaque_t;
typedef cublasLtMatrixLayoutOpaque_t *cublasLtMatrixLayout_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct { uint64_t data[32]; } cublasLtMatmulDescOpaque_t;
typedef cublasLtMatmulDescOpaque_t *cublasLtMatmulDesc_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulPreferenceOpaque_t;
typedef cublasLtMatmulPreferenceOpaque_t *cublasLtMatmulPreference_t;

typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,         /* int32_t (cublasOperation_t) */
    CUBLASLT_MATMUL_DESC_TRANSB = 4,         /* int32_t (cublasOperation_t) */
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,       /* uint32_t (cublasLtEpilogue_t) */
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,   /* const void * */
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26 /* int32_t (cudaDataType), default -1: D's type */
} cublasLtMatmulDescAttributes_t;

typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_RELU = 2,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_RELU_BIAS = (CUBLASLT_EPILOGUE_RELU | CUBLASLT_EPILOGUE_BIAS),
    CUBLASLT_EPILOGUE_GELU = 32,
    CUBLASLT_EPILOGUE_GELU_BIAS = (CUBLASLT_EPILOGUE_GELU | CUBLASLT_EPILOGUE_BIAS)
} cublasLtEpilogue_t;

/* how split-K partial sums are reduced (the emulated algorithms never split K) */
typedef enum {
    CUBLASLT_REDUCTION_SCHEME_NONE = 0,
    CUBLASLT_REDUCTION_SCHEME_INPLACE = 1,
    CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE = 2,
    CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE = 4,
    CUBLASLT_REDUCTION_SCHEME_MASK = 7
} cublasLtReductionScheme_t;

typedef enum {
    CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,           /* uint32_t */
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,   /* uint64_t, default 0 */
    CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3, /* uint32_t, default all schemes */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5, /* uint32_t, default 256 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
} cublasLtMatmulPreferenceAttributes_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

#ifdef __cplusplus
extern "C" {
#endif
cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
const char *cublasLtGetStatusString(cublasStatus_t status);
size_t cublasLtGetVersion(void);

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType,
                                        cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
/* sizeInBytes must be the attribute's size (see the enum), as the real library checks */
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes);

/* runs nothing on the device; results are written to heuristicResultsArray[0..*returnAlgoCount) */
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                              cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc,
                                              cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc,
                                              cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference,
                                              int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount);

/* D = epilogue(alpha op(A) op(B) + beta C); alpha and beta are host floats read at the call */
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream);
#ifdef __cplusplus
}
#endif

#endif
