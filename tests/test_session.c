/* test_session.c - act_session_create / act_run on the CPU backend: what the step promises
 * beyond matching PyTorch (test_parity.py covers that).
 *
 *  - bad input gets a clear error, never a crash: batch out of range, missing qpos or frames,
 *    non-finite qpos or actions, posterior outputs without recorded actions, bad options;
 *  - samples of a batch are independent: a batch of 3 equals three batches of 1;
 *  - the prior and the posterior share one decoder pass without mixing: each alone equals the
 *    joint run;
 *  - the key-padding mask really masks: garbage in padded action steps leaves mu unchanged,
 *    and unmasking them changes it;
 *  - kl is the closed form of mu/logvar; actions is the denormalized actions_norm;
 *  - sampling is seeded: the same seed gives the same chunk, another seed another chunk;
 *  - profiling fills the stage times;
 *  - inputs written into the session's own buffers need no copy and give the same chunk.
 * Models: $ACT_TEST_DATA/small.actw and small_sep_gn.actw (tests/make_testdata.py). Inputs are
 * fresh random values (seed printed, ACT_TEST_SEED replays). Tolerance 1e-5 relative where the
 * batch size changes the GEMM shapes, exact where the same step runs twice. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "act.h"
#include "forward.h"
#include "test_common.h"




static double rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
}

typedef struct batch {
    int B;
    float *qpos, *actions;
    uint8_t *frames[ACT_MAX_CAMS], *pad;
} batch;

static batch make_batch(const act_config *c, int B) {
    batch b;
    memset(&b, 0, sizeof b);
    b.B = B;
    size_t fsz = (size_t)c->image_h * c->image_w * 3;
    b.qpos = malloc(sizeof(float) * B * c->obs_dim);
    for (int i = 0; i < B * c->obs_dim; i++) b.qpos[i] = urand(-2, 2);
    b.actions = malloc(sizeof(float) * B * c->pred_horizon * c->action_dim);
    for (int i = 0; i < B * c->pred_horizon * c->action_dim; i++) b.actions[i] = urand(-2, 2);
    b.pad = calloc((size_t)B * c->pred_horizon, 1);
    for (int cam = 0; cam < c->num_cams; cam++) {
        b.frames[cam] = malloc(B * fsz);
        for (size_t i = 0; i < B * fsz; i++) b.frames[cam][i] = (uint8_t)(rnd() & 255);
    }
    return b;
}

static void free_batch(batch *b) {
    free(b->qpos), free(b->actions), free(b->pad);
    for (int c = 0; c < ACT_MAX_CAMS; c++) free(b->frames[c]);
}

/* sample `i` of b as a batch of 1 (views, not copies) */
static act_inputs inputs_of(const act_config *c, const batch *b, int i, int n) {
    act_inputs in;
    memset(&in, 0, sizeof in);
    in.batch = n;
    in.qpos = b->qpos + (size_t)i * c->obs_dim;
    for (int cam = 0; cam < c->num_cams; cam++)
        in.images[cam] = b->frames[cam] + (size_t)i * c->image_h * c->image_w * 3;
    in.actions = b->actions + (size_t)i * c->pred_horizon * c->action_dim;
    in.action_is_pad = b->pad + (size_t)i * c->pred_horizon;
    return in;
}

typedef struct outs { float *a, *an, *pa, *pan, *mu, *lv, *kl; } outs;

static outs make_outs(const act_config *c, int B) {
    size_t ch = (size_t)B * c->pred_horizon * c->action_dim, l = (size_t)B * c->latent_dim;
    outs o = {malloc(ch * 4), malloc(ch * 4), malloc(ch * 4), malloc(ch * 4), malloc(l * 4),
              malloc(l * 4), malloc((size_t)B * 4)};
    return o;
}
static void free_outs(outs *o) { free(o->a), free(o->an), free(o->pa), free(o->pan), free(o->mu), free(o->lv), free(o->kl); }
static act_outputs all_of(outs *o) {
    act_outputs r = {o->a, o->an, o->pa, o->pan, o->mu, o->lv, o->kl};
    return r;
}

