/* cpu_winograd.c - 3x3 stride-1 pad-1 convolutions of the CPU backend by Winograd F(2x2,3x3)
 * and F(4x4,3x3).
 * defines: act_cpu_wino_shape, act_cpu_wino_tile, act_cpu_wino_span, act_cpu_wino_rows,
 *          act_cpu_wino_load, act_cpu_wino_free, act_cpu_wino_conv
 *
 * Lavin & Gray's minimal filtering: each m x m output tile is A^T [(G g G^T) . (B^T d B)] A for
 * the (m+2) x (m+2) input patch d around it and the 3x3 filter g. The elementwise product over
 * (cin) is (m+2)^2 independent matrix products, one per position xi of the transformed tile:
 *     M_xi[cout][tiles] = U_xi[cout][cin] x V_xi[cin][tiles]
 * F(2x2): 16 multiply-adds per 4 outputs against 36 directly (2.25x fewer); F(4x4): 36 per 16
 * (4x fewer). The rest of the cost moves into the transforms (a few adds per value,
 * memory-bound), which replace im2col's 9x copy of the input and the epilogue pass: the output
 * transform applies bias, residual and activation as it writes.
 *
 * U = G g G^T is made once per conv at load_weights ((m+2)^2/9 of the filter's floats); a conv
 * the table does not hold (ops built outside a model, or ACT_CPU_WINOGRAD=0) goes through
 * im2col. Which tile a conv gets: act_cpu_wino_tile (ACT_CPU_WINO_TILE=2|4 forces one).
 * Rounding: F(2x2)'s coefficients are 0, +-1 and +-1/2 (exact in binary), so its results differ
 * from im2col's only in the order of fp32 additions (relative ~1e-7 per conv); F(4x4)'s
 * (1/6, 1/24, 4, 5, 8) are not all exact and its sums are longer: ~1e-6 per conv. */
#include <stdlib.h>
#include <string.h>
#include "cpu_ops.h"
#include "forward.h"
#include "util.h"

int act_cpu_wino_shape(const act_conv *c) { return c->k == 3 && c->stride == 1 && c->pad == 1; }

/* F(4x4) up to 128 x 128 channels (ResNet18's layer1-2). Measured on one thread (full model,
 * batch 1, bench/NOTES.md): layer1 -33%, layer2 -27%, but layer3 (256 channels, 16x16 maps)
 * +15% and layer4 +10%: their GEMMs are narrow (few tiles), so packing the 2.25x larger
 * transformed filters every step costs more than the multiplies saved. */
#define WINO4_MAX_FILTER (128 * 128)

int act_cpu_wino_tile(const act_conv *c) {
    const char *e = getenv("ACT_CPU_WINO_TILE");
    if (e && !strcmp(e, "2")) return 2;
    if (e && !strcmp(e, "4")) return 4;
    if (e && *e && strcmp(e, "auto")) act_env_ignored("ACT_CPU_WINO_TILE", e, "2, 4 or auto");
    return (long)c->cout * c->cin <= WINO4_MAX_FILTER ? 4 : 2;
}

/* Images per pass of a conv with tile m. F(4x4) convs take one image at a time: their
 * transformed filters are small next to an image's transformed maps (layer1: 0.6 MB of filters,
 * 1.8 MB of V and as much of M per image), so packing the filters once per image costs less than
 * V and M of three images (5.4 MB each) falling out of a 2 MiB L2 between the transforms and the
 * products. F(2x2) convs (layer3-4) keep the step's cameras together: there the filters are the
 * larger operand (layer4: 16 MB a conv), and reading them three times per step costs more,
 * whether OpenBLAS packs them or act_cpu_pgemm reads them packed (bench/NOTES.md, session 13).
 * ACT_CPU_WINO_GROUP=N forces N (1..64; the workspaces, sized for ACT_CPU_CONV_GROUP images,
 * may hold fewer). */
static int wino_group(int m) {
    const char *e = getenv("ACT_CPU_WINO_GROUP");
    char *end = NULL;
    long g = e && *e ? strtol(e, &end, 10) : 0;
    if (e && *e && !*end && g >= 1 && g <= 64) return (int)g;
    if (e && *e && strcmp(e, "auto")) act_env_ignored("ACT_CPU_WINO_GROUP", e, "1..64 images or auto");
    return m == 4 ? 1 : ACT_CPU_CONV_GROUP;
}

