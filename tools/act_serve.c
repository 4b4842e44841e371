/* act_serve.c - act-serve: serve one .actw model to rollout workers and robots over TCP.
 * Thin main: flags (each with an ACT_SERVE_* environment twin; a flag beats its variable),
 * signals, model and session; the server itself is engine/server.c (docs/SERVING.md). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <sched.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>
#include "act.h"
#include "outfile.h"
#include "server.h"
#include "util.h"

typedef enum { F_STR, F_INT, F_SIZE, F_BOOL } flag_kind;
/* lo..hi: the values an F_INT or F_SIZE flag accepts (checked here, so that a bad value names its
 * flag: the server's own check can only list every rule) */
typedef struct flag { const char *name, *env; flag_kind kind; void *ptr; const char *help; long long lo, hi; } flag;

typedef struct cli {
    const char *model, *device, *precision, *port_file;
    int cuda_device;
    int copy_threads;           /* the session's (act_session_opts.copy_threads) */
    const char *algo_cache;     /* ACT_CUDA_ALGO_CACHE for the CUDA backend */
    act_server_opts so;
} cli;

static act_server *g_server;
static int g_signals;             /* signals received (an atomic: two may arrive on two threads at once) */
static int g_teardown, g_in_handler;   /* atomics: the handler may no longer touch g_server */
static char g_unix_path[108];   /* sun_path's size: removed by a second signal's exit */
static char g_port_file[1024];  /* --port-file once written (g_port_set), with what it holds: */
static char g_port_line[64];    /* removed at exit while it still holds our port, not another's */
static volatile sig_atomic_t g_port_set;

/* --port-file removed if it still holds what this server wrote there: a replacement started
 * beside it (a rolling restart) may have rewritten it, and its port must stay findable.
 * Async-signal-safe (open, read, close, unlink). */
static void remove_port_file(void)
{
    if (!g_port_set) return;
    char got[sizeof g_port_line];
    int fd = open(g_port_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, got, sizeof got);
    close(fd);
    size_t want = strlen(g_port_line);
    if (n == (ssize_t)want && memcmp(got, g_port_line, want) == 0) unlink(g_port_file);
}

/* The first SIGTERM/SIGINT/SIGHUP drains (at most --drain-timeout-ms, plus the batch computing
 * then); a second one exits at once, for an operator or orchestrator that will not wait, as does
 * any signal once the server is being torn down. Only async-signal-safe calls here. SIGHUP too:
 * a server started from a terminal or an ssh session that closes drains and says so rather than
 * dying silently (under nohup it stays ignored). */
static void on_signal(int sig)
{
    __atomic_add_fetch(&g_in_handler, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&g_teardown, __ATOMIC_SEQ_CST) || __atomic_fetch_add(&g_signals, 1, __ATOMIC_SEQ_CST)) {
        static const char msg[] = "act-serve: a second signal: exiting now, without draining\n";
        if (g_unix_path[0]) unlink(g_unix_path);
        remove_port_file();
        act_outfile_remove_pending();
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        _exit(128 + sig);
    }
    static const char msg[] = "act-serve: signal received: draining (a second one exits at once)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    if (g_server) act_server_stop(g_server);
    __atomic_sub_fetch(&g_in_handler, 1, __ATOMIC_SEQ_CST);
}

static void usage(FILE *out, const flag *fl, int n)
{
    fprintf(out, "usage: act-serve --model M.actw [options]\n"
                 "       act-serve --version\n\n"
                 "Serves action chunks over TCP (docs/PROTOCOL.md, docs/SERVING.md); SIGTERM (SIGINT, SIGHUP) drains\n"
                 "and exits 0, a second one exits at once (128 + the signal). Every option has the environment\n"
                 "variable beside it; the option wins. Switches (1/0) also take true/false, yes/no, on/off.\n\n");
    for (int i = 0; i < n; i++)
        fprintf(out, "  --%-22s %-28s %s\n", fl[i].name, fl[i].env, fl[i].help);
}

static int word_is(const char *v, const char *a, const char *b, const char *c, const char *d)
{
    return !strcasecmp(v, a) || !strcasecmp(v, b) || !strcasecmp(v, c) || !strcasecmp(v, d);
}

