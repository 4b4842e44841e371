/* cpu_winograd.c - 3x3 stride-1 pad-1 convolutions of the CPU backend by Winograd F(2x2, 3x3).
 * defines: act_cpu_wino_shape, act_cpu_wino_tiles, act_cpu_wino_rows, act_cpu_wino_load,
 *          act_cpu_wino_free, act_cpu_wino_conv
 *
 * Lavin & Gray's minimal filtering: each 2x2 output tile is A^T [(G g G^T) . (B^T d B)] A for the
 * 4x4 input patch d around it and the 3x3 filter g. The elementwise product over (cin) is 16
 * independent matrix products, one per position xi of the 4x4 transformed tile:
 *     M_xi[cout][tiles] = U_xi[cout][cin] x V_xi[cin][tiles]
 * That is 16 multiply-adds per 4 outputs against 36 directly: 2.25x fewer for ResNet18's 3x3
 * stride-1 convs, which are ~83% of the trunk's arithmetic. The rest of the cost moves into the
 * transforms (a few adds per value, memory-bound), which replace im2col's 9x copy of the input
 * and the epilogue pass: the output transform applies bias, residual and activation as it writes.
 *
 * U = G g G^T is made once per conv at load_weights (16/9 of the filter's floats); a conv the
 * table does not hold (ops built outside a model, or ACT_CPU_WINOGRAD=0) goes through im2col.
 * Rounding: the transforms' coefficients are 0, +-1 and +-1/2 (exact in binary), so the results
 * differ from im2col's only in the order of fp32 additions (relative ~1e-7 per conv). */
#include <stdlib.h>
#include <string.h>
#include "cpu_ops.h"
#include "forward.h"
#include "util.h"

int act_cpu_wino_shape(const act_conv *c) { return c->k == 3 && c->stride == 1 && c->pad == 1; }

/* a conv of the model whose filters can be transformed */
static int eligible(const act_conv *c) {
    return act_cpu_wino_shape(c) && c->w && c->w->data && c->w->numel == (int64_t)c->cout * c->cin * 9;
}

size_t act_cpu_wino_tiles(int H, int W) { return (size_t)((H + 1) / 2) * (size_t)((W + 1) / 2); }

/* the input transform's 4 padded rows (4 PW) or the output transform's 12 TW, PW = 2 TW + 2 */
size_t act_cpu_wino_rows(int W) { return 6 * (size_t)(2 * ((W + 1) / 2) + 2); }

/* U[xi][co][ci] for one filter; G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1], in double. */
static void filter_transform(const float *w, int cout, int cin, float *u) {
    static const double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    size_t plane = (size_t)cout * cin;
    for (int co = 0; co < cout; co++)
        for (int ci = 0; ci < cin; ci++) {
            const float *g = w + ((size_t)co * cin + ci) * 9;
            double t[4][3];   /* G g */
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 3; j++)
                    t[i][j] = G[i][0] * g[j] + G[i][1] * g[3 + j] + G[i][2] * g[6 + j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++)
                    u[(size_t)(i * 4 + j) * plane + (size_t)co * cin + ci] =
                        (float)(t[i][0] * G[j][0] + t[i][1] * G[j][1] + t[i][2] * G[j][2]);
        }
}

static void add_conv(const act_conv *c, const act_conv **list, int *n, size_t *floats) {
    if (!eligible(c)) return;
    for (int i = 0; i < *n; i++)
        if (list[i]->w == c->w) return;   /* a trunk shared by the cameras appears once */
    if (*n >= ACT_CPU_WINO_MAX) return;    /* more than any ResNet18 set holds: im2col for the rest */
    list[(*n)++] = c;
    *floats += (size_t)16 * c->cout * c->cin;
}

void act_cpu_wino_free(act_cpu_ctx *ctx) {
    ctx->bytes -= ctx->wino_bytes;
    act_aligned_free(ctx->wino_data);
    ctx->wino_data = NULL;
    ctx->wino_bytes = 0;
    ctx->n_wino = 0;
}

