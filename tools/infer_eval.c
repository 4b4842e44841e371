/* infer_eval.c - `act-infer eval` and `act-infer eval-merge`: the held-out validation of a
 * checkpoint over HDF5 episodes (metrics: engine/eval.h), fast enough to run after every
 * checkpoint. One act_run per batch gives both the prior chunk (scored against the recorded
 * actions) and the z = mu posterior (the validation loss); the episode stream reads the next
 * batch while this one runs. `--shard i/n` keeps every n-th episode so a job scheduler can fan
 * the set out over many GPUs; `eval-merge` folds the shard summaries into the single-run totals. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "episode.h"
#include "episode_stream.h"
#include "eval.h"
#include "infer_common.h"
#include "npy.h"
#include "util.h"

#define MERGE_USAGE_TEXT \
    "usage: act-infer eval-merge S0.json S1.json ... --json ALL.json\n" \
    "  combines the summaries of `eval --shard i/n` runs (all n of them) into the totals one run\n" \
    "  over every episode gives.\n"

static const char *USAGE =
    "usage: act-infer eval --model M.actw --episodes DIR|FILE... [options]\n"
    "  --model M.actw            weight file\n"
    "  --episodes DIR|FILE...    directories (their episode_*.hdf5, by episode number) and/or files\n"
    "  --device cpu|cuda         default: cuda when a GPU is usable, else cpu\n"
    "  --precision P             fp32 (default), tf32, bf16, fp16 (CUDA; the CPU backend is fp32 only)\n"
    "  --batch N                 timesteps per forward (default: cuda 128, cpu 4)\n"
    INFER_PAD_USAGE
    "  --json SUMMARY.json       write the summary (per episode and overall, with the raw sums)\n"
    "  --save-predictions DIR    write DIR/<episode>.npy: float32 (T, pred_horizon, action_dim) prior chunks\n"
    "  --plots DIR               PNG per episode: recorded vs predicted per joint, error over time\n"
    "                            (runs tools/eval_plots.py with $ACT_PYTHON or /usr/bin/python3; needs\n"
    "                            matplotlib and h5py; predictions go to DIR/predictions unless\n"
    "                            --save-predictions is given)\n"
    "  --shard i/n               evaluate episodes i, i+n, i+2n, ... of the list (0 <= i < n)\n"
    "  --keep-going              a broken episode is reported as failed and the rest still run;\n"
    "                            the exit code is 1 at the end if any failed\n"
    "  --copy-frames             cuda: copy each batch's frames into the session's input buffers\n"
    "                            instead of reading them where the episode reader put them (its\n"
    "                            buffers are registered with the session: no host copy per batch)\n"
    "Prints each episode's metrics, then the overall ones, the throughput (and the steady rate past\n"
    "each batch size's first two steps, which set up plans and graphs), how long the step waited\n"
    "for the episode reader, and how the frames were read (docs/EVAL.md says what to change when\n"
    "reading sets the pace). SIGTERM/SIGINT/SIGHUP: the step in flight finishes, then the eval\n"
    "stops (exit 128 + the signal) and says what it did not write; a second signal stops at once.\n"
    "\n" MERGE_USAGE_TEXT;
static const char *MERGE_USAGE = MERGE_USAGE_TEXT;

static int make_dir(const char *d) {
    if (mkdir(d, 0777) == 0 || errno == EEXIST) return 0;
    fprintf(stderr, "act-infer eval: %s: cannot create directory: %s\n", d, strerror(errno));
    return -1;
}

/* ---- progress bar (a terminal only; pipes and logs stay quiet) ---- */

typedef struct progress {
    int on, episodes;
    double t_start, t_last;
} progress;

static void progress_show(progress *p, int done_eps, long long steps, int final) {
    if (!p->on) return;
    double t = act_now();
    if (!final && t - p->t_last < 0.1) return;
    p->t_last = t;
    int width = 24, fill = p->episodes ? done_eps * width / p->episodes : width;
    char bar[32];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    double el = t - p->t_start;
    fprintf(stderr, "\reval [%s] %d/%d episodes  %lld timesteps  %.1f timesteps/s ", bar, done_eps,
            p->episodes, steps, el > 0 ? (double)steps / el : 0.0);
    if (final) fputc('\n', stderr);
    fflush(stderr);
}