static int set_flag(const flag *f, const char *v)
{
    char *end = NULL;
    errno = 0;
    switch (f->kind) {
    case F_STR: *(const char **)f->ptr = v; return 0;
    case F_BOOL:
        if (word_is(v, "1", "true", "yes", "on")) *(int *)f->ptr = 1;
        else if (word_is(v, "0", "false", "no", "off")) *(int *)f->ptr = 0;
        else break;
        return 0;
    case F_INT: {
        long long x = strtoll(v, &end, 10);
        if (!*v || *end) break;
        if (errno == ERANGE) goto range;
        if (x < f->lo || x > f->hi) goto range;
        *(int *)f->ptr = (int)x;
        return 0;
    }
    case F_SIZE: {
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *end || v[0] == '-') break;
        if (errno == ERANGE) goto range;
        if (x < (unsigned long long)f->lo || x > (unsigned long long)f->hi) goto range;
        *(size_t *)f->ptr = (size_t)x;
        return 0;
    }
    }
    fprintf(stderr, "act-serve: --%s (%s): '%s' is not %s\n", f->name, f->env, v,
            f->kind == F_BOOL ? "a switch (1/0, true/false, yes/no, on/off)" : "a whole number");
    return -1;
range:
    fprintf(stderr, "act-serve: --%s (%s): %s is out of range: %lld to %lld\n", f->name, f->env, v, f->lo, f->hi);
    return -1;
}

