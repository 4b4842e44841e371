/* infer_bench.c - `act-infer bench`: how fast is one policy step, and where does the time go.
 *
 * Design:
 * - One session sized for the largest batch asked for; per batch size: warmup, then timed
 *   act_run calls (host clock around the whole call: act_run returns only when the chunk is on
 *   the host, so each sample is the full step a user sees - upload, preprocess, vision,
 *   transformer, download). Then a separate, shorter profiled pass reads the per-stage times
 *   (CUDA events / monotonic clocks inside the engine) and the same time in finer sections
 *   (the trunk's stem and four layers, keypoints; latent, memory, decoder, head). Profiling
 *   disables CUDA graphs, so the stage sum is reported beside, never mixed into, the clean
 *   latency numbers.
 * - Inputs look like camera frames (gradients, coloured shapes, sensor noise; never zeros) and
 *   are rotated: a pool of max_batch + ROTATIONS - 1 frames per camera, and iteration i reads
 *   the window starting at frame i % ROTATIONS, so consecutive steps never read the same window
 *   (at batch 1, eight distinct inputs in turn).
 *   --inputs DIR replaces the generated pool with raw files (bench/compare_torch.py writes them
 *   so that PyTorch and act-infer time the very same frames).
 * - Memory: device bytes held by the session, host peak RSS (VmHWM), and beside them the
 *   weight and input-pool bytes, so the engine's own share can be read off. On CUDA also the
 *   driver's count (cudaMemGetInfo since the backend's setup), which sees the libraries' own
 *   buffers and the graphs too; the device goal is judged on it.
 * - Output: a table on stdout, and with --json a JSON document for scripts; --check-output adds
 *   the chunks of window 0 of the first batch size (one per input) so a caller can verify that
 *   the fast answer is the right one. Both name the backend switches set in the environment
 *   (ACT_CUDA_*, ACT_CPU_*, ...: they change what a step runs), so a figure is never read
 *   without them.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "act.h"
#include "act_infer_cmds.h"
#include "cores.h"
#include "frames.h"
#include "infer_common.h"
#include "json.h"
#include "outfile.h"
#include "rng.h"
#include "util.h"

#define MAX_BATCHES 16
#define ROTATIONS 8
#define DEMO_MODEL "weights/demo.actw"

typedef struct bench_args {
    const char *model, *json, *inputs;
    act_device device;
    int device_set;
    act_precision precision;
    int batches[MAX_BATCHES], n_batches;
    int iters, warmup, profile_iters;
    int use_graphs, check_output, staged, in_place;
    uint64_t seed;
} bench_args;

typedef struct batch_result {
    int batch;
    double min, p50, p90, p99, mean;   /* ms */
    double steps_per_s;
    double *samples;                   /* ms, in run order (owned); JSON carries them for merging runs */
    double first_ms[2];                /* the first two warmup steps (CUDA: plans and algorithm
                                        * measurements, then the graph's capture) */
    int n_first;                       /* how many of them ran (--warmup) */
    int windows;                       /* input windows the steps rotate over (ROTATIONS unless
                                        * --inputs holds fewer than batch + ROTATIONS - 1) */
    int have_stages;
    double section_ms[ACT_SECTION_COUNT];   /* the stages, finer (act_section; stage_ms sums them) */
} batch_result;

typedef struct input_pool {
    int n;                       /* frames per camera */
    float *qpos;                 /* [n][obs_dim] */
    uint8_t *frames[ACT_MAX_CAMS];
    size_t bytes;
    const uint8_t **items;       /* --in-place-inputs: [num_cams][max_batch] frame pointers */
} input_pool;

static const char *const USAGE =
        "usage: act-infer bench [--model M.actw] [--device cuda|cpu] [--precision fp32|tf32|bf16|fp16]\n"
        "                       [--batch 1,8,64,256] [--iters N] [--warmup N] [--profile-iters N]\n"
        "                       [--no-graph] [--staged-inputs | --in-place-inputs] [--json OUT.json]\n"
        "                       [--inputs DIR] [--seed S]\n"
        "                       [--check-output]\n"
        "\n"
        "Times one policy step (uint8 frames + qpos in, action chunk out, preprocessing included)\n"
        "per batch size: min/p50/p90/p99/mean latency, steps/s and images/s, a per-stage breakdown\n"
        "from a separate profiled pass (and the same time by section: the ResNet stem and layers,\n"
        "keypoints, latent, memory, decoder, head), device memory held (weights, activations,\n"
        "workspaces; on CUDA also the driver's count, which the goal is judged on) and host peak\n"
        "RSS, each against its goal (bench/RESULTS.md's goal table).\n"
        "  --model        weight file (default: " DEMO_MODEL ", the built-in demo model)\n"
        "  --device       default: cuda when a CUDA device is usable, else cpu\n"
        "  --precision    fp32 (default), tf32, bf16, fp16 (CUDA; the CPU backend is fp32 only)\n"
        "  --batch        comma-separated batch sizes (default: cuda 1,8,64,256; cpu 1)\n"
        "  --iters        timed steps per batch size (default: cuda 200; cpu 10)\n"
        "  --warmup       untimed steps first (default: cuda 20; cpu 2); the first two are timed\n"
        "                 apart and reported as 'first' (CUDA: plans and algorithm measurements,\n"
        "                 then the graph's capture: what a server's warm-up pays per batch size)\n"
        "  --profile-iters steps of the profiled pass (default: min(iters, 10))\n"
        "  --no-graph     CUDA: launch kernels one by one instead of replaying a CUDA graph\n"
        "  --staged-inputs write each step's frames and qpos into the session's own (pinned on CUDA)\n"
        "                 input buffers before the timer starts, as a camera driver or act-serve does\n"
        "                 (act_session_input_buffers), so act_run has nothing to copy; the torch\n"
        "                 peers of bench/compare_torch.py likewise start from pinned frames. Without\n"
        "                 it act_run copies them from the bench's pool inside the timed step\n"
        "  --in-place-inputs register the pool with the session (act_session_register_host) and\n"
        "                 pass one pointer per frame (image_items): the step reads the frames where\n"
        "                 they lie (CUDA: the GPU pulls them over PCIe), as act-serve does for its\n"
        "                 shared-memory clients; nothing is copied on the host\n"
        "  --json         also write the results as JSON\n"
        "  --inputs DIR   frames from DIR/qpos.f32 ([N][obs_dim] float32) and DIR/<camera>.u8\n"
        "                 ([N][H][W][3] uint8) instead of generated ones; N >= largest batch\n"
        "  --seed         generator seed for the frames and qpos (default 1)\n"
        "  --check-output put the chunks of the first batch size's first step (window 0, one per input)\n"
        "                 into the JSON (first_output)\n";

