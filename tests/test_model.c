/* test_model.c - act_model_load on real converter output: the config parsed from metadata, every
 * tensor bound to its place with its canonical name and geometry, the normalization helpers
 * against PyTorch's NormalizationModule; then edited copies (checksum recomputed, so the check
 * under test speaks) that must fail with a message naming the key or tensor: missing, unknown
 * and misshapen tensors, config/shape disagreements, missing and bad metadata values.
 *
 * Files: small.actw (shared BatchNorm trunk, min_max, gelu) and small_sep_gn.actw (separate
 * GroupNorm trunks, mean_std, relu, crop) with their .expect files, from tests/make_testdata.py.
 */
#include "actw_test.h"

#include <math.h>
#include <sys/resource.h>
#include <sys/wait.h>
#ifdef ACT_WITH_ZSTD
#include <zstd.h>
#endif

/* ---- expectations ---- */

static int cfg_field(const act_config *c, const char *k, double *v) {
    static const struct { const char *name; size_t off; } ints[] = {
#define F(x) {#x, offsetof(act_config, x)}
        F(obs_dim), F(action_dim), F(pred_horizon), F(obs_horizon), F(num_action_steps), F(num_cams),
        F(image_h), F(image_w), F(input_h), F(input_w), F(crop_h), F(crop_w), F(imagenet_norm),
        F(separate_trunks), F(num_keypoints), F(vision_dim), F(feat_h), F(feat_w), F(hidden_dim), F(nheads),
        F(enc_layers), F(dec_layers), F(ff_dim), F(latent_dim),
#undef F
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (strcmp(k, ints[i].name) == 0) {
            *v = *(const int *)((const char *)c + ints[i].off);
            return 0;
        }
    if (strcmp(k, "vision_norm") == 0) *v = c->vision_norm == ACT_VISION_GROUPNORM;
    else if (strcmp(k, "activation") == 0) *v = c->activation == ACT_ACT_GELU;
    else if (strcmp(k, "norm_type") == 0) *v = c->norm_type == ACT_NORM_MEAN_STD;
    else if (strcmp(k, "kl_weight") == 0) *v = c->kl_weight;
    else return -1;
    return 0;
}

/* Compares one normalization helper with the PyTorch rows of the .expect file. */
static void check_norm_rows(const act_model *m, const char *which, int rows, int cols, const float *x, const float *y) {
    float *got = (float *)calloc((size_t)rows * cols, sizeof(float));
    if (strcmp(which, "qpos") == 0) act_normalize_qpos(m, x, got, rows);
    else if (strcmp(which, "action") == 0) act_normalize_action(m, x, got, rows);
    else act_denormalize_action(m, x, got, rows);
    double worst = 0;
    for (int i = 0; i < rows * cols; i++) {
        double d = fabs((double)got[i] - y[i]) / (fabs(y[i]) + 1e-3);
        if (d > worst) worst = d;
    }
    /* same fp32 operations in the same order as PyTorch: agreement to an ulp or two */
    CHECK(worst <= 1e-6, "%s: normalization %s differs from PyTorch by %.3g (relative)", m->w->path, which, worst);
    free(got);
}

static void check_expect(const act_model *m, const char *stem) {
    char path[512], kind[16], key[128], sval[256];
    snprintf(path, sizeof path, "%s/%s.expect", data_dir(), stem);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "missing %s", path);
    if (!f) return;
    int ncfg = 0, nnorm = 0;
    while (fscanf(f, "%15s", kind) == 1) {
        if (strcmp(kind, "cfg") == 0 && fscanf(f, "%127s %255s", key, sval) == 2) {
            ncfg++;
            double v;
            if (strcmp(key, "camera_names") == 0) {
                char joined[ACT_MAX_CAMS * ACT_NAME_LEN] = "";
                for (int i = 0; i < m->cfg.num_cams; i++) {
                    if (i) strcat(joined, ",");
                    strcat(joined, m->cfg.camera_names[i]);
                }
                CHECK(strcmp(joined, sval) == 0, "%s: camera_names '%s', expected '%s'", stem, joined, sval);
            } else if (cfg_field(&m->cfg, key, &v) == 0) {
                CHECK(fabs(v - atof(sval)) <= 1e-6 * fabs(v), "%s: cfg %s = %g, expected %s", stem, key, v, sval);
            } else {
                CHECK(0, "%s: unknown cfg field '%s' in the .expect file", stem, key);
            }
        } else if (strcmp(kind, "norm") == 0) {
            int rows, cols;
            if (fscanf(f, "%127s %d %d", key, &rows, &cols) != 3 || rows < 1 || cols < 1 || rows * cols > 1 << 16)
                break;
            float *x = (float *)malloc(sizeof(float) * 2 * (size_t)rows * cols);
            int ok = 1;
            for (int i = 0; i < 2 * rows * cols && ok; i++) ok = fscanf(f, "%f", &x[i]) == 1;
            CHECK(ok, "%s: short norm section", stem);
            if (ok) check_norm_rows(m, key, rows, cols, x, x + (size_t)rows * cols);
            free(x);
            nnorm++;
        } else {
            int c;
            while ((c = fgetc(f)) != '\n' && c != EOF) {}
        }
    }
    fclose(f);
    CHECK(ncfg >= 25 && nnorm == 3, "%s: .expect had %d cfg lines and %d norm sections", stem, ncfg, nnorm);
}

