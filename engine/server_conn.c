/* server_conn.c - act-serve connections: frames in, replies out (design: server.h).
 *
 * A connection reads a 12-byte header, checks magic, version, type and the payload length
 * against the limit the model implies, and only then grows its buffer to that length. Framing
 * errors close the connection after an ERROR reply (the stream cannot be resynchronized);
 * content errors answer ERROR and keep it. Replies queue per connection up to max_out_bytes; a
 * client that lets them pile up is dropped, so it never holds memory or the thread hostage. A
 * client that half-closes after whole frames still gets every reply it is owed. All of it runs
 * on the I/O thread that owns the connection: the first I/O thread accepts, and hands each new
 * connection to the thread with the fewest (act_conn_take), which reads it, answers it and
 * closes it from then on.
 */
#define _GNU_SOURCE
#include "server_internal.h"
#include "json.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CLOSING_LINGER_S 2.0       /* how long a refused client gets to read its ERROR */
#define READ_FRAMES_PER_WAKE 16    /* fairness: one busy client cannot starve the others */
/* what a queued reply costs beyond its bytes: its node and two allocator headers. Counted
 * against --max-out-bytes, so a client flooding PINGs it never reads (20-byte PONGs) is dropped
 * at the memory the limit names, not four times it. */
#define OUT_OVERHEAD (sizeof(act_out) + 32)

int act_ep_set(act_io *io, int op, int fd, uint32_t events, uint64_t tag)
{
    struct epoll_event ev = { .events = events, .data.u64 = tag };
    return epoll_ctl(io->epfd, op, fd, &ev);
}

/* A connection the batcher waits no longer for: a request out, and no more announced. A client
 * pipelining a burst (act_client's predict_many) marks every PREDICT but its last with
 * ACT_PREDICT_MORE, so its first request does not make it "all busy" and run a batch alone while
 * the rest are on their way (the window still ends at --max-wait-us). Under s->mu. */
static int conn_busy(const act_conn *c)
{
    return c->inflight > 0 && !c->more;
}

/* Sets a connection's requests out and its announced burst, keeping n_busy_conns its count of
 * busy connections. Under s->mu. */
static void conn_set(act_server *s, act_conn *c, int inflight, int more)
{
    int was_busy = conn_busy(c);
    c->inflight = inflight;
    c->more = more;
    s->n_busy_conns += conn_busy(c) - was_busy;
}

/* The burst a connection announced will not come (a request of it refused, an error, the client
 * half-closed): its requests out count as all it has, and the batcher stops waiting for more. */
