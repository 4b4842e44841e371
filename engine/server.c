/* server.c - act-serve's lifecycle and I/O loops: listen, dispatch events, drain (design: server.h).
 *
 * Each I/O thread has a level-triggered epoll set with an eventfd (woken by the inference
 * thread when its results are ready, by a connection handed to it, by attach and by stop) and
 * its connections; the first one's also holds the client listeners and the metrics listener.
 * What a connection does with its bytes is server_conn.c, the HTTP side port http.c.
 * Drain: the listeners close, what is in flight is answered, then each loop ends.
 */
#define _GNU_SOURCE
#include "server_internal.h"
#include "pool.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static void serve_vlog(const char *fmt, va_list ap)
{
    char line[1024];
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    line[n] = '\n';
    line[n + 1] = 0;
    /* one stdio call per line: several threads log, and stderr is unbuffered */
    flockfile(stderr);
    fputs("act-serve: ", stderr);
    fputs(line, stderr);
    funlockfile(stderr);
}

void act_serve_log(const act_server *s, const char *fmt, ...)
{
    if (!s->o.verbose) return;
    va_list ap;
    va_start(ap, fmt);
    serve_vlog(fmt, ap);
    va_end(ap);
}

void act_serve_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    serve_vlog(fmt, ap);
    va_end(ap);
}

void act_io_wake(act_io *io)
{
    uint64_t one = 1;
    ssize_t r = write(io->wakefd, &one, sizeof one);
    (void)r;   /* EAGAIN means the counter is already non-zero: the loop will wake anyway */
}

void act_server_wake(act_server *s)
{
    for (int i = 0; i < s->n_io; i++) act_io_wake(&s->io[i]);
}

/* I/O threads when opts ask for 0: one per four cores, at most 4 (one thread received ~9-10k
 * TCP requests/s of 590 KB frames on the project's 2-vCPU VM: bench/RESULTS.md, session 9) */
static int auto_io_threads(void)
{
    long n = act_pool_cores() / 4;   /* the usable cores: an affinity mask or CPU quota counts */
    return n < 1 ? 1 : n > 4 ? 4 : (int)n;
}

