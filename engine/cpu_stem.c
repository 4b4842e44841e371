/* cpu_stem.c - the trunk's first convolution (ResNet's 7x7 stride-2 on 3 channels) computed
 * directly, without im2col.
 * defines: act_cpu_stem_conv
 *
 * im2col + GEMM is a poor fit for a conv on 3 input channels: the column matrix is 147 rows of
 * 12544 values per image (49x the input, written and read again), the GEMM's K is only 147, and
 * the bias/ReLU epilogue is a third pass. Here the padded input is written once, its columns
 * split by parity (stride 2), so that for every tap 16 neighbouring outputs read 16 consecutive
 * inputs; each task owns one output row of one image and keeps 16 channels x 16 pixels of
 * accumulators (one AVX-512 register per channel; 4 channels in two 8-float registers each
 * without AVX-512) through all cin*k*k taps, starting from the bias, then applies the ReLU as
 * it stores. The sums run over the taps in (c, ky, kx) order, as
 * im2col's GEMM does; only the rounding of fp32 addition differs (relative ~1e-7).
 * Taken for convs with at most 4 input channels, a multiple of 16 output channels, kernels up
 * to 16, stride 1 or 2, no residual and a ReLU or no activation; ACT_CPU_STEM=0 sends them to im2col (A/B). */
#include <stdlib.h>
#include <string.h>
#include "cpu_ops.h"
#include "forward.h"
#include "util.h"

#define PX 16   /* output pixels per block (one AVX-512 vector of fp32, two AVX2 ones) */
#define STEM_KMAX 16   /* the largest kernel taken */
#define CB 16   /* output channels per block with AVX-512: 16 accumulators of its 32 registers */
#define CB_NARROW 4   /* without: AVX2's 16 registers hold 4 x 2 accumulators, the input's two
                       * halves and a broadcast weight (16 channels there spilled: 5x slower
                       * than im2col on an AVX2 EPYC) */

typedef struct {
    const float *x;      /* [g][cin][H][W] */
    float *planes;       /* [g][cin][s][Hp][Wq]: padded input, column j of plane q = column j*s+q */
    const float *wt;     /* [cin*k*k][cout]: the filter, tap-major */
    const float *bias;   /* [cout] or NULL */
    float *y;            /* [g][cout][Ho][Wo] */
    int cin, cout, k, s, p, H, W, Hp, Wq, Ho, Wo, relu;
    int cb;              /* output channels per block: CB or CB_NARROW */
    size_t tap_off[STEM_KMAX];   /* tap kx reads from its row in plane 0 + tap_off[kx] */
} stem_job;

static float *plane_row(const stem_job *q, int n, int c, int par, int row) {
    return q->planes + ((((size_t)n * q->cin + c) * q->s + par) * q->Hp + row) * q->Wq;
}

/* items: (image, channel, padded row) */
static void pad_task(void *arg, int t, int lo, int hi) {
    (void)t;
    const stem_job *q = arg;
    for (int it = lo; it < hi; it++) {
        int row = it % q->Hp, c = it / q->Hp % q->cin, n = it / q->Hp / q->cin;
        int iy = row - q->p;
        const float *src = iy >= 0 && iy < q->H ? q->x + (((size_t)n * q->cin + c) * q->H + iy) * q->W
                                                : NULL;
        for (int par = 0; par < q->s; par++) {
            float *d = plane_row(q, n, c, par, row);
            for (int j = 0; j < q->Wq; j++) {
                int ix = j * q->s + par - q->p;
                d[j] = src && ix >= 0 && ix < q->W ? src[ix] : 0.0f;
            }
        }
    }
}

/* 16 floats: one AVX-512 register in that clone, split by the compiler in the others */
typedef float v16f __attribute__((vector_size(PX * sizeof(float))));
typedef float v8f __attribute__((vector_size(8 * sizeof(float))));

/* channels [co0, co0+cb) of the block's pixels, ReLU applied as they are stored */
static void store_block(const stem_job *q, int n, int oy, int co0, int ox0, const v16f *acc,
                        int cb) {
    int npx = q->Wo - ox0 < PX ? q->Wo - ox0 : PX;
    for (int j = 0; j < cb; j++) {
        float *o = q->y + (((size_t)n * q->cout + co0 + j) * q->Ho + oy) * q->Wo + ox0;
        for (int i = 0; i < npx; i++) {
            float v = acc[j][i];
            o[i] = q->relu && v < 0.0f ? 0.0f : v;   /* NaN passes, as torch.relu */
        }
    }
}

/* one block: CB channels from co0, PX pixels from ox0 of output row oy of image n */
ACT_CPU_VEC_CLONES static void stem_block(const stem_job *q, int n, int oy, int co0, int ox0) {
    v16f acc[CB];
    for (int j = 0; j < CB; j++) {
        float b = q->bias ? q->bias[co0 + j] : 0.0f;
        acc[j] = (v16f){0} + b;
    }
    const float *w = q->wt + co0;
    for (int c = 0; c < q->cin; c++)
        for (int ky = 0; ky < q->k; ky++)
            for (int kx = 0; kx < q->k; kx++, w += q->cout) {
                const float *in = plane_row(q, n, c, 0, oy * q->s + ky) + ox0 + q->tap_off[kx];
                v16f x;
                memcpy(&x, in, sizeof x);             /* an unaligned vector load */
                for (int j = 0; j < CB; j++) acc[j] += w[j] * x;
            }
    store_block(q, n, oy, co0, ox0, acc, CB);
}

