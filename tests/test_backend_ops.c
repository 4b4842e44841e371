/* test_backend_ops.c - every op of the CUDA backend against the CPU backend (the oracle), in the
 * spirit of ggml's test-backend-ops.
 *
 * Weights are a real small model ($ACT_TEST_DATA/small.actw; small_sep_gn.actw for GroupNorm,
 * crop and ImageNet preprocessing), so every op runs on the shapes the forward pass gives it;
 * a third copy of small.actw is made degenerate where formulas need their eps (degenerate()).
 * For each precision (fp32, tf32, bf16, fp16) and batch (1, 3, 64; shapes scale with it) each
 * op gets fresh random inputs, rounded on the host to the activation type so that both
 * backends see the same values; the CUDA output is poisoned with NaN before the op, so an
 * element it fails to write fails the check. Error: ||cuda - cpu|| / ||cpu|| over the output.
 * Feature maps (vision op inputs and outputs) are made and compared in the logical NCHW order and
 * permuted on the host to and from the CUDA backend's layout (be->feature_nhwc).
 * Tolerances: fp32 1e-5 (1e-4 for the cuBLAS/cuDNN ops, whose summation order differs),
 * tf32 2e-3, bf16 and fp16 2e-2. Prints a table op x precision (worst batch). bf16 outputs of
 * 256 values or more must also not drift toward zero or infinity (see record): a conversion that
 * truncates stays inside 2e-2.
 * Exit 77 (skipped) without a usable CUDA device.
 * Narrowing (for compute-sanitizer runs, which are slow): ACT_OPS_ONLY=attention,norm (ops whose
 * name contains one of the words), ACT_OPS_PREC=fp32,bf16, ACT_OPS_BATCH=3. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend.h"
#include "forward.h"
#include "model.h"
#include "test_common.h"

enum { NPREC = 4 };
static const char *PREC_NAME[NPREC] = {"fp32", "tf32", "bf16", "fp16"};

#define MAX_OPS 128   /* distinct op rows of the table; record() refuses more, never overruns */
static const char *g_op[MAX_OPS];
static double g_err[MAX_OPS][NPREC];
static int g_bad[MAX_OPS][NPREC], g_nops;
static int g_layout[NPREC] = {-1, -1, -1, -1};   /* feature-map layout the CUDA backend chose */

typedef struct {
    act_backend *cpu, *gpu;
    int prec, B;
} pair;


/* v rounded to the nearest fp16 (ties to even; past 65504 infinity), as a float, by hand:
 * _Float16 is not every compiler's (clang 14 refuses it on x86). Agrees with GCC's _Float16 on
 * every seventh float bit pattern. */
static float f16_round(float v) {
    float a = fabsf(v);
    if (!(a < 65520.0f)) return a != a ? v : copysignf(INFINITY, v);
    if (a < 0x1p-14f) return copysignf(nearbyintf(a * 0x1p24f) * 0x1p-24f, v);   /* subnormal */
    int e;
    frexpf(a, &e);   /* a in [2^(e-1), 2^e): 11 significant bits, a step of 2^(e-11) */
    float q = ldexpf(1.0f, e - 11);
    return copysignf(nearbyintf(a / q) * q, v);
}

/* round to what the activation type can hold, so both backends get identical inputs */
static float quant(float v, act_dtype dt) {
    if (dt == ACT_DT_BF16) {
        uint32_t b;
        memcpy(&b, &v, 4);
        b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
        memcpy(&v, &b, 4);
        return v;
    }
    if (dt == ACT_DT_F16) return f16_round(v);
    return v;
}

static float *rand_arr(size_t n, float lo, float hi, act_dtype q) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) p[i] = quant(urand(lo, hi), q);
    return p;
}

/* rows r % 3 == 0 of x nearly flat: 0 and 2^-7 in turn (exact in every dtype, and so are their
 * mean and variance), variance 2^-16 = 1.5e-5, of the order of LayerNorm's eps (1e-5): eps left
 * out or misplaced shows there, not in random rows (variance ~1: eps is 5e-6 of it) */
static void flat_rows(float *x, int rows, int E) {
    for (int r = 0; r < rows; r += 3)
        for (int i = 0; i < E; i++) x[(size_t)r * E + i] = (i & 1) ? 0.0078125f : 0.0f;
}

static void die_be(act_backend *be, const char *what) {
    fprintf(stderr, "FAIL %s on %s: %s\n", what, be->name, be->err);
    exit(1);
}

/* a buffer of dtype dt (ACT resolves per backend) holding host floats h */
static act_buf put(act_backend *be, const float *h, size_t n, act_dtype dt) {
    act_buf b = be->alloc(be, n, dt);
    if (!b.p) die_be(be, "alloc");
    if (b.dt == ACT_DT_F32) {
        if (be->upload(be, b, h, n)) die_be(be, "upload");
    } else {
        act_buf t = be->alloc(be, n, ACT_DT_F32);
        if (!t.p) die_be(be, "alloc");
        if (be->upload(be, t, h, n) || be->copy(be, b, t, n)) die_be(be, "upload+copy");
    }
    if (be->sync(be)) die_be(be, "sync");
    return b;
}

static act_buf put_u8(act_backend *be, const uint8_t *h, size_t n) {
    act_buf b = be->alloc(be, n, ACT_DT_U8);
    if (!b.p) die_be(be, "alloc");
    if (be->upload(be, b, h, n) || be->sync(be)) die_be(be, "upload u8");
    return b;
}

/* an output buffer: NaN everywhere */
static act_buf poisoned(act_backend *be, size_t n, act_dtype dt) {
    float *nan = malloc((n ? n : 1) * sizeof *nan);
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    act_buf b = put(be, nan, n, dt);
    free(nan);
    return b;
}

static float *get(act_backend *be, act_buf b, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof *h);
    if (be->download(be, h, b, n) || be->sync(be)) die_be(be, "download");
    return h;
}

static void record(const char *op, const pair *p, const float *got, const float *want, size_t n,
                   int gemm) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    /* bf16: the error's drift toward zero, sum((got - want) sgn(want)) / sum|want|, over outputs
     * of 256 values or more. Rounding to nearest leaves only noise (~1.6e-3 / sqrt(n); measured
     * |drift| <= 1.9e-4 on the emulator, 5e-4 below 256 values); a conversion that truncates
     * (f32 bits >> 16) drifts -2.8e-3 in every op it writes, yet only doubles the error
     * (~3.3e-3, inside the 2e-2 limit) */
    double drift = 0;
    if (p->prec == ACT_BF16 && n >= 256) {
        double sb = 0, sa = 0;
        for (size_t i = 0; i < n; i++) {
            sb += ((double)got[i] - want[i]) * (want[i] > 0 ? 1 : want[i] < 0 ? -1 : 0);
            sa += fabs((double)want[i]);
        }
        drift = sa > 0 ? sb / sa : 0;
    }
    double tol = p->prec == ACT_FP32 ? (gemm ? 1e-4 : 1e-5) : p->prec == ACT_TF32 ? 2e-3 : 2e-2;
    int k = 0;
    while (k < g_nops && strcmp(g_op[k], op)) k++;
    if (k == MAX_OPS) {
        fprintf(stderr, "FAIL %s: more than MAX_OPS (%d) op rows; raise MAX_OPS\n", op, MAX_OPS);
        g_fail++;
        return;
    }
    if (k == g_nops) {
        g_op[g_nops++] = op;
        for (int j = 0; j < NPREC; j++) g_err[k][j] = -1;
    }
    if (!(e <= tol)) {                                  /* NaN fails too */
        g_bad[k][p->prec] = 1;
        g_fail++;
        fprintf(stderr, "FAIL %-22s %s B=%d: rel err %.3g > %.1g\n", op, PREC_NAME[p->prec], p->B,
                e, tol);
    } else if (fabs(drift) > 1.4e-3) {
        g_bad[k][p->prec] = 1;
        g_fail++;
        fprintf(stderr, "FAIL %-22s %s B=%d: rel err %.3g drifts %+.3g toward %s (> 1.4e-3: a "
                "bf16 rounding that truncates?)\n", op, PREC_NAME[p->prec], p->B, e, drift,
                drift < 0 ? "zero" : "infinity");
    }
    if (isnan(e) || e > g_err[k][p->prec]) g_err[k][p->prec] = isnan(e) ? INFINITY : e;
}

