/* cpu_vision.c - the vision ops of the CPU backend: preprocess, conv2d, groupnorm, maxpool,
 * spatial softmax. Feature maps are NCHW fp32.
 * defines: cpu_preprocess, cpu_conv2d, cpu_groupnorm, cpu_maxpool, cpu_spatial_softmax,
 *          act_cpu_conv_workspace
 *
 * Convolutions are im2col + one sgemm per group of images (y[cout][P] = W[cout][cin*k*k] x
 * col[..][P], see cpu_conv2d); a lone 1x1 stride-1 conv multiplies the input map directly. Bias,
 * residual and ReLU are applied in one pass over the output (the fused epilogue), in PyTorch's
 * order: conv + bias, + residual, then the activation. Preprocessing follows PyTorch to the rounding rule (see cpu_preprocess). */
#include <math.h>
#include <string.h>
#include "cpu_ops.h"
#include "forward.h"
#include "util.h"

static float *f32(act_buf b) { return (float *)b.p; }

static void conv_ws(const act_conv *c, int H, int W, size_t *col, size_t *out, size_t *rows) {
    int Ho = act_conv_out(H, c), Wo = act_conv_out(W, c);
    if (Ho < 1 || Wo < 1) return;
    size_t P = (size_t)Ho * Wo, n = (size_t)c->cin * c->k * c->k * P, o = (size_t)c->cout * P;
    if (act_cpu_wino_shape(c)) {   /* Winograd: V and M, (m+2)^2 per tile */
        size_t span = act_cpu_wino_span(c, H, W), r = act_cpu_wino_rows(W);
        if (span * c->cin > n) n = span * c->cin;
        if (span * c->cout > o) o = span * c->cout;
        if (r > *rows) *rows = r;
    }
    if (n > *col) *col = n;
    if (o > *out) *out = o;
}

int act_cpu_conv_workspace(const act_model *m, size_t *col_elems, size_t *out_elems,
                           size_t *rows_elems, char *err, size_t errlen) {
    act_trunk_geom g;
    if (act_trunk_geometry(m, &g, err, errlen)) return -1;
    size_t col = 0, out = 0, rows = 0;
    for (int t = 0; t < m->n_trunks; t++) {
        const act_trunk *tr = &m->trunks[t];
        conv_ws(&tr->conv1, g.in_h, g.in_w, &col, &out, &rows);
        int H = g.pool_h, W = g.pool_w;
        for (int l = 0; l < 4; l++)
            for (int i = 0; i < 2; i++) {
                const act_block *b = &tr->blocks[l][i];
                conv_ws(&b->conv1, H, W, &col, &out, &rows);
                if (b->has_down) conv_ws(&b->down, H, W, &col, &out, &rows);
                H = act_conv_out(H, &b->conv1);
                W = act_conv_out(W, &b->conv1);
                conv_ws(&b->conv2, H, W, &col, &out, &rows);
            }
        if (tr->kp_w) {   /* the keypoint 1x1 conv on the final map */
            act_conv kp = {tr->kp_w, NULL, NULL, NULL, (int)tr->kp_w->dims[1], (int)tr->kp_w->dims[0], 1, 1, 0};
            conv_ws(&kp, H, W, &col, &out, &rows);
        }
    }
    *col_elems = col;
    *out_elems = out;
    *rows_elems = rows;
    return 0;
}

/* Bilinear source index as PyTorch's upsample_bilinear2d with align_corners=False and no
 * antialias: src = scale * (dst + 0.5) - 0.5 in float, clamped at 0 (area_pixel_compute_source
 * _index), i0 = floor, i1 = i0 + 1 unless at the last pixel, lambda = src - i0. */
static void bilinear_index(int dst, int in, float scale, int *i0, int *i1, float *l1) {
    float src = scale * ((float)dst + 0.5f) - 0.5f;
    if (src < 0.0f) src = 0.0f;
    int i = (int)src;
    if (i > in - 1) i = in - 1;
    float l = src - (float)i;
    if (l > 1.0f) l = 1.0f;
    *i0 = i;
    *i1 = i + (i < in - 1 ? 1 : 0);
    *l1 = l;
}

