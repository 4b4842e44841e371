/* server.c - act-serve's I/O thread: sockets, frames, routing, drain (design: server.h).
 *
 * One level-triggered epoll set holds the client listener, the metrics listener, an eventfd
 * (woken by the inference thread when results are ready, by attach, and by stop) and every
 * connection. A connection reads a 12-byte header, checks magic, version, type and the payload
 * length against the limit the model implies, and only then grows its buffer to that length.
 * Framing errors close the connection after an ERROR reply (the stream cannot be resynchronized);
 * content errors answer ERROR and keep it. Replies queue per connection up to max_out_bytes; a
 * client that lets them pile up is dropped, so it never holds memory or the thread hostage.
 */
#define _GNU_SOURCE
#include "server_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CLOSING_LINGER_S 2.0       /* how long a refused client gets to read its ERROR */
#define READ_FRAMES_PER_WAKE 16    /* fairness: one busy client cannot starve the others */

double act_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void act_serve_log(const act_server *s, const char *fmt, ...)
{
    if (!s->o.verbose) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "act-serve: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void act_server_wake(act_server *s)
{
    uint64_t one = 1;
    ssize_t r = write(s->wakefd, &one, sizeof one);
    (void)r;   /* EAGAIN means the counter is already non-zero: the loop will wake anyway */
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

static int ep_set(act_server *s, int op, int fd, uint32_t events, uint64_t tag)
{
    struct epoll_event ev = { .events = events, .data.u64 = tag };
    return epoll_ctl(s->epfd, op, fd, &ev);
}

/* ---- connections ---- */
static act_conn *conn_lookup(act_server *s, uint32_t slot, uint32_t gen)
{
    if (slot >= (uint32_t)s->o.max_clients) return NULL;
    act_conn *c = &s->conns[slot];
    return c->fd >= 0 && c->gen == gen ? c : NULL;
}

static void conn_close(act_server *s, act_conn *c, int dropped, const char *why)
{
    uint32_t slot = (uint32_t)(c - s->conns);
    if (why) act_serve_log(s, "%s: closing connection: %s", c->peer, why);
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    c->gen++;
    pthread_mutex_lock(&s->mu);
    if (c->handshaken) s->n_ready_conns--;
    if (c->inflight > 0) s->n_busy_conns--;
    pthread_cond_signal(&s->cv);   /* fewer clients to wait for: a pending batch may go now */
    pthread_mutex_unlock(&s->mu);
    while (c->out_head) {
        act_out *o = c->out_head;
        c->out_head = o->next;
        free(o->p);
        free(o);
    }
    c->out_tail = NULL;
    free(c->in);
    c->in = NULL;
    c->in_cap = c->in_got = c->hdr_got = 0;
    c->have_hdr = c->handshaken = c->inflight = c->read_done = 0;
    c->events = 0;
    c->out_bytes = 0;
    if (c->closing) s->n_closing--;
    c->closing = 0;
    s->free_slots[s->n_free++] = (int)slot;
    s->n_open--;
    act_metrics_conn(&s->metrics, -1, dropped);
}

static void conn_update_events(act_server *s, act_conn *c)
{
    uint32_t ev = (c->read_done ? 0u : EPOLLIN) | (c->out_head ? EPOLLOUT : 0u);
    if (ev == c->events) return;
    c->events = ev;
    ep_set(s, EPOLL_CTL_MOD, c->fd, ev, ACT_TAG(TAG_CONN, c - s->conns));
}

/* Sends what the socket takes now. Returns -1 when the connection was closed. */
static int conn_flush(act_server *s, act_conn *c)
{
    while (c->out_head) {
        act_out *o = c->out_head;
        ssize_t n = send(c->fd, o->p + o->off, o->n - o->off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR) continue;
            conn_close(s, c, 0, strerror(errno));
            return -1;
        }
        o->off += (size_t)n;
        c->out_bytes -= (size_t)n;
        if (o->off < o->n) break;
        c->out_head = o->next;
        if (!c->out_head) c->out_tail = NULL;
        free(o->p);
        free(o);
    }
    if (!c->out_head && c->closing) {
        /* everything said: half-close and let the peer read the ERROR before we go */
        shutdown(c->fd, SHUT_WR);
    }
    if (!c->out_head && c->read_done && c->inflight == 0) {
        conn_close(s, c, 0, NULL);   /* the half-closed peer has every reply it was owed */
        return -1;
    }
    conn_update_events(s, c);
    return 0;
}

/* Queues a frame (taking ownership of p). Returns -1 when the connection was closed. */
static int conn_send(act_server *s, act_conn *c, uint8_t *p, size_t n)
{
    if (!p) {
        conn_close(s, c, 1, "out of memory building a reply");
        return -1;
    }
    if (c->out_bytes + n > s->o.max_out_bytes) {
        free(p);
        conn_close(s, c, 1, "client does not read its replies (output queue full)");
        return -1;
    }
    act_out *o = malloc(sizeof *o);
    if (!o) {
        free(p);
        conn_close(s, c, 1, "out of memory queueing a reply");
        return -1;
    }
    o->next = NULL;
    o->p = p;
    o->n = n;
    o->off = 0;
    int backlog = c->out_head != NULL;
    if (c->out_tail) c->out_tail->next = o;
    else c->out_head = o;
    c->out_tail = o;
    c->out_bytes += n;
    /* with replies already waiting the socket is full: EPOLLOUT will say when it drains */
    return backlog ? 0 : conn_flush(s, c);
}

static void audit_line(act_server *s, act_conn *c, uint64_t id, int code, const act_req *r)
{
    if (!s->audit) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    fprintf(s->audit, "{\"ts\":%lld.%06ld,\"peer\":\"%s\",\"client\":\"%s\",\"id\":%llu,\"status\":\"%s\"",
            (long long)ts.tv_sec, ts.tv_nsec / 1000, c->peer, c->client, (unsigned long long)id,
            code ? act_err_code_name(code) : "ok");
    if (r && !code)
        fprintf(s->audit, ",\"batch\":%d,\"queue_ms\":%.3f,\"infer_ms\":%.3f,\"total_ms\":%.3f",
                r->batch, 1e3 * (r->t_start - r->t_arrive), 1e3 * (r->t_end - r->t_start),
                1e3 * (act_now() - r->t_arrive));
    fputs("}\n", s->audit);
    fflush(s->audit);
}

/* Answers ERROR. fatal: the stream is unusable; say why, then close once the reply is out. */
static int conn_error(act_server *s, act_conn *c, uint64_t id, int code, const char *msg, int fatal)
{
    size_t n;
    act_metrics_error(&s->metrics, code);
    act_serve_log(s, "%s: error %s: %s", c->peer, act_err_code_name(code), msg);
    if (fatal) {
        c->closing = 1;
        c->closing_deadline = act_now() + CLOSING_LINGER_S;
        s->n_closing++;
        act_metrics_conn(&s->metrics, 0, 1);
    }
    uint8_t *f = act_proto_build_error(id, code, msg, &n);
    return conn_send(s, c, f, n);
}

static int on_hello(act_server *s, act_conn *c, const uint8_t *p, uint32_t len)
{
    act_hello h;
    char msg[512];
    int code = act_proto_parse_hello(p, len, &h, msg, sizeof msg);
    if (!code && c->handshaken) {
        code = ACT_E_MALFORMED;
        snprintf(msg, sizeof msg, "HELLO: this connection has already agreed its contract");
    }
    if (!code && atomic_load(&s->draining)) {
        code = ACT_E_SHUTTING_DOWN;
        snprintf(msg, sizeof msg, "server is draining; connect to another replica");
    }
    if (!code) code = act_proto_check_contract(s->cfg, &h, msg, sizeof msg);
    if (code) return conn_error(s, c, 0, code, msg, 1);
    snprintf(c->client, sizeof c->client, "%s", h.client_name);
    c->handshaken = 1;
    pthread_mutex_lock(&s->mu);
    s->n_ready_conns++;
    pthread_mutex_unlock(&s->mu);
    uint8_t *f = malloc(s->info_len);
    if (f) memcpy(f, s->info_frame, s->info_len);
    return conn_send(s, c, f, s->info_len);
}

static int on_predict(act_server *s, act_conn *c, const uint8_t *p, uint32_t len)
{
    char msg[512];
    uint64_t id = 0;
    const act_config *cfg = s->cfg;
    act_metrics_request(&s->metrics);
    for (int i = 0; i < 8 && (uint32_t)i < len; i++) id |= (uint64_t)p[i] << (8 * i);
    if (atomic_load(&s->draining)) {
        audit_line(s, c, id, ACT_E_SHUTTING_DOWN, NULL);
        return conn_error(s, c, id, ACT_E_SHUTTING_DOWN, "server is draining; retry on another replica", 0);
    }
    if (s->inflight >= s->o.max_queue || c->inflight >= s->o.max_inflight_per_conn) {
        snprintf(msg, sizeof msg, "server busy: %d requests queued (limit %d), %d from this connection (limit %d)",
                 s->inflight, s->o.max_queue, c->inflight, s->o.max_inflight_per_conn);
        audit_line(s, c, id, ACT_E_OVERLOADED, NULL);
        return conn_error(s, c, id, ACT_E_OVERLOADED, msg, 0);
    }
    size_t chunk = (size_t)cfg->pred_horizon * cfg->action_dim * sizeof(float);
    act_req *r = calloc(1, sizeof *r + chunk);
    if (!r) return conn_error(s, c, id, ACT_E_INTERNAL, "out of memory for a request", 0);
    int code = act_proto_parse_predict(cfg, p, len, &r->p, msg, sizeof msg);
    if (code) {
        free(r);
        audit_line(s, c, id, code, NULL);
        return conn_error(s, c, id, code, msg, 0);
    }
    r->slot = (uint32_t)(c - s->conns);
    r->gen = c->gen;
    r->t_arrive = act_now();
    s->inflight++;
    act_metrics_inflight(&s->metrics, 1);
    pthread_mutex_lock(&s->mu);
    if (c->inflight++ == 0) s->n_busy_conns++;
    if (s->pend_tail) s->pend_tail->next = r;
    else s->pend_head = r;
    s->pend_tail = r;
    s->n_pending++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int on_frame(act_server *s, act_conn *c)
{
    const uint8_t *p = c->in;
    uint32_t len = c->fh.len;
    switch (c->fh.type) {
    case ACT_MSG_HELLO: return on_hello(s, c, p, len);
    case ACT_MSG_PREDICT: return on_predict(s, c, p, len);
    case ACT_MSG_PING: {
        size_t n;
        uint64_t nonce = 0;
        if (len != 8) return conn_error(s, c, 0, ACT_E_MALFORMED, "PING: payload must be 8 bytes", 0);
        for (int i = 0; i < 8; i++) nonce |= (uint64_t)p[i] << (8 * i);
        uint8_t *f = act_proto_build_pong(nonce, &n);
        return conn_send(s, c, f, n);
    }
    default: return 0;   /* unreachable: types are checked with the header */
    }
}

/* Header complete: decide whether the payload may be read at all. */
static int on_header(act_server *s, act_conn *c)
{
    char msg[256];
    int code = act_proto_parse_hdr(c->hdr, &c->fh, msg, sizeof msg);
    if (code) return conn_error(s, c, 0, code, msg, 1);
    int t = c->fh.type;
    if (t != ACT_MSG_HELLO && t != ACT_MSG_PREDICT && t != ACT_MSG_PING) {
        snprintf(msg, sizeof msg, "message type %d is not one a client may send (HELLO=1, PREDICT=3, PING=6)", t);
        return conn_error(s, c, 0, ACT_E_BAD_TYPE, msg, 1);
    }
    if (t == ACT_MSG_PREDICT && !c->handshaken)
        return conn_error(s, c, 0, ACT_E_NO_HELLO, "PREDICT before HELLO: send HELLO first", 1);
    uint32_t max = act_proto_max_payload(s->cfg, t, c->handshaken);
    if (c->fh.len > max) {
        snprintf(msg, sizeof msg, "frame payload of %u bytes exceeds the limit of %u for this message type and model",
                 c->fh.len, max);
        return conn_error(s, c, 0, ACT_E_TOO_LARGE, msg, 1);
    }
    if (c->fh.len > c->in_cap) {
        uint8_t *b = realloc(c->in, c->fh.len);
        if (!b) return conn_error(s, c, 0, ACT_E_INTERNAL, "out of memory for a frame", 1);
        c->in = b;
        c->in_cap = c->fh.len;
    }
    c->have_hdr = 1;
    c->in_got = 0;
    return 0;
}

static void conn_read(act_server *s, act_conn *c)
{
    if (c->closing) {   /* refused: discard what it still sends until it hangs up */
        uint8_t sink[4096];
        ssize_t n;
        while ((n = recv(c->fd, sink, sizeof sink, MSG_DONTWAIT)) > 0) {}
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            conn_close(s, c, 0, NULL);
        return;
    }
    for (int frames = 0; frames < READ_FRAMES_PER_WAKE;) {
        int in_payload = c->have_hdr;
        ssize_t n = in_payload ? recv(c->fd, c->in + c->in_got, c->fh.len - c->in_got, MSG_DONTWAIT)
                               : recv(c->fd, c->hdr + c->hdr_got, ACT_PROTO_HDR - c->hdr_got, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == EINTR) continue;
            conn_close(s, c, 0, strerror(errno));
            return;
        }
        if (n == 0) {
            if (!in_payload && !c->hdr_got && (c->inflight > 0 || c->out_head)) {
                c->read_done = 1;   /* half-closed after whole frames: answer them, then close */
                conn_update_events(s, c);
                return;
            }
            conn_close(s, c, 0, in_payload || c->hdr_got ? "client disconnected mid-frame" : NULL);
            return;
        }
        if (!in_payload) {
            c->hdr_got += (size_t)n;
            if (c->hdr_got < ACT_PROTO_HDR) continue;
            c->hdr_got = 0;
            if (on_header(s, c) || c->closing) return;
            if (c->fh.len) continue;   /* an empty payload is complete with its header */
        } else {
            c->in_got += (size_t)n;
            if (c->in_got < c->fh.len) continue;
        }
        c->have_hdr = 0;
        frames++;
        if (on_frame(s, c) || c->closing) return;
    }
}

static void do_accept(act_server *s)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                /* out of descriptors: free the spare, take the connection and refuse it, so the
                 * listener does not stay readable and spin the loop */
                close(s->spare_fd);
                fd = accept(s->lfd, NULL, NULL);
                if (fd >= 0) close(fd);
                s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                act_serve_log(s, "out of file descriptors: refused a connection");
                continue;
            }
            return;   /* EAGAIN, or an aborted handshake: nothing more to take now */
        }
        if (atomic_load(&s->draining) || s->n_free == 0) {
            /* say why in one best-effort send: a fresh socket's buffer always takes it */
            char msg[128];
            size_t n;
            snprintf(msg, sizeof msg, atomic_load(&s->draining) ? "server is draining; connect to another replica"
                                                                  : "max clients (%d) reached; try another replica",
                     s->o.max_clients);
            uint8_t *f = act_proto_build_error(0, atomic_load(&s->draining) ? ACT_E_SHUTTING_DOWN : ACT_E_OVERLOADED,
                                               msg, &n);
            if (f && send(fd, f, n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) act_serve_log(s, "refusing a client: %s", strerror(errno));
            free(f);
            close(fd);
            act_serve_log(s, "%s: refused a connection", msg);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int slot = s->free_slots[--s->n_free];
        act_conn *c = &s->conns[slot];
        c->fd = fd;
        char addr[INET6_ADDRSTRLEN] = "?";
        int port = 0;
        if (ss.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, addr, sizeof addr);
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, addr, sizeof addr);
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
        snprintf(c->peer, sizeof c->peer, "%s:%d", addr, port);
        c->client[0] = 0;
        s->n_open++;
        act_metrics_conn(&s->metrics, 1, 0);
        c->events = EPOLLIN;
        if (ep_set(s, EPOLL_CTL_ADD, fd, EPOLLIN, ACT_TAG(TAG_CONN, slot))) conn_close(s, c, 0, strerror(errno));
    }
}