/* ---- plots ---- */

/* tools/eval_plots.py: $ACT_EVAL_PLOTS, else next to the source tree of this binary
 * (<repo>/<build>/act-infer -> <repo>/tools), else beside the binary. */
static int find_plot_script(char *out, size_t len) {
    const char *env = getenv("ACT_EVAL_PLOTS");
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return access(out, R_OK) == 0 ? 0 : -1;
    }
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    const char *rel[] = {"/../tools/eval_plots.py", "/../../tools/eval_plots.py", "/eval_plots.py"};
    for (int i = 0; i < 3; i++) {
        snprintf(out, len, "%s%s", exe, rel[i]);
        if (access(out, R_OK) == 0) return 0;
    }
    return -1;
}

static int run_plots(const char *plots, const char *preds, const char *summary, const act_eval_summary *s,
                     char **sel) {
    char script[1100];
    if (find_plot_script(script, sizeof script) != 0) {
        fprintf(stderr, "act-infer eval: --plots: tools/eval_plots.py not found (set ACT_EVAL_PLOTS to its path)\n");
        return -1;
    }
    const char *py = getenv("ACT_PYTHON");
    /* Debian's interpreter is the one apt's matplotlib/numpy live in; a pyenv python3 may shadow it */
    if (!py || !*py) py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
    char **argv = calloc((size_t)s->n_episodes + 12, sizeof(char *));
    if (!argv) return -1;
    int a = 0, nplots = 0;
    argv[a++] = (char *)py;
    argv[a++] = script;
    argv[a++] = "--predictions";
    argv[a++] = (char *)preds;
    argv[a++] = "--out";
    argv[a++] = (char *)plots;
    if (summary) {
        argv[a++] = "--summary";
        argv[a++] = (char *)summary;
    }
    char oh[16];
    snprintf(oh, sizeof oh, "%d", s->obs_horizon);
    argv[a++] = "--obs-horizon";
    argv[a++] = oh;
    for (int i = 0; i < s->n_episodes; i++)
        if (!s->episodes[i].failed) { argv[a++] = sel[i]; nplots++; }
    argv[a] = NULL;
    if (nplots == 0) { free(argv); return 0; }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        execvp(py, argv);
        fprintf(stderr, "act-infer eval: --plots: cannot run %s: %s\n", py, strerror(errno));
        _exit(127);
    }
    free(argv);
    int status = 0;
    if (pid < 0 || infer_wait_child(pid, &status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (pid > 0 && WIFSIGNALED(status))
            fprintf(stderr, "act-infer eval: --plots: %s %s stopped by signal %d\n", py, script, WTERMSIG(status));
        else
            fprintf(stderr, "act-infer eval: --plots: %s %s failed (exit %d)\n", py, script,
                    WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return -1;
    }
    return 0;
}

/* ---- eval ---- */

#define MAX_SHARDS 1000000

typedef struct eval_args {
    const char *model, *json, *save, *plots, *shard;
    infer_run_opts ro;
    int keep_going, copy_frames;
    char **episodes;
    int n_episode_args;
    int shard_i, shard_n;
} eval_args;

static int parse_eval_args(int argc, char **argv, eval_args *a) {
    memset(a, 0, sizeof *a);
    a->shard_n = 1;
    const char *batch = NULL, *val;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(USAGE, stdout); return -2; }
        if (!strcmp(argv[i], "--keep-going")) { a->keep_going = 1; continue; }
        if (!strcmp(argv[i], "--copy-frames")) { a->copy_frames = 1; continue; }
        if (!strcmp(argv[i], "--episodes")) {
            if (a->episodes)
                return infer_usage("eval", USAGE, "--episodes given twice: list every directory and file after one --episodes");
            a->episodes = argv + i + 1;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) { i++; a->n_episode_args++; }
            if (!a->n_episode_args) return infer_usage("eval", USAGE, "--episodes needs at least one directory or file");
            continue;
        }
        const char *names[] = {"--model", "--json", "--save-predictions", "--plots", "--shard",
                               "--device", "--precision", "--batch", "--pad-batches"};
        const char **slots[] = {&a->model, &a->json, &a->save, &a->plots, &a->shard,
                                &a->ro.device, &a->ro.precision, &batch, &a->ro.pad};
        int matched = 0;
        for (int k = 0; k < (int)(sizeof names / sizeof names[0]) && !matched; k++) {
            int r = infer_opt(argc, argv, &i, names[k], &val);
            if (r < 0) return infer_usage("eval", USAGE, "%s needs a value", names[k]);
            if (r > 0) { *slots[k] = val; matched = 1; }
        }
        if (!matched) return infer_usage("eval", USAGE, "unknown argument '%s'", argv[i]);
    }
    if (!a->model) return infer_usage("eval", USAGE, "--model is required");
    if (!a->episodes) return infer_usage("eval", USAGE, "--episodes is required");
    if (batch && infer_parse_int(batch, 1, 1 << 16, &a->ro.batch) != 0)
        return infer_usage("eval", USAGE, "--batch must be an integer in 1..65536, got '%s'", batch);
    int urc = infer_check_run_opts("eval", USAGE, &a->ro);
    if (urc != 0) return urc;
    if (a->shard) {   /* each part parsed whole and range-checked: 0/4294967297 used to wrap to 0/1 */
        const char *slash = strchr(a->shard, '/');
        char part[24];
        size_t li = slash ? (size_t)(slash - a->shard) : 0;
        int ok = slash && li < sizeof part;
        if (ok) {
            memcpy(part, a->shard, li);
            part[li] = 0;
            ok = infer_parse_int(slash + 1, 1, MAX_SHARDS, &a->shard_n) == 0 &&
                 infer_parse_int(part, 0, a->shard_n - 1, &a->shard_i) == 0;
        }
        if (!ok)
            return infer_usage("eval", USAGE, "--shard must be i/n with 0 <= i < n <= %d, got '%s'", MAX_SHARDS, a->shard);
    }
    return 0;
}

