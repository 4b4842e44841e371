/* session.c - a model bound to a backend: create, run, profile, free.
 * defines: act_session_default_opts, act_session_create, act_session_free, act_run,
 *          act_session_profile, act_session_stage_ms, act_session_device_name, act_session_uses_graphs,
 *          act_outputs_check,
 *          act_session_device_bytes, act_session_memory, act_session_input_buffers,
 *          act_session_register_host, act_session_unregister_host, act_stage_name,
 *          act_section_name, act_section_stage, act_session_section_ms
 *
 * act_run is the only door from the caller's memory into a step: it checks every input (batch
 * range, a frame buffer per camera, finite qpos and actions), copies the inputs into the
 * forward's staging buffers (unless the caller wrote them there already, or gave frames in
 * registered memory, which the step reads where they lie), runs the step and copies
 * the requested outputs back out. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "forward.h"
#include "pool.h"
#include "util.h"

#define ACT_MAX_BATCH_LIMIT 65536

/* Frames of 590 KB per sample (151 MB at batch 256) are copied into staging on several threads:
 * one thread's memcpy would take longer than a GPU's step. One piece per frame. */
typedef struct copy_piece { uint8_t *dst; const uint8_t *src; size_t bytes; } copy_piece;
typedef struct copy_job { const copy_piece *pieces; int n; } copy_job;

struct act_session {
    const act_model *m;
    act_backend *be;
    act_fwd *fwd;
    act_session_opts opts;
    int profile;
    int have_stages;
    double section_ms[ACT_SECTION_COUNT];
    size_t weight_bytes, activation_bytes;   /* device bytes load_weights and act_fwd_create took */
    struct host_reg { const uint8_t *p; size_t bytes; uint8_t *dev; } *regs;   /* registered host memory */
    int n_regs, cap_regs;
    act_pool *copy_pool;   /* copies of caller frames into staging; NULL: on the calling thread */
    copy_piece *pieces;    /* [num_cams * max_batch]: one copy job's frames */
};

static void copy_task(void *arg, int t, int lo, int hi) {
    const copy_job *j = arg;
    (void)t;
    for (int i = lo; i < hi; i++) memcpy(j->pieces[i].dst, j->pieces[i].src, j->pieces[i].bytes);
}

const char *act_stage_name(act_stage st) {
    static const char *names[ACT_STAGE_COUNT] = {"upload", "preprocess", "vision", "transformer",
                                                 "download"};
    return (st >= 0 && st < ACT_STAGE_COUNT) ? names[st] : "unknown";
}

static const struct {
    const char *name;
    act_stage stage;
} k_sections[ACT_SECTION_COUNT] = {
    {"upload", ACT_STAGE_UPLOAD},      {"preprocess", ACT_STAGE_PREPROCESS},
    {"stem", ACT_STAGE_VISION},        {"layer1", ACT_STAGE_VISION},
    {"layer2", ACT_STAGE_VISION},      {"layer3", ACT_STAGE_VISION},
    {"layer4", ACT_STAGE_VISION},      {"keypoints", ACT_STAGE_VISION},
    {"latent", ACT_STAGE_TRANSFORMER}, {"memory", ACT_STAGE_TRANSFORMER},
    {"decoder", ACT_STAGE_TRANSFORMER}, {"head", ACT_STAGE_TRANSFORMER},
    {"download", ACT_STAGE_DOWNLOAD},
};

const char *act_section_name(act_section sec) {
    return (sec >= 0 && sec < ACT_SECTION_COUNT) ? k_sections[sec].name : "unknown";
}

act_stage act_section_stage(act_section sec) {
    return (sec >= 0 && sec < ACT_SECTION_COUNT) ? k_sections[sec].stage : ACT_STAGE_COUNT;
}

act_session_opts act_session_default_opts(void) {
    act_session_opts o;
    memset(&o, 0, sizeof o);
    o.device = ACT_DEVICE_CPU;
    o.precision = ACT_FP32;
    o.max_batch = 1;
    o.use_graphs = 1;
    o.cuda_device = 0;
    return o;
}

static size_t ws_bytes(act_backend *be) { return be->workspace_bytes ? be->workspace_bytes(be) : 0; }