static void expect_error(act_session *s, const act_inputs *in, act_outputs *out, const char *needle, const char *what) {
    char err[ACT_ERR_LEN] = "";
    int rc = act_run(s, in, out, err, sizeof err);
    CHECK(rc == -1 && strstr(err, needle), "%s: rc %d, error '%s' (expected one naming '%s')", what, rc, err, needle);
}

static void test_validation(act_session *s, const act_config *c, batch *b, int max_batch) {
    outs o = make_outs(c, max_batch);
    act_outputs out = all_of(&o);
    act_inputs in = inputs_of(c, b, 0, 1);
    in.batch = 0;
    expect_error(s, &in, &out, "batch 0", "batch 0");
    in.batch = max_batch + 1;
    expect_error(s, &in, &out, "max_batch", "batch over max");
    in = inputs_of(c, b, 0, 1);
    in.qpos = NULL;
    expect_error(s, &in, &out, "qpos", "NULL qpos");
    in = inputs_of(c, b, 0, 1);
    in.images[c->num_cams - 1] = NULL;
    expect_error(s, &in, &out, c->camera_names[c->num_cams - 1], "missing camera");
    in = inputs_of(c, b, 0, 1);
    float saved = b->qpos[1];
    b->qpos[1] = NAN;
    expect_error(s, &in, &out, "qpos[0][1]", "NaN qpos");
    b->qpos[1] = saved;
    saved = b->actions[c->action_dim + 2];
    b->actions[c->action_dim + 2] = INFINITY;
    expect_error(s, &in, &out, "actions[0][1][2]", "Inf action");
    b->actions[c->action_dim + 2] = saved;
    in.actions = NULL;
    expect_error(s, &in, &out, "inputs.actions", "posterior outputs without actions");
    act_outputs none;
    memset(&none, 0, sizeof none);
    expect_error(s, &in, &none, "no output", "nothing requested");
    free_outs(&o);
}

static void test_options(const act_model *m) {
    char err[ACT_ERR_LEN] = "";
    act_session *s = NULL;
    act_session_opts o = act_session_default_opts();
    o.max_batch = 0;
    CHECK(act_session_create(m, &o, &s, err, sizeof err) == -1 && strstr(err, "max_batch") && !s,
          "max_batch 0 accepted: '%s'", err);
    o = act_session_default_opts();
    o.precision = ACT_BF16;
    CHECK(act_session_create(m, &o, &s, err, sizeof err) == -1 && strstr(err, "bf16") && !s,
          "bf16 on the CPU accepted: '%s'", err);
    o = act_session_default_opts();
    o.device = (act_device)7;
    CHECK(act_session_create(m, &o, &s, err, sizeof err) == -1 && strstr(err, "device") && !s,
          "device 7 accepted: '%s'", err);
    o = act_session_default_opts();
    o.copy_threads = 65;
    CHECK(act_session_create(m, &o, &s, err, sizeof err) == -1 && strstr(err, "copy_threads 65") && !s,
          "copy_threads 65 accepted: '%s'", err);
    /* a failed graph capture's retry schedule (forward.c, read at every session) */
    static const char *bad[] = {"x", "-1", "12z", "2000000000", " 5"};
    o = act_session_default_opts();
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("ACT_CUDA_GRAPH_RETRY", bad[i], 1);
        err[0] = 0;
        s = NULL;
        int rc = act_session_create(m, &o, &s, err, sizeof err);
        CHECK(rc == -1 && strstr(err, "ACT_CUDA_GRAPH_RETRY=") && strstr(err, "step count") && !s,
              "ACT_CUDA_GRAPH_RETRY='%s' accepted: '%s'", bad[i], err);
        if (!rc) act_session_free(s);
    }
    setenv("ACT_CUDA_GRAPH_RETRY", "0", 1);
    CHECK(act_session_create(m, &o, &s, err, sizeof err) == 0, "ACT_CUDA_GRAPH_RETRY=0 refused: %s", err);
    if (s) act_session_free(s);
    unsetenv("ACT_CUDA_GRAPH_RETRY");
    CHECK(act_fwd_retry_wait(1, 100) == 100 && act_fwd_retry_wait(2, 100) == 1000 &&
          act_fwd_retry_wait(3, 100) == 10000 && act_fwd_retry_wait(4, 100) == -1 &&
          act_fwd_retry_wait(1, 0) == -1 && act_fwd_retry_wait(0, 100) == -1 &&
          (sizeof(long) < 8 || act_fwd_retry_wait(3, 1000000000L) == (long)(100000000000LL)),
          "graph retry schedule: %ld %ld %ld %ld", act_fwd_retry_wait(1, 100), act_fwd_retry_wait(2, 100),
          act_fwd_retry_wait(3, 100), act_fwd_retry_wait(4, 100));
}


