/* episode_stream.c - the read-ahead double buffer of episode_stream.h.
 * Slots cycle FREE -> (reader fills) FULL -> (caller takes) HELD -> (next call) FREE. The reader
 * fills slots in ring order and the caller takes them in the same order, so batches arrive in
 * episode/timestep order. A final slot with episode = -1 marks the end. */
#include "episode_stream.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "episode.h"
#include "util.h"

#define NSLOTS 2
enum { SLOT_FREE, SLOT_FULL, SLOT_HELD };

typedef struct slot {
    int state;
    act_ep_batch b;
    uint8_t *frames[ACT_MAX_CAMS];   /* per camera, inside block */
    uint8_t *block;                  /* whole pages: every camera's frames of the batch */
    size_t block_bytes;
} slot;

struct act_stream {
    char **paths;
    int npaths, batch;
    act_config cfg;
    slot slots[NSLOTS];
    int fill_idx, take_idx, held;
    int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int thread_started;
};

static slot *wait_free(act_stream *s) {
    pthread_mutex_lock(&s->mu);
    slot *sl = &s->slots[s->fill_idx];
    while (sl->state != SLOT_FREE && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
    int stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    return stop ? NULL : sl;
}

static void publish(act_stream *s, slot *sl) {
    pthread_mutex_lock(&s->mu);
    sl->state = SLOT_FULL;
    s->fill_idx = (s->fill_idx + 1) % NSLOTS;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Chunk step k at timestep t is action[t - (obs_horizon - 1) + k]: the seed's select_action
 * executes chunk[obs_horizon - 1 :] from the current step, so the chunk starts obs_horizon - 1
 * steps back (LeRobot's action indices from 1 - n_obs_steps; obs_horizon 1, the default, is
 * action[t + k]). Steps outside the episode are padding: the nearest recorded action, masked. */
static void fill_targets(const act_episode *ep, const act_config *c, act_ep_batch *b) {
    int H = c->pred_horizon, A = c->action_dim, back = c->obs_horizon > 1 ? c->obs_horizon - 1 : 0;
    for (int i = 0; i < b->n; i++) {
        int t = b->t0 + i;
        for (int k = 0; k < H; k++) {
            int j = t - back + k;
            int src = j < 0 ? 0 : j < ep->T ? j : ep->T - 1;
            memcpy(b->targets + ((size_t)i * H + k) * A, ep->action + (size_t)src * A, sizeof(float) * A);
            b->is_pad[(size_t)i * H + k] = (uint8_t)(j < 0 || j >= ep->T);
        }
    }
}

/* Rows n..batch-1 of a partial batch: copies of row 0's qpos, targets and key padding, so that a
 * caller may run the batch at its full size (a step size already planned and captured) and drop
 * those rows. Their frames are whatever an earlier batch left in the slot (or its zeroed pages):
 * any frame is valid input, and a row's outputs depend on its own inputs alone. */
static void fill_stand_ins(const act_config *c, act_ep_batch *b, int batch) {
    size_t q = (size_t)c->obs_dim, h = (size_t)c->pred_horizon, a = (size_t)c->action_dim;
    for (int i = b->n; i < batch && b->n > 0; i++) {
        memcpy(b->qpos + i * q, b->qpos, sizeof(float) * q);
        memcpy(b->targets + i * h * a, b->targets, sizeof(float) * h * a);
        memcpy(b->is_pad + i * h, b->is_pad, h);
    }
}

/* Delivers a failed-episode batch; returns 0 if the stream was stopped meanwhile. */
static int publish_failure(act_stream *s, int e, int T, const char *msg) {
    slot *sl = wait_free(s);
    if (!sl) return 0;
    act_ep_batch *b = &sl->b;
    b->episode = e;
    b->T = T;
    b->t0 = b->n = 0;
    b->first = b->last = 1;
    b->failed = 1;
    b->reader[0] = '\0';
    snprintf(b->err, sizeof b->err, "%s", msg);
    publish(s, sl);
    return 1;
}

static void *reader_main(void *arg) {
    act_stream *s = arg;
    const act_config *c = &s->cfg;
    char err[ACT_ERR_LEN];
    for (int e = 0; e < s->npaths; e++) {
        act_episode *ep;
        if (act_episode_open(s->paths[e], c, &ep, err, sizeof err) != 0) {
            if (!publish_failure(s, e, 0, err)) return NULL;
            continue;
        }
        for (int t0 = 0; t0 < ep->T; t0 += s->batch) {
            slot *sl = wait_free(s);
            if (!sl) { act_episode_close(ep); return NULL; }
            act_ep_batch *b = &sl->b;
            b->episode = e;
            b->T = ep->T;
            b->t0 = t0;
            b->n = ep->T - t0 < s->batch ? ep->T - t0 : s->batch;
            b->first = t0 == 0;
            b->last = t0 + b->n == ep->T;
            b->failed = 0;
            b->err[0] = '\0';
            b->reader[0] = '\0';
            if (b->first) act_episode_readers(ep, c, b->reader, sizeof b->reader);
            int bad = 0;
            for (int cam = 0; cam < c->num_cams && !bad; cam++)
                bad = act_episode_read_frames(ep, cam, t0, b->n, sl->frames[cam], err, sizeof err) != 0;
            if (bad) {
                /* the slot was never published: hand it over as the failure record */
                b->n = 0;
                b->first = b->last = 1;
                b->failed = 1;
                snprintf(b->err, sizeof b->err, "%s", err);
                publish(s, sl);
                break;
            }
            memcpy(b->qpos, ep->qpos + (size_t)t0 * c->obs_dim, sizeof(float) * (size_t)b->n * c->obs_dim);
            fill_targets(ep, c, b);
            fill_stand_ins(c, b, s->batch);
            publish(s, sl);
        }
        act_episode_close(ep);
    }
    slot *sl = wait_free(s);
    if (sl) {
        sl->b.episode = -1;
        publish(s, sl);
    }
    return NULL;
}

static void free_slots(act_stream *s) {
    for (int i = 0; i < NSLOTS; i++) {
        slot *sl = &s->slots[i];
        free(sl->block);
        free(sl->b.qpos);
        free(sl->b.targets);
        free(sl->b.is_pad);
    }
}

int act_stream_open(char *const *paths, int npaths, const act_config *cfg, int batch,
                    act_stream **out, char *err, size_t errlen) {
    *out = NULL;
    if (batch < 1) {
        snprintf(err, errlen, "batch must be >= 1, got %d", batch);
        return -1;
    }
    act_stream *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, errlen, "out of memory"); return -1; }
    s->paths = (char **)paths;
    s->npaths = npaths;
    s->batch = batch;
    s->cfg = *cfg;
    size_t frame = (size_t)cfg->image_h * cfg->image_w * 3, cam_bytes = frame * (size_t)batch;
    int ok = 1;
    for (int i = 0; i < NSLOTS && ok; i++) {
        slot *sl = &s->slots[i];
        size_t bytes = 0;
        void *p = act_page_alloc(cam_bytes * (size_t)cfg->num_cams, &bytes);
        ok = p != NULL;
        /* every page written now: a caller may register the block with a CUDA session, which
         * pins it read-only, and a read-only pin of a page never written can pin the kernel's
         * shared zero page (Linux before 6.2), which the reader's writes would then not reach */
        if (ok) memset(p, 0, bytes);
        sl->block = p;
        sl->block_bytes = ok ? bytes : 0;
        for (int c = 0; c < cfg->num_cams && ok; c++) {
            sl->frames[c] = sl->block + (size_t)c * cam_bytes;
            sl->b.images[c] = sl->frames[c];
        }
        sl->b.qpos = malloc(sizeof(float) * (size_t)batch * cfg->obs_dim);
        sl->b.targets = malloc(sizeof(float) * (size_t)batch * cfg->pred_horizon * cfg->action_dim);
        sl->b.is_pad = malloc((size_t)batch * cfg->pred_horizon);
        ok = ok && sl->b.qpos && sl->b.targets && sl->b.is_pad;
    }
    if (!ok) {
        free_slots(s);
        free(s);
        snprintf(err, errlen, "out of memory for two batches of %d timesteps (%d cameras of %dx%d)",
                 batch, cfg->num_cams, cfg->image_h, cfg->image_w);
        return -1;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, reader_main, s) != 0) {
        act_stream_close(s);
        snprintf(err, errlen, "cannot start the episode reader thread");
        return -1;
    }
    s->thread_started = 1;
    *out = s;
    return 0;
}

const act_ep_batch *act_stream_next(act_stream *s) {
    pthread_mutex_lock(&s->mu);
    if (s->held) {
        s->slots[s->take_idx].state = SLOT_FREE;
        s->take_idx = (s->take_idx + 1) % NSLOTS;
        s->held = 0;
        pthread_cond_broadcast(&s->cv);
    }
    slot *sl = &s->slots[s->take_idx];
    while (sl->state != SLOT_FULL) pthread_cond_wait(&s->cv, &s->mu);
    const act_ep_batch *b = NULL;
    if (sl->b.episode >= 0) {
        sl->state = SLOT_HELD;
        s->held = 1;
        b = &sl->b;
    }
    pthread_mutex_unlock(&s->mu);
    return b;
}

int act_stream_frame_blocks(const act_stream *s, const uint8_t **blocks, size_t *bytes, int max) {
    int n = 0;
    for (int i = 0; i < NSLOTS && n < max; i++, n++) {
        blocks[n] = s->slots[i].block;
        bytes[n] = s->slots[i].block_bytes;
    }
    return n;
}

void act_stream_close(act_stream *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_started) pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free_slots(s);
    free(s);
}
