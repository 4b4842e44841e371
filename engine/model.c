/* model.c - binds a validated .actw file to the act_resnet structure (engine/model.h).
 * defines: act_model_load, act_model_free, act_model_config, act_normalize_qpos,
 *          act_normalize_action, act_denormalize_action
 *
 * Design: the metadata is parsed into act_config with a range for every number, then every
 * canonical tensor of weights/FORMAT.md is looked up by name with the shape the config implies.
 * A `used` mark per directory record makes the tensor set exact: a missing name fails at its
 * lookup, and any record left unmarked afterwards is an unknown tensor. So a file the forward
 * pass accepts is one whose every byte has a place in this description.
 *
 * All of this runs on the directory alone (act_weights_open_index), before the tensor data is
 * inflated and scanned (act_weights_load_data): what the config implies bounds the memory a file
 * can make the loader allocate, whatever its header and directory declare.
 */
#include "act.h"
#include "model.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct binder {
    act_weights *w;
    unsigned char *used;   /* one mark per directory record */
    char *err;
    size_t errlen;
} binder;

/* ---- metadata ---- */

static int meta_int(const act_weights *w, const char *key, int required, int def, int lo, int hi, int *out,
                    char *err, size_t errlen) {
    const char *v = act_meta_get(w, key);
    if (!v) {
        if (required) return act_errf(err, errlen, "%s: metadata key '%s' is missing (required)", w->path, key);
        *out = def;
        return 0;
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if ((*v != '-' && (*v < '0' || *v > '9')) || end == v || *end || errno) /* strtol skips spaces, takes '+' */
        return act_errf(err, errlen, "%s: metadata '%s=%s' is not an integer", w->path, key, v);
    if (x < lo || x > hi)
        return act_errf(err, errlen, "%s: metadata '%s=%ld' is out of range [%d, %d]", w->path, key, x, lo, hi);
    *out = (int)x;
    return 0;
}

static int meta_float(const act_weights *w, const char *key, float def, double lo, double hi, float *out,
                      char *err, size_t errlen) {
    const char *v = act_meta_get(w, key);
    if (!v) {
        *out = def;
        return 0;
    }
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    /* a decimal number as the converter writes it: strtod also skips spaces and reads hex */
    int decimal = (*v == '-' || *v == '.' || (*v >= '0' && *v <= '9')) && !strpbrk(v, "xX");
    if (!decimal || end == v || *end || errno || !isfinite(x))
        return act_errf(err, errlen, "%s: metadata '%s=%s' is not a finite number", w->path, key, v);
    if (x < lo || x > hi)
        return act_errf(err, errlen, "%s: metadata '%s=%s' is out of range [%g, %g]", w->path, key, v, lo, hi);
    *out = (float)x;
    return 0;
}

/* Picks one of the words in `choices` (NULL-terminated); returns its index in *out. */
static int meta_enum(const act_weights *w, const char *key, int required, int def, const char *const *choices,
                     int *out, char *err, size_t errlen) {
    const char *v = act_meta_get(w, key);
    if (!v) {
        if (required) return act_errf(err, errlen, "%s: metadata key '%s' is missing (required)", w->path, key);
        *out = def;
        return 0;
    }
    for (int i = 0; choices[i]; i++)
        if (strcmp(v, choices[i]) == 0) {
            *out = i;
            return 0;
        }
    return act_errf(err, errlen, "%s: metadata '%s=%s' is not one of the known values (%s%s%s)", w->path, key, v,
                    choices[0], choices[1] ? ", " : "", choices[1] ? choices[1] : "");
}

static int parse_cameras(const act_weights *w, act_config *c, char *err, size_t errlen) {
    const char *v = act_meta_get(w, "camera_names");
    if (!v) return act_errf(err, errlen, "%s: metadata key 'camera_names' is missing (required)", w->path);
    c->num_cams = 0;
    const char *p = v;
    for (;;) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= ACT_NAME_LEN)
            return act_errf(err, errlen, "%s: metadata 'camera_names=%s': each name must be 1..%d characters",
                            w->path, v, ACT_NAME_LEN - 1);
        if (c->num_cams == ACT_MAX_CAMS)
            return act_errf(err, errlen, "%s: metadata 'camera_names=%s': more than %d cameras", w->path, v,
                            ACT_MAX_CAMS);
        char *dst = c->camera_names[c->num_cams];
        memcpy(dst, p, len);
        dst[len] = 0;
        for (size_t i = 0; i < len; i++)
            if (dst[i] < 0x21 || dst[i] > 0x7e)
                return act_errf(err, errlen, "%s: metadata 'camera_names': name '%s' has a non-printable or space "
                                "character", w->path, dst);
        for (int j = 0; j < c->num_cams; j++)
            if (strcmp(c->camera_names[j], dst) == 0)
                return act_errf(err, errlen, "%s: metadata 'camera_names': '%s' appears twice", w->path, dst);
        c->num_cams++;
        if (!p[len]) break;
        p += len + 1;
    }
    return 0;
}