/* run one op on both backends; op_fn fills out on one backend given inputs made there */
typedef int (*op_fn)(act_backend *be, act_buf *in, act_buf out, const void *arg);

typedef struct {
    const float *h;            /* host values (NULL: u8 data in h8) */
    const uint8_t *h8;
    size_t n;
    act_dtype dt;
} input;

/* a feature map [n / (c * hw)][c][hw]; c 0: not one. image: the preprocess output or the stem
 * conv's input, stored with be->image_channels channels on an NHWC backend */
typedef struct { int c; size_t hw; int image; } fmap;

/* channels a backend stores for the feature map */
static int stored_c(const act_backend *be, fmap fm) {
    return fm.image && be->feature_nhwc ? be->image_channels : fm.c;
}

/* [N][C][HW] (n elements) <-> [N][HW][Cs] (n / C * Cs) on the host, channels C..Cs-1 set to
 * `fill`; to_nhwc 0 undoes it, counting the nonzero padding channels into *bad_pad */
static float *relayout(const float *src, size_t n, int C, int Cs, size_t HW, int to_nhwc,
                       float fill, size_t *bad_pad) {
    size_t per = (size_t)C * HW, pers = (size_t)Cs * HW, imgs = n / per;
    float *d = calloc((to_nhwc ? imgs * pers : n) + 1, sizeof *d);
    if (!d) { fprintf(stderr, "out of memory\n"); exit(1); }
    for (size_t img = 0; img < imgs; img++)
        for (size_t p = 0; p < HW; p++) {
            for (int c = 0; c < C; c++) {
                size_t a = img * per + (size_t)c * HW + p, b = img * pers + p * Cs + c;
                if (to_nhwc) d[b] = src[a];
                else d[a] = src[b];
            }
            for (int c = C; c < Cs; c++)
                if (to_nhwc) d[img * pers + p * Cs + c] = fill;
                else if (src[img * pers + p * Cs + c] != 0.0f) (*bad_pad)++;
        }
    return d;
}

/* in_fm[i] / out_fm: which inputs and whether the output are feature maps (in_fm may be NULL) */
static void run_case_fm(const pair *p, const char *name, int gemm, op_fn fn, const void *arg,
                        const input *in, const fmap *in_fm, int nin, size_t nout, act_dtype odt,
                        fmap out_fm) {
    if (!listed(getenv("ACT_OPS_ONLY"), name, 1)) return;
    act_backend *bes[2] = {p->cpu, p->gpu};
    float *res[2];
    for (int s = 0; s < 2; s++) {
        act_backend *be = bes[s];
        act_buf bufs[8];
        for (int i = 0; i < nin; i++) {
            if (in[i].h8 || !in[i].n) {
                bufs[i] = in[i].h8 ? put_u8(be, in[i].h8, in[i].n) : act_nobuf();
            } else if (in_fm && in_fm[i].c && be->feature_nhwc) {
                /* the stem's padding channels hold 3.0 here, not preprocess's zeros: its
                 * filter must ignore them (zero weights there) */
                int cs = stored_c(be, in_fm[i]);
                float *t = relayout(in[i].h, in[i].n, in_fm[i].c, cs, in_fm[i].hw, 1, 3.0f, NULL);
                bufs[i] = put(be, t, in[i].n / in_fm[i].c * cs, in[i].dt);
                free(t);
            } else {
                bufs[i] = put(be, in[i].h, in[i].n, in[i].dt);
            }
        }
        int ocs = out_fm.c ? stored_c(be, out_fm) : 1;
        size_t nstored = out_fm.c ? nout / out_fm.c * ocs : nout;
        act_buf out = poisoned(be, nstored, odt);
        if (fn(be, bufs, out, arg) || be->sync(be)) {
            fprintf(stderr, "FAIL %s %s B=%d on %s: %s\n", name, PREC_NAME[p->prec], p->B,
                    be->name, be->err);
            g_fail++;
            if (s == 1) free(res[0]);
            return;
        }
        res[s] = get(be, out, nstored);
        if (out_fm.c && be->feature_nhwc) {
            size_t bad_pad = 0;
            float *t = relayout(res[s], nout, out_fm.c, ocs, out_fm.hw, 0, 0.0f, &bad_pad);
            free(res[s]);
            res[s] = t;
            if (bad_pad) {   /* the stem's filter would see them */
                fprintf(stderr, "FAIL %s %s B=%d on %s: %zu padding channel values are not zero "
                        "(%d channels stored for %d)\n", name, PREC_NAME[p->prec], p->B, be->name,
                        bad_pad, ocs, out_fm.c);
                g_fail++;
            }
        }
    }
    record(name, p, res[1], res[0], nout, gemm);
    free(res[0]);
    free(res[1]);
}

static void run_case(const pair *p, const char *name, int gemm, op_fn fn, const void *arg,
                     const input *in, int nin, size_t nout, act_dtype odt) {
    fmap none = {0, 0, 0};
    run_case_fm(p, name, gemm, fn, arg, in, NULL, nin, nout, odt, none);
}

/* ---------------- the ops ---------------- */

/* part -1: preprocess alone; 0-2: with the step's two side normalizations (qpos [B][obs],
 * actions [B*H][A], F32 in, the activation dtype out, as the forward pass asks), the output
 * checked being the image (0), the normalized qpos (1) or actions (2); the others go to
 * buffers of their own */
