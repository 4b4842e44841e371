/* server_internal.h - the state the act-serve threads share (server.c, server_conn.c,
 * server_infer.c, server_audit.c, http.c).
 * Ownership: each I/O thread (an act_io) owns its share of the connection slots, their sockets,
 * its epoll set and its request pool; the first also owns the listeners and the HTTP side port.
 * The session and batch buffers belong to the inference thread. The pending list, each I/O
 * thread's done list and hand-off list, and the connection counts the batcher reads are
 * guarded by mu. */
#ifndef ACT_SERVER_INTERNAL_H
#define ACT_SERVER_INTERNAL_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include "metrics.h"
#include "protocol.h"
#include "server.h"
#include "util.h"   /* act_now */

/* One PREDICT on its way through the server: one block sized from the contract at attach
 * (header, chunk, then the decoded inputs at data), recycled through a pool so that the
 * steady state allocates nothing and touches no fresh pages. */
/* Memory frames arrive in - a client's shared memory, a receive buffer - which the inference
 * thread registers with the session at the first batch that reads frames from it, so that steps
 * read them in place. reg is written by the inference thread only (under mu, since the I/O
 * thread reads it). Whoever lets go of a block calls act_regmem_drop: an unregistered one is
 * released at once, a registered one goes to the retired list, and the inference thread
 * unregisters it before release() unmaps or frees it. */
typedef struct act_regmem {
    const uint8_t *p;
    size_t bytes;
    int reg;                       /* 0 not yet tried, 1 registered, -1 refused (frames copied) */
    struct act_regmem *next;       /* on the retired list */
    void (*release)(struct act_regmem *m);
} act_regmem;

/* A client's shared memory, mapped read-only (server_shm.c): mem.p, mem.bytes. refs: its
 * connection and every request whose frames may point into it; I/O thread only. */
typedef struct act_shm {
    act_regmem mem;                /* first: release() gets the act_shm back */
    int refs;
} act_shm;

/* The header of a receive buffer (server_wire.c), in the page before its data (mem.p). */
typedef struct act_wire {
    act_regmem mem;                /* first, at the start of the allocation */
} act_wire;

typedef struct act_req {
    struct act_req *next;
    uint32_t slot, gen;            /* the connection that asked */
    act_predict p;
    double t_arrive, t_start, t_end;   /* monotonic seconds: last byte read, forward start/end */
    int ord;                       /* its place among its connection's pending requests of its
                                    * kind (take_batch's scratch, under mu) */
    int batch;                     /* requests in its forward pass */
    int rows;                      /* the pass's rows: batch padded up to a size the server runs */
    int code;                      /* 0 = chunk valid, else an act_err_code */
    char msg[ACT_ERR_LEN + 32];
    float kl;
    uint8_t *data;                 /* act_proto_predict_bytes, inside this block */
    uint8_t *wire;                 /* a payload buffer the raw frames point into, swapped with
                                    * the connection's receive buffer instead of copied; it stays
                                    * with the block when recycled (owned, may be NULL) */
    size_t wire_cap;
    act_shm *shm;                  /* a reference to the connection's shared memory, or NULL */
    char peer[64], client[256];    /* who asked, for the audit log after the connection is gone */
    float chunk[];                 /* [pred_horizon][action_dim] */
} act_req;

typedef struct act_audit {         /* --audit-log */
    int on;                        /* 1 from open to close (mu made): set before the I/O threads
                                    * start, so read without the lock */
    int fd;                        /* the file, under mu (a rotation replaces it) */
    pthread_mutex_t mu;            /* one line at a time, from every I/O thread */
    double checked;                /* when the path was last compared with the file open */
    unsigned long long failing;    /* lines lost since the last one written */
    int reopen_failed;             /* the path could not be made again (said once) */
    char path[512];
} act_audit;

typedef struct act_out {           /* one queued reply frame */
    struct act_out *next;
    uint8_t *p;
    size_t n, off;
} act_out;

#define ACT_PROXY_V2_HDR 16        /* a PROXY protocol v2 header's fixed part */
#define ACT_PROXY_MAX 256          /* the longest PROXY header read (v1's is at most 107 bytes) */