static void print_table(const act_eval_summary *s) {
    printf("%-28s %6s %12s %12s %12s %s\n", "episode", "steps", "action_l1", "action_mse", "val_loss", "status");
    for (int i = 0; i < s->n_episodes; i++) {
        const act_eval_episode *e = &s->episodes[i];
        if (e->failed) {
            printf("%-28s %6d %12s %12s %12s failed: %s\n", e->name, e->steps, "-", "-", "-", e->error);
            continue;
        }
        act_eval_means m = act_eval_means_of(&e->s, s->kl_weight);
        printf("%-28s %6d %12.6g %12.6g %12.6g ok\n", e->name, e->steps, m.action_l1, m.action_mse, m.val_loss);
    }
}

/* How the episodes' frames were read: the most common way, and how many episodes were read
 * otherwise (each episode's own is in the summary's episodes[].reader). */
static void print_readers(const act_eval_summary *s) {
    int best = -1, best_n = 0, known = 0;
    for (int i = 0; i < s->n_episodes; i++) {
        const char *r = s->episodes[i].reader;
        if (!r[0]) continue;
        known++;
        int first = 1, n = 0;   /* counted at its first occurrence only */
        for (int j = 0; j < s->n_episodes; j++) {
            if (strcmp(s->episodes[j].reader, r)) continue;
            if (j < i) { first = 0; break; }
            n++;
        }
        if (first && n > best_n) best = i, best_n = n;
    }
    if (best < 0) return;
    printf("frames read: %s", s->episodes[best].reader);
    if (known > best_n) printf(" (%d of %d episodes; each episode's own: episodes[].reader in the summary)", best_n, known);
    printf("\n");
}