typedef struct { const act_model *m; int B, hi, wi, part; size_t nimg; } pre_arg;
static int f_pre(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const pre_arg *x = a;
    const act_config *c = &x->m->cfg;
    if (x->part < 0) return be->preprocess(be, in[0], x->B, x->hi, x->wi, c, out, NULL, 0);
    size_t nq = (size_t)x->B * c->obs_dim, na = (size_t)x->B * c->pred_horizon * c->action_dim;
    act_buf img = out, qn = out, an = out;
    if (x->part != 0) img = be->alloc(be, x->nimg / 3 * be->image_channels, ACT_DT_ACT);
    if (x->part != 1) qn = be->alloc(be, nq, ACT_DT_ACT);
    if (x->part != 2) an = be->alloc(be, na, ACT_DT_ACT);
    if (!img.p || !qn.p || !an.p) return -1;
    act_norm_job side[2] = {
        {in[1], qn, x->B, c->obs_dim, x->m->qpos_lo, x->m->qpos_hi, c->norm_type, c->norm_eps},
        {in[2], an, x->B * c->pred_horizon, c->action_dim, x->m->action_lo, x->m->action_hi,
         c->norm_type, c->norm_eps}};
    return be->preprocess(be, in[0], x->B, x->hi, x->wi, c, img, side, 2);
}
/* frames of hi x wi (the model's image_h x image_w, or another size: preprocess resizes any) */
static void t_preprocess_hw(const pair *p, const char *name, const act_model *m, int sides, int hi,
                            int wi) {
    const act_config *c = &m->cfg;
    size_t n = (size_t)p->B * hi * wi * 3;
    size_t nq = (size_t)p->B * c->obs_dim, na = (size_t)p->B * c->pred_horizon * c->action_dim;
    uint8_t *f = malloc(n);
    for (size_t i = 0; i < n; i++) f[i] = (uint8_t)(rnd() >> 56);
    float *q = rand_arr(nq, -2, 2, ACT_DT_F32), *ac = rand_arr(na, -2, 2, ACT_DT_F32);
    int ho = c->crop_h ? c->crop_h : c->input_h, wo = c->crop_w ? c->crop_w : c->input_w;
    input in[3] = {{NULL, f, n, ACT_DT_U8}, {q, NULL, nq, ACT_DT_F32}, {ac, NULL, na, ACT_DT_F32}};
    size_t nimg = (size_t)p->B * 3 * ho * wo;
    fmap fout = {3, (size_t)ho * wo, 1}, none = {0, 0, 0};
    if (!sides) {
        pre_arg a = {m, p->B, hi, wi, -1, nimg};
        run_case_fm(p, name, 0, f_pre, &a, in, NULL, 1, nimg, ACT_DT_ACT, fout);
    } else {
        static const char *names[3] = {"preprocess+norm:image", "preprocess+norm:qpos",
                                       "preprocess+norm:actions"};
        size_t nout[3] = {nimg, nq, na};
        for (int part = 0; part < 3; part++) {
            pre_arg a = {m, p->B, hi, wi, part, nimg};
            run_case_fm(p, names[part], 0, f_pre, &a, in, NULL, 3, nout[part], ACT_DT_ACT,
                        part == 0 ? fout : none);
        }
    }
    free(f);
    free(q);
    free(ac);
}
static void t_preprocess(const pair *p, const char *name, const act_model *m, int sides) {
    t_preprocess_hw(p, name, m, sides, m->cfg.image_h, m->cfg.image_w);
}

/* gather (frames read where they lie, each in a host block of its own, registered with the
 * backend; some at offsets off 16-byte alignment, read as shifted words), then preprocess: the
 * output shows every gathered byte, since preprocess reads all of them */
typedef struct { const act_config *cfg; int items, hi, wi; uint8_t **blk; const size_t *off; } gather_arg;
static int f_frames_gather(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const gather_arg *x = a;
    const act_config *c = x->cfg;
    size_t fsz = (size_t)x->hi * x->wi * 3;
    uint64_t *tab = malloc((size_t)x->items * sizeof *tab);
    int rc = 0, n = 0;
    (void)in;
    for (; n < x->items && !rc; n++) {
        void *dev = NULL;
        rc = be->host_register(be, x->blk[n], fsz + 16, &dev);
        tab[n] = (uint64_t)(uintptr_t)dev + x->off[n];
    }
    if (rc) n--;
    if (!rc) {
        act_buf t = put_u8(be, (const uint8_t *)tab, (size_t)x->items * sizeof *tab);
        act_buf fr = be->alloc(be, (size_t)x->items * fsz, ACT_DT_U8);
        rc = !fr.p || be->gather(be, fr, t, x->items, fsz) ||
             be->preprocess(be, fr, x->items, x->hi, x->wi, c, out, NULL, 0) ||
             be->sync(be);
    }
    while (n-- > 0) be->host_unregister(be, x->blk[n]);
    free(tab);
    return rc ? -1 : 0;
}
static void t_gather_hw(const pair *p, const char *name, const act_config *c, int hi, int wi) {
    int items = p->B * c->num_cams;
    size_t fsz = (size_t)hi * wi * 3;
    uint8_t **blk = malloc((size_t)items * sizeof *blk), *frames = malloc((size_t)items * fsz);
    size_t *off = malloc((size_t)items * sizeof *off);
    for (int i = 0; i < items; i++) {
        /* aligned, and shifted by 1, 13, 6 and 10 bytes (a word of 0-3 bytes into each of the
         * four 4-byte words of a 16-byte load) */
        static const size_t offs[6] = {0, 16, 1, 13, 6, 10};
        off[i] = offs[i % 6];
        /* blocks in memory in no particular order, each on pages of its own (the driver pins
         * whole pages, so two registrations cannot share one) */
        if (posix_memalign((void **)&blk[items - 1 - i], 4096, (fsz + 16 + 4095) / 4096 * 4096)) exit(1);
    }
    for (int i = 0; i < items; i++) {
        for (size_t j = 0; j < fsz; j++) frames[(size_t)i * fsz + j] = (uint8_t)(rnd() >> 56);
        memcpy(blk[i] + off[i], frames + (size_t)i * fsz, fsz);
    }
    int ho = c->crop_h ? c->crop_h : c->input_h, wo = c->crop_w ? c->crop_w : c->input_w;
    gather_arg a = {c, items, hi, wi, blk, off};
    fmap fout = {3, (size_t)ho * wo, 1};
    run_case_fm(p, name, 0, f_frames_gather, &a, NULL, NULL, 0, (size_t)items * 3 * ho * wo,
                ACT_DT_ACT, fout);
    for (int i = 0; i < items; i++) free(blk[i]);
    free(blk);
    free(off);
    free(frames);
}
static void t_gather(const pair *p, const act_config *c) {
    t_gather_hw(p, "gather+preprocess", c, c->image_h, c->image_w);
}

static act_dtype qdt(const pair *p) {
    return p->prec == ACT_BF16 ? ACT_DT_BF16 : p->prec == ACT_FP16 ? ACT_DT_F16 : ACT_DT_F32;
}

typedef struct { const act_conv *cv; int N, H, W; act_epilogue epi; int res; } conv_arg;
static int f_conv(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const conv_arg *x = a;
    return be->conv2d(be, x->cv, in[0], x->N, x->H, x->W, x->res ? in[1] : act_nobuf(), x->epi,
                      out);
}
static void t_conv(const pair *p, const char *name, const act_conv *cv, int N, int H, int W,
                   act_epilogue epi, int res) {
    act_dtype q = qdt(p);
    int Ho = act_conv_out(H, cv), Wo = act_conv_out(W, cv);
    size_t nx = (size_t)N * cv->cin * H * W, ny = (size_t)N * cv->cout * Ho * Wo;
    float *x = rand_arr(nx, -1, 1, q), *r = rand_arr(ny, -1, 1, q);
    conv_arg a = {cv, N, H, W, epi, res};
    input in[2] = {{x, NULL, nx, ACT_DT_ACT}, {r, NULL, res ? ny : 0, ACT_DT_ACT}};
    /* 3 input channels: the stem, whose input is the preprocessed image */
    fmap fin[2] = {{cv->cin, (size_t)H * W, cv->cin == 3}, {cv->cout, (size_t)Ho * Wo, 0}};
    run_case_fm(p, name, 1, f_conv, &a, in, fin, 2, ny, ACT_DT_ACT, fin[1]);
    free(x);
    free(r);
}

