/* conv.cuh - 2D convolutions through cuDNN's legacy API, planned once per shape.
 * defines: act_conv_plan, act_k_conv_plan, act_k_conv_find_need, act_k_conv_find, act_k_conv_run,
 *          act_k_conv_plan_free, KCUDNN, act_k_conv_weight_nhwc
 * Layout: NCHW feature maps with KCRS filters, or (nhwc) NHWC feature maps with KRSC filters,
 * the form cuDNN's tensor-core kernels read without transposing.
 * A plan holds the descriptors and the algorithm chosen for one (layer, N, H, W); the bias,
 * residual and activation go into cuDNN's fused call where it takes them, else
 * act_k_bias_res_act (elementwise.cuh) applies them after the convolution. */
#ifndef ACT_KERNELS_CONV_CUH
#define ACT_KERNELS_CONV_CUH
#include "common.cuh"
#include <cudnn.h>
#ifdef __cplusplus
extern "C" {
#endif

#define KCUDNN(call) do { cudnnStatus_t s_ = (call); \
    if (s_ != CUDNN_STATUS_SUCCESS) return act_kerr(err, errlen, __FILE__, __LINE__, #call, cudnnGetErrorString(s_)); \
} while (0)

typedef struct act_conv_plan act_conv_plan;

/* prec: 0 fp32 (no TF32, GEMM-family algorithms only), 1 tf32 (GEMM family), 2 bf16, 3 fp16
 * (dt is the data type of x, w and y). Picks the first heuristic algorithm whose workspace fits
 * ws_limit. */
int act_k_conv_plan(cudnnHandle_t h, int dt, int prec, int nhwc, int N, int cin, int H, int W,
                    int cout, int k, int stride, int pad, size_t ws_limit, act_conv_plan **out,
                    char *err, size_t errlen);
/* Measuring instead of trusting the heuristics (conv_find.cu), outside a capture only:
 * act_k_conv_find_need applies what an earlier measurement of the same key chose (if its
 * workspace fits ws_cap) and returns 0, or returns 1 with the workspace bytes a measurement may
 * use (the most any usable heuristic candidate needs, at most ws_cap; -1 error). Then
 * act_k_conv_find runs cuDNN's Find on x and w, overwriting y (which must therefore not hold a
 * residual) and synchronizing, and takes the fastest usable algorithm whose workspace fits
 * ws_size, or IMPLICIT_PRECOMP_GEMM whenever usable with keep_fusion (the conv's bias goes
 * through act_k_conv_run_fused with the identity activation, which needs it); 1 when none was
 * usable and -1 when Find failed (err says why): the plan then keeps the heuristics' choice and
 * stays usable. The plan's workspace need (act_k_conv_ws) may grow to at most ws_bytes. */
int act_k_conv_find_need(cudnnHandle_t h, act_conv_plan *p, int keep_fusion, size_t ws_cap,
                         size_t *ws_bytes, char *err, size_t errlen);
int act_k_conv_find(cudnnHandle_t h, act_conv_plan *p, int keep_fusion, const void *x,
                    const void *w, void *y, void *ws, size_t ws_size, char *err, size_t errlen);
/* y = conv(x, w) + beta * y (beta 0 or 1: 1 accumulates onto a residual already in y). 0 done,
 * -1 cuDNN refused the call (nothing queued), -2 a CUDA fault inside cuDNN (EXECUTION_FAILED:
 * an error, not a refusal a fallback could take over). */
int act_k_conv_run(cudnnHandle_t h, const act_conv_plan *p, const void *x, const void *w,
                   float beta, void *y, void *ws, size_t ws_size, char *err, size_t errlen);
/* y = epi(conv(x, w) + bias + res) in one cuDNN call (res may be NULL; bias in the data type;
 * epi 0 none, 1 ReLU). Returns 1 when this plan cannot fuse that (GELU, an in-place residual,
 * an identity epilogue on another algorithm than IMPLICIT_PRECOMP_GEMM, or cuDNN refused it at
 * the plan's first use): the caller then runs act_k_conv_run + act_k_bias_res_act. 0 done,
 * -1 error, -2 a CUDA fault inside cuDNN (as act_k_conv_run). */
int act_k_conv_run_fused(cudnnHandle_t h, act_conv_plan *p, const void *x, const void *w,
                         const void *bias, const void *res, int epi, void *y, void *ws,
                         size_t ws_size, char *err, size_t errlen);
void act_k_conv_out_dims(const act_conv_plan *p, int *Ho, int *Wo);
/* workspace bytes the plan's algorithm needs (<= the ws_limit it was planned with) */
size_t act_k_conv_ws(const act_conv_plan *p);
/* The fallback when cuDNN offers no algorithm (or ACT_CUDA_CONV=direct): a direct convolution,
 * one thread per output, fp32 accumulation, with the whole epilogue fused:
 * y = epi(conv(x, w) + bias + res); res may be y itself. x, w, y of dtype dt, laid out as nhwc
 * says. */
int act_k_conv_direct(const void *x, const void *w, int dt, int nhwc, int N, int cin, int H, int W,
                      int cout, int k, int stride, int pad, const float *bias, const void *res,
                      int rdt, int epi, void *y, cudaStream_t st, char *err, size_t errlen);
/* KCRS filter w [K][C][k][k] (F32) -> KRSC [K][k][k][Cs] in dtype ddt (dst must not alias w):
 * the NHWC filter layout, made once at weight load. Cs >= C channels are stored, the ones past
 * C zero (the stem's input padded to 4 or 8 channels, ACT_CUDA_STEM_CHANNELS) */
int act_k_conv_weight_nhwc(const float *w, void *dst, int ddt, int K, int C, int Cs, int k,
                           cudaStream_t st, char *err, size_t errlen);
void act_k_conv_plan_free(act_conv_plan *p);

#ifdef __cplusplus
}
#endif
#endif