static void conn_no_more(act_server *s, act_conn *c)
{
    pthread_mutex_lock(&s->mu);
    if (c->more) {
        conn_set(s, c, c->inflight, 0);
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

static act_conn *conn_lookup(act_io *io, uint32_t slot, uint32_t gen)
{
    if (slot < (uint32_t)io->lo || slot >= (uint32_t)io->hi) return NULL;
    act_conn *c = &io->s->conns[slot];
    return c->fd >= 0 && c->gen == gen ? c : NULL;
}

void act_conn_close(act_io *io, act_conn *c, int dropped, const char *why)
{
    act_server *s = io->s;
    uint32_t slot = (uint32_t)(c - s->conns);
    if (why) act_serve_log(s, "%s: closing connection: %s", c->peer, why);
    /* counted before the peer can see the close: /metrics may be served by another I/O thread */
    act_metrics_conn(&s->metrics, -1, dropped);
    epoll_ctl(io->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    uint32_t gen = c->gen++;
    /* its requests still waiting for a batch go too: nobody will read their results, and they
     * would hold --max-queue places and forward-pass rows from live clients (a worker pool that
     * times out and reconnects leaves a queue of them). Those in a running batch come back
     * through act_deliver_done, which drops their results. */
    act_req *dead = NULL;
    int n_dead = 0;
    pthread_mutex_lock(&s->mu);
    if (c->handshaken) s->n_ready_conns--;
    if (conn_busy(c)) s->n_busy_conns--;
    for (act_req **link = &s->pend_head, *prev = NULL; *link;) {
        act_req *r = *link;
        if (r->slot == slot && r->gen == gen) {
            *link = r->next;
            if (s->pend_tail == r) s->pend_tail = prev;
            s->n_pending--;
            r->next = dead;
            dead = r;
            n_dead++;
        } else {
            prev = r;
            link = &r->next;
        }
    }
    pthread_cond_signal(&s->cv);   /* fewer clients to wait for: a pending batch may go now */
    pthread_mutex_unlock(&s->mu);
    while (dead) {
        act_req *r = dead;
        dead = r->next;
        act_audit_line(s, c->peer, c->client, r->p.request_id, "abandoned", NULL);
        io->inflight--;
        atomic_fetch_sub(&s->inflight, 1);
        act_metrics_inflight(&s->metrics, -1);
        act_req_put(io, r);
    }
    if (n_dead) {
        act_metrics_abandoned(&s->metrics, n_dead);
        act_serve_log(s, "%s: %d queued requests of the closed connection dropped", c->peer, n_dead);
    }
    while (c->out_head) {
        act_out *o = c->out_head;
        c->out_head = o->next;
        free(o->p);
        free(o);
    }
    c->out_tail = NULL;
    act_wire_free(s, c->in);
    c->in = NULL;
    if (c->rx_fd >= 0) close(c->rx_fd);
    c->rx_fd = -1;
    act_shm_unref(s, c->shm);   /* requests still running keep their own references */
    c->shm = NULL;
    c->is_unix = 0;
    c->in_cap = c->in_got = c->hdr_got = 0;
    c->have_hdr = c->handshaken = c->inflight = c->read_done = c->more = 0;
    c->events = 0;
    c->frame_deadline = c->age_deadline = 0;
    c->out_bytes = 0;
    if (c->closing) io->n_closing--;
    c->closing = 0;
    io->free_slots[io->n_free++] = (int)slot;
    atomic_fetch_sub(&io->n_assigned, 1);
}

static void conn_update_events(act_io *io, act_conn *c)
{
    uint32_t ev = (c->read_done ? 0u : EPOLLIN) | (c->out_head ? EPOLLOUT : 0u);
    if (ev == c->events) return;
    c->events = ev;
    act_ep_set(io, EPOLL_CTL_MOD, c->fd, ev, ACT_TAG(TAG_CONN, c - io->s->conns));
}

/* --max-connection-age: a connection past its age that owes nothing (no request queued or
 * running, no reply unsent, no frame begun, no byte waiting unread in the socket, no burst
 * announced with ACT_PREDICT_MORE) is let go as a refused one is: the server half-closes
 * (the client's next call finds the end of the stream and reconnects, through the balancer, before
 * it sends), discards whatever crossed the FIN on its way in (that client sees the stream end
 * without a reply and sends it again: a predict is a pure function) and closes at the client's
 * end or after CLOSING_LINGER_S. A connection that always has requests out is never cut. */
static void conn_age_out(act_io *io, act_conn *c, double now)
{
    act_server *s = io->s;
    if (!c->age_deadline || now < c->age_deadline || c->closing || !c->handshaken || c->inflight ||
        c->out_head || c->have_hdr || c->hdr_got || c->read_done || c->more)
        return;
    /* its next frame already here (a reply went out on the wake-up that also brought it, or
     * between two pipelined frames of one read) would cross the FIN: it is read and answered */
    int unread = 0;
    if (ioctl(c->fd, FIONREAD, &unread) != 0 || unread > 0) return;
    act_serve_log(s, "%s: closing connection: older than --max-connection-age %d s", c->peer, s->o.max_conn_age_s);
    pthread_mutex_lock(&s->mu);   /* the batcher waits for its requests no longer */
    s->n_ready_conns--;
    c->handshaken = 0;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    c->frame_deadline = 0;
    c->closing = 1;
    c->closing_deadline = now + CLOSING_LINGER_S;
    io->n_closing++;
    shutdown(c->fd, SHUT_WR);
    act_metrics_conn_aged(&s->metrics);   /* after the FIN: whoever reads it may look for the end */
}

/* Sends what the socket takes now. Returns -1 when the connection was closed. */
int act_conn_flush(act_io *io, act_conn *c)
{
    while (c->out_head) {
        act_out *o = c->out_head;
        ssize_t n = send(c->fd, o->p + o->off, o->n - o->off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR) continue;
            act_conn_close(io, c, 0, strerror(errno));
            return -1;
        }
        o->off += (size_t)n;
        c->out_bytes -= (size_t)n;
        if (o->off < o->n) break;
        c->out_head = o->next;
        if (!c->out_head) c->out_tail = NULL;
        c->out_bytes -= OUT_OVERHEAD;
        free(o->p);
        free(o);
    }
    if (!c->out_head && c->closing) {
        /* everything said: half-close and let the peer read the ERROR before we go */
        shutdown(c->fd, SHUT_WR);
    }
    if (!c->out_head && c->read_done && c->inflight == 0) {
        act_conn_close(io, c, 0, NULL);   /* the half-closed peer has every reply it was owed */
        return -1;
    }
    if (!c->out_head && c->age_deadline) conn_age_out(io, c, act_now());
    conn_update_events(io, c);
    return 0;
}

/* Queues a frame (taking ownership of p). Returns -1 when the connection was closed. */
static int conn_send(act_io *io, act_conn *c, uint8_t *p, size_t n)
{
    if (!p) {
        act_conn_close(io, c, 1, "out of memory building a reply");
        return -1;
    }
    if (c->out_bytes + n + OUT_OVERHEAD > io->s->o.max_out_bytes) {
        free(p);
        act_conn_close(io, c, 1, "client does not read its replies (output queue full)");
        return -1;
    }
    act_out *o = malloc(sizeof *o);
    if (!o) {
        free(p);
        act_conn_close(io, c, 1, "out of memory queueing a reply");
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
    c->out_bytes += n + OUT_OVERHEAD;
    /* with replies already waiting the socket is full: EPOLLOUT will say when it drains */
    return backlog ? 0 : act_conn_flush(io, c);
}

static void audit_line(act_server *s, act_conn *c, uint64_t id, int code, const act_req *r)
{
    act_audit_line(s, c->peer, c->client, id, code ? act_err_code_name(code) : "ok", code ? NULL : r);
}

/* Answers ERROR. fatal: the stream is unusable; say why, then close once the reply is out. */
static int conn_error(act_io *io, act_conn *c, uint64_t id, int code, const char *msg, int fatal)
{
    act_server *s = io->s;
    size_t n;
    act_metrics_error(&s->metrics, code);
    act_serve_log(s, "%s: error %s: %s", c->peer, act_err_code_name(code), msg);
    conn_no_more(s, c);
    if (fatal) {
        c->closing = 1;
        c->closing_deadline = act_now() + CLOSING_LINGER_S;
        io->n_closing++;
        act_metrics_conn(&s->metrics, 0, 1);
    }
    uint8_t *f = act_proto_build_error(id, code, msg, &n);
    return conn_send(io, c, f, n);
}

static int on_hello(act_io *io, act_conn *c, const uint8_t *p, uint32_t len)
{
    act_server *s = io->s;
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
    if (code) return conn_error(io, c, 0, code, msg, 1);
    snprintf(c->client, sizeof c->client, "%s", h.client_name);
    c->handshaken = 1;
    pthread_mutex_lock(&s->mu);
    s->n_ready_conns++;
    pthread_mutex_unlock(&s->mu);
    uint8_t *f = malloc(s->info_len);
    if (f) memcpy(f, s->info_frame, s->info_len);
    return conn_send(io, c, f, s->info_len);
}

static act_req *req_get(act_io *io)
{
    act_server *s = io->s;
    act_req *r = io->req_pool;
    if (r) {
        io->req_pool = r->next;
        io->n_pool--;
    } else {
        size_t chunk = (size_t)s->cfg->pred_horizon * s->cfg->action_dim * sizeof(float);
        if (!(r = malloc(s->req_bytes))) return NULL;
        r->data = (uint8_t *)r->chunk + chunk;
        r->wire = NULL;
        r->wire_cap = 0;
    }
    uint8_t *data = r->data, *wire = r->wire;
    size_t wire_cap = r->wire_cap;
    memset(r, 0, sizeof *r);   /* the header only: data and chunk are overwritten before use */
    r->data = data;
    r->wire = wire;
    r->wire_cap = wire_cap;
    return r;
}

void act_req_put(act_io *io, act_req *r)
{
    act_shm_unref(io->s, r->shm);
    r->shm = NULL;
    if (io->n_pool >= io->pool_max) {
        act_wire_free(io->s, r->wire);
        free(r);
        return;
    }
    r->next = io->req_pool;
    io->req_pool = r;
    io->n_pool++;
}

static int on_predict(act_io *io, act_conn *c, uint8_t *p, uint32_t len)
{
    act_server *s = io->s;
    char msg[512];
    uint64_t id = 0;
    const act_config *cfg = s->cfg;
    act_metrics_request(&s->metrics);
    for (int i = 0; i < 8 && (uint32_t)i < len; i++) id |= (uint64_t)p[i] << (8 * i);
    if (atomic_load(&s->draining)) {
        audit_line(s, c, id, ACT_E_SHUTTING_DOWN, NULL);
        return conn_error(io, c, id, ACT_E_SHUTTING_DOWN, "server is draining; retry on another replica", 0);
    }
    /* the queue's limit holds for all I/O threads together: a place is reserved only while
     * the count is under it (compare-and-swap), so no refused request ever inflates it */
    int queued = atomic_load(&s->inflight);
    int busy = c->inflight >= s->o.max_inflight_per_conn;
    while (!busy && !(busy = queued >= s->o.max_queue) &&
           !atomic_compare_exchange_weak(&s->inflight, &queued, queued + 1)) {}
    if (busy) {
        snprintf(msg, sizeof msg, "server busy: %d requests queued (limit %d), %d from this connection (limit %d)",
                 queued, s->o.max_queue, c->inflight, s->o.max_inflight_per_conn);
        audit_line(s, c, id, ACT_E_OVERLOADED, NULL);
        return conn_error(io, c, id, ACT_E_OVERLOADED, msg, 0);
    }
    act_req *r = req_get(io);
    if (!r) {
        atomic_fetch_sub(&s->inflight, 1);
        audit_line(s, c, id, ACT_E_INTERNAL, NULL);
        return conn_error(io, c, id, ACT_E_INTERNAL, "out of memory for a request", 0);
    }
    int code = act_proto_parse_predict_shm(cfg, p, len, &r->p, r->data, c->shm ? c->shm->mem.p : NULL,
                                           c->shm ? c->shm->mem.bytes : 0, msg, sizeof msg);
    if (code) {
        atomic_fetch_sub(&s->inflight, 1);
        act_req_put(io, r);
        audit_line(s, c, id, code, NULL);
        return conn_error(io, c, id, code, msg, 0);
    }
    /* raw frames point into the receive buffer p (c->in): the request takes it, and the
     * connection reads its next frame into the buffer the block brought back from its last use */
    uint8_t *w = r->wire;
    size_t wcap = r->wire_cap;
    r->wire = c->in;
    r->wire_cap = c->in_cap;
    c->in = w;
    c->in_cap = wcap;
    r->shm = c->shm;   /* frames may point into it: it stays mapped until the request is back */
    act_shm_ref(r->shm);
    r->slot = (uint32_t)(c - s->conns);
    r->gen = c->gen;
    memcpy(r->peer, c->peer, sizeof r->peer);
    memcpy(r->client, c->client, sizeof r->client);
    r->t_arrive = act_now();
    io->inflight++;
    act_metrics_inflight(&s->metrics, 1);
    pthread_mutex_lock(&s->mu);
    conn_set(s, c, c->inflight + 1, (r->p.flags & ACT_PREDICT_MORE) != 0);
    if (s->pend_tail) s->pend_tail->next = r;
    else s->pend_head = r;
    s->pend_tail = r;
    s->n_pending++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* SHM_ATTACH: map the memfd that came with the frame; it replaces an earlier attachment (whose
 * mapping lives on while requests read from it). Errors keep the connection: the client can go
 * on sending frames inline. */
static int on_shm_attach(act_io *io, act_conn *c, const uint8_t *p, uint32_t len)
{
    act_server *s = io->s;
    char msg[256];
    uint64_t size;
    int fd = c->rx_fd;
    c->rx_fd = -1;
    int code = act_proto_parse_shm_attach(p, len, &size, msg, sizeof msg);
    if (!code && !c->is_unix) {
        code = ACT_E_BAD_SHM;
        snprintf(msg, sizeof msg, "SHM_ATTACH: a descriptor cannot travel over TCP; connect to the Unix socket "
                                  "(act-serve --unix PATH) to use shared memory");
    } else if (!code && fd < 0) {
        code = ACT_E_BAD_SHM;
        snprintf(msg, sizeof msg, "SHM_ATTACH: no file descriptor came with the message (send the memfd with "
                                  "SCM_RIGHTS in the same sendmsg)");
    }
    act_shm *m = NULL;
    if (!code) code = act_shm_map(fd, size, &m, msg, sizeof msg);
    if (fd >= 0) close(fd);   /* the mapping, if any, keeps the memory */
    if (code) return conn_error(io, c, 0, code, msg, 0);
    act_shm_unref(s, c->shm);
    c->shm = m;
    act_serve_log(s, "%s: attached %llu bytes of shared memory", c->peer, (unsigned long long)size);
    size_t n = 0;
    uint8_t *f = act_proto_build_shm_ok(size, &n);
    return conn_send(io, c, f, n);
}

static int on_frame(act_io *io, act_conn *c)
{
    uint8_t *p = c->in;
    uint32_t len = c->fh.len;
    switch (c->fh.type) {
    case ACT_MSG_HELLO: return on_hello(io, c, p, len);
    case ACT_MSG_PREDICT: return on_predict(io, c, p, len);
    case ACT_MSG_SHM_ATTACH: return on_shm_attach(io, c, p, len);
    case ACT_MSG_PING: {
        size_t n;
        uint64_t nonce = 0;
        if (len != 8) return conn_error(io, c, 0, ACT_E_MALFORMED, "PING: payload must be 8 bytes", 0);
        for (int i = 0; i < 8; i++) nonce |= (uint64_t)p[i] << (8 * i);
        uint8_t *f = act_proto_build_pong(nonce, &n);
        return conn_send(io, c, f, n);
    }
    default: return 0;   /* unreachable: types are checked with the header */
    }
}

/* Header complete: decide whether the payload may be read at all. */
static int on_header(act_io *io, act_conn *c)
{
    act_server *s = io->s;
    char msg[256];
    int code = act_proto_parse_hdr(c->hdr, &c->fh, msg, sizeof msg);
    if (code) return conn_error(io, c, 0, code, msg, 1);
    int t = c->fh.type;
    if (t != ACT_MSG_HELLO && t != ACT_MSG_PREDICT && t != ACT_MSG_PING && t != ACT_MSG_SHM_ATTACH) {
        snprintf(msg, sizeof msg, "message type %d is not one a client may send (HELLO=1, PREDICT=3, PING=6, SHM_ATTACH=8)", t);
        return conn_error(io, c, 0, ACT_E_BAD_TYPE, msg, 1);
    }
    if ((t == ACT_MSG_PREDICT || t == ACT_MSG_SHM_ATTACH) && !c->handshaken)
        return conn_error(io, c, 0, ACT_E_NO_HELLO, t == ACT_MSG_PREDICT ? "PREDICT before HELLO: send HELLO first"
                                                                         : "SHM_ATTACH before HELLO: send HELLO first", 1);
    uint32_t max = act_proto_max_payload(s->cfg, t, c->handshaken);
    if (c->fh.len > max) {
        snprintf(msg, sizeof msg, "frame payload of %u bytes exceeds the limit of %u for this message type and model",
                 c->fh.len, max);
        return conn_error(io, c, 0, ACT_E_TOO_LARGE, msg, 1);
    }
    if (c->fh.len > c->in_cap) {   /* nothing of the old buffer is kept: the payload is next */
        uint8_t *b = act_wire_alloc(c->fh.len);
        if (!b) return conn_error(io, c, 0, ACT_E_INTERNAL, "out of memory for a frame", 1);
        act_wire_free(s, c->in);
        c->in = b;
        c->in_cap = act_wire_of(b)->mem.bytes;
    }
    c->have_hdr = 1;
    c->in_got = 0;
    return 0;
}

/* recv, and on a Unix socket recvmsg, which also takes a descriptor passed with SCM_RIGHTS: the
 * frame being read keeps the first (SHM_ATTACH consumes it, any other frame drops it at its end);
 * more than one is closed at once. */
static ssize_t conn_recv(act_conn *c, void *buf, size_t n)
{
    if (!c->is_unix) return recv(c->fd, buf, n, MSG_DONTWAIT);
    union { struct cmsghdr h; char b[CMSG_SPACE(4 * sizeof(int))]; } ctl;
    struct iovec iov = { buf, n };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b };
    ssize_t got = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got < 0) return got;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
        size_t nfd = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
            if (c->rx_fd < 0) c->rx_fd = fd;
            else close(fd);
        }
    }
    return got;
}