typedef struct { const act_conv *cv; int N, HW; } gn_arg;
static int f_gn(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const gn_arg *x = a;
    return be->groupnorm(be, in[0], x->N, x->cv->cout, x->HW, x->cv->cout / 16, x->cv->gn_w,
                         x->cv->gn_b, in[1], ACT_EPI_RELU, out);
}
static void t_groupnorm(const pair *p, const act_conv *cv, int HW) {
    size_t n = (size_t)p->B * cv->cout * HW;
    float *x = rand_arr(n, -2, 3, qdt(p)), *r = rand_arr(n, -1, 1, qdt(p));
    /* group 0 of every image nearly flat: 0 and 2^-7 in turn (exact in every dtype, and so are
     * its mean and variance), variance 2^-16 = 1.5e-5, of the order of eps (1e-5), so eps left
     * out or added outside the square root shows (random groups have variance ~2: eps is 5e-6
     * of it, below the fp32 limit) */
    int cpg = cv->cout / (cv->cout / 16);
    for (int b = 0; b < p->B; b++)
        for (int ch = 0; ch < cpg; ch++)
            for (int q = 0; q < HW; q++)
                x[((size_t)b * cv->cout + ch) * HW + q] = ((ch + q) & 1) ? 0.0078125f : 0.0f;
    gn_arg a = {cv, p->B, HW};
    input in[2] = {{x, NULL, n, ACT_DT_ACT}, {r, NULL, n, ACT_DT_ACT}};
    fmap fin[2] = {{cv->cout, (size_t)HW, 0}, {cv->cout, (size_t)HW, 0}};
    run_case_fm(p, "groupnorm+res+relu", 0, f_gn, &a, in, fin, 2, n, ACT_DT_ACT, fin[0]);
    free(x);
    free(r);
}

typedef struct { int N, C, H, W; } mp_arg;
static int f_mp(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const mp_arg *x = a;
    return be->maxpool(be, in[0], x->N, x->C, x->H, x->W, out);
}
static void t_maxpool(const pair *p, int C, int H, int W) {
    size_t n = (size_t)p->B * C * H * W;
    float *x = rand_arr(n, -1, 1, qdt(p));
    mp_arg a = {p->B, C, H, W};
    input in[1] = {{x, NULL, n, ACT_DT_ACT}};
    size_t ohw = (size_t)((H - 1) / 2 + 1) * ((W - 1) / 2 + 1);
    fmap fin[1] = {{C, (size_t)H * W, 0}}, fout = {C, ohw, 0};
    run_case_fm(p, "maxpool", 0, f_mp, &a, in, fin, 1, (size_t)p->B * C * ohw, ACT_DT_ACT, fout);
    free(x);
}

typedef struct { int N, K, HW; const act_tensor *grid; } ss_arg;
static int f_ss(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const ss_arg *x = a;
    return be->spatial_softmax(be, in[0], x->N, x->K, x->HW, x->grid, out);
}
/* shift: added to every logit (the softmax is the same; exp of a logit past 88.7 overflows fp32,
 * so a softmax that does not subtract the maximum gives inf / inf) */
static void t_spatial_softmax(const pair *p, const char *name, const act_trunk *tr, int K, int HW,
                              int ncam, float shift) {
    int N = p->B * ncam;
    size_t n = (size_t)N * K * HW;
    float *x = rand_arr(n, -4 + shift, 4 + shift, qdt(p));
    ss_arg a = {N, K, HW, tr->pos_grid};
    input in[1] = {{x, NULL, n, ACT_DT_ACT}};
    fmap fin[1] = {{K, (size_t)HW, 0}}, fout = {0, 0, 0};
    run_case_fm(p, name, 0, f_ss, &a, in, fin, 1, (size_t)N * 2 * K, ACT_DT_ACT, fout);
    free(x);
}

typedef struct { const act_linear *l; int M; act_epilogue epi; } lin_arg;
static int f_lin(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const lin_arg *x = a;
    return be->linear(be, x->l, in[0], x->M, x->epi, out);
}
static void t_linear(const pair *p, const char *name, const act_linear *l, int M, act_epilogue epi,
                     act_dtype xdt) {
    size_t nx = (size_t)M * l->in;
    float *x = rand_arr(nx, -1, 1, xdt == ACT_DT_F32 ? ACT_DT_F32 : qdt(p));
    lin_arg a = {l, M, epi};
    input in[1] = {{x, NULL, nx, xdt}};
    run_case(p, name, 1, f_lin, &a, in, 1, (size_t)M * l->out, ACT_DT_ACT);
    free(x);
}

/* the decoder's cross-attention K/V of every layer as one group (where the CUDA backend offers
 * linear_group; the CPU's loops over its layers' GEMMs, each into its columns) */
typedef struct { const act_linear *ls; int n, M; } grp_arg;
static int f_grp(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const grp_arg *x = a;
    return be->linear_group_prepare(be, x->ls, x->n) ||
           be->linear_group(be, x->ls, x->n, in[0], x->M, out);
}
static void t_linear_group(const pair *p, const act_model *m, int M) {
    act_linear ls[ACT_MAX_LAYERS];
    int n = m->cfg.dec_layers;
    if (!p->gpu->linear_group || n < 2) return;
    for (int i = 0; i < n; i++) ls[i] = m->dec[i].cross_attn.kv;
    size_t nx = (size_t)M * ls[0].in;
    float *x = rand_arr(nx, -1, 1, qdt(p));
    grp_arg a = {ls, n, M};
    input in[1] = {{x, NULL, nx, ACT_DT_ACT}};
    run_case(p, "linear group (cross K/V)", 1, f_grp, &a, in, 1, (size_t)M * n * ls[0].out,
             ACT_DT_ACT);
    free(x);
}

typedef struct { int qs, kvs, koff, voff, B, Lq, Lk, nh, dh, pad; } att_arg;
static int f_att(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const att_arg *x = a;
    return be->attention(be, in[0], x->qs, act_at(in[1], x->koff), act_at(in[1], x->voff), x->kvs,
                         x->B, x->Lq, x->Lk, x->nh, x->dh, x->pad ? in[2] : act_nobuf(), out);
}
/* packed = 1: q, k, v all from one [B*L][3E] buffer (self-attention); else q [B*Lq][E] and a
 * packed kv [B*Lk][2E] (cross-attention). pad: mask random keys after the first two.
 * big (packed only): the last dimension of every head is 16 in q and 20 in k, which adds
 * 320 / sqrt(dh) (113 at dh = 8) to every score of a row: the softmax is the same, but
 * exp(score) overflows fp32 past 88.7, so a softmax that does not subtract the row's maximum
 * gives inf / inf. Scores of ~113 carry fp32 rounding of ~1e-5 (the two backends scale q before
 * and after the dot product), so this case is held to the GEMM ops' fp32 limit. */