int act_cpu_wino_load(act_cpu_ctx *ctx, const act_model *m, char *err, size_t errlen) {
    act_cpu_wino_free(ctx);
    if (!act_cpu_switch_on("ACT_CPU_WINOGRAD")) return 0;
    const act_conv *list[ACT_CPU_WINO_MAX];
    int n = 0;
    size_t floats = 0;
    for (int t = 0; t < m->n_trunks; t++)
        for (int l = 0; l < 4; l++)
            for (int i = 0; i < 2; i++) {
                add_conv(&m->trunks[t].blocks[l][i].conv1, list, &n, &floats);
                add_conv(&m->trunks[t].blocks[l][i].conv2, list, &n, &floats);
            }
    if (!n) return 0;
    size_t bytes;
    if (!act_mul_ok(floats, sizeof(float), &bytes) || !(ctx->wino_data = act_aligned_alloc(bytes)))
        return act_errf(err, errlen, "cpu load_weights: out of memory for %zu floats of Winograd "
                        "filters (ACT_CPU_WINOGRAD=0 runs without them)", floats);
    float *u = ctx->wino_data;
    for (int i = 0; i < n; i++) {
        filter_transform(list[i]->w->data, list[i]->cout, list[i]->cin, u);
        ctx->wino[i].w = list[i]->w;
        ctx->wino[i].u = u;
        u += (size_t)16 * list[i]->cout * list[i]->cin;
    }
    ctx->n_wino = n;
    ctx->wino_bytes = bytes;
    ctx->bytes += bytes;
    return 0;
}

/* the conv's transformed filters, or NULL (not in the model's table) */
static const float *find(const act_cpu_ctx *ctx, const act_conv *c) {
    for (int i = 0; i < ctx->n_wino; i++)
        if (ctx->wino[i].w == c->w && act_cpu_wino_shape(c)) return ctx->wino[i].u;
    return NULL;
}

/* B^T d down the columns of four input rows (GCC honours restrict on parameters only, so the
 * vectorizable loops are functions of their own) */
ACT_CPU_VEC_CLONES static void vertical(const float *restrict a0, const float *restrict a1, const float *restrict a2,
                     const float *restrict a3, float *restrict t0, float *restrict t1,
                     float *restrict t2, float *restrict t3, int W) {
    for (int c = 0; c < W; c++) {
        t0[c] = a0[c] - a2[c];
        t1[c] = a1[c] + a2[c];
        t2[c] = a2[c] - a1[c];
        t3[c] = a1[c] - a3[c];
    }
}

/* (B^T d) B along one padded row: tile tx reads columns 2tx .. 2tx+3 */
ACT_CPU_VEC_CLONES static void horizontal(const float *restrict q, float *restrict o0, float *restrict o1,
                       float *restrict o2, float *restrict o3, int TW) {
    for (int tx = 0; tx < TW; tx++) {
        float q0 = q[2 * tx], q1 = q[2 * tx + 1], q2 = q[2 * tx + 2], q3 = q[2 * tx + 3];
        o0[tx] = q0 - q2;
        o1[tx] = q1 + q2;
        o2[tx] = q2 - q1;
        o3[tx] = q1 - q3;
    }
}

/* V[xi][ci][j0 + t] for one input plane x (H x W), t = ty * TW + tx over its tiles; xi_stride
 * is the distance between the 16 V_xi. The vertical half of B^T d B runs over whole zero-padded
 * rows (t_k[1 + col] for input column col; rows above or below the map read `zero`), the
 * horizontal half over column pairs, so both loops vectorize. rows: 4 * PW floats. */
