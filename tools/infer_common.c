/* infer_common.c - shared plumbing of the act-infer subcommands (see infer_common.h). */
#include "infer_common.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int infer_usage(const char *cmd, const char *usage, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "act-infer %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n\n%s", usage);
    return INFER_EXIT_USAGE;
}

int infer_opt(int argc, char **argv, int *i, const char *name, const char **val) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) return -1;
    *val = argv[++*i];
    return 1;
}

int infer_parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int infer_parse_device(const char *s, act_device *out) {
    if (!strcmp(s, "cpu")) *out = ACT_DEVICE_CPU;
    else if (!strcmp(s, "cuda")) *out = ACT_DEVICE_CUDA;
    else return -1;
    return 0;
}

int infer_parse_precision(const char *s, act_precision *out) {
    if (!strcmp(s, "fp32")) *out = ACT_FP32;
    else if (!strcmp(s, "tf32")) *out = ACT_TF32;
    else if (!strcmp(s, "bf16")) *out = ACT_BF16;
    else if (!strcmp(s, "fp16")) *out = ACT_FP16;
    else return -1;
    return 0;
}

const char *infer_device_name(act_device d) { return d == ACT_DEVICE_CUDA ? "cuda" : "cpu"; }

const char *infer_precision_name(act_precision p) {
    switch (p) {
    case ACT_TF32: return "tf32";
    case ACT_BF16: return "bf16";
    case ACT_FP16: return "fp16";
    default: return "fp32";
    }
}

int infer_check_run_opts(const char *cmd, const char *usage, const infer_run_opts *o) {
    act_device d;
    act_precision p;
    if (o->device && infer_parse_device(o->device, &d) != 0)
        return infer_usage(cmd, usage, "--device must be cpu or cuda, got '%s'", o->device);
    if (o->precision && infer_parse_precision(o->precision, &p) != 0)
        return infer_usage(cmd, usage, "--precision must be fp32, tf32, bf16 or fp16, got '%s'", o->precision);
    if (o->pad && strcmp(o->pad, "auto") && strcmp(o->pad, "on") && strcmp(o->pad, "off") && strcmp(o->pad, "few"))
        return infer_usage(cmd, usage, "--pad-batches must be auto, few, on or off, got '%s'", o->pad);
    return 0;
}

int infer_open(const char *cmd, const char *model_path, const infer_run_opts *o, infer_ctx *ctx) {
    char err[ACT_ERR_LEN];
    memset(ctx, 0, sizeof *ctx);
    if (o->device) {
        if (infer_parse_device(o->device, &ctx->device) != 0) {
            fprintf(stderr, "act-infer %s: --device must be cpu or cuda, got '%s'\n", cmd, o->device);
            return INFER_EXIT_USAGE;
        }
    } else {
        char why[256] = "";
        ctx->device = act_cuda_available(why, sizeof why) ? ACT_DEVICE_CUDA : ACT_DEVICE_CPU;
        if (ctx->device == ACT_DEVICE_CUDA)
            fprintf(stderr, "act-infer %s: using device cuda (a GPU is available; --device cpu to override)\n", cmd);
        else
            fprintf(stderr, "act-infer %s: using device cpu (no CUDA: %s)\n", cmd, why[0] ? why : "unavailable");
    }
    ctx->precision = ACT_FP32;
    if (o->precision && infer_parse_precision(o->precision, &ctx->precision) != 0) {
        fprintf(stderr, "act-infer %s: --precision must be fp32, tf32, bf16 or fp16, got '%s'\n", cmd, o->precision);
        return INFER_EXIT_USAGE;
    }
    ctx->batch = o->batch > 0 ? o->batch : (ctx->device == ACT_DEVICE_CUDA ? 128 : 4);
    if (!o->pad || !strcmp(o->pad, "auto"))
        ctx->pad = ctx->device == ACT_DEVICE_CUDA ? INFER_PAD_FEW : INFER_PAD_OFF;
    else
        ctx->pad = !strcmp(o->pad, "on") ? INFER_PAD_ON : !strcmp(o->pad, "few") ? INFER_PAD_FEW : INFER_PAD_OFF;
    if (!(ctx->ran = calloc((size_t)ctx->batch + 1, 1))) {
        fprintf(stderr, "act-infer %s: out of memory\n", cmd);
        return INFER_EXIT_FAIL;
    }
    if (act_model_load(model_path, &ctx->model, err, sizeof err) != 0) {
        fprintf(stderr, "act-infer %s: %s\n", cmd, err);
        return INFER_EXIT_FAIL;
    }
    ctx->cfg = act_model_config(ctx->model);
    act_session_opts so = act_session_default_opts();
    so.device = ctx->device;
    so.precision = ctx->precision;
    so.max_batch = ctx->batch;
    if (act_session_create(ctx->model, &so, &ctx->session, err, sizeof err) != 0) {
        fprintf(stderr, "act-infer %s: %s\n", cmd, err);
        act_model_free(ctx->model);
        ctx->model = NULL;
        free(ctx->ran);
        ctx->ran = NULL;
        return INFER_EXIT_FAIL;
    }
    return INFER_EXIT_OK;
}