static void t_attention(const pair *p, const char *name, int Lq, int Lk, int nh, int E, int packed,
                        int pad, int big) {
    int B = p->B;
    size_t nq = (size_t)B * Lq * (packed ? 3 * E : E), nkv = packed ? 0 : (size_t)B * Lk * 2 * E;
    float *q = rand_arr(nq, -2, 2, qdt(p)), *kv = rand_arr(nkv, -2, 2, qdt(p));
    if (big && packed)
        for (size_t r = 0; r < (size_t)B * Lq; r++)
            for (int h = 0; h < nh; h++) {
                q[r * 3 * E + (size_t)(h + 1) * (E / nh) - 1] = 16.0f;
                q[r * 3 * E + E + (size_t)(h + 1) * (E / nh) - 1] = 20.0f;
            }
    uint8_t *m8 = calloc((size_t)B * Lk, 1);
    for (int i = 0; i < B * Lk; i++) m8[i] = (i % Lk) >= 2 && (rnd() & 3) == 0;
    att_arg a = {packed ? 3 * E : E, packed ? 3 * E : 2 * E, packed ? E : 0, packed ? 2 * E : E,
                 B, Lq, Lk, nh, E / nh, pad};
    input in[3] = {{q, NULL, nq, ACT_DT_ACT}, {packed ? q : kv, NULL, packed ? nq : nkv, ACT_DT_ACT},
                   {NULL, m8, (size_t)B * Lk, ACT_DT_U8}};
    run_case(p, name, big, f_att, &a, in, pad ? 3 : 2, (size_t)B * Lq * E, ACT_DT_ACT);
    free(q);
    free(kv);
    free(m8);
}

/* attention + output projection + residual + post-norm: the backend's fused op where it has one
 * (CUDA), else its three parts (the CPU backend), so the CUDA kernel is checked against the
 * composition of the CPU ops. y aliases the residual x, as in the forward pass, or (oop) the
 * residual is an input of its own and y a fresh, poisoned output (decoder layer 0's
 * cross-attention of one sequence reads its constant input so). */
typedef struct { att_arg at; const act_linear *out; const act_ln *ln; float eps; int oop; } aol_arg;
static int f_aol(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const aol_arg *x = a;
    const att_arg *t = &x->at;
    int rows = t->B * t->Lq, E = t->nh * t->dh;
    act_buf k = act_at(in[1], t->koff), v = act_at(in[1], t->voff), pad = t->pad ? in[3] : act_nobuf();
    act_buf res = x->oop ? in[2] : out;
    if (!x->oop && be->copy(be, out, in[2], (size_t)rows * E)) return -1;
    if (be->attention_out_ln)
        return be->attention_out_ln(be, in[0], t->qs, k, v, t->kvs, t->B, t->Lq, t->Lk, t->nh, t->dh,
                                    pad, x->out, res, x->ln, x->eps, out);
    act_buf att = be->alloc(be, (size_t)rows * E, ACT_DT_ACT), o = be->alloc(be, (size_t)rows * E, ACT_DT_ACT);
    if (!att.p || !o.p) return -1;
    if (be->attention(be, in[0], t->qs, k, v, t->kvs, t->B, t->Lq, t->Lk, t->nh, t->dh, pad, att) ||
        be->linear(be, x->out, att, rows, ACT_EPI_NONE, o))
        return -1;
    return be->add_layernorm(be, res, o, x->ln, x->eps, rows, E, out);
}
static void t_attention_out_ln(const pair *p, const char *name, int Lq, int Lk, int nh, int E,
                               int packed, int pad, const act_linear *out, const act_ln *ln, float eps,
                               int oop, int flat) {
    int B = p->B;
    size_t nq = (size_t)B * Lq * (packed ? 3 * E : E), nkv = packed ? 0 : (size_t)B * Lk * 2 * E;
    size_t nx = (size_t)B * Lq * E;
    float *q = rand_arr(nq, -2, 2, qdt(p)), *kv = rand_arr(nkv, -2, 2, qdt(p));
    float *x = rand_arr(nx, -1, 3, qdt(p));
    if (flat) flat_rows(x, B * Lq, E);
    uint8_t *m8 = calloc((size_t)B * Lk, 1);
    for (int i = 0; i < B * Lk; i++) m8[i] = (i % Lk) >= 2 && (rnd() & 3) == 0;
    aol_arg a = {{packed ? 3 * E : E, packed ? 3 * E : 2 * E, packed ? E : 0, packed ? 2 * E : E,
                  B, Lq, Lk, nh, E / nh, pad}, out, ln, eps, oop};
    input in[4] = {{q, NULL, nq, ACT_DT_ACT}, {packed ? q : kv, NULL, packed ? nq : nkv, ACT_DT_ACT},
                   {x, NULL, nx, ACT_DT_ACT}, {NULL, m8, (size_t)B * Lk, ACT_DT_U8}};
    run_case(p, name, 1, f_aol, &a, in, pad ? 4 : 3, nx, ACT_DT_ACT);
    free(q);
    free(kv);
    free(x);
    free(m8);
}

/* The fused kernel's shared memory is its dynamic bytes (3E + 16 Lk floats) plus block_sum's
 * static 128; a GPU refuses a launch whose two together pass 48 KB. At the longest key count
 * whose dynamic bytes alone fit, the op must refuse the shape itself, with the reason, and leave
 * the backend usable (a launch a GPU refuses says only "too many resources"; the emulator faults
 * it, sticky, as it counts the static bytes too). */
static void t_attention_out_ln_limit(const pair *p, const act_dec_layer *d, int nh, int E,
                                     float eps) {
    const char *name = "attention+out+ln smem limit";
    act_backend *be = p->gpu;
    if (!listed(getenv("ACT_OPS_ONLY"), name, 1) || !be->attention_out_ln) return;
    int Lk = (48 * 1024 / 4 - 3 * E) / 16;
    act_buf q = be->alloc(be, (size_t)E, ACT_DT_ACT), kv = be->alloc(be, (size_t)Lk * 2 * E, ACT_DT_ACT);
    act_buf x = be->alloc(be, (size_t)E, ACT_DT_ACT), y = be->alloc(be, (size_t)E, ACT_DT_ACT);
    if (!q.p || !kv.p || !x.p || !y.p) {
        fprintf(stderr, "FAIL %s: alloc: %s\n", name, be->err);
        g_fail++;
        return;
    }
    int r = be->attention_out_ln(be, q, E, kv, act_at(kv, E), 2 * E, 1, 1, Lk, nh, E / nh,
                                 act_nobuf(), &d->cross_attn.out, x, &d->ln2, eps, y);
    if (r == 0 || !strstr(be->err, "shared memory")) {
        fprintf(stderr, "FAIL %s %s: %d keys of width %d %s (%s)\n", name, PREC_NAME[p->prec], Lk,
                E, r ? "refused without the reason" : "accepted", be->err);
        g_fail++;
    }
    if (be->sync(be)) {
        fprintf(stderr, "FAIL %s %s: the backend after the refusal: %s\n", name,
                PREC_NAME[p->prec], be->err);
        g_fail++;
    }
}

typedef struct { const act_ln *ln; float eps; int rows, E, oop; } ln_arg;
static int f_ln(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const ln_arg *x = a;
    size_t n = (size_t)x->rows * x->E;
    /* in place, as the forward pass mostly uses it (y aliases x), or into a fresh y (oop: the
     * unfused path of decoder layer 0's cross-attention of one sequence) */
    if (x->oop) return be->add_layernorm(be, in[0], in[1], x->ln, x->eps, x->rows, x->E, out);
    if (be->copy(be, out, in[0], n)) return -1;
    return be->add_layernorm(be, out, in[1], x->ln, x->eps, x->rows, x->E, out);
}
static void t_add_layernorm(const pair *p, const act_ln *ln, float eps, int rows, int E) {
    size_t n = (size_t)rows * E;
    float *x = rand_arr(n, -1, 3, qdt(p)), *d = rand_arr(n, -1, 1, qdt(p));
    flat_rows(x, rows, E);                            /* x + d flat: d 0 there */
    for (int r = 0; r < rows; r += 3) memset(d + (size_t)r * E, 0, sizeof(float) * E);
    input in[2] = {{x, NULL, n, ACT_DT_ACT}, {d, NULL, n, ACT_DT_ACT}};
    for (int oop = 0; oop < 2; oop++) {
        ln_arg a = {ln, eps, rows, E, oop};
        run_case(p, oop ? "add_layernorm(x->y)" : "add_layernorm(inplace)", 0, f_ln, &a, in,
                 2, n, ACT_DT_ACT);
    }
    free(x);
    free(d);
}