typedef struct pre_job {
    const uint8_t *src;
    float *dst;
    int hi, wi, oh, ow, top, left, norm;
    float sh, sw;
    float u[256];          /* v / 255 for every byte value v */
    float un[3][256];      /* the same, then normalized as channel c is: the no-resize path */
} pre_job;

static const float pre_mean[3] = {0.485f, 0.456f, 0.406f}, pre_std[3] = {0.229f, 0.224f, 0.225f};

/* items: rows of output images (image n = i / oh, row y = i % oh), all three channels. Bytes
 * become floats through the job's tables, which hold what the divisions would give. */
static void preprocess_task(void *arg, int t, int lo, int hi_) {
    const float *mean = pre_mean, *stdv = pre_std;
    const pre_job *q = arg;
    int hi = q->hi, wi = q->wi, oh = q->oh, ow = q->ow;
    (void)t;
    for (int i = lo; i < hi_; i++) {
        int n = i / oh, y = i % oh;
        const uint8_t *img = q->src + (size_t)n * hi * wi * 3;
        float *o = q->dst + (size_t)n * 3 * oh * ow;
        if (q->sh == 1.0f && q->sw == 1.0f) {   /* no resize: the bilinear weights are 1 and 0 */
            const uint8_t *row = img + ((size_t)(y + q->top) * wi + q->left) * 3;
            for (int c = 0; c < 3; c++) {
                float *oc = o + ((size_t)c * oh + y) * ow;
                const float *un = q->un[c];
                for (int x = 0; x < ow; x++) oc[x] = un[row[(size_t)x * 3 + c]];
            }
            continue;
        }
        int y0, y1;
        float ly;
        bilinear_index(y + q->top, hi, q->sh, &y0, &y1, &ly);
        for (int x = 0; x < ow; x++) {
            int x0, x1;
            float lx;
            bilinear_index(x + q->left, wi, q->sw, &x0, &x1, &lx);
            for (int c = 0; c < 3; c++) {
                float p00 = q->u[img[((size_t)y0 * wi + x0) * 3 + c]];
                float p01 = q->u[img[((size_t)y0 * wi + x1) * 3 + c]];
                float p10 = q->u[img[((size_t)y1 * wi + x0) * 3 + c]];
                float p11 = q->u[img[((size_t)y1 * wi + x1) * 3 + c]];
                float t0 = p00 * (1.0f - lx) + p01 * lx;
                float t1 = p10 * (1.0f - lx) + p11 * lx;
                float v = t0 * (1.0f - ly) + t1 * ly;
                if (q->norm) v = (v - mean[c]) / stdv[c];
                o[((size_t)c * oh + y) * ow + x] = v;
            }
        }
    }
}

/* uint8 HWC -> /255 -> bilinear resize to (input_h, input_w) -> center crop (torchvision
 * CenterCrop: top = int(round((H - ch) / 2.0)), round half to even, which rintf does in the
 * default rounding mode) -> ImageNet (x - mean) / std. Only the cropped window is computed;
 * output rows are spread over the backend's threads. The side normalizations follow. */
