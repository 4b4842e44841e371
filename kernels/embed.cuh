/* embed.cuh - token assembly for the ACT head and the CVAE latent.
 * defines: act_k_memory_assemble, act_k_posterior_assemble, act_k_latent */
#ifndef ACT_KERNELS_EMBED_CUH
#define ACT_KERNELS_EMBED_CUH
#include "common.cuh"
#ifdef __cplusplus
extern "C" {
#endif

/* decoder memory out [B][2+ncam][E]: token 0 = lat[b], 1 = qp[b], 2+c = vis[c*B + b], each
 * + pos[l] (F32) + type[min(l, 2)] (F32) */
int act_k_memory_assemble(const void *lat, int ldt, const void *qp, int qdt, const void *vis,
                          int vdt, int B, int ncam, int E, const float *pos, const float *type,
                          void *out, int odt, cudaStream_t st, char *err, size_t errlen);
/* posterior tokens out [B][2+H][E]: token 0 = cls (F32), 1 = qp[b], 2+h = act[b*H + h], + pos[l] */
int act_k_posterior_assemble(const float *cls, const void *qp, int qdt, const void *act, int adt,
                             int B, int H, int E, const float *pos, void *out, int odt,
                             cudaStream_t st, char *err, size_t errlen);
/* ml [B][2L] -> mu, logvar F32 [B][L], kl F32 [B], z [B][L] (zdt): z = mu, or with sample
 * z = mu + act_normal_eps(seed, b*L + i) * exp(logvar / 2), seed = 8 LE bytes at seed8 */
int act_k_latent(const void *ml, int mdt, int B, int L, int sample, const unsigned char *seed8,
                 float *mu, float *logvar, float *kl, void *z, int zdt, cudaStream_t st,
                 char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