typedef struct act_conn {
    int fd;                        /* -1 = free slot */
    int is_unix;                   /* accepted on the Unix socket: may attach shared memory */
    int rx_fd;                     /* a descriptor that came with the frame being read, or -1 */
    act_shm *shm;                  /* attached shared memory (a reference), or NULL */
    uint32_t gen;
    int handshaken, closing, read_done;   /* read_done: peer half-closed, still owed replies */
    uint32_t events;               /* what epoll watches for it now */
    double closing_deadline;
    double frame_deadline;         /* a frame begun (or HELLO owed) must be complete by then; 0 = idle */
    double age_deadline;           /* --max-connection-age: closed once past it and owing nothing
                                    * (0 = never) */
    int proxy_wait;                /* --proxy-protocol: its PROXY header not yet read */
    size_t proxy_got;              /* bytes of it in proxy_buf */
    uint8_t proxy_buf[ACT_PROXY_MAX];
    char peer[64], client[256];
    uint8_t hdr[ACT_PROTO_HDR];
    size_t hdr_got;
    act_frame_hdr fh;
    int have_hdr;
    uint8_t *in;
    size_t in_cap, in_got;
    act_out *out_head, *out_tail;
    size_t out_bytes;
    int inflight;
    int more;                      /* its last PREDICT said more follow at once (ACT_PREDICT_MORE) */
} act_conn;

/* A connection the first I/O thread accepted for another one (server_conn.c). */
typedef struct act_handoff {
    struct act_handoff *next;
    int fd, is_unix;
    char peer[64];
} act_handoff;

#define ACT_IO_MAX 16              /* I/O threads at most */

/* One I/O thread: an epoll set, an eventfd to wake it, and the connection slots [lo, hi). */
typedef struct act_io {
    struct act_server *s;
    int idx;                       /* 0: also the listeners and the HTTP side port */
    int epfd, wakefd;
    pthread_t thread;
    int started, rc;
    int lo, hi;
    int *free_slots, n_free;
    atomic_int n_assigned;         /* slots in use or promised by a hand-off (for the acceptor) */
    int n_closing;
    double last_scan;              /* of its slots for expired deadlines */
    int inflight;                  /* its connections' requests queued or running */
    act_req *req_pool;             /* recycled request blocks */
    int n_pool, pool_max;
    act_req *done_head, *done_tail;        /* finished requests to route (under mu) */
    act_handoff *hand_head, *hand_tail;    /* accepted connections to take over (under mu) */
} act_io;

#define ACT_HTTP_SLOTS 32
#define ACT_HTTP_BUF 4096
/* answered: the response is out and the write side shut; the rest of the request is read and
 * dropped until the peer closes (closing with unread bytes would reset the response away) */
/* head: the request was HEAD (the response's headers without its body) */
typedef struct act_http_conn { int fd, answered, head; size_t got; double deadline; char buf[ACT_HTTP_BUF]; } act_http_conn;

/* epoll tags: kind in the high 32 bits, slot in the low */
enum { TAG_LISTEN = 1, TAG_METRICS = 2, TAG_WAKE = 3, TAG_CONN = 4, TAG_HTTP = 5 };
enum { LISTEN_TCP = 0, LISTEN_UNIX = 1 };   /* TAG_LISTEN slots */
#define ACT_TAG(kind, slot) (((uint64_t)(kind) << 32) | (uint32_t)(slot))

struct act_server {
    act_server_opts o;
    char host[64];
    int lfd, mfd, spare_fd;
    atomic_llong refused_said_ms;  /* when refusals were last said on stderr (act_conn_refuse) */
    atomic_int refused_unsaid;     /* refusals since */
    int ufd;                       /* the Unix-socket listener (--unix), or -1 */
    char unix_path[108];           /* its path, removed at exit; "" = none */
    int port, mport;
    atomic_int stop_flag;          /* set by a signal handler (lock-free: async-signal-safe), read by every thread */
    atomic_int ready, draining, attached;
    pthread_t infer_thread;
    int infer_started;
    act_io *io;                    /* n_io I/O threads */
    int n_io, io_per;              /* io_per: connection slots per I/O thread (the last: fewer) */
    atomic_int io_running;         /* I/O threads not yet left (the first leaves last) */
    atomic_int listeners_closed;   /* the first I/O thread hands over no more connections */

    const act_model *model;
    act_session *sess;
    const act_config *cfg;
    char device[64];
    uint8_t *info_frame;
    size_t info_len;

    act_metrics metrics;
    double warmup_s;                    /* act_server_attach's warm-up */
    int *pad_to;                   /* [0..max_batch]: the size a batch of n runs at (server_sizes.c) */
    char sizes_str[512];           /* them, for the log and the ready line */
    act_audit audit;               /* --audit-log (server_audit.c) */

