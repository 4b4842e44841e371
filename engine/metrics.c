/* metrics.c - act-serve counters and histograms, Prometheus text exposition (see metrics.h). */
#include "metrics.h"
#include "protocol.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* an error code past the table would be counted as code 0 and vanish from /metrics */
_Static_assert(ACT_E_BAD_SHM < ACT_METRICS_MAX_CODES, "ACT_METRICS_MAX_CODES must exceed every act_err_code");

static void hist_init(act_hist *h, const double *le, int n)
{
    memset(h, 0, sizeof *h);
    h->n = n;
    memcpy(h->le, le, (size_t)n * sizeof *le);
}

static void hist_add(act_hist *h, double v)
{
    int i = 0;
    while (i < h->n && v > h->le[i]) i++;
    h->count[i]++;
    h->sum += v;
    h->total++;
}

void act_metrics_init(act_metrics *m)
{
    static const double batch_le[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256 };
    /* 50 us .. 5 s: loopback round trips on a GPU sit at the low end, CPU batches at the top */
    static const double time_le[] = { 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
                                      2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5 };
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->batch_size, batch_le, 9);
    hist_init(&m->queue_wait_s, time_le, 16);
    hist_init(&m->infer_s, time_le, 16);
}

void act_metrics_destroy(act_metrics *m) { pthread_mutex_destroy(&m->mu); }

void act_metrics_request(act_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->requests++;
    pthread_mutex_unlock(&m->mu);
}

void act_metrics_error(act_metrics *m, int code)
{
    pthread_mutex_lock(&m->mu);
    m->errors[code > 0 && code < ACT_METRICS_MAX_CODES ? code : 0]++;
    pthread_mutex_unlock(&m->mu);
}

void act_metrics_result(act_metrics *m, double queue_wait_s)
{
    pthread_mutex_lock(&m->mu);
    m->results++;
    hist_add(&m->queue_wait_s, queue_wait_s);
    pthread_mutex_unlock(&m->mu);
}

int act_metrics_batch(act_metrics *m, int batch, int rows, double infer_s, const char *failed_why)
{
    pthread_mutex_lock(&m->mu);
    m->batches++;
    if (rows > batch) m->padded_rows += (uint64_t)(rows - batch);
    hist_add(&m->batch_size, batch);
    hist_add(&m->infer_s, infer_s);
    int was = m->failing;
    if (failed_why && !was) snprintf(m->failing_why, sizeof m->failing_why, "%s", failed_why);
    m->failing = failed_why != NULL;
    pthread_mutex_unlock(&m->mu);
    return was;
}

void act_metrics_conn(act_metrics *m, int delta, int dropped)
{
    pthread_mutex_lock(&m->mu);
    m->conns_open += delta;
    if (delta > 0) m->conns_total++;
    if (dropped) m->conns_dropped++;
    pthread_mutex_unlock(&m->mu);
}

void act_metrics_refused(act_metrics *m, int reason)
{
    pthread_mutex_lock(&m->mu);
    m->conns_refused[reason >= 0 && reason < ACT_REFUSED_N ? reason : ACT_REFUSED_MAX_CLIENTS]++;
    pthread_mutex_unlock(&m->mu);
}

void act_metrics_memory(act_metrics *m, size_t weights, size_t activations, size_t workspace,
                        size_t drv_held, size_t drv_before, size_t drv_total)
{
    pthread_mutex_lock(&m->mu);
    m->mem_weights = weights;
    m->mem_activations = activations;
    m->mem_workspace = workspace;
    m->drv_held = drv_held;
    m->drv_before = drv_before;
    m->drv_total = drv_total;
    pthread_mutex_unlock(&m->mu);
}

void act_metrics_warmup(act_metrics *m, double seconds)
{
    pthread_mutex_lock(&m->mu);
    m->warmup_s = seconds;
    pthread_mutex_unlock(&m->mu);
}

void act_metrics_io_threads(act_metrics *m, int n)
{
    pthread_mutex_lock(&m->mu);
    m->io_threads = n;
    pthread_mutex_unlock(&m->mu);
}

int act_metrics_failing(act_metrics *m, char *why, size_t whylen)
{
    pthread_mutex_lock(&m->mu);
    int f = m->failing;
    if (f && why && whylen) snprintf(why, whylen, "%s", m->failing_why);
    pthread_mutex_unlock(&m->mu);
    return f;
}

/* counter += n, under the lock (any thread) */
static void count(act_metrics *m, uint64_t *counter, uint64_t n)
{
    pthread_mutex_lock(&m->mu);
    *counter += n;
    pthread_mutex_unlock(&m->mu);
}

void act_metrics_abandoned(act_metrics *m, int n) { count(m, &m->abandoned, (uint64_t)n); }
void act_metrics_conn_aged(act_metrics *m) { count(m, &m->conns_aged, 1); }
void act_metrics_undelivered(act_metrics *m) { count(m, &m->undelivered, 1); }
void act_metrics_audit_lost(act_metrics *m) { count(m, &m->audit_lost, 1); }

void act_metrics_inflight(act_metrics *m, int delta)
{
    pthread_mutex_lock(&m->mu);
    m->inflight += delta;
    pthread_mutex_unlock(&m->mu);
}

/* A growing text buffer; on allocation failure it stops growing and render returns NULL. */
typedef struct sbuf { char *p; size_t len, cap; int oom; } sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        if (b->oom) return;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)(n > 0 ? n : 0);
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* a gauge of three values by kind */
static void render_kinds(sbuf *b, const char *name, const char *help, const char *const kind[3],
                         const uint64_t v[3])
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
    for (int i = 0; i < 3; i++)
        sb_printf(b, "%s{kind=\"%s\"} %llu\n", name, kind[i], (unsigned long long)v[i]);
}

