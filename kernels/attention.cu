/* attention.cu - one block per (batch, head); K and V of that head staged in shared memory
 * (fp32), one warp per query row. Scores: lane j handles keys j, j+32, ...; K rows are padded
 * to dh+1 floats so those lanes hit different banks. Softmax with warp reductions, then lane d
 * accumulates output dims d, d+32, ... over the probabilities kept in shared memory.
 * Semantics are PyTorch's MultiheadAttention: q / sqrt(dh), masked keys get -inf (a row whose
 * keys are all masked gives NaN, as in PyTorch; ACT never masks its cls/qpos tokens).
 * Sized for short sequences: everything for one head must fit in 48 KB of shared memory. */
#include "attention.cuh"
#include <math.h>

#define ATT_WARPS 4

static __global__ void attention_kernel(const void *q, int qdt, int qs, const void *k,
                                        const void *v, int kvdt, int kvs, int Lq, int Lk, int nh,
                                        int dh, const unsigned char *key_pad, void *out, int odt) {
    extern __shared__ float sm[];
    float *Ks = sm;                                   /* [Lk][dh+1] */
    float *Vs = Ks + (size_t)Lk * (dh + 1);           /* [Lk][dh] */
    float *Qs = Vs + (size_t)Lk * dh;                 /* [ATT_WARPS][dh] */
    float *Ps = Qs + ATT_WARPS * dh;                  /* [ATT_WARPS][Lk] */
    int b = blockIdx.x / nh, h = blockIdx.x % nh;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int idx = threadIdx.x; idx < Lk * dh; idx += blockDim.x) {
        int j = idx / dh, d = idx % dh;
        size_t src = ((size_t)b * Lk + j) * kvs + (size_t)h * dh + d;
        Ks[j * (dh + 1) + d] = kld(k, kvdt, src);
        Vs[j * dh + d] = kld(v, kvdt, src);
    }
    __syncthreads();
    float scale = sqrtf((float)dh);
    float *qw = Qs + w * dh, *pw = Ps + w * Lk;
    for (int i = w; i < Lq; i += ATT_WARPS) {
        size_t qrow = ((size_t)b * Lq + i) * qs + (size_t)h * dh;
        for (int d = lane; d < dh; d += 32) qw[d] = kld(q, qdt, qrow + d) / scale;
        __syncwarp();
        float m = -INFINITY;
        for (int j = lane; j < Lk; j += 32) {
            float s = -INFINITY;
            if (!key_pad || !key_pad[(size_t)b * Lk + j]) {
                s = 0.0f;
                for (int d = 0; d < dh; d++) s += qw[d] * Ks[j * (dh + 1) + d];
            }
            pw[j] = s;
            m = fmaxf(m, s);
        }
        m = warp_max(m);
        float sum = 0.0f;
        for (int j = lane; j < Lk; j += 32) {
            float e = expf(pw[j] - m);
            pw[j] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        __syncwarp();                                 /* pw written by other lanes */
        size_t orow = ((size_t)b * Lq + i) * ((size_t)nh * dh) + (size_t)h * dh;
        for (int d = lane; d < dh; d += 32) {
            float acc = 0.0f;
            for (int j = 0; j < Lk; j++) acc += (pw[j] / sum) * Vs[j * dh + d];
            kst(out, odt, orow + d, acc);
        }
        __syncwarp();                                 /* qw, pw reused by the next row */
    }
}

int act_k_attention(const void *q, int qdt, int qs, const void *k, const void *v, int kvdt,
                    int kvs, int B, int Lq, int Lk, int nh, int dh, const unsigned char *key_pad,
                    void *out, int odt, cudaStream_t st, char *err, size_t errlen) {
    if (B == 0 || Lq == 0) return 0;
    size_t smem = ((size_t)Lk * (2 * dh + 1) + ATT_WARPS * ((size_t)dh + Lk)) * sizeof(float);
    if (Lk <= 0 || dh <= 0 || smem > 48 * 1024) {
        snprintf(err, errlen, "attention: %d keys of head size %d need %zu bytes of shared memory; "
                 "this kernel is for short sequences (<= 48 KB)", Lk, dh, smem);
        return -1;
    }
    attention_kernel<<<B * nh, ATT_WARPS * 32, smem, st>>>(q, qdt, qs, k, v, kvdt, kvs, Lq, Lk,
                                                           nh, dh, key_pad, out, odt);
    KLAUNCH(attention_kernel);
    return 0;
}