act_server_opts act_server_default_opts(void)
{
    act_server_opts o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = 7070;
    o.metrics_port = -1;
    o.max_batch = 32;
    o.max_wait_us = 200;
    o.max_clients = 4096;
    o.max_queue = 256;
    o.max_inflight_per_conn = 32;
    o.max_out_bytes = 4u << 20;
    o.drain_timeout_ms = 10000;
    o.frame_timeout_ms = 30000;
    o.keepalive_s = 30;
    o.max_conn_age_s = 0;
    return o;
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int listen_on(const char *host, int port, int *bound, char *err, size_t errlen)
{
    struct addrinfo hints = { 0 }, *ai = NULL;
    char ps[16];
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g) return fail(err, errlen, "act-serve: cannot resolve host '%s': %s", host, gai_strerror(g));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0) {
        freeaddrinfo(ai);
        return fail(err, errlen, "act-serve: socket: %s", strerror(errno));
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 1024)) {
        int e = errno;
        freeaddrinfo(ai);
        close(fd);
        return fail(err, errlen, "act-serve: cannot listen on %s:%d: %s", host, port, strerror(e));
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

/* A Unix-socket listener at path. A socket file left by a server that is gone (connect is
 * refused) is replaced; a live one, or a path that is not a socket, is an error. */
static int listen_unix(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    struct stat st;
    if (strlen(path) >= sizeof a.sun_path)
        return fail(err, errlen, "act-serve: --unix '%s': longer than %zu bytes", path, sizeof a.sun_path - 1);
    memcpy(a.sun_path, path, strlen(path) + 1);
    if (!lstat(path, &st)) {
        if (!S_ISSOCK(st.st_mode))
            return fail(err, errlen, "act-serve: --unix '%s' exists and is not a socket; not removing it", path);
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int live = probe >= 0 && connect(probe, (struct sockaddr *)&a, sizeof a) == 0;
        if (probe >= 0) close(probe);
        if (live) return fail(err, errlen, "act-serve: --unix '%s': another server is listening there", path);
        unlink(path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail(err, errlen, "act-serve: socket(AF_UNIX): %s", strerror(errno));
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 1024)) {
        int e = errno;
        close(fd);
        return fail(err, errlen, "act-serve: cannot listen on Unix socket '%s': %s", path, strerror(e));
    }
    return fd;
}

static void close_listener(act_io *io, int *fd)
{
    if (*fd < 0) return;
    epoll_ctl(io->epfd, EPOLL_CTL_DEL, *fd, NULL);
    close(*fd);
    *fd = -1;
}

/* On each I/O thread once stop was asked; the first closes the listeners (in its epoll set). */
static void begin_drain(act_io *io)
{
    act_server *s = io->s;
    if (!atomic_exchange(&s->draining, 1))
        act_serve_log(s, "draining: %d requests in flight", atomic_load(&s->inflight));
    if (io->idx == 0) {
        close_listener(io, &s->lfd);
        close_listener(io, &s->ufd);
        atomic_store(&s->listeners_closed, 1);   /* no connection is handed over after this */
    }
}

/* May io's loop end once it is drained? Another I/O thread leaves only after the listeners are
 * closed (before that the first one may still hand it a connection); the first leaves only
 * after all the others, so that /healthz answers "draining" for as long as the drain lasts. */
static int may_leave(act_io *io)
{
    if (io->idx == 0) return atomic_load(&io->s->io_running) == 1;
    return atomic_load(&io->s->listeners_closed);
}

/* io's requests are all answered and its replies sent, and no connection waits to be taken */
static int drained(act_io *io)
{
    if (io->inflight > 0) return 0;
    for (int i = io->lo; i < io->hi; i++)
        if (io->s->conns[i].fd >= 0 && io->s->conns[i].out_head) return 0;
    pthread_mutex_lock(&io->s->mu);
    int handoffs = io->hand_head != NULL;
    pthread_mutex_unlock(&io->s->mu);
    return !handoffs;
}

/* Connections handed to io that it will not serve: it leaves past its drain deadline (once the
 * listeners are closed no more come), or the server is freed without a drain. */
static void drop_handoffs(act_io *io)
{
    pthread_mutex_lock(&io->s->mu);
    act_handoff *h = io->hand_head;
    io->hand_head = io->hand_tail = NULL;
    pthread_mutex_unlock(&io->s->mu);
    for (act_handoff *next; h; h = next) {
        next = h->next;
        close(h->fd);
        atomic_fetch_sub(&io->n_assigned, 1);
        free(h);
    }
}

static void *io_main(void *arg)
{
    act_io *io = arg;
    act_server *s = io->s;
    struct epoll_event evs[256];
    double drain_deadline = 0;
    int draining = 0;
    for (;;) {
        /* deadlines are checked by act_conn_expire on each wake-up: ten a second where an idle
         * connection's age may pass (--max-connection-age) or one is closing, else one */
        int timeout = io->n_closing || draining || s->o.max_conn_age_s ? 100 : 1000;
        int n = epoll_wait(io->epfd, evs, 256, timeout);
        if (n < 0 && errno != EINTR) {
            /* this thread's connections can no longer be served: the whole server stops, as
             * it did with a single I/O thread, instead of running on half alive */
            act_serve_log(s, "epoll_wait on I/O thread %d: %s; stopping", io->idx + 1, strerror(errno));
            io->rc = -1;
            act_server_stop(s);
            begin_drain(io);   /* the first thread closes the listeners: the others may leave */
            break;
        }
        int tcp_ready = 0, unix_ready = 0;
        for (int i = 0; i < n; i++) {
            uint32_t kind = (uint32_t)(evs[i].data.u64 >> 32), slot = (uint32_t)evs[i].data.u64;
            if (kind == TAG_WAKE) {
                uint64_t v;
                ssize_t r = read(io->wakefd, &v, sizeof v);
                (void)r;
                if (io->idx == 0 && atomic_load(&s->attached) && !atomic_load(&s->ready) && s->lfd >= 0 &&
                    !atomic_load(&s->stop_flag)) {
                    act_ep_set(io, EPOLL_CTL_ADD, s->lfd, EPOLLIN, ACT_TAG(TAG_LISTEN, LISTEN_TCP));
                    if (s->ufd >= 0) act_ep_set(io, EPOLL_CTL_ADD, s->ufd, EPOLLIN, ACT_TAG(TAG_LISTEN, LISTEN_UNIX));
                    atomic_store(&s->ready, 1);
                }
                act_conn_take(io);
                if (atomic_load(&s->attached)) act_deliver_done(io);
            } else if (kind == TAG_LISTEN) {
                if (slot == LISTEN_UNIX) unix_ready = 1;
                else tcp_ready = 1;
            } else if (kind == TAG_METRICS) {
                act_http_accept(s);
            } else if (kind == TAG_HTTP) {
                act_http_read(s, (int)slot);
            } else if (kind == TAG_CONN) {
                act_conn *c = &s->conns[slot];
                if (c->fd < 0) continue;
                if (c->read_done && (evs[i].events & (EPOLLERR | EPOLLHUP))) {
                    act_conn_close(io, c, 0, "client vanished before its replies");
                    continue;
                }
                if (evs[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) {
                    if (act_conn_flush(io, c)) continue;
                }
                if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) act_conn_read(io, c);
            }
        }
        /* accept after this round's hang-ups are handled: the slots they free go to the new
         * connections instead of a max-clients refusal */
        if (tcp_ready && s->lfd >= 0) act_conn_accept(io, s->lfd, 0);
        if (unix_ready && s->ufd >= 0) act_conn_accept(io, s->ufd, 1);
        double now = act_now();
        act_conn_expire(io, now);
        if (io->idx == 0) act_http_expire(s, now);
        if (atomic_load(&s->stop_flag) && !draining) {
            begin_drain(io);
            draining = 1;
            drain_deadline = now + 1e-3 * s->o.drain_timeout_ms;
        }
        /* may_leave first: once the listeners are closed, every hand-off to io is in its list,
         * where drained() looks */
        if (draining && ((may_leave(io) && drained(io)) || now > drain_deadline)) {
            if (!drained(io))
                act_serve_log(s, "drain timeout: %d requests still in flight on I/O thread %d", io->inflight, io->idx + 1);
            break;
        }
    }
    drop_handoffs(io);
    atomic_fetch_sub(&s->io_running, 1);
    act_io_wake(&s->io[0]);   /* the first may be waiting for the others to leave */
    return NULL;
}

/* The I/O threads' state: the connection slots split into n_io ranges, an epoll set and eventfd
 * each (threads are started by the caller). */
static int io_init(act_server *s, int n_io, char *err, size_t errlen)
{
    int maxc = s->o.max_clients;
    if (n_io > ACT_IO_MAX) n_io = ACT_IO_MAX;
    if (n_io > maxc) n_io = maxc;
    int per = (maxc + n_io - 1) / n_io;
    n_io = (maxc + per - 1) / per;   /* every thread has at least one slot (act_io_of) */
    s->io = calloc((size_t)n_io, sizeof *s->io);
    if (!s->io) return fail(err, errlen, "act-serve: out of memory");
    s->n_io = n_io;
    s->io_per = per;
    for (int i = 0; i < n_io; i++) {   /* first what act_server_free needs of every entry */
        s->io[i].s = s;
        s->io[i].idx = i;
        s->io[i].epfd = s->io[i].wakefd = -1;
    }
    for (int i = 0; i < n_io; i++) {
        act_io *io = &s->io[i];
        io->lo = i * per;
        io->hi = io->lo + per < maxc ? io->lo + per : maxc;
        io->pool_max = (s->o.max_queue + n_io - 1) / n_io;
        atomic_init(&io->n_assigned, 0);
        io->free_slots = malloc((size_t)(io->hi - io->lo) * sizeof *io->free_slots);
        if (!io->free_slots) return fail(err, errlen, "act-serve: out of memory for %d connection slots", maxc);
        for (int k = io->lo; k < io->hi; k++) io->free_slots[io->n_free++] = io->hi - 1 - (k - io->lo);
        io->epfd = epoll_create1(EPOLL_CLOEXEC);
        io->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (io->epfd < 0 || io->wakefd < 0) return fail(err, errlen, "act-serve: epoll/eventfd: %s", strerror(errno));
        act_ep_set(io, EPOLL_CTL_ADD, io->wakefd, EPOLLIN, ACT_TAG(TAG_WAKE, 0));
    }
    return 0;
}

int act_server_create(const act_server_opts *opts, act_server **out, char *err, size_t errlen)
{
    *out = NULL;
    if (opts->max_batch < 1 || opts->max_batch > 65536 || opts->max_clients < 1 || opts->max_queue < 1 || opts->max_wait_us < 0 ||
        opts->max_inflight_per_conn < 1 || opts->max_out_bytes < 4096 || opts->frame_timeout_ms < 0 ||
        opts->keepalive_s < 0 || opts->keepalive_s > 86400 || opts->max_conn_age_s < 0 ||
        opts->io_threads < 0 || opts->io_threads > ACT_IO_MAX)
        return fail(err, errlen, "act-serve: max-batch (at most 65536, a session's limit), max-clients, max-queue and per-connection limits must be >= 1, "
                                 "max-wait-us, frame-timeout-ms and max-connection-age >= 0, keepalive-s 0..86400, max-out-bytes >= 4096, io-threads 0 (auto) "
                                 "to %d", ACT_IO_MAX);
    /* the sizes' syntax now, before the model loads; which "auto" means waits for the device */
    int *sizes = malloc(((size_t)opts->max_batch + 1) * sizeof *sizes);
    if (!sizes) return fail(err, errlen, "act-serve: out of memory");
    if (act_serve_batch_sizes(opts->batch_sizes, opts->max_batch, ACT_DEVICE_CPU, sizes, err, errlen) < 0) {
        free(sizes);
        return -1;
    }
    act_server *s = calloc(1, sizeof *s);
    char *spec = strdup(opts->batch_sizes ? opts->batch_sizes : "auto");
    if (!s || !spec) {
        free(sizes);
        free(s);
        free(spec);
        return fail(err, errlen, "act-serve: out of memory");
    }
    s->o = *opts;
    s->pad_to = sizes;
    s->o.batch_sizes = spec;
    snprintf(s->host, sizeof s->host, "%s", opts->host ? opts->host : "127.0.0.1");
    s->o.host = s->host;
    s->lfd = s->mfd = s->spare_fd = s->ufd = s->audit.fd = -1;
    for (int i = 0; i < ACT_HTTP_SLOTS; i++) s->http[i].fd = -1;
    act_metrics_init(&s->metrics);
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->conns = calloc((size_t)opts->max_clients, sizeof *s->conns);
    s->fair_seen = calloc((size_t)opts->max_clients, sizeof *s->fair_seen);
    s->fair_level = calloc((size_t)opts->max_batch + 1, sizeof *s->fair_level);
    if (!s->conns || !s->fair_seen || !s->fair_level) {
        act_server_free(s);
        return fail(err, errlen, "act-serve: out of memory for %d connection slots", opts->max_clients);
    }
    for (int i = 0; i < opts->max_clients; i++) s->conns[i].fd = -1;
    if (opts->audit_log) {
        if (act_audit_open(s, opts->audit_log, err, errlen)) {
            act_server_free(s);
            return -1;
        }
        s->o.audit_log = s->audit.path;
    }
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (io_init(s, opts->io_threads ? opts->io_threads : auto_io_threads(), err, errlen)) {
        act_server_free(s);
        return -1;
    }
    act_metrics_io_threads(&s->metrics, s->n_io);
    if ((s->lfd = listen_on(s->host, opts->port, &s->port, err, errlen)) < 0) {
        act_server_free(s);
        return -1;
    }
    if (opts->unix_path) {
        if ((s->ufd = listen_unix(opts->unix_path, err, errlen)) < 0) {
            act_server_free(s);
            return -1;
        }
        snprintf(s->unix_path, sizeof s->unix_path, "%s", opts->unix_path);
        s->o.unix_path = s->unix_path;
    }
    if (opts->metrics_port >= 0) {
        if ((s->mfd = listen_on(s->host, opts->metrics_port, &s->mport, err, errlen)) < 0) {
            act_server_free(s);
            return -1;
        }
        act_ep_set(&s->io[0], EPOLL_CTL_ADD, s->mfd, EPOLLIN, ACT_TAG(TAG_METRICS, 0));
    }
    atomic_store(&s->io_running, s->n_io);   /* before any thread can leave and count down */
    for (int i = 0; i < s->n_io; i++) {
        if (pthread_create(&s->io[i].thread, NULL, io_main, &s->io[i])) {
            /* the threads that never ran are not waited for */
            atomic_fetch_sub(&s->io_running, s->n_io - i);
            act_server_free(s);
            return fail(err, errlen, "act-serve: cannot start I/O thread %d", i + 1);
        }
        s->io[i].started = 1;
    }
    *out = s;
    return 0;
}

int act_server_io_threads(const act_server *s) { return s->n_io; }
double act_server_warmup_seconds(const act_server *s) { return s->warmup_s; }
const char *act_server_batch_sizes(const act_server *s) { return s->sizes_str; }

int act_server_attach(act_server *s, const act_model *m, act_session *sess, act_device device,
                      char *err, size_t errlen)
{
    s->model = m;
    s->sess = sess;
    s->cfg = act_model_config(m);
    snprintf(s->device, sizeof s->device, "%s", act_session_device_name(sess));
    s->info_frame = act_proto_build_info(s->cfg, s->o.max_batch, s->device, &s->info_len);
    s->req_bytes = sizeof(act_req) + (size_t)s->cfg->pred_horizon * s->cfg->action_dim * sizeof(float) +
                   act_proto_predict_bytes(s->cfg);
    if (!s->info_frame) return fail(err, errlen, "act-serve: out of memory");
    if (act_serve_batch_sizes(s->o.batch_sizes, s->o.max_batch, device, s->pad_to, err, errlen) < 0) return -1;
    act_serve_batch_sizes_str(s->pad_to, s->o.max_batch, s->sizes_str, sizeof s->sizes_str);
    double t0 = act_now();
    if (act_infer_warmup(s, device, err, errlen)) return -1;
    s->warmup_s = act_now() - t0;
    act_metrics_warmup(&s->metrics, s->warmup_s);
    if (atomic_load(&s->stop_flag)) return fail(err, errlen, "act-serve: stopped before the model was ready");
    act_memory mem;   /* after the warm-up, which has sized the workspaces for every batch */
    act_session_memory(sess, &mem);
    act_metrics_memory(&s->metrics, mem.weights, mem.activations, mem.workspace, mem.driver_held,
                       mem.driver_before, mem.driver_total);
    if (act_infer_start(s, err, errlen)) return -1;
    atomic_store(&s->attached, 1);
    act_server_wake(s);
    return 0;
}

void act_server_stop(act_server *s)
{
    atomic_store(&s->stop_flag, 1);
    act_server_wake(s);
}

int act_server_stopping(const act_server *s) { return atomic_load(&s->stop_flag) != 0; }
int act_server_port(const act_server *s) { return s->port; }
int act_server_metrics_port(const act_server *s) { return s->mport; }

int act_server_wait(act_server *s)
{
    int rc = 0;
    for (int i = 0; i < s->n_io; i++) {
        act_io *io = &s->io[i];
        if (io->started) {
            pthread_join(io->thread, NULL);
            io->started = 0;
        }
        rc |= io->rc;
    }
    act_conn_say_refusals(s);   /* the I/O threads are done: no refusal comes after this */
    act_infer_stop(s);
    /* anything finished after the loops ended is released, not leaked */
    for (int i = 0; i < s->n_io; i++) act_deliver_done(&s->io[i]);
    return rc;
}

void act_server_free(act_server *s)
{
    if (!s) return;
    int running = 0;
    for (int i = 0; i < s->n_io; i++) running |= s->io[i].started;
    if (running) {
        act_server_stop(s);
        act_server_wait(s);
    }
    act_infer_stop(s);
    for (int i = 0; s->io && i < s->n_io; i++) {
        act_io *io = &s->io[i];
        drop_handoffs(io);
        for (int k = io->lo; k < io->hi; k++)
            if (s->conns[k].fd >= 0) act_conn_close(io, &s->conns[k], 0, NULL);
    }
    if (s->io) act_http_close_all(s);
    for (int i = 0; s->io && i < s->n_io; i++) {
        for (act_req *r = s->io[i].req_pool, *n; r; r = n) {
            n = r->next;
            act_wire_free(s, r->wire);
            free(r);
        }
    }
    for (act_req *r = s->pend_head, *n; r; r = n) {
        n = r->next;
        act_shm_unref(s, r->shm);
        act_wire_free(s, r->wire);
        free(r);
    }
    act_infer_retire(s);   /* every block is unused now; the session is still the caller's */
    if (s->lfd >= 0) close(s->lfd);
    if (s->ufd >= 0) close(s->ufd);
    if (s->unix_path[0]) unlink(s->unix_path);
    if (s->mfd >= 0) close(s->mfd);
    for (int i = 0; s->io && i < s->n_io; i++) {
        if (s->io[i].epfd >= 0) close(s->io[i].epfd);
        if (s->io[i].wakefd >= 0) close(s->io[i].wakefd);
        free(s->io[i].free_slots);
    }
    free(s->io);
    if (s->spare_fd >= 0) close(s->spare_fd);
    act_audit_close(s);
    free(s->info_frame);
    free(s->pad_to);
    free((char *)s->o.batch_sizes);
    free(s->conns);
    free(s->fair_seen);
    free(s->fair_level);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    act_metrics_destroy(&s->metrics);
    free(s);
}