static void input_transform(const float *x, int H, int W, float *v, size_t xi_stride,
                            float *rows, const float *zero) {
    int TH = (H + 1) / 2, TW = (W + 1) / 2, PW = 2 * TW + 2;
    float *ts[4] = {rows, rows + PW, rows + 2 * PW, rows + 3 * PW};
    for (int k = 0; k < 4; k++) {   /* the padding columns stay zero */
        ts[k][0] = 0.0f;
        for (int c = W + 1; c < PW; c++) ts[k][c] = 0.0f;
    }
    for (int ty = 0; ty < TH; ty++) {
        const float *r[4];
        for (int k = 0; k < 4; k++) {
            int y = 2 * ty - 1 + k;
            r[k] = (y >= 0 && y < H) ? x + (size_t)y * W : zero;
        }
        vertical(r[0], r[1], r[2], r[3], ts[0] + 1, ts[1] + 1, ts[2] + 1, ts[3] + 1, W);
        float *o = v + (size_t)ty * TW;
        for (int k = 0; k < 4; k++)
            horizontal(ts[k], o + (size_t)(4 * k) * xi_stride, o + (size_t)(4 * k + 1) * xi_stride,
                       o + (size_t)(4 * k + 2) * xi_stride, o + (size_t)(4 * k + 3) * xi_stride, TW);
    }
}

/* A^T m over the positions' rows: s0 = m0 + m1 + m2, s1 = m1 - m2 - m3 */
ACT_CPU_VEC_CLONES static void column_sums(const float *restrict pa, const float *restrict pb, const float *restrict pc,
                        const float *restrict pd, float *restrict s0, float *restrict s1, int TW) {
    for (int tx = 0; tx < TW; tx++) {
        s0[tx] = pa[tx] + pb[tx] + pc[tx];
        s1[tx] = pb[tx] - pc[tx] - pd[tx];
    }
}

/* (A^T m) A: the tile's two outputs of one row, interleaved into the output row */
ACT_CPU_VEC_CLONES static void row_sums(const float *restrict c0, const float *restrict c1, const float *restrict c2,
                     const float *restrict c3, float *restrict er, int TW) {
    for (int tx = 0; tx < TW; tx++) {
        er[2 * tx] = c0[tx] + c1[tx] + c2[tx];
        er[2 * tx + 1] = c1[tx] - c2[tx] - c3[tx];
    }
}

/* y (H x W) from M[xi][co][j0 + t]: A^T m A with A^T = [1 1 1 0; 0 1 -1 -1] per tile, a row of
 * tiles at a time: the column sums over the 4x4 positions into s (8 rows of TW), the row sums
 * into two interleaved output rows of 2 TW (scratch e), then act_cpu_conv_epilogue.
 * scratch: 12 TW floats. */
static void output_transform(const float *mm, size_t xi_stride, int H, int W, float bias,
                             const float *res, act_epilogue epi, float *y, float *scratch) {
    int TH = (H + 1) / 2, TW = (W + 1) / 2;
    float *s = scratch, *e = scratch + 8 * (size_t)TW;
    for (int ty = 0; ty < TH; ty++) {
        const float *m = mm + (size_t)ty * TW;
        for (int j = 0; j < 4; j++)
            column_sums(m + (size_t)j * xi_stride, m + (size_t)(4 + j) * xi_stride,
                        m + (size_t)(8 + j) * xi_stride, m + (size_t)(12 + j) * xi_stride,
                        s + (size_t)j * TW, s + (size_t)(4 + j) * TW, TW);
        for (int i = 0; i < 2; i++) {
            const float *c0 = s + (size_t)(4 * i) * TW;
            row_sums(c0, c0 + TW, c0 + 2 * TW, c0 + 3 * TW, e + (size_t)i * 2 * TW, TW);
        }
        int y0 = 2 * ty;
        for (int i = 0; i < 2 && y0 + i < H; i++)
            act_cpu_conv_epilogue(y + (size_t)(y0 + i) * W, e + (size_t)i * 2 * TW, (size_t)W, bias,
                                  res ? res + (size_t)(y0 + i) * W : NULL, epi);
    }
}

