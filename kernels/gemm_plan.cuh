/* gemm_plan.cuh - the inside of a cuBLASLt linear plan, shared by gemm.cu (planning by the
 * heuristic, running) and gemm_tune.cu (choosing among the heuristic's candidates by
 * measurement). Not part of the kernels' API: the backend sees act_lt_plan only through gemm.cuh.
 * defines: struct act_lt_plan, act_lt_key, KLT_CANDIDATES */
#ifndef ACT_KERNELS_GEMM_PLAN_CUH
#define ACT_KERNELS_GEMM_PLAN_CUH
#include "gemm.cuh"

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
    int bias_dt;                           /* KDT_* of the bias the runs take */
    unsigned align_w, align_x, align_y, align_b;
    act_lt_key key;
    int n_cand;                            /* the heuristic's usable candidates, best first */
    cublasLtMatmulAlgo_t cand[KLT_CANDIDATES];
    size_t cand_ws[KLT_CANDIDATES];
};

#endif