/* --proxy-protocol: the PROXY header before anything else, read without taking a byte past its
 * end (the HELLO may follow in the same segment): what is there is peeked, and only the bytes
 * that belong to the header are taken. 1 = read (c->peer is now the client it names), 0 = not
 * yet whole, -1 = the connection was closed or is closing. */
static int conn_read_proxy(act_io *io, act_conn *c)
{
    act_server *s = io->s;
    char msg[320];
    ssize_t n;
    do n = recv(c->fd, c->proxy_buf + c->proxy_got, sizeof c->proxy_buf - c->proxy_got, MSG_PEEK | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n <= 0) {
        /* nothing sent at all: a balancer's plain TCP health check, not worth a line */
        act_conn_close(io, c, 0, n < 0 ? strerror(errno) : c->proxy_got ? "closed before its PROXY header was complete" : NULL);
        return -1;
    }
    size_t have = c->proxy_got + (size_t)n;
    long whole = act_proxy_scan(c->proxy_buf, have, msg, sizeof msg);
    size_t take = whole > 0 ? (size_t)whole - c->proxy_got : (size_t)n;
    char peer[64] = "";
    if (whole < 0 || (whole > 0 && act_proxy_peer(c->proxy_buf, (size_t)whole, peer, sizeof peer, msg, sizeof msg))) {
        c->proxy_wait = 0;   /* the ERROR goes out as frames do; what follows is discarded */
        conn_error(io, c, 0, ACT_E_MALFORMED, msg, 1);
        return -1;
    }
    uint8_t sink[ACT_PROXY_MAX];   /* the peeked bytes, taken now (the same bytes: nobody else reads) */
    ssize_t got;
    do got = recv(c->fd, sink, take, MSG_DONTWAIT);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)take) {
        act_conn_close(io, c, 0, got < 0 ? strerror(errno) : "a short read of peeked bytes");
        return -1;
    }
    c->proxy_got += take;
    if (whole == 0) return 0;
    c->proxy_wait = 0;
    if (peer[0]) {
        act_serve_log(s, "%s: PROXY header: the client is %s", c->peer, peer);
        snprintf(c->peer, sizeof c->peer, "%s", peer);
    }
    return 1;
}

