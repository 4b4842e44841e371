/* test_cpu_ops.c - every op of the CPU backend against a naive direct implementation here.
 *
 * The naive versions are written from the PyTorch definitions (direct convolution loops, scores
 * then softmax then weighted sum for attention, ...) in double precision where that is the
 * natural way to write them, and share no code with the backend. Inputs are fresh random
 * values (the seed is printed; ACT_TEST_SEED replays it) at several shapes, including the
 * awkward ones (stride 2 with odd maps, 1x1 convs on both code paths, masked keys, crop
 * offsets that round half to even). Tolerance: ||got - want|| / ||want|| <= 1e-5. */
#define _POSIX_C_SOURCE 200809L   /* setenv */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "backend.h"
#include "cpu_ops.h"   /* the Winograd counter and the thread pool (internal) */
#include "rng.h"
#include "test_common.h"

#define TOL 1e-5



static float *rand_arr(size_t n, float lo, float hi) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = urand(lo, hi);
    return p;
}

static act_tensor tensor(const char *name, float *data, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    act_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    int64_t d[4] = {d0, d1, d2, d3};
    t.numel = 1;
    for (int i = 0; i < 4 && d[i] > 0; i++) {
        t.dims[t.ndim++] = d[i];
        t.numel *= d[i];
    }
    t.data = data;
    return t;
}

static act_buf fbuf(float *p) { act_buf b = {p, ACT_DT_F32}; return b; }

/* ||got - want|| / ||want||, checked against TOL */
static void check_close(const char *what, const float *got, const double *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
        if (!isfinite(got[i])) num = INFINITY;
    }
    double rel = sqrt(num) / (sqrt(den) > 0 ? sqrt(den) : 1.0);
    g_checks++;
    if (!(rel <= TOL)) {
        g_fail++;
        fprintf(stderr, "FAIL %s: relative error %.3g > %.0e\n", what, rel, TOL);
    } else {
        printf("ok   %-48s rel %.2e\n", what, rel);
    }
}

/* n floats past an op's output, poisoned with NaN before it ran, still NaN (a last group of
 * images or a row taken whole writes past the batch) */
static void check_untouched(const char *what, const float *p, size_t n) {
    size_t touched = 0;
    for (size_t i = 0; i < n; i++) touched += !isnan(p[i]);
    g_checks++;
    if (touched) {
        g_fail++;
        fprintf(stderr, "FAIL %s: %zu floats past the output written\n", what, touched);
    }
}

static void check_rc(const char *what, int rc, act_backend *be) {
    g_checks++;
    if (rc) {
        g_fail++;
        fprintf(stderr, "FAIL %s: returned %d: %s\n", what, rc, be->err);
    }
}

static double epi_d(double v, act_epilogue e) {
    if (e == ACT_EPI_RELU) return v > 0 ? v : 0;
    if (e == ACT_EPI_GELU) return 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
    return v;
}

/* ---------------- vision ---------------- */

static double bilin_src(int dst, int in, int out) {
    double s = ((double)in / out) * (dst + 0.5) - 0.5;
    return s < 0 ? 0 : s;
}

static void test_preprocess(act_backend *be, int B, int hi, int wi, int rh, int rw, int ch, int cw, int inet) {
    act_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.input_h = rh;
    cfg.input_w = rw;
    cfg.crop_h = ch;
    cfg.crop_w = cw;
    cfg.imagenet_norm = inet;
    int oh = ch ? ch : rh, ow = cw ? cw : rw;
    /* torchvision CenterCrop: int(round((H - ch) / 2.0)), Python rounds half to even */
    double th = (rh - oh) / 2.0, tw = (rw - ow) / 2.0;
    int top = (int)floor(th), left = (int)floor(tw);
    if (th - top > 0.5 || (th - top == 0.5 && top % 2)) top++;
    if (tw - left > 0.5 || (tw - left == 0.5 && left % 2)) left++;
    size_t nin = (size_t)B * hi * wi * 3, nout = (size_t)B * 3 * oh * ow;
    uint8_t *fr = malloc(nin);
    for (size_t i = 0; i < nin; i++) fr[i] = (uint8_t)(rnd() & 255);
    float *got = malloc(nout * sizeof *got);
    double *want = malloc(nout * sizeof *want);
    static const double mean[3] = {0.485, 0.456, 0.406}, sd[3] = {0.229, 0.224, 0.225};
    for (int n = 0; n < B; n++)
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < oh; y++)
                for (int x = 0; x < ow; x++) {
                    double sy = bilin_src(y + top, hi, rh), sx = bilin_src(x + left, wi, rw);
                    int y0 = (int)floor(sy), x0 = (int)floor(sx);
                    if (y0 > hi - 1) y0 = hi - 1;
                    if (x0 > wi - 1) x0 = wi - 1;
                    int y1 = y0 + 1 < hi ? y0 + 1 : hi - 1, x1 = x0 + 1 < wi ? x0 + 1 : wi - 1;
                    double ly = sy - y0, lx = sx - x0;
#define PX(yy, xx) (fr[(((size_t)n * hi + (yy)) * wi + (xx)) * 3 + c] / 255.0)
                    double v = (1 - ly) * ((1 - lx) * PX(y0, x0) + lx * PX(y0, x1)) +
                               ly * ((1 - lx) * PX(y1, x0) + lx * PX(y1, x1));
#undef PX
                    if (inet) v = (v - mean[c]) / sd[c];
                    want[(((size_t)n * 3 + c) * oh + y) * ow + x] = v;
                }
    act_buf fb = {fr, ACT_DT_U8};
    char what[96];
    snprintf(what, sizeof what, "preprocess %dx%d -> %dx%d crop %dx%d inet %d", hi, wi, rh, rw, ch, cw, inet);
    check_rc(what, be->preprocess(be, fb, B, hi, wi, &cfg, fbuf(got), NULL, 0), be);
    check_close(what, got, want, nout);
    free(fr);
    free(got);
    free(want);
}

static int load_ws(act_backend *be, const act_conv *extra);
static int load_model(act_backend *be, const act_conv *extra, const act_linear *lin);

/* the Winograd output tile test_conv_via expects (2 or 4), 0 for either */
static int g_wino_tile;

/* wino: 1 = the conv is part of the loaded model, so a 3x3 stride-1 conv must run by Winograd
 * (checked with the backend's counter); 0 = a conv outside the model (im2col) */
