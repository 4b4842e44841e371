/* server_infer.c - act-serve's inference thread: batching across connections, and warm-up.
 *
 * The thread sleeps until a request is pending, then gives the batch a short window to fill:
 * it runs as soon as max_batch requests wait, max_wait_us have passed since the oldest arrived,
 * or every handshaken connection already has a request outstanding (closed-loop clients cannot
 * send more, so waiting longer would only add latency). Requests that queue up while a forward
 * runs form the next batch with no wait at all. One batch holds one kind of request: prior
 * (z = 0), posterior with z = mu, or a sampled posterior, which runs alone so its seed alone
 * decides its noise. Each request goes back to the I/O thread of its connection, through that
 * thread's done list and eventfd.
 * A batch's frames go to act_run as one pointer per request and camera: it reads them where
 * they lie when all are in memory registered with the session (clients' shared memory, the
 * receive buffers of TCP requests; registered here, at their first batch), else copies them on
 * the session's copy threads (act_session_opts.copy_threads).
 */
#define _GNU_SOURCE
#include "server_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A batch's qpos and recorded actions go into the session's own input buffers; these hold the
 * rest: key padding, the outputs and the frame pointers. */
typedef struct batch_bufs {
    act_input_buffers in;
    float *out, *kl;
    uint8_t *is_pad;
    const uint8_t **items;   /* [num_cams][batch] frame pointers */
} batch_bufs;

static void bufs_free(batch_bufs *b)
{
    free(b->out);
    free(b->kl);
    free(b->is_pad);
    free(b->items);
    memset(b, 0, sizeof *b);
}

static int bufs_alloc(batch_bufs *b, act_session *sess, const act_config *c, int nb)
{
    size_t na = (size_t)nb * c->pred_horizon * c->action_dim;
    memset(b, 0, sizeof *b);
    act_session_input_buffers(sess, &b->in);
    b->out = malloc(na * sizeof(float));
    b->kl = malloc((size_t)nb * sizeof(float));
    b->is_pad = malloc((size_t)nb * c->pred_horizon);
    b->items = malloc((size_t)nb * c->num_cams * sizeof *b->items);
    int ok = b->out && b->kl && b->is_pad && b->items && b->in.max_batch >= nb;
    if (!ok) bufs_free(b);
    return ok ? 0 : -1;
}

static int req_kind(const act_req *r)
{
    if (!r->p.actions) return 0;
    return (r->p.flags & ACT_PREDICT_SAMPLE_LATENT) ? 2 : 1;
}