/* ---- structure ---- */

static unsigned char *g_marks;

static void mark(const act_model *m, const act_tensor *t, const char *fmt, ...) ACT_PRINTF_TEST;
static void mark(const act_model *m, const act_tensor *t, const char *fmt, ...) {
    char want[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(want, sizeof want, fmt, ap);
    va_end(ap);
    CHECK(t != NULL, "%s: no tensor bound for '%s'", m->w->path, want);
    if (!t) return;
    CHECK(strcmp(t->name, want) == 0, "%s: '%s' bound where '%s' belongs", m->w->path, t->name, want);
    CHECK(t >= m->w->tensors && t < m->w->tensors + m->w->n_tensors, "%s: tensor pointer outside the directory", want);
    CHECK(g_marks[t->index] == 0, "%s: tensor '%s' bound twice", m->w->path, want);
    g_marks[t->index] = 1;
}

static void check_conv(const act_model *m, const act_conv *c, const char *name, int cin, int cout, int k, int stride,
                       int pad) {
    CHECK(c->cin == cin && c->cout == cout && c->k == k && c->stride == stride && c->pad == pad,
          "%s: conv %d->%d k%d s%d p%d, expected %d->%d k%d s%d p%d", name, c->cin, c->cout, c->k, c->stride, c->pad,
          cin, cout, k, stride, pad);
    mark(m, c->w, "%s.w", name);
    mark(m, c->b, "%s.b", name);
    if (m->cfg.vision_norm == ACT_VISION_GROUPNORM) {
        mark(m, c->gn_w, "%s.gn.w", name);
        mark(m, c->gn_b, "%s.gn.b", name);
    } else {
        CHECK(!c->gn_w && !c->gn_b, "%s: GroupNorm affine in a BatchNorm trunk", name);
    }
}

static void check_linear(const act_model *m, const act_linear *l, const char *name, int row0, int out, int in) {
    CHECK(l->row0 == row0 && l->out == out && l->in == in, "%s: linear rows [%d,+%d) in %d, expected [%d,+%d) in %d",
          name, l->row0, l->out, l->in, row0, out, in);
}

static void check_mha(const act_model *m, const act_mha *a, const char *name, int E) {
    char n[96];
    snprintf(n, sizeof n, "%s.in", name);
    check_linear(m, &a->qkv, n, 0, 3 * E, E);
    check_linear(m, &a->q, n, 0, E, E);
    check_linear(m, &a->k, n, E, E, E);
    check_linear(m, &a->v, n, 2 * E, E, E);
    check_linear(m, &a->kv, n, E, 2 * E, E);
    CHECK(a->q.w == a->qkv.w && a->k.w == a->qkv.w && a->v.w == a->qkv.w && a->kv.b == a->qkv.b,
          "%s: q/k/v are not views of the packed in_proj", name);
    mark(m, a->qkv.w, "%s.in.w", name);
    mark(m, a->qkv.b, "%s.in.b", name);
    snprintf(n, sizeof n, "%s.out", name);
    check_linear(m, &a->out, n, 0, E, E);
    mark(m, a->out.w, "%s.out.w", name);
    mark(m, a->out.b, "%s.out.b", name);
}

static void lin(const act_model *m, const act_linear *l, const char *name, int out, int in) {
    check_linear(m, l, name, 0, out, in);
    mark(m, l->w, "%s.w", name);
    mark(m, l->b, "%s.b", name);
}

static void ln(const act_model *m, const act_ln *l, const char *name) {
    mark(m, l->w, "%s.w", name);
    mark(m, l->b, "%s.b", name);
}

static void check_structure(const act_model *m) {
    const act_config *c = act_model_config(m);
    const int E = c->hidden_dim, F = c->ff_dim;
    char n[96];
    g_marks = (unsigned char *)calloc((size_t)m->w->n_tensors, 1);
    CHECK(c == &m->cfg, "act_model_config");
    CHECK(m->n_trunks == (c->separate_trunks ? c->num_cams : 1), "n_trunks %d", m->n_trunks);
    static const int width[4] = {64, 128, 256, 512};
    for (int T = 0; T < m->n_trunks; T++) {
        const act_trunk *t = &m->trunks[T];
        snprintf(n, sizeof n, "vision.%d.conv1", T);
        check_conv(m, &t->conv1, n, 3, 64, 7, 2, 3);
        for (int L = 0; L < 4; L++)
            for (int I = 0; I < 2; I++) {
                const act_block *b = &t->blocks[L][I];
                int cin = I == 0 ? (L ? width[L - 1] : 64) : width[L], s = L && !I ? 2 : 1;
                snprintf(n, sizeof n, "vision.%d.layer%d.%d.conv1", T, L + 1, I);
                check_conv(m, &b->conv1, n, cin, width[L], 3, s, 1);
                snprintf(n, sizeof n, "vision.%d.layer%d.%d.conv2", T, L + 1, I);
                check_conv(m, &b->conv2, n, width[L], width[L], 3, 1, 1);
                CHECK(b->has_down == (L && !I), "layer%d.%d has_down %d", L + 1, I, b->has_down);
                if (b->has_down) {
                    snprintf(n, sizeof n, "vision.%d.layer%d.%d.down", T, L + 1, I);
                    check_conv(m, &b->down, n, cin, width[L], 1, 2, 0);
                }
            }
        mark(m, t->kp_w, "vision.%d.keypoints.w", T);
        mark(m, t->kp_b, "vision.%d.keypoints.b", T);
        mark(m, t->pos_grid, "vision.%d.pos_grid", T);
        CHECK(t->pos_grid && t->pos_grid->dims[0] == (int64_t)c->feat_h * c->feat_w, "pos_grid rows");
        CHECK(t->kp_w && t->kp_w->dims[0] == c->num_keypoints, "keypoints rows");
        mark(m, t->out_w, "vision.%d.out.w", T);
        mark(m, t->out_b, "vision.%d.out.b", T);
        CHECK(t->out_w && t->out_w->dims[0] == c->vision_dim && t->out_w->dims[1] == 2 * c->num_keypoints,
              "out.w shape");
    }
    mark(m, m->cls_embed, "head.cls_embed");
    lin(m, &m->enc_qpos, "head.enc_qpos", E, c->obs_dim);
    lin(m, &m->enc_action, "head.enc_action", E, c->action_dim);
    for (int i = 0; i < c->enc_layers; i++) {
        snprintf(n, sizeof n, "head.enc.%d.attn", i);
        check_mha(m, &m->enc[i].attn, n, E);
        snprintf(n, sizeof n, "head.enc.%d.ln1", i);
        ln(m, &m->enc[i].ln1, n);
        snprintf(n, sizeof n, "head.enc.%d.ln2", i);
        ln(m, &m->enc[i].ln2, n);
        snprintf(n, sizeof n, "head.enc.%d.ff1", i);
        lin(m, &m->enc[i].ff1, n, F, E);
        snprintf(n, sizeof n, "head.enc.%d.ff2", i);
        lin(m, &m->enc[i].ff2, n, E, F);
    }
    lin(m, &m->latent_proj, "head.latent_proj", 2 * c->latent_dim, E);
    lin(m, &m->latent_out, "head.latent_out", E, c->latent_dim);
    lin(m, &m->dec_qpos, "head.dec_qpos", E, c->obs_dim);
    lin(m, &m->visual_proj, "head.visual_proj", E, c->vision_dim);
    mark(m, m->mem_type, "head.mem_type");
    mark(m, m->query, "head.query");
    for (int i = 0; i < c->dec_layers; i++) {
        const act_dec_layer *d = &m->dec[i];
        snprintf(n, sizeof n, "head.dec.%d.self_attn", i);
        check_mha(m, &d->self_attn, n, E);
        snprintf(n, sizeof n, "head.dec.%d.cross_attn", i);
        check_mha(m, &d->cross_attn, n, E);
        const act_ln *lns[3] = {&d->ln1, &d->ln2, &d->ln3};
        for (int k = 0; k < 3; k++) {
            snprintf(n, sizeof n, "head.dec.%d.ln%d", i, k + 1);
            ln(m, lns[k], n);
        }
        snprintf(n, sizeof n, "head.dec.%d.ff1", i);
        lin(m, &d->ff1, n, F, E);
        snprintf(n, sizeof n, "head.dec.%d.ff2", i);
        lin(m, &d->ff2, n, E, F);
    }
    lin(m, &m->action_head, "head.action_head", c->action_dim, E);
    int ms = c->norm_type == ACT_NORM_MEAN_STD;
    mark(m, m->qpos_lo, "norm.qpos.%s", ms ? "mean" : "min");
    mark(m, m->qpos_hi, "norm.qpos.%s", ms ? "std" : "max");
    mark(m, m->action_lo, "norm.action.%s", ms ? "mean" : "min");
    mark(m, m->action_hi, "norm.action.%s", ms ? "std" : "max");
    int64_t total = 0;
    for (int i = 0; i < m->w->n_tensors; i++) {
        CHECK(g_marks[i], "%s: tensor '%s' is in the file but bound nowhere", m->w->path, m->w->tensors[i].name);
        total += m->w->tensors[i].numel;
    }
    free(g_marks);
    CHECK(c->n_params == total, "n_params %lld, expected %lld", (long long)c->n_params, (long long)total);
    char hash[17];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)m->w->checksum);
    CHECK(strcmp(c->model_hash, hash) == 0, "model_hash %s, expected %s", c->model_hash, hash);
    CHECK(strlen(c->source_sha256) == 64 && c->converter_version[0], "provenance: sha '%s' version '%s'",
          c->source_sha256, c->converter_version);
    CHECK(c->ln_eps > 0.99e-5f && c->ln_eps < 1.01e-5f && c->norm_eps > 0.99e-8f && c->norm_eps < 1.01e-8f,
          "eps values %g %g", c->ln_eps, c->norm_eps);
}

