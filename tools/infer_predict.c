/* infer_predict.c - `act-infer predict`: the prior chunk (z = 0) for every timestep of one
 * episode, as float32 .npy (T, pred_horizon, action_dim), batched over timesteps. With
 * --posterior-dir it also encodes the recorded actions (targets action[t-o+1 : t-o+1+H], o the
 * obs_horizon, steps outside the episode padded and is_pad = 1; episode_stream.c) and writes the
 * CVAE outputs with z = mu - the same act_run
 * computes both, which is how the parity tests compare the whole model against PyTorch. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "episode_stream.h"
#include "infer_common.h"
#include "npy.h"

static const char *USAGE =
    "usage: act-infer predict --model M.actw --episode EP.hdf5 --out PRED.npy [options]\n"
    "  --model M.actw            weight file\n"
    "  --episode EP.hdf5         episode: action (T,A), observations/qpos (T,obs),\n"
    "                            observations/images/<cam> (T,H,W,3) uint8 for the model's cameras\n"
    "  --out PRED.npy            prior chunks (z = 0), float32 (T, pred_horizon, action_dim)\n"
    "  --device cpu|cuda         default: cuda when a GPU is usable, else cpu\n"
    "  --precision P             fp32 (default), tf32, bf16, fp16 (CUDA; the CPU backend is fp32 only)\n"
    "  --batch N                 timesteps per forward (default: cuda 128, cpu 4)\n"
    INFER_PAD_USAGE
    "  --posterior-dir DIR       also write DIR/mu.npy (T,L), logvar.npy (T,L), kl.npy (T,),\n"
    "                            post_actions.npy (T,H,A): the posterior with z = mu, encoding\n"
    "                            action[t-o+1 : t-o+1+H] (o = the model's obs_horizon, 1 by default),\n"
    "                            steps outside the episode padded with its nearest action, is_pad\n";

enum { OUT_PRIOR, OUT_MU, OUT_LOGVAR, OUT_KL, OUT_POST, OUT_N };
static const char *const POST_NAMES[] = {"mu.npy", "logvar.npy", "kl.npy", "post_actions.npy"};

/* path with its folder resolved (links, "..", "."): "/real/dir/name"; "" when the folder does
 * not exist (then it is no existing file's name) */
static void canonical(const char *path, char *buf, size_t len) {
    char dir[PATH_MAX], real[PATH_MAX];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    buf[0] = '\0';
    if (realpath(dir, real)) snprintf(buf, len, "%s/%s", real, base);
}

/* --out naming one of the --posterior-dir files: both would be written through one temporary
 * file, and the set left half moved and mixed */
static int out_in_posterior_dir(const char *out, const char *pdir) {
    char a[2 * PATH_MAX + 2], b[2 * PATH_MAX + 2], p[PATH_MAX];
    canonical(out, a, sizeof a);
    for (int k = 0; a[0] && k < (int)(sizeof POST_NAMES / sizeof POST_NAMES[0]); k++) {
        snprintf(p, sizeof p, "%s/%s", pdir, POST_NAMES[k]);
        canonical(p, b, sizeof b);
        if (!strcmp(a, b)) {
            fprintf(stderr, "act-infer predict: --out %s is the --posterior-dir's %s: give the prior "
                            "chunks another name\n", out, POST_NAMES[k]);
            return 1;
        }
    }
    return 0;
}

static int open_outputs(const char *out, const char *pdir, const act_config *c, int T, act_npy **f,
                        char *err, size_t errlen) {
    int64_t chunk[3] = {T, c->pred_horizon, c->action_dim}, lat[2] = {T, c->latent_dim}, vec[1] = {T};
    if (act_npy_open(out, chunk, 3, &f[OUT_PRIOR], err, errlen) != 0) return -1;
    if (!pdir) return 0;
    char p[1100];
    snprintf(p, sizeof p, "%s/%s", pdir, POST_NAMES[OUT_MU - 1]);
    if (act_npy_open(p, lat, 2, &f[OUT_MU], err, errlen) != 0) return -1;
    snprintf(p, sizeof p, "%s/%s", pdir, POST_NAMES[OUT_LOGVAR - 1]);
    if (act_npy_open(p, lat, 2, &f[OUT_LOGVAR], err, errlen) != 0) return -1;
    snprintf(p, sizeof p, "%s/%s", pdir, POST_NAMES[OUT_KL - 1]);
    if (act_npy_open(p, vec, 1, &f[OUT_KL], err, errlen) != 0) return -1;
    snprintf(p, sizeof p, "%s/%s", pdir, POST_NAMES[OUT_POST - 1]);
    return act_npy_open(p, chunk, 3, &f[OUT_POST], err, errlen);
}

static int write_batch(act_npy **f, const act_config *c, int n, const infer_buffers *o, char *err, size_t errlen) {
    size_t chunk = (size_t)n * c->pred_horizon * c->action_dim, lat = (size_t)n * c->latent_dim;
    if (act_npy_write(f[OUT_PRIOR], o->actions, chunk, err, errlen) != 0) return -1;
    if (!f[OUT_MU]) return 0;
    if (act_npy_write(f[OUT_MU], o->mu, lat, err, errlen) != 0 ||
        act_npy_write(f[OUT_LOGVAR], o->logvar, lat, err, errlen) != 0 ||
        act_npy_write(f[OUT_KL], o->kl, (size_t)n, err, errlen) != 0 ||
        act_npy_write(f[OUT_POST], o->post_actions, chunk, err, errlen) != 0)
        return -1;
    return 0;
}