int cpu_preprocess(act_backend *be, act_buf frames, int B, int hi, int wi, const act_config *cfg,
                   act_buf out, const act_norm_job *side, int nside) {
    int rh = cfg->input_h, rw = cfg->input_w;
    int oh = cfg->crop_h > 0 ? cfg->crop_h : rh, ow = cfg->crop_w > 0 ? cfg->crop_w : rw;
    if (hi < 1 || wi < 1 || rh < 1 || rw < 1 || oh > rh || ow > rw)
        return act_errf(be->err, sizeof be->err,
                        "cpu preprocess: frame %dx%d, resize %dx%d, crop %dx%d is not a valid "
                        "pipeline", hi, wi, rh, rw, oh, ow);
    if (nside < 0 || nside > ACT_MAX_NORM_JOBS)
        return act_errf(be->err, sizeof be->err, "cpu preprocess: %d side normalizations (at "
                        "most %d)", nside, ACT_MAX_NORM_JOBS);
    pre_job q = {(const uint8_t *)frames.p, f32(out), hi, wi, oh, ow,
                 (int)rintf((float)(rh - oh) / 2.0f), (int)rintf((float)(rw - ow) / 2.0f),
                 cfg->imagenet_norm, (float)hi / (float)rh, (float)wi / (float)rw, {0}, {{0}}};
    for (int v = 0; v < 256; v++) {
        q.u[v] = v / 255.0f;
        for (int c = 0; c < 3; c++)
            q.un[c][v] = q.norm ? (q.u[v] - pre_mean[c]) / pre_std[c] : q.u[v];
    }
    act_pool_run(((act_cpu_ctx *)be->ctx)->pool, preprocess_task, &q, B * oh);
    for (int j = 0; j < nside; j++) {   /* the side normalizations: one launch on CUDA */
        const act_norm_job *n = &side[j];
        if (cpu_normalize(be, n->x, n->rows, n->dim, n->lo, n->hi, n->type, n->eps, 0, n->y))
            return -1;
    }
    return 0;
}

/* Output columns [*lo, *hi) read an input column inside [0, W) for kernel offset kw. */
static void valid_cols(int Wo, int W, int s, int p, int kw, int *lo, int *hi) {
    int a = 0, b = Wo;
    while (a < b && a * s - p + kw < 0) a++;
    while (b > a && (b - 1) * s - p + kw >= W) b--;
    *lo = a;
    *hi = b;
}

/* col[(ci, kh, kw)][oh * Wo + ow] = x[ci][oh*s - p + kh][ow*s - p + kw], zero outside the map,
 * for the channels ci in [c0, c1). Row r of the matrix starts at col + r * ld (ld >= Ho*Wo:
 * images of a group side by side). The valid column range is computed once per kernel column,
 * so the inner loop has no bounds checks (a plain copy at stride 1). */
static void im2col(const float *x, int c0, int c1, int H, int W, int k, int s, int p, int Ho,
                   int Wo, float *col, size_t ld) {
    for (int kw = 0; kw < k; kw++) {
        int lo, hi;
        valid_cols(Wo, W, s, p, kw, &lo, &hi);
        for (int ci = c0; ci < c1; ci++)
            for (int kh = 0; kh < k; kh++) {
                float *dst = col + ((size_t)(ci * k + kh) * k + kw) * ld;
                for (int oh = 0; oh < Ho; oh++) {
                    int ih = oh * s - p + kh;
                    float *d = dst + (size_t)oh * Wo;
                    if (ih < 0 || ih >= H || lo >= hi) {
                        memset(d, 0, sizeof(float) * Wo);
                        continue;
                    }
                    const float *row = x + ((size_t)ci * H + ih) * W + (kw - p);
                    for (int ow = 0; ow < lo; ow++) d[ow] = 0.0f;
                    if (s == 1) {
                        memcpy(d + lo, row + lo, sizeof(float) * (hi - lo));
                    } else {
                        for (int ow = lo; ow < hi; ow++) d[ow] = row[(size_t)ow * s];
                    }
                    for (int ow = hi; ow < Wo; ow++) d[ow] = 0.0f;
                }
            }
    }
}

/* one loop per case so each vectorizes; static: clang 14 cannot call a multiversioned function
 * from another file (its callers there want a symbol its definition does not export), so the
 * other files call the plain act_cpu_conv_epilogue below */