/* Fresh random rows: the helpers against the formula in double, and denormalize inverting
 * normalize (away from the clamp, where both are exact to fp32 rounding). */
static void check_norm_random(const act_model *m) {
    const act_config *c = &m->cfg;
    const int rows = 9, A = c->action_dim;
    float *x = (float *)malloc(sizeof(float) * rows * A), *y = (float *)malloc(sizeof(float) * rows * A);
    float *z = (float *)malloc(sizeof(float) * rows * A);
    for (int i = 0; i < rows * A; i++) x[i] = (float)((double)(rnd() >> 11) / 9007199254740992.0 * 8.0 - 4.0);
    act_normalize_action(m, x, y, rows);
    act_denormalize_action(m, y, z, rows);
    double worst_f = 0, worst_rt = 0;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < A; j++) {
            double lo = m->action_lo->data[j], hi = m->action_hi->data[j], v = x[r * A + j], want;
            if (c->norm_type == ACT_NORM_MIN_MAX) want = 2 * (v - lo) / fmax(hi - lo, c->norm_eps) - 1;
            else want = (v - lo) / fmax(hi, c->norm_eps);
            worst_f = fmax(worst_f, fabs(y[r * A + j] - want) / (fabs(want) + 1));
            worst_rt = fmax(worst_rt, fabs(z[r * A + j] - v) / (fabs(v) + 1));
        }
    CHECK(worst_f <= 1e-5, "%s: normalize_action vs double formula: %.3g", m->w->path, worst_f);
    CHECK(worst_rt <= 1e-5, "%s: denormalize(normalize(x)) - x: %.3g", m->w->path, worst_rt);
    free(x);
    free(y);
    free(z);
}