static void test_conv_via(act_backend *be, int wino, int N, int cin, int cout, int H, int W, int k,
                          int s, int p, int use_res, act_epilogue epi) {
    int Ho = (H + 2 * p - k) / s + 1, Wo = (W + 2 * p - k) / s + 1;
    size_t nx = (size_t)N * cin * H * W, ny = (size_t)N * cout * Ho * Wo;
    float *x = rand_arr(nx, -1, 1), *w = rand_arr((size_t)cout * cin * k * k, -0.5f, 0.5f);
    float *b = rand_arr(cout, -0.5f, 0.5f), *res = use_res ? rand_arr(ny, -1, 1) : NULL;
    float *y = malloc(2 * ny * sizeof *y);   /* the second half: past the batch, never written */
    double *want = malloc(ny * sizeof *want);
    act_tensor tw = tensor("w", w, cout, cin, k, k), tb = tensor("b", b, cout, 0, 0, 0);
    act_conv c = {&tw, &tb, NULL, NULL, cin, cout, k, s, p};
    for (int n = 0; n < N; n++)
        for (int co = 0; co < cout; co++)
            for (int oh = 0; oh < Ho; oh++)
                for (int ow = 0; ow < Wo; ow++) {
                    double acc = b[co];
                    for (int ci = 0; ci < cin; ci++)
                        for (int kh = 0; kh < k; kh++)
                            for (int kw = 0; kw < k; kw++) {
                                int ih = oh * s - p + kh, iw = ow * s - p + kw;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                acc += (double)w[((co * cin + ci) * k + kh) * k + kw] *
                                       x[(((size_t)n * cin + ci) * H + ih) * W + iw];
                            }
                    size_t o = (((size_t)n * cout + co) * Ho + oh) * Wo + ow;
                    if (res) acc += res[o];
                    want[o] = epi_d(acc, epi);
                }
    act_buf rb = res ? fbuf(res) : act_nobuf();
    char what[128];
    act_cpu_ctx *ctx = be->ctx;
    const char *group = getenv("ACT_CPU_WINO_GROUP"), *pack = getenv("ACT_CPU_PACKED_GEMM");
    snprintf(what, sizeof what, "conv2d%s%s%s%s%s N%d %d->%d %dx%d k%d s%d p%d res%d epi%d threads %d",
             wino ? " winograd" : "", wino && group ? " group " : "", wino && group ? group : "",
             wino && pack ? " packed " : "", wino && pack ? pack : "", N, cin, cout, H, W, k, s,
             p, use_res, epi, act_pool_threads(ctx->pool));
    if (wino) check_rc(what, load_ws(be, &c), be);
    unsigned long before = ctx->wino_convs, stem_before = ctx->stem_convs, wino4_before = ctx->wino4_convs;
    unsigned long packed_before = ctx->packed_convs;
    for (size_t i = 0; i < 2 * ny; i++) y[i] = NAN;   /* an output left unwritten fails */
    check_rc(what, be->conv2d(be, &c, fbuf(x), N, H, W, rb, epi, fbuf(y)), be);
    check_close(what, y, want, ny);
    check_untouched(what, y + ny, ny);
    g_checks++;
    if ((ctx->wino_convs != before) != wino) {
        g_fail++;
        fprintf(stderr, "FAIL %s: ran %s\n", what, wino ? "im2col, not Winograd" : "Winograd");
    }
    if (wino && g_wino_tile) {
        int tile = ctx->wino4_convs != wino4_before ? 4 : 2;
        g_checks++;
        if (tile != g_wino_tile) {
            g_fail++;
            fprintf(stderr, "FAIL %s: ran F(%dx%d,3x3), not F(%dx%d,3x3)\n", what, tile, tile,
                    g_wino_tile, g_wino_tile);
        }
    }
    /* the products over packed filters (cpu_pgemm.c): F(2x2) convs with output channels in 8s,
     * on an AVX-512 CPU with the products threaded by the backend; F(4x4) ones too with
     * ACT_CPU_PACKED_GEMM=all, none with =0 */
    if (wino) {
        const char *pe = getenv("ACT_CPU_PACKED_GEMM");
        int tile = ctx->wino4_convs != wino4_before ? 4 : 2;
        int packed = act_cpu_pgemm_ok() && act_cpu_gemm_split_on() && cout % 8 == 0 &&
                     !(pe && !strcmp(pe, "0")) && (tile == 2 || (pe && !strcmp(pe, "all")));
        g_checks++;
        if ((ctx->packed_convs != packed_before) != packed) {
            g_fail++;
            fprintf(stderr, "FAIL %s: %s\n", what,
                    packed ? "products not over packed filters" : "products over packed filters");
        }
    }
    /* few input channels, output channels in 16s, stride 1-2, no residual, ReLU or nothing:
     * computed directly (cpu_stem.c) unless ACT_CPU_STEM=0 */
    const char *se = getenv("ACT_CPU_STEM");
    int stem = !wino && cin <= 4 && cout % 16 == 0 && (s == 1 || s == 2) && !use_res &&
               (epi == ACT_EPI_NONE || epi == ACT_EPI_RELU) && !(se && !strcmp(se, "0"));
    g_checks++;
    if ((ctx->stem_convs != stem_before) != stem) {
        g_fail++;
        fprintf(stderr, "FAIL %s: %s\n", what, stem ? "not run by the direct stem conv"
                                                     : "run by the direct stem conv");
    }
    if (wino) check_rc(what, load_ws(be, NULL), be);
    free(x), free(w), free(b), free(res), free(y), free(want);
}

static void test_conv(act_backend *be, int N, int cin, int cout, int H, int W, int k, int s, int p,
                      int use_res, act_epilogue epi) {
    test_conv_via(be, 0, N, cin, cout, H, W, k, s, p, use_res, epi);
}

/* 3x3 stride-1 pad-1 convs of the model go through Winograd, F(2x2,3x3) and F(4x4,3x3) each:
 * maps of every size modulo 4 (edge tiles partly outside), one row or column, every epilogue,
 * with each tile's default images per pass and with 1 and 2 forced (5 images: groups of 3 + 2,
 * 2 + 2 + 1 or one at a time); then the default choice by channel count */
static void test_winograd(act_backend *be) {
    static const char *const groups[] = {NULL, "1", "2", NULL, NULL};
    static const char *const packed[] = {NULL, NULL, NULL, "0", "all"};
    for (int run = 0; run < 10; run++) {
        int tile = run % 2 ? 4 : 2;
        const char *group = groups[run / 2], *pack = packed[run / 2];
        setenv("ACT_CPU_WINO_TILE", tile == 2 ? "2" : "4", 1);
        if (group) setenv("ACT_CPU_WINO_GROUP", group, 1);
        else unsetenv("ACT_CPU_WINO_GROUP");
        if (pack) setenv("ACT_CPU_PACKED_GEMM", pack, 1);
        else unsetenv("ACT_CPU_PACKED_GEMM");
        g_wino_tile = tile;
        test_conv_via(be, 1, 2, 8, 12, 11, 13, 3, 1, 1, 1, ACT_EPI_RELU);
        test_conv_via(be, 1, 1, 16, 16, 16, 16, 3, 1, 1, 0, ACT_EPI_RELU);
        test_conv_via(be, 1, 5, 4, 6, 9, 8, 3, 1, 1, 1, ACT_EPI_RELU);
        test_conv_via(be, 1, 3, 5, 7, 7, 7, 3, 1, 1, 0, ACT_EPI_NONE);
        test_conv_via(be, 1, 1, 4, 4, 5, 1, 3, 1, 1, 0, ACT_EPI_GELU);
        test_conv_via(be, 1, 2, 3, 5, 1, 6, 3, 1, 1, 1, ACT_EPI_NONE);
        test_conv_via(be, 1, 4, 7, 9, 2, 2, 3, 1, 1, 1, ACT_EPI_RELU);
        test_conv_via(be, 1, 1, 2, 3, 1, 1, 3, 1, 1, 0, ACT_EPI_NONE);
        test_conv_via(be, 1, 2, 6, 5, 10, 14, 3, 1, 1, 1, ACT_EPI_RELU);
        test_conv_via(be, 1, 2, 4, 6, 7, 9, 3, 1, 1, 1, ACT_EPI_GELU);   /* GELU + residual */
        /* output channels in 8s (the packed products where the CPU has them): F(2x2) columns
         * 126 (2 x 48 + 30), 64 (48 + 16), 40 (48 masked) and 1 for three images */
        test_conv_via(be, 1, 3, 16, 16, 11, 13, 3, 1, 1, 1, ACT_EPI_RELU);
        test_conv_via(be, 1, 1, 8, 8, 16, 16, 3, 1, 1, 0, ACT_EPI_NONE);
        test_conv_via(be, 1, 2, 8, 24, 9, 8, 3, 1, 1, 1, ACT_EPI_RELU);
        test_conv_via(be, 1, 3, 5, 8, 1, 2, 3, 1, 1, 0, ACT_EPI_GELU);
        /* not Winograd even inside the model: stride 2 */
        test_conv_via(be, 0, 1, 8, 16, 11, 13, 3, 2, 1, 0, ACT_EPI_NONE);
    }
    unsetenv("ACT_CPU_WINO_TILE");
    unsetenv("ACT_CPU_WINO_GROUP");
    unsetenv("ACT_CPU_PACKED_GEMM");
    /* by default F(4x4) up to 128 x 128 channels (ResNet18's layer1-2), F(2x2) beyond */
    g_wino_tile = 4;
    test_conv_via(be, 1, 1, 128, 128, 7, 6, 3, 1, 1, 1, ACT_EPI_RELU);
    g_wino_tile = 2;
    test_conv_via(be, 1, 1, 128, 136, 6, 7, 3, 1, 1, 0, ACT_EPI_RELU);
    g_wino_tile = 0;
}