ACT_CPU_VEC_CLONES static void conv_epilogue(float *o, const float *g, size_t P, float b, const float *r,
                                             act_epilogue epi) {
    if (r && epi == ACT_EPI_RELU) {
        for (size_t i = 0; i < P; i++) {
            float t = (g[i] + b) + r[i];
            o[i] = t < 0.0f ? 0.0f : t;
        }
    } else if (!r && epi == ACT_EPI_RELU) {
        for (size_t i = 0; i < P; i++) {
            float t = g[i] + b;
            o[i] = t < 0.0f ? 0.0f : t;
        }
    } else if (epi == ACT_EPI_NONE) {
        if (r) {
            for (size_t i = 0; i < P; i++) o[i] = (g[i] + b) + r[i];
        } else {
            for (size_t i = 0; i < P; i++) o[i] = g[i] + b;
        }
    } else {
        for (size_t i = 0; i < P; i++) o[i] = act_cpu_epi((g[i] + b) + (r ? r[i] : 0.0f), epi);
    }
}

void act_cpu_conv_epilogue(float *o, const float *g, size_t P, float b, const float *r, act_epilogue epi) {
    conv_epilogue(o, g, P, b, r, epi);
}

/* One group of images of a conv, for the pool's tasks: item i is (image j, channel) with
 * j = i / channels; im2col and the 1x1 copy walk input channels, the epilogue output ones. */
typedef struct conv_job {
    const act_conv *c;
    const float *xin;         /* the group's first image */
    int H, W, Ho, Wo;
    size_t P, NP, HW;
    float *col, *out0, *gout;
    const float *res0, *bias; /* residual of the group's first image, or NULL */
    act_epilogue epi;
} conv_job;

static void im2col_task(void *arg, int t, int lo, int hi) {
    const conv_job *q = arg;
    int cin = q->c->cin;
    (void)t;
    for (int i = lo; i < hi;) {   /* runs of channels of one image */
        int j = i / cin, c0 = i % cin, c1 = cin;
        if (c1 - c0 > hi - i) c1 = c0 + (hi - i);
        im2col(q->xin + (size_t)j * cin * q->HW, c0, c1, q->H, q->W, q->c->k, q->c->stride,
               q->c->pad, q->Ho, q->Wo, q->col + (size_t)j * q->P, q->NP);
        i += c1 - c0;
    }
}

static void copy_task(void *arg, int t, int lo, int hi) {   /* 1x1 stride 1: images side by side */
    const conv_job *q = arg;
    int cin = q->c->cin;
    (void)t;
    for (int i = lo; i < hi; i++) {
        int j = i / cin, ci = i % cin;
        memcpy(q->col + (size_t)ci * q->NP + (size_t)j * q->P,
               q->xin + ((size_t)j * cin + ci) * q->HW, sizeof(float) * q->P);
    }
}

static void epilogue_task(void *arg, int t, int lo, int hi) {
    const conv_job *q = arg;
    int cout = q->c->cout;
    (void)t;
    for (int i = lo; i < hi; i++) {
        int j = i / cout, co = i % cout;
        size_t o = ((size_t)j * cout + co) * q->P;
        conv_epilogue(q->out0 + o, q->gout + (size_t)co * q->NP + (size_t)j * q->P, q->P,
                      q->bias ? q->bias[co] : 0.0f, q->res0 ? q->res0 + o : NULL, q->epi);
    }
}

/* Images go through the GEMM in groups: the group's im2col matrices side by side
 * ([cin*k*k][g*P]), one GEMM into [cout][g*P], and the epilogue writes each image's NCHW
 * block. A group of one image multiplies straight into the output (and a 1x1 stride-1 conv
 * needs no im2col at all). im2col and the epilogue run on the backend's threads
 * (pool.c), the GEMM too (act_cpu_sgemm_split); 3x3 stride-1 convs go to cpu_winograd.c. */
