/* gemm.cu - row-major Y = X W^T is column-major Y^T = W X^T: cuBLAS sees W (stored [out][in]
 * row-major = [in][out] column-major) transposed, X untransposed, and writes Y^T column-major,
 * which is Y row-major. No copies, no transposes.
 * Precision: fp32 parity mode uses CUBLAS_COMPUTE_32F_PEDANTIC (no TF32, no reduced-precision
 * reductions); tf32 uses CUBLAS_COMPUTE_32F_FAST_TF32; bf16/fp16 inputs use fp32 accumulation
 * (CUBLAS_COMPUTE_32F), split-K partial sums included (cuBLAS: the backend's math mode has
 * CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION; cuBLASLt: the reduction scheme mask below).
 *
 * Two paths. act_k_linear is cublasGemmEx, and the bias/activation is our own kernel
 * (elementwise.cu). The act_k_lt_* path is cublasLtMatmul with CUBLASLT_EPILOGUE_BIAS,
 * RELU_BIAS or GELU_BIAS: one graph node instead of two per linear. The bias is fp32
 * (BIAS_DATA_TYPE CUDA_R_32F, also under bf16/fp16 outputs), added to the fp32 accumulator
 * before the one rounding to the output type; where cuBLASLt refuses that beside a 16-bit
 * output (cublasLt.h documents only the output's type there), the caller plans again with the
 * bias in the output's type (full model on the emulator: bf16 parity 8.29e-3 -> 8.39e-3, fp16
 * 1.18e-3 -> 1.17e-3: a linear's bias is small beside its output).
 * cuBLASLt's GELU is the tanh approximation; the
 * model's is exact erf, so the caller asks for it only where the output's rounding hides the
 * difference (bf16/fp16).
 *
 * A plan holds the descriptors and the heuristic's algorithms (up to KLT_CANDIDATES, best
 * first: the runs take the first unless gemm_tune.cu measured another faster). The heuristic is
 * told the real alignment of every operand (the default assumption is 256 bytes, which a row
 * slice of a packed weight or an offset activation need not have), and the bias pointer itself
 * (the heuristic reads its alignment from it); a run checks its pointers are no less aligned. */
#include "gemm_plan.cuh"
#include <stdint.h>
#include <stdlib.h>
#include <library_types.h>

static cudaDataType_t cuda_type(int dt) {
    return dt == KDT_BF16 ? CUDA_R_16BF : dt == KDT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static cublasComputeType_t compute_type(int wdt, int tf32) {
    if (wdt != KDT_F32) return CUBLAS_COMPUTE_32F;
    return tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC;
}

static int check_dtypes(int wdt, int xdt, int ydt, char *err, size_t errlen) {
    if (wdt == xdt && (ydt == xdt || ydt == KDT_F32)) return 0;
    snprintf(err, errlen, "linear: unsupported dtypes weight %d, input %d, output %d", wdt, xdt,
             ydt);
    return -1;
}

int act_k_linear(cublasHandle_t h, const void *W, int wdt, const void *x, int xdt, void *y,
                 int ydt, int M, int out, int in, int tf32, char *err, size_t errlen) {
    if (check_dtypes(wdt, xdt, ydt, err, errlen)) return -1;
    if (M == 0) return 0;
    const float alpha = 1.0f, beta = 0.0f;
    KCUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, M, in, &alpha, W, cuda_type(wdt), in,
                         x, cuda_type(xdt), in, &beta, y, cuda_type(ydt), out,
                         compute_type(wdt, tf32), CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* ---------------- cuBLASLt ---------------- */

unsigned act_k_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned n = 1;
    while (n < 256 && !(a & n)) n <<= 1;
    return n;
}

void act_k_lt_plan_free(act_lt_plan *p) {
    if (!p) return;
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->d) cublasLtMatrixLayoutDestroy(p->d);
    free(p);
}

/* a checked cuBLASLt call in act_k_lt_plan: on failure the plan is freed */
#define LTP(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    act_kerr(err, errlen, __FILE__, __LINE__, #call, cublasLtGetStatusString(s_)); \
    act_k_lt_plan_free(p); return -1; } } while (0)