int act_session_create(const act_model *m, const act_session_opts *opts, act_session **out,
                       char *err, size_t errlen) {
    if (!out) return act_errf(err, errlen, "act_session_create: out is NULL");
    *out = NULL;
    if (!m) return act_errf(err, errlen, "act_session_create: model is NULL");
    act_session_opts o = opts ? *opts : act_session_default_opts();
    if (o.copy_threads < 0 || o.copy_threads > 64)
        return act_errf(err, errlen, "act_session_create: copy_threads %d is outside 0..64", o.copy_threads);
    if (o.max_batch < 1 || o.max_batch > ACT_MAX_BATCH_LIMIT)
        return act_errf(err, errlen, "act_session_create: max_batch %d is outside 1..%d",
                        o.max_batch, ACT_MAX_BATCH_LIMIT);
    if (o.precision < ACT_FP32 || o.precision > ACT_FP16)
        return act_errf(err, errlen, "act_session_create: unknown precision %d", (int)o.precision);
    act_session *s = calloc(1, sizeof *s);
    if (!s) return act_errf(err, errlen, "act_session_create: out of memory");
    s->m = m;
    s->opts = o;
    int rc;
    if (o.device == ACT_DEVICE_CPU)
        rc = act_backend_cpu_create(o.precision, &s->be, err, errlen);
    else if (o.device == ACT_DEVICE_CUDA)
        rc = act_backend_cuda_create(o.cuda_device, o.precision, &s->be, err, errlen);
    else
        rc = act_errf(err, errlen, "act_session_create: unknown device %d", (int)o.device);
    if (rc) {
        free(s);
        return -1;
    }
    size_t before = s->be->device_bytes(s->be), ws_before = ws_bytes(s->be);
    if (s->be->load_weights(s->be, m)) {
        act_errf(err, errlen, "act_session_create: %s backend: loading weights: %s", s->be->name,
                 s->be->err);
        act_session_free(s);
        return -1;
    }
    /* what load_weights and act_fwd_create took, less scratch (workspace: the rest of the total) */
    s->weight_bytes = (s->be->device_bytes(s->be) - before) - (ws_bytes(s->be) - ws_before);
    before = s->be->device_bytes(s->be);
    ws_before = ws_bytes(s->be);
    if (act_fwd_create(s->be, m, o.max_batch, &s->fwd, err, errlen)) {
        act_session_free(s);
        return -1;
    }
    s->activation_bytes = (s->be->device_bytes(s->be) - before) - (ws_bytes(s->be) - ws_before);
    int half = act_pool_cores() / 2;
    int threads = o.copy_threads ? o.copy_threads : act_pool_env_threads("ACT_COPY_THREADS", half < 1 ? 1 : half > 8 ? 8 : half);
    if (threads > 1) s->copy_pool = act_pool_create(threads);   /* NULL: copies run inline */
    s->pieces = malloc((size_t)m->cfg.num_cams * o.max_batch * sizeof *s->pieces);
    if (!s->pieces) {
        act_errf(err, errlen, "act_session_create: out of memory");
        act_session_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void act_session_free(act_session *s) {
    if (!s) return;
    while (s->n_regs > 0) act_session_unregister_host(s, s->regs[s->n_regs - 1].p);
    free(s->regs);
    act_pool_destroy(s->copy_pool);
    free(s->pieces);
    act_fwd_free(s->fwd);
    if (s->be) s->be->destroy(s->be);
    free(s);
}

static int all_finite(const float *x, size_t n, size_t *bad) {
    *bad = act_find_nonfinite(x, n);
    return *bad == n;
}

/* Copies an input into its staging buffer; nothing when the caller wrote it there already
 * (act_session_input_buffers), memmove when it is a window inside the buffer. */
static void stage_in(void *stage, const void *src, size_t bytes) {
    if (stage != src) memmove(stage, src, bytes);
}

/* The device address of a frame inside registered memory, or NULL. */
static const uint8_t *registered(const act_session *s, const uint8_t *p, size_t bytes) {
    for (int i = 0; i < s->n_regs; i++) {
        const struct host_reg *r = &s->regs[i];
        if (p >= r->p && (size_t)(p - r->p) <= r->bytes && bytes <= r->bytes - (size_t)(p - r->p))
            return r->dev + (p - r->p);
    }
    return NULL;
}

/* Whether [p, p + bytes) overlaps the staging frames (act_session_input_buffers). */
static int in_staging(const act_session *s, const uint8_t *p, size_t bytes) {
    const act_config *c = &s->m->cfg;
    const uint8_t *lo = s->fwd->stage.frames[0];
    const uint8_t *hi = lo + (size_t)c->num_cams * s->opts.max_batch * c->image_h * c->image_w * 3;
    return p + bytes > lo && p < hi;
}

/* Frames into the staging frames: contiguous per camera (images) or per sample (image_items).
 * A window inside the staging buffer itself moves in place (memmove, one thread); the rest is
 * cut into pieces for the copy threads. */
static void copy_frames(act_session *s, const act_inputs *in, int B) {
    const act_config *c = &s->m->cfg;
    act_fwd_stage *st = &s->fwd->stage;
    size_t fsz = (size_t)c->image_h * c->image_w * 3;
    int n = 0;
    for (int cam = 0; cam < c->num_cams; cam++) {
        const uint8_t *src = in->images[cam];
        if (src && in_staging(s, src, (size_t)B * fsz)) {   /* may overlap its destination */
            stage_in(st->frames[cam], src, (size_t)B * fsz);
            continue;
        }
        for (int b = 0; b < B; b++) {
            copy_piece p = {st->frames[cam] + (size_t)b * fsz,
                            src ? src + (size_t)b * fsz : in->image_items[cam][b], fsz};
            s->pieces[n++] = p;
        }
    }
    copy_job j = {s->pieces, n};
    act_pool_run(s->copy_pool, copy_task, &j, n);
}

/* Frames in registered memory, given per sample (image_items) or per camera (images): when all
 * of them are, their device addresses go to the staging table and the step gathers them
 * (returns 1); otherwise every frame is copied into the staging frames (returns 0). */
static int stage_frames(act_session *s, const act_inputs *in, int B) {
    const act_config *c = &s->m->cfg;
    act_fwd_stage *st = &s->fwd->stage;
    size_t fsz = (size_t)c->image_h * c->image_w * 3;
    int gather = st->frame_ptrs != NULL;
    for (int cam = 0; cam < c->num_cams && gather; cam++) {
        if (in->images[cam]) {   /* B frames one after another */
            const uint8_t *dev = registered(s, in->images[cam], (size_t)B * fsz);
            for (int b = 0; b < B && dev; b++)
                st->frame_ptrs[(size_t)cam * B + b] = (uint64_t)(uintptr_t)(dev + (size_t)b * fsz);
            gather = dev != NULL;
            continue;
        }
        for (int b = 0; b < B && gather; b++) {
            const uint8_t *dev = registered(s, in->image_items[cam][b], fsz);
            if (dev) st->frame_ptrs[(size_t)cam * B + b] = (uint64_t)(uintptr_t)dev;
            else gather = 0;
        }
    }
    if (gather) return 1;
    copy_frames(s, in, B);
    return 0;
}

int act_session_register_host(act_session *s, const void *p, size_t bytes, char *err, size_t errlen) {
    if (!s || !p || !bytes) return act_errf(err, errlen, "act_session_register_host: no memory given");
    act_backend *be = s->be;
    if (!be->host_register || !s->fwd->stage.frame_ptrs)
        return act_errf(err, errlen, "act_session_register_host: the %s backend cannot read host "
                        "memory in place", be->name);
    if (registered(s, p, 1))
        return act_errf(err, errlen, "act_session_register_host: %p is registered already", p);
    if (s->n_regs == s->cap_regs) {
        int cap = s->cap_regs ? 2 * s->cap_regs : 16;
        struct host_reg *r = realloc(s->regs, (size_t)cap * sizeof *r);
        if (!r) return act_errf(err, errlen, "act_session_register_host: out of memory");
        s->regs = r;
        s->cap_regs = cap;
    }
    void *dev = NULL;
    if (be->host_register(be, (void *)p, bytes, &dev))
        return act_errf(err, errlen, "act_session_register_host: %s", be->err);
    s->regs[s->n_regs++] = (struct host_reg){p, bytes, dev};
    return 0;
}

int act_session_unregister_host(act_session *s, const void *p) {
    for (int i = 0; s && i < s->n_regs; i++)
        if (s->regs[i].p == p) {
            int rc = s->be->host_unregister(s->be, (void *)p);
            s->regs[i] = s->regs[--s->n_regs];
            return rc;
        }
    return -1;
}

int act_run(act_session *s, const act_inputs *in, act_outputs *out, char *err, size_t errlen) {
    if (!s || !in || !out) return act_errf(err, errlen, "act_run: session, inputs and outputs are required");
    const act_config *c = &s->m->cfg;
    act_fwd_stage *st = &s->fwd->stage;
    int B = in->batch, H = c->pred_horizon, A = c->action_dim, L = c->latent_dim;
    if (B < 1 || B > s->opts.max_batch)
        return act_errf(err, errlen, "act_run: batch %d is outside 1..%d (the session's max_batch)",
                        B, s->opts.max_batch);
    if (!in->qpos) return act_errf(err, errlen, "act_run: qpos is NULL");
    size_t fsz = (size_t)c->image_h * c->image_w * 3;
    for (int cam = 0; cam < c->num_cams; cam++) {
        const uint8_t *const *it = in->images[cam] ? NULL : in->image_items[cam];
        if (!in->images[cam] && !it)
            return act_errf(err, errlen, "act_run: no frames for camera %d '%s'", cam,
                            c->camera_names[cam]);
        for (int b = 0; it && b < B; b++) {
            if (!it[b])
                return act_errf(err, errlen, "act_run: image_items[%d] ('%s') has no frame for "
                                "sample %d", cam, c->camera_names[cam], b);
            if (in_staging(s, it[b], fsz))   /* its copy could overwrite another item's source */
                return act_errf(err, errlen, "act_run: image_items[%d][%d] points into the "
                                "session's input buffers; pass those frames as images[%d]", cam, b, cam);
        }
    }
    size_t bad;
    if (!all_finite(in->qpos, (size_t)B * c->obs_dim, &bad))
        return act_errf(err, errlen, "act_run: qpos[%zu][%zu] is not finite", bad / c->obs_dim,
                        bad % c->obs_dim);
    int prior = out->actions || out->actions_norm;
    int want_post = out->post_actions || out->post_actions_norm || out->mu || out->logvar || out->kl;
    if (want_post && !in->actions)
        return act_errf(err, errlen, "act_run: posterior outputs (post_actions, mu, logvar, kl) "
                        "need the recorded actions (inputs.actions)");
    int post = in->actions != NULL;
    if (!prior && !post)
        return act_errf(err, errlen, "act_run: no output requested (set outputs.actions or give "
                        "inputs.actions for the posterior)");
    if (post && !all_finite(in->actions, (size_t)B * H * A, &bad))
        return act_errf(err, errlen, "act_run: actions[%zu][%zu][%zu] is not finite",
                        bad / ((size_t)H * A), bad / A % H, bad % A);

    int mode = (prior ? ACT_FWD_PRIOR : 0) | (post ? ACT_FWD_POSTERIOR : 0);
    /* the host's copy of the inputs into the session's (pinned) buffers is part of getting them
     * to the device: the profile counts it in the upload section (none for staged inputs) */
    double host_in_s = s->profile ? act_now() : 0.0;
    if (stage_frames(s, in, B) > 0) mode |= ACT_FWD_GATHER;
    stage_in(st->qpos, in->qpos, sizeof(float) * B * c->obs_dim);
    if (post) {
        stage_in(st->actions, in->actions, sizeof(float) * B * H * A);
        /* key padding over [cls, qpos, actions]: the first two tokens are never padded */
        for (int b = 0; b < B; b++) {
            uint8_t *row = st->pad + (size_t)b * (H + 2);
            row[0] = row[1] = 0;
            for (int h = 0; h < H; h++)
                row[2 + h] = in->action_is_pad ? (in->action_is_pad[(size_t)b * H + h] != 0) : 0;
        }
        if (in->sample_latent) {
            mode |= ACT_FWD_SAMPLE;
            for (int i = 0; i < 8; i++) st->seed8[i] = (uint8_t)(in->seed >> (8 * i));
        }
    }
    if (s->profile) host_in_s = act_now() - host_in_s;
    int graphs = s->opts.use_graphs && !s->profile;
    if (act_fwd_step(s->fwd, B, mode, graphs, err, errlen)) return -1;
    if (s->profile) {
        s->be->section_ms(s->be, s->section_ms);
        s->section_ms[ACT_SECTION_UPLOAD] += host_in_s * 1e3;
        s->have_stages = 1;
    }

    size_t chunk = (size_t)B * H * A;
    size_t poff = prior ? chunk : 0;
    if (out->actions) memcpy(out->actions, st->act, sizeof(float) * chunk);
    if (out->actions_norm) memcpy(out->actions_norm, st->act_norm, sizeof(float) * chunk);
    if (out->post_actions) memcpy(out->post_actions, st->act + poff, sizeof(float) * chunk);
    if (out->post_actions_norm) memcpy(out->post_actions_norm, st->act_norm + poff, sizeof(float) * chunk);
    if (out->mu) memcpy(out->mu, st->mu, sizeof(float) * B * L);
    if (out->logvar) memcpy(out->logvar, st->logvar, sizeof(float) * B * L);
    if (out->kl) memcpy(out->kl, st->kl, sizeof(float) * B);
    return 0;
}

void act_session_profile(act_session *s, int enable) {
    if (!s) return;
    s->profile = enable != 0;
    s->fwd->profile = s->profile;
    if (s->profile) s->be->section_ms(s->be, s->section_ms);   /* drop time from unprofiled steps */
    s->have_stages = 0;
}

int act_session_stage_ms(act_session *s, double ms[ACT_STAGE_COUNT]) {
    if (!s || !s->have_stages) return -1;
    for (int k = 0; k < ACT_STAGE_COUNT; k++) ms[k] = 0.0;
    for (int k = 0; k < ACT_SECTION_COUNT; k++) ms[k_sections[k].stage] += s->section_ms[k];
    return 0;
}

int act_session_section_ms(act_session *s, double ms[ACT_SECTION_COUNT]) {
    if (!s || !s->have_stages) return -1;
    memcpy(ms, s->section_ms, sizeof s->section_ms);
    return 0;
}

int act_outputs_check(const act_session *s, const act_outputs *o, int first, int n, char *err,
                      size_t errlen) {
    const act_config *c = &s->m->cfg;
    size_t chunk = (size_t)c->pred_horizon * c->action_dim, L = (size_t)c->latent_dim;
    const struct { const float *p; size_t per; int is_chunk; const char *what; } outs[] = {
        {o->actions, chunk, 1, "action chunk"}, {o->actions_norm, chunk, 1, "action chunk (normalized)"},
        {o->post_actions, chunk, 1, "posterior action chunk"},
        {o->post_actions_norm, chunk, 1, "posterior action chunk (normalized)"},
        {o->mu, L, 0, "latent mean"}, {o->logvar, L, 0, "latent log-variance"}, {o->kl, 1, 0, "KL"}};
    for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++) {
        if (!outs[k].p || n <= 0) continue;
        size_t len = (size_t)n * outs[k].per, bad = act_find_nonfinite(outs[k].p + (size_t)first * outs[k].per, len);
        if (bad == len) continue;
        size_t row = (size_t)first + bad / outs[k].per, at = bad % outs[k].per;
        float v = outs[k].p[(size_t)first * outs[k].per + bad];
        char where[96] = "", rowtxt[32] = "";
        if (n > 1) snprintf(rowtxt, sizeof rowtxt, " for row %zu", row);
        if (outs[k].is_chunk)
            snprintf(where, sizeof where, " (step %zu, joint %zu is %s)", at / c->action_dim, at % c->action_dim,
                     isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        else if (outs[k].per > 1)
            snprintf(where, sizeof where, " (element %zu is %s)", at, isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        return act_errf(err, errlen, "the model's %s%s is not finite%s: its inputs lie far outside the dataset "
                        "statistics (a qpos in other units?)%s", outs[k].what, rowtxt, where,
                        s->opts.precision == ACT_FP16 ? ", or the fp16 computation overflowed (bf16 or fp32 avoid that)"
                                                      : "");
    }
    return 0;
}

const char *act_session_device_name(const act_session *s) { return s ? s->be->device_name : ""; }
int act_session_uses_graphs(const act_session *s) { return s && s->opts.use_graphs && s->be->graphs; }
size_t act_session_device_bytes(const act_session *s) { return s ? s->be->device_bytes(s->be) : 0; }

void act_session_memory(const act_session *s, act_memory *m) {
    memset(m, 0, sizeof *m);
    if (!s) return;
    m->total = s->be->device_bytes(s->be);
    m->weights = s->weight_bytes;
    m->activations = s->activation_bytes;
    m->workspace = m->total - m->weights - m->activations;
    size_t held, before, total;
    if (s->be->driver_memory && s->be->driver_memory(s->be, &held, &before, &total) == 0) {
        m->driver_held = held;
        m->driver_before = before;
        m->driver_total = total;
    }
}

void act_session_input_buffers(act_session *s, act_input_buffers *b) {
    memset(b, 0, sizeof *b);
    if (!s) return;
    const act_fwd_stage *st = &s->fwd->stage;
    for (int cam = 0; cam < s->m->cfg.num_cams; cam++) b->images[cam] = st->frames[cam];
    b->qpos = st->qpos;
    b->actions = st->actions;
    b->max_batch = s->opts.max_batch;
}