typedef struct { const act_tensor *t; int B, R, E; } bc_arg;
static int f_bc(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const bc_arg *x = a;
    return be->broadcast_rows(be, x->t, x->B, x->R, x->E, out);
}

typedef struct { int B, ncam, E, H; const act_tensor *type, *cls; } asm_arg;
static int f_mem(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const asm_arg *x = a;
    return be->memory_assemble(be, in[0], in[1], in[2], x->B, x->ncam, x->E, in[3], x->type, out);
}
static int f_post(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const asm_arg *x = a;
    return be->posterior_assemble(be, x->cls, in[0], in[1], x->B, x->H, x->E, in[2], out);
}
static int f_sin(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const asm_arg *x = a;
    return be->sinusoid_table(be, x->H, x->E, out);
}

typedef struct { const act_model *m; int rows, dim, inverse; } nrm_arg;
static int f_nrm(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const nrm_arg *x = a;
    const act_config *c = &x->m->cfg;
    return be->normalize(be, in[0], x->rows, x->dim, x->m->action_lo, x->m->action_hi,
                         c->norm_type, c->norm_eps, x->inverse, out);
}

typedef struct { int B, L, sample, part; } lat_arg;
static int f_lat(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const lat_arg *x = a;
    size_t n = (size_t)x->B * x->L;
    act_buf mu = be->alloc(be, n, ACT_DT_F32), lv = be->alloc(be, n, ACT_DT_F32);
    act_buf kl = be->alloc(be, x->B, ACT_DT_F32), z = be->alloc(be, n, ACT_DT_ACT);
    if (!mu.p || !lv.p || !kl.p || !z.p) return -1;
    act_buf o[4] = {mu, lv, kl, z};
    if (x->part == 0) o[0] = out;
    else if (x->part == 1) o[1] = out;
    else if (x->part == 2) o[2] = out;
    else o[3] = out;
    return be->latent(be, in[0], x->B, x->L, x->sample, in[1], o[0], o[1], o[2], o[3]);
}

/* normalize, its inverse and normalize into the activation dtype, of the [B*H][A] actions an */
static void t_normalize(const pair *p, const act_model *m, const float *an, const char *names[3]) {
    int rows = p->B * m->cfg.pred_horizon, A = m->cfg.action_dim;
    size_t na = (size_t)rows * A;
    for (int inv = 0; inv < 2; inv++) {
        nrm_arg na_ = {m, rows, A, inv};
        input ni[1] = {{an, NULL, na, ACT_DT_F32}};
        run_case(p, names[inv], 0, f_nrm, &na_, ni, 1, na, ACT_DT_F32);
    }
    /* the forward pass's normalized qpos and actions: F32 in, the activation dtype out (what the
     * linears that read them take without a conversion) */
    nrm_arg nact = {m, rows, A, 0};
    input ni[1] = {{an, NULL, na, ACT_DT_F32}};
    run_case(p, names[2], 0, f_nrm, &nact, ni, 1, na, ACT_DT_ACT);
}

static int f_copy(act_backend *be, act_buf *in, act_buf out, const void *a) {
    return be->copy(be, out, in[0], *(const size_t *)a);
}
typedef struct { int rows; size_t n, stride; } gat_arg;
static int f_gather(act_backend *be, act_buf *in, act_buf out, const void *a) {
    const gat_arg *g = a;
    return be->gather_rows(be, out, in[0], g->rows, g->n, g->stride);
}

static void t_head_misc(const pair *p, const act_model *m) {
    const act_config *c = &m->cfg;
    int B = p->B, E = c->hidden_dim, H = c->pred_horizon, A = c->action_dim, L = c->latent_dim;
    int nc = c->num_cams;
    bc_arg bc = {m->query, B, H, E};
    run_case(p, "broadcast_rows", 0, f_bc, &bc, NULL, 0, (size_t)B * H * E, ACT_DT_ACT);

    size_t nb = (size_t)B * E;
    float *lat = rand_arr(nb, -1, 1, qdt(p)), *qp = rand_arr(nb, -1, 1, qdt(p));
    float *vis = rand_arr(nb * nc, -1, 1, qdt(p)), *act = rand_arr(nb * H, -1, 1, qdt(p));
    float *pos = rand_arr((size_t)(H + 2 + nc) * E, -1, 1, ACT_DT_F32);
    asm_arg aa = {B, nc, E, H, m->mem_type, m->cls_embed};
    input mi[4] = {{lat, NULL, nb, ACT_DT_ACT}, {qp, NULL, nb, ACT_DT_ACT},
                   {vis, NULL, nb * nc, ACT_DT_ACT}, {pos, NULL, (size_t)(2 + nc) * E, ACT_DT_F32}};
    run_case(p, "memory_assemble", 0, f_mem, &aa, mi, 4, (size_t)B * (2 + nc) * E, ACT_DT_ACT);
    input pi[3] = {{qp, NULL, nb, ACT_DT_ACT}, {act, NULL, nb * H, ACT_DT_ACT},
                   {pos, NULL, (size_t)(H + 2) * E, ACT_DT_F32}};
    run_case(p, "posterior_assemble", 0, f_post, &aa, pi, 3, (size_t)B * (2 + H) * E, ACT_DT_ACT);
    asm_arg sa = {0, 0, E, H + 2 + B, NULL, NULL};           /* table length grows with B */
    run_case(p, "sinusoid_table", 0, f_sin, &sa, NULL, 0, (size_t)sa.H * E, ACT_DT_F32);

    size_t na = (size_t)B * H * A;
    float *an = rand_arr(na, -1.5f, 1.5f, ACT_DT_F32);
    static const char *nrm_names[3] = {"normalize", "normalize(inverse)", "normalize(->act)"};
    t_normalize(p, m, an, nrm_names);

    float *ml = rand_arr((size_t)B * 2 * L, -1.5f, 1.5f, qdt(p));
    uint8_t seed[8];
    for (int i = 0; i < 8; i++) seed[i] = (uint8_t)(rnd() >> 56);
    static const char *lat_names[2][4] = {{"latent:mu", "latent:logvar", "latent:kl", "latent:z=mu"},
                                          {"latent(sample):mu", "latent(sample):logvar",
                                           "latent(sample):kl", "latent(sample):z"}};
    for (int s = 0; s < 2; s++)
        for (int part = 0; part < 4; part++) {
            lat_arg la = {B, L, s, part};
            input li[2] = {{ml, NULL, (size_t)B * 2 * L, ACT_DT_ACT}, {NULL, seed, 8, ACT_DT_U8}};
            run_case(p, lat_names[s][part], 0, f_lat, &la, li, 2,
                     part == 2 ? (size_t)B : (size_t)B * L, part == 3 ? ACT_DT_ACT : ACT_DT_F32);
        }

    size_t nx = nb * H;
    input ci[1] = {{act, NULL, nx, ACT_DT_ACT}};
    run_case(p, "copy(act->f32)", 0, f_copy, &nx, ci, 1, nx, ACT_DT_F32);
    input ci2[1] = {{an, NULL, na, ACT_DT_F32}};
    float *anq = malloc(na * sizeof *anq);
    for (size_t i = 0; i < na; i++) anq[i] = quant(an[i], qdt(p));
    ci2[0].h = anq;
    run_case(p, "copy(f32->act)", 0, f_copy, &na, ci2, 1, na, ACT_DT_ACT);
    /* the posterior's cls rows: row 0 of each batch element's (H + 2)-token sequence */
    gat_arg ga = {B, (size_t)E, (size_t)(H + 2) * E};
    float *seq = rand_arr((size_t)B * (H + 2) * E, -2.0f, 2.0f, qdt(p));
    input gi[1] = {{seq, NULL, (size_t)B * (H + 2) * E, ACT_DT_ACT}};
    run_case(p, "gather_rows", 0, f_gather, &ga, gi, 1, (size_t)B * E, ACT_DT_ACT);
    /* row stride 0: one [H, E] block repeated for every batch element (the decoder's prefix) */
    gat_arg gb = {B, (size_t)H * E, 0};
    input bi[1] = {{seq, NULL, (size_t)H * E, ACT_DT_ACT}};
    run_case(p, "gather_rows(broadcast)", 0, f_gather, &gb, bi, 1, (size_t)B * H * E, ACT_DT_ACT);
    free(seq);
    free(lat); free(qp); free(vis); free(act); free(pos); free(an); free(ml); free(anq);
}