int cpu_conv2d(act_backend *be, const act_conv *c, act_buf x, int N, int H, int W,
               act_buf residual, act_epilogue epi, act_buf y) {
    act_cpu_ctx *ctx = be->ctx;
    int k = c->k, s = c->stride, p = c->pad;
    int Ho = act_conv_out(H, c), Wo = act_conv_out(W, c);
    if (Ho < 1 || Wo < 1 || !c->w)
        return act_errf(be->err, sizeof be->err, "cpu conv2d: %dx%d input too small for k=%d "
                        "stride=%d pad=%d", H, W, k, s, p);
    size_t P = (size_t)Ho * Wo, Kd = (size_t)c->cin * k * k, HW = (size_t)H * W;
    int wino = act_cpu_wino_conv(ctx, c, f32(x), N, H, W, residual.p ? f32(residual) : NULL, epi, f32(y));
    if (wino <= 0) return wino;   /* 1: not a Winograd conv of this model */
    int stem = act_cpu_stem_conv(ctx, c, f32(x), N, H, W, residual.p ? f32(residual) : NULL, epi, f32(y));
    if (stem <= 0) return stem;   /* 1: not a stem-like conv: im2col below */
    int direct = k == 1 && s == 1 && p == 0;
    size_t G = ACT_CPU_CONV_GROUP;
    if (G > ctx->ws_col_elems / (Kd * P)) G = ctx->ws_col_elems / (Kd * P);
    if (G > ctx->ws_out_elems / ((size_t)c->cout * P)) G = ctx->ws_out_elems / ((size_t)c->cout * P);
    if (G < 1 && !direct)
        return act_errf(be->err, sizeof be->err, "cpu conv2d: '%s' on %dx%d needs %zu + %zu "
                        "workspace floats, have %zu + %zu (load_weights sized them for another "
                        "model)", c->w->name, H, W, Kd * P, (size_t)c->cout * P,
                        ctx->ws_col_elems, ctx->ws_out_elems);
    if (G < 1) G = 1;
    for (int n0 = 0; n0 < N; n0 += (int)G) {
        int g = N - n0 < (int)G ? N - n0 : (int)G;
        conv_job q = {c, f32(x) + (size_t)n0 * c->cin * HW, H, W, Ho, Wo, P, (size_t)g * P, HW,
                      ctx->ws_col, f32(y) + (size_t)n0 * c->cout * P, NULL,
                      residual.p ? f32(residual) + (size_t)n0 * c->cout * P : NULL,
                      c->b ? c->b->data : NULL, epi};
        const float *col = q.xin;
        if (direct && g > 1) {
            act_pool_run(ctx->pool, copy_task, &q, g * c->cin);
            col = ctx->ws_col;
        } else if (!direct) {
            act_pool_run(ctx->pool, im2col_task, &q, g * c->cin);
            col = ctx->ws_col;
        }
        q.gout = g == 1 ? q.out0 : ctx->ws_out;
        act_cpu_sgemm_split(ctx->pool, 0, c->cout, (int)q.NP, (int)Kd, c->w->data, (int)Kd, col,
                            (int)q.NP, q.gout, (int)q.NP);
        act_pool_run(ctx->pool, epilogue_task, &q, g * c->cout);
    }
    return 0;
}

/* Statistics in double so that large maps (C/G * HW up to 64 * 12544 values) lose nothing. */
int cpu_groupnorm(act_backend *be, act_buf x, int N, int C, int HW, int groups,
                  const act_tensor *gamma, const act_tensor *beta, act_buf residual,
                  act_epilogue epi, act_buf y) {
    if (groups < 1 || C % groups)
        return act_errf(be->err, sizeof be->err, "cpu groupnorm: %d channels do not split into "
                        "%d groups", C, groups);
    int cpg = C / groups;
    size_t gsz = (size_t)cpg * HW;
    for (int n = 0; n < N; n++)
        for (int g = 0; g < groups; g++) {
            size_t base = ((size_t)n * C + (size_t)g * cpg) * HW;
            const float *xi = f32(x) + base;
            double sum = 0.0, sq = 0.0;
            for (size_t i = 0; i < gsz; i++) sum += xi[i];
            double mean = sum / (double)gsz;
            for (size_t i = 0; i < gsz; i++) {
                double d = xi[i] - mean;
                sq += d * d;
            }
            float rstd = (float)(1.0 / sqrt(sq / (double)gsz + 1e-5));
            float fm = (float)mean;
            float *yo = f32(y) + base;
            const float *r = residual.p ? f32(residual) + base : NULL;
            for (int c = 0; c < cpg; c++) {
                float ga = gamma ? gamma->data[g * cpg + c] : 1.0f;
                float bb = beta ? beta->data[g * cpg + c] : 0.0f;
                for (int i = 0; i < HW; i++) {
                    size_t j = (size_t)c * HW + i;
                    float v = (xi[j] - fm) * rstd * ga + bb;
                    if (r) v += r[j];
                    yo[j] = act_cpu_epi(v, epi);
                }
            }
        }
    return 0;
}