static void print_overall(const act_eval_summary *s) {
    act_eval_sums o;
    int failed;
    if (act_eval_overall(s, &o, &failed) != 0) return;
    act_eval_means m = act_eval_means_of(&o, s->kl_weight);
    printf("overall: %d episodes (%d failed), %lld timesteps: action_l1 %.6g  action_mse %.6g  "
           "val_l1 %.6g  val_kl %.6g  val_loss %.6g\n", s->n_episodes, failed, (long long)s->timesteps,
           m.action_l1, m.action_mse, m.val_l1, m.val_kl, m.val_loss);
    free(o.joint_l1);
    if (s->elapsed_s > 0) {
        printf("throughput: %.1f timesteps/s, %.1f images/s (%s, %s, model %s)\n",
               (double)s->timesteps / s->elapsed_s, (double)s->timesteps * s->num_cams / s->elapsed_s,
               s->device, s->precision, s->model_hash);
        double steady = act_eval_steady_rate(s), rest = s->elapsed_s - s->steady_s;
        if (isfinite(steady) && rest > 0.05 * s->elapsed_s)
            printf("steady: %.1f timesteps/s past the first two steps at each batch size (the rest took "
                   "%.2f s of %.2f s: opening, %s)\n", steady, rest, s->elapsed_s,
                   strcmp(s->device, "cuda") ? "first steps" : "algorithm choice, graph capture");
        double share = s->reader_wait_s / s->elapsed_s;
        if (isfinite(share))
            printf("reader: waited %.2f s of %.2f s (%.0f%%) for frames%s\n", s->reader_wait_s, s->elapsed_s,
                   100.0 * share, share > 0.25 ? ": reading the episodes sets the pace (docs/EVAL.md: how frames "
                   "are read, ACT_EPISODE_THREADS)" : "");
    }
    print_readers(s);
}

/* The batch sizes the steps ran at, and what padding the episodes' last batches cost. */
static void print_steps(const infer_ctx *ctx, long long padded_rows) {
    char sizes[256] = "";
    size_t at = 0;
    int n = 0;
    for (int r = ctx->batch; r >= 1 && at < sizeof sizes; r--)
        if (ctx->ran[r]) {
            if (++n > 8) {
                snprintf(sizes + at, sizeof sizes - at, ", ...");
                break;
            }
            int w = snprintf(sizes + at, sizeof sizes - at, "%s%d", at ? ", " : "", r);
            at += w > 0 ? (size_t)w : 0;
        }
    if (!n) return;
    printf("steps: at batch size%s %s", n > 1 ? "s" : "", sizes);
    if (padded_rows)
        printf(" (%lld rows computed and dropped, episodes' last batches padded up to a size that ran: "
               "--pad-batches)", padded_rows);
    else if (n > 1 && ctx->pad == INFER_PAD_OFF && ctx->device == ACT_DEVICE_CUDA)
        /* on the CPU a size costs nothing to set up and every padded row its share: no advice */
        printf(" (each new size is set up at its first steps: --pad-batches few or on set up fewer)");
    printf("\n");
}

/* act_stream_next, with the time it waited for the reader added to *wait: when that is a large
 * part of the eval, reading the episodes (not the model) sets the pace */
static const act_ep_batch *next_batch(act_stream *st, double *wait) {
    double t = act_now();
    const act_ep_batch *b = act_stream_next(st);
    *wait += act_now() - t;
    return b;
}

/* On CUDA a batch's frames are read where the episode reader put them: its two buffers are
 * registered with the session, and the step pulls the frames from there (on the CPU that would
 * only move the same copy into the step). All or none; returns how many. */
static int register_reader(infer_ctx *ctx, act_stream *st, const uint8_t **blocks) {
    size_t bytes[2];
    char err[ACT_ERR_LEN];
    int n = act_stream_frame_blocks(st, blocks, bytes, 2);
    for (int i = 0; i < n; i++) {
        if (act_session_register_host(ctx->session, blocks[i], bytes[i], err, sizeof err) != 0) {
            while (i-- > 0) act_session_unregister_host(ctx->session, blocks[i]);
            fprintf(stderr, "act-infer eval: frames are copied: %s\n", err);
            return 0;
        }
    }
    return n;
}

static void unregister_reader(infer_ctx *ctx, const uint8_t **blocks, int *n) {
    for (int i = 0; i < *n; i++) act_session_unregister_host(ctx->session, blocks[i]);
    *n = 0;
}

/* Predictions are saved as <stem>.npy: two episodes of one name (episode_0.hdf5 in two
 * --episodes folders) would overwrite each other's file. Refused before the model loads. */