static void usage(FILE *f) { fputs(USAGE, f); }

#define bench_usage(...) infer_usage("bench", USAGE, __VA_ARGS__)


static int parse_batches(const char *s, bench_args *a) {
    a->n_batches = 0;
    const char *p = s;
    while (*p) {
        char tok[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof tok || a->n_batches == MAX_BATCHES) return -1;
        memcpy(tok, p, len);
        tok[len] = 0;
        if (infer_parse_int(tok, 1, 65536, &a->batches[a->n_batches++])) return -1;
        p += len;
        if (*p == ',' && !*++p) return -1;   /* "1," names no last size */
    }
    return a->n_batches ? 0 : -1;
}

/* Returns 0 on success, 1 after --help, 2 on a usage error (message printed). */
static int parse_args(int argc, char **argv, bench_args *a) {
    memset(a, 0, sizeof *a);
    a->iters = a->warmup = a->profile_iters = -1;
    a->use_graphs = 1;
    a->seed = 1;
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *v = NULL;
        int *count = NULL, lo = 0, r = 0;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) { usage(stdout); return 1; }
        if (!strcmp(o, "--no-graph")) { a->use_graphs = 0; continue; }
        if (!strcmp(o, "--check-output")) { a->check_output = 1; continue; }
        if (!strcmp(o, "--staged-inputs")) { a->staged = 1; continue; }
        if (!strcmp(o, "--in-place-inputs")) { a->in_place = 1; continue; }
        if ((r = infer_opt(argc, argv, &i, "--model", &v))) a->model = v;
        else if ((r = infer_opt(argc, argv, &i, "--json", &v))) a->json = v;
        else if ((r = infer_opt(argc, argv, &i, "--inputs", &v))) a->inputs = v;
        else if ((r = infer_opt(argc, argv, &i, "--device", &v))) {
            if (r > 0 && infer_parse_device(v, &a->device)) return bench_usage("--device '%s': expected cpu or cuda", v);
            a->device_set = 1;
        } else if ((r = infer_opt(argc, argv, &i, "--precision", &v))) {
            if (r > 0 && infer_parse_precision(v, &a->precision))
                return bench_usage("--precision '%s': expected fp32, tf32, bf16 or fp16", v);
        } else if ((r = infer_opt(argc, argv, &i, "--batch", &v))) {
            if (r > 0 && parse_batches(v, a))
                return bench_usage("--batch '%s': expected up to %d comma-separated sizes in 1..65536", v, MAX_BATCHES);
        } else if ((r = infer_opt(argc, argv, &i, "--iters", &v))) count = &a->iters, lo = 1;
        else if ((r = infer_opt(argc, argv, &i, "--warmup", &v))) count = &a->warmup;
        else if ((r = infer_opt(argc, argv, &i, "--profile-iters", &v))) count = &a->profile_iters;
        else if ((r = infer_opt(argc, argv, &i, "--seed", &v)) > 0) {
            char *end;
            errno = 0;
            a->seed = strtoull(v, &end, 10);
            /* digits only: strtoull skips blanks and wraps a sign (' -3' became 2^64 - 3) */
            if (errno || end == v || *end || !isdigit((unsigned char)*v))
                return bench_usage("--seed '%s': expected a non-negative integer", v);
        } else if (!r) {
            return bench_usage("unknown option '%s'", o);
        }
        if (r < 0) return bench_usage("%s needs a value", o);
        if (count && infer_parse_int(v, lo, 10000000, count))
            return bench_usage("%s '%s': expected an integer in %d..10000000", o, v, lo);
    }
    if (a->staged && a->in_place)
        return bench_usage("--staged-inputs and --in-place-inputs are two ways to give the frames: pick one");
    return 0;
}

/* Defaults that depend on the device: seconds on a CPU, a stable median on a GPU. */
static void apply_defaults(bench_args *a) {
    int cuda = a->device == ACT_DEVICE_CUDA;
    if (!a->n_batches) {
        static const int gpu_batches[] = {1, 8, 64, 256};
        a->n_batches = cuda ? 4 : 1;
        for (int i = 0; i < a->n_batches; i++) a->batches[i] = cuda ? gpu_batches[i] : 1;
    }
    if (a->iters < 0) a->iters = cuda ? 200 : 10;
    if (a->warmup < 0) a->warmup = cuda ? 20 : 2;
    if (a->profile_iters < 0) a->profile_iters = a->iters < 10 ? a->iters : 10;
}

/* The demo model: relative to the working directory, else next to the build directory. */
static const char *find_demo_model(char *buf, size_t len) {
    struct stat st;
    if (stat(DEMO_MODEL, &st) == 0) return DEMO_MODEL;
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(buf, len, "%s/../%s", exe, DEMO_MODEL);
            if (stat(buf, &st) == 0) return buf;
        }
    }
    return NULL;
}

/* ---- inputs ---- */

static void pool_free(input_pool *p) {
    free(p->qpos);
    for (int c = 0; c < ACT_MAX_CAMS; c++) free(p->frames[c]);
    free(p->items);
    memset(p, 0, sizeof *p);
}

