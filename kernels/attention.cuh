/* attention.cuh - multi-head attention for the sequences of ACT (16 queries; memory of
 * 2 + cameras tokens; posterior of 2 + horizon tokens), with an optional key padding mask.
 * defines: act_k_attention, act_k_attention_out_ln */
#ifndef ACT_KERNELS_ATTENTION_CUH
#define ACT_KERNELS_ATTENTION_CUH
#include "common.cuh"
#ifdef __cplusplus
extern "C" {
#endif

/* out[b][i][h*dh + d] = sum_j softmax_j(q_i . k_j / sqrt(dh)) v_j[d] per head h, where
 * q_i = q[(b*Lq + i)*qs + h*dh ...], k_j = k[(b*Lk + j)*kvs + h*dh ...] (v likewise);
 * key_pad u8 [B][Lk] (1 = masked) or NULL; out dense [B][Lq][nh*dh]. */
int act_k_attention(const void *q, int qdt, int qs, const void *k, const void *v, int kvdt,
                    int kvs, int B, int Lq, int Lk, int nh, int dh, const unsigned char *key_pad,
                    void *out, int odt, cudaStream_t st, char *err, size_t errlen);

/* y[r] = LayerNorm(x[r] + attention(q, k, v)[r] W^T + bo) * lw + lb for the B*Lq rows r, in one
 * kernel: the attention as act_k_attention (kept fp32, not rounded), W [E][E] row-major in wdt
 * (E = nh*dh), bo/lw/lb fp32 [E], x/y [B*Lq][E] (y may alias x). One block per row, each
 * reading all of W: for the few rows of a small batch. */
int act_k_attention_out_ln(const void *q, int qdt, int qs, const void *k, const void *v, int kvdt,
                           int kvs, int B, int Lq, int Lk, int nh, int dh,
                           const unsigned char *key_pad, const void *W, int wdt, const float *bo,
                           const void *x, int xdt, const float *lw, const float *lb, float eps,
                           void *y, int ydt, cudaStream_t st, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
