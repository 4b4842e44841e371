/* gemm.cuh - the linear layers through cuBLAS, and through cuBLASLt with the bias (and ReLU)
 * fused into the GEMM's epilogue. defines: act_k_linear, act_k_lt_plan, act_k_lt_run,
 * act_k_lt_plan_free, act_k_lt_measure, act_k_align, KCUBLAS */
#ifndef ACT_KERNELS_GEMM_CUH
#define ACT_KERNELS_GEMM_CUH
#include "common.cuh"
#include <cublas_v2.h>
#include <cublasLt.h>
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

/* The epilogue of a cuBLASLt plan: the bias alone, then ReLU, or then GELU in cuBLASLt's tanh
 * form (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), at most 4.7e-4 from the exact erf GELU:
 * under a bf16 or fp16 output's own rounding, so only those precisions use it). */
enum { KLT_EPI_BIAS = 0, KLT_EPI_RELU = 1, KLT_EPI_GELU_TANH = 2 };

/* A cuBLASLt plan for y[M][out] = epi(x W^T + bias) (epi a KLT_EPI_*), same dtypes and
 * precision rules as act_k_linear, bias [out] of type bias_dt: KDT_F32, or ydt itself (the only
 * type cublasLt.h documents for a bias beside a 16-bit output; the caller tries fp32 first).
 * Made on the host only (descriptors and the heuristic's candidates within ws_bytes of
 * workspace; runs take the first unless act_k_lt_measure chose another); it is valid for
 * pointers at least as aligned as the ones given here (act_k_align), which the heuristic was
 * told about. Returns -1 with the reason in err when cuBLASLt offers nothing: the caller falls
 * back. */
typedef struct act_lt_plan act_lt_plan;
int act_k_lt_plan(cublasLtHandle_t lt, int wdt, int xdt, int ydt, int M, int out, int in,
                  int tf32, int epi, const void *W, const void *x, const void *bias, int bias_dt,
                  const void *y, size_t ws_bytes, act_lt_plan **plan, char *err, size_t errlen);
/* the bias type a plan was made for (its runs take a bias of that type) */
int act_k_lt_bias_dt(const act_lt_plan *p);
/* one cublasLtMatmul on st; -1 with err when the pointers are less aligned than the plan's or
 * cuBLASLt refuses the call (*refused = 1: nothing was enqueued, the caller may fall back) */
int act_k_lt_run(cublasLtHandle_t lt, const act_lt_plan *p, const void *W, const void *x,
                 const void *bias, void *y, void *ws, size_t ws_bytes, cudaStream_t st,
                 int *refused, char *err, size_t errlen);
void act_k_lt_plan_free(act_lt_plan *p);
/* Choose the plan's algorithm among the heuristic's candidates by timing each on st with these
 * operands (gemm_tune.cu): y is written several times, the stream is waited for, so only in an
 * eager step, never inside a capture. dev keys the process-wide cache of choices. 0 also when
 * nothing was measured (one candidate, or a choice cached already); -1 with err on a CUDA error
 * or operands that do not fit the plan. graphs: time each batch of runs as a captured graph
 * (0: plain launches, for a backend whose graphs are off). */
int act_k_lt_measure(cublasLtHandle_t lt, act_lt_plan *p, int dev, const void *W,
                     const void *x, const void *bias, void *y, void *ws, size_t ws_bytes,
                     cudaStream_t st, int graphs, char *err, size_t errlen);
/* the largest power of two up to 256 that divides the address (cuBLASLt's alignment classes) */
unsigned act_k_align(const void *p);

#ifdef __cplusplus
}
#endif
#endif