/* Output size of a conv/pool along one axis. */
static int conv_out(int n, int k, int s, int pad) { return (n + 2 * pad - k) / s + 1; }

static int parse_config(const act_weights *w, act_config *c, char *err, size_t errlen) {
    static const char *const formats[] = {"actw", NULL}, *const archs[] = {"act_resnet", NULL};
    static const char *const vnorms[] = {"batchnorm", "groupnorm", NULL};
    static const char *const acts[] = {"relu", "gelu", NULL};
    static const char *const ntypes[] = {"min_max", "mean_std", NULL};
    int fmt, arch, v = 0;
    const int big = 1 << 20;
    memset(c, 0, sizeof *c);
    if (meta_enum(w, "format", 1, 0, formats, &fmt, err, errlen) ||
        meta_enum(w, "arch", 1, 0, archs, &arch, err, errlen) ||
        meta_int(w, "obs_dim", 1, 0, 1, 4096, &c->obs_dim, err, errlen) ||
        meta_int(w, "action_dim", 1, 0, 1, 4096, &c->action_dim, err, errlen) ||
        meta_int(w, "pred_horizon", 1, 0, 1, 4096, &c->pred_horizon, err, errlen) ||
        meta_int(w, "obs_horizon", 1, 0, 1, c->pred_horizon, &c->obs_horizon, err, errlen) ||
        meta_int(w, "num_action_steps", 1, 0, 1, c->pred_horizon - c->obs_horizon + 1, &c->num_action_steps,
                 err, errlen) ||
        parse_cameras(w, c, err, errlen) ||
        meta_int(w, "image_height", 1, 0, 1, 16384, &c->image_h, err, errlen) ||
        meta_int(w, "image_width", 1, 0, 1, 16384, &c->image_w, err, errlen) ||
        meta_int(w, "vision.input_height", 1, 0, 1, 4096, &c->input_h, err, errlen) ||
        meta_int(w, "vision.input_width", 1, 0, 1, 4096, &c->input_w, err, errlen) ||
        meta_int(w, "vision.crop_height", 0, 0, 0, c->input_h, &c->crop_h, err, errlen) ||
        meta_int(w, "vision.crop_width", 0, 0, 0, c->input_w, &c->crop_w, err, errlen) ||
        meta_int(w, "vision.imagenet_norm", 0, 0, 0, 1, &c->imagenet_norm, err, errlen) ||
        meta_enum(w, "vision.norm", 0, ACT_VISION_BATCHNORM, vnorms, &v, err, errlen))
        return -1;
    c->vision_norm = (act_vision_norm)v;
    if ((c->crop_h == 0) != (c->crop_w == 0))
        return act_errf(err, errlen, "%s: metadata vision.crop_height=%d and vision.crop_width=%d: both or neither "
                        "must be 0", w->path, c->crop_h, c->crop_w);
    if (meta_int(w, "vision.separate_trunks", 0, 0, 0, 1, &c->separate_trunks, err, errlen) ||
        meta_int(w, "vision.num_keypoints", 0, 32, 1, 4096, &c->num_keypoints, err, errlen) ||
        meta_int(w, "vision.output_dim", 0, 64, 1, big, &c->vision_dim, err, errlen) ||
        meta_int(w, "head.hidden_dim", 1, 0, 1, big, &c->hidden_dim, err, errlen) ||
        meta_int(w, "head.nheads", 1, 0, 1, 1024, &c->nheads, err, errlen) ||
        meta_int(w, "head.enc_layers", 1, 0, 1, ACT_MAX_LAYERS, &c->enc_layers, err, errlen) ||
        meta_int(w, "head.dec_layers", 1, 0, 1, ACT_MAX_LAYERS, &c->dec_layers, err, errlen) ||
        meta_int(w, "head.dim_feedforward", 1, 0, 1, big, &c->ff_dim, err, errlen) ||
        meta_int(w, "head.latent_dim", 1, 0, 1, big, &c->latent_dim, err, errlen) ||
        meta_enum(w, "head.activation", 0, ACT_ACT_GELU, acts, &v, err, errlen))
        return -1;
    c->activation = (act_activation)v;
    if (c->hidden_dim % c->nheads != 0)
        return act_errf(err, errlen, "%s: metadata head.hidden_dim=%d is not divisible by head.nheads=%d", w->path,
                        c->hidden_dim, c->nheads);
    if (meta_float(w, "head.kl_weight", 10.0f, 0.0, 1e30, &c->kl_weight, err, errlen) ||
        meta_float(w, "head.layer_norm_eps", 1e-5f, 1e-30, 1.0, &c->ln_eps, err, errlen) ||
        meta_enum(w, "norm.type", 0, ACT_NORM_MIN_MAX, ntypes, &v, err, errlen))
        return -1;
    c->norm_type = (act_norm_type)v;
    if (meta_float(w, "norm.eps", 1e-8f, 1e-30, 1.0, &c->norm_eps, err, errlen)) return -1;

    /* the trunk's output map follows from its input: conv1 7/2/3, maxpool 3/2/1, then three
     * stride-2 stages (3x3, pad 1); each maps n >= 1 to n' >= 1 */
    int h = c->crop_h ? c->crop_h : c->input_h, wd = c->crop_w ? c->crop_w : c->input_w;
    int fh = h, fw = wd;
    fh = conv_out(conv_out(fh, 7, 2, 3), 3, 2, 1);
    fw = conv_out(conv_out(fw, 7, 2, 3), 3, 2, 1);
    for (int s = 0; s < 3; s++) {
        fh = conv_out(fh, 3, 2, 1);
        fw = conv_out(fw, 3, 2, 1);
    }
    if (meta_int(w, "vision.feature_height", 0, fh, 1, 4096, &c->feat_h, err, errlen) ||
        meta_int(w, "vision.feature_width", 0, fw, 1, 4096, &c->feat_w, err, errlen))
        return -1;
    if (c->feat_h != fh || c->feat_w != fw)
        return act_errf(err, errlen, "%s: metadata vision.feature_height/width %dx%d disagree with the %dx%d map "
                        "ResNet18 makes of a %dx%d input", w->path, c->feat_h, c->feat_w, fh, fw, h, wd);
    /* provenance, shown by info and kept whole: a value that does not fit, or a digest that is
     * not one, is a damaged or foreign file's, not something to cut short in silence */
    const char *s = act_meta_get(w, "converter_version");
    if (s && strlen(s) >= sizeof c->converter_version)
        return act_errf(err, errlen, "%s: metadata converter_version is %zu characters, more than the %zu a "
                        "converter writes", w->path, strlen(s), sizeof c->converter_version - 1);
    snprintf(c->converter_version, sizeof c->converter_version, "%s", s ? s : "");
    s = act_meta_get(w, "source_sha256");
    if (s && (strlen(s) != 64 || strspn(s, "0123456789abcdefABCDEF") != 64))
        return act_errf(err, errlen, "%s: metadata source_sha256 '%.80s' is not a SHA-256 (64 hex digits)", w->path, s);
    snprintf(c->source_sha256, sizeof c->source_sha256, "%s", s ? s : "");
    snprintf(c->model_hash, sizeof c->model_hash, "%016llx", (unsigned long long)w->checksum);
    return 0;
}

