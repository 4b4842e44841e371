/* elementwise.cuh - launchers for the elementwise ops: bias/residual/activation epilogues,
 * (de)normalization, dtype conversion, broadcast of weight rows.
 * defines: act_k_bias_res_act, act_k_normalize, act_k_convert, act_k_gather_rows,
 *          act_k_broadcast_rows */
#ifndef ACT_KERNELS_ELEMENTWISE_CUH
#define ACT_KERNELS_ELEMENTWISE_CUH
#include "common.cuh"
#ifdef __cplusplus
extern "C" {
#endif

/* y[o][c][i] = epi(y + bias[c] + res[o][c][i]) for o < outer, c < C, i < inner; in place.
 * bias F32 or NULL, res (dtype rdt) or NULL; epi 0 none, 1 ReLU, 2 GELU (erf). Linear layers
 * use inner = 1 (c = column), convs inner = H*W (c = channel). */
int act_k_bias_res_act(void *y, int ydt, const float *bias, const void *res, int rdt,
                       size_t outer, int C, size_t inner, int epi, cudaStream_t st,
                       char *err, size_t errlen);
/* rows x dim; type 0 min_max, 1 mean_std (lo/hi = min/max or mean/std, F32) */
int act_k_normalize(const void *x, int xdt, void *y, int ydt, int rows, int dim, const float *lo,
                    const float *hi, int type, float eps, int inverse, cudaStream_t st,
                    char *err, size_t errlen);
/* dst[i] = src[i] converted, i < n, between F32/BF16/F16 (equal dtypes, U8 too, are a memcpy) */
int act_k_convert(void *dst, int ddt, const void *src, int sdt, size_t n, cudaStream_t st,
                  char *err, size_t errlen);
/* dst[r][j] = src[r * stride + j] converted, r < rows, j < n (F32/BF16/F16) */
int act_k_gather_rows(void *dst, int ddt, const void *src, int sdt, int rows, size_t n,
                      size_t stride, cudaStream_t st, char *err, size_t errlen);
/* out[b][j] = t[j] for b < B, j < n (t F32) */
int act_k_broadcast_rows(const float *t, int B, size_t n, void *out, int odt, cudaStream_t st,
                         char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