static int visits[1000];
static void count_task(void *arg, int t, int lo, int hi) {
    int n = *(int *)arg;
    for (int i = lo; i < hi; i++) __atomic_add_fetch(&visits[i], t < n ? 1 : 1000, __ATOMIC_RELAXED);
}

/* every item once, on a thread index below the pool's size, for item counts around it; with
 * helpers that sleep at once and with helpers that spin first (act_pool_set_spin_us), then many
 * runs back to back (a spinning helper that took a run twice, or missed one, fails) */
static void test_pool(void) {
    static const int items[] = {0, 1, 2, 3, 5, 64, 1000};
    for (int t = 0; t < 8; t++) {
        int threads = 1 + t % 4;
        long spin = t < 4 ? 0 : 100;
        act_pool *p = act_pool_create(threads);
        act_pool_set_spin_us(p, spin);
        int n = act_pool_threads(p);
        g_checks++;
        if (n != threads) {
            g_fail++;
            fprintf(stderr, "FAIL pool of %d has %d threads\n", threads, n);
        }
        for (size_t k = 0; k < sizeof items / sizeof items[0]; k++)
            for (int rep = 0; rep < 3; rep++) {
                memset(visits, 0, sizeof visits);
                act_pool_run(p, count_task, &n, items[k]);
                int bad = 0;
                for (int i = 0; i < 1000; i++) bad += visits[i] != (i < items[k]);
                g_checks++;
                if (bad) {
                    g_fail++;
                    fprintf(stderr, "FAIL pool of %d, %d items: %d items visited wrongly\n", n,
                            items[k], bad);
                }
            }
        memset(visits, 0, sizeof visits);
        for (int rep = 0; rep < 2000; rep++) act_pool_run(p, count_task, &n, 1 + rep % 7);
        int bad = 0;
        for (int i = 0; i < 7; i++) {
            int want = 0;   /* item i is in runs of more than i items */
            for (int rep = 0; rep < 2000; rep++) want += i < 1 + rep % 7;
            bad += visits[i] != want;
        }
        g_checks++;
        if (bad) {
            g_fail++;
            fprintf(stderr, "FAIL pool of %d (spin %ld us): 2000 runs back to back visited %d items "
                    "wrongly\n", n, spin, bad);
        }
        act_pool_destroy(p);
    }
}

/* C (M x N in rows of ldc, poisoned with NaN before the product) against want: the M x N
 * elements (copied into got) within TOL, and none of the columns beyond N written */
static void check_product(const char *what, const float *C, int ldc, const double *want, float *got,
                          int M, int N) {
    int touched = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) got[(size_t)i * N + j] = C[(size_t)i * ldc + j];
        for (int j = N; j < ldc; j++) touched += !isnan(C[(size_t)i * ldc + j]);
    }
    check_close(what, got, want, (size_t)M * N);
    g_checks++;
    if (touched) {
        g_fail++;
        fprintf(stderr, "FAIL %s: %d elements beyond N written\n", what, touched);
    }
}

/* act_cpu_sgemm_split against double sums: rows split (M >= N), columns split (trans_b 0 and
 * 1), pieces that do not divide evenly, strides wider than the matrices, one too small to
 * split; C's columns beyond N (ldc > N) stay untouched */
static void test_sgemm_split(void) {
    static const int shapes[][6] = {/* M, N, K, trans_b, extra lda/ldb, extra ldc */
                                    {150, 37, 260, 0, 3, 5}, {20, 203, 300, 1, 0, 7},
                                    {21, 190, 300, 0, 2, 0}, {5, 3072, 256, 1, 0, 0},
                                    {16, 16, 20, 1, 1, 1},   {300, 64, 64, 1, 0, 3}};
    for (int threads = 1; threads <= 3; threads++) {
        act_pool *p = act_pool_create(threads);
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            int M = shapes[k][0], N = shapes[k][1], K = shapes[k][2], tb = shapes[k][3];
            int lda = K + shapes[k][4], ldb = (tb ? K : N) + shapes[k][4], ldc = N + shapes[k][5];
            float *A = rand_arr((size_t)M * lda, -1, 1), *B = rand_arr((size_t)(tb ? N : K) * ldb, -1, 1);
            float *C = malloc((size_t)M * ldc * sizeof *C);
            double *want = malloc((size_t)M * N * sizeof *want);
            float *got = malloc((size_t)M * N * sizeof *got);
            for (size_t i = 0; i < (size_t)M * ldc; i++) C[i] = NAN;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double acc = 0;
                    for (int q = 0; q < K; q++)
                        acc += (double)A[(size_t)i * lda + q] *
                               (tb ? B[(size_t)j * ldb + q] : B[(size_t)q * ldb + j]);
                    want[(size_t)i * N + j] = acc;
                }
            act_cpu_sgemm_split(p, tb, M, N, K, A, lda, B, ldb, C, ldc);
            char what[96];
            snprintf(what, sizeof what, "sgemm split %dx%dx%d tb%d threads %d", M, N, K, tb,
                     act_pool_threads(p));
            check_product(what, C, ldc, want, got, M, N);
            free(A), free(B), free(C), free(want), free(got);
        }
        act_pool_destroy(p);
    }
}

/* act_cpu_pgemm (A packed in 8-row panels) against double sums: column counts on each side of
 * the kernel's 16/32/48-wide blocks, short and long K, strides wider than the matrices; C's
 * columns beyond N stay untouched */
static void test_pgemm(void) {
    if (!act_cpu_pgemm_ok()) {
        printf("skip pgemm: this CPU has no AVX-512 (the Winograd products stay on the BLAS)\n");
        return;
    }
    static const int shapes[][5] = {/* M, N, K, extra ldb, extra ldc */
                                    {8, 1, 1, 0, 0},     {16, 5, 3, 2, 1},    {8, 16, 64, 0, 3},
                                    {24, 17, 9, 1, 0},   {8, 31, 130, 0, 0},  {16, 32, 7, 5, 2},
                                    {8, 33, 40, 0, 1},   {32, 47, 12, 0, 0},  {8, 48, 256, 3, 0},
                                    {40, 49, 33, 0, 4},  {8, 96, 5, 0, 0},    {64, 147, 70, 1, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int ldb = N + shapes[s][3], ldc = N + shapes[s][4];
        float *A = rand_arr((size_t)M * K, -1, 1), *B = rand_arr((size_t)K * ldb, -1, 1);
        float *Ap = malloc((size_t)M * K * sizeof *Ap), *C = malloc((size_t)M * ldc * sizeof *C);
        double *want = malloc((size_t)M * N * sizeof *want);
        float *got = malloc((size_t)M * N * sizeof *got);
        for (int i = 0; i < M; i++)
            for (int q = 0; q < K; q++) Ap[act_cpu_pgemm_pack_index(i, q, K)] = A[(size_t)i * K + q];
        for (size_t i = 0; i < (size_t)M * ldc; i++) C[i] = NAN;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double acc = 0;
                for (int q = 0; q < K; q++) acc += (double)A[(size_t)i * K + q] * B[(size_t)q * ldb + j];
                want[(size_t)i * N + j] = acc;
            }
        act_cpu_pgemm(M, N, K, Ap, B, ldb, C, ldc);
        char what[96];
        snprintf(what, sizeof what, "pgemm %dx%dx%d ldb %d ldc %d", M, N, K, ldb, ldc);
        check_product(what, C, ldc, want, got, M, N);
        free(A), free(B), free(Ap), free(C), free(want), free(got);
    }
}