typedef struct stem_ref { char stem[256]; const char *path; } stem_ref;
static int cmp_stem(const void *x, const void *y)
{
    return strcmp(((const stem_ref *)x)->stem, ((const stem_ref *)y)->stem);
}
static int duplicate_stems(char **paths, int n)
{
    if (n < 2) return 0;
    stem_ref *r = malloc((size_t)n * sizeof *r);
    if (!r) {
        fprintf(stderr, "act-infer eval: out of memory\n");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        act_episode_stem(paths[i], r[i].stem, sizeof r[i].stem);
        r[i].path = paths[i];
    }
    qsort(r, (size_t)n, sizeof *r, cmp_stem);
    int bad = 0;
    for (int i = 1; i < n && !bad; i++)
        if (!strcmp(r[i].stem, r[i - 1].stem)) {
            fprintf(stderr, "act-infer eval: %s and %s would both save their predictions as %s.npy; "
                            "rename one, or evaluate the folders in separate runs (--save/--plots)\n",
                    r[i - 1].path, r[i].path, r[i].stem);
            bad = 1;
        }
    free(r);
    return bad ? -1 : 0;
}

/* DIR/<stem>.npy: where an episode's predictions are saved */
static const char *pred_file(const char *dir, const char *episode, char *buf, size_t len) {
    char stem[256];
    act_episode_stem(episode, stem, sizeof stem);
    snprintf(buf, len, "%s/%s.npy", dir, stem);
    return buf;
}

/* A failed episode has no predictions: an earlier run's file is not this run's answer. */
static void drop_stale_prediction(const char *dir, const char *episode) {
    char p[1400];
    if (dir) remove(pred_file(dir, episode, p, sizeof p));
}

/* After a stop at a broken episode: says how many episodes were never evaluated and which of
 * them still have an earlier run's predictions in DIR (left as they were, but not this run's). */
static void report_unreached(const act_eval_summary *s, const char *dir, char **sel) {
    int unreached = 0, stale = 0;
    char first[1400] = "", p[1400];
    for (int i = 0; i < s->n_episodes; i++) {
        if (s->episodes[i].steps || s->episodes[i].failed) continue;
        unreached++;
        struct stat st;
        if (dir && stat(pred_file(dir, sel[i], p, sizeof p), &st) == 0) {
            if (!stale++) snprintf(first, sizeof first, "%s", p);
        }
    }
    if (!unreached) return;
    fprintf(stderr, "act-infer eval: %d episode%s not evaluated", unreached, unreached > 1 ? "s" : "");
    if (stale)
        fprintf(stderr, "; %d of them still ha%s an earlier run's predictions in %s (e.g. %s), not this run's",
                stale, stale > 1 ? "ve" : "s", dir, first);
    fputc('\n', stderr);
}