/* Products by act_cpu_pgemm over filters packed at load (cpu_pgemm.c), instead of OpenBLAS packing
 * them on every call: the F(2x2) convs (layer3-4), whose filters are the large operand, where
 * the CPU has AVX-512 and the backend threads the products itself. ACT_CPU_PACKED_GEMM=0: never
 * (OpenBLAS, as before); =all: the F(4x4) convs too. */
static int wino_packed(const act_conv *c, int m) {
    const char *e = getenv("ACT_CPU_PACKED_GEMM");
    if (e && *e && strcmp(e, "0") && strcmp(e, "1") && strcmp(e, "all"))
        act_env_ignored("ACT_CPU_PACKED_GEMM", e, "0, 1 or all");
    if ((e && !strcmp(e, "0")) || c->cout % 8 || !act_cpu_pgemm_ok() || !act_cpu_gemm_split_on())
        return 0;
    return m == 2 || (e && !strcmp(e, "all"));
}

static size_t tiles(int H, int W, int m) { return (size_t)((H + m - 1) / m) * (size_t)((W + m - 1) / m); }

size_t act_cpu_wino_span(const act_conv *c, int H, int W) {
    int m = act_cpu_wino_tile(c);
    return (size_t)(m + 2) * (m + 2) * tiles(H, W, m);
}

/* per thread, the larger of both tiles' row scratch for width W: F(2x2)'s input transform holds
 * 4 padded rows (PW = 2 TW + 2) and its output transform 12 TW; F(4x4)'s 6 rows of 4 TW + 2 and
 * 40 TW */
size_t act_cpu_wino_rows(int W) {
    size_t t2 = (size_t)(W + 1) / 2, t4 = (size_t)(W + 3) / 4;
    size_t f2 = 4 * (2 * t2 + 2) > 12 * t2 ? 4 * (2 * t2 + 2) : 12 * t2;
    size_t f4 = 6 * (4 * t4 + 2) > 40 * t4 ? 6 * (4 * t4 + 2) : 40 * t4;
    return f2 > f4 ? f2 : f4;
}

/* a conv of the model whose filters can be transformed */
static int eligible(const act_conv *c) {
    return act_cpu_wino_shape(c) && c->w && c->w->data && c->w->numel == (int64_t)c->cout * c->cin * 9;
}

/* U[xi][co][ci] for one filter, xi over the (m+2) x (m+2) positions, in double:
 * F(2x2): G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1];
 * F(4x4): G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1] */