static int parse(int argc, char **argv, cli *c)
{
    memset(c, 0, sizeof *c);
    c->so = act_server_default_opts();
    c->device = "auto";
    c->precision = "fp32";
    const flag fl[] = {
        { "model", "ACT_SERVE_MODEL", F_STR, &c->model, ".actw weight file (required)", 0, 0 },
        { "host", "ACT_SERVE_HOST", F_STR, &c->so.host, "listen address [127.0.0.1]", 0, 0 },
        { "port", "ACT_SERVE_PORT", F_INT, &c->so.port, "TCP port, 0 = any free [7070]", 0, 65535 },
        { "unix", "ACT_SERVE_UNIX", F_STR, &c->so.unix_path, "also listen on this Unix socket (same-host clients; frames in shared memory)", 0, 0 },
        { "device", "ACT_SERVE_DEVICE", F_STR, &c->device, "cuda|cpu|auto [auto: cuda if available]", 0, 0 },
        { "precision", "ACT_SERVE_PRECISION", F_STR, &c->precision, "fp32|tf32|bf16|fp16; the CPU device runs fp32 only [fp32]", 0, 0 },
        { "cuda-device", "ACT_SERVE_CUDA_DEVICE", F_INT, &c->cuda_device, "CUDA device ordinal [0]", 0, 1023 },
        { "algo-cache", "ACT_CUDA_ALGO_CACHE", F_STR, &c->algo_cache, "GPU: a file of measured conv/GEMM algorithm choices, read at start and appended to, so that a restart or a replica sharing the file measures nothing again and runs the same algorithms (lines of another GPU model or library version are skipped)", 0, 0 },
        { "max-batch", "ACT_SERVE_MAX_BATCH", F_INT, &c->so.max_batch, "requests per forward pass [32]", 1, 65536 },
        { "max-wait-us", "ACT_SERVE_MAX_WAIT_US", F_INT, &c->so.max_wait_us, "longest wait for a batch to fill [200]", 0, 60000000 },
        { "batch-sizes", "ACT_SERVE_BATCH_SIZES", F_STR, &c->so.batch_sizes, "the batch sizes run, a batch padded up to the next with copies of its first request (results dropped): 'auto' (GPU: 1,2,4 and multiples of 8, each warmed up and captured at start; CPU: every size), 'all' (1..max-batch) or a list like 1,2,4,8,16,32; 1 and max-batch always run [auto]", 0, 0 },
        { "copy-threads", "ACT_SERVE_COPY_THREADS", F_INT, &c->copy_threads, "threads copying a batch's frames into the input buffers, 0 = half the usable cores (an affinity mask or CPU quota counts), at most 8 [0]", 0, 64 },
        { "copy-frames", "ACT_SERVE_COPY_FRAMES", F_BOOL, &c->so.copy_frames, "copy each batch's frames into the input buffers, instead of reading them where they arrived (shared memory, receive buffers; GPU: pulled over PCIe, no host copy) (1/0) [0]", 0, 0 },
        { "io-threads", "ACT_SERVE_IO_THREADS", F_INT, &c->so.io_threads, "threads receiving frames and answering clients, each with its share of the connections; 0 = one per 4 usable cores, at most 4 (TCP clients sending many frames want more than one) [0]", 0, 16 },
        { "max-clients", "ACT_SERVE_MAX_CLIENTS", F_INT, &c->so.max_clients, "open connections [4096]", 1, 1048576 },
        { "max-queue", "ACT_SERVE_MAX_QUEUE", F_INT, &c->so.max_queue, "requests queued, all clients [256]", 1, 1048576 },
        { "max-inflight", "ACT_SERVE_MAX_INFLIGHT", F_INT, &c->so.max_inflight_per_conn, "requests queued per connection [32]", 1, 1048576 },
        { "max-out-bytes", "ACT_SERVE_MAX_OUT_BYTES", F_SIZE, &c->so.max_out_bytes, "unread reply bytes before a client is dropped [4194304]", 4096, (long long)1 << 40 },
        { "drain-timeout-ms", "ACT_SERVE_DRAIN_TIMEOUT_MS", F_INT, &c->so.drain_timeout_ms, "longest drain after SIGTERM [10000]", 0, 86400000 },
        { "frame-timeout-ms", "ACT_SERVE_FRAME_TIMEOUT_MS", F_INT, &c->so.frame_timeout_ms, "longest a frame (or HELLO) may take, 0 = none [30000]", 0, 86400000 },
        { "proxy-protocol", "ACT_SERVE_PROXY_PROTOCOL", F_BOOL, &c->so.proxy_protocol, "behind a TCP balancer that sends the PROXY protocol (HAProxy: send-proxy or send-proxy-v2): every TCP connection must start with its header, and logs and the audit log name the client it carries, not the balancer; a connection without one is refused (the Unix socket never has one) (1/0) [0]", 0, 0 },
        { "max-connection-age", "ACT_SERVE_MAX_CONNECTION_AGE", F_INT, &c->so.max_conn_age_s, "close a connection older than this many seconds (spread over 0.9-1.1 of it) the next time it owes nothing, so its client reconnects and a TCP balancer places it again (after a rolling restart); 0 = never [0]", 0, 31536000 },
        { "keepalive-s", "ACT_SERVE_KEEPALIVE_S", F_INT, &c->so.keepalive_s, "TCP: drop a peer that vanished without closing (power or network lost while idle) after this many silent seconds plus 3 unanswered probes; 0 = the kernel's defaults (hours) [30]", 0, 86400 },
        { "metrics-port", "ACT_SERVE_METRICS_PORT", F_INT, &c->so.metrics_port, "HTTP /healthz and /metrics, -1 = off [-1]", -1, 65535 },
        { "audit-log", "ACT_SERVE_AUDIT_LOG", F_STR, &c->so.audit_log, "append one JSON line per request", 0, 0 },
        { "port-file", "ACT_SERVE_PORT_FILE", F_STR, &c->port_file, "write 'port metrics_port' here once ready", 0, 0 },
        { "verbose", "ACT_SERVE_VERBOSE", F_BOOL, &c->so.verbose, "log connections and errors (1/0)", 0, 0 },
    };
    int n = (int)(sizeof fl / sizeof fl[0]);
    unsigned char given[sizeof fl / sizeof fl[0]] = { 0 };   /* on the command line: its variable is not read */
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "-h") || !strcmp(argv[a], "--help")) {
            usage(stdout, fl, n);
            return 1;
        }
        if (!strcmp(argv[a], "--version")) {
            printf("act-serve %s (protocol: docs/PROTOCOL.md)\n", ACT_VERSION);
            return 1;
        }
        const flag *f = NULL;
        for (int i = 0; i < n && !f; i++)
            if (!strncmp(argv[a], "--", 2) && !strcmp(argv[a] + 2, fl[i].name)) { f = &fl[i]; given[i] = 1; }
        if (!f) {
            fprintf(stderr, "act-serve: unknown option '%s' (see --help)\n", argv[a]);
            return -1;
        }
        if (f->kind == F_BOOL && (a + 1 >= argc || !strncmp(argv[a + 1], "--", 2))) {
            *(int *)f->ptr = 1;
            continue;
        }
        if (a + 1 >= argc) {
            fprintf(stderr, "act-serve: --%s needs a value\n", f->name);
            return -1;
        }
        if (set_flag(f, argv[++a])) return -1;
    }
    /* a flag on the command line wins over its variable, even over a variable that is not valid */
    for (int i = 0; i < n; i++) {
        const char *v = given[i] ? NULL : getenv(fl[i].env);
        if (v && set_flag(&fl[i], v)) return -1;
    }
    if (!c->model) {
        fprintf(stderr, "act-serve: --model (or ACT_SERVE_MODEL) is required\n\n");
        usage(stderr, fl, n);
        return -1;
    }
    return 0;
}