/* Routes finished requests to their connections. */
static void deliver_done(act_server *s)
{
    pthread_mutex_lock(&s->mu);
    act_req *r = s->done_head;
    s->done_head = s->done_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    const act_config *cfg = s->cfg;
    while (r) {
        act_req *next = r->next;
        s->inflight--;
        act_metrics_inflight(&s->metrics, -1);
        act_conn *c = conn_lookup(s, r->slot, r->gen);
        if (c && !c->closing) {
            pthread_mutex_lock(&s->mu);
            if (--c->inflight == 0) s->n_busy_conns--;
            pthread_mutex_unlock(&s->mu);
            audit_line(s, c, r->p.request_id, r->code, r);
            if (r->code) {
                conn_error(s, c, r->p.request_id, r->code, r->msg, 0);
            } else {
                act_result_hdr h = { r->p.request_id, r->p.actions ? ACT_RESULT_POSTERIOR : 0u, (uint32_t)r->batch,
                                     (uint32_t)lround(1e6 * (r->t_start - r->t_arrive)),
                                     (uint32_t)lround(1e6 * (r->t_end - r->t_start)), r->p.actions ? r->kl : NAN };
                size_t n;
                act_metrics_result(&s->metrics, r->t_start - r->t_arrive);
                uint8_t *f = act_proto_build_result(&h, r->chunk, cfg->pred_horizon, cfg->action_dim, &n);
                conn_send(s, c, f, n);
            }
        }
        act_predict_free(&r->p);
        free(r);
        r = next;
    }
}