static int pool_generate(input_pool *p, const act_config *cfg, int n, uint64_t seed) {
    size_t fb = (size_t)cfg->image_h * cfg->image_w * 3;
    memset(p, 0, sizeof *p);
    p->n = n;
    p->qpos = malloc(sizeof(float) * n * cfg->obs_dim);
    if (!p->qpos) return -1;
    uint64_t s = seed;
    for (int i = 0; i < n * cfg->obs_dim; i++) p->qpos[i] = 3.0f * act_unit(&s) - 1.5f;  /* joint angles, rad */
    for (int c = 0; c < cfg->num_cams; c++) {
        /* whole pages: --in-place-inputs registers each camera's block (CUDA pins whole pages,
         * so two blocks sharing one would clash) */
        p->frames[c] = act_page_alloc(fb * n, NULL);
        if (!p->frames[c]) { pool_free(p); return -1; }
        for (int i = 0; i < n; i++)
            act_synthetic_frame(p->frames[c] + fb * i, cfg->image_h, cfg->image_w,
                       act_splitmix64(seed * 1000003ull + (uint64_t)c * 7919ull + (uint64_t)i));
    }
    p->bytes = sizeof(float) * n * cfg->obs_dim + fb * n * cfg->num_cams;
    return 0;
}

/* Reads a whole raw file whose size must be a positive multiple of unit; *count = size / unit. */
static void *read_raw(const char *path, size_t unit_bytes, size_t *count, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "%s: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fileno(f), &st) || st.st_size <= 0 || (size_t)st.st_size % unit_bytes) {
        snprintf(err, errlen, "%s: size %lld is not a positive multiple of %zu bytes (one input)",
                 path, (long long)st.st_size, unit_bytes);
        fclose(f);
        return NULL;
    }
    void *buf = act_page_alloc((size_t)st.st_size, NULL);   /* whole pages: registrable */
    if (!buf || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        snprintf(err, errlen, "%s: %s", path, buf ? "short read" : "out of memory");
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *count = (size_t)st.st_size / unit_bytes;
    return buf;
}

static int pool_load(input_pool *p, const act_config *cfg, const char *dir, char *err, size_t errlen) {
    char path[1024];
    size_t n = 0, nc = 0, fb = (size_t)cfg->image_h * cfg->image_w * 3;
    memset(p, 0, sizeof *p);
    snprintf(path, sizeof path, "%s/qpos.f32", dir);
    p->qpos = read_raw(path, sizeof(float) * cfg->obs_dim, &n, err, errlen);
    if (!p->qpos) return -1;
    for (int c = 0; c < cfg->num_cams; c++) {
        snprintf(path, sizeof path, "%s/%s.u8", dir, cfg->camera_names[c]);
        p->frames[c] = read_raw(path, fb, &nc, err, errlen);
        if (!p->frames[c]) { pool_free(p); return -1; }
        if (nc != n) {
            snprintf(err, errlen, "%.400s: holds %zu frames of %dx%dx3, but qpos.f32 holds %zu inputs",
                     path, nc, cfg->image_h, cfg->image_w, n);
            pool_free(p);
            return -1;
        }
    }
    if (n > (size_t)1 << 30) { snprintf(err, errlen, "%s: too many inputs", dir); pool_free(p); return -1; }
    p->n = (int)n;
    p->bytes = sizeof(float) * n * cfg->obs_dim + fb * n * cfg->num_cams;
    return 0;
}

static void pool_window(const input_pool *p, const act_config *cfg, int batch, int start, act_inputs *in) {
    size_t fb = (size_t)cfg->image_h * cfg->image_w * 3;
    memset(in, 0, sizeof *in);
    in->batch = batch;
    in->qpos = p->qpos + (size_t)start * cfg->obs_dim;
    for (int c = 0; c < cfg->num_cams; c++) in->images[c] = p->frames[c] + fb * start;
}

/* The window of the pool a step reads; with --staged-inputs it is first written into the
 * session's own input buffers (outside the timed region), and the step reads it there. */
static void step_inputs(act_session *s, const input_pool *p, const act_config *cfg, const bench_args *a,
                        int batch, int start, act_inputs *in) {
    pool_window(p, cfg, batch, start, in);
    size_t fb = (size_t)cfg->image_h * cfg->image_w * 3;
    if (a->in_place) {
        for (int c = 0; c < cfg->num_cams; c++) {
            const uint8_t **it = p->items + (size_t)c * batch;
            for (int b = 0; b < batch; b++) it[b] = in->images[c] + (size_t)b * fb;
            in->images[c] = NULL;
            in->image_items[c] = it;
        }
        return;
    }
    if (!a->staged) return;
    act_input_buffers ib;
    act_session_input_buffers(s, &ib);
    memcpy(ib.qpos, in->qpos, sizeof(float) * batch * cfg->obs_dim);
    in->qpos = ib.qpos;
    for (int c = 0; c < cfg->num_cams; c++) {
        memcpy(ib.images[c], in->images[c], fb * batch);
        in->images[c] = ib.images[c];
    }
}

/* ---- timing ---- */

static double now_ms(void) { return act_now() * 1e3; }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(const double *sorted, int n, double pct) { /* nearest rank */
    int idx = (int)ceil(pct / 100.0 * n) - 1;
    return sorted[idx < 0 ? 0 : idx >= n ? n - 1 : idx];
}