int act_cmd_eval(int argc, char **argv) {
    eval_args a;
    int rc = parse_eval_args(argc, argv, &a);
    if (rc == -2) return 0;
    if (rc != 0) return rc;

    char err[ACT_ERR_LEN];
    char **all = NULL;
    int nall = 0;
    if (act_episode_list(a.episodes, a.n_episode_args, &all, &nall, err, sizeof err) != 0) {
        fprintf(stderr, "act-infer eval: %s\n", err);
        return INFER_EXIT_FAIL;
    }
    char **sel = calloc((size_t)nall, sizeof(char *));
    int *sel_index = calloc((size_t)nall, sizeof(int));
    int nsel = 0;
    for (int i = a.shard_i; sel && sel_index && i < nall; i += a.shard_n) {
        sel_index[nsel] = i;
        sel[nsel++] = all[i];
    }
    const char *preds = a.save;
    char preds_buf[1100];
    if (a.plots && !preds) {
        snprintf(preds_buf, sizeof preds_buf, "%s/predictions", a.plots);
        preds = preds_buf;
    }
    infer_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    act_eval_summary sum;
    memset(&sum, 0, sizeof sum);
    act_stream *st = NULL;
    const uint8_t *reg_blocks[2];
    int n_reg = 0;   /* reader buffers registered with the session */
    infer_buffers bufs = {0};
    float *tnorm = NULL;
    act_npy *pf = NULL;
    rc = INFER_EXIT_FAIL;
    if (!sel || !sel_index) { fprintf(stderr, "act-infer eval: out of memory\n"); goto done; }
    /* over the whole list, not this shard's part: shards writing to one DIR must not overwrite
     * each other's files */
    if (preds && duplicate_stems(all, nall) != 0) goto done;
    if ((a.json && infer_output_writable("eval", "--json", a.json) != 0) || (a.plots && make_dir(a.plots) != 0) ||
        (preds && make_dir(preds) != 0))
        goto done;
    if (nsel == 0) fprintf(stderr, "act-infer eval: shard %d/%d of %d episodes is empty\n", a.shard_i, a.shard_n, nall);

    int orc = infer_open("eval", a.model, &a.ro, &ctx);
    if (orc != 0) { rc = orc; goto done; }
    const act_config *cfg = ctx.cfg;
    if (act_eval_init(&sum, cfg, infer_device_name(ctx.device), infer_precision_name(ctx.precision),
                      a.shard_i, a.shard_n, nsel, err, sizeof err) != 0 ||
        infer_buffers_alloc(&ctx, &bufs) != 0 ||
        !(tnorm = malloc(sizeof(float) * (size_t)ctx.batch * cfg->pred_horizon * cfg->action_dim))) {
        fprintf(stderr, "act-infer eval: %s\n", err[0] ? err : "out of memory");
        goto done;
    }
    snprintf(sum.device_name, sizeof sum.device_name, "%s", act_session_device_name(ctx.session));
    sum.batch = ctx.batch;
    snprintf(sum.pad_batches, sizeof sum.pad_batches, "%s",
             ctx.pad == INFER_PAD_ON ? "on" : ctx.pad == INFER_PAD_FEW ? "few" : "off");
    for (int i = 0; i < nsel; i++) {
        snprintf(sum.episodes[i].name, sizeof sum.episodes[i].name, "%s", act_episode_basename(sel[i]));
        sum.episodes[i].index = sel_index[i];
        sum.episodes[i].number = act_episode_number(sel[i]);
    }
    act_eval_set_list(&sum, all, nall);
    progress pg = {isatty(STDERR_FILENO), nsel, act_now(), 0};
    double t0 = act_now();
    if (act_stream_open(sel, nsel, cfg, ctx.batch, &st, err, sizeof err) != 0) {
        fprintf(stderr, "act-infer eval: %s\n", err);
        goto done;
    }
    if (ctx.device == ACT_DEVICE_CUDA && !a.copy_frames) n_reg = register_reader(&ctx, st, reg_blocks);
    int skip = -1, done_eps = 0, any_failed = 0, aborted = 0;
    long long padded_rows = 0;   /* rows run past the episodes' ends (--pad-batches) */
    size_t chunk = (size_t)cfg->pred_horizon * cfg->action_dim;
    const act_ep_batch *b;
    /* The steady rate: the first step at each batch size runs eagerly and sets up its plans (on
     * CUDA it measures the conv/GEMM algorithms), the second captures the step's graph, so only
     * iterations from the third step of a size on count, each from the end of the one before
     * (the reader's wait, the step, the metrics). An episode's share counts once it succeeded. */
    double t_last = act_now(), ep_steady_s = 0, ep_steady_ts = 0;
    int stop_sig = 0, cur = -1;   /* the signal that stopped the run; the episode in flight */
    while (!aborted && (b = next_batch(st, &sum.reader_wait_s)) != NULL) {
        if ((stop_sig = infer_stop_requested()) != 0) {
            aborted = 1;
            break;
        }
        act_eval_episode *e = &sum.episodes[b->episode];
        if (b->first) cur = b->episode;
        if (b->first) ep_steady_s = ep_steady_ts = 0;
        if (b->episode == skip) {
            t_last = act_now();
            continue;
        }
        e->steps = b->T;
        if (b->first && b->reader[0]) snprintf(e->reader, sizeof e->reader, "%s", b->reader);
        int bad = b->failed;
        if (bad) snprintf(e->error, sizeof e->error, "%s", b->err);
        if (!bad && b->first && preds) {
            char p[1400];
            int64_t shape[3] = {b->T, cfg->pred_horizon, cfg->action_dim};
            bad = act_npy_open(pred_file(preds, sel[b->episode], p, sizeof p), shape, 3, &pf, e->error,
                               sizeof e->error) != 0;
        }
        int steady = 0;
        if (!bad) {
            int rows = 0;
            char why[ACT_ERR_LEN];
            bad = infer_run_batch(&ctx, b, 1, &bufs, &rows, why, sizeof why) != 0;
            if (bad) act_errf(e->error, sizeof e->error, "%s: %s", sel[b->episode], why);
            if (!bad && rows > 0 && rows <= ctx.batch) {
                steady = ctx.ran[rows] > 2;   /* this size's third step or later */
                padded_rows += rows - b->n;
            }
        }
        if (!bad && pf) bad = act_npy_write(pf, bufs.actions, (size_t)b->n * chunk, e->error, sizeof e->error) != 0;
        if (bad) {
            e->failed = 1;
            any_failed = 1;
            sum.timesteps -= e->s.kl_count;
            act_npy_close(pf, 1, NULL, 0);
            pf = NULL;
            drop_stale_prediction(preds, sel[b->episode]);
            skip = b->episode;
            done_eps++;
            if (pg.on) fputc('\n', stderr);
            fprintf(stderr, "act-infer eval: %s%s\n", e->error, a.keep_going ? " (--keep-going: continuing)" : "");
            if (!a.keep_going) aborted = 1;
            t_last = act_now();
            continue;
        }
        act_normalize_action(ctx.model, b->targets, tnorm, b->n * cfg->pred_horizon);
        act_eval_add_batch(e, cfg, b->n, bufs.actions, b->targets, b->is_pad, bufs.post_actions_norm, tnorm, bufs.kl);
        sum.timesteps += b->n;
        double now = act_now();
        if (steady) {
            ep_steady_s += now - t_last;
            ep_steady_ts += b->n;
        }
        t_last = now;
        if (b->last) {
            cur = -1;
            done_eps++;
            if (pf && act_npy_close(pf, 0, e->error, sizeof e->error) != 0) {
                drop_stale_prediction(preds, sel[b->episode]);
                e->failed = 1;
                any_failed = 1;
                sum.timesteps -= e->s.kl_count;
                fprintf(stderr, "act-infer eval: %s\n", e->error);
                if (!a.keep_going) aborted = 1;
            } else {
                sum.steady_s += ep_steady_s;
                sum.steady_timesteps += ep_steady_ts;
            }
            pf = NULL;
        }
        progress_show(&pg, done_eps, (long long)sum.timesteps, 0);
    }
    sum.elapsed_s = sum.elapsed_max_s = act_now() - t0;
    sum.padded_rows = (double)padded_rows;
    unregister_reader(&ctx, reg_blocks, &n_reg);   /* before the stream frees them */
    act_stream_close(st);
    st = NULL;
    if (stop_sig) {
        aborted = 1;
        /* the episode in flight has no predictions file: its partial one was never committed */
        if (cur >= 0 && !sum.episodes[cur].failed) sum.episodes[cur].steps = 0;
        if (pg.on) fputc('\n', stderr);
        fprintf(stderr, "act-infer eval: stopped by %s after %d of %d episodes\n", infer_signal_name(stop_sig),
                done_eps, nsel);
        rc = 128 + stop_sig;
    } else if (aborted) {
        fprintf(stderr, "act-infer eval: stopped at the first broken episode (--keep-going evaluates the rest)\n");
    }
    if (aborted) {
        report_unreached(&sum, preds, sel);
        struct stat js;
        if (a.json && stat(a.json, &js) == 0 && S_ISREG(js.st_mode))
            fprintf(stderr, "act-infer eval: %s not written: the file there is an earlier run's summary\n", a.json);
        goto done;
    }
    progress_show(&pg, done_eps, (long long)sum.timesteps, 1);
    /* the summary file before the tables: a reader of our output that goes away (| head) ends
     * the process at the tables, and the file should be there by then */
    if (a.json && act_eval_write_json(&sum, a.json, err, sizeof err) != 0) {
        fprintf(stderr, "act-infer eval: %s\n", err);
        goto done;
    }
    print_table(&sum);
    print_overall(&sum);
    print_steps(&ctx, padded_rows);
    if (a.plots && run_plots(a.plots, preds, a.json, &sum, sel) != 0 && !infer_stop_requested()) goto done;
    rc = any_failed ? INFER_EXIT_FAIL : INFER_EXIT_OK;
    if ((stop_sig = infer_stop_requested()) != 0) {
        /* it came during the last step, the summary or the plots: every episode was evaluated
         * and written; the exit still says the run was asked to stop */
        fprintf(stderr, "act-infer eval: %s came after the last step: every episode was evaluated and its "
                "outputs written%s\n", infer_signal_name(stop_sig), a.plots ? " (the plots may be cut short)" : "");
        rc = 128 + stop_sig;
    }
done:
    act_npy_close(pf, 1, NULL, 0);
    unregister_reader(&ctx, reg_blocks, &n_reg);
    act_stream_close(st);
    free(tnorm);
    infer_buffers_free(&bufs);
    act_eval_free(&sum);
    if (ctx.model) infer_close(&ctx);
    free(sel);
    free(sel_index);
    act_episode_free_list(all, nall);
    return rc;
}