/* x uniform in [lo, hi): a narrow range near 0 makes the groups nearly flat (variance ~1e-6,
 * under eps = 1e-5), where eps decides rstd; near 0, so the float mean loses nothing */
static void test_groupnorm_in(act_backend *be, int N, int C, int HW, int G, int use_res,
                              act_epilogue epi, float lo, float hi) {
    size_t n = (size_t)N * C * HW;
    float *x = rand_arr(n, lo, hi), *ga = rand_arr(C, 0.5f, 1.5f), *be_ = rand_arr(C, -0.5f, 0.5f);
    float *res = use_res ? rand_arr(n, -1, 1) : NULL, *y = malloc(n * sizeof *y);
    double *want = malloc(n * sizeof *want);
    int cpg = C / G;
    for (int b = 0; b < N; b++)
        for (int g = 0; g < G; g++) {
            double m = 0, v = 0;
            size_t base = ((size_t)b * C + (size_t)g * cpg) * HW, cnt = (size_t)cpg * HW;
            for (size_t i = 0; i < cnt; i++) m += x[base + i];
            m /= cnt;
            for (size_t i = 0; i < cnt; i++) v += (x[base + i] - m) * (x[base + i] - m);
            v /= cnt;
            for (size_t i = 0; i < cnt; i++) {
                int c = g * cpg + (int)(i / HW);
                double t = (x[base + i] - m) / sqrt(v + 1e-5) * ga[c] + be_[c];
                if (res) t += res[base + i];
                want[base + i] = epi_d(t, epi);
            }
        }
    act_tensor tg = tensor("gn.w", ga, C, 0, 0, 0), tb = tensor("gn.b", be_, C, 0, 0, 0);
    char what[96];
    snprintf(what, sizeof what, "groupnorm N%d C%d HW%d G%d res%d epi%d x in [%g,%g)", N, C, HW, G,
             use_res, epi, lo, hi);
    check_rc(what, be->groupnorm(be, fbuf(x), N, C, HW, G, &tg, &tb, res ? fbuf(res) : act_nobuf(),
                                 epi, fbuf(y)), be);
    check_close(what, y, want, n);
    free(x), free(ga), free(be_), free(res), free(y), free(want);
}

static void test_groupnorm(act_backend *be, int N, int C, int HW, int G, int use_res, act_epilogue epi) {
    test_groupnorm_in(be, N, C, HW, G, use_res, epi, -2, 3);
}

static void test_maxpool(act_backend *be, int N, int C, int H, int W) {
    int Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
    size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * Ho * Wo;
    float *x = rand_arr(nx, -3, 1), *y = malloc(ny * sizeof *y);
    double *want = malloc(ny * sizeof *want);
    for (int nc = 0; nc < N * C; nc++)
        for (int oh = 0; oh < Ho; oh++)
            for (int ow = 0; ow < Wo; ow++) {
                double m = -INFINITY;
                for (int ih = 2 * oh - 1; ih <= 2 * oh + 1; ih++)
                    for (int iw = 2 * ow - 1; iw <= 2 * ow + 1; iw++)
                        if (ih >= 0 && ih < H && iw >= 0 && iw < W && x[((size_t)nc * H + ih) * W + iw] > m)
                            m = x[((size_t)nc * H + ih) * W + iw];
                want[((size_t)nc * Ho + oh) * Wo + ow] = m;
            }
    char what[96];
    snprintf(what, sizeof what, "maxpool N%d C%d %dx%d", N, C, H, W);
    check_rc(what, be->maxpool(be, fbuf(x), N, C, H, W, fbuf(y)), be);
    check_close(what, y, want, ny);
    free(x), free(y), free(want);
}

/* logits uniform in [lo, hi): up to 100, exp of an unshifted logit overflows fp32 */
static void test_spatial_softmax_in(act_backend *be, int N, int K, int h, int w, float lo, float hi) {
    int HW = h * w;
    float *x = rand_arr((size_t)N * K * HW, lo, hi), *grid = malloc(sizeof(float) * HW * 2);
    for (int i = 0; i < h; i++)   /* LeRobot's pos_grid: x varies along the row, y down the map */
        for (int j = 0; j < w; j++) {
            grid[2 * (i * w + j)] = w > 1 ? -1.0f + 2.0f * j / (w - 1) : 0.0f;
            grid[2 * (i * w + j) + 1] = h > 1 ? -1.0f + 2.0f * i / (h - 1) : 0.0f;
        }
    float *y = malloc(sizeof(float) * N * 2 * K);
    double *want = malloc(sizeof(double) * N * 2 * K);
    for (int r = 0; r < N * K; r++) {
        const float *xr = x + (size_t)r * HW;
        double m = xr[0], s = 0, ex = 0, ey = 0;
        for (int i = 0; i < HW; i++) m = xr[i] > m ? xr[i] : m;
        for (int i = 0; i < HW; i++) s += exp(xr[i] - m);
        for (int i = 0; i < HW; i++) {
            ex += exp(xr[i] - m) / s * grid[2 * i];
            ey += exp(xr[i] - m) / s * grid[2 * i + 1];
        }
        want[2 * r] = ex;
        want[2 * r + 1] = ey;
    }
    act_tensor tg = tensor("pos_grid", grid, HW, 2, 0, 0);
    char what[96];
    snprintf(what, sizeof what, "spatial_softmax N%d K%d %dx%d x in [%g,%g)", N, K, h, w, lo, hi);
    check_rc(what, be->spatial_softmax(be, fbuf(x), N, K, HW, &tg, fbuf(y)), be);
    check_close(what, y, want, (size_t)N * 2 * K);
    free(x), free(grid), free(y), free(want);
}

static void test_spatial_softmax(act_backend *be, int N, int K, int h, int w) {
    test_spatial_softmax_in(be, N, K, h, w, -4, 4);
}

/* ---------------- transformer ---------------- */

/* in_model: the weight is a decoder linear of the loaded model, so on an AVX-512 CPU a product of
 * at most 48 rows over a view in 8s runs over its packed copy (cpu_linear_packed.c; checked
 * with the backend's counter), anything else on the BLAS */
