/* gemm_plan.cuh - the inside of a cuBLASLt linear plan, shared by gemm.cu (planning by the
 * heuristic, running) and gemm_tune.cu (choosing among the heuristic's candidates by
 * measurement). Not part of the kernels' API: the backend sees act_lt_plan only through gemm.cuh.
 * defines: struct act_lt_plan, act_lt_key, KLT_CANDIDATES, act_k_lt_fits */
#ifndef ACT_KERNELS_GEMM_PLAN_CUH
#define ACT_KERNELS_GEMM_PLAN_CUH
#include "gemm.cuh"
#include <stdio.h>

/* the most candidates a plan keeps from the heuristic (its ranking, best first) */
#define KLT_CANDIDATES 8

/* what makes two plans interchangeable: device (set by the measurement), data types, shape,
 * precision, epilogue and the operands' alignment classes (the workspace is the backend's one
 * constant). All ints, so memcmp compares it. */
typedef struct {
    int dev, wdt, xdt, ydt, M, out, in, tf32, epi, bias_dt;
    unsigned align_w, align_x, align_y, align_b;
} act_lt_key;

struct act_lt_plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;        /* W^T (op T of [in][out]), X^T [in][M], Y^T [out][M] */
    cublasLtMatmulAlgo_t algo;             /* the one runs use: cand[0] unless measured */
    size_t ws;                             /* workspace it needs */
    act_lt_key key;                        /* also the bias type runs take and the alignments
                                            * the heuristic was told */
    int n_cand;                            /* the heuristic's usable candidates, best first */
    cublasLtMatmulAlgo_t cand[KLT_CANDIDATES];
    size_t cand_ws[KLT_CANDIDATES];
};

/* 0 when W, x, y and bias are at least as aligned as the plan was made for and ws_bytes holds
 * the workspace its algorithm needs; else -1 with the reason in err */
static inline int act_k_lt_fits(const act_lt_plan *p, const void *W, const void *x,
                                const void *y, const void *bias, size_t ws_bytes, char *err,
                                size_t errlen) {
    const act_lt_key *k = &p->key;
    if (act_k_align(W) >= k->align_w && act_k_align(x) >= k->align_x &&
        act_k_align(y) >= k->align_y && act_k_align(bias) >= k->align_b && ws_bytes >= p->ws)
        return 0;
    snprintf(err, errlen, "cuBLASLt linear: operands or workspace do not fit the plan "
             "(alignments %u %u %u %u, planned for %u %u %u %u; workspace %zu of %zu bytes)",
             act_k_align(W), act_k_align(x), act_k_align(y), act_k_align(bias), k->align_w,
             k->align_x, k->align_y, k->align_b, ws_bytes, p->ws);
    return -1;
}

#endif
