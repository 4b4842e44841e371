/* norm.cuh - GroupNorm (vision trunks with GroupNorm) and LayerNorm fused with the residual add
 * (every transformer sublayer). defines: act_k_groupnorm, act_k_add_layernorm */
#ifndef ACT_KERNELS_NORM_CUH
#define ACT_KERNELS_NORM_CUH
#include "common.cuh"
#ifdef __cplusplus
extern "C" {
#endif

/* y = epi(GroupNorm(x) * gamma + beta + res), x [N][C][HW] (nhwc: [N][HW][C]); gamma/beta F32;
 * res optional. y may alias x or res. */
int act_k_groupnorm(const void *x, int xdt, int N, int C, int HW, int groups, int nhwc, float eps,
                    const float *gamma, const float *beta, const void *res, int rdt, int epi,
                    void *y, int ydt, cudaStream_t st, char *err, size_t errlen);
/* y = LayerNorm(x + d) * w + b over rows of E; d optional; y may alias x or d. */
int act_k_add_layernorm(const void *x, int xdt, const void *d, int ddt, const float *w,
                        const float *b, float eps, int rows, int E, void *y, int ydt,
                        cudaStream_t st, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
