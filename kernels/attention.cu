/* attention.cu - attention, and attention fused with its output projection and post-norm.
 *
 * act_k_attention: one block per (batch, head, 16 query rows); K and V of that head staged in
 * shared memory (fp32), one warp per query row. Scores: lane j handles keys j, j+32, ...; K rows are padded
 * to dh+1 floats so those lanes hit different banks. Softmax with warp reductions, then lane d
 * accumulates output dims d, d+32, ... over the probabilities kept in shared memory.
 * Semantics are PyTorch's MultiheadAttention: q / sqrt(dh), masked keys get -inf (a row whose
 * keys are all masked gives NaN, as in PyTorch; ACT never masks its cls/qpos tokens).
 * K and V staged in shared memory fit short sequences (ACT's 16 queries, memory of 2 + cameras);
 * longer ones (an action chunk of 100 at head size 64 needs 53 KB) read K and V where they lie,
 * one block per (batch, head, ATT_WARPS query rows), only the queries and the probabilities in
 * shared memory: up to ~3000 keys. There the lanes split each key's dims for the scores
 * (coalesced loads of one K row, a warp sum per key) and, as in the staged kernel, the output's
 * dims for the weighted sum of V. */
#include "attention.cuh"
#include <math.h>

#define ATT_WARPS 4
#define ATT_STAGED_ROWS 16   /* query rows a block of the staged kernel takes (4 a warp) */
#define ATT_KEYS 4    /* keys scored together by the in-place (long) kernel */

/* The warp's scores pw[j] (each lane wrote j = lane, lane + 32, ...; m is its running max) become
 * the softmax's probabilities exp(pw[j] - max) / sum in place, each divided once by the lane that
 * wrote it rather than at each of its uses. After it every lane may read every pw[j]. */