int act_cmd_predict(int argc, char **argv) {
    const char *model = NULL, *episode = NULL, *out = NULL, *pdir = NULL, *batch = NULL, *val;
    infer_run_opts ro = {0};
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(USAGE, stdout); return 0; }
        const char *names[] = {"--model", "--episode", "--out", "--posterior-dir", "--device", "--precision", "--batch",
                               "--pad-batches"};
        const char **slots[] = {&model, &episode, &out, &pdir, &ro.device, &ro.precision, &batch, &ro.pad};
        int matched = 0;
        for (int k = 0; k < (int)(sizeof names / sizeof names[0]) && !matched; k++) {
            int r = infer_opt(argc, argv, &i, names[k], &val);
            if (r < 0) return infer_usage("predict", USAGE, "%s needs a value", names[k]);
            if (r > 0) { *slots[k] = val; matched = 1; }
        }
        if (!matched) return infer_usage("predict", USAGE, "unknown argument '%s'", argv[i]);
    }
    if (!model) return infer_usage("predict", USAGE, "--model is required");
    if (!episode) return infer_usage("predict", USAGE, "--episode is required");
    if (!out) return infer_usage("predict", USAGE, "--out is required");
    if (batch && infer_parse_int(batch, 1, 1 << 16, &ro.batch) != 0)
        return infer_usage("predict", USAGE, "--batch must be an integer in 1..65536, got '%s'", batch);
    int urc = infer_check_run_opts("predict", USAGE, &ro);
    if (urc != 0) return urc;
    int made_pdir = 0;   /* this run made --posterior-dir: removed again if the run fails (while empty) */
    if (pdir && mkdir(pdir, 0777) == 0) made_pdir = 1;
    else if (pdir && errno != EEXIST) {
        fprintf(stderr, "act-infer predict: %s: cannot create directory: %s\n", pdir, strerror(errno));
        return INFER_EXIT_FAIL;
    }
    if (pdir && out_in_posterior_dir(out, pdir)) {
        if (made_pdir) rmdir(pdir);
        return INFER_EXIT_USAGE;
    }

    infer_ctx ctx;
    int rc = infer_open("predict", model, &ro, &ctx);
    if (rc != 0) {
        if (made_pdir) rmdir(pdir);
        return rc;
    }
    char err[ACT_ERR_LEN] = "";
    infer_buffers bufs = {0};
    act_npy *files[OUT_N] = {0};
    act_stream *st = NULL;
    char *paths[1] = {(char *)episode};
    rc = INFER_EXIT_FAIL;
    if (infer_buffers_alloc(&ctx, &bufs) != 0) {
        snprintf(err, sizeof err, "out of memory for batch %d", ctx.batch);
        goto done;
    }
    if (act_stream_open(paths, 1, ctx.cfg, ctx.batch, &st, err, sizeof err) != 0) goto done;
    const act_ep_batch *b;
    int steps = 0, T = 0, last_rows = 0;
    while ((b = act_stream_next(st)) != NULL) {
        if (b->failed) {
            snprintf(err, sizeof err, "%s", b->err);
            goto done;
        }
        if (b->first && open_outputs(out, pdir, ctx.cfg, b->T, files, err, sizeof err) != 0) goto done;
        if (infer_run_batch(&ctx, b, pdir != NULL, &bufs, &last_rows, err, sizeof err) != 0 ||
            write_batch(files, ctx.cfg, b->n, &bufs, err, sizeof err) != 0)
            goto done;
        steps++;
        T = b->T;
    }
    if (steps > 1 && last_rows != ctx.batch)
        fprintf(stderr, "act-infer predict: %d timesteps in %d steps of %d rows, the last of %d\n", T, steps,
                ctx.batch, last_rows);
    else if (steps)
        fprintf(stderr, "act-infer predict: %d timesteps in %d step%s of %d rows%s\n", T, steps, steps > 1 ? "s" : "",
                last_rows, steps * last_rows > T ? " (the last padded: --pad-batches)" : "");
    /* every file complete before any replaces its PATH: the set is written whole or not at all */
    for (int k = 0; k < OUT_N; k++)
        if (files[k] && act_npy_finish(files[k], err, sizeof err) != 0) goto done;
    rc = INFER_EXIT_OK;
    for (int k = 0; k < OUT_N && rc == INFER_EXIT_OK; k++) {   /* a failed rename: the rest abandoned */
        if (files[k] && act_npy_close(files[k], 0, err, sizeof err) != 0) rc = INFER_EXIT_FAIL;
        files[k] = NULL;
    }
done:
    for (int k = 0; k < OUT_N; k++) act_npy_close(files[k], 1, NULL, 0);
    if (rc != INFER_EXIT_OK) fprintf(stderr, "act-infer predict: %s\n", err);
    act_stream_close(st);
    infer_buffers_free(&bufs);
    infer_close(&ctx);
    if (rc != INFER_EXIT_OK && made_pdir) rmdir(pdir);   /* only if empty: no file is lost */
    return rc;
}