static void begin_drain(act_server *s)
{
    if (atomic_exchange(&s->draining, 1)) return;
    act_serve_log(s, "draining: %d requests in flight, %d connections", s->inflight, s->n_open);
    if (s->lfd >= 0) {
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->lfd, NULL);
        close(s->lfd);
        s->lfd = -1;
    }
}

static int drained(act_server *s)
{
    if (s->inflight > 0) return 0;
    for (int i = 0; i < s->o.max_clients; i++)
        if (s->conns[i].fd >= 0 && s->conns[i].out_head) return 0;
    return 1;
}

static void expire_closing(act_server *s, double now)
{
    if (!s->n_closing) return;
    for (int i = 0; i < s->o.max_clients; i++) {
        act_conn *c = &s->conns[i];
        if (c->fd >= 0 && c->closing && now > c->closing_deadline) conn_close(s, c, 0, NULL);
    }
}

static void *io_main(void *arg)
{
    act_server *s = arg;
    struct epoll_event evs[256];
    double drain_deadline = 0;
    for (;;) {
        int timeout = s->n_closing || atomic_load(&s->draining) ? 100 : 1000;
        int n = epoll_wait(s->epfd, evs, 256, timeout);
        if (n < 0 && errno != EINTR) {
            act_serve_log(s, "epoll_wait: %s", strerror(errno));
            s->io_rc = -1;
            break;
        }
        for (int i = 0; i < n; i++) {
            uint32_t kind = (uint32_t)(evs[i].data.u64 >> 32), slot = (uint32_t)evs[i].data.u64;
            if (kind == TAG_WAKE) {
                uint64_t v;
                ssize_t r = read(s->wakefd, &v, sizeof v);
                (void)r;
                if (atomic_load(&s->attached) && !atomic_load(&s->ready) && s->lfd >= 0 && !s->stop_flag) {
                    ep_set(s, EPOLL_CTL_ADD, s->lfd, EPOLLIN, ACT_TAG(TAG_LISTEN, 0));
                    atomic_store(&s->ready, 1);
                }
                if (atomic_load(&s->attached)) deliver_done(s);
            } else if (kind == TAG_LISTEN) {
                if (s->lfd >= 0) do_accept(s);
            } else if (kind == TAG_METRICS) {
                act_http_accept(s);
            } else if (kind == TAG_HTTP) {
                act_http_read(s, (int)slot);
            } else if (kind == TAG_CONN) {
                act_conn *c = &s->conns[slot];
                if (c->fd < 0) continue;
                if (c->read_done && (evs[i].events & (EPOLLERR | EPOLLHUP))) {
                    conn_close(s, c, 0, "client vanished before its replies");
                    continue;
                }
                if (evs[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) {
                    if (conn_flush(s, c)) continue;
                }
                if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) conn_read(s, c);
            }
        }
        double now = act_now();
        expire_closing(s, now);
        act_http_expire(s, now);
        if (s->stop_flag && !atomic_load(&s->draining)) {
            begin_drain(s);
            drain_deadline = now + 1e-3 * s->o.drain_timeout_ms;
        }
        if (atomic_load(&s->draining) && (drained(s) || now > drain_deadline)) {
            if (!drained(s)) act_serve_log(s, "drain timeout: %d requests still in flight", s->inflight);
            break;
        }
    }
    return NULL;
}