static void test_linear_via(act_backend *be, int in_model, int M, int rows, int row0, int out,
                            int in, act_epilogue epi) {
    float *w = rand_arr((size_t)rows * in, -0.3f, 0.3f), *b = rand_arr(rows, -0.5f, 0.5f);
    float *x = rand_arr((size_t)M * in, -1, 1), *y = malloc(sizeof(float) * M * out);
    double *want = malloc(sizeof(double) * M * out);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < out; j++) {
            double acc = b[row0 + j];
            for (int k = 0; k < in; k++) acc += (double)x[(size_t)i * in + k] * w[(size_t)(row0 + j) * in + k];
            want[(size_t)i * out + j] = epi_d(acc, epi);
        }
    act_tensor tw = tensor("w", w, rows, in, 0, 0), tb = tensor("b", b, rows, 0, 0, 0);
    act_linear l = {&tw, &tb, row0, out, in};
    char what[112];
    snprintf(what, sizeof what, "linear%s M%d rows[%d,%d) of %d in%d epi%d",
             in_model ? " (decoder)" : "", M, row0, row0 + out, rows, in, epi);
    act_cpu_ctx *ctx = be->ctx;
    if (in_model) {
        act_linear whole = {&tw, &tb, 0, rows, in};
        check_rc(what, load_model(be, NULL, &whole), be);
    }
    unsigned long before = ctx->plin_calls;
    for (size_t i = 0; i < (size_t)M * out; i++) y[i] = NAN;
    check_rc(what, be->linear(be, &l, fbuf(x), M, epi, fbuf(y)), be);
    check_close(what, y, want, (size_t)M * out);
    const char *pe = getenv("ACT_CPU_PACKED_LINEAR");
    int packed = in_model && act_cpu_pgemm_ok() && act_cpu_gemm_split_on() && !(pe && !strcmp(pe, "0")) &&
                 M <= 48 && rows % 8 == 0 && row0 % 8 == 0 && out % 8 == 0;
    g_checks++;
    if ((ctx->plin_calls != before) != packed) {
        g_fail++;
        fprintf(stderr, "FAIL %s: %s\n", what, packed ? "not run over the packed weights" : "run over packed weights");
    }
    if (in_model) check_rc(what, load_ws(be, NULL), be);
    free(w), free(b), free(x), free(y), free(want);
}

static void test_linear(act_backend *be, int M, int rows, int row0, int out, int in, act_epilogue epi) {
    test_linear_via(be, 0, M, rows, row0, out, in, epi);
}

/* the decoder's linears over packed weights: 1, 5, 16 and 48 rows (one pass of the kernel's
 * widest block, with 8 output panels split over the threads unevenly), row views of an in_proj,
 * every epilogue; 49 rows, views off the 8-row panels and widths not in 8s go to the BLAS */
static void test_linear_packed(act_backend *be) {
    test_linear_via(be, 1, 16, 768, 0, 768, 256, ACT_EPI_NONE);
    test_linear_via(be, 1, 5, 48, 16, 32, 24, ACT_EPI_NONE);      /* the K/V rows of an in_proj */
    test_linear_via(be, 1, 1, 64, 0, 64, 130, ACT_EPI_GELU);
    test_linear_via(be, 1, 48, 40, 0, 40, 33, ACT_EPI_RELU);
    test_linear_via(be, 1, 17, 24, 8, 8, 7, ACT_EPI_RELU);
    test_linear_via(be, 1, 49, 32, 0, 32, 16, ACT_EPI_NONE);
    test_linear_via(be, 1, 16, 48, 4, 16, 16, ACT_EPI_NONE);
    test_linear_via(be, 1, 16, 24, 0, 12, 16, ACT_EPI_NONE);
    test_linear_via(be, 1, 3, 12, 0, 12, 9, ACT_EPI_NONE);
}

/* n linears as one group (the decoder's cross-attention K/V): rows [row0, row0+out) of n packed
 * weights, outputs side by side in rows of n*out, against the double-precision sums */
static void test_linear_group(act_backend *be, int n, int M, int rows, int row0, int out, int in) {
    float *w[4], *b[4];
    act_tensor tw[4], tb[4];
    act_linear ls[4];
    for (int g = 0; g < n; g++) {
        w[g] = rand_arr((size_t)rows * in, -0.3f, 0.3f);
        b[g] = rand_arr(rows, -0.5f, 0.5f);
        tw[g] = tensor("w", w[g], rows, in, 0, 0);
        tb[g] = tensor("b", b[g], rows, 0, 0, 0);
        act_linear l = {&tw[g], &tb[g], row0, out, in};
        ls[g] = l;
    }
    float *x = rand_arr((size_t)M * in, -1, 1), *y = rand_arr((size_t)M * n * out, -9, 9);
    double *want = malloc(sizeof(double) * M * n * out);
    for (int i = 0; i < M; i++)
        for (int g = 0; g < n; g++)
            for (int j = 0; j < out; j++) {
                double acc = b[g][row0 + j];
                for (int k = 0; k < in; k++)
                    acc += (double)x[(size_t)i * in + k] * w[g][(size_t)(row0 + j) * in + k];
                want[((size_t)i * n + g) * out + j] = acc;
            }
    char what[96];
    snprintf(what, sizeof what, "linear group of %d, M%d rows[%d,%d) in%d", n, M, row0, row0 + out, in);
    check_rc(what, be->linear_group_prepare(be, ls, n) ||
                   be->linear_group(be, ls, n, fbuf(x), M, fbuf(y)), be);
    check_close(what, y, want, (size_t)M * n * out);
    for (int g = 0; g < n; g++) free(w[g]), free(b[g]);
    free(x), free(y), free(want);
}

/* q, k, v as column blocks of one packed buffer (stride 3E), as the forward pass lays them out */
static void test_attention(act_backend *be, int B, int Lq, int Lk, int nh, int dh, int masked) {
    int E = nh * dh, qs = 3 * E;
    float *qb = rand_arr((size_t)B * Lq * qs, -1, 1), *kvb = rand_arr((size_t)B * Lk * 2 * E, -1, 1);
    uint8_t *pad = masked ? calloc((size_t)B * Lk, 1) : NULL;
    if (pad)   /* mask a random tail of each sequence, never the first two keys */
        for (int b = 0; b < B; b++)
            for (int j = 2 + (int)(rnd() % (Lk - 1)); j < Lk; j++) pad[(size_t)b * Lk + j] = 1;
    float *out = malloc(sizeof(float) * B * Lq * E);
    double *want = malloc(sizeof(double) * B * Lq * E), *sc = malloc(sizeof(double) * Lk);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < Lq; i++) {
                const float *q = qb + ((size_t)b * Lq + i) * qs + h * dh;
                double m = -INFINITY, s = 0;
                for (int j = 0; j < Lk; j++) {
                    const float *k = kvb + ((size_t)b * Lk + j) * 2 * E + h * dh;
                    double d = 0;
                    for (int t = 0; t < dh; t++) d += (double)q[t] * k[t];
                    sc[j] = (pad && pad[(size_t)b * Lk + j]) ? -INFINITY : d / sqrt((double)dh);
                    if (sc[j] > m) m = sc[j];
                }
                for (int j = 0; j < Lk; j++) s += (sc[j] = exp(sc[j] - m));
                for (int t = 0; t < dh; t++) {
                    double acc = 0;
                    for (int j = 0; j < Lk; j++) acc += sc[j] / s * kvb[((size_t)b * Lk + j) * 2 * E + E + h * dh + t];
                    want[((size_t)b * Lq + i) * E + h * dh + t] = acc;
                }
            }
    act_buf pb = {pad, ACT_DT_U8};
    char what[96];
    snprintf(what, sizeof what, "attention B%d Lq%d Lk%d nh%d dh%d mask%d", B, Lq, Lk, nh, dh, masked);
    check_rc(what, be->attention(be, fbuf(qb), qs, fbuf(kvb), fbuf(kvb + E), 2 * E, B, Lq, Lk, nh, dh,
                                 pad ? pb : act_nobuf(), fbuf(out)), be);
    check_close(what, out, want, (size_t)B * Lq * E);
    free(qb), free(kvb), free(pad), free(out), free(want), free(sc);
}