void act_conn_read(act_io *io, act_conn *c)
{
    act_server *s = io->s;
    if (c->closing) {   /* refused: discard what it still sends until it hangs up */
        uint8_t sink[4096];
        ssize_t n;
        while ((n = recv(c->fd, sink, sizeof sink, MSG_DONTWAIT)) > 0) {}
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            act_conn_close(io, c, 0, NULL);
        return;
    }
    if (c->proxy_wait && conn_read_proxy(io, c) <= 0) return;
    for (int frames = 0; frames < READ_FRAMES_PER_WAKE;) {
        int in_payload = c->have_hdr;
        ssize_t n = in_payload ? conn_recv(c, c->in + c->in_got, c->fh.len - c->in_got)
                               : conn_recv(c, c->hdr + c->hdr_got, ACT_PROTO_HDR - c->hdr_got);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == EINTR) continue;
            act_conn_close(io, c, 0, strerror(errno));
            return;
        }
        if (n == 0) {
            if (!in_payload && !c->hdr_got && (c->inflight > 0 || c->out_head)) {
                c->read_done = 1;   /* half-closed after whole frames: answer them, then close */
                conn_no_more(io->s, c);
                conn_update_events(io, c);
                return;
            }
            act_conn_close(io, c, 0, in_payload || c->hdr_got ? "client disconnected mid-frame" : NULL);
            return;
        }
        if (!in_payload) {
            if (c->hdr_got == 0 && c->handshaken && s->o.frame_timeout_ms)
                c->frame_deadline = act_now() + 1e-3 * s->o.frame_timeout_ms;
            c->hdr_got += (size_t)n;
            if (c->hdr_got < ACT_PROTO_HDR) continue;
            c->hdr_got = 0;
            if (on_header(io, c) || c->closing) return;
            if (c->fh.len) continue;   /* an empty payload is complete with its header */
        } else {
            c->in_got += (size_t)n;
            if (c->in_got < c->fh.len) continue;
        }
        c->have_hdr = 0;
        frames++;
        if (on_frame(io, c) || c->closing) return;
        if (c->rx_fd >= 0) {   /* a descriptor sent with some other frame: not ours to keep */
            close(c->rx_fd);
            c->rx_fd = -1;
        }
        if (c->handshaken) c->frame_deadline = 0;   /* between frames a client may idle */
    }
}