static void test_good(const char *stem) {
    char path[512], err[ACT_ERR_LEN];
    snprintf(path, sizeof path, "%s/%s.actw", data_dir(), stem);
    act_model *m = NULL;
    int rc = act_model_load(path, &m, err, sizeof err);
    CHECK(rc == 0 && m, "load %s: %s", path, err);
    if (rc) return;
    check_expect(m, stem);
    check_structure(m);
    check_norm_random(m);
    act_model_free(m);
}

/* ---- failures ---- */

static void meta_fail(const bytes *good, const char *key, const char *value, const char *w1, const char *w2) {
    parts p = split(good);
    meta_set(&p, key, value);
    char what[160];
    snprintf(what, sizeof what, "metadata %s=%s", key, value ? value : "(removed)");
    expect_fail(assemble(&p), 1, what, w1, w2, NULL);
    parts_free(&p);
}

static void test_metadata(const bytes *good) {
    static const char *required[] = {"format", "arch", "obs_dim", "action_dim", "pred_horizon", "obs_horizon",
                                     "num_action_steps", "camera_names", "image_height", "image_width",
                                     "vision.input_height", "vision.input_width", "head.hidden_dim", "head.nheads",
                                     "head.enc_layers", "head.dec_layers", "head.dim_feedforward", "head.latent_dim"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        meta_fail(good, required[i], NULL, required[i], "missing");
    meta_fail(good, "format", "gguf", "format", "gguf");
    meta_fail(good, "arch", "detr", "arch", "detr");
    meta_fail(good, "obs_dim", "abc", "obs_dim", "not an integer");
    meta_fail(good, "obs_dim", "5x", "obs_dim", "not an integer");
    meta_fail(good, "obs_dim", "", "obs_dim", "not an integer");
    meta_fail(good, "obs_dim", "99999999999999999999", "obs_dim", "not an integer");
    meta_fail(good, "obs_dim", " 5", "obs_dim", "not an integer");
    meta_fail(good, "obs_dim", "0", "obs_dim", "out of range");
    meta_fail(good, "head.enc_layers", "17", "head.enc_layers", "out of range");
    meta_fail(good, "head.nheads", "3", "head.nheads", "divisible");
    meta_fail(good, "num_action_steps", "7", "num_action_steps", "out of range");
    meta_fail(good, "head.activation", "swish", "head.activation", "swish");
    meta_fail(good, "norm.type", "zscore", "norm.type", "zscore");
    meta_fail(good, "vision.norm", "layernorm", "vision.norm", "layernorm");
    meta_fail(good, "head.layer_norm_eps", "nan", "head.layer_norm_eps", "finite");
    meta_fail(good, "norm.eps", "-1", "norm.eps", "out of range");
    meta_fail(good, "camera_names", "l_vis,,front", "camera_names", "1..");
    meta_fail(good, "camera_names", "l_vis,r_vis,l_vis", "camera_names", "twice");
    meta_fail(good, "camera_names", "a,b,c,d,e,f,g,h,i", "camera_names", "more than 8");
    meta_fail(good, "camera_names", "a very long camera name of forty characters", "camera_names", "1..");
    meta_fail(good, "vision.crop_height", "32", "crop", "both or neither");
    meta_fail(good, "vision.feature_height", "3", "vision.feature_height", "disagree");
    meta_fail(good, "vision.input_height", "8", "vision.feature_height", "8x64 input");
    /* provenance is shown whole or the file refused: never cut short in silence */
    char sha[100];
    memset(sha, 'f', 80);
    sha[80] = '\0';
    meta_fail(good, "source_sha256", sha, "source_sha256", "64 hex digits");
    meta_fail(good, "source_sha256", "0123456789abcdefg123456789abcdef0123456789abcdef0123456789abcdef", "source_sha256",
              "64 hex digits");
    char ver[200];
    memset(ver, 'v', 130);
    ver[130] = '\0';
    meta_fail(good, "converter_version", ver, "converter_version", "130 characters");
}

static void test_tensor_set(const bytes *good) {
    char what[160], name[65], msg[160];
    /* missing: any one record */
    parts p = split(good);
    int i = (int)rnd_below((size_t)p.n);
    memcpy(name, rec(&p, i), 64);
    name[64] = 0;
    rec_remove(&p, i);
    snprintf(what, sizeof what, "tensor %s removed", name);
    snprintf(msg, sizeof msg, "tensor '%s' is missing", name);
    expect_fail(assemble(&p), 1, what, msg, NULL);
    parts_free(&p);

    /* unknown: an extra record over extra (random, finite) data */
    static const char *extras[] = {"head.extra.w", "vision.1.conv1.w", "head.dec.9.ff1.w"};
    for (int k = 0; k < 3; k++) {
        p = split(good);
        p.dir = (unsigned char *)realloc(p.dir, (size_t)(p.n + 1) * 128);
        unsigned char *r = rec(&p, p.n);
        memset(r, 0, 128);
        strcpy((char *)r, extras[k]);
        rec_put32(r, R_NDIM, 1);
        rec_put64(r, R_DIMS, 16);
        rec_put64(r, R_OFFSET, p.data_size);
        rec_put64(r, R_NBYTES, 64);
        p.n++;
        p.stored = (unsigned char *)realloc(p.stored, p.stored_n + 64);
        for (int e = 0; e < 16; e++) {
            float v = (float)(rnd() % 1000) / 1000.0f - 0.5f;
            memcpy(p.stored + p.stored_n + 4 * e, &v, 4);
        }
        p.stored_n += 64;
        p.data_size += 64;
        snprintf(what, sizeof what, "extra tensor %s", extras[k]);
        snprintf(msg, sizeof msg, "unknown tensor '%s'", extras[k]);
        expect_fail(assemble(&p), 1, what, msg, NULL);
        parts_free(&p);
    }

    /* misshapen: a random non-square 2-D tensor transposed, a bias given a leading 1 */
    p = split(good);
    do i = (int)rnd_below((size_t)p.n);
    while (rec32(rec(&p, i), R_NDIM) != 2 || rec64(rec(&p, i), R_DIMS) == rec64(rec(&p, i), R_DIMS + 8));
    uint64_t a = rec64(rec(&p, i), R_DIMS), b = rec64(rec(&p, i), R_DIMS + 8);
    rec_put64(rec(&p, i), R_DIMS, b);
    rec_put64(rec(&p, i), R_DIMS + 8, a);
    memcpy(name, rec(&p, i), 64);
    snprintf(msg, sizeof msg, "tensor '%s' has shape [%llu,%llu], expected [%llu,%llu]", name, (unsigned long long)b,
             (unsigned long long)a, (unsigned long long)a, (unsigned long long)b);
    snprintf(what, sizeof what, "%s transposed", name);
    expect_fail(assemble(&p), 1, what, msg, NULL);
    parts_free(&p);

    p = split(good);
    i = rec_find(&p, "head.action_head.b");
    CHECK(i >= 0, "head.action_head.b not in the file");
    if (i >= 0) {
        uint64_t d = rec64(rec(&p, i), R_DIMS);
        rec_put32(rec(&p, i), R_NDIM, 2);
        rec_put64(rec(&p, i), R_DIMS, 1);
        rec_put64(rec(&p, i), R_DIMS + 8, d);
        snprintf(msg, sizeof msg, "tensor 'head.action_head.b' has shape [1,%llu], expected [%llu]",
                 (unsigned long long)d, (unsigned long long)d);
        expect_fail(assemble(&p), 1, "bias with a leading 1", msg, NULL);
    }
    parts_free(&p);

    /* config and shapes disagree: the message names the first tensor that no longer fits */
    char v[64], buf[64];
    p = split(good);
    int F = atoi(meta_value(&p, "head.dim_feedforward", v, sizeof v));
    int E = atoi(meta_value(&p, "head.hidden_dim", v, sizeof v));
    snprintf(buf, sizeof buf, "%d", 2 * F);
    meta_set(&p, "head.dim_feedforward", buf);
    snprintf(msg, sizeof msg, "tensor 'head.enc.0.ff1.w' has shape [%d,%d], expected [%d,%d]", F, E, 2 * F, E);
    expect_fail(assemble(&p), 1, "dim_feedforward doubled", msg, NULL);
    parts_free(&p);

    p = split(good);
    int O = atoi(meta_value(&p, "obs_dim", v, sizeof v));
    snprintf(buf, sizeof buf, "%d", O + 1);
    meta_set(&p, "obs_dim", buf);
    snprintf(msg, sizeof msg, "tensor 'head.enc_qpos.w' has shape [%d,%d], expected [%d,%d]", E, O, E, O + 1);
    expect_fail(assemble(&p), 1, "obs_dim + 1", msg, NULL);
    parts_free(&p);

    p = split(good);
    meta_set(&p, "vision.separate_trunks", "1");
    expect_fail(assemble(&p), 1, "separate_trunks on a shared-trunk file", "tensor 'vision.1.conv1.w' is missing", NULL);
    parts_free(&p);

    p = split(good);
    meta_set(&p, "vision.norm", "groupnorm");
    expect_fail(assemble(&p), 1, "groupnorm on a batchnorm file", "tensor 'vision.0.conv1.gn.w' is missing", NULL);
    parts_free(&p);

    p = split(good);
    meta_set(&p, "norm.type", "mean_std");
    expect_fail(assemble(&p), 1, "mean_std on a min_max file", "tensor 'norm.qpos.mean' is missing", NULL);
    parts_free(&p);

    p = split(good);
    meta_set(&p, "vision.num_keypoints", "7");
    expect_fail(assemble(&p), 1, "num_keypoints off by one", "tensor 'vision.0.keypoints.w' has shape", NULL);
    parts_free(&p);
}

/* Random bytes in the metadata and directory, checksum made to match: whatever the parsers
 * meet, act_model_load returns a model or -1 with a message naming the file. The failure this
 * can find is a crash or an ASan/UBSan report, which aborts the test. */
static void test_fuzz_structure(const bytes *good) {
    size_t end = get64(good, H_DATA_OFF);
    scratch s;
    CHECK(scratch_open(&s, good) == 0, "cannot write a scratch copy");
    bytes b = bytes_dup(*good);
    int failed = 0, loaded = 0;
    for (int it = 0; it < 30; it++) {
        memcpy(b.p, good->p, end);
        int k = 1 + (int)rnd_below(4);
        for (int j = 0; j < k; j++) b.p[128 + rnd_below(end - 128)] = (unsigned char)rnd();
        /* the checksum covers the untouched data as well: hash the edited prefix, then the rest */
        uint64_t h = act_fnv1a64(b.p + 128, end - 128, ACT_FNV_INIT);
        put64(&b, H_CHECKSUM, act_fnv1a64(good->p + end, good->n - end, h));
        CHECK(pwrite_at(s.path, 0, b.p, end) == 0, "cannot patch %s", s.path);
        char err[ACT_ERR_LEN] = "";
        act_model *m = NULL;
        int rc = act_model_load(s.path, &m, err, sizeof err);
        CHECK((rc == 0 && m) || (rc == -1 && !m && strstr(err, s.path)), "fuzz %d: rc %d, message \"%s\"", it, rc, err);
        failed += rc == -1;
        loaded += rc == 0;
        act_model_free(m);
    }
    CHECK(pwrite_at(s.path, 0, good->p, end) == 0, "cannot restore %s", s.path);
    printf("test_model: structure fuzz: %d refused, %d loaded\n", failed, loaded);
    free(b.p);
    scratch_close(&s);
}

#ifdef ACT_WITH_ZSTD
/* ---- zstd bombs: a directory the config contradicts is refused before the data is inflated ---- */

/* The metadata and directory of a file, read without its data (so this process stays small:
 * the memory of the loads below is measured). stored is left empty. */
static parts front_parts(const char *path) {
    parts p;
    memset(&p, 0, sizeof p);
    unsigned char hb[128];
    bytes h = {hb, sizeof hb};
    FILE *f = fopen(path, "rb");
    int ok = f && fread(hb, 1, sizeof hb, f) == sizeof hb;
    size_t ms = ok ? get64(&h, H_META_SIZE) : 0;
    p.n = ok ? (int)get64(&h, H_NT) : 0;
    p.data_size = ok ? get64(&h, H_DATA_SIZE) : 0;
    p.compression = ACTW_ZSTD;
    p.meta = (char *)calloc(ms + 1, 1);
    p.dir = (unsigned char *)malloc((size_t)p.n * 128 + 1);
    p.stored = (unsigned char *)malloc(1);
    ok = ok && fread(p.meta, 1, ms, f) == ms && fread(p.dir, 1, (size_t)p.n * 128, f) == (size_t)p.n * 128;
    if (f) fclose(f);
    if (!ok) {
        fprintf(stderr, "cannot read the front of %s\n", path);
        exit(1);
    }
    return p;
}

/* Makes p's data one zstd frame of `n` bytes, streamed (the frame does not state its content
 * size, so a reader has only data_size to go by): `noise` bytes of random finite floats in
 * [1, 2) first (they barely compress, so the frame stays under the reader's 64:1 limit), then
 * zeros (128 KiB RLE blocks, ~4 bytes each). */
static void zero_frame(parts *p, uint64_t n, uint64_t noise) {
    ZSTD_CCtx *c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 1);
    const size_t chunk = (size_t)1 << 20, oc = ZSTD_CStreamOutSize();
    unsigned char *zero = (unsigned char *)calloc(chunk, 1), *out = (unsigned char *)malloc(oc);
    uint32_t seed = 12345;
    free(p->stored);
    p->stored = NULL;
    p->stored_n = 0;
    size_t cap = 0;
    for (uint64_t left = n;;) {
        size_t take = left < chunk ? (size_t)left : chunk;
        uint64_t done = n - left;   /* the chunk's bytes: noise while done < noise, else zeros */
        for (size_t k = 0; k + 4 <= take; k += 4) {
            uint32_t bits = 0;
            if (done + k < noise) {
                seed = seed * 1664525u + 1013904223u;
                bits = 0x3F800000u | (seed >> 9);
            }
            memcpy(zero + k, &bits, 4);
        }
        ZSTD_EndDirective mode = take == left ? ZSTD_e_end : ZSTD_e_continue;
        ZSTD_inBuffer in = {zero, take, 0};
        size_t r;
        do {
            ZSTD_outBuffer ob = {out, oc, 0};
            r = ZSTD_compressStream2(c, &ob, &in, mode);
            if (ZSTD_isError(r)) {
                fprintf(stderr, "test setup: zstd: %s\n", ZSTD_getErrorName(r));
                exit(1);
            }
            if (p->stored_n + ob.pos > cap) {
                cap = (p->stored_n + ob.pos) * 2;
                p->stored = (unsigned char *)realloc(p->stored, cap);
            }
            memcpy(p->stored + p->stored_n, out, ob.pos);
            p->stored_n += ob.pos;
        } while (mode == ZSTD_e_end ? r != 0 : in.pos < in.size);
        left -= take;
        if (mode == ZSTD_e_end) break;
    }
    free(zero);
    free(out);
    ZSTD_freeCCtx(c);
}