/* the same for CB_NARROW channels, each 16-pixel row as two 8-float vectors: GCC lowers a
 * 16-float vector on AVX2 through the stack (no FMA, spills), but an 8-float one is a register */
ACT_CPU_VEC_CLONES static void stem_block_narrow(const stem_job *q, int n, int oy, int co0,
                                                 int ox0) {
    v8f lo[CB_NARROW], hi[CB_NARROW];
    for (int j = 0; j < CB_NARROW; j++) {
        float b = q->bias ? q->bias[co0 + j] : 0.0f;
        lo[j] = hi[j] = (v8f){0} + b;
    }
    const float *w = q->wt + co0;
    for (int c = 0; c < q->cin; c++)
        for (int ky = 0; ky < q->k; ky++)
            for (int kx = 0; kx < q->k; kx++, w += q->cout) {
                const float *in = plane_row(q, n, c, 0, oy * q->s + ky) + ox0 + q->tap_off[kx];
                v8f x0, x1;
                memcpy(&x0, in, sizeof x0);
                memcpy(&x1, in + 8, sizeof x1);
                for (int j = 0; j < CB_NARROW; j++) {
                    lo[j] += w[j] * x0;
                    hi[j] += w[j] * x1;
                }
            }
    v16f acc[CB_NARROW];
    for (int j = 0; j < CB_NARROW; j++) {
        memcpy(&acc[j], &lo[j], sizeof lo[j]);
        memcpy((float *)&acc[j] + 8, &hi[j], sizeof hi[j]);
    }
    store_block(q, n, oy, co0, ox0, acc, CB_NARROW);
}

/* items: (image, output row) */
static void row_task(void *arg, int t, int lo, int hi) {
    (void)t;
    const stem_job *q = arg;
    for (int it = lo; it < hi; it++) {
        int oy = it % q->Ho, n = it / q->Ho;
        for (int co0 = 0; co0 < q->cout; co0 += q->cb)
            for (int ox0 = 0; ox0 < q->Wo; ox0 += PX) {
                if (q->cb == CB) stem_block(q, n, oy, co0, ox0);
                else stem_block_narrow(q, n, oy, co0, ox0);
            }
    }
}

int act_cpu_stem_conv(act_cpu_ctx *ctx, const act_conv *c, const float *x, int N, int H, int W,
                      const float *residual, act_epilogue epi, float *y) {
    if (!act_cpu_switch_on("ACT_CPU_STEM") || !c->w || c->cin < 1 || c->cin > 4 || c->cout % CB ||
        c->k > STEM_KMAX || (c->stride != 1 && c->stride != 2) || residual ||
        (epi != ACT_EPI_NONE && epi != ACT_EPI_RELU))
        return 1;   /* not a stem-like conv: im2col takes it */
    int k = c->k, s = c->stride, p = c->pad;
    /* ACT_CPU_STEM_BLOCK=16|4 picks the block for tests, which run both on any machine */
    const char *blk = getenv("ACT_CPU_STEM_BLOCK");
    _Static_assert(CB == 16 && CB_NARROW == 4, "the words ACT_CPU_STEM_BLOCK takes");
    if (blk && *blk && strcmp(blk, "16") && strcmp(blk, "4")) {   /* exactly: '4x' ran as 4 unsaid */
        act_env_ignored("ACT_CPU_STEM_BLOCK", blk, "16 or 4");
        blk = NULL;
    }
    int cb = blk && *blk ? (atoi(blk) == CB ? CB : CB_NARROW)
                         : act_cpu_wide_clone() ? CB : CB_NARROW;
    int Ho = act_conv_out(H, c), Wo = act_conv_out(W, c);
    int Hp = (Ho - 1) * s + k;   /* padded rows read (the pad below may be partly unread) */
    /* columns per parity plane: every block reads PX from ox0 plus up to (k-1)/s */
    int blocks = (Wo + PX - 1) / PX, Wq = blocks * PX + (k - 1) / s;
    size_t taps = (size_t)c->cin * k * k, per_image = (size_t)c->cin * s * Hp * Wq;
    if (Ho < 1 || Wo < 1 || taps * c->cout > ctx->ws_out_elems || per_image > ctx->ws_col_elems)
        return 1;   /* workspaces too small: im2col takes it */
    /* the filter [cout][cin][k][k] turned tap-major into the output workspace */
    float *wt = ctx->ws_out;
    for (int co = 0; co < c->cout; co++)
        for (size_t tp = 0; tp < taps; tp++) wt[tp * c->cout + co] = c->w->data[(size_t)co * taps + tp];
    size_t G = ctx->ws_col_elems / per_image;
    for (int n0 = 0; n0 < N; n0 += (int)G) {
        int g = N - n0 < (int)G ? N - n0 : (int)G;
        stem_job q = {x + (size_t)n0 * c->cin * H * W, ctx->ws_col, wt, c->b ? c->b->data : NULL,
                      y + (size_t)n0 * c->cout * Ho * Wo, c->cin, c->cout, k, s, p, H, W, Hp, Wq,
                      Ho, Wo, epi == ACT_EPI_RELU, cb, {0}};
        for (int kx = 0; kx < k; kx++) q.tap_off[kx] = (size_t)(kx % s) * Hp * Wq + kx / s;
        act_pool_run(ctx->pool, pad_task, &q, g * c->cin * Hp);
        act_pool_run(ctx->pool, row_task, &q, g * Ho);
    }
    ctx->stem_convs++;
    return 0;
}