/* The I/O thread with the fewest connections that has a slot left, which is promised to the
 * connection being accepted; NULL when every slot is taken. */
static act_io *pick_io(act_server *s)
{
    act_io *best = NULL;
    int least = 0;
    for (int i = 0; i < s->n_io; i++) {
        act_io *io = &s->io[i];
        int n = atomic_load(&io->n_assigned);
        if (n < io->hi - io->lo && (!best || n < least)) {
            best = io;
            least = n;
        }
    }
    if (best) atomic_fetch_add(&best->n_assigned, 1);
    return best;
}

/* A connection's share of --max-connection-age, 0.9-1.1, from its slot and generation mixed
 * (a hash finalizer: neighbouring slots, which the clients of a restart get all at once, land
 * far apart), so that clients that connected together do not all reconnect together again. */
static double age_spread(uint32_t slot, uint32_t gen)
{
    uint32_t h = slot * 0x9E3779B1u ^ gen * 0x85EBCA77u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    h *= 0x297A2D39u;
    h ^= h >> 15;
    return 0.9 + 0.2 * (double)(h % 1024u) / 1023.0;
}

/* Sets up an accepted connection in one of io's free slots (one was promised by pick_io). */
static void conn_open(act_io *io, int fd, int is_unix, const char *peer)
{
    act_server *s = io->s;
    int slot = io->free_slots[--io->n_free];
    act_conn *c = &s->conns[slot];
    c->fd = fd;
    c->is_unix = is_unix;
    c->rx_fd = -1;
    c->shm = NULL;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->client[0] = 0;
    double now = act_now();
    c->frame_deadline = s->o.frame_timeout_ms ? now + 1e-3 * s->o.frame_timeout_ms : 0;
    c->proxy_wait = s->o.proxy_protocol && !is_unix;
    c->proxy_got = 0;
    c->age_deadline = s->o.max_conn_age_s && !is_unix   /* no balancer places a Unix socket's */
        ? now + s->o.max_conn_age_s * age_spread((uint32_t)slot, c->gen)
        : 0;
    act_metrics_conn(&s->metrics, 1, 0);
    act_serve_log(s, "%s: connected (I/O thread %d of %d)", c->peer, io->idx + 1, s->n_io);
    c->events = EPOLLIN;
    if (act_ep_set(io, EPOLL_CTL_ADD, fd, EPOLLIN, ACT_TAG(TAG_CONN, slot))) act_conn_close(io, c, 0, strerror(errno));
}