static __device__ __forceinline__ void softmax_row(float *pw, int Lk, int lane, float m) {
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < Lk; j += 32) {
        float e = expf(pw[j] - m);
        pw[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    for (int j = lane; j < Lk; j += 32) pw[j] = pw[j] / sum;
    __syncwarp();                                     /* pw written by other lanes */
}

/* The block's work: batch b, head h, query rows i0 + w, i0 + w + ATT_WARPS, ... below i1.
 * staged (a constant at each call, so each kernel below is compiled for one case): K and V of
 * the head copied to shared memory first, else read from global memory at each use. */
static __device__ __forceinline__ void attention_rows(
    const void *q, int qdt, int qs, const void *k, const void *v, int kvdt, int kvs, int Lq,
    int Lk, int nh, int dh, const unsigned char *key_pad, void *out, int odt, int b, int h,
    int i0, int i1, int staged, float *sm) {
    float *Ks = sm;                                   /* staged: [Lk][dh+1] */
    float *Vs = Ks + (size_t)Lk * (dh + 1);           /* staged: [Lk][dh] */
    float *Qs = staged ? Vs + (size_t)Lk * dh : sm;   /* [ATT_WARPS][dh] */
    float *Ps = Qs + ATT_WARPS * dh;                  /* [ATT_WARPS][Lk] */
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    size_t kv0 = (size_t)b * Lk * kvs + (size_t)h * dh;   /* key j, dim d: kv0 + j kvs + d */
    if (staged) {
        for (int idx = threadIdx.x; idx < Lk * dh; idx += blockDim.x) {
            int j = idx / dh, d = idx % dh;
            size_t src = kv0 + (size_t)j * kvs + d;
            Ks[j * (dh + 1) + d] = kld(k, kvdt, src);
            Vs[j * dh + d] = kld(v, kvdt, src);
        }
        __syncthreads();
    }
    float scale = sqrtf((float)dh);
    float *qw = Qs + w * dh, *pw = Ps + w * Lk;
    for (int i = i0 + w; i < i1; i += ATT_WARPS) {
        size_t qrow = ((size_t)b * Lq + i) * qs + (size_t)h * dh;
        for (int d = lane; d < dh; d += 32) qw[d] = kld(q, qdt, qrow + d) / scale;
        __syncwarp();
        float m = -INFINITY;
        if (staged) {
            for (int j = lane; j < Lk; j += 32) {
                float s = -INFINITY;
                if (!key_pad || !key_pad[(size_t)b * Lk + j]) {
                    s = 0.0f;
                    for (int d = 0; d < dh; d++) s += qw[d] * Ks[j * (dh + 1) + d];
                }
                pw[j] = s;
                m = fmaxf(m, s);
            }
        } else {
            /* K in place: the lanes split a key's dims, so each load is one row's contiguous
             * bytes (a lane per key would read 32 rows, 32 cache lines, per load); ATT_KEYS keys
             * at a time, their warp sums independent of each other. Every lane ends with every
             * score; lane j % 32 keeps key j's, as the staged loop above does. */
            for (int j0 = 0; j0 < Lk; j0 += ATT_KEYS) {
                float part[ATT_KEYS];
#pragma unroll
                for (int u = 0; u < ATT_KEYS; u++) {
                    part[u] = 0.0f;
                    if (j0 + u < Lk)
                        for (int d = lane; d < dh; d += 32)
                            part[u] += qw[d] * kld(k, kvdt, kv0 + (size_t)(j0 + u) * kvs + d);
                }
#pragma unroll
                for (int u = 0; u < ATT_KEYS; u++) part[u] = warp_sum(part[u]);
#pragma unroll
                for (int u = 0; u < ATT_KEYS; u++) {
                    int j = j0 + u;
                    if (j >= Lk) break;
                    float s = key_pad && key_pad[(size_t)b * Lk + j] ? -INFINITY : part[u];
                    if (lane == (j & 31)) pw[j] = s;
                    m = fmaxf(m, s);
                }
            }
        }
        softmax_row(pw, Lk, lane, m);
        size_t orow = ((size_t)b * Lq + i) * ((size_t)nh * dh) + (size_t)h * dh;
        for (int d = lane; d < dh; d += 32) {
            float acc = 0.0f;
            if (staged)
                for (int j = 0; j < Lk; j++) acc += pw[j] * Vs[j * dh + d];
            else
                for (int j = 0; j < Lk; j++) acc += pw[j] * kld(v, kvdt, kv0 + (size_t)j * kvs + d);
            kst(out, odt, orow + d, acc);
        }
        __syncwarp();                                 /* qw, pw reused by the next row */
    }
}

/* the block's batch b, head h and chunk of per query rows: blockIdx.x counts (b, h, chunk) */
static __device__ __forceinline__ void attention_block(
    const void *q, int qdt, int qs, const void *k, const void *v, int kvdt, int kvs, int Lq,
    int Lk, int nh, int dh, const unsigned char *key_pad, void *out, int odt, int per, int staged,
    float *sm) {
    int chunks = (Lq + per - 1) / per;
    int bh = blockIdx.x / chunks, c = blockIdx.x % chunks;
    int i0 = c * per, i1 = i0 + per < Lq ? i0 + per : Lq;
    attention_rows(q, qdt, qs, k, v, kvdt, kvs, Lq, Lk, nh, dh, key_pad, out, odt, bh / nh,
                   bh % nh, i0, i1, staged, sm);
}

/* short sequences: one block per (batch, head, ATT_STAGED_ROWS query rows), K and V of the head
 * staged by each block for its rows (ACT's 16 queries: one block per head, 4 rows a warp; an
 * action chunk of 100 spreads over 7 blocks instead of queuing 25 rows on each warp of one) */
static __global__ void attention_kernel(const void *q, int qdt, int qs, const void *k,
                                        const void *v, int kvdt, int kvs, int Lq, int Lk, int nh,
                                        int dh, const unsigned char *key_pad, void *out, int odt) {
    extern __shared__ float sm[];
    attention_block(q, qdt, qs, k, v, kvdt, kvs, Lq, Lk, nh, dh, key_pad, out, odt,
                    ATT_STAGED_ROWS, 1, sm);
}

/* long ones: one block per (batch, head, ATT_WARPS rows), K and V read where they lie */
static __global__ void attention_long_kernel(const void *q, int qdt, int qs, const void *k,
                                             const void *v, int kvdt, int kvs, int Lq, int Lk,
                                             int nh, int dh, const unsigned char *key_pad,
                                             void *out, int odt) {
    extern __shared__ float sm[];
    attention_block(q, qdt, qs, k, v, kvdt, kvs, Lq, Lk, nh, dh, key_pad, out, odt, ATT_WARPS, 0,
                    sm);
}

int act_k_attention(const void *q, int qdt, int qs, const void *k, const void *v, int kvdt,
                    int kvs, int B, int Lq, int Lk, int nh, int dh, const unsigned char *key_pad,
                    void *out, int odt, cudaStream_t st, char *err, size_t errlen) {
    if (B == 0 || Lq == 0) return 0;
    size_t rows = ATT_WARPS * ((size_t)dh + Lk) * sizeof(float);   /* queries, probabilities */
    size_t staged = (size_t)Lk * (2 * dh + 1) * sizeof(float) + rows;
    if (Lk <= 0 || dh <= 0 || rows > 48 * 1024) {
        snprintf(err, errlen, "attention: %d keys of head size %d: the CUDA kernel holds %zu bytes "
                 "of a block's probabilities in shared memory, over its 48 KB (at most %d keys at "
                 "this head size: a longer action chunk, pred_horizon, runs on the CPU backend)",
                 Lk, dh, rows, (int)(48 * 1024 / (ATT_WARPS * sizeof(float))) - dh);
        return -1;
    }
    if (staged <= 48 * 1024) {
        size_t blocks = (size_t)B * nh * ((Lq + ATT_STAGED_ROWS - 1) / ATT_STAGED_ROWS);
        attention_kernel<<<(unsigned)blocks, ATT_WARPS * 32, staged, st>>>(
            q, qdt, qs, k, v, kvdt, kvs, Lq, Lk, nh, dh, key_pad, out, odt);
        KLAUNCH(attention_kernel);
        return 0;
    }
    size_t blocks = (size_t)B * nh * ((Lq + ATT_WARPS - 1) / ATT_WARPS);
    attention_long_kernel<<<(unsigned)blocks, ATT_WARPS * 32, rows, st>>>(
        q, qdt, qs, k, v, kvdt, kvs, Lq, Lk, nh, dh, key_pad, out, odt);
    KLAUNCH(attention_long_kernel);
    return 0;
}

/* ---------------- attention + output projection + residual + LayerNorm ---------------- */

#define AOL_WARPS 16
#define AOL_OUTS 4   /* the reduction below is written for four */
#define AOL_RED 32   /* block_sum's static shared floats: they count against 48 KB with the dynamic */

/* Two weights at once (i even, the pointer aligned to two elements): 4-byte bf16/fp16 pairs or
 * 8-byte fp32 pairs, so a warp reads 128 or 256 contiguous bytes of a weight row per step. */
static __device__ __forceinline__ float2 kld2(const void *p, int dt, size_t i) {
    if (dt == KDT_BF16) return __bfloat1622float2(((const __nv_bfloat162 *)p)[i / 2]);
    if (dt == KDT_F16) return __half22float2(((const __half2 *)p)[i / 2]);
    return ((const float2 *)p)[i / 2];
}

/* One block per query row (b, i), for the decoder's few rows at small batches, where the three
 * separate ops are mostly launch latency: every head's attention into shared memory (kept fp32,
 * one warp per head), then out[j] = b_out[j] + att . W_out[j] with each warp taking AOL_OUTS
 * outputs at a time, lanes reading the weight rows coalesced, plus the residual x, then
 * LayerNorm over the row. Each block reads all of W_out (512 KB in bf16 at E = 512), which is
 * why the caller bounds the rows.
 * y may alias x: a block reads only its own row of x, before it writes that row of y. */
static __global__ void attention_out_ln_kernel(const void *q, int qdt, int qs, const void *k,
                                               const void *v, int kvdt, int kvs, int Lq, int Lk,
                                               int nh, int dh, const unsigned char *key_pad,
                                               const void *W, int wdt, int wpairs, const float *bo,
                                               const void *x, int xdt, const float *lw,
                                               const float *lb, float eps, void *y, int ydt) {
    extern __shared__ float sm[];
    __shared__ float red[AOL_RED];
    int E = nh * dh;
    float *Qs = sm;                                   /* [E] the query row / sqrt(dh) */
    float *Att = Qs + E;                              /* [E] attention output, all heads */
    float *Y = Att + E;                               /* [E] x + projection */
    float *Ps = Y + E;                                /* [AOL_WARPS][Lk] */
    int row = blockIdx.x, b = row / Lq;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float scale = sqrtf((float)dh);
    for (int i = threadIdx.x; i < E; i += blockDim.x) Qs[i] = kld(q, qdt, (size_t)row * qs + i) / scale;
    __syncthreads();
    float *pw = Ps + w * Lk;
    for (int h = w; h < nh; h += AOL_WARPS) {
        const float *qh = Qs + h * dh;
        float m = -INFINITY;
        for (int j = lane; j < Lk; j += 32) {
            float s = -INFINITY;
            if (!key_pad || !key_pad[(size_t)b * Lk + j]) {
                size_t kr = ((size_t)b * Lk + j) * kvs + (size_t)h * dh;
                s = 0.0f;
                for (int d = 0; d < dh; d++) s += qh[d] * kld(k, kvdt, kr + d);
            }
            pw[j] = s;
            m = fmaxf(m, s);
        }
        softmax_row(pw, Lk, lane, m);
        for (int d = lane; d < dh; d += 32) {
            float acc = 0.0f;
            for (int j = 0; j < Lk; j++)
                acc += pw[j] * kld(v, kvdt, ((size_t)b * Lk + j) * kvs + (size_t)h * dh + d);
            Att[h * dh + d] = acc;
        }
        __syncwarp();                                 /* pw reused by this warp's next head */
    }
    __syncthreads();
    /* AOL_OUTS outputs per warp at a time, their weight loads interleaved: with one block per SM
     * at batch 1, the loads in flight per warp, not the arithmetic, set the time */
    for (int j0 = w * AOL_OUTS; j0 < E; j0 += AOL_WARPS * AOL_OUTS) {
        float acc[AOL_OUTS];
#pragma unroll
        for (int o = 0; o < AOL_OUTS; o++) acc[o] = 0.0f;
        if (wpairs) {
            for (int c = 2 * lane; c < E; c += 64) {
                float a0 = Att[c], a1 = Att[c + 1];
#pragma unroll
                for (int o = 0; o < AOL_OUTS; o++) {
                    float2 wv = j0 + o < E ? kld2(W, wdt, (size_t)(j0 + o) * E + c) : make_float2(0.0f, 0.0f);
                    acc[o] += a0 * wv.x + a1 * wv.y;
                }
            }
        } else {
            for (int c = lane; c < E; c += 32)
#pragma unroll
                for (int o = 0; o < AOL_OUTS; o++)
                    if (j0 + o < E) acc[o] += Att[c] * kld(W, wdt, (size_t)(j0 + o) * E + c);
        }
        /* the four sums in 6 shuffles, not 4 x 5: halve the values across lane bit 4, then bit
         * 3, then sum the one left over bits 2..0; lane 8*o then holds output j0 + o */
        int hi = (lane >> 4) & 1, mid = (lane >> 3) & 1;
        float h0 = (hi ? acc[2] : acc[0]) + __shfl_xor_sync(0xffffffffu, hi ? acc[0] : acc[2], 16);
        float h1 = (hi ? acc[3] : acc[1]) + __shfl_xor_sync(0xffffffffu, hi ? acc[1] : acc[3], 16);
        float t = (mid ? h1 : h0) + __shfl_xor_sync(0xffffffffu, mid ? h0 : h1, 8);
        for (int off = 4; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
        int jo = j0 + 2 * hi + mid;
        if ((lane & 7) == 0 && jo < E) Y[jo] = t + bo[jo] + kld(x, xdt, (size_t)row * E + jo);
    }
    __syncthreads();
    float s = 0.0f;
    for (int i = threadIdx.x; i < E; i += blockDim.x) s += Y[i];
    float mean = block_sum(s, red) / (float)E;
    s = 0.0f;
    for (int i = threadIdx.x; i < E; i += blockDim.x) s += (Y[i] - mean) * (Y[i] - mean);
    float rstd = 1.0f / sqrtf(block_sum(s, red) / (float)E + eps);
    for (int i = threadIdx.x; i < E; i += blockDim.x)
        kst(y, ydt, (size_t)row * E + i, (Y[i] - mean) * rstd * lw[i] + lb[i]);
}

int act_k_attention_out_ln(const void *q, int qdt, int qs, const void *k, const void *v, int kvdt,
                           int kvs, int B, int Lq, int Lk, int nh, int dh,
                           const unsigned char *key_pad, const void *W, int wdt, const float *bo,
                           const void *x, int xdt, const float *lw, const float *lb, float eps,
                           void *y, int ydt, cudaStream_t st, char *err, size_t errlen) {
    if (B == 0 || Lq == 0) return 0;
    int E = nh * dh;
    /* a launch's static and dynamic shared memory together may not pass 48 KB (without the
     * opt-in attribute); a GPU refuses it at launch, with no word of which limit */
    size_t smem = ((size_t)3 * E + (size_t)AOL_WARPS * Lk) * sizeof(float);
    if (Lk <= 0 || dh <= 0 || smem + AOL_RED * sizeof(float) > 48 * 1024) {
        snprintf(err, errlen, "attention+out+ln: %d keys, width %d need %zu bytes of shared "
                 "memory; this kernel is for short sequences (<= 48 KB)", Lk, E,
                 smem + AOL_RED * sizeof(float));
        return -1;
    }
    size_t esz = wdt == KDT_F32 ? 4 : 2;
    int wpairs = E % 2 == 0 && (size_t)W % (2 * esz) == 0;
    attention_out_ln_kernel<<<B * Lq, AOL_WARPS * 32, smem, st>>>(
        q, qdt, qs, k, v, kvdt, kvs, Lq, Lk, nh, dh, key_pad, W, wdt, wpairs, bo, x, xdt, lw, lb,
        eps, y, ydt);
    KLAUNCH(attention_out_ln_kernel);
    return 0;
}