static int bench_batch(act_session *s, const act_config *cfg, const input_pool *pool, const bench_args *a,
                       int batch, float *out, batch_result *r, char *err, size_t errlen) {
    int windows = pool->n - batch + 1 < ROTATIONS ? pool->n - batch + 1 : ROTATIONS;
    act_outputs o = {0};
    act_inputs in;
    o.actions = out;
    memset(r, 0, sizeof *r);
    r->batch = batch;
    r->windows = windows;
    if (windows < ROTATIONS)
        fprintf(stderr, "act-infer bench: batch %d rotates over %d input window%s, not %d: --inputs holds %d "
                "samples (%d would give %d); steps that reread the same frames may find them in caches\n", batch,
                windows, windows > 1 ? "s" : "", ROTATIONS, pool->n, batch + ROTATIONS - 1, ROTATIONS);
    for (int i = 0; i < a->warmup; i++) {
        step_inputs(s, pool, cfg, a, batch, i % windows, &in);
        double t0 = now_ms();
        if (act_run(s, &in, &o, err, errlen)) return -1;
        if (i < 2) r->first_ms[r->n_first++] = now_ms() - t0;
    }
    double *t = malloc(sizeof(double) * a->iters);
    r->samples = malloc(sizeof(double) * a->iters);
    if (!t || !r->samples) { free(t); snprintf(err, errlen, "out of memory for %d samples", a->iters); return -1; }
    double total = 0;
    for (int i = 0; i < a->iters; i++) {
        step_inputs(s, pool, cfg, a, batch, i % windows, &in);
        double t0 = now_ms();
        if (act_run(s, &in, &o, err, errlen)) { free(t); return -1; }
        t[i] = now_ms() - t0;
        total += t[i];
    }
    memcpy(r->samples, t, sizeof(double) * a->iters);
    qsort(t, a->iters, sizeof(double), cmp_double);
    r->min = t[0];
    r->p50 = percentile(t, a->iters, 50);
    r->p90 = percentile(t, a->iters, 90);
    r->p99 = percentile(t, a->iters, 99);
    r->mean = total / a->iters;
    r->steps_per_s = batch * 1e3 / r->mean;
    free(t);

    if (a->profile_iters > 0) {
        act_session_profile(s, 1);
        int ok = 1;
        for (int i = 0; i < a->profile_iters && ok; i++) {
            double sec[ACT_SECTION_COUNT];
            step_inputs(s, pool, cfg, a, batch, i % windows, &in);
            if (act_run(s, &in, &o, err, errlen)) { act_session_profile(s, 0); return -1; }
            if (act_session_section_ms(s, sec)) { ok = 0; break; }
            for (int k = 0; k < ACT_SECTION_COUNT; k++) r->section_ms[k] += sec[k] / a->profile_iters;
        }
        act_session_profile(s, 0);
        r->have_stages = ok;
    }
    return 0;
}

/* ---- machine facts ---- */

/* Peak RSS of this program: VmHWM of the current address space. getrusage's ru_maxrss is the
 * fallback only: Linux carries the pre-exec peak of the forked parent into it, so a bench started
 * from a large process (Python with torch loaded) would report that process's memory. */
static size_t peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        unsigned long long kib = 0;
        int found = 0;
        while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "VmHWM: %llu kB", &kib) == 1;
        fclose(f);
        if (found) return (size_t)kib * 1024;
    }
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? 0 : (size_t)ru.ru_maxrss * 1024;  /* Linux: KiB */
}

/* the value of the first "key : value" line of /proc/cpuinfo; 0 if there is none */
static int cpuinfo_field(const char *key, char *buf, size_t len) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (colon && !strncmp(line, key, strlen(key))) {
            snprintf(buf, len, "%s", colon + 1 + (colon[1] == ' '));
            buf[strcspn(buf, "\n")] = 0;
            found = 1;
        }
    }
    fclose(f);
    return found;
}

static void host_cpu_name(char *buf, size_t len) {
    if (!cpuinfo_field("model name", buf, len)) snprintf(buf, len, "unknown");
}

/* GPU clocks are informative only (the engine has no business reading them): asked of
 * nvidia-smi when it is there, else "n/a". */
static void gpu_clocks(char *buf, size_t len) {
    snprintf(buf, len, "n/a");
    FILE *f = popen("nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader 2>/dev/null", "r");
    if (!f) return;
    char line[256];
    if (fgets(line, sizeof line, f) && strchr(line, ',')) {
        line[strcspn(line, "\n")] = 0;
        snprintf(buf, len, "sm, max sm, mem: %.200s", line);
    }
    pclose(f);
}

/* CPU clocks: the current frequency of core 0 from cpufreq when the kernel exposes it, else the
 * "cpu MHz" /proc/cpuinfo reports (a VM's nominal clock). */
static void cpu_clocks(char *buf, size_t len) {
    double mhz = 0;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq", "r");
    const char *src = "cpufreq";
    if (f) {
        long khz = 0;
        if (fscanf(f, "%ld", &khz) == 1) mhz = khz / 1000.0;
        fclose(f);
    }
    char v[64];
    if (mhz <= 0 && cpuinfo_field("cpu MHz", v, sizeof v)) {
        mhz = atof(v);
        src = "/proc/cpuinfo";
    }
    if (mhz > 0) snprintf(buf, len, "%.0f MHz (%s)", mhz, src);
    else snprintf(buf, len, "n/a");
}

/* ---- output ---- */

typedef struct bench_report {
    const bench_args *a;
    const act_config *cfg;
    const char *model_path, *device_name;
    char host_cpu[256], clocks[256], date[32];
    act_cores cores;                /* the CPUs the process may use: the thread counts follow them */
    size_t weight_file_bytes, device_bytes, rss_bytes, input_bytes;
    act_memory mem;                 /* what the device bytes hold */
    const batch_result *res;
    int n_res;
    const float *first_chunk;   /* [first batch][H][A] or NULL */
} bench_report;

/* The memory goals (issue 4, bench/RESULTS.md's goal table; ARCHITECTURE section 9 has the
 * latency ones): device memory <= 1.5x the fp32 weight bytes plus the activations of the largest
 * batch; host peak RSS <= the weight file + 200 MB, decimal: 2e8 bytes (the frames the
 * bench keeps in its input pool are the bench's, not the engine's, so they are left out) */