void act_conn_take(act_io *io)
{
    act_server *s = io->s;
    pthread_mutex_lock(&s->mu);
    act_handoff *h = io->hand_head;
    io->hand_head = io->hand_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (h) {
        act_handoff *next = h->next;
        conn_open(io, h->fd, h->is_unix, h->peer);
        free(h);
        h = next;
    }
}

/* Gives a connection accepted on the first I/O thread to io: at once if it is that thread, else
 * through io's hand-off list (io sets it up when woken). */
static void conn_hand(act_io *from, act_io *io, int fd, int is_unix, const char *peer)
{
    act_server *s = from->s;
    if (io == from) {
        conn_open(io, fd, is_unix, peer);
        return;
    }
    act_handoff *h = malloc(sizeof *h);
    if (!h) {
        act_serve_log(s, "%s: out of memory handing over a connection; closing it", peer);
        close(fd);
        atomic_fetch_sub(&io->n_assigned, 1);
        return;
    }
    h->next = NULL;
    h->fd = fd;
    h->is_unix = is_unix;
    snprintf(h->peer, sizeof h->peer, "%s", peer);
    pthread_mutex_lock(&s->mu);
    if (io->hand_tail) io->hand_tail->next = h;
    else io->hand_head = h;
    io->hand_tail = h;
    pthread_mutex_unlock(&s->mu);
    act_io_wake(io);
}