void infer_close(infer_ctx *ctx) {
    free(ctx->ran);
    act_session_free(ctx->session);
    act_model_free(ctx->model);
    memset(ctx, 0, sizeof *ctx);
}

int infer_buffers_alloc(const infer_ctx *ctx, infer_buffers *b) {
    const act_config *c = ctx->cfg;
    size_t chunk = (size_t)ctx->batch * c->pred_horizon * c->action_dim;
    size_t lat = (size_t)ctx->batch * c->latent_dim;
    b->actions = malloc(sizeof(float) * chunk);
    b->post_actions = malloc(sizeof(float) * chunk);
    b->post_actions_norm = malloc(sizeof(float) * chunk);
    b->mu = malloc(sizeof(float) * lat);
    b->logvar = malloc(sizeof(float) * lat);
    b->kl = malloc(sizeof(float) * (size_t)ctx->batch);
    if (b->actions && b->post_actions && b->post_actions_norm && b->mu && b->logvar && b->kl) return 0;
    infer_buffers_free(b);
    return -1;
}

void infer_buffers_free(infer_buffers *b) {
    free(b->actions);
    free(b->post_actions);
    free(b->post_actions_norm);
    free(b->mu);
    free(b->logvar);
    free(b->kl);
    memset(b, 0, sizeof *b);
}

/* The rows b runs with under ctx->pad (infer_common.h: INFER_PAD_*). */
static int batch_rows(const infer_ctx *ctx, const act_ep_batch *b) {
    int n = b->n;
    if (n <= 0 || n >= ctx->batch || ctx->pad == INFER_PAD_OFF) return n;
    if (ctx->pad == INFER_PAD_ON) return ctx->batch;
    if (ctx->ran[n] || ctx->n_ran < INFER_PAD_SIZES) return n;
    while (n < ctx->batch && !ctx->ran[n]) n++;
    return n;
}

int infer_run_batch(infer_ctx *ctx, const act_ep_batch *b, int posterior, infer_buffers *out, int *rows,
                    char *err, size_t errlen) {
    act_inputs in;
    memset(&in, 0, sizeof in);
    in.batch = batch_rows(ctx, b);
    if (rows) *rows = in.batch;
    in.qpos = b->qpos;
    for (int c = 0; c < ctx->cfg->num_cams; c++) in.images[c] = b->images[c];
    act_outputs o;
    memset(&o, 0, sizeof o);
    o.actions = out->actions;
    if (posterior) {
        in.actions = b->targets;
        in.action_is_pad = b->is_pad;
        in.sample_latent = 0;
        o.post_actions = out->post_actions;
        o.post_actions_norm = out->post_actions_norm;
        o.mu = out->mu;
        o.logvar = out->logvar;
        o.kl = out->kl;
    }
    int rc = act_run(ctx->session, &in, &o, err, errlen);
    if (!rc && in.batch > 0 && in.batch <= ctx->batch && ctx->ran[in.batch] < 255)
        ctx->n_ran += !ctx->ran[in.batch]++;
    if (rc) return rc;
    /* a chunk of NaN is no prediction: scored, it turned every overall metric into null with exit 0.
     * Row by row, so the error names the timestep */
    char why[ACT_ERR_LEN];
    for (int r = 0; r < b->n; r++)
        if (act_outputs_check(ctx->session, &o, r, 1, why, sizeof why)) {
            snprintf(err, errlen, "timestep %d: %s", b->t0 + r, why);
            return -1;
        }
    return 0;
}

int infer_output_writable(const char *cmd, const char *flag, const char *path) {
    char dir[1024];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "act-infer %s: %s %s is a directory: name a file in it\n", cmd, flag, path);
        return -1;
    }
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {   /* /dev/stdout, a FIFO: written directly */
        if (access(path, W_OK) == 0) return 0;
        fprintf(stderr, "act-infer %s: %s %s: %s\n", cmd, flag, path, strerror(errno));
        return -1;
    }
    if (access(act_path_dir(path, dir, sizeof dir), W_OK) == 0) return 0;
    fprintf(stderr, "act-infer %s: %s %s: cannot write into %s: %s\n", cmd, flag, path, dir, strerror(errno));
    return -1;
}