static int max_batch(const bench_report *r) {
    int b = 1;
    for (int i = 0; i < r->n_res; i++) if (r->res[i].batch > b) b = r->res[i].batch;
    return b;
}
static size_t device_goal(const bench_report *r) {
    return (size_t)(1.5 * (double)r->cfg->n_params * 4) + r->mem.activations;
}
/* The device memory the goal is judged on: the driver's count where the backend has one (CUDA:
 * what the device lost since the backend's setup, so cuBLAS's and cuDNN's own buffers, the
 * graphs and the allocator's rounding count too), else the session's own allocations. The
 * CUDA context (~0.5 GiB, no engine can shrink it) stays outside, reported beside. */
static int driver_view(const bench_report *r) { return r->mem.driver_total > 0; }
static size_t device_judged(const bench_report *r) {
    return driver_view(r) ? r->mem.driver_held : r->device_bytes;
}
#define RSS_GOAL_EXTRA ((size_t)200000000)   /* 200 MB as the goal says it, not 200 MiB */
static size_t rss_goal(const bench_report *r) { return r->weight_file_bytes + RSS_GOAL_EXTRA; }
/* The host RSS the goal is about: the process's peak less the bench's own input pool and, on
 * the CPU backend, less its buffers (the CPU's "device" memory, held to the device goal like a
 * GPU's): what serving from this file costs the host beyond the activations any backend needs.
 * The buffers count at their allocated size; pages of them never written were never resident,
 * so this can undercount other host memory by as much (the bench's largest batch writes most). */
static size_t rss_counted(const bench_report *r) {
    size_t own = r->input_bytes + (r->a->device == ACT_DEVICE_CPU ? r->device_bytes : 0);
    return r->rss_bytes > own ? r->rss_bytes - own : 0;
}

/* a stage's time: the sum of its sections' */
static double stage_ms(const batch_result *b, int stage) {
    double t = 0;
    for (int k = 0; k < ACT_SECTION_COUNT; k++)
        if (act_section_stage((act_section)k) == (act_stage)stage) t += b->section_ms[k];
    return t;
}

/* The vision and transformer stages in their sections (ms, same profiled pass), with each
 * section's share of the step: where a profile starts looking. */
static void print_sections(const bench_report *r) {
    int any = 0;
    for (int i = 0; i < r->n_res; i++) any |= r->res[i].have_stages;
    if (!any) return;
    printf("\nsections (ms, same pass; %% of the step)\n%6s", "batch");
    for (int k = ACT_SECTION_STEM; k <= ACT_SECTION_HEAD; k++)
        printf(" %10s", act_section_name((act_section)k));
    printf("\n");
    for (int i = 0; i < r->n_res; i++) {
        const batch_result *b = &r->res[i];
        if (!b->have_stages) continue;
        double sum = 0;
        for (int k = 0; k < ACT_SECTION_COUNT; k++) sum += b->section_ms[k];
        printf("%6d", b->batch);
        for (int k = ACT_SECTION_STEM; k <= ACT_SECTION_HEAD; k++) printf(" %10.3f", b->section_ms[k]);
        printf("\n%6s", "");
        for (int k = ACT_SECTION_STEM; k <= ACT_SECTION_HEAD; k++)
            printf(" %9.1f%%", sum > 0 ? 100.0 * b->section_ms[k] / sum : 0.0);
        printf("\n");
    }
}

extern char **environ;

/* 1 when the environment entry kv ("NAME=value") is a switch of the engine, its emulator or its
 * BLAS: what an A/B run flips. OpenBLAS takes its thread count (the CPU backend's default
 * ACT_CPU_THREADS) from GOTO_NUM_THREADS or OMP_NUM_THREADS too, not only OPENBLAS_NUM_THREADS. */
static int is_switch(const char *kv) {
    static const char *const prefix[] = {"ACT_CUDA_", "ACT_CPU_", "ACT_POOL_", "ACT_EMU_", "ACT_COPY_",
                                         "OPENBLAS_", "GOTO_NUM_THREADS=", "OMP_NUM_THREADS="};
    if (!strchr(kv, '=')) return 0;
    for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++)
        if (!strncmp(kv, prefix[i], strlen(prefix[i]))) return 1;
    return 0;
}