static void run_ok(act_session *s, const act_inputs *in, act_outputs *out, const char *what) {
    char err[ACT_ERR_LEN] = "";
    int rc = act_run(s, in, out, err, sizeof err);
    CHECK(rc == 0, "%s: %s", what, err);
}

/* Inputs written into the session's own buffers (act_session_input_buffers) give exactly the
 * joint run's answer and stay as written; a window inside them (sample 2 alone) gives sample 2's. */
static void test_input_buffers(act_session *s, const act_config *c, const batch *b, const outs *full) {
    act_input_buffers ib;
    act_session_input_buffers(s, &ib);
    int B = b->B, H = c->pred_horizon;
    size_t fsz = (size_t)c->image_h * c->image_w * 3, CH = (size_t)H * c->action_dim, L = c->latent_dim;
    CHECK(ib.max_batch == B && ib.qpos && ib.actions, "input buffers: max_batch %d (session %d), qpos %p, actions %p",
          ib.max_batch, B, (void *)ib.qpos, (void *)ib.actions);
    for (int cam = 0; cam < ACT_MAX_CAMS; cam++)
        CHECK((ib.images[cam] != NULL) == (cam < c->num_cams), "input buffers: camera %d pointer %p", cam,
              (void *)ib.images[cam]);
    if (!ib.qpos || !ib.actions || !ib.images[0]) return;
    act_inputs in;
    memset(&in, 0, sizeof in);
    in.batch = B;
    in.qpos = ib.qpos;
    in.actions = ib.actions;
    in.action_is_pad = b->pad;
    memcpy(ib.qpos, b->qpos, sizeof(float) * B * c->obs_dim);
    memcpy(ib.actions, b->actions, sizeof(float) * B * CH);
    for (int cam = 0; cam < c->num_cams; cam++) {
        memcpy(ib.images[cam], b->frames[cam], B * fsz);
        in.images[cam] = ib.images[cam];
    }
    outs o = make_outs(c, B);
    act_outputs oo = all_of(&o);
    run_ok(s, &in, &oo, "inputs in the session's buffers");
    CHECK(!memcmp(o.a, full->a, sizeof(float) * B * CH) && !memcmp(o.pa, full->pa, sizeof(float) * B * CH) &&
          !memcmp(o.mu, full->mu, sizeof(float) * B * L),
          "inputs in the session's buffers: the chunk differs from the same batch copied in (%.3g)",
          rel(o.a, full->a, B * CH));
    int same = !memcmp(ib.qpos, b->qpos, sizeof(float) * B * c->obs_dim);
    for (int cam = 0; cam < c->num_cams; cam++) same = same && !memcmp(ib.images[cam], b->frames[cam], B * fsz);
    CHECK(same, "act_run changed the inputs in the session's buffers");
    act_inputs w = in;
    w.batch = 1;
    w.qpos += 2 * c->obs_dim;
    w.actions += 2 * CH;
    w.action_is_pad += 2 * H;
    for (int cam = 0; cam < c->num_cams; cam++) w.images[cam] += 2 * fsz;
    run_ok(s, &w, &oo, "a window inside the session's buffers");
    CHECK(rel(o.a, full->a + 2 * CH, CH) <= 1e-5 && rel(o.pa, full->pa + 2 * CH, CH) <= 1e-5,
          "sample 2 read from inside the session's buffers: prior %.3g, posterior %.3g vs the joint run",
          rel(o.a, full->a + 2 * CH, CH), rel(o.pa, full->pa + 2 * CH, CH));
    free_outs(&o);
}