static int parse_precision(const char *s, act_precision *p)
{
    static const char *const names[] = { "fp32", "tf32", "bf16", "fp16" };
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) {
            *p = (act_precision)i;
            return 0;
        }
    fprintf(stderr, "act-serve: --precision '%s': expected fp32, tf32, bf16 or fp16\n", s);
    return -1;
}

/* Each connection is a descriptor: lift the soft limit as far as the hard limit allows, and say
 * when that is not enough for --max-clients (connections past it are refused, each with an
 * ERROR frame, and said on stderr). */
static void raise_fd_limit(int want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return;
    rlim_t need = (rlim_t)want + 64;
    if (rl.rlim_cur >= need) return;
    rl.rlim_cur = need < rl.rlim_max ? need : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) || getrlimit(RLIMIT_NOFILE, &rl)) return;
    if (rl.rlim_cur < need)
        fprintf(stderr, "act-serve: warning: the open-file limit is %llu (hard limit %llu), below the "
                "--max-clients %d connections + 64 the server may hold: connections past it are refused; "
                "raise it (ulimit -n, LimitNOFILE= in a systemd unit) or lower --max-clients\n",
                (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max, want);
}

/* --port-file's folder must take the file before the model loads (a warm-up can take a minute):
 * 1 with a message when it cannot */
static int port_file_unwritable(const char *path)
{
    char dir[1024];
    if (access(act_path_dir(path, dir, sizeof dir), W_OK | X_OK) == 0) return 0;
    fprintf(stderr, "act-serve: --port-file %s: its folder %s cannot take it: %s\n", path, dir, strerror(errno));
    return 1;
}