static void print_table(const bench_report *r) {
    const act_config *cfg = r->cfg;
    printf("act-infer bench  %s\n", r->date);
    printf("model   %s (hash %s, %lld params, %d cameras %dx%d)\n", r->model_path, cfg->model_hash,
           (long long)cfg->n_params, cfg->num_cams, cfg->image_h, cfg->image_w);
    printf("device  %s: %s, %s%s\n", r->a->device == ACT_DEVICE_CUDA ? "cuda" : "cpu", r->device_name,
           infer_precision_name(r->a->precision),
           r->a->device == ACT_DEVICE_CUDA ? (r->a->use_graphs ? ", CUDA graphs" : ", no graphs") : "");
    printf("host    %s; clocks %s\n", r->host_cpu, r->clocks);
    char quota[48] = "no CPU quota";
    if (r->cores.quota > 0) snprintf(quota, sizeof quota, "CPU quota %.2f", r->cores.quota);
    printf("cores   %d online, %d usable (affinity %d, %s): the default thread counts follow the "
           "usable\n", r->cores.online, r->cores.usable, r->cores.affinity, quota);
    printf("env    ");
    int switches = 0;
    for (char **e = environ; *e; e++)
        if (is_switch(*e)) {
            printf(" %s", *e);
            switches++;
        }
    printf("%s\n", switches ? "" : " no engine switches set (the defaults)");
    printf("steps   %d warmup + %d timed per batch size; profiled pass %d steps\n", r->a->warmup,
           r->a->iters, r->a->profile_iters);
    printf("inputs  %s\n\n", r->a->staged ? "staged in the session's input buffers before each step (untimed)"
                             : r->a->in_place ? "read in place from the registered pool (image_items; no host copy)"
                                              : "copied by act_run from the bench's pool (timed)");
    printf("%6s %9s %9s %9s %9s %9s %11s %11s\n", "batch", "min ms", "p50 ms", "p90 ms", "p99 ms", "mean ms",
           "steps/s", "images/s");
    for (int i = 0; i < r->n_res; i++) {
        const batch_result *b = &r->res[i];
        printf("%6d %9.3f %9.3f %9.3f %9.3f %9.3f %11.1f %11.1f\n", b->batch, b->min, b->p50, b->p90, b->p99,
               b->mean, b->steps_per_s, b->steps_per_s * cfg->num_cams);
    }
    if (r->n_res && r->res[0].n_first) {
        printf("first  ");
        for (int i = 0; i < r->n_res; i++) {
            const batch_result *b = &r->res[i];
            printf(" batch %d:", b->batch);
            for (int k = 0; k < b->n_first; k++) printf(" %.1f", b->first_ms[k]);
            printf(" ms;");
        }
        printf("\n        (warmup steps 1-2 of each size: %s)\n", r->a->device != ACT_DEVICE_CUDA ? "buffers, lazy setup"
               : r->a->use_graphs ? "plans and algorithm measurements, then the graph's capture"
                                  : "plans and algorithm measurements");
    }
    printf("\nstages (ms, mean of the profiled pass%s; upload includes act_run's host copy of the "
           "frames%s)\n%6s", r->a->device == ACT_DEVICE_CUDA ? "; graphs and the upload lane off while profiling" : "",
           r->a->staged ? ", none here: --staged-inputs" : r->a->in_place ? ", none here: --in-place-inputs" : "",
           "batch");
    for (int k = 0; k < ACT_STAGE_COUNT; k++) printf(" %11s", act_stage_name((act_stage)k));
    printf(" %11s\n", "sum");
    for (int i = 0; i < r->n_res; i++) {
        const batch_result *b = &r->res[i];
        printf("%6d", b->batch);
        double sum = 0;
        for (int k = 0; k < ACT_STAGE_COUNT; k++) {
            if (b->have_stages) printf(" %11.3f", stage_ms(b, k)); else printf(" %11s", "n/a");
            sum += stage_ms(b, k);
        }
        if (b->have_stages) printf(" %11.3f\n", sum); else printf(" %11s\n", "n/a");
    }
    print_sections(r);
    printf("\nmemory  device %.1f MiB held; host peak RSS %.1f MiB (weight file %.1f MiB, input pool %.1f MiB)\n",
           r->device_bytes / 1048576.0, r->rss_bytes / 1048576.0, r->weight_file_bytes / 1048576.0,
           r->input_bytes / 1048576.0);
    printf("        device: weights %.1f, activations (batch %d) %.1f, workspaces %.1f MiB\n",
           r->mem.weights / 1048576.0, max_batch(r), r->mem.activations / 1048576.0,
           r->mem.workspace / 1048576.0);
    if (driver_view(r))
        printf("        device, the driver's count (cudaMemGetInfo): %.1f MiB held since the backend's setup\n"
               "        (cuBLAS, cuDNN, graphs and rounding included; a shared GPU's other processes too);\n"
               "        %.1f MiB before it (the CUDA context, other processes), of %.1f MiB\n",
               r->mem.driver_held / 1048576.0, r->mem.driver_before / 1048576.0,
               r->mem.driver_total / 1048576.0);
    printf("goal    %s (%.1f MiB) <= 1.5 x fp32 weights + activations = %.1f MiB: %s\n",
           r->a->device != ACT_DEVICE_CUDA ? "CPU backend buffers"
           : driver_view(r) ? "device, the driver's count" : "device", device_judged(r) / 1048576.0,
           device_goal(r) / 1048576.0, device_judged(r) <= device_goal(r) ? "met" : "NOT met");
    printf("goal    host peak RSS less the bench's input pool%s (%.1f MiB) <= weight file + 200 MB "
           "= %.1f MiB: %s\n", r->a->device == ACT_DEVICE_CPU ? " and the CPU backend's buffers" : "",
           rss_counted(r) / 1048576.0, rss_goal(r) / 1048576.0,
           rss_counted(r) <= rss_goal(r) ? "met" : "NOT met");
}