/* One group of images, for the pool's tasks: item i is (image j, channel), j = i / channels */
typedef struct wino_job {
    const float *x, *res;     /* the group's first image (input, residual or NULL) */
    float *y, *V, *M;
    const float *bias, *zero;
    float *rows;              /* thread t's scratch: rows + t * rows_stride */
    size_t rows_stride, T, GT, HW;
    int H, W, cin, cout;
    act_epilogue epi;
} wino_job;

static void input_task(void *arg, int t, int lo, int hi) {
    const wino_job *q = arg;
    for (int i = lo; i < hi; i++) {
        int j = i / q->cin, ci = i % q->cin;
        input_transform(q->x + ((size_t)j * q->cin + ci) * q->HW, q->H, q->W,
                        q->V + (size_t)ci * q->GT + (size_t)j * q->T, (size_t)q->cin * q->GT,
                        q->rows + (size_t)t * q->rows_stride, q->zero);
    }
}

static void output_task(void *arg, int t, int lo, int hi) {
    const wino_job *q = arg;
    for (int i = lo; i < hi; i++) {
        int j = i / q->cout, co = i % q->cout;
        size_t o = ((size_t)j * q->cout + co) * q->HW;
        output_transform(q->M + (size_t)co * q->GT + (size_t)j * q->T, (size_t)q->cout * q->GT,
                         q->H, q->W, q->bias ? q->bias[co] : 0.0f, q->res ? q->res + o : NULL,
                         q->epi, q->y + o, q->rows + (size_t)t * q->rows_stride);
    }
}

/* Groups of up to ACT_CPU_CONV_GROUP images (fewer if the workspaces, sized by
 * act_cpu_conv_workspace for the model's maps, hold fewer): the group's tiles side by side in V
 * and M (so each of the 16 GEMMs is as wide as the group), V in ws_col, M in ws_out. The
 * transforms run on the backend's threads (one scratch of ws_rows_elems each, then the zero row,
 * zeroed at allocation and never written), the GEMMs on OpenBLAS's. */
int act_cpu_wino_conv(act_cpu_ctx *ctx, const act_conv *c, const float *x, int N, int H, int W,
                      const float *residual, act_epilogue epi, float *y) {
    const float *u = find(ctx, c);
    if (!u) return 1;
    size_t T = act_cpu_wino_tiles(H, W), HW = (size_t)H * W, G = ACT_CPU_CONV_GROUP;
    int cin = c->cin, cout = c->cout, nt = act_pool_threads(ctx->pool);
    if (G > ctx->ws_col_elems / (16 * (size_t)cin * T)) G = ctx->ws_col_elems / (16 * (size_t)cin * T);
    if (G > ctx->ws_out_elems / (16 * (size_t)cout * T)) G = ctx->ws_out_elems / (16 * (size_t)cout * T);
    if (G < 1 || ctx->ws_rows_elems < act_cpu_wino_rows(W)) return 1;   /* a larger map than the model's */
    const float *zero = ctx->ws_rows + (size_t)nt * ctx->ws_rows_elems;
    ctx->wino_convs++;
    for (int n0 = 0; n0 < N; n0 += (int)G) {
        int g = N - n0 < (int)G ? N - n0 : (int)G;
        size_t GT = (size_t)g * T, vxi = (size_t)cin * GT, mxi = (size_t)cout * GT;
        wino_job q = {x + (size_t)n0 * cin * HW, residual ? residual + (size_t)n0 * cout * HW : NULL,
                      y + (size_t)n0 * cout * HW, ctx->ws_col, ctx->ws_out,
                      c->b ? c->b->data : NULL, zero, ctx->ws_rows, ctx->ws_rows_elems, T, GT, HW,
                      H, W, cin, cout, epi};
        act_pool_run(ctx->pool, input_task, &q, g * cin);
        for (int xi = 0; xi < 16; xi++)
            act_cpu_sgemm(0, cout, (int)GT, cin, u + (size_t)xi * cout * cin, cin,
                          q.V + (size_t)xi * vxi, (int)GT, q.M + (size_t)xi * mxi, (int)GT);
        act_pool_run(ctx->pool, output_task, &q, g * cout);
    }
    return 0;
}
