/* server.h - act-serve: serve one model to many TCP clients (protocol: docs/PROTOCOL.md).
 * defines: act_server_opts, act_server_create, act_server_attach, act_server_stop,
 *          act_server_wait, act_server_free, act_server_port, act_server_metrics_port
 *
 * Threads. The I/O threads (server.c; io_threads of them) own the sockets: the first accepts and
 * hands each connection to the I/O thread with the fewest, which from then on reads its frames
 * with non-blocking I/O on its own epoll set, validates them (protocol.c), answers HELLO/PING
 * itself and queues PREDICTs; the first also serves /healthz and /metrics (http.c). Receiving
 * ~590 KB of frames per request is what one thread cannot do fast enough for many TCP clients.
 * The inference thread (server_infer.c) owns the session: it takes the requests that are
 * waiting together, from any connections, runs them as one batch through act_run and hands the
 * results back; the connection's I/O thread routes each reply (by slot and generation, so a
 * reply for a closed connection is dropped, never sent to its successor).
 *
 * Lifecycle: create (binds both ports, starts the I/O thread: /healthz answers 503) ->
 * attach (warm-up, then accept clients; /healthz 200) -> stop (async-signal-safe: stop
 * accepting, finish and answer what is in flight) -> wait (returns when drained) -> free.
 */
#ifndef ACT_SERVER_H
#define ACT_SERVER_H

#include <stddef.h>
#include "act.h"

typedef struct act_server_opts {
    const char *host;          /* listen address (default 127.0.0.1) */
    int port;                  /* 0 = any free port (see act_server_port) */
    const char *unix_path;     /* NULL, or also listen on this Unix socket: same-host clients there
                                * may pass frames in shared memory (SHM_ATTACH) */
    int metrics_port;          /* -1 = no HTTP side port, 0 = any free port */
    int max_batch;             /* requests per forward pass (<= the session's max_batch) */
    int max_wait_us;           /* how long a batch may wait for more requests */
    const char *batch_sizes;   /* the sizes batches run at, a batch padded up to the next:
                                * "auto" (NULL too), "all" or a list (act_serve_batch_sizes) */
    int copy_frames;           /* 1: copy every batch's frames into the session's input buffers,
                                * instead of registering the memory they arrived in (shared
                                * memory, receive buffers) with the session and reading them
                                * there */
    int io_threads;            /* threads receiving and answering clients, 0 = one per 4 cores,
                                * at most 4 (each takes an equal share of max_clients) */
    int max_clients;           /* open connections; beyond it new ones are closed at once */
    int max_queue;             /* requests waiting or running, all clients together */
    int max_inflight_per_conn; /* requests one connection may have outstanding */
    size_t max_out_bytes;      /* unread replies a connection may hold before it is dropped */
    int drain_timeout_ms;      /* after stop: longest wait for slow readers to take their replies */
    int frame_timeout_ms;      /* longest a frame may take to arrive, and HELLO after connecting (0 = no limit) */
    int keepalive_s;           /* TCP: probe a silent peer after this many seconds and drop it
                                * after 3 unanswered probes (a third of it apart); the same
                                * bound on unacknowledged replies (0 = the kernel's defaults) */
    int proxy_protocol;        /* TCP connections start with a PROXY protocol header (v1 or v2)
                                * from a balancer, naming the client for the logs */
    int max_conn_age_s;        /* a connection older than this (give or take a tenth, spread
                                * per connection) is closed the next time it owes nothing, so a
                                * TCP balancer places its client again (0 = never) */
    const char *audit_log;     /* NULL or a file: one JSON line per request */
    int verbose;               /* log connections and errors to stderr */
} act_server_opts;

typedef struct act_server act_server;

act_server_opts act_server_default_opts(void);
int act_server_create(const act_server_opts *opts, act_server **out, char *err, size_t errlen);
/* Binds the model and a session (created with max_batch >= opts.max_batch), warms up every
 * batch size the server runs (CUDA) or batch 1 (CPU), then starts serving. */
int act_server_attach(act_server *s, const act_model *m, act_session *sess, act_device device,
                      char *err, size_t errlen);
void act_server_stop(act_server *s);       /* async-signal-safe */
int act_server_stopping(const act_server *s);
int act_server_wait(act_server *s);        /* 0 when drained cleanly */
void act_server_free(act_server *s);
int act_server_port(const act_server *s);
int act_server_metrics_port(const act_server *s);
int act_server_io_threads(const act_server *s);
/* how long act_server_attach's warm-up took (seconds): on CUDA it plans, measures (unless the
 * choices come from ACT_CUDA_ALGO_CACHE) and captures every batch size it runs (batch_sizes) */
double act_server_warmup_seconds(const act_server *s);

/* The batch sizes act-serve runs (on CUDA each one is warmed up and captured at start): a batch of
 * n requests runs at pad_to[n], the smallest of them >= n, its extra rows copies of the first
 * request's inputs whose results are dropped. spec: "auto" (NULL too; CUDA: 1, 2, 4 and every
 * multiple of 8; CPU: every size), "all" (1..max_batch) or sizes separated by commas; 1 and
 * max_batch are always run. Fills pad_to[0..max_batch]; returns how many sizes, or -1 with a
 * message naming what was wrong. */
int act_serve_batch_sizes(const char *spec, int max_batch, act_device dev, int *pad_to, char *err, size_t errlen);
/* "1-32" when every size runs, else the sizes with commas */
void act_serve_batch_sizes_str(const int *pad_to, int max_batch, char *buf, size_t len);
/* the sizes the attached server runs (act_serve_batch_sizes_str) */
const char *act_server_batch_sizes(const act_server *s);

#endif