/* ---------------- driver ---------------- */

/* ops whose weights come from the GroupNorm model (its own pair of backends) */
static void gn_ops(const pair *p, const act_model *mg) {
    act_trunk_geom g;
    char err[512];
    if (act_trunk_geometry(mg, &g, err, sizeof err)) { fprintf(stderr, "FAIL geometry: %s\n", err); exit(1); }
    t_preprocess(p, "preprocess(crop+imagenet)", mg, 0);
    t_groupnorm(p, &mg->trunks[0].conv1, g.c1_h * g.c1_w);
    t_groupnorm(p, &mg->trunks[1].blocks[3][1].conv2, mg->cfg.feat_h * mg->cfg.feat_w);
    static const char *names[3] = {"normalize mean_std", "normalize mean_std(inv)",
                                   "normalize mean_std(->act)"};
    float *an = rand_arr((size_t)p->B * mg->cfg.pred_horizon * mg->cfg.action_dim, -1.5f, 1.5f,
                         ACT_DT_F32);
    t_normalize(p, mg, an, names);
    free(an);
}

/* A copy of the small model made degenerate where the formulas lean on their eps (before any
 * backend loads it): action and qpos dimension 0 constant in the data (min == max: min_max's
 * clamp of the range), decoder layer 0's self-attention output projection zero (attention+out+ln
 * then normalizes its residual x alone, whose flat rows need LayerNorm's eps). */
static void degenerate(act_model *m) {
    const act_tensor *z[2] = {m->dec[0].self_attn.out.w, m->dec[0].self_attn.out.b};
    for (int i = 0; i < 2; i++) memset((float *)z[i]->data, 0, sizeof(float) * (size_t)z[i]->numel);
    ((float *)m->action_hi->data)[0] = m->action_lo->data[0];
    ((float *)m->qpos_hi->data)[0] = m->qpos_lo->data[0];
}

static void degenerate_ops(const pair *p, const act_model *m) {
    const act_config *c = &m->cfg;
    int rows = p->B * c->pred_horizon, A = c->action_dim, H = c->pred_horizon, E = c->hidden_dim;
    float *an = rand_arr((size_t)rows * A, -1.5f, 1.5f, ACT_DT_F32);
    for (int r = 0; r < rows; r++) an[(size_t)r * A] = m->action_lo->data[0];   /* its one value */
    static const char *names[3] = {"normalize(const dim)", "normalize(inv,const dim)",
                                   "normalize(->act,const dim)"};
    t_normalize(p, m, an, names);
    free(an);
    t_attention_out_ln(p, "attention+out+ln(flat x)", H, H, c->nheads, E, 1, 0,
                       &m->dec[0].self_attn.out, &m->dec[0].ln1, c->ln_eps, 0, 1);
}