static int write_json(const bench_report *r, const char *path, char *err, size_t errlen) {
    const act_config *cfg = r->cfg;
    act_outfile out;   /* whole or not at all */
    if (act_outfile_open(&out, path, "w", err, errlen) != 0) return -1;
    FILE *f = out.fp;
    fprintf(f, "{\n  \"tool\": \"act-infer bench\",\n  \"version\": \"%s\",\n  \"date\": \"%s\",\n", ACT_VERSION, r->date);
    fprintf(f, "  \"model\": "); act_json_write_string(f, r->model_path);
    fprintf(f, ",\n  \"model_hash\": \"%s\",\n  \"n_params\": %lld,\n", cfg->model_hash, (long long)cfg->n_params);
    fprintf(f, "  \"cameras\": [");
    for (int c = 0; c < cfg->num_cams; c++) { if (c) fputs(", ", f); act_json_write_string(f, cfg->camera_names[c]); }
    fprintf(f, "],\n  \"image_size\": [%d, %d],\n", cfg->image_h, cfg->image_w);
    fprintf(f, "  \"device\": \"%s\",\n  \"device_name\": ", r->a->device == ACT_DEVICE_CUDA ? "cuda" : "cpu");
    act_json_write_string(f, r->device_name);
    fprintf(f, ",\n  \"precision\": \"%s\",\n  \"graphs\": %s,\n", infer_precision_name(r->a->precision),
            r->a->device == ACT_DEVICE_CUDA && r->a->use_graphs ? "true" : "false");
    fprintf(f, "  \"host_cpu\": "); act_json_write_string(f, r->host_cpu);
    fprintf(f, ",\n  \"clocks\": "); act_json_write_string(f, r->clocks);
    fprintf(f, ",\n  \"cores\": {\"online\": %d, \"affinity\": %d, \"quota\": ", r->cores.online,
            r->cores.affinity);
    if (r->cores.quota > 0) fprintf(f, "%.17g", r->cores.quota); else fputs("null", f);
    fprintf(f, ", \"usable\": %d}", r->cores.usable);
    fprintf(f, ",\n  \"switches\": {");
    int n_sw = 0;
    for (char **e = environ; *e; e++) {
        if (!is_switch(*e)) continue;
        const char *eq = strchr(*e, '=');
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
        fputs(n_sw++ ? ", " : "", f);
        act_json_write_string(f, name);
        fputs(": ", f);
        act_json_write_string(f, eq + 1);
    }
    fputc('}', f);
    fprintf(f, ",\n  \"iters\": %d,\n  \"warmup\": %d,\n  \"profile_iters\": %d,\n  \"staged_inputs\": %s,\n"
               "  \"inputs_in_place\": %s,\n  \"inputs\": ", r->a->iters, r->a->warmup, r->a->profile_iters,
            r->a->staged ? "true" : "false", r->a->in_place ? "true" : "false");
    if (r->a->inputs) act_json_write_string(f, r->a->inputs); else fprintf(f, "\"generated, seed %llu\"", (unsigned long long)r->a->seed);
    fprintf(f, ",\n  \"memory\": {\"device_bytes\": %zu, \"peak_rss_bytes\": %zu, \"weight_file_bytes\": %zu, "
               "\"weight_bytes\": %lld, \"input_pool_bytes\": %zu,\n             \"device_weights_bytes\": %zu, "
               "\"device_activations_bytes\": %zu, \"device_workspace_bytes\": %zu,\n             "
               "\"device_goal_bytes\": %zu, \"device_goal_met\": %s, \"device_judged_bytes\": %zu, "
               "\"device_judged_by\": \"%s\",\n             \"driver_held_bytes\": ",
            r->device_bytes, r->rss_bytes, r->weight_file_bytes, (long long)cfg->n_params * 4, r->input_bytes,
            r->mem.weights, r->mem.activations, r->mem.workspace, device_goal(r),
            device_judged(r) <= device_goal(r) ? "true" : "false", device_judged(r),
            driver_view(r) ? "driver" : "session");
    if (driver_view(r))   /* null where the backend has no driver's count (the CPU) */
        fprintf(f, "%zu, \"driver_before_bytes\": %zu, \"driver_total_bytes\": %zu", r->mem.driver_held,
                r->mem.driver_before, r->mem.driver_total);
    else
        fputs("null, \"driver_before_bytes\": null, \"driver_total_bytes\": null", f);
    fprintf(f, ",\n             \"rss_goal_bytes\": %zu, \"rss_counted_bytes\": %zu, \"rss_goal_met\": %s},\n",
            rss_goal(r), rss_counted(r), rss_counted(r) <= rss_goal(r) ? "true" : "false");
    fprintf(f, "  \"results\": [\n");
    for (int i = 0; i < r->n_res; i++) {
        const batch_result *b = &r->res[i];
        fprintf(f, "    {\"batch\": %d, \"latency_ms\": {\"min\": %.6f, \"p50\": %.6f, \"p90\": %.6f, \"p99\": %.6f, "
                   "\"mean\": %.6f}, \"steps_per_s\": %.9g, \"images_per_s\": %.9g, \"input_windows\": %d, "
                   "\"stages_ms\": ",
                b->batch, b->min, b->p50, b->p90, b->p99, b->mean, b->steps_per_s, b->steps_per_s * cfg->num_cams,
                b->windows);
        if (b->have_stages) {
            fputc('{', f);
            for (int k = 0; k < ACT_STAGE_COUNT; k++)
                fprintf(f, "%s\"%s\": %.6f", k ? ", " : "", act_stage_name((act_stage)k), stage_ms(b, k));
            fputs("}, \"sections_ms\": {", f);
            for (int k = 0; k < ACT_SECTION_COUNT; k++)
                fprintf(f, "%s\"%s\": %.6f", k ? ", " : "", act_section_name((act_section)k), b->section_ms[k]);
            fputc('}', f);
        } else {
            fputs("null, \"sections_ms\": null", f);
        }
        fprintf(f, ", \"first_steps_ms\": [");
        for (int k = 0; k < b->n_first; k++) fprintf(f, "%s%.6f", k ? ", " : "", b->first_ms[k]);
        fprintf(f, "], \"samples_ms\": [");
        for (int k = 0; k < r->a->iters; k++) fprintf(f, "%s%.6f", k ? ", " : "", b->samples[k]);
        fprintf(f, "]}%s\n", i + 1 < r->n_res ? "," : "");
    }
    fprintf(f, "  ]");
    if (r->first_chunk) {
        int n = r->res[0].batch * cfg->pred_horizon * cfg->action_dim;
        fprintf(f, ",\n  \"first_output\": {\"batch\": %d, \"shape\": [%d, %d, %d], \"actions\": [",
                r->res[0].batch, r->res[0].batch, cfg->pred_horizon, cfg->action_dim);
        for (int i = 0; i < n; i++) fprintf(f, "%s%.9g", i ? ", " : "", r->first_chunk[i]);
        fprintf(f, "]}");
    }
    fprintf(f, "\n}\n");
    return act_outfile_commit(&out, err, errlen);
}

/* ---- the command ---- */