static void render_hist(sbuf *b, const char *name, const char *help, const act_hist *h)
{
    uint64_t cum = 0;
    sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < h->n; i++) {
        cum += h->count[i];
        sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
              (unsigned long long)h->total, name, h->sum, name, (unsigned long long)h->total);
}

/* one counter: its HELP and TYPE lines and its value */
static void counter(sbuf *b, const char *name, const char *help, uint64_t v)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

char *act_metrics_render(act_metrics *m, int ready, int draining, size_t *len)
{
    sbuf b = { malloc(4096), 0, 4096, 0 };
    if (!b.p) return NULL;
    b.p[0] = 0;
    pthread_mutex_lock(&m->mu);
    sb_printf(&b, "# HELP act_serve_ready 1 once the model is loaded and warmed up\n"
                  "# TYPE act_serve_ready gauge\nact_serve_ready %d\n", ready);
    sb_printf(&b, "# HELP act_serve_warmup_seconds how long the warm-up before serving took (CUDA: every "
                  "batch size planned, measured and captured)\n"
                  "# TYPE act_serve_warmup_seconds gauge\nact_serve_warmup_seconds %.3f\n", m->warmup_s);
    sb_printf(&b, "# HELP act_serve_draining 1 after SIGTERM, while in-flight requests finish\n"
                  "# TYPE act_serve_draining gauge\nact_serve_draining %d\n", draining);
    sb_printf(&b, "# HELP act_serve_failing 1 after a forward pass failed, until one succeeds\n"
                  "# TYPE act_serve_failing gauge\nact_serve_failing %d\n", m->failing);
    const struct { const char *name, *help; uint64_t v; } counters[] = {
        {"act_serve_requests_total", "PREDICT frames received", m->requests},
        {"act_serve_results_total", "RESULT replies sent", m->results},
        {"act_serve_batches_total", "forward passes run", m->batches},
        {"act_serve_padded_rows_total", "rows computed past the requests, a batch padded up to the next size the "
         "server runs (--batch-sizes)", m->padded_rows},
        {"act_serve_abandoned_requests_total", "requests dropped unrun: their connection closed while they waited "
         "for a batch", m->abandoned},
        {"act_serve_undelivered_results_total", "requests run whose connection closed before the reply: their "
         "results dropped", m->undelivered},
        {"act_serve_audit_lines_lost_total", "--audit-log lines that could not be written (a full disk); the log "
         "holds whole lines only", m->audit_lost}};
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        counter(&b, counters[i].name, counters[i].help, counters[i].v);
    sb_printf(&b, "# HELP act_serve_errors_total ERROR replies and refused frames, by code\n"
                  "# TYPE act_serve_errors_total counter\n");
    for (int c = 1; c < ACT_METRICS_MAX_CODES; c++)
        if (m->errors[c])
            sb_printf(&b, "act_serve_errors_total{code=\"%s\"} %llu\n", act_err_code_name(c),
                      (unsigned long long)m->errors[c]);
    sb_printf(&b, "# HELP act_serve_connections open client connections\n"
                  "# TYPE act_serve_connections gauge\nact_serve_connections %lld\n",
              (long long)m->conns_open);
    sb_printf(&b, "# HELP act_serve_io_threads threads receiving and answering clients (--io-threads)\n"
                  "# TYPE act_serve_io_threads gauge\nact_serve_io_threads %d\n", m->io_threads);
    counter(&b, "act_serve_connections_total", "client connections accepted", m->conns_total);
    counter(&b, "act_serve_connections_dropped_total", "connections closed for bad frames or unread replies",
            m->conns_dropped);
    counter(&b, "act_serve_connections_aged_total", "idle connections closed at --max-connection-age (their "
            "clients reconnect, through a balancer to any replica)", m->conns_aged);
    static const char *const refused_why[ACT_REFUSED_N] = { "max_clients", "draining", "no_fds" };
    sb_printf(&b, "# HELP act_serve_connections_refused_total connections refused at accept (max clients, draining, "
                  "out of file descriptors)\n# TYPE act_serve_connections_refused_total counter\n");
    for (int r = 0; r < ACT_REFUSED_N; r++)
        sb_printf(&b, "act_serve_connections_refused_total{reason=\"%s\"} %llu\n", refused_why[r],
                  (unsigned long long)m->conns_refused[r]);
    static const char *const mem_kind[3] = { "weights", "activations", "workspace" };
    static const char *const drv_kind[3] = { "held", "before", "total" };
    const uint64_t mem[3] = { m->mem_weights, m->mem_activations, m->mem_workspace };
    const uint64_t drv[3] = { m->drv_held, m->drv_before, m->drv_total };
    render_kinds(&b, "act_serve_device_memory_bytes", "device memory the model session holds (CPU: its "
                 "buffers), by what it holds", mem_kind, mem);
    if (m->drv_total)   /* a separate gauge: summing it with the one above would count twice */
        render_kinds(&b, "act_serve_device_memory_driver_bytes", "the GPU's memory as its driver counts "
                     "it after the warm-up: held since the backend's setup (the libraries' buffers, "
                     "graphs and lazily loaded kernels included), before it (the CUDA context, other "
                     "processes), the GPU's total", drv_kind, drv);
    sb_printf(&b, "# HELP act_serve_inflight requests received and not yet answered\n"
                  "# TYPE act_serve_inflight gauge\nact_serve_inflight %lld\n", (long long)m->inflight);
    render_hist(&b, "act_serve_batch_size", "requests per forward pass", &m->batch_size);
    render_hist(&b, "act_serve_queue_wait_seconds", "time from a request's last byte to its forward pass",
                &m->queue_wait_s);
    render_hist(&b, "act_serve_inference_seconds", "duration of one batched forward pass", &m->infer_s);
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}