int act_k_lt_plan(cublasLtHandle_t lt, int wdt, int xdt, int ydt, int M, int out, int in,
                  int tf32, int epi, const void *W, const void *x, const void *bias, int bias_dt,
                  const void *y, size_t ws_bytes, act_lt_plan **plan, char *err, size_t errlen) {
    *plan = NULL;
    if (check_dtypes(wdt, xdt, ydt, err, errlen)) return -1;
    if (M <= 0 || !bias || epi < KLT_EPI_BIAS || epi > KLT_EPI_GELU_TANH ||
        (bias_dt != KDT_F32 && bias_dt != ydt)) {
        snprintf(err, errlen, "cuBLASLt linear: needs M > 0 (got %d), a bias of fp32 or the "
                 "output's type (got dtype %d, output %d) and a known epilogue (got %d)", M,
                 bias_dt, ydt, epi);
        return -1;
    }
    act_lt_plan *p = (act_lt_plan *)calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "cuBLASLt linear: out of host memory for a plan");
        return -1;
    }
    /* dev is set by a measurement; the alignments are the heuristic's to rely on */
    const act_lt_key key = {0, wdt, xdt, ydt, M, out, in, tf32, epi, bias_dt, act_k_align(W),
                            act_k_align(x), act_k_align(y), act_k_align(bias)};
    p->key = key;
    LTP(cublasLtMatmulDescCreate(&p->op, compute_type(wdt, tf32), CUDA_R_32F));
    const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    static const char *const epi_name[] = {"bias", "bias+ReLU", "bias+GELU"};
    const uint32_t lt_epi = epi == KLT_EPI_RELU ? CUBLASLT_EPILOGUE_RELU_BIAS
                          : epi == KLT_EPI_GELU_TANH ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = cuda_type(bias_dt);
    LTP(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LTP(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LTP(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &lt_epi, sizeof lt_epi));
    LTP(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                       sizeof bias));
    LTP(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                       sizeof bias_type));
    /* layouts describe the matrices as stored (column-major); TRANSA makes A [in][out] -> op */
    LTP(cublasLtMatrixLayoutCreate(&p->a, cuda_type(wdt), (uint64_t)in, (uint64_t)out, in));
    LTP(cublasLtMatrixLayoutCreate(&p->b, cuda_type(xdt), (uint64_t)in, (uint64_t)M, in));
    LTP(cublasLtMatrixLayoutCreate(&p->d, cuda_type(ydt), (uint64_t)out, (uint64_t)M, out));

    cublasLtMatmulPreference_t pref = NULL;
    LTP(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws64 = ws_bytes;
    const uint32_t al[4] = {key.align_w, key.align_x, key.align_y, key.align_y};
    const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws64, sizeof ws64);
    /* split K only with partial sums kept in the compute type (fp32): the default also allows
     * sums in the output's type (a bf16/fp16 rounding per split) and in place (in an order
     * that varies from run to run) */
    const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                 &reduction, sizeof reduction);
    const char *what = "cublasLtMatmulPreferenceSetAttribute";
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
        s = cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al[i], sizeof al[i]);
    cublasLtMatmulHeuristicResult_t r[KLT_CANDIDATES];
    int n = 0;
    if (s == CUBLAS_STATUS_SUCCESS) {
        what = "cublasLtMatmulAlgoGetHeuristic";
        s = cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->a, p->b, p->d, p->d, pref,
                                           KLT_CANDIDATES, r, &n);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "%s: %s", what, cublasLtGetStatusString(s));
        act_k_lt_plan_free(p);
        return -1;
    }
    for (int i = 0; i < n && i < KLT_CANDIDATES; i++)
        if (r[i].state == CUBLAS_STATUS_SUCCESS && r[i].workspaceSize <= ws_bytes) {
            p->cand[p->n_cand] = r[i].algo;
            p->cand_ws[p->n_cand++] = r[i].workspaceSize;
        }
    if (p->n_cand < 1) {
        snprintf(err, errlen, "cuBLASLt has no algorithm for a %d x %d x %d %s GEMM with a %s "
                 "epilogue (%s bias)", out, M, in,
                 wdt == KDT_F32 ? (tf32 ? "tf32" : "fp32") : "16-bit", epi_name[epi],
                 bias_dt == KDT_F32 ? "fp32" : "16-bit");
        act_k_lt_plan_free(p);
        return -1;
    }
    p->algo = p->cand[0];
    p->ws = p->cand_ws[0];
    *plan = p;
    return 0;
}

int act_k_lt_bias_dt(const act_lt_plan *p) { return p->key.bias_dt; }

int act_k_lt_run(cublasLtHandle_t lt, const act_lt_plan *p, const void *W, const void *x,
                 const void *bias, void *y, void *ws, size_t ws_bytes, cudaStream_t st,
                 int *refused, char *err, size_t errlen) {
    *refused = 1;
    if (act_k_lt_fits(p, W, x, y, bias, ws_bytes, err, errlen)) return -1;
    /* the descriptor holds the bias pointer; it is set per call (a host-side write) so a plan
     * never runs with a stale one */
    cublasStatus_t s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof bias);
    const float alpha = 1.0f, beta = 0.0f;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmul(lt, p->op, &alpha, W, p->a, x, p->b, &beta, y, p->d, y, p->d, &p->algo,
                           ws, ws_bytes, st);
    if (s == CUBLAS_STATUS_SUCCESS) {
        *refused = 0;
        return 0;
    }
    /* EXECUTION_FAILED is a CUDA error on the stream: not something a fallback can mend */
    *refused = s != CUBLAS_STATUS_EXECUTION_FAILED;
    return act_kerr(err, errlen, __FILE__, __LINE__, "cublasLtMatmul", cublasLtGetStatusString(s));
}