static void all_ops(const pair *p, const act_model *m) {
    const act_config *c = &m->cfg;
    const act_trunk *tr = &m->trunks[0];
    act_trunk_geom g;
    char err[512];
    if (act_trunk_geometry(m, &g, err, sizeof err)) { fprintf(stderr, "FAIL geometry: %s\n", err); exit(1); }
    int B = p->B, nc = c->num_cams, N = B * nc;
    t_preprocess(p, "preprocess", m, 0);
    t_preprocess(p, "preprocess+norm", m, 1);
    t_gather(p, c);
    /* frames smaller than the network input, 45x50 -> 64x64: upsampled, the last rows and
     * columns take their second tap clamped to the frame's edge (a bound one too wide reads past
     * the row; the model's 80x80 frames, downsampled, never reach it). 45 * 50 * 3 = 6750 bytes,
     * not a multiple of 16: gather's byte path, and its frames' ends unaligned */
    t_preprocess_hw(p, "preprocess(45x50 frames)", m, 0, 45, 50);
    t_gather_hw(p, "gather+preprocess(45x50)", c, 45, 50);
    t_conv(p, "conv 7x7/2 +relu", &tr->conv1, B, g.in_h, g.in_w, ACT_EPI_RELU, 0);
    int h1 = g.pool_h, w1 = g.pool_w;
    t_conv(p, "conv 3x3/1 +res+relu", &tr->blocks[0][0].conv2, B, h1, w1, ACT_EPI_RELU, 1);
    t_conv(p, "conv 3x3/2 +relu", &tr->blocks[1][0].conv1, B, h1, w1, ACT_EPI_RELU, 0);
    t_conv(p, "conv 1x1/2 (down)", &tr->blocks[1][0].down, B, h1, w1, ACT_EPI_NONE, 0);
    act_conv kp = {tr->kp_w, tr->kp_b, NULL, NULL, 512, c->num_keypoints, 1, 1, 0};
    t_conv(p, "conv 1x1/1 (keypoints)", &kp, B, c->feat_h, c->feat_w, ACT_EPI_NONE, 0);
    t_maxpool(p, 64, g.c1_h, g.c1_w);
    t_maxpool(p, 8, 15, 14);
    t_spatial_softmax(p, "spatial_softmax", tr, c->num_keypoints, c->feat_h * c->feat_w, nc, 0);
    t_spatial_softmax(p, "spatial_softmax(x ~96)", tr, c->num_keypoints, c->feat_h * c->feat_w,
                      nc, 96);
    act_linear kpo = {tr->out_w, tr->out_b, 0, c->vision_dim, 2 * c->num_keypoints};
    t_linear(p, "linear keypoint out+relu", &kpo, N, ACT_EPI_RELU, ACT_DT_ACT);
    int H = c->pred_horizon, E = c->hidden_dim;
    const act_dec_layer *d = &m->dec[0];
    t_linear(p, "linear qkv (packed)", &d->self_attn.qkv, B * H, ACT_EPI_NONE, ACT_DT_ACT);
    t_linear(p, "linear kv (row0=E)", &d->cross_attn.kv, B * (2 + nc), ACT_EPI_NONE, ACT_DT_ACT);
    t_linear(p, "linear ff1+act", &d->ff1, B * H, c->activation == ACT_ACT_GELU ? ACT_EPI_GELU
             : ACT_EPI_RELU, ACT_DT_ACT);
    t_linear(p, "linear gelu", &d->ff2, B * H, ACT_EPI_GELU, ACT_DT_ACT);
    t_linear(p, "linear f32 input", &m->enc_qpos, B, ACT_EPI_NONE, ACT_DT_F32);
    /* out = action_dim (4): no multiple of 8 bf16/fp16 values, the bias kernel's scalar path */
    t_linear(p, "linear action head", &m->action_head, B * H, ACT_EPI_NONE, ACT_DT_ACT);
    t_linear_group(p, m, B * (2 + nc));
    t_attention(p, "attention self", H, H, c->nheads, E, 1, 0, 0);
    t_attention(p, "attention cross", H, 2 + nc, c->nheads, E, 0, 0, 0);
    t_attention(p, "attention masked", 2 + H, 2 + H, c->nheads, E, 1, 1, 0);
    /* a mask with Lq != Lk: a mask row indexed by Lq instead of Lk shows only here (the forward
     * pass masks only the posterior's self-attention, Lq == Lk; the op takes any) */
    t_attention(p, "attention cross masked", H, 2 + nc, c->nheads, E, 0, 1, 0);
    t_attention(p, "attention(scores ~113)", H, H, c->nheads, E, 1, 0, 1);
    /* an action chunk of 100 at head size 64 (the ACT paper's: hidden 512, 8 heads): K and V of
     * a head no longer fit 48 KB of shared memory, the CUDA kernel reads them in place; the
     * posterior's 2 + 100 keys masked; and the large scores there */
    t_attention(p, "attention long (100 keys, head 64)", 100, 100, 2, 128, 1, 0, 0);
    t_attention(p, "attention long masked (102 keys)", 102, 102, 2, 128, 1, 1, 0);
    t_attention(p, "attention long(scores ~113)", 100, 100, 2, 128, 1, 0, 1);
    /* a head size the lanes do not divide (48: lanes 16-31 have one dim of each key, the others
     * two) and a key count the in-place kernel's groups of 4 do not (130), masked */
    t_attention(p, "attention long (130 keys, head 48)", 130, 130, 2, 96, 1, 1, 0);
    /* an action chunk of 100 at head size 32 (hidden 64 here): K and V staged, the 100 query
     * rows spread over 7 blocks of 16, the last one short */
    t_attention(p, "attention 100 queries staged (head 32)", 100, 100, 2, 64, 1, 1, 0);
    t_add_layernorm(p, &d->ln1, c->ln_eps, B * H, E);
    t_attention_out_ln(p, "attention+out+ln self", H, H, c->nheads, E, 1, 0, &d->self_attn.out,
                       &d->ln1, c->ln_eps, 0, 0);
    t_attention_out_ln(p, "attention+out+ln cross", H, 2 + nc, c->nheads, E, 0, 0,
                       &d->cross_attn.out, &d->ln2, c->ln_eps, 0, 0);
    t_attention_out_ln(p, "attention+out+ln cross->y", H, 2 + nc, c->nheads, E, 0, 0,
                       &d->cross_attn.out, &d->ln2, c->ln_eps, 1, 0);
    t_attention_out_ln(p, "attention+out+ln masked", 2 + H, 2 + H, c->nheads, E, 1, 1,
                       &m->enc[0].attn.out, &m->enc[0].ln1, c->ln_eps, 0, 0);
    t_attention_out_ln_limit(p, d, c->nheads, E, c->ln_eps);
    t_head_misc(p, m);
}

static int load(const char *dir, const char *name, act_model **m) {
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (act_model_load(path, m, err, sizeof err)) {
        fprintf(stderr, "FAIL cannot load %s: %s (make it with tests/make_testdata.py)\n", path, err);
        return -1;
    }
    return 0;
}

int main(void) {
    char why[256];
    if (!act_cuda_available(why, sizeof why)) {
        printf("SKIP test_backend_ops: %s\n", why);
        return 77;
    }
    const char *dir = data_dir();
    seed_rng("test_backend_ops");
    act_model *m = NULL, *mg = NULL, *mz = NULL;
    if (load(dir, "small.actw", &m) || load(dir, "small_sep_gn.actw", &mg) ||
        load(dir, "small.actw", &mz))
        return 1;
    degenerate(mz);
    const int batches[3] = {1, 3, 64};
    char err[512];
    for (int prec = 0; prec < NPREC; prec++)
        for (int bi = 0; bi < 3; bi++) {
            char bname[16];
            snprintf(bname, sizeof bname, "%d", batches[bi]);
            if (!listed(getenv("ACT_OPS_PREC"), PREC_NAME[prec], 0) ||
                !listed(getenv("ACT_OPS_BATCH"), bname, 0))
                continue;
            /* a backend holds one model's weights: one pair of backends per model */
            for (int which = 0; which < 3; which++) {
                const act_model *mm = which == 0 ? m : which == 1 ? mg : mz;
                pair p = {NULL, NULL, prec, batches[bi]};
                if (act_backend_cpu_create(ACT_FP32, &p.cpu, err, sizeof err) ||
                    act_backend_cuda_create(0, (act_precision)prec, &p.gpu, err, sizeof err)) {
                    fprintf(stderr, "FAIL backend create (%s): %s\n", PREC_NAME[prec], err);
                    return 1;
                }
                if (p.cpu->load_weights(p.cpu, mm) || p.gpu->load_weights(p.gpu, mm)) {
                    fprintf(stderr, "FAIL load_weights: %s | %s\n", p.cpu->err, p.gpu->err);
                    return 1;
                }
                g_layout[prec] = p.gpu->feature_nhwc;
                if (which == 2) degenerate_ops(&p, mz);
                else if (which) gn_ops(&p, mg);
                else all_ops(&p, m);
                p.cpu->destroy(p.cpu);
                p.gpu->destroy(p.gpu);
            }
        }
    int w = 26;                               /* the first column fits the longest op name */
    for (int k = 0; k < g_nops; k++)
        if ((int)strlen(g_op[k]) > w) w = (int)strlen(g_op[k]);
    printf("\n%-*s", w, "op (rel err, worst batch)");
    for (int j = 0; j < NPREC; j++) printf(" %10s", PREC_NAME[j]);
    printf("\n%-*s", w, "feature-map layout");
    for (int j = 0; j < NPREC; j++) printf(" %10s", g_layout[j] < 0 ? "-" : g_layout[j] ? "NHWC" : "NCHW");
    printf("\n");
    for (int k = 0; k < g_nops; k++) {
        printf("%-*s", w, g_op[k]);
        for (int j = 0; j < NPREC; j++) {
            if (g_err[k][j] < 0) printf(" %10s", "-");
            else printf(" %9.2e%s", g_err[k][j], g_bad[k][j] ? "!" : " ");
        }
        printf("\n");
    }
    if (g_nops == 0) {
        printf("FAIL: no op ran (check ACT_OPS_ONLY / ACT_OPS_PREC / ACT_OPS_BATCH)\n");
        g_fail++;
    }
    printf("%s: %d failing checks\n", g_fail ? "FAIL" : "PASS", g_fail);
    act_model_free(m);
    act_model_free(mg);
    act_model_free(mz);
    return g_fail ? 1 : 0;
}