/* flat: x and d within +-1e-3, so a row's variance (~1e-6) is under eps = 1e-5 */
static void test_add_layernorm(act_backend *be, int rows, int E, int alias, int flat) {
    float *x = rand_arr((size_t)rows * E, flat ? -1e-3f : -2, flat ? 1e-3f : 2);
    float *d = rand_arr((size_t)rows * E, flat ? -1e-3f : -1, flat ? 1e-3f : 1);
    float *w = rand_arr(E, 0.5f, 1.5f), *b = rand_arr(E, -0.5f, 0.5f);
    float *y = alias ? x : malloc(sizeof(float) * rows * E);
    double *want = malloc(sizeof(double) * rows * E);
    float eps = 1e-5f;
    for (int r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < E; i++) m += (double)x[r * E + i] + d[r * E + i];
        m /= E;
        for (int i = 0; i < E; i++) v += pow((double)x[r * E + i] + d[r * E + i] - m, 2);
        v /= E;
        for (int i = 0; i < E; i++)
            want[r * E + i] = ((double)x[r * E + i] + d[r * E + i] - m) / sqrt(v + eps) * w[i] + b[i];
    }
    act_tensor tw = tensor("ln.w", w, E, 0, 0, 0), tb = tensor("ln.b", b, E, 0, 0, 0);
    act_ln ln = {&tw, &tb};
    char what[96];
    snprintf(what, sizeof what, "add_layernorm rows%d E%d alias%d%s", rows, E, alias, flat ? " flat" : "");
    check_rc(what, be->add_layernorm(be, fbuf(x), fbuf(d), &ln, eps, rows, E, fbuf(y)), be);
    check_close(what, y, want, (size_t)rows * E);
    if (!alias) free(y);
    free(x), free(d), free(w), free(b), free(want);
}

static void test_assembly(act_backend *be, int B, int ncam, int H, int E) {
    int Lm = 2 + ncam, Lp = H + 2, R = H;
    float *lat = rand_arr((size_t)B * E, -1, 1), *qp = rand_arr((size_t)B * E, -1, 1);
    float *vis = rand_arr((size_t)ncam * B * E, -1, 1), *pos = rand_arr((size_t)(Lp > Lm ? Lp : Lm) * E, -1, 1);
    float *type = rand_arr(3 * (size_t)E, -1, 1), *cls = rand_arr(E, -1, 1);
    float *act = rand_arr((size_t)B * H * E, -1, 1), *q = rand_arr((size_t)R * E, -1, 1);
    size_t nm = (size_t)B * Lm * E, np = (size_t)B * Lp * E, nb = (size_t)B * R * E;
    float *om = malloc(nm * 4), *op = malloc(np * 4), *ob = malloc(nb * 4);
    double *wm = malloc(nm * 8), *wp = malloc(np * 8), *wb = malloc(nb * 8);
    for (int b = 0; b < B; b++) {
        for (int l = 0; l < Lm; l++)
            for (int i = 0; i < E; i++) {
                float src = l == 0 ? lat[b * E + i] : l == 1 ? qp[b * E + i] : vis[((size_t)(l - 2) * B + b) * E + i];
                wm[((size_t)b * Lm + l) * E + i] = (double)(src + pos[l * E + i]) + type[(l < 2 ? l : 2) * E + i];
            }
        for (int l = 0; l < Lp; l++)
            for (int i = 0; i < E; i++) {
                float src = l == 0 ? cls[i] : l == 1 ? qp[b * E + i] : act[((size_t)b * H + l - 2) * E + i];
                wp[((size_t)b * Lp + l) * E + i] = (double)src + pos[l * E + i];
            }
        for (int r = 0; r < R; r++)
            for (int i = 0; i < E; i++) wb[((size_t)b * R + r) * E + i] = q[r * E + i];
    }
    act_tensor tt = tensor("mem_type", type, 3, E, 0, 0), tc = tensor("cls", cls, E, 0, 0, 0);
    act_tensor tq = tensor("query", q, R, E, 0, 0);
    char what[96];
    snprintf(what, sizeof what, "memory_assemble B%d ncam%d E%d", B, ncam, E);
    check_rc(what, be->memory_assemble(be, fbuf(lat), fbuf(qp), fbuf(vis), B, ncam, E, fbuf(pos), &tt,
                                       fbuf(om)), be);
    check_close(what, om, wm, nm);
    snprintf(what, sizeof what, "posterior_assemble B%d H%d E%d", B, H, E);
    check_rc(what, be->posterior_assemble(be, &tc, fbuf(qp), fbuf(act), B, H, E, fbuf(pos), fbuf(op)), be);
    check_close(what, op, wp, np);
    snprintf(what, sizeof what, "broadcast_rows B%d R%d E%d", B, R, E);
    check_rc(what, be->broadcast_rows(be, &tq, B, R, E, fbuf(ob)), be);
    check_close(what, ob, wb, nb);
    free(lat), free(qp), free(vis), free(pos), free(type), free(cls), free(act), free(q);
    free(om), free(op), free(ob), free(wm), free(wp), free(wb);
}

/* The seed builds the table in float32: the angle is the float product of float(position) and
 * float(exp(float(2i) * float(-ln(1e4)/E))); that product is what sin/cos see. */
static void test_sinusoid(act_backend *be, int L, int E) {
    float *got = malloc(sizeof(float) * L * E);
    double *want = malloc(sizeof(double) * L * E);
    float c = (float)(-log(10000.0) / E);
    for (int l = 0; l < L; l++)
        for (int j = 0; j < E; j++) {
            float div = (float)exp((double)((float)(j / 2 * 2) * c));
            float a = (float)l * div;
            want[(size_t)l * E + j] = j % 2 ? cos((double)a) : sin((double)a);
        }
    char what[96];
    snprintf(what, sizeof what, "sinusoid_table L%d E%d", L, E);
    check_rc(what, be->sinusoid_table(be, L, E, fbuf(got)), be);
    check_close(what, got, want, (size_t)L * E);
    free(got), free(want);
}

static void test_normalize(act_backend *be, act_norm_type type, int rows, int dim) {
    float *x = rand_arr((size_t)rows * dim, -3, 3), *lo = rand_arr(dim, -1, 0), *hi = rand_arr(dim, 0.1f, 2);
    hi[0] = type == ACT_NORM_MIN_MAX ? lo[0] : 0.0f;   /* a degenerate joint: the eps clamp applies */
    float *y = malloc(sizeof(float) * rows * dim), *back = malloc(sizeof(float) * rows * dim);
    double *want = malloc(sizeof(double) * rows * dim), *wantx = malloc(sizeof(double) * rows * dim);
    float eps = 1e-8f;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < dim; i++) {
            double v = x[r * dim + i];
            if (type == ACT_NORM_MIN_MAX) {
                double rg = fmax((double)hi[i] - lo[i], eps);
                want[r * dim + i] = 2 * (v - lo[i]) / rg - 1;
            } else {
                want[r * dim + i] = (v - lo[i]) / fmax(hi[i], eps);
            }
            wantx[r * dim + i] = v;
        }
    hi[0] = type == ACT_NORM_MIN_MAX ? lo[0] + 1.0f : 1.0f;   /* round trip on well-posed stats */
    act_tensor tl = tensor("lo", lo, dim, 0, 0, 0), th = tensor("hi", hi, dim, 0, 0, 0);
    char what[96];
    snprintf(what, sizeof what, "normalize %s rows%d dim%d (inverse round trip)",
             type == ACT_NORM_MIN_MAX ? "min_max" : "mean_std", rows, dim);
    check_rc(what, be->normalize(be, fbuf(x), rows, dim, &tl, &th, type, eps, 0, fbuf(y)), be);
    check_rc(what, be->normalize(be, fbuf(y), rows, dim, &tl, &th, type, eps, 1, fbuf(back)), be);
    check_close(what, back, wantx, (size_t)rows * dim);
    hi[0] = type == ACT_NORM_MIN_MAX ? lo[0] : 0.0f;
    snprintf(what, sizeof what, "normalize %s rows%d dim%d (degenerate stat clamped)",
             type == ACT_NORM_MIN_MAX ? "min_max" : "mean_std", rows, dim);
    check_rc(what, be->normalize(be, fbuf(x), rows, dim, &tl, &th, type, eps, 0, fbuf(y)), be);
    check_close(what, y, want, (size_t)rows * dim);
    free(x), free(lo), free(hi), free(y), free(back), free(want), free(wantx);
}