int act_server_create(const act_server_opts *opts, act_server **out, char *err, size_t errlen)
{
    *out = NULL;
    if (opts->max_batch < 1 || opts->max_clients < 1 || opts->max_queue < 1 || opts->max_wait_us < 0 ||
        opts->max_inflight_per_conn < 1 || opts->max_out_bytes < 4096)
        return fail(err, errlen, "act-serve: max-batch, max-clients, max-queue and per-connection limits must be >= 1, "
                                 "max-wait-us >= 0, max-out-bytes >= 4096");
    act_server *s = calloc(1, sizeof *s);
    if (!s) return fail(err, errlen, "act-serve: out of memory");
    s->o = *opts;
    snprintf(s->host, sizeof s->host, "%s", opts->host ? opts->host : "127.0.0.1");
    s->o.host = s->host;
    s->lfd = s->mfd = s->epfd = s->wakefd = s->spare_fd = -1;
    for (int i = 0; i < ACT_HTTP_SLOTS; i++) s->http[i].fd = -1;
    act_metrics_init(&s->metrics);
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->conns = calloc((size_t)opts->max_clients, sizeof *s->conns);
    s->free_slots = malloc((size_t)opts->max_clients * sizeof *s->free_slots);
    if (!s->conns || !s->free_slots) {
        act_server_free(s);
        return fail(err, errlen, "act-serve: out of memory for %d connection slots", opts->max_clients);
    }
    for (int i = 0; i < opts->max_clients; i++) {
        s->conns[i].fd = -1;
        s->free_slots[i] = opts->max_clients - 1 - i;
    }
    s->n_free = opts->max_clients;
    if (opts->audit_log) {
        snprintf(s->audit_path, sizeof s->audit_path, "%s", opts->audit_log);
        s->o.audit_log = s->audit_path;
        s->audit = fopen(opts->audit_log, "a");
        if (!s->audit) {
            int e = errno;
            act_server_free(s);
            return fail(err, errlen, "act-serve: cannot open audit log '%s': %s", opts->audit_log, strerror(e));
        }
    }
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    s->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->epfd < 0 || s->wakefd < 0) {
        act_server_free(s);
        return fail(err, errlen, "act-serve: epoll/eventfd: %s", strerror(errno));
    }
    if ((s->lfd = listen_on(s->host, opts->port, &s->port, err, errlen)) < 0) {
        act_server_free(s);
        return -1;
    }
    if (opts->metrics_port >= 0) {
        if ((s->mfd = listen_on(s->host, opts->metrics_port, &s->mport, err, errlen)) < 0) {
            act_server_free(s);
            return -1;
        }
        ep_set(s, EPOLL_CTL_ADD, s->mfd, EPOLLIN, ACT_TAG(TAG_METRICS, 0));
    }
    ep_set(s, EPOLL_CTL_ADD, s->wakefd, EPOLLIN, ACT_TAG(TAG_WAKE, 0));
    if (pthread_create(&s->io_thread, NULL, io_main, s)) {
        act_server_free(s);
        return fail(err, errlen, "act-serve: cannot start the I/O thread");
    }
    s->io_started = 1;
    *out = s;
    return 0;
}