/* The merge adds the shards' sums exactly, but a sum's last bits depend on the rows each step
 * computed (a GEMM's blocking): shards run at different batch sizes, or padded by --pad-batches
 * few (which pads by the sizes that process ran before), match a single run only to rounding. */
static void note_inexact_merge(const act_eval_summary *s, int n) {
    int batches_differ = 0, few = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].batch && s[0].batch && s[i].batch != s[0].batch) batches_differ = 1;
        if (!strcmp(s[i].pad_batches, "few")) few = 1;
    }
    if (batches_differ)
        fprintf(stderr, "act-infer eval-merge: note: the shards ran at different --batch sizes (summary 0 at %d): the "
                "merged metrics match a single run's to rounding, not bit for bit (\"batch\": null)\n", s[0].batch);
    else if (few && s[0].shard_count > 1)
        fprintf(stderr, "act-infer eval-merge: note: the shards ran with --pad-batches few (CUDA's default), which pads "
                "by the batch sizes each process ran before: the merged metrics match a single run's to rounding; "
                "--pad-batches on or off makes them bit for bit\n");
}

int act_cmd_eval_merge(int argc, char **argv) {
    const char *out = NULL, *val;
    char **inputs = calloc((size_t)(argc > 0 ? argc : 1), sizeof(char *));
    int n = 0;
    if (!inputs) return INFER_EXIT_FAIL;
    for (int i = 0; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(MERGE_USAGE, stdout); free(inputs); return 0; }
        if ((r = infer_opt(argc, argv, &i, "--json", &val)) != 0) {
            if (r < 0) { free(inputs); return infer_usage("eval-merge", MERGE_USAGE, "--json needs a value"); }
            out = val;
            continue;
        }
        if (!strncmp(argv[i], "--", 2)) {
            free(inputs);
            return infer_usage("eval-merge", MERGE_USAGE, "unknown argument '%s'", argv[i]);
        }
        inputs[n++] = argv[i];
    }
    if (!out) { free(inputs); return infer_usage("eval-merge", MERGE_USAGE, "--json ALL.json is required"); }
    if (!n) { free(inputs); return infer_usage("eval-merge", MERGE_USAGE, "give the shard summaries to merge"); }
    act_eval_summary *s = calloc((size_t)n, sizeof *s), merged;
    memset(&merged, 0, sizeof merged);
    char err[ACT_ERR_LEN];
    int rc = INFER_EXIT_FAIL, loaded = 0;
    if (!s) goto done;
    for (; loaded < n; loaded++) {
        if (act_eval_read_json(inputs[loaded], &s[loaded], err, sizeof err) != 0) {
            fprintf(stderr, "act-infer eval-merge: %s\n", err);
            goto done;
        }
    }
    if (act_eval_merge(s, n, &merged, err, sizeof err) != 0 ||
        act_eval_write_json(&merged, out, err, sizeof err) != 0) {
        fprintf(stderr, "act-infer eval-merge: %s\n", err);
        goto done;
    }
    print_overall(&merged);
    note_inexact_merge(s, n);
    rc = INFER_EXIT_OK;
done:
    for (int i = 0; i < loaded; i++) act_eval_free(&s[i]);
    free(s);
    act_eval_free(&merged);
    free(inputs);
    return rc;
}