/* Max of the valid taps; NaN propagates as in PyTorch (a NaN tap wins). Rows are combined a
 * whole output row at a time so the inner loops stay branch-free. */
static inline float max_nan(float m, float v) { return (v > m || v != v) ? v : m; }

typedef struct pool_job { const float *x; float *y; int H, W, Ho, Wo; } pool_job;

static void maxpool_task(void *arg, int t, int lo, int hi) {   /* items: (image, channel) planes */
    const pool_job *q = arg;
    int H = q->H, W = q->W, Ho = q->Ho, Wo = q->Wo;
    (void)t;
    for (size_t nc = (size_t)lo; nc < (size_t)hi; nc++) {
        const float *xi = q->x + nc * H * W;
        float *yo = q->y + nc * Ho * Wo;
        for (int oh = 0; oh < Ho; oh++) {
            float *yr = yo + (size_t)oh * Wo;
            for (int ow = 0; ow < Wo; ow++) yr[ow] = -INFINITY;
            for (int ih = 2 * oh - 1; ih <= 2 * oh + 1; ih++) {
                if (ih < 0 || ih >= H) continue;
                const float *r = xi + (size_t)ih * W;
                /* ow = 0 has no left tap; the last ow may lack a right one */
                yr[0] = max_nan(yr[0], r[0]);
                if (W > 1) yr[0] = max_nan(yr[0], r[1]);
                int full = (W - 2) / 2 + 1;    /* ow with all three taps 2ow-1..2ow+1 < W */
                if (full > Wo) full = Wo;
                for (int ow = 1; ow < full; ow++)
                    yr[ow] = max_nan(max_nan(max_nan(yr[ow], r[2 * ow - 1]), r[2 * ow]), r[2 * ow + 1]);
                for (int ow = full > 1 ? full : 1; ow < Wo; ow++)
                    for (int iw = 2 * ow - 1; iw <= 2 * ow + 1 && iw < W; iw++) yr[ow] = max_nan(yr[ow], r[iw]);
            }
        }
    }
}

int cpu_maxpool(act_backend *be, act_buf x, int N, int C, int H, int W, act_buf y) {
    pool_job q = {f32(x), f32(y), H, W, (H + 2 - 3) / 2 + 1, (W + 2 - 3) / 2 + 1};
    act_pool_run(((act_cpu_ctx *)be->ctx)->pool, maxpool_task, &q, N * C);
    return 0;
}

int cpu_spatial_softmax(act_backend *be, act_buf x, int N, int K, int HW,
                        const act_tensor *pos_grid, act_buf y) {
    if (pos_grid->numel != (int64_t)HW * 2)
        return act_errf(be->err, sizeof be->err, "cpu spatial_softmax: pos_grid '%s' has %lld "
                        "values, expected %d (HW=%d x 2)", pos_grid->name,
                        (long long)pos_grid->numel, HW * 2, HW);
    const float *grid = pos_grid->data;
    for (size_t r = 0; r < (size_t)N * K; r++) {
        const float *xi = f32(x) + r * HW;
        float m = xi[0];
        for (int i = 1; i < HW; i++) m = xi[i] > m ? xi[i] : m;
        float sum = 0.0f, ex = 0.0f, ey = 0.0f;
        for (int i = 0; i < HW; i++) sum += expf(xi[i] - m);
        for (int i = 0; i < HW; i++) {
            float pr = expf(xi[i] - m) / sum;
            ex += pr * grid[2 * i];
            ey += pr * grid[2 * i + 1];
        }
        f32(y)[2 * r] = ex;
        f32(y)[2 * r + 1] = ey;
    }
    return 0;
}
