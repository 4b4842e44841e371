/* server_internal.h - the state the act-serve threads share (server.c, server_conn.c,
 * server_infer.c, http.c).
 * Ownership: connections, sockets and the audit file belong to the I/O thread; the session and
 * batch buffers to the inference thread; the pending and done lists, and the connection counts
 * the batcher reads, are guarded by mu. */
#ifndef ACT_SERVER_INTERNAL_H
#define ACT_SERVER_INTERNAL_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include "metrics.h"
#include "protocol.h"
#include "server.h"

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
    int batch;
    int code;                      /* 0 = chunk valid, else an act_err_code */
    char msg[ACT_ERR_LEN + 32];
    float kl;
    uint8_t *data;                 /* act_proto_predict_bytes, inside this block */
    uint8_t *wire;                 /* a payload buffer the raw frames point into, swapped with
                                    * the connection's receive buffer instead of copied; it stays
                                    * with the block when recycled (owned, may be NULL) */
    size_t wire_cap;
    act_shm *shm;                  /* a reference to the connection's shared memory, or NULL */
    float chunk[];                 /* [pred_horizon][action_dim] */
} act_req;

typedef struct act_out {           /* one queued reply frame */
    struct act_out *next;
    uint8_t *p;
    size_t n, off;
} act_out;

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
    char peer[64], client[64];
    uint8_t hdr[ACT_PROTO_HDR];
    size_t hdr_got;
    act_frame_hdr fh;
    int have_hdr;
    uint8_t *in;
    size_t in_cap, in_got;
    act_out *out_head, *out_tail;
    size_t out_bytes;
    int inflight;
} act_conn;

#define ACT_HTTP_SLOTS 32
#define ACT_HTTP_BUF 4096
typedef struct act_http_conn { int fd; size_t got; double deadline; char buf[ACT_HTTP_BUF]; } act_http_conn;

/* epoll tags: kind in the high 32 bits, slot in the low */
enum { TAG_LISTEN = 1, TAG_METRICS = 2, TAG_WAKE = 3, TAG_CONN = 4, TAG_HTTP = 5 };
enum { LISTEN_TCP = 0, LISTEN_UNIX = 1 };   /* TAG_LISTEN slots */
#define ACT_TAG(kind, slot) (((uint64_t)(kind) << 32) | (uint32_t)(slot))

struct act_server {
    act_server_opts o;
    char host[64], audit_path[512];
    int lfd, mfd, epfd, wakefd, spare_fd;
    int ufd;                       /* the Unix-socket listener (--unix), or -1 */
    char unix_path[108];           /* its path, removed at exit; "" = none */
    int port, mport;
    volatile sig_atomic_t stop_flag;
    atomic_int ready, draining, attached;
    pthread_t io_thread, infer_thread;
    int io_started, infer_started, io_rc;

    const act_model *model;
    act_session *sess;
    const act_config *cfg;
    char device[64];
    uint8_t *info_frame;
    size_t info_len;

    act_metrics metrics;
    FILE *audit;

    act_conn *conns;               /* max_clients slots */
    int *free_slots, n_free;
    int n_open, n_closing;
    double last_scan;              /* of the connection table for expired deadlines */
    act_http_conn http[ACT_HTTP_SLOTS];
    int inflight;                  /* requests queued or running (I/O thread's count) */
    act_req *req_pool;             /* recycled request blocks (I/O thread only) */
    int n_pool;
    size_t req_bytes;              /* one request block */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    act_req *pend_head, *pend_tail;
    int n_pending;
    act_regmem *retired;           /* registered blocks let go of: to unregister, then release */
    size_t reg_bytes;              /* bytes of frame memory registered (inference thread) */
    int reg_full_logged;           /* the limit on it was reached and said so (inference thread) */
    act_req *done_head, *done_tail;
    int n_ready_conns, n_busy_conns;   /* handshaken; with a request not yet answered */
    int infer_stop;
};

double act_now(void);              /* monotonic seconds */
void act_server_wake(act_server *s);
void act_serve_log(const act_server *s, const char *fmt, ...);

/* server_conn.c (I/O thread only) */
int act_ep_set(act_server *s, int op, int fd, uint32_t events, uint64_t tag);
void act_conn_accept(act_server *s, int lfd, int is_unix);
void act_conn_read(act_server *s, act_conn *c);
int act_conn_flush(act_server *s, act_conn *c);      /* -1: the connection was closed */
void act_conn_close(act_server *s, act_conn *c, int dropped, const char *why);
void act_conn_expire(act_server *s, double now);     /* closes refused clients past their linger */
void act_deliver_done(act_server *s);                /* routes finished requests to their clients */
void act_req_put(act_server *s, act_req *r);         /* back to the pool (or freed when it is full) */

/* server_shm.c (I/O thread only) */
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

#endif