/* One step on `in` after a step on other frames (nothing of an earlier step may linger in the
 * buffers): the chunks must equal the joint run's exactly. */
static void same_as_joint(act_session *s, const act_config *c, const batch *b, const outs *full,
                          const act_inputs *in, outs *o, const char *what, const char *how) {
    int B = b->B;
    size_t CH = (size_t)c->pred_horizon * c->action_dim;
    act_outputs oo = all_of(o);
    act_inputs other = inputs_of(c, b, 0, B);
    for (int cam = 0; cam < c->num_cams; cam++) other.images[cam] = b->frames[(cam + 1) % c->num_cams];
    run_ok(s, &other, &oo, "a step on other frames");
    memset(o->a, 0xff, sizeof(float) * B * CH);
    run_ok(s, in, &oo, how);
    CHECK(!memcmp(o->a, full->a, sizeof(float) * B * CH) && !memcmp(o->pa, full->pa, sizeof(float) * B * CH),
          "%s %s: the chunk differs from the joint run (%.3g)", what, how, rel(o->a, full->a, B * CH));
}

/* Frames given per sample (act_inputs.image_items), each sample's in a block of its own, in
 * reverse order in memory: read where they lie when registered, copied when not, copied when
 * only some are (one frame sticks out of its registration), and unregistering goes back to
 * copying; every way gives the joint run's answer exactly. Then the errors. */
static void test_image_items(act_session *s, const act_config *c, const batch *b, const outs *full) {
    char err[ACT_ERR_LEN];
    int B = b->B;
    size_t fsz = (size_t)c->image_h * c->image_w * 3;
    uint8_t *blk[8];
    const uint8_t *items[ACT_MAX_CAMS][8];
    act_inputs in = inputs_of(c, b, 0, B);
    for (int i = 0; i < B; i++) {
        int at = B - 1 - i;
        blk[i] = malloc(c->num_cams * fsz);
        for (int cam = 0; cam < c->num_cams; cam++) {
            memcpy(blk[i] + cam * fsz, b->frames[cam] + (size_t)at * fsz, fsz);
            items[cam][at] = blk[i] + cam * fsz;
        }
    }
    for (int cam = 0; cam < c->num_cams; cam++) {
        in.images[cam] = NULL;
        in.image_items[cam] = items[cam];
    }
    outs o = make_outs(c, B);
    act_outputs oo = all_of(&o);
    const char *how[4] = {"copied (nothing registered)", "read in place (all registered)",
                          "copied (one frame outside its registration)", "copied (unregistered again)"};
    for (int round = 0; round < 4; round++) {
        if (round == 1)
            for (int i = 0; i < B; i++)
                CHECK(act_session_register_host(s, blk[i], c->num_cams * fsz, err, sizeof err) == 0,
                      "register block %d: %s", i, err);
        if (round == 2) {
            act_session_unregister_host(s, blk[0]);
            CHECK(act_session_register_host(s, blk[0], c->num_cams * fsz - 1, err, sizeof err) == 0,
                  "register a short block: %s", err);
        }
        if (round == 3)
            for (int i = 0; i < B; i++)
                CHECK(act_session_unregister_host(s, blk[i]) == 0, "unregister block %d", i);
        same_as_joint(s, c, b, full, &in, &o, "per-sample frames", how[round]);
    }
    CHECK(act_session_unregister_host(s, blk[0]) == -1, "unregistering memory twice did not fail");
    CHECK(act_session_register_host(s, blk[0], fsz, err, sizeof err) == 0, "register again: %s", err);
    CHECK(act_session_register_host(s, blk[0], fsz, err, sizeof err) == -1 && strstr(err, "registered already"),
          "registering the same memory twice: '%s'", err);
    CHECK(act_session_register_host(s, NULL, fsz, err, sizeof err) == -1, "registering NULL did not fail");
    act_session_unregister_host(s, blk[0]);
    items[1][1] = NULL;
    expect_error(s, &in, &oo, "has no frame for sample 1", "a NULL frame among image_items");
    act_input_buffers ib;
    act_session_input_buffers(s, &ib);
    items[1][1] = ib.images[0] + fsz;
    expect_error(s, &in, &oo, "points into the session's input buffers", "an item inside the input buffers");
    in.image_items[1] = NULL;
    expect_error(s, &in, &oo, "no frames for camera 1", "neither images nor image_items");
    free_outs(&o);
    for (int i = 0; i < B; i++) free(blk[i]);
}