static void test_latent(act_backend *be, int B, int L, int sample) {
    float *ml = rand_arr((size_t)B * 2 * L, -1.5f, 1.5f);
    float *mu = malloc(sizeof(float) * B * L), *lv = malloc(sizeof(float) * B * L);
    float *kl = malloc(sizeof(float) * B), *z = malloc(sizeof(float) * B * L);
    double *wmu = malloc(sizeof(double) * B * L), *wlv = malloc(sizeof(double) * B * L);
    double *wkl = malloc(sizeof(double) * B), *wz = malloc(sizeof(double) * B * L);
    uint64_t seed = rnd();
    uint8_t s8[8];
    for (int i = 0; i < 8; i++) s8[i] = (uint8_t)(seed >> (8 * i));
    for (int b = 0; b < B; b++) {
        wkl[b] = 0;
        for (int i = 0; i < L; i++) {
            double m = ml[b * 2 * L + i], v = ml[b * 2 * L + L + i];
            wmu[b * L + i] = m;
            wlv[b * L + i] = v;
            wkl[b] += -0.5 * (1 + v - m * m - exp(v));
            wz[b * L + i] = sample ? m + act_normal_eps(seed, (uint64_t)b * L + i) * exp(0.5 * v) : m;
        }
    }
    act_buf sb = {s8, ACT_DT_U8};
    char what[96];
    snprintf(what, sizeof what, "latent B%d L%d sample%d", B, L, sample);
    check_rc(what, be->latent(be, fbuf(ml), B, L, sample, sb, fbuf(mu), fbuf(lv), fbuf(kl), fbuf(z)), be);
    check_close(what, mu, wmu, (size_t)B * L);
    check_close(what, lv, wlv, (size_t)B * L);
    check_close(what, kl, wkl, B);
    check_close(what, z, wz, (size_t)B * L);
    free(ml), free(mu), free(lv), free(kl), free(z), free(wmu), free(wlv), free(wkl), free(wz);
}

/* The CPU backend sizes its workspaces and makes its Winograd filters from the model at
 * load_weights; give it a model whose trunk holds the largest conv these tests run (64
 * channels, maps up to 16x16 after the stem), and `extra` as layer1's first conv. The dummy
 * tensors have no data, so only `extra` gets Winograd filters. */
static int load_model(act_backend *be, const act_conv *extra, const act_linear *lin);
static int load_ws(act_backend *be, const act_conv *extra) { return load_model(be, extra, NULL); }

/* the model of load_ws with one decoder layer whose linear1 is lin (its weights are packed at
 * load where the CPU runs act_cpu_pgemm), and `stem` (or a 16 -> 64 7x7/2 conv) as the trunk's
 * conv1 on in_hw x in_hw frames: the workspaces are sized for that */
static int load_model_at(act_backend *be, const act_conv *extra, const act_linear *lin,
                         const act_conv *stem, int in_hw) {
    static act_model m;
    static act_tensor dummy;
    memset(&m, 0, sizeof m);
    m.n_trunks = 1;
    m.cfg.input_h = m.cfg.input_w = in_hw;
    act_trunk *t = &m.trunks[0];
    act_conv c1 = {&dummy, NULL, NULL, NULL, 16, 64, 7, 2, 3};
    t->conv1 = stem ? *stem : c1;
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < 2; i++) {
            act_conv c = {&dummy, NULL, NULL, NULL, 64, 64, 3, 1, 1};
            t->blocks[l][i].conv1 = c;
            t->blocks[l][i].conv2 = c;
        }
    if (extra) t->blocks[0][0].conv1 = *extra;
    if (lin) {
        m.cfg.dec_layers = 1;
        m.dec[0].ff1 = *lin;
    }
    int c1_hw = (in_hw + 2 * t->conv1.pad - t->conv1.k) / t->conv1.stride + 1;
    m.cfg.feat_h = m.cfg.feat_w = (c1_hw - 1) / 2 + 1;   /* after the max pool (blocks of stride 1) */
    return be->load_weights(be, &m);
}
static int load_model(act_backend *be, const act_conv *extra, const act_linear *lin) {
    return load_model_at(be, extra, lin, NULL, 64);
}

/* a CPU backend on `threads` threads (ACT_CPU_THREADS, read at create); 0: made */
static int cpu_backend_threads(int threads, act_backend **be, char *err, size_t errlen) {
    char nt[16];
    snprintf(nt, sizeof nt, "%d", threads);
    setenv("ACT_CPU_THREADS", nt, 1);
    int rc = act_backend_cpu_create(ACT_FP32, be, err, errlen);
    unsetenv("ACT_CPU_THREADS");
    return rc;
}

/* The stem in several groups of images, as a batch of many frames runs it: workspaces sized for
 * a model whose stem is ResNet's conv1 on 24x24 frames hold 19 padded images (3 x 2 planes of
 * 29 x 19), so 40 images run as 19 + 19 + 2, on 1 and 3 threads. The outputs past the batch stay
 * unwritten (test_conv_via). */
static void test_stem_groups(void) {
    static act_tensor dummy;
    act_conv stem = {&dummy, NULL, NULL, NULL, 3, 16, 7, 2, 3};
    for (int threads = 1; threads <= 3; threads += 2) {
        char err[ACT_ERR_LEN];
        act_backend *be;
        int rc = cpu_backend_threads(threads, &be, err, sizeof err);
        g_checks++;
        if (rc || load_model_at(be, NULL, NULL, &stem, 24)) {
            g_fail++;
            fprintf(stderr, "FAIL stem groups: backend for 24x24 frames: %s\n", rc ? err : be->err);
            if (!rc) be->destroy(be);
            return;
        }
        test_conv(be, 40, 3, 16, 24, 24, 7, 2, 3, 0, ACT_EPI_RELU);
        test_conv(be, 21, 3, 32, 24, 24, 7, 2, 3, 0, ACT_EPI_NONE);
        be->destroy(be);
    }
}