int act_cmd_bench(int argc, char **argv) {
    bench_args a;
    char err[ACT_ERR_LEN] = "", demo[1200];
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? INFER_EXIT_OK : INFER_EXIT_USAGE;
    if (!a.device_set) {
        char why[256];
        a.device = act_cuda_available(why, sizeof why) ? ACT_DEVICE_CUDA : ACT_DEVICE_CPU;
        if (a.device == ACT_DEVICE_CUDA) fprintf(stderr, "act-infer bench: device cuda\n");
        else fprintf(stderr, "act-infer bench: device cpu (no CUDA: %s)\n", why);
    }
    apply_defaults(&a);
    if (a.json && infer_output_writable("bench", "--json", a.json)) return INFER_EXIT_FAIL;
    if (!a.model) {
        a.model = find_demo_model(demo, sizeof demo);
        if (!a.model) {
            fprintf(stderr,
                    "act-infer bench: no --model given and the demo model %s is missing (looked in the\n"
                    "current folder and next to this build). Make it in the repository with\n"
                    "  scripts/demo.sh                                  (installs, builds, makes it, runs the demo)\n"
                    "or, the model alone (seed 0, full act_resnet size, converted by convert_checkpoint.py):\n"
                    "  scripts/make_full_model.sh /tmp/act_demo %s\n",
                    DEMO_MODEL, DEMO_MODEL);
            return 1;
        }
    }

    act_model *m = NULL;
    act_session *s = NULL;
    input_pool pool = {0};
    float *out = NULL, *first = NULL;
    batch_result res[MAX_BATCHES];
    memset(res, 0, sizeof res);
    int status = 1, max_batch = 0;
    if (act_model_load(a.model, &m, err, sizeof err)) goto fail;
    const act_config *cfg = act_model_config(m);
    for (int i = 0; i < a.n_batches; i++) if (a.batches[i] > max_batch) max_batch = a.batches[i];

    act_session_opts opts = act_session_default_opts();
    opts.device = a.device;
    opts.precision = a.precision;
    opts.max_batch = max_batch;
    opts.use_graphs = a.use_graphs;
    if (act_session_create(m, &opts, &s, err, sizeof err)) goto fail;
    /* the backend's switch (ACT_CUDA_GRAPHS=0) turns graphs off as --no-graph does: the report
     * says what ran */
    a.use_graphs = act_session_uses_graphs(s);

    if (a.inputs) {
        if (pool_load(&pool, cfg, a.inputs, err, sizeof err)) goto fail;
        if (pool.n < max_batch) {
            snprintf(err, sizeof err, "%s: holds %d inputs, but --batch asks for %d", a.inputs, pool.n, max_batch);
            goto fail;
        }
    } else if (pool_generate(&pool, cfg, max_batch + ROTATIONS - 1, a.seed)) {
        snprintf(err, sizeof err, "out of memory for %d input frames per camera", max_batch + ROTATIONS - 1);
        goto fail;
    }
    if (a.in_place) {
        pool.items = malloc(sizeof *pool.items * (size_t)cfg->num_cams * max_batch);
        if (!pool.items) { snprintf(err, sizeof err, "out of memory for frame pointers"); goto fail; }
        size_t fb = (size_t)cfg->image_h * cfg->image_w * 3;
        for (int c = 0; c < cfg->num_cams; c++)
            if (act_session_register_host(s, pool.frames[c], fb * pool.n, err, sizeof err)) goto fail;
    }
    size_t chunk = (size_t)cfg->pred_horizon * cfg->action_dim;
    out = malloc(sizeof(float) * chunk * max_batch);
    if (!out) { snprintf(err, sizeof err, "out of memory for the output chunk"); goto fail; }

    for (int i = 0; i < a.n_batches; i++) {
        fprintf(stderr, "act-infer bench: batch %d ...\n", a.batches[i]);
        if (bench_batch(s, cfg, &pool, &a, a.batches[i], out, &res[i], err, sizeof err)) goto fail;
    }
    /* window 0 of the first batch size, after the timing: run before it, this step would take
     * the first size's plans and algorithm measurements out of its reported 'first' steps (and
     * on CUDA it now checks the captured graph's replay, the path the timed steps took) */
    if (a.check_output) {
        act_inputs in;
        act_outputs o = {0};
        first = malloc(sizeof(float) * chunk * a.batches[0]);
        if (!first) { snprintf(err, sizeof err, "out of memory for the output chunk"); goto fail; }
        o.actions = first;
        step_inputs(s, &pool, cfg, &a, a.batches[0], 0, &in);
        if (act_run(s, &in, &o, err, sizeof err)) goto fail;
    }

    bench_report r;
    memset(&r, 0, sizeof r);
    r.a = &a;
    r.cfg = cfg;
    r.model_path = a.model;
    r.device_name = act_session_device_name(s);
    host_cpu_name(r.host_cpu, sizeof r.host_cpu);
    if (a.device == ACT_DEVICE_CUDA) gpu_clocks(r.clocks, sizeof r.clocks);
    else cpu_clocks(r.clocks, sizeof r.clocks);
    act_cores_read(&r.cores);
    time_t now = time(NULL);
    strftime(r.date, sizeof r.date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    struct stat st;
    r.weight_file_bytes = stat(a.model, &st) ? 0 : (size_t)st.st_size;
    r.device_bytes = act_session_device_bytes(s);
    act_session_memory(s, &r.mem);
    r.rss_bytes = peak_rss_bytes();
    r.input_bytes = pool.bytes;
    r.res = res;
    r.n_res = a.n_batches;
    r.first_chunk = first;
    print_table(&r);
    if (a.json && write_json(&r, a.json, err, sizeof err)) goto fail;
    status = 0;
fail:
    if (status) fprintf(stderr, "act-infer bench: %s\n", err);
    for (int i = 0; i < MAX_BATCHES; i++) free(res[i].samples);
    free(first);
    free(out);
    if (s) act_session_free(s);   /* first: it unregisters the pool (--in-place-inputs) */
    pool_free(&pool);
    if (m) act_model_free(m);
    return status;
}