/* Frames copied into staging by 3 copy threads (the default is half the cores: none on a 2-core
 * machine): contiguous per camera and per sample, the joint run's chunk exactly. */
/* Frames given per camera (act_inputs.images) from one block of registered memory, as
 * act-infer eval's episode reader keeps them: read in place, then copied when one camera's
 * frames stick out of the registration; both give the joint run's answer exactly. */
static void test_images_registered(act_session *s, const act_config *c, const batch *b, const outs *full) {
    char err[ACT_ERR_LEN];
    int B = b->B;
    size_t fsz = (size_t)c->image_h * c->image_w * 3;
    size_t cam_bytes = (size_t)B * fsz;
    uint8_t *blk = malloc(c->num_cams * cam_bytes);
    act_inputs in = inputs_of(c, b, 0, B);
    for (int cam = 0; cam < c->num_cams; cam++) {
        memcpy(blk + cam * cam_bytes, b->frames[cam], cam_bytes);
        in.images[cam] = blk + cam * cam_bytes;
    }
    outs o = make_outs(c, B);
    const char *how[2] = {"read in place (registered)", "copied (the last camera's last frame outside)"};
    for (int round = 0; round < 2; round++) {
        size_t reg = c->num_cams * cam_bytes - (round ? 1 : 0);
        CHECK(act_session_register_host(s, blk, reg, err, sizeof err) == 0, "register the block: %s", err);
        same_as_joint(s, c, b, full, &in, &o, "per-camera frames", how[round]);
        CHECK(act_session_unregister_host(s, blk) == 0, "unregister the block");
    }
    free_outs(&o);
    free(blk);
}

static void test_copy_threads(const act_model *m, const batch *b, const outs *full) {
    char err[ACT_ERR_LEN];
    const act_config *c = act_model_config(m);
    act_session_opts o = act_session_default_opts();
    o.max_batch = b->B;
    o.copy_threads = 3;
    act_session *s = NULL;
    CHECK(act_session_create(m, &o, &s, err, sizeof err) == 0, "session with 3 copy threads: %s", err);
    if (!s) return;
    size_t CH = (size_t)c->pred_horizon * c->action_dim;
    outs o3 = make_outs(c, b->B);
    act_outputs oo = all_of(&o3);
    act_inputs in = inputs_of(c, b, 0, b->B);
    run_ok(s, &in, &oo, "joint batch, 3 copy threads");
    CHECK(!memcmp(o3.a, full->a, sizeof(float) * b->B * CH) && !memcmp(o3.pa, full->pa, sizeof(float) * b->B * CH),
          "3 copy threads: the chunk differs from the joint run (%.3g)", rel(o3.a, full->a, b->B * CH));
    test_image_items(s, c, b, full);
    free_outs(&o3);
    act_session_free(s);
}