/* ---- tensors ---- */

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *dims) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)dims[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Looks up `name` (printf-formatted), checks its shape (ndim dims follow), marks it used. */
static const act_tensor *bind(binder *b, int ndim, const int64_t *dims, const char *fmt, ...) ACT_PRINTF(4, 5);
static const act_tensor *bind(binder *b, int ndim, const int64_t *dims, const char *fmt, ...) {
    char name[ACTW_NAME_MAX * 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const act_tensor *t = act_weights_find(b->w, name);
    if (!t) {
        act_errf(b->err, b->errlen, "%s: tensor '%s' is missing", b->w->path, name);
        return NULL;
    }
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->dims[i] == dims[i];
    if (!ok) {
        char have[96], want[96];
        fmt_shape(have, sizeof have, t->ndim, t->dims);
        fmt_shape(want, sizeof want, ndim, dims);
        act_errf(b->err, b->errlen, "%s: tensor '%s' has shape %s, expected %s", b->w->path, name, have, want);
        return NULL;
    }
    b->used[t->index] = 1;
    return t;
}

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#define NDIMS(...) ((int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define SHAPE(...) NDIMS(__VA_ARGS__), DIMS(__VA_ARGS__)

/* A linear layer "<prefix>.w" [out][in] / "<prefix>.b" [out]. */
static int bind_linear(binder *b, act_linear *l, const char *prefix, int out, int in) {
    if (!(l->w = bind(b, SHAPE(out, in), "%s.w", prefix))) return -1;
    if (!(l->b = bind(b, SHAPE(out), "%s.b", prefix))) return -1;
    l->row0 = 0;
    l->out = out;
    l->in = in;
    return 0;
}

static act_linear rows_of(const act_linear *packed, int row0, int out) {
    act_linear v = *packed;
    v.row0 = row0;
    v.out = out;
    return v;
}

static int bind_mha(binder *b, act_mha *m, const char *prefix, int E) {
    char n[ACTW_NAME_MAX * 2];
    snprintf(n, sizeof n, "%s.in", prefix);
    if (bind_linear(b, &m->qkv, n, 3 * E, E)) return -1;
    m->q = rows_of(&m->qkv, 0, E);
    m->k = rows_of(&m->qkv, E, E);
    m->v = rows_of(&m->qkv, 2 * E, E);
    m->kv = rows_of(&m->qkv, E, 2 * E);
    snprintf(n, sizeof n, "%s.out", prefix);
    return bind_linear(b, &m->out, n, E, E);
}

static int bind_ln(binder *b, act_ln *l, const char *prefix, int E) {
    if (!(l->w = bind(b, SHAPE(E), "%s.w", prefix))) return -1;
    return (l->b = bind(b, SHAPE(E), "%s.b", prefix)) ? 0 : -1;
}

static int bind_conv(binder *b, act_conv *c, const char *prefix, int cin, int cout, int k, int stride, int pad,
                     int groupnorm) {
    if (!(c->w = bind(b, SHAPE(cout, cin, k, k), "%s.w", prefix))) return -1;
    if (!(c->b = bind(b, SHAPE(cout), "%s.b", prefix))) return -1;
    c->gn_w = c->gn_b = NULL;
    if (groupnorm) {
        if (!(c->gn_w = bind(b, SHAPE(cout), "%s.gn.w", prefix))) return -1;
        if (!(c->gn_b = bind(b, SHAPE(cout), "%s.gn.b", prefix))) return -1;
    }
    c->cin = cin;
    c->cout = cout;
    c->k = k;
    c->stride = stride;
    c->pad = pad;
    return 0;
}

static int bind_trunk(binder *b, act_trunk *t, int T, const act_config *c) {
    static const int width[4] = {64, 128, 256, 512};
    int gn = c->vision_norm == ACT_VISION_GROUPNORM;
    char n[ACTW_NAME_MAX * 2];
    snprintf(n, sizeof n, "vision.%d.conv1", T);
    if (bind_conv(b, &t->conv1, n, 3, 64, 7, 2, 3, gn)) return -1;
    int cin = 64;
    for (int L = 0; L < 4; L++) {
        for (int I = 0; I < 2; I++) {
            act_block *blk = &t->blocks[L][I];
            int C = width[L], stride = (L >= 1 && I == 0) ? 2 : 1;
            snprintf(n, sizeof n, "vision.%d.layer%d.%d.conv1", T, L + 1, I);
            if (bind_conv(b, &blk->conv1, n, I == 0 ? cin : C, C, 3, stride, 1, gn)) return -1;
            snprintf(n, sizeof n, "vision.%d.layer%d.%d.conv2", T, L + 1, I);
            if (bind_conv(b, &blk->conv2, n, C, C, 3, 1, 1, gn)) return -1;
            blk->has_down = L >= 1 && I == 0;
            if (blk->has_down) {
                snprintf(n, sizeof n, "vision.%d.layer%d.%d.down", T, L + 1, I);
                if (bind_conv(b, &blk->down, n, cin, C, 1, 2, 0, gn)) return -1;
            } else {
                memset(&blk->down, 0, sizeof blk->down);
            }
        }
        cin = width[L];
    }
    int K = c->num_keypoints;
    if (!(t->kp_w = bind(b, SHAPE(K, 512, 1, 1), "vision.%d.keypoints.w", T))) return -1;
    if (!(t->kp_b = bind(b, SHAPE(K), "vision.%d.keypoints.b", T))) return -1;
    if (!(t->pos_grid = bind(b, SHAPE((int64_t)c->feat_h * c->feat_w, 2), "vision.%d.pos_grid", T))) return -1;
    if (!(t->out_w = bind(b, SHAPE(c->vision_dim, 2 * K), "vision.%d.out.w", T))) return -1;
    return (t->out_b = bind(b, SHAPE(c->vision_dim), "vision.%d.out.b", T)) ? 0 : -1;
}

static int bind_head(binder *b, act_model *m) {
    const act_config *c = &m->cfg;
    int E = c->hidden_dim, F = c->ff_dim, L = c->latent_dim;
    char n[ACTW_NAME_MAX * 2];
    if (!(m->cls_embed = bind(b, SHAPE(E), "head.cls_embed"))) return -1;
    if (bind_linear(b, &m->enc_qpos, "head.enc_qpos", E, c->obs_dim) ||
        bind_linear(b, &m->enc_action, "head.enc_action", E, c->action_dim))
        return -1;
    for (int i = 0; i < c->enc_layers; i++) {
        act_enc_layer *e = &m->enc[i];
        snprintf(n, sizeof n, "head.enc.%d.attn", i);
        if (bind_mha(b, &e->attn, n, E)) return -1;
        snprintf(n, sizeof n, "head.enc.%d.ln1", i);
        if (bind_ln(b, &e->ln1, n, E)) return -1;
        snprintf(n, sizeof n, "head.enc.%d.ln2", i);
        if (bind_ln(b, &e->ln2, n, E)) return -1;
        snprintf(n, sizeof n, "head.enc.%d.ff1", i);
        if (bind_linear(b, &e->ff1, n, F, E)) return -1;
        snprintf(n, sizeof n, "head.enc.%d.ff2", i);
        if (bind_linear(b, &e->ff2, n, E, F)) return -1;
    }
    if (bind_linear(b, &m->latent_proj, "head.latent_proj", 2 * L, E) ||
        bind_linear(b, &m->latent_out, "head.latent_out", E, L) ||
        bind_linear(b, &m->dec_qpos, "head.dec_qpos", E, c->obs_dim) ||
        bind_linear(b, &m->visual_proj, "head.visual_proj", E, c->vision_dim))
        return -1;
    if (!(m->mem_type = bind(b, SHAPE(3, E), "head.mem_type"))) return -1;
    if (!(m->query = bind(b, SHAPE(c->pred_horizon, E), "head.query"))) return -1;
    for (int i = 0; i < c->dec_layers; i++) {
        act_dec_layer *d = &m->dec[i];
        snprintf(n, sizeof n, "head.dec.%d.self_attn", i);
        if (bind_mha(b, &d->self_attn, n, E)) return -1;
        snprintf(n, sizeof n, "head.dec.%d.cross_attn", i);
        if (bind_mha(b, &d->cross_attn, n, E)) return -1;
        for (int k = 0; k < 3; k++) {
            act_ln *ln = k == 0 ? &d->ln1 : k == 1 ? &d->ln2 : &d->ln3;
            snprintf(n, sizeof n, "head.dec.%d.ln%d", i, k + 1);
            if (bind_ln(b, ln, n, E)) return -1;
        }
        snprintf(n, sizeof n, "head.dec.%d.ff1", i);
        if (bind_linear(b, &d->ff1, n, F, E)) return -1;
        snprintf(n, sizeof n, "head.dec.%d.ff2", i);
        if (bind_linear(b, &d->ff2, n, E, F)) return -1;
    }
    if (bind_linear(b, &m->action_head, "head.action_head", c->action_dim, E)) return -1;
    const char *lo = c->norm_type == ACT_NORM_MIN_MAX ? "min" : "mean";
    const char *hi = c->norm_type == ACT_NORM_MIN_MAX ? "max" : "std";
    if (!(m->qpos_lo = bind(b, SHAPE(c->obs_dim), "norm.qpos.%s", lo))) return -1;
    if (!(m->qpos_hi = bind(b, SHAPE(c->obs_dim), "norm.qpos.%s", hi))) return -1;
    if (!(m->action_lo = bind(b, SHAPE(c->action_dim), "norm.action.%s", lo))) return -1;
    return (m->action_hi = bind(b, SHAPE(c->action_dim), "norm.action.%s", hi)) ? 0 : -1;
}

/* A file whose tensors do not fit its metadata, written by a tool that left keys out: the keys
 * that shape the tensors and were left to their defaults are named, since the fault is more
 * likely a missing key (vision.norm, norm.type, ...) than the tensor the binder stopped at. */
static void name_defaulted_keys(const act_model *m, char *err, size_t errlen) {
    const act_config *c = &m->cfg;
    char keys[512] = "", one[96];
    const struct { const char *key; const char *word; int num; } opt[] = {   /* word, else num */
        {"vision.norm", c->vision_norm == ACT_VISION_GROUPNORM ? "groupnorm" : "batchnorm", 0},
        {"vision.separate_trunks", NULL, c->separate_trunks},
        {"vision.num_keypoints", NULL, c->num_keypoints}, {"vision.output_dim", NULL, c->vision_dim},
        {"vision.feature_height", NULL, c->feat_h}, {"vision.feature_width", NULL, c->feat_w},
        {"norm.type", c->norm_type == ACT_NORM_MIN_MAX ? "min_max" : "mean_std", 0}};
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++) {
        if (act_meta_get(m->w, opt[i].key)) continue;
        if (opt[i].word) snprintf(one, sizeof one, "%s%s=%s", keys[0] ? ", " : "", opt[i].key, opt[i].word);
        else snprintf(one, sizeof one, "%s%s=%d", keys[0] ? ", " : "", opt[i].key, opt[i].num);
        strncat(keys, one, sizeof keys - strlen(keys) - 1);
    }
    size_t n = strlen(err);
    if (keys[0] && n + 1 < errlen)
        snprintf(err + n, errlen - n, "; the metadata leaves %s to their defaults (weights/FORMAT.md): a file whose "
                 "tensors are made otherwise must say so", keys);
}

static int bind_all(act_model *m, char *err, size_t errlen) {
    binder b = {m->w, NULL, err, errlen};
    b.used = (unsigned char *)act_array_alloc((size_t)m->w->n_tensors, 1);
    if (!b.used) return act_errf(err, errlen, "%s: out of memory", m->w->path);
    int rc = 0;
    m->n_trunks = m->cfg.separate_trunks ? m->cfg.num_cams : 1;
    for (int t = 0; t < m->n_trunks && !rc; t++) rc = bind_trunk(&b, &m->trunks[t], t, &m->cfg);
    if (!rc) rc = bind_head(&b, m);
    for (int i = 0; i < m->w->n_tensors && !rc; i++)
        if (!b.used[i])
            rc = act_errf(err, errlen, "%s: unknown tensor '%s' (not used by an act_resnet model with this config)",
                          m->w->path, m->w->tensors[i].name);
    free(b.used);
    if (rc) name_defaulted_keys(m, err, errlen);
    if (!rc)
        for (int i = 0; i < m->w->n_tensors; i++) m->cfg.n_params += m->w->tensors[i].numel;
    return rc;
}

/* Once every tensor is bound, the data the model needs is known: the converter packs the tensors,
 * each padded to 64 bytes. The reader refuses data past the last tensor, but not gaps between
 * tensors; a bound file whose data_size exceeds this sum spreads its tensors over data nothing
 * reads (a frame of zeros could make that gigabytes), so it is refused before inflating. */
static int check_data_size(const act_model *m, char *err, size_t errlen) {
    uint64_t need = 0;
    for (int i = 0; i < m->w->n_tensors; i++)
        need += ((uint64_t)m->w->tensors[i].numel * 4 + ACTW_ALIGN - 1) / ACTW_ALIGN * ACTW_ALIGN;
    if (m->w->data_size > need)
        return act_errf(err, errlen, "%s: data_size is %llu bytes, but the model's tensors take %llu (each padded to "
                        "%u): the file claims data no tensor reads", m->w->path, (unsigned long long)m->w->data_size,
                        (unsigned long long)need, ACTW_ALIGN);
    return 0;
}

/* ---- public ---- */

int act_model_load(const char *path, act_model **out, char *err, size_t errlen) {
    *out = NULL;
    act_model *m = (act_model *)calloc(1, sizeof *m);
    if (!m) return act_errf(err, errlen, "%s: out of memory", path);
    /* the directory is checked against the config before the data is paid for: a zstd file
     * whose directory declares a gigabyte tensor is refused by its shape, not after inflating */
    if (act_weights_open_index(path, &m->w, err, errlen) || parse_config(m->w, &m->cfg, err, errlen) ||
        bind_all(m, err, errlen) || check_data_size(m, err, errlen) || act_weights_load_data(m->w, err, errlen)) {
        act_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void act_model_free(act_model *m) {
    if (!m) return;
    act_weights_free(m->w);
    free(m);
}

const act_config *act_model_config(const act_model *m) { return &m->cfg; }

/* The formulas of weights/FORMAT.md, in the same operation order as the PyTorch module
 * (2*(x-lo) / clamp(hi-lo, eps) - 1 and its inverse), so results agree with it bit for bit
 * (barring FMA contraction under ACT_NATIVE). */
static void normalize(const act_model *m, const act_tensor *lo, const act_tensor *hi, int n, const float *x,
                      float *y, int rows) {
    const float eps = m->cfg.norm_eps;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) {
            float a = lo->data[j], b = hi->data[j], v = x[(size_t)r * n + j];
            if (m->cfg.norm_type == ACT_NORM_MIN_MAX) {
                float d = fmaxf(b - a, eps);
                y[(size_t)r * n + j] = 2.0f * (v - a) / d - 1.0f;
            } else {
                y[(size_t)r * n + j] = (v - a) / fmaxf(b, eps);
            }
        }
}

void act_normalize_qpos(const act_model *m, const float *x, float *y, int rows) {
    normalize(m, m->qpos_lo, m->qpos_hi, m->cfg.obs_dim, x, y, rows);
}

void act_normalize_action(const act_model *m, const float *x, float *y, int rows) {
    normalize(m, m->action_lo, m->action_hi, m->cfg.action_dim, x, y, rows);
}

void act_denormalize_action(const act_model *m, const float *x, float *y, int rows) {
    const int n = m->cfg.action_dim;
    const float eps = m->cfg.norm_eps;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) {
            float a = m->action_lo->data[j], b = m->action_hi->data[j], v = x[(size_t)r * n + j];
            if (m->cfg.norm_type == ACT_NORM_MIN_MAX)
                y[(size_t)r * n + j] = (v + 1.0f) / 2.0f * fmaxf(b - a, eps) + a;
            else
                y[(size_t)r * n + j] = v * fmaxf(b, eps) + a;
        }
}