static void deadline_ts(double t, struct timespec *ts)
{
    ts->tv_sec = (time_t)t;
    ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Which requests of kind a batch of max takes when more wait (under mu): the first of every
 * connection's, then the second of every connection's, and so on, each round in arrival order -
 * so a client with a long window out (predict_many, an evaluation) shares each pass with the
 * robots that ask one step at a time instead of running ahead of them all, and every client's
 * own requests still run in the order it sent them. Numbers each pending request of kind with
 * its place among its connection's (r->ord, from 0) and returns the place where the batch
 * fills: every request before it is taken, and of those at it the first in arrival order; max
 * (everything) when no more than max wait. */
static int fair_level(act_server *s, int kind, int max)
{
    int total = 0;
    for (int l = 0; l < max; l++) s->fair_level[l] = 0;
    for (act_req *r = s->pend_head; r; r = r->next) {
        if (req_kind(r) != kind) continue;
        r->ord = s->fair_seen[r->slot]++;
        if (r->ord < max) s->fair_level[r->ord]++;
        total++;
    }
    for (act_req *r = s->pend_head; r; r = r->next) s->fair_seen[r->slot] = 0;
    if (total <= max) return max;
    int level = 0;
    for (int sum = 0; level < max && sum + s->fair_level[level] <= max; level++) sum += s->fair_level[level];
    return level;
}

/* Waits for work and takes one batch off the pending list (under mu). Returns its size, 0 = stop,
 * -1 = no request, but registered memory to retire. Once told to stop it hands out nothing more:
 * the stop comes after the I/O loops have ended, drained or past --drain-timeout-ms, so whatever
 * still waits then is dropped (act_infer_stop) rather than computed with no one to answer. */
static int take_batch(act_server *s, act_req **out)
{
    int max = s->o.max_batch, n = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->pend_head && !s->infer_stop && !s->retired) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->pend_head) {
            int retire = s->retired && !s->infer_stop;
            pthread_mutex_unlock(&s->mu);
            return retire ? -1 : 0;
        }
        double deadline = s->pend_head->t_arrive + 1e-6 * s->o.max_wait_us;
        while (s->pend_head && s->n_pending < max && s->n_busy_conns < s->n_ready_conns && !s->infer_stop &&
               act_now() < deadline) {
            struct timespec ts;
            deadline_ts(deadline, &ts);
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        if (s->infer_stop) {   /* requests still pending: the window above ends at once on a stop */
            pthread_mutex_unlock(&s->mu);
            return 0;
        }
        if (s->pend_head) break;
        /* a closed connection took the requests that opened the window: wait for work again */
    }
    int kind = req_kind(s->pend_head);
    if (kind == 2) max = 1;
    int level = fair_level(s, kind, max), quota = max;
    if (level < max)   /* the requests at the places before it all go; of those at it, the first */
        for (int l = 0; l < level; l++) quota -= s->fair_level[l];
    act_req **link = &s->pend_head, *prev = NULL;
    while (*link && n < max) {
        act_req *r = *link;
        if (req_kind(r) == kind && (r->ord < level || (r->ord == level && quota-- > 0))) {
            *link = r->next;
            if (s->pend_tail == r) s->pend_tail = prev;
            r->next = NULL;
            out[n++] = r;
            s->n_pending--;
        } else {
            prev = r;
            link = &r->next;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Registering locks pages in RAM (and faults in a sparse memfd's): a client could attach up to
 * 4 GiB of shared memory. So only areas a frame ring plausibly needs are registered, and only up
 * to a total (shared memory and receive buffers together); the frames of any other are copied. */
#define REG_BLOCK_MAX ((size_t)64 << 20)
#define REG_TOTAL_MAX ((size_t)1 << 30)

void act_regmem_drop(act_server *s, act_regmem *m)
{
    pthread_mutex_lock(&s->mu);
    int reg = m->reg == 1;
    if (reg) {   /* the device may read it: the inference thread lets go first */
        m->next = s->retired;
        s->retired = m;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (!reg) m->release(m);
}

/* Registered blocks let go of (shared memory no request uses any more, receive buffers the I/O
 * thread freed): unregistered from the session, then released. On the inference thread (every
 * session call is made here), or once it has stopped. */
void act_infer_retire(act_server *s)
{
    pthread_mutex_lock(&s->mu);
    act_regmem *m = s->retired;
    s->retired = NULL;
    pthread_mutex_unlock(&s->mu);
    while (m) {
        act_regmem *next = m->next;
        act_session_unregister_host(s->sess, m->p);
        s->reg_bytes -= m->bytes;
        s->reg_full_logged = 0;
        m->release(m);
        m = next;
    }
}

/* Registers block m with the session if frame f is read from it and it was not tried yet;
 * it stays untried past the total (a later batch tries again, once memory registered before
 * has been let go of). m->reg is this thread's to write, so reading it needs no lock. */
static void register_block(act_server *s, act_regmem *m, const uint8_t *f, const char *what)
{
    if (!m || m->reg || f < m->p || f >= m->p + m->bytes) return;
    char err[ACT_ERR_LEN];
    int reg = -1;
    if (m->bytes <= REG_BLOCK_MAX && s->reg_bytes + m->bytes > REG_TOTAL_MAX) {
        if (!s->reg_full_logged)
            act_serve_log(s, "%zu MiB of frame memory are locked for reading in place, the most allowed: "
                          "further frames are copied until some is let go of", REG_TOTAL_MAX >> 20);
        s->reg_full_logged = 1;
        return;
    }
    if (m->bytes > REG_BLOCK_MAX)
        snprintf(err, sizeof err, "over the %zu MiB per block that are locked in RAM", REG_BLOCK_MAX >> 20);
    else if (!act_session_register_host(s->sess, m->p, m->bytes, err, sizeof err))
        reg = 1;
    if (reg == 1) s->reg_bytes += m->bytes;
    else act_serve_log(s, "%s of %zu bytes cannot be read in place (%s); its frames are copied", what, m->bytes, err);
    pthread_mutex_lock(&s->mu);
    m->reg = reg;
    pthread_mutex_unlock(&s->mu);
}

/* Registers what the batch's frames lie in and the session does not know yet: a client's
 * shared memory, or the receive buffer a request's raw TCP frames arrived in. The frames of a
 * block the session refused, or of zstd frames (inflated into the request), are copied by
 * act_run. */
static void register_frames(act_server *s, act_req **rs, int n)
{
    if (s->o.copy_frames) return;
    for (int i = 0; i < n; i++) {
        act_wire *w = act_wire_of(rs[i]->wire);
        register_block(s, rs[i]->shm ? &rs[i]->shm->mem : NULL, rs[i]->p.images[0], "shared memory");
        register_block(s, w ? &w->mem : NULL, rs[i]->p.images[0], "a receive buffer");
    }
}

/* Runs n requests as one forward pass of s->pad_to[n] rows: the rows past n repeat the first
 * request (its frame pointers, qpos, actions), and their results are dropped. */
static void run_batch(act_server *s, batch_bufs *b, act_req **rs, int n)
{
    const act_config *c = s->cfg;
    size_t na = (size_t)c->pred_horizon * c->action_dim;
    int kind = req_kind(rs[0]);
    int rows = s->pad_to[n];
    act_inputs in;
    act_outputs out;
    memset(&in, 0, sizeof in);
    memset(&out, 0, sizeof out);
    in.batch = rows;
    /* frames by pointer, where each request has them: act_run reads them in place when all lie
     * in registered memory, else copies them into its input buffers on its copy threads */
    register_frames(s, rs, n);
    for (int k = 0; k < c->num_cams; k++) {
        const uint8_t **items = b->items + (size_t)k * rows;
        for (int i = 0; i < rows; i++) items[i] = rs[i < n ? i : 0]->p.images[k];
        in.image_items[k] = items;
    }
    if (rows == 1) {   /* the rest of a batch of one is laid out as act_run wants it */
        in.qpos = rs[0]->p.qpos;
        in.actions = rs[0]->p.actions;
        in.action_is_pad = rs[0]->p.is_pad;
    } else {           /* a few hundred bytes per row, into the session's input buffers */
        const act_input_buffers *ib = &b->in;
        for (int i = 0; i < rows; i++) {
            const act_req *r = rs[i < n ? i : 0];
            memcpy(ib->qpos + (size_t)i * c->obs_dim, r->p.qpos, (size_t)c->obs_dim * sizeof(float));
            if (kind) {
                memcpy(ib->actions + (size_t)i * na, r->p.actions, na * sizeof(float));
                memcpy(b->is_pad + (size_t)i * c->pred_horizon, r->p.is_pad, (size_t)c->pred_horizon);
            }
        }
        in.qpos = ib->qpos;
        if (kind) {
            in.actions = ib->actions;
            in.action_is_pad = b->is_pad;
        }
    }
    if (kind) {
        in.sample_latent = kind == 2;
        in.seed = rs[0]->p.seed;
        out.post_actions = b->out;
        out.kl = b->kl;
    } else {
        out.actions = b->out;
    }
    char err[ACT_ERR_LEN];
    double t0 = act_now();
    int rc = act_run(s->sess, &in, &out, err, sizeof err);
    double t1 = act_now();
    /* a failing device (a GPU fault is sticky: every later pass fails too) turns /healthz to 503,
     * so a load balancer stops sending work here; one good pass turns it back */
    int was = act_metrics_batch(&s->metrics, n, rows, t1 - t0, rc ? err : NULL);
    if (rc && !was)
        act_serve_log(s, "inference failed: %s; /healthz says failing until a forward pass succeeds", err);
    else if (!rc && was)
        act_serve_log(s, "inference works again; /healthz says ok");
    for (int i = 0; i < n; i++) {
        act_req *r = rs[i];
        r->t_start = t0;
        r->t_end = t1;
        r->batch = n;
        r->rows = rows;
        if (rc) {
            r->code = ACT_E_INTERNAL;
            snprintf(r->msg, sizeof r->msg, "inference failed: %s", err);
            continue;
        }
        /* this request's inputs gave a NaN or infinite chunk: an error for it alone (the others
         * in the batch are fine), never actions a robot would execute */
        if (act_outputs_check(s->sess, &out, i, 1, r->msg, sizeof r->msg)) {
            r->code = ACT_E_INTERNAL;
            continue;
        }
        memcpy(r->chunk, b->out + (size_t)i * na, na * sizeof(float));
        r->kl = kind ? b->kl[i] : NAN;
    }
}

static void *infer_main(void *arg)
{
    act_server *s = arg;
    batch_bufs b;
    act_req **rs = malloc((size_t)s->o.max_batch * sizeof *rs);
    int ok = rs && bufs_alloc(&b, s->sess, s->cfg, s->o.max_batch) == 0;
    for (;;) {
        act_infer_retire(s);
        int n = take_batch(s, rs);
        if (!n) break;
        if (n < 0) continue;
        if (ok) {
            run_batch(s, &b, rs, n);
        } else {
            for (int i = 0; i < n; i++) {
                rs[i]->code = ACT_E_INTERNAL;
                snprintf(rs[i]->msg, sizeof rs[i]->msg, "inference thread is out of memory for batch buffers");
            }
        }
        uint32_t woken = 0;   /* I/O threads with results (ACT_IO_MAX <= 32) */
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < n; i++) {
            act_io *io = act_io_of(s, rs[i]->slot);
            if (io->done_tail) io->done_tail->next = rs[i];
            else io->done_head = rs[i];
            io->done_tail = rs[i];
            woken |= 1u << io->idx;
        }
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < s->n_io; i++)
            if (woken & (1u << i)) act_io_wake(&s->io[i]);
    }
    if (ok) bufs_free(&b);
    free(rs);
    return NULL;
}

int act_infer_start(act_server *s, char *err, size_t errlen)
{
    if (pthread_create(&s->infer_thread, NULL, infer_main, s)) {
        snprintf(err, errlen, "act-serve: cannot start the inference thread");
        return -1;
    }
    s->infer_started = 1;
    return 0;
}

void act_infer_stop(act_server *s)
{
    if (!s->infer_started) return;
    pthread_mutex_lock(&s->mu);
    s->infer_stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->infer_thread, NULL);
    s->infer_started = 0;
    if (s->n_pending)   /* freed with their connections by act_server_free */
        act_serve_log(s, "shutdown: %d queued requests dropped past the drain deadline (their connections "
                      "close; clients retry on another replica)", s->n_pending);
}

/* Runs every batch size the server will use with random inputs, so the first client does not
 * pay for lazy allocation, cuBLAS heuristics or CUDA graph capture: the CUDA backend runs a
 * key's first step eagerly and captures its second, so each size runs twice there - first every
 * size eagerly, then every size captured, because an eager step that grows the conv workspace
 * drops the graphs captured before it. The sizes are the ones batches are padded up to
 * (--batch-sizes). On the CPU nothing is captured per size, so batch 1 suffices (twice, the
 * second timed, when batches are larger).
 * Steps that read frames in place (from clients' shared memory or receive buffers) are keys of
 * their own on CUDA: a second pass warms them. */
int act_infer_warmup(act_server *s, act_device dev, char *err, size_t errlen)
{
    const act_config *c = s->cfg;
    batch_bufs b;
    int *sizes = malloc((size_t)s->o.max_batch * sizeof *sizes);
    if (!sizes || bufs_alloc(&b, s->sess, c, s->o.max_batch)) {
        free(sizes);
        snprintf(err, errlen, "act-serve: out of memory for batch buffers (max-batch %d)", s->o.max_batch);
        return -1;
    }
    int n_sizes = 0;
    for (int n = 1; n <= s->o.max_batch; n++)
        if (s->pad_to[n] == n && (n == 1 || dev == ACT_DEVICE_CUDA)) sizes[n_sizes++] = n;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    size_t frame = (size_t)c->image_h * c->image_w * 3;
    for (size_t i = 0; i < (size_t)s->o.max_batch * c->obs_dim; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        b.in.qpos[i] = (float)((x >> 40) & 0xffff) / 65536.0f - 0.5f;
    }
    for (int k = 0; k < c->num_cams; k++)
        for (size_t i = 0; i < (size_t)s->o.max_batch * frame; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            b.in.images[k][i] = (uint8_t)(x >> 56);
        }
    int rc = 0;
    /* CUDA: each size eager, then captured. CPU (batch 1 only): a second step is timed, since a
     * full batch's cost here is what clients' timeouts must cover (the first pays one-time costs) */
    int reps = dev == ACT_DEVICE_CUDA || s->o.max_batch > 1 ? 2 : 1;
    double step_s = 0;
    /* on CUDA, frames read in place are steps of their own (graphs included): warm those too,
     * from a registered copy of the frames (the session's own pinned buffers cannot be) */
    size_t all = (size_t)s->o.max_batch * frame;
    uint8_t *placed = NULL;
    char e[ACT_ERR_LEN];
    if (dev == ACT_DEVICE_CUDA && !s->o.copy_frames && (placed = malloc(all * c->num_cams))) {
        for (int k = 0; k < c->num_cams; k++) memcpy(placed + k * all, b.in.images[k], all);
        if (act_session_register_host(s->sess, placed, all * c->num_cams, e, sizeof e)) {
            act_serve_log(s, "warm-up: frames in registered memory: %s; frames will be copied", e);
            free(placed);
            placed = NULL;
        }
    }
    int passes = placed ? 2 : 1;
    double t0 = act_now();
    if (dev == ACT_DEVICE_CUDA)
        act_serve_say("warm-up: batch sizes %s (--batch-sizes), %d step(s) each: planned (algorithms measured "
                      "unless the algorithm cache has them)%s%s",
                      s->sizes_str, reps * passes,
                      act_session_uses_graphs(s->sess) ? ", then captured as CUDA graphs" : ", no graphs (ACT_CUDA_GRAPHS=0)",
                      placed ? ", then again with frames read in place" : "");
    for (int pass = 0; pass < passes && !rc; pass++)
        for (int r = 0; r < reps * n_sizes && !rc && !atomic_load(&s->stop_flag); r++) {
            int n = sizes[r % n_sizes];
            if (dev == ACT_DEVICE_CUDA && n == 1 && (pass || r) && n_sizes > 1)
                act_serve_say("warm-up: %d of %d sweeps over the batch sizes done (%.1f s)",
                              pass * reps + r / n_sizes, passes * reps, act_now() - t0);
            act_inputs in;
            act_outputs out;
            memset(&in, 0, sizeof in);
            memset(&out, 0, sizeof out);
            in.batch = n;
            in.qpos = b.in.qpos;
            for (int k = 0; k < c->num_cams; k++) {
                if (!pass) {
                    in.images[k] = b.in.images[k];
                    continue;
                }
                for (int i = 0; i < n; i++) b.items[(size_t)k * n + i] = placed + k * all + (size_t)i * frame;
                in.image_items[k] = b.items + (size_t)k * n;
            }
            out.actions = b.out;
            double t1 = act_now();
            if (act_run(s->sess, &in, &out, e, sizeof e)) {
                snprintf(err, errlen, "act-serve: warm-up at batch %d%s failed: %s", n,
                         pass ? " (frames in place)" : "", e);
                rc = -1;
            }
            step_s = act_now() - t1;
        }
    if (placed) {
        act_session_unregister_host(s->sess, placed);
        free(placed);
    }
    /* the CPU's step time grows with the batch: the last batch-1 step says what a full batch may
     * cost here (an estimate: batch 1's time per row; a batch's rows cost a little less each), and
     * a request waits out the batches queued before its own */
    if (!rc && dev == ACT_DEVICE_CPU && reps == 2 && !atomic_load(&s->stop_flag)) {
        double full = s->o.max_batch * step_s;
        int ahead = (s->o.max_queue + s->o.max_batch - 1) / s->o.max_batch;   /* batches queued */
        act_serve_say("CPU: a step at batch 1 takes %.4f s here, so a full batch (--max-batch %d) about "
                      "%.2f s; a request waits for the batches queued before its own (the one running, or "
                      "up to %d with --max-queue %d full) and its own: keep clients' timeouts above that%s",
                      step_s, s->o.max_batch, full, ahead, s->o.max_queue,
                      2 * full > 10.0 ? " (two batches already pass ActClient's default 10 s: lower "
                                        "--max-batch or raise the timeouts)" : "");
    }
    bufs_free(&b);
    free(sizes);
    return rc;
}