static void test_model(const char *path) {
    char err[ACT_ERR_LEN];
    act_model *m;
    if (act_model_load(path, &m, err, sizeof err)) {
        fprintf(stderr, "FAIL cannot load %s: %s (make it with tests/make_testdata.py)\n", path, err);
        g_fail++;
        return;
    }
    const act_config *c = act_model_config(m);
    const int MB = 3, H = c->pred_horizon, A = c->action_dim, L = c->latent_dim;
    const size_t CH = (size_t)H * A;
    act_session_opts opts = act_session_default_opts();
    opts.max_batch = MB;
    act_session *s;
    if (act_session_create(m, &opts, &s, err, sizeof err)) {
        fprintf(stderr, "FAIL session on %s: %s\n", path, err);
        g_fail++;
        act_model_free(m);
        return;
    }
    printf("%s: %s, %zu bytes of buffers\n", path, act_session_device_name(s), act_session_device_bytes(s));
    CHECK(strstr(act_session_device_name(s), "cpu") && act_session_device_bytes(s) > 0, "device name/bytes");
    test_options(m);

    batch b = make_batch(c, MB);
    for (int i = 0; i < MB; i++)   /* sample i has i * 3 padded steps at the end */
        for (int h = H - 3 * i; h < H; h++)
            if (h >= 1) b.pad[(size_t)i * H + h] = 1;
    test_validation(s, c, &b, MB);

    /* the joint run of the whole batch */
    outs full = make_outs(c, MB);
    act_outputs fo = all_of(&full);
    act_inputs in = inputs_of(c, &b, 0, MB);
    run_ok(s, &in, &fo, "joint batch 3");

    /* batch independence + prior/posterior independence, one sample at a time */
    outs one = make_outs(c, 1);
    for (int i = 0; i < MB; i++) {
        act_inputs i1 = inputs_of(c, &b, i, 1);
        act_outputs prior_only = {one.a, one.an, NULL, NULL, NULL, NULL, NULL};
        act_inputs ip = i1;
        ip.actions = NULL;
        run_ok(s, &ip, &prior_only, "prior alone");
        CHECK(rel(one.a, full.a + i * CH, CH) <= 1e-5, "sample %d: prior alone vs in a joint batch of 3: %.3g", i,
              rel(one.a, full.a + i * CH, CH));
        act_outputs post_only = {NULL, NULL, one.pa, one.pan, one.mu, one.lv, one.kl};
        run_ok(s, &i1, &post_only, "posterior alone");
        CHECK(rel(one.pa, full.pa + i * CH, CH) <= 1e-5 && rel(one.mu, full.mu + (size_t)i * L, L) <= 1e-5,
              "sample %d: posterior alone vs in a joint batch of 3: chunk %.3g mu %.3g", i,
              rel(one.pa, full.pa + i * CH, CH), rel(one.mu, full.mu + (size_t)i * L, L));
    }

    test_input_buffers(s, c, &b, &full);
    test_image_items(s, c, &b, &full);
    test_images_registered(s, c, &b, &full);
    test_copy_threads(m, &b, &full);

    /* closed forms: kl from mu/logvar, actions = denormalize(actions_norm) */
    for (int i = 0; i < MB; i++) {
        double kl = 0;
        for (int j = 0; j < L; j++) {
            double mu = full.mu[i * L + j], lv = full.lv[i * L + j];
            kl += -0.5 * (1 + lv - mu * mu - exp(lv));
        }
        CHECK(fabs(kl - full.kl[i]) <= 1e-5 * (fabs(kl) + 1e-3), "kl[%d] %.7g, closed form %.7g", i, full.kl[i], kl);
    }
    float *den = malloc(sizeof(float) * MB * CH);
    act_denormalize_action(m, full.an, den, MB * H);
    CHECK(rel(full.a, den, MB * CH) <= 1e-6, "actions vs denormalize(actions_norm): %.3g", rel(full.a, den, MB * CH));
    act_denormalize_action(m, full.pan, den, MB * H);
    CHECK(rel(full.pa, den, MB * CH) <= 1e-6, "post_actions vs denormalize(post_actions_norm)");
    CHECK(rel(full.pa, full.a, MB * CH) > 1e-3, "posterior chunk equals the prior chunk: z is not used");

    /* act_outputs_check: the joint run's outputs are finite; a qpos of 3e38 (finite, so act_run
     * takes it) normalizes to infinity and its row's outputs are not: named by output and row,
     * and only that row's range fails */
    {
        char e2[ACT_ERR_LEN] = "";
        CHECK(act_outputs_check(s, &fo, 0, MB, e2, sizeof e2) == 0, "finite outputs refused: %s", e2);
        outs h = make_outs(c, MB);
        act_outputs ho = all_of(&h);
        float keep = b.qpos[1 * c->obs_dim];
        b.qpos[1 * c->obs_dim] = 3e38f;
        run_ok(s, &in, &ho, "a qpos of 3e38");
        b.qpos[1 * c->obs_dim] = keep;
        int rc = act_outputs_check(s, &ho, 0, MB, e2, sizeof e2);
        CHECK(rc == -1 && strstr(e2, "action chunk for row 1 is not finite") && strstr(e2, "dataset statistics"),
              "a NaN chunk in row 1: rc %d, '%s'", rc, e2);
        CHECK(act_outputs_check(s, &ho, 0, 1, NULL, 0) == 0 && act_outputs_check(s, &ho, 2, 1, NULL, 0) == 0,
              "rows 0 and 2 (finite) refused");
        rc = act_outputs_check(s, &ho, 1, 1, e2, sizeof e2);
        CHECK(rc == -1 && strstr(e2, "the model's action chunk is not finite (step 0, joint 0 is "),
              "row 1 alone: rc %d, '%s'", rc, e2);
        /* the CVAE outputs are checked as well: finite chunks, a latent mean, log-variance or KL
         * that is not (set by hand in the finite run's outputs) */
        act_outputs fm = fo;
        float *lat = malloc((size_t)MB * c->latent_dim * sizeof *lat), kl[MB];
        memcpy(lat, fo.mu, (size_t)MB * c->latent_dim * sizeof *lat);
        memcpy(kl, fo.kl, sizeof kl);
        lat[(size_t)2 * c->latent_dim + 3] = NAN;
        fm.mu = lat;
        rc = act_outputs_check(s, &fm, 0, MB, e2, sizeof e2);
        CHECK(rc == -1 && strstr(e2, "latent mean for row 2 is not finite (element 3 is nan)"), "mu: rc %d, '%s'", rc, e2);
        fm.mu = fo.mu;
        fm.logvar = lat;
        rc = act_outputs_check(s, &fm, 2, 1, e2, sizeof e2);
        CHECK(rc == -1 && strstr(e2, "latent log-variance is not finite (element 3 is nan)"), "logvar: rc %d, '%s'", rc, e2);
        fm.logvar = fo.logvar;
        kl[MB - 1] = INFINITY;
        fm.kl = kl;
        rc = act_outputs_check(s, &fm, 0, MB, e2, sizeof e2);
        CHECK(rc == -1 && strstr(e2, "KL for row ") && strstr(e2, "is not finite"), "kl: rc %d, '%s'", rc, e2);
        CHECK(act_outputs_check(s, &fm, 0, MB - 1, NULL, 0) == 0, "rows before the bad KL refused");
        free(lat);
        free_outs(&h);
    }

    /* key padding: garbage in padded steps changes nothing, unmasking them changes mu */
    outs g = make_outs(c, MB);
    act_outputs go = all_of(&g);
    for (int i = 0; i < MB; i++)
        for (int h = 0; h < H; h++)
            if (b.pad[(size_t)i * H + h])
                for (int a = 0; a < A; a++) b.actions[((size_t)i * H + h) * A + a] = urand(-50, 50);
    run_ok(s, &in, &go, "garbage in padded steps");
    CHECK(rel(g.mu, full.mu, (size_t)MB * L) == 0.0, "padded steps leak into mu: %.3g", rel(g.mu, full.mu, (size_t)MB * L));
    memset(b.pad, 0, (size_t)MB * H);
    run_ok(s, &in, &go, "no padding");
    CHECK(rel(g.mu + L, full.mu + L, (size_t)(MB - 1) * L) > 1e-4, "unmasking steps left mu unchanged");
    CHECK(rel(g.mu, full.mu, L) == 0.0, "sample 0 had no padding, yet mu moved");

    /* seeded sampling */
    outs s1 = make_outs(c, MB), s2 = make_outs(c, MB);
    act_outputs so1 = all_of(&s1), so2 = all_of(&s2);
    in.sample_latent = 1;
    in.seed = rnd();
    run_ok(s, &in, &so1, "sample seed A");
    run_ok(s, &in, &so2, "sample seed A again");
    CHECK(memcmp(s1.pa, s2.pa, sizeof(float) * MB * CH) == 0, "same seed, different chunks");
    CHECK(rel(s1.mu, g.mu, (size_t)MB * L) == 0.0, "sampling changed mu");
    CHECK(rel(s1.pa, g.pa, MB * CH) > 1e-4, "a sampled z decodes like z = mu");
    in.seed ^= 0x5bd1e995u;
    run_ok(s, &in, &so2, "sample seed B");
    CHECK(rel(s2.pa, s1.pa, MB * CH) > 1e-4, "another seed, same chunk");
    CHECK(memcmp(s2.a, s1.a, sizeof(float) * MB * CH) == 0, "the prior depends on the sampling seed");

    /* profiling */
    double ms[ACT_STAGE_COUNT];
    CHECK(act_session_stage_ms(s, ms) == -1, "stage times without profiling");
    act_session_profile(s, 1);
    run_ok(s, &in, &so2, "profiled");
    CHECK(act_session_stage_ms(s, ms) == 0, "no stage times after a profiled run");
    double sum = 0;
    for (int i = 0; i < ACT_STAGE_COUNT; i++) {
        CHECK(ms[i] >= 0, "stage %s: %.3f ms", act_stage_name((act_stage)i), ms[i]);
        sum += ms[i];
    }
    CHECK(ms[ACT_STAGE_VISION] > 0 && sum > 0, "vision stage took no time (%.3f ms)", ms[ACT_STAGE_VISION]);
    CHECK(!strcmp(act_stage_name(ACT_STAGE_VISION), "vision"), "stage name");
    /* the sections: every one of a stage's, summed, is that stage; each section that runs an op
     * in this posterior step (every one) took time */
    double sec[ACT_SECTION_COUNT], by_stage[ACT_STAGE_COUNT] = {0};
    CHECK(act_session_section_ms(s, sec) == 0, "no section times after a profiled run");
    for (int k = 0; k < ACT_SECTION_COUNT; k++) {
        act_stage st = act_section_stage((act_section)k);
        CHECK(st >= 0 && st < ACT_STAGE_COUNT, "section %d has no stage", k);
        if (st >= 0 && st < ACT_STAGE_COUNT) by_stage[st] += sec[k];
        CHECK(sec[k] > 0 || k == ACT_SECTION_DOWNLOAD, "section %s took no time (%.6f ms)",
              act_section_name((act_section)k), sec[k]);
    }
    for (int i = 0; i < ACT_STAGE_COUNT; i++)
        CHECK(fabs(by_stage[i] - ms[i]) <= 1e-9 * (1 + ms[i]), "stage %s %.6f ms, its sections %.6f",
              act_stage_name((act_stage)i), ms[i], by_stage[i]);
    static const act_stage want_stage[ACT_SECTION_COUNT] = {
        ACT_STAGE_UPLOAD, ACT_STAGE_PREPROCESS, ACT_STAGE_VISION, ACT_STAGE_VISION, ACT_STAGE_VISION,
        ACT_STAGE_VISION, ACT_STAGE_VISION, ACT_STAGE_VISION, ACT_STAGE_TRANSFORMER,
        ACT_STAGE_TRANSFORMER, ACT_STAGE_TRANSFORMER, ACT_STAGE_TRANSFORMER, ACT_STAGE_DOWNLOAD};
    for (int k = 0; k < ACT_SECTION_COUNT; k++)
        CHECK(act_section_stage((act_section)k) == want_stage[k], "section %s in stage %s",
              act_section_name((act_section)k), act_stage_name(act_section_stage((act_section)k)));
    CHECK(!strcmp(act_section_name(ACT_SECTION_LAYER3), "layer3") &&
          !strcmp(act_section_name(ACT_SECTION_COUNT), "unknown"), "section names");

    free(den);
    free_outs(&full), free_outs(&one), free_outs(&g), free_outs(&s1), free_outs(&s2);
    free_batch(&b);
    act_session_free(s);
    act_model_free(m);
}

int main(void) {
    seed_rng("test_session");
    const char *dir = data_dir();
    const char *models[] = {"small.actw", "small_sep_gn.actw"};
    for (int i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, models[i]);
        test_model(path);
    }
    printf("test_session: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