int act_server_attach(act_server *s, const act_model *m, act_session *sess, act_device device,
                      char *err, size_t errlen)
{
    s->model = m;
    s->sess = sess;
    s->cfg = act_model_config(m);
    snprintf(s->device, sizeof s->device, "%s", act_session_device_name(sess));
    s->info_frame = act_proto_build_info(s->cfg, s->o.max_batch, s->device, &s->info_len);
    if (!s->info_frame) return fail(err, errlen, "act-serve: out of memory");
    if (act_infer_warmup(s, device, err, errlen)) return -1;
    if (s->stop_flag) return fail(err, errlen, "act-serve: stopped before the model was ready");
    if (act_infer_start(s, err, errlen)) return -1;
    atomic_store(&s->attached, 1);
    act_server_wake(s);
    return 0;
}

void act_server_stop(act_server *s)
{
    s->stop_flag = 1;
    act_server_wake(s);
}

int act_server_stopping(const act_server *s) { return s->stop_flag != 0; }
int act_server_port(const act_server *s) { return s->port; }
int act_server_metrics_port(const act_server *s) { return s->mport; }

int act_server_wait(act_server *s)
{
    if (s->io_started) {
        pthread_join(s->io_thread, NULL);
        s->io_started = 0;
    }
    act_infer_stop(s);
    deliver_done(s);   /* anything finished after the loop ended is released, not leaked */
    return s->io_rc;
}

void act_server_free(act_server *s)
{
    if (!s) return;
    if (s->io_started) {
        act_server_stop(s);
        act_server_wait(s);
    }
    act_infer_stop(s);
    for (int i = 0; s->conns && i < s->o.max_clients; i++)
        if (s->conns[i].fd >= 0) conn_close(s, &s->conns[i], 0, NULL);
    act_http_close_all(s);
    for (act_req *r = s->pend_head, *n; r; r = n) {
        n = r->next;
        act_predict_free(&r->p);
        free(r);
    }
    if (s->lfd >= 0) close(s->lfd);
    if (s->mfd >= 0) close(s->mfd);
    if (s->epfd >= 0) close(s->epfd);
    if (s->wakefd >= 0) close(s->wakefd);
    if (s->spare_fd >= 0) close(s->spare_fd);
    if (s->audit) fclose(s->audit);
    free(s->info_frame);
    free(s->conns);
    free(s->free_slots);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    act_metrics_destroy(&s->metrics);
    free(s);
}