int main(void) {
    seed_rng("test_cpu_ops");
    char err[ACT_ERR_LEN];
    act_backend *be;
    if (act_backend_cpu_create(ACT_FP32, &be, err, sizeof err)) {
        fprintf(stderr, "FAIL cpu backend: %s\n", err);
        return 1;
    }
    if (load_ws(be, NULL)) {
        fprintf(stderr, "FAIL load_weights: %s\n", be->err);
        return 1;
    }
    act_backend *bad;
    g_checks++;
    if (act_backend_cpu_create(ACT_BF16, &bad, err, sizeof err) == 0 || !strstr(err, "bf16")) {
        g_fail++;
        fprintf(stderr, "FAIL cpu backend accepted bf16 (or said nothing about it): %s\n", err);
    }

    test_preprocess(be, 2, 37, 53, 24, 40, 0, 0, 0);      /* downscale, non-square */
    test_preprocess(be, 1, 20, 18, 31, 29, 0, 0, 1);      /* upscale + ImageNet */
    test_preprocess(be, 2, 40, 40, 29, 31, 24, 24, 1);    /* crop offsets 2.5 -> 2, 3.5 -> 4 */
    test_preprocess(be, 1, 16, 16, 16, 16, 11, 13, 0);    /* identity resize, odd crop */
    test_preprocess(be, 2, 12, 20, 12, 20, 0, 0, 1);      /* identity resize + ImageNet */

    test_conv(be, 2, 3, 8, 23, 19, 7, 2, 3, 0, ACT_EPI_RELU);   /* ResNet conv1 */
    test_conv(be, 2, 8, 12, 11, 13, 3, 1, 1, 1, ACT_EPI_RELU);  /* block conv2 + residual */
    test_conv(be, 1, 8, 16, 11, 13, 3, 2, 1, 0, ACT_EPI_NONE);  /* strided 3x3 */
    test_conv(be, 2, 8, 16, 11, 13, 1, 2, 0, 0, ACT_EPI_NONE);  /* downsample 1x1 stride 2 */
    test_conv(be, 3, 16, 5, 7, 7, 1, 1, 0, 0, ACT_EPI_NONE);    /* keypoints 1x1 (no im2col) */
    test_conv(be, 1, 16, 5, 7, 7, 1, 1, 0, 1, ACT_EPI_RELU);
    test_conv(be, 2, 2, 3, 3, 2, 7, 2, 3, 1, ACT_EPI_NONE);     /* map smaller than the kernel */
    test_conv(be, 5, 4, 6, 9, 8, 3, 1, 1, 1, ACT_EPI_RELU);     /* GEMM groups of 3 + 2 images */
    test_conv(be, 4, 8, 3, 5, 5, 1, 1, 0, 1, ACT_EPI_NONE);     /* 1x1 groups: 3 copied + 1 direct */
    test_conv(be, 1, 4, 4, 5, 1, 3, 1, 1, 0, ACT_EPI_GELU);     /* one column; generic epilogue */
    test_conv(be, 2, 4, 6, 7, 9, 3, 1, 1, 1, ACT_EPI_GELU);     /* generic epilogue + residual */
    test_conv(be, 5, 16, 5, 7, 7, 1, 1, 0, 1, ACT_EPI_RELU);    /* 1x1 groups: 3 + 2 copied */
    /* the stem computed directly (cpu_stem.c): ResNet's conv1 with a tail block of 10 of 16
     * pixels, a map smaller than the kernel, 4 input channels at stride 1, no activation, and
     * shapes it leaves to im2col (a residual, GELU, 5 input channels, stride 3) */
    test_conv(be, 2, 3, 32, 23, 19, 7, 2, 3, 0, ACT_EPI_RELU);
    test_conv(be, 3, 3, 16, 40, 37, 7, 2, 3, 0, ACT_EPI_RELU);
    test_conv(be, 1, 3, 16, 3, 2, 7, 2, 3, 0, ACT_EPI_NONE);
    test_conv(be, 2, 4, 16, 9, 21, 5, 1, 2, 0, ACT_EPI_NONE);
    test_conv(be, 1, 1, 48, 17, 33, 3, 2, 0, 0, ACT_EPI_RELU);
    test_conv(be, 1, 3, 16, 11, 13, 7, 2, 3, 1, ACT_EPI_RELU);
    test_conv(be, 1, 3, 16, 11, 13, 7, 2, 3, 0, ACT_EPI_GELU);
    test_conv(be, 1, 5, 16, 11, 13, 3, 2, 1, 0, ACT_EPI_RELU);
    test_conv(be, 1, 3, 16, 11, 13, 3, 3, 1, 0, ACT_EPI_RELU);
    /* both channel blocks of the stem (16 with AVX-512, 4 without) on whatever machine this is */
    for (int blk = 0; blk < 2; blk++) {
        setenv("ACT_CPU_STEM_BLOCK", blk ? "4" : "16", 1);
        test_conv(be, 2, 3, 32, 23, 19, 7, 2, 3, 0, ACT_EPI_RELU);
        test_conv(be, 2, 4, 16, 9, 21, 5, 1, 2, 0, ACT_EPI_NONE);
    }
    unsetenv("ACT_CPU_STEM_BLOCK");
    test_stem_groups();

    test_winograd(be);
    /* the backend's own loops on 3 threads (the pool splits channels unevenly over them) */
    act_backend *be3;
    if (cpu_backend_threads(3, &be3, err, sizeof err) || load_ws(be3, NULL)) {
        fprintf(stderr, "FAIL cpu backend with 3 threads: %s\n", err);
        return 1;
    }
    test_winograd(be3);
    test_conv(be3, 5, 4, 6, 9, 8, 3, 1, 1, 1, ACT_EPI_RELU);
    test_conv(be3, 2, 3, 8, 23, 19, 7, 2, 3, 0, ACT_EPI_RELU);
    test_conv(be3, 4, 8, 3, 5, 5, 1, 1, 0, 1, ACT_EPI_NONE);
    be3->destroy(be3);
    test_pool();
    test_sgemm_split();
    test_pgemm();

    test_groupnorm(be, 2, 32, 49, 2, 0, ACT_EPI_RELU);
    test_groupnorm(be, 3, 64, 30, 4, 1, ACT_EPI_RELU);
    test_groupnorm(be, 1, 16, 7, 1, 0, ACT_EPI_NONE);
    test_groupnorm_in(be, 2, 32, 20, 2, 1, ACT_EPI_RELU, -2e-3f, 4e-3f);   /* nearly flat groups */

    test_maxpool(be, 2, 3, 12, 12);
    test_maxpool(be, 1, 4, 13, 7);
    test_maxpool(be, 2, 2, 2, 3);
    test_maxpool(be, 1, 3, 1, 1);

    test_spatial_softmax(be, 2, 8, 7, 7);
    test_spatial_softmax(be, 3, 4, 5, 9);
    test_spatial_softmax_in(be, 2, 4, 6, 5, 90, 100);   /* logits whose exp overflows fp32 */

    test_linear(be, 5, 12, 0, 12, 16, ACT_EPI_NONE);
    test_linear(be, 7, 24, 8, 16, 16, ACT_EPI_GELU);   /* a row view of a packed in_proj */
    test_linear(be, 3, 33, 1, 31, 17, ACT_EPI_RELU);
    test_linear_group(be, 3, 5, 24, 8, 16, 16);
    test_linear_packed(be);
    setenv("ACT_CPU_PACKED_LINEAR", "0", 1);
    test_linear_packed(be);
    unsetenv("ACT_CPU_PACKED_LINEAR");
    test_linear_group(be, 4, 2, 9, 0, 9, 7);

    test_attention(be, 2, 16, 16, 4, 8, 0);
    test_attention(be, 3, 18, 18, 2, 16, 1);   /* encoder with key padding */
    test_attention(be, 2, 5, 7, 3, 4, 0);      /* cross attention shape */
    test_attention(be, 3, 5, 11, 2, 8, 1);     /* masked with Lq != Lk: the mask is [B][Lk] */

    test_add_layernorm(be, 6, 32, 0, 0);
    test_add_layernorm(be, 5, 48, 1, 0);
    test_add_layernorm(be, 4, 32, 0, 1);   /* nearly flat rows: eps decides rstd */

    test_assembly(be, 3, 3, 5, 16);
    test_assembly(be, 1, 1, 2, 8);

    test_sinusoid(be, 18, 32);
    test_sinusoid(be, 1024, 64);
    test_sinusoid(be, 9, 7);

    test_normalize(be, ACT_NORM_MIN_MAX, 6, 10);
    test_normalize(be, ACT_NORM_MEAN_STD, 4, 9);

    test_latent(be, 3, 8, 0);
    test_latent(be, 4, 6, 1);

    be->destroy(be);
    printf("test_cpu_ops: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