    act_conn *conns;               /* max_clients slots, split among the I/O threads */
    act_http_conn http[ACT_HTTP_SLOTS];   /* the first I/O thread's */
    atomic_int inflight;           /* requests queued or running, all I/O threads together */
    size_t req_bytes;              /* one request block */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    act_req *pend_head, *pend_tail;
    int n_pending;
    int *fair_seen;                /* [max_clients], all 0 between batches: a connection's pending
                                    * requests counted while a batch is chosen (take_batch) */
    int *fair_level;               /* [max_batch]: requests at each place (take_batch) */
    act_regmem *retired;           /* registered blocks let go of: to unregister, then release */
    size_t reg_bytes;              /* bytes of frame memory registered (inference thread) */
    int reg_full_logged;           /* the limit on it was reached and said so (inference thread) */
    int n_ready_conns, n_busy_conns;   /* handshaken; with a request not yet answered and no more
                                        * announced (conn_busy: the batcher waits for the others) */
    int infer_stop;
};

void act_io_wake(act_io *io);
void act_server_wake(act_server *s);   /* every I/O thread */
void act_serve_log(const act_server *s, const char *fmt, ...);   /* with --verbose only */
void act_serve_say(const char *fmt, ...);                        /* always (startup progress) */
void act_conn_say_refusals(act_server *s);   /* refusals not yet said on stderr (server_conn.c) */
/* the I/O thread that owns connection slot */
static inline act_io *act_io_of(act_server *s, uint32_t slot)
{
    return &s->io[slot / (uint32_t)s->io_per];
}

/* server_conn.c (on the I/O thread that owns the connection) */
int act_ep_set(act_io *io, int op, int fd, uint32_t events, uint64_t tag);
void act_conn_accept(act_io *io, int lfd, int is_unix);   /* the first I/O thread */
void act_conn_take(act_io *io);                      /* the connections handed to it */
void act_conn_read(act_io *io, act_conn *c);
int act_conn_flush(act_io *io, act_conn *c);         /* -1: the connection was closed */
void act_conn_close(act_io *io, act_conn *c, int dropped, const char *why);
void act_conn_expire(act_io *io, double now);        /* closes refused clients past their linger */
void act_deliver_done(act_io *io);                   /* routes finished requests to their clients */
void act_req_put(act_io *io, act_req *r);            /* back to the pool (or freed when it is full) */

/* server_proxy.c: the PROXY protocol header a balancer sends first (--proxy-protocol).
 * act_proxy_scan: of the first n bytes of a connection, L > 0 when a whole header is the first
 * L; 0 when all n belong to a header not yet complete; -1 when they cannot (msg).
 * act_proxy_peer: the client a whole header (len bytes) names, as "addr:port", or "" when it
 * names none (LOCAL, UNKNOWN, not IP); 0, or -1 with msg. */
long act_proxy_scan(const uint8_t *b, size_t n, char *msg, size_t msglen);
int act_proxy_peer(const uint8_t *b, size_t len, char *peer, size_t peerlen, char *msg, size_t msglen);
/* "addr:port" (af AF_INET or AF_INET6, addr in network order), as act-serve names peers: 0, or
 * -1 when inet_ntop cannot print it */
int act_peer_format(char *peer, size_t peerlen, int af, const void *addr, unsigned port);

/* server_shm.c (the I/O thread of the connection) */
int act_shm_map(int fd, uint64_t size, act_shm **out, char *msg, size_t msglen);   /* 0 or an act_err_code */
static inline void act_shm_ref(act_shm *m) { if (m) m->refs++; }
void act_shm_unref(act_server *s, act_shm *m);     /* drops it (act_regmem_drop) at the last reference */

/* server_wire.c: receive buffers (c->in, r->wire) of whole pages, registrable with the session */
uint8_t *act_wire_alloc(size_t cap);               /* NULL: out of memory */
void act_wire_free(act_server *s, uint8_t *p);     /* NULL ok; act_regmem_drop */
act_wire *act_wire_of(uint8_t *p);                 /* its header (NULL for NULL) */

/* server_infer.c */
int act_infer_start(act_server *s, char *err, size_t errlen);
void act_infer_stop(act_server *s);
void act_regmem_drop(act_server *s, act_regmem *m);   /* releases it, or retires a registered one */
void act_infer_retire(act_server *s);       /* the inference thread's, or after it stopped */
int act_infer_warmup(act_server *s, act_device dev, char *err, size_t errlen);

/* http.c */
void act_http_accept(act_server *s);
void act_http_read(act_server *s, int slot);
void act_http_expire(act_server *s, double now);
void act_http_close_all(act_server *s);

/* server_audit.c: --audit-log. status: "ok" or an error code's name, or "abandoned" (its
 * connection closed before the reply); r (a request that ran) adds its batch and times */
int act_audit_open(act_server *s, const char *path, char *err, size_t errlen);
void act_audit_close(act_server *s);
void act_audit_line(act_server *s, const char *peer, const char *client, uint64_t id, const char *status,
                    const act_req *r);

#endif