/* TCP_NODELAY, and a way to notice a peer that vanished without a FIN or RST (a robot that lost
 * power or its network while idle between requests): keepalive probes after --keepalive-s of
 * silence, 3 probes a third of that apart, and the same bound on unacknowledged replies. Without
 * them such a connection is held forever, and the batcher, counting it as a client that may
 * still send, waits --max-wait-us on every batch. */
static void tcp_options(act_server *s, int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int idle = s->o.keepalive_s;
    if (idle <= 0) return;
    int intvl = idle / 3 > 0 ? idle / 3 : 1, cnt = 3;
    unsigned user_ms = (unsigned)(idle + intvl * cnt) * 1000u;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) ||
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms))
        act_serve_log(s, "setting TCP keepalive: %s (a vanished peer may hold its slot)", strerror(errno));
}

/* A refusal is said on stderr whatever --verbose (an operator must learn that clients are being
 * turned away): the first at once, later ones at most once every 10 s with their count since
 * (a flood of them cannot flood the log), and what is left unsaid when the I/O threads stop
 * (act_conn_say_refusals); --verbose says each. */
static void say_refused(act_server *s, const char *why)
{
    act_serve_log(s, "%s: refused a connection", why);
    long long now = (long long)(act_now() * 1e3);
    atomic_fetch_add(&s->refused_unsaid, 1);
    long long last = atomic_load(&s->refused_said_ms);
    if (last && now - last < 10000) return;
    if (!atomic_compare_exchange_strong(&s->refused_said_ms, &last, now)) return;
    int n = atomic_exchange(&s->refused_unsaid, 0);
    if (!last)
        act_serve_say("refused a connection (%s); further refusals are said at most every 10 s with their "
                      "count (/metrics: act_serve_connections_refused_total)", why);
    else
        act_serve_say("refused %d more connection%s in the last %.0f s (latest: %s)", n, n == 1 ? "" : "s",
                      (double)(now - last) / 1e3, why);
}

void act_conn_say_refusals(act_server *s)
{
    int n = atomic_exchange(&s->refused_unsaid, 0);
    if (n > 0)
        act_serve_say("refused %d more connection%s since the last note on refusals", n, n == 1 ? "" : "s");
}