/* act_model_load in a forked child (a loader that does allocate the claim must not take this
 * test down with it): its result, message and peak-RSS growth over the load (getrusage). */
typedef struct child_load { int rc, ok; long grow_kb; char err[ACT_ERR_LEN]; } child_load;

static child_load load_in_child(const char *path) {
    child_load r;
    memset(&r, 0, sizeof r);
    int fds[2];
    if (pipe(fds) != 0) return r;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        struct rusage a, b;
        getrusage(RUSAGE_SELF, &a);
        act_model *m = NULL;
        r.rc = act_model_load(path, &m, r.err, sizeof r.err);
        getrusage(RUSAGE_SELF, &b);
        r.grow_kb = b.ru_maxrss - a.ru_maxrss;  /* KB on Linux */
        r.ok = 1;
        act_model_free(m);
        ssize_t w = write(fds[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fds[1]);
    size_t got = 0;
    while (pid > 0 && got < sizeof r) {
        ssize_t k = read(fds[0], (char *)&r + got, sizeof r - got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fds[0]);
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0);
    if (got != sizeof r) {
        memset(&r, 0, sizeof r);
        snprintf(r.err, sizeof r.err, "the loading child %s %d", pid <= 0 ? "could not start:" :
                 WIFSIGNALED(st) ? "died of signal" : "exited with status", pid <= 0 ? 0 :
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    }
    return r;
}

/* Growth of the peak RSS a refused bomb may cost: the file itself is kilobytes; the claims are
 * 256 MiB, which the old loader inflated (and held, twice over while its buffer grew). */
#define BOMB_BYTES ((uint64_t)64 << 20)
#define BOMB_NOISE ((uint64_t)4 << 20)   /* random bytes first: the frame inflates < 64:1 */
#define BOMB_MAX_GROW_KB (32L << 10)

static void test_bombs(const char *good_path) {
    char path[512], msg[256];
    /* 1. the reviewer's D2: a directory of one tensor, vision.0.conv1.w, of 2^24 floats where
     * the config wants [64,3,7,7]: refused by its shape, before the frame is inflated */
    parts p = front_parts(good_path);
    const uint64_t numel = BOMB_BYTES / 4;
    p.n = 1;
    memset(p.dir, 0, 128);
    strcpy((char *)p.dir, "vision.0.conv1.w");
    rec_put32(p.dir, R_NDIM, 1);
    rec_put64(p.dir, R_DIMS, numel);
    rec_put64(p.dir, R_OFFSET, 0);
    rec_put64(p.dir, R_NBYTES, BOMB_BYTES);
    p.data_size = BOMB_BYTES;
    zero_frame(&p, BOMB_BYTES, BOMB_NOISE);
    bytes b = assemble(&p);
    tmp_path(path, sizeof path);
    CHECK(write_bytes(path, &b) == 0, "cannot write %s", path);
    child_load r = load_in_child(path);
    snprintf(msg, sizeof msg, "tensor 'vision.0.conv1.w' has shape [%llu], expected [64,3,7,7]",
             (unsigned long long)numel);
    CHECK(r.ok && r.rc == -1 && strstr(r.err, path) && strstr(r.err, msg), "shape bomb: rc %d, message \"%s\"", r.rc,
          r.err);
    CHECK(r.ok && r.grow_kb < BOMB_MAX_GROW_KB, "shape bomb: a %zu-byte file declaring %llu bytes grew the peak RSS "
          "by %ld KB (limit %ld KB): its data was allocated before its directory was checked", b.n,
          (unsigned long long)BOMB_BYTES, r.grow_kb, BOMB_MAX_GROW_KB);
    printf("test_model: shape bomb (%zu-byte file, %llu bytes declared): peak RSS +%ld KB, \"%s\"\n", b.n,
           (unsigned long long)BOMB_BYTES, r.grow_kb, r.err);
    remove(path);
    free(b.p);
    parts_free(&p);

    /* 2. every tensor with its right name and shape, but the last one moved 64 MiB further
     * (the reader refuses data past the last tensor, not gaps): refused by the data_size the
     * config implies, before inflating. The control is the same file without the gap. */
    for (int gap = 0; gap < 2; gap++) {
        p = front_parts(good_path);
        int last = 0;
        for (int i = 1; i < p.n; i++)
            if (rec64(rec(&p, i), R_OFFSET) > rec64(rec(&p, last), R_OFFSET)) last = i;
        if (gap) {
            rec_put64(rec(&p, last), R_OFFSET, rec64(rec(&p, last), R_OFFSET) + BOMB_BYTES);
            p.data_size += BOMB_BYTES;
        }
        zero_frame(&p, p.data_size, BOMB_NOISE);  /* finite: without the gap this is a valid model */
        b = assemble(&p);
        tmp_path(path, sizeof path);
        CHECK(write_bytes(path, &b) == 0, "cannot write %s", path);
        r = load_in_child(path);
        if (gap) {
            CHECK(r.ok && r.rc == -1 && strstr(r.err, path) && strstr(r.err, "data_size") &&
                  strstr(r.err, "no tensor reads"), "gap bomb: rc %d, message \"%s\"", r.rc, r.err);
            CHECK(r.ok && r.grow_kb < BOMB_MAX_GROW_KB, "gap bomb: a %zu-byte file with a %llu-byte gap grew the peak "
                  "RSS by %ld KB (limit %ld KB)", b.n, (unsigned long long)BOMB_BYTES, r.grow_kb, BOMB_MAX_GROW_KB);
            printf("test_model: gap bomb (%zu-byte file, %llu bytes declared): peak RSS +%ld KB, \"%s\"\n", b.n,
                   (unsigned long long)p.data_size, r.grow_kb, r.err);
        } else {
            CHECK(r.ok && r.rc == 0, "packed zstd model (the gap bomb's control): rc %d, \"%s\"", r.rc, r.err);
        }
        remove(path);
        free(b.p);
        parts_free(&p);
    }

    /* 3. a model its config describes, every byte zero: a frame of a few KB inflating 1000:1
     * (a config with a huge hidden size would make it gigabytes): refused by the ratio */
    p = front_parts(good_path);
    zero_frame(&p, p.data_size, 0);
    b = assemble(&p);
    tmp_path(path, sizeof path);
    CHECK(write_bytes(path, &b) == 0, "cannot write %s", path);
    r = load_in_child(path);
    CHECK(r.ok && r.rc == -1 && strstr(r.err, path) && strstr(r.err, "more than 64:1"), "ratio bomb: rc %d, \"%s\"",
          r.rc, r.err);
    CHECK(r.ok && r.grow_kb < BOMB_MAX_GROW_KB, "ratio bomb: peak RSS +%ld KB", r.grow_kb);
    remove(path);
    free(b.p);
    parts_free(&p);
}
#endif

int main(void) {
    seed_rng("test_model");
    char path[512];
#ifdef ACT_WITH_ZSTD
    /* first, while this process is small: the bombs measure the peak RSS of a forked load */
    snprintf(path, sizeof path, "%s/small.actw", data_dir());
    test_bombs(path);
#endif
    test_good("small");
    test_good("small_sep_gn");
    bytes good = need_file("small.actw", path, sizeof path);
    test_metadata(&good);
    test_tensor_set(&good);
    test_fuzz_structure(&good);
    free(good.p);
    printf("test_model: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
