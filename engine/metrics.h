/* metrics.h - act-serve counters and histograms, rendered as Prometheus text.
 * defines: act_metrics, act_metrics_* (record from any thread, render for /metrics)
 * One mutex guards everything: updates are a handful per request, far below contention. */
#ifndef ACT_METRICS_H
#define ACT_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define ACT_HIST_MAX_BUCKETS 16
#define ACT_METRICS_MAX_CODES 32      /* > every act_err_code (checked in metrics.c) */

typedef struct act_hist {
    int n;                                   /* buckets in use */
    double le[ACT_HIST_MAX_BUCKETS];         /* upper bounds; +Inf is implicit */
    uint64_t count[ACT_HIST_MAX_BUCKETS + 1];/* per bucket, not cumulative; last = +Inf */
    double sum;
    uint64_t total;
} act_hist;

/* why a connection was refused at accept */
enum { ACT_REFUSED_MAX_CLIENTS, ACT_REFUSED_DRAINING, ACT_REFUSED_NO_FDS, ACT_REFUSED_N };

typedef struct act_metrics {
    pthread_mutex_t mu;
    uint64_t requests, results, batches;
    uint64_t padded_rows;                    /* rows run past the requests, padding a batch up to a size */
    uint64_t abandoned;                      /* queued requests dropped with their closed connection */
    uint64_t undelivered;                    /* results computed after their connection closed */
    uint64_t audit_lost;                     /* --audit-log lines that could not be written */
    uint64_t errors[ACT_METRICS_MAX_CODES];  /* by act_err_code */
    uint64_t conns_total, conns_dropped;     /* accepted; closed by the server for misbehaviour */
    uint64_t conns_aged;                     /* closed idle at --max-connection-age */
    uint64_t conns_refused[ACT_REFUSED_N];   /* accepted only to be refused at once, by reason */
    uint64_t mem_weights, mem_activations, mem_workspace;   /* device bytes the session holds */
    uint64_t drv_held, drv_before, drv_total;  /* the driver's count (act_memory); drv_total 0: none */
    int failing;                             /* the last forward pass failed */
    char failing_why[256];                   /* the first failure since the last success */
    int64_t conns_open, inflight;
    int io_threads;                          /* act-serve's I/O threads (a setting, for dashboards) */
    double warmup_s;                         /* the warm-up before serving (seconds) */
    act_hist batch_size, queue_wait_s, infer_s;
} act_metrics;

void act_metrics_init(act_metrics *m);
void act_metrics_destroy(act_metrics *m);
void act_metrics_request(act_metrics *m);
void act_metrics_error(act_metrics *m, int code);
void act_metrics_result(act_metrics *m, double queue_wait_s);
/* one forward pass: its requests, its rows (requests padded up to a batch size the server runs),
 * duration, and why it failed (NULL: it succeeded). Returns whether the pass before had failed,
 * so the caller can log the transitions. */
int act_metrics_batch(act_metrics *m, int batch, int rows, double infer_s, const char *failed_why);
void act_metrics_conn(act_metrics *m, int delta, int dropped);   /* +1 open, -1 close */
void act_metrics_refused(act_metrics *m, int reason);            /* ACT_REFUSED_* */
void act_metrics_inflight(act_metrics *m, int delta);
void act_metrics_abandoned(act_metrics *m, int n);   /* queued requests of a closed connection */
void act_metrics_undelivered(act_metrics *m);        /* a result whose connection closed while it ran */
void act_metrics_conn_aged(act_metrics *m);          /* a connection let go at --max-connection-age */
void act_metrics_audit_lost(act_metrics *m);         /* an audit line not written */
/* the session's device memory by kind, and the driver's count (act_memory's driver_*: rendered
 * only when drv_total > 0) */
void act_metrics_memory(act_metrics *m, size_t weights, size_t activations, size_t workspace,
                        size_t drv_held, size_t drv_before, size_t drv_total);
void act_metrics_io_threads(act_metrics *m, int n);
void act_metrics_warmup(act_metrics *m, double seconds);
/* 1 while failing, with the reason copied into why */
int act_metrics_failing(act_metrics *m, char *why, size_t whylen);
/* Renders the Prometheus text exposition (version 0.0.4) into a malloc'd string. */
char *act_metrics_render(act_metrics *m, int ready, int draining, size_t *len);

#endif