/* says why in one best-effort ERROR frame (a fresh socket's buffer always takes it), then closes */
static void refuse(act_server *s, int fd, int code, int reason, const char *msg)
{
    size_t n;
    uint8_t *f = act_proto_build_error(0, code, msg, &n);
    act_metrics_refused(&s->metrics, reason);
    say_refused(s, msg);
    if (f && send(fd, f, n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) act_serve_log(s, "refusing a client: %s", strerror(errno));
    free(f);
    close(fd);
}

void act_conn_accept(act_io *from, int lfd, int is_unix)
{
    act_server *s = from->s;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                /* out of descriptors: free the spare, take the connection and refuse it, so the
                 * listener does not stay readable and spin the loop. Another thread may take
                 * the freed descriptor first: then try again next round, not in a loop here. */
                int enfile = errno == ENFILE;
                if (s->spare_fd >= 0) close(s->spare_fd);
                fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd >= 0) {
                    struct rlimit rl;
                    char msg[160];
                    if (enfile || getrlimit(RLIMIT_NOFILE, &rl))
                        snprintf(msg, sizeof msg, "server out of file descriptors (%s); try another replica",
                                 enfile ? "the system's limit" : "its open-file limit");
                    else
                        snprintf(msg, sizeof msg, "server out of file descriptors (open-file limit %llu: "
                                 "raise ulimit -n or lower --max-clients); try another replica",
                                 (unsigned long long)rl.rlim_cur);
                    refuse(s, fd, ACT_E_OVERLOADED, ACT_REFUSED_NO_FDS, msg);
                }
                s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                if (fd < 0) return;
                continue;
            }
            return;   /* EAGAIN, or an aborted handshake: nothing more to take now */
        }
        int draining = atomic_load(&s->draining);
        act_io *io = draining ? NULL : pick_io(s);
        if (!io) {
            char msg[128];
            snprintf(msg, sizeof msg, draining ? "server is draining; connect to another replica"
                                               : "max clients (%d) reached; try another replica",
                     s->o.max_clients);
            refuse(s, fd, draining ? ACT_E_SHUTTING_DOWN : ACT_E_OVERLOADED,
                   draining ? ACT_REFUSED_DRAINING : ACT_REFUSED_MAX_CLIENTS, msg);
            continue;
        }
        if (!is_unix) tcp_options(s, fd);
        char peer[64] = "?:0";
        struct ucred cr;
        socklen_t crl = sizeof cr;
        if (is_unix && !getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crl))
            snprintf(peer, sizeof peer, "unix:pid %d", (int)cr.pid);
        else if (ss.ss_family == AF_INET && act_peer_format(peer, sizeof peer, AF_INET, &((struct sockaddr_in *)&ss)->sin_addr,
                                                            ntohs(((struct sockaddr_in *)&ss)->sin_port)))
            snprintf(peer, sizeof peer, "?:0");
        else if (ss.ss_family == AF_INET6 && act_peer_format(peer, sizeof peer, AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr,
                                                             ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)))
            snprintf(peer, sizeof peer, "?:0");
        conn_hand(from, io, fd, is_unix, peer);
    }
}

/* Routes finished requests to io's connections. */
void act_deliver_done(act_io *io)
{
    act_server *s = io->s;
    pthread_mutex_lock(&s->mu);
    act_req *r = io->done_head;
    io->done_head = io->done_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    const act_config *cfg = s->cfg;
    while (r) {
        act_req *next = r->next;
        io->inflight--;
        atomic_fetch_sub(&s->inflight, 1);
        act_metrics_inflight(&s->metrics, -1);
        act_conn *c = conn_lookup(io, r->slot, r->gen);
        if (!c || c->closing) {
            /* it ran, but whoever asked is gone: counted and logged, never answered */
            act_audit_line(s, r->peer, r->client, r->p.request_id, "abandoned", r);
            act_metrics_undelivered(&s->metrics);
        } else {
            pthread_mutex_lock(&s->mu);
            conn_set(s, c, c->inflight - 1, c->more);
            pthread_mutex_unlock(&s->mu);
            audit_line(s, c, r->p.request_id, r->code, r);
            if (r->code) {
                conn_error(io, c, r->p.request_id, r->code, r->msg, 0);
            } else {
                act_result_hdr h = { r->p.request_id, r->p.actions ? ACT_RESULT_POSTERIOR : 0u, (uint32_t)r->batch,
                                     (uint32_t)lround(1e6 * (r->t_start - r->t_arrive)),
                                     (uint32_t)lround(1e6 * (r->t_end - r->t_start)), r->p.actions ? r->kl : NAN };
                size_t n;
                act_metrics_result(&s->metrics, r->t_start - r->t_arrive);
                uint8_t *f = act_proto_build_result(&h, r->chunk, cfg->pred_horizon, cfg->action_dim, &n);
                conn_send(io, c, f, n);
            }
        }
        act_req_put(io, r);
        r = next;
    }
}

void act_conn_expire(act_io *io, double now)
{
    /* a scan of the slots ten times a second at most: deadlines are seconds long */
    if (now - io->last_scan < 0.1 || (!io->n_closing && !io->s->o.frame_timeout_ms && !io->s->o.max_conn_age_s))
        return;
    io->last_scan = now;
    for (int i = io->lo; i < io->hi; i++) {
        act_conn *c = &io->s->conns[i];
        if (c->fd < 0) continue;
        if (c->closing && now > c->closing_deadline) {
            act_conn_close(io, c, 0, NULL);
        } else if (!c->closing && c->frame_deadline && now > c->frame_deadline) {
            act_conn_close(io, c, 1, c->handshaken ? "frame not completed within --frame-timeout-ms"
                                     : c->proxy_wait ? "no whole PROXY header within --frame-timeout-ms"
                                                     : "no HELLO within --frame-timeout-ms");
        } else {
            conn_age_out(io, c, now);   /* an idle client's, which no reply flushes */
        }
    }
}