int main(int argc, char **argv)
{
    cli c;
    int pr = parse(argc, argv, &c);
    if (pr) return pr > 0 ? 0 : 2;
    char err[ACT_ERR_LEN], why[256];
    /* the CUDA backend reads its algorithm cache from the environment; set before any thread */
    if (c.algo_cache && setenv("ACT_CUDA_ALGO_CACHE", c.algo_cache, 1)) {
        fprintf(stderr, "act-serve: --algo-cache: %s\n", strerror(errno));
        return 2;
    }
    act_session_opts sopts = act_session_default_opts();
    if (parse_precision(c.precision, &sopts.precision)) return 2;
    /* --device cpu never asks: that would load the CUDA plugin and its libraries for nothing */
    int cuda = strcmp(c.device, "cpu") ? act_cuda_available(why, sizeof why) : 0;
    if (!strcmp(c.device, "auto")) {
        sopts.device = cuda ? ACT_DEVICE_CUDA : ACT_DEVICE_CPU;
    } else if (!strcmp(c.device, "cuda")) {
        if (!cuda) {
            fprintf(stderr, "act-serve: --device cuda: %s\n", why);
            return 2;
        }
        sopts.device = ACT_DEVICE_CUDA;
    } else if (!strcmp(c.device, "cpu")) {
        sopts.device = ACT_DEVICE_CPU;
    } else {
        fprintf(stderr, "act-serve: --device '%s': expected cuda, cpu or auto\n", c.device);
        return 2;
    }
    sopts.max_batch = c.so.max_batch;
    sopts.cuda_device = c.cuda_device;
    sopts.copy_threads = c.copy_threads;
    raise_fd_limit(c.so.max_clients);
    if (c.port_file && port_file_unwritable(c.port_file)) return 2;
    {   /* --batch-sizes is a flag like the others: a bad list is a usage error, before the model loads */
        int *pad_to = calloc((size_t)c.so.max_batch + 2, sizeof *pad_to);
        int n = pad_to ? act_serve_batch_sizes(c.so.batch_sizes, c.so.max_batch, sopts.device, pad_to, err, sizeof err) : 0;
        free(pad_to);
        if (n < 0) {
            fprintf(stderr, "%s\n", err);
            return 2;
        }
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);
    sigaction(SIGXFSZ, &sa, NULL);   /* an audit log past a file size limit: its write fails, the server lives */
    if (act_server_create(&c.so, &g_server, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (c.so.unix_path) snprintf(g_unix_path, sizeof g_unix_path, "%s", c.so.unix_path);
    /* SIGINT and SIGHUP ignored at start stay ignored (nohup, a background job of a script); an
     * ignored SIGTERM is caught all the same: it is how supervisors (systemd, Kubernetes, a
     * rolling restart) ask a server to drain, and a wrapper's `trap '' TERM` would otherwise
     * leave them nothing but SIGKILL */
    int term_ignored = signal(SIGTERM, SIG_DFL) == SIG_IGN;
    static const int drain_sigs[] = {SIGTERM, SIGINT, SIGHUP};
    act_catch_signals(drain_sigs, (int)(sizeof drain_sigs / sizeof *drain_sigs), on_signal, 0);
    if (term_ignored)
        fprintf(stderr, "act-serve: SIGTERM was ignored when act-serve started (a `trap '' TERM` in a wrapper?); "
                        "it drains the server all the same\n");

    act_model *m = NULL;
    act_session *sess = NULL;
    int rc = 1;
    if (act_model_load(c.model, &m, err, sizeof err) ||
        act_session_create(m, &sopts, &sess, err, sizeof err) ||
        act_server_attach(g_server, m, sess, sopts.device, err, sizeof err)) {
        if (act_server_stopping(g_server)) rc = 0;   /* SIGTERM while loading: a clean exit */
        else fprintf(stderr, "act-serve: %s\n", err);
        act_server_stop(g_server);
        act_server_wait(g_server);
        goto out;
    }
    const act_config *cfg = act_model_config(m);
    if (c.algo_cache && sopts.device == ACT_DEVICE_CPU)
        fprintf(stderr, "act-serve: --algo-cache (ACT_CUDA_ALGO_CACHE) %s: unused on the CPU, which measures no "
                        "algorithms (the file is neither read nor written)\n", c.algo_cache);
    char mport[48] = "";
    if (c.so.metrics_port >= 0) snprintf(mport, sizeof mport, ", metrics on port %d", act_server_metrics_port(g_server));
    fprintf(stderr, "act-serve: ready on %s:%d%s%s%s (%s, model %s, max-batch %d, batch sizes %s, max-wait-us %d, "
            "io-threads %d, warm-up %.1f s)%s\n", c.so.host, act_server_port(g_server),
            c.so.proxy_protocol ? " (TCP: PROXY protocol headers only)" : "", c.so.unix_path ? " and unix:" : "",
            c.so.unix_path ? c.so.unix_path : "", act_session_device_name(sess), cfg->model_hash,
            c.so.max_batch, act_server_batch_sizes(g_server), c.so.max_wait_us, act_server_io_threads(g_server),
            act_server_warmup_seconds(g_server), mport);
    if (c.port_file) {
        /* renamed into place whole: a watcher polling for the file never reads half of it */
        act_outfile pf;
        char perr[1300];
        snprintf(g_port_line, sizeof g_port_line, "%d %d\n", act_server_port(g_server),
                 c.so.metrics_port >= 0 ? act_server_metrics_port(g_server) : -1);   /* -1: off */
        snprintf(g_port_file, sizeof g_port_file, "%s", c.port_file);
        int ok = act_outfile_open(&pf, c.port_file, "w", perr, sizeof perr) == 0;
        if (ok) {
            fputs(g_port_line, pf.fp);
            ok = act_outfile_commit(&pf, perr, sizeof perr) == 0;
        }
        if (ok) {
            g_port_set = 1;
        } else {
            /* whoever asked for the file finds the server by it: serving unfound helps nobody */
            fprintf(stderr, "act-serve: cannot write --port-file: %s; stopping\n", perr);
            act_server_stop(g_server);
            act_server_wait(g_server);
            goto out;
        }
    }
    rc = act_server_wait(g_server) ? 1 : 0;
    fprintf(stderr, "act-serve: drained, exiting\n");
out:
    /* the server is going away: from here a signal exits at once (removing the socket and the
     * port file), and no handler may touch the server: wait out one that is doing so now */
    __atomic_store_n(&g_teardown, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&g_in_handler, __ATOMIC_SEQ_CST)) sched_yield();
    remove_port_file();   /* a dead server's port is no one's to read */
    act_server_free(g_server);
    g_server = NULL;
    act_session_free(sess);
    act_model_free(m);
    if (rc != 0) {
        /* without the libraries' exit handlers: OpenBLAS's joins a worker thread that an
         * out-of-memory failure can leave retrying its allocation forever */
        fflush(NULL);
        _exit(rc);
    }
    return rc;
}