static void filter_transform(const float *w, int cout, int cin, int m, int packed, float *u) {
    static const double G2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    static const double G4[6][3] = {{0.25, 0, 0},
                                    {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                    {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                    {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                    {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                    {0, 0, 1}};
    const double(*G)[3] = m == 4 ? G4 : G2;
    int a = m + 2;
    size_t plane = (size_t)cout * cin;
    for (int co = 0; co < cout; co++)
        for (int ci = 0; ci < cin; ci++) {
            const float *g = w + ((size_t)co * cin + ci) * 9;
            double t[6][3];   /* G g */
            for (int i = 0; i < a; i++)
                for (int j = 0; j < 3; j++)
                    t[i][j] = G[i][0] * g[j] + G[i][1] * g[3 + j] + G[i][2] * g[6 + j];
            for (int i = 0; i < a; i++)
                for (int j = 0; j < a; j++)
                    u[(size_t)(i * a + j) * plane +
                      (packed ? act_cpu_pgemm_pack_index(co, ci, cin) : (size_t)co * cin + ci)] =
                        (float)(t[i][0] * G[j][0] + t[i][1] * G[j][1] + t[i][2] * G[j][2]);
        }
}

static void add_conv(const act_conv *c, const act_conv **list, int *tile, int *n, size_t *floats) {
    if (!eligible(c)) return;
    for (int i = 0; i < *n; i++)
        if (list[i]->w == c->w) return;   /* a trunk shared by the cameras appears once */
    if (*n >= ACT_CPU_WINO_MAX) return;    /* more than any ResNet18 set holds: im2col for the rest */
    tile[*n] = act_cpu_wino_tile(c);   /* once: the table is filled with the tile sized here */
    list[(*n)++] = c;
    int a = tile[*n - 1] + 2;
    *floats += (size_t)a * a * c->cout * c->cin;
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
    int tile[ACT_CPU_WINO_MAX];
    int n = 0;
    size_t floats = 0;
    for (int t = 0; t < m->n_trunks; t++)
        for (int l = 0; l < 4; l++)
            for (int i = 0; i < 2; i++) {
                add_conv(&m->trunks[t].blocks[l][i].conv1, list, tile, &n, &floats);
                add_conv(&m->trunks[t].blocks[l][i].conv2, list, tile, &n, &floats);
            }
    if (!n) return 0;
    size_t bytes;
    if (!act_mul_ok(floats, sizeof(float), &bytes) || !(ctx->wino_data = act_aligned_alloc(bytes)))
        return act_errf(err, errlen, "cpu load_weights: out of memory for %zu floats of Winograd "
                        "filters (ACT_CPU_WINOGRAD=0 runs without them)", floats);
    float *u = ctx->wino_data;
    for (int i = 0; i < n; i++) {
        int tm = tile[i];
        int packed = wino_packed(list[i], tm);
        filter_transform(list[i]->w->data, list[i]->cout, list[i]->cin, tm, packed, u);
        ctx->wino[i].w = list[i]->w;
        ctx->wino[i].packed = packed;
        ctx->wino[i].u = u;
        ctx->wino[i].m = tm;
        ctx->wino[i].group = wino_group(tm);
        u += (size_t)(tm + 2) * (tm + 2) * list[i]->cout * list[i]->cin;
    }
    ctx->n_wino = n;
    ctx->wino_bytes = bytes;
    ctx->bytes += bytes;
    return 0;
}

/* the conv's transformed filters, or NULL (not in the model's table) */
static const act_cpu_wino *find(const act_cpu_ctx *ctx, const act_conv *c) {
    for (int i = 0; i < ctx->n_wino; i++)
        if (ctx->wino[i].w == c->w && act_cpu_wino_shape(c)) return &ctx->wino[i];
    return NULL;
}

/* ---- F(2x2,3x3): B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], A^T = [1 1 1 0; 0 1 -1 -1] ---- */

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

/* ---- F(4x4,3x3): the rows of B^T (6 x 6) and A^T (4 x 6) ----
 *   B^T: [4 0 -5 0 1 0]  [0 -4 -4 1 1 0]  [0 4 -4 -1 1 0]  [0 -2 -1 2 1 0]  [0 2 -1 -2 1 0]
 *        [0 4 0 -5 0 1]
 *   A^T: [1 1 1 1 1 0]  [0 1 -1 2 -2 0]  [0 1 1 4 4 0]  [0 1 -1 8 -8 1] */

/* (As for F(2x2): every pointer is a restrict parameter of its own. Pointers derived inside the
 * function from one parameter plus strides are block-scope restrict, which GCC ignores: it then
 * cannot rule out that an output row overlaps an input and leaves the loop scalar.) */

/* B^T d down the columns of six input rows */
ACT_CPU_VEC_CLONES static void vertical6(const float *restrict a0, const float *restrict a1,
                                         const float *restrict a2, const float *restrict a3,
                                         const float *restrict a4, const float *restrict a5,
                                         float *restrict t0, float *restrict t1, float *restrict t2,
                                         float *restrict t3, float *restrict t4, float *restrict t5,
                                         int W) {
    for (int c = 0; c < W; c++) {
        float p = a4[c] - 4.0f * a2[c], q = a3[c] - 4.0f * a1[c];   /* rows 1, 2 */
        float r = a4[c] - a2[c], s = 2.0f * (a3[c] - a1[c]);         /* rows 3, 4 */
        t0[c] = 4.0f * a0[c] - 5.0f * a2[c] + a4[c];
        t1[c] = p + q;
        t2[c] = p - q;
        t3[c] = r + s;
        t4[c] = r - s;
        t5[c] = 4.0f * a1[c] - 5.0f * a3[c] + a5[c];
    }
}

/* (B^T d) B along one padded row: tile tx reads columns 4tx .. 4tx+5 */
ACT_CPU_VEC_CLONES static void horizontal6(const float *restrict q, float *restrict o0, float *restrict o1,
                                           float *restrict o2, float *restrict o3, float *restrict o4,
                                           float *restrict o5, int TW) {
    for (int tx = 0; tx < TW; tx++) {
        const float *d = q + 4 * tx;
        float p = d[4] - 4.0f * d[2], r = d[3] - 4.0f * d[1];
        float u = d[4] - d[2], v = 2.0f * (d[3] - d[1]);
        o0[tx] = 4.0f * d[0] - 5.0f * d[2] + d[4];
        o1[tx] = p + r;
        o2[tx] = p - r;
        o3[tx] = u + v;
        o4[tx] = u - v;
        o5[tx] = 4.0f * d[1] - 5.0f * d[3] + d[5];
    }
}

/* A^T m over six positions' rows into a tile row's four output rows s0..s3 */
ACT_CPU_VEC_CLONES static void column_sums6(const float *restrict m0, const float *restrict m1,
                                            const float *restrict m2, const float *restrict m3,
                                            const float *restrict m4, const float *restrict m5,
                                            float *restrict s0, float *restrict s1, float *restrict s2,
                                            float *restrict s3, int TW) {
    for (int tx = 0; tx < TW; tx++) {
        float a = m1[tx] + m2[tx], b = m1[tx] - m2[tx], c = m3[tx] + m4[tx], d = m3[tx] - m4[tx];
        s0[tx] = m0[tx] + a + c;
        s1[tx] = b + 2.0f * d;
        s2[tx] = a + 4.0f * c;
        s3[tx] = b + 8.0f * d + m5[tx];
    }
}

/* (A^T m) A: a tile's four outputs of one row from its six column sums c0..c5, written side by
 * side into the output row */
ACT_CPU_VEC_CLONES static void row_sums6(const float *restrict c0, const float *restrict c1,
                                         const float *restrict c2, const float *restrict c3,
                                         const float *restrict c4, const float *restrict c5,
                                         float *restrict er, int TW) {
    for (int tx = 0; tx < TW; tx++) {
        float a = c1[tx] + c2[tx], b = c1[tx] - c2[tx], p = c3[tx] + c4[tx], d = c3[tx] - c4[tx];
        er[4 * tx] = c0[tx] + a + p;
        er[4 * tx + 1] = b + 2.0f * d;
        er[4 * tx + 2] = a + 4.0f * p;
        er[4 * tx + 3] = b + 8.0f * d + c5[tx];
    }
}

/* V[xi][ci][j0 + t] for one input plane x (H x W), t = ty * TW + tx over its m x m tiles;
 * xi_stride is the distance between the (m+2)^2 V_xi. The vertical half of B^T d B runs over
 * whole zero-padded rows (t_k[1 + col] for input column col; rows above or below the map read
 * `zero`), the horizontal half over each tile's columns, so both loops vectorize.
 * rows: (m+2) rows of PW = m TW + 2 floats. */
static void input_transform(const float *x, int H, int W, int m, float *v, size_t xi_stride,
                            float *rows, const float *zero) {
    int a = m + 2, TH = (H + m - 1) / m, TW = (W + m - 1) / m, PW = m * TW + 2;
    for (int k = 0; k < a; k++) {   /* the padding columns stay zero */
        float *t = rows + (size_t)k * PW;
        t[0] = 0.0f;
        for (int c = W + 1; c < PW; c++) t[c] = 0.0f;
    }
    for (int ty = 0; ty < TH; ty++) {
        const float *r[6];
        for (int k = 0; k < a; k++) {
            int y = m * ty - 1 + k;
            r[k] = (y >= 0 && y < H) ? x + (size_t)y * W : zero;
        }
        float *o = v + (size_t)ty * TW;
        if (m == 4) {
            float *t = rows + 1;
            vertical6(r[0], r[1], r[2], r[3], r[4], r[5], t, t + PW, t + 2 * PW, t + 3 * PW,
                      t + 4 * PW, t + 5 * PW, W);
            for (int k = 0; k < 6; k++) {
                float *ok = o + (size_t)(6 * k) * xi_stride;
                horizontal6(rows + (size_t)k * PW, ok, ok + xi_stride, ok + 2 * xi_stride,
                            ok + 3 * xi_stride, ok + 4 * xi_stride, ok + 5 * xi_stride, TW);
            }
        } else {
            float *ts[4] = {rows, rows + PW, rows + 2 * PW, rows + 3 * PW};
            vertical(r[0], r[1], r[2], r[3], ts[0] + 1, ts[1] + 1, ts[2] + 1, ts[3] + 1, W);
            for (int k = 0; k < 4; k++)
                horizontal(ts[k], o + (size_t)(4 * k) * xi_stride, o + (size_t)(4 * k + 1) * xi_stride,
                           o + (size_t)(4 * k + 2) * xi_stride, o + (size_t)(4 * k + 3) * xi_stride, TW);
        }
    }
}

/* y (H x W) from M[xi][co][j0 + t]: A^T m A per tile, a row of tiles at a time: the column sums
 * over the positions into s (m rows per position column: 2 x 4 or 4 x 6 rows of TW), the row sums
 * into m output rows of m TW (scratch e), then act_cpu_conv_epilogue.
 * scratch: 12 TW floats (F(2x2)) or 40 TW (F(4x4)). */
static void output_transform(const float *mm, size_t xi_stride, int H, int W, int m, float bias,
                             const float *res, act_epilogue epi, float *y, float *scratch) {
    int TH = (H + m - 1) / m, TW = (W + m - 1) / m;
    float *s = scratch, *e = scratch + (size_t)m * (m + 2) * TW;
    for (int ty = 0; ty < TH; ty++) {
        const float *mt = mm + (size_t)ty * TW;
        if (m == 4) {
            /* s[(r * 6 + j) * TW + tx]: output row r of the tile, position column j; position
             * (i, j) is M_xi with xi = 6 i + j */
            size_t ms = 6 * xi_stride, ss = (size_t)6 * TW;
            for (int j = 0; j < 6; j++) {
                const float *mj = mt + (size_t)j * xi_stride;
                float *sj = s + (size_t)j * TW;
                column_sums6(mj, mj + ms, mj + 2 * ms, mj + 3 * ms, mj + 4 * ms, mj + 5 * ms,
                             sj, sj + ss, sj + 2 * ss, sj + 3 * ss, TW);
            }
            for (int r = 0; r < 4; r++) {
                const float *c = s + (size_t)r * 6 * TW;
                row_sums6(c, c + TW, c + 2 * TW, c + 3 * TW, c + 4 * TW, c + 5 * TW,
                          e + (size_t)r * 4 * TW, TW);
            }
        } else {
            for (int j = 0; j < 4; j++)
                column_sums(mt + (size_t)j * xi_stride, mt + (size_t)(4 + j) * xi_stride,
                            mt + (size_t)(8 + j) * xi_stride, mt + (size_t)(12 + j) * xi_stride,
                            s + (size_t)j * TW, s + (size_t)(4 + j) * TW, TW);
            for (int i = 0; i < 2; i++) {
                const float *c0 = s + (size_t)(4 * i) * TW;
                row_sums(c0, c0 + TW, c0 + 2 * TW, c0 + 3 * TW, e + (size_t)i * 2 * TW, TW);
            }
        }
        int y0 = m * ty;
        for (int i = 0; i < m && y0 + i < H; i++)
            act_cpu_conv_epilogue(y + (size_t)(y0 + i) * W, e + (size_t)i * m * TW, (size_t)W, bias,
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
    int H, W, m, cin, cout;
    act_epilogue epi;
} wino_job;

static void input_task(void *arg, int t, int lo, int hi) {
    const wino_job *q = arg;
    for (int i = lo; i < hi; i++) {
        int j = i / q->cin, ci = i % q->cin;
        input_transform(q->x + ((size_t)j * q->cin + ci) * q->HW, q->H, q->W, q->m,
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
                         q->H, q->W, q->m, q->bias ? q->bias[co] : 0.0f, q->res ? q->res + o : NULL,
                         q->epi, q->y + o, q->rows + (size_t)t * q->rows_stride);
    }
}

/* the products of positions [lo, hi) (one-thread GEMMs, side by side on the pool's threads) */
typedef struct gemm_job {
    const float *u, *V;
    float *M;
    size_t vxi, mxi;
    int GT, cin, cout, packed;
} gemm_job;

static void gemm_task(void *arg, int t, int lo, int hi) {
    const gemm_job *q = arg;
    for (int xi = lo; xi < hi; xi++) {
        const float *u = q->u + (size_t)xi * q->cout * q->cin, *v = q->V + (size_t)xi * q->vxi;
        float *mm = q->M + (size_t)xi * q->mxi;
        if (q->packed) act_cpu_pgemm(q->cout, q->GT, q->cin, u, v, q->GT, mm, q->GT);
        else act_cpu_sgemm(0, q->cout, q->GT, q->cin, u, q->cin, v, q->GT, mm, q->GT);
    }
}

/* Groups of up to the conv's group images (wino_group; fewer if the workspaces, sized by
 * act_cpu_conv_workspace for the model's maps, hold fewer): the group's tiles side by side in V
 * and M (so each of the (m+2)^2 GEMMs is as wide as the group), V in ws_col, M in ws_out. The
 * transforms run on the backend's threads (one scratch of ws_rows_elems each, then the zero row,
 * zeroed at allocation and never written), and so do the GEMMs, whole ones side by side (each
 * thread packs only its own positions' filters), unless ACT_CPU_SPLIT_GEMM=0 hands each to
 * OpenBLAS's threads. */
int act_cpu_wino_conv(act_cpu_ctx *ctx, const act_conv *c, const float *x, int N, int H, int W,
                      const float *residual, act_epilogue epi, float *y) {
    const act_cpu_wino *e = find(ctx, c);
    if (!e) return 1;
    const float *u = e->u;
    int m = e->m, P = (m + 2) * (m + 2);
    size_t T = tiles(H, W, m), HW = (size_t)H * W, G = (size_t)e->group;
    int cin = c->cin, cout = c->cout, nt = act_pool_threads(ctx->pool);
    if (G > ctx->ws_col_elems / (P * (size_t)cin * T)) G = ctx->ws_col_elems / (P * (size_t)cin * T);
    if (G > ctx->ws_out_elems / (P * (size_t)cout * T)) G = ctx->ws_out_elems / (P * (size_t)cout * T);
    if (G < 1 || ctx->ws_rows_elems < act_cpu_wino_rows(W)) return 1;   /* a larger map than the model's */
    const float *zero = ctx->ws_rows + (size_t)nt * ctx->ws_rows_elems;
    ctx->wino_convs++;
    if (m == 4) ctx->wino4_convs++;
    if (e->packed) ctx->packed_convs++;
    for (int n0 = 0; n0 < N; n0 += (int)G) {
        int g = N - n0 < (int)G ? N - n0 : (int)G;
        size_t GT = (size_t)g * T, vxi = (size_t)cin * GT, mxi = (size_t)cout * GT;
        wino_job q = {x + (size_t)n0 * cin * HW, residual ? residual + (size_t)n0 * cout * HW : NULL,
                      y + (size_t)n0 * cout * HW, ctx->ws_col, ctx->ws_out,
                      c->b ? c->b->data : NULL, zero, ctx->ws_rows, ctx->ws_rows_elems, T, GT, HW,
                      H, W, m, cin, cout, epi};
        act_pool_run(ctx->pool, input_task, &q, g * cin);
        gemm_job gq = {u, q.V, q.M, vxi, mxi, (int)GT, cin, cout, e->packed};
        if (act_cpu_gemm_split_on())
            act_pool_run(ctx->pool, gemm_task, &gq, P);   /* positions over the threads */
        else
            gemm_task(&gq, 0, 0, P);                        /* each product threaded by OpenBLAS */
        act_pool_run(ctx->pool, output_task, &q, g * cout);
    }
    return 0;
}
