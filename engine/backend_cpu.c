/* backend_cpu.c - the CPU backend: memory, transfers, step structure, and the op table.
 * defines: act_backend_cpu_create
 *
 * The reference backend: plain C11 + a BLAS, fp32 only. "Device" memory is host memory, so
 * transfers are memcpy, there are no graphs (begin_capture runs the step eagerly) and sync is a
 * no-op. The ops themselves live in cpu_vision.c and cpu_transformer.c. Stage timing uses the
 * monotonic clock: section_mark(s) closes the open section and opens s (s >= ACT_SECTION_COUNT
 * just closes), section_ms hands back and clears the accumulated milliseconds. */
#define _POSIX_C_SOURCE 200809L   /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <string.h>
#include <time.h>
#include "cpu_ops.h"
#include "forward.h"
#include "util.h"

static double now_ms(void) { return act_now() * 1e3; }

static void cpu_destroy(act_backend *be) {
    if (!be) return;
    act_cpu_ctx *ctx = be->ctx;
    if (ctx) {
        for (size_t i = 0; i < ctx->n_allocs; i++) act_aligned_free(ctx->allocs[i]);
        free(ctx->allocs);
        act_aligned_free(ctx->ws_col);
        act_aligned_free(ctx->ws_out);
        act_aligned_free(ctx->ws_rows);
        act_cpu_wino_free(ctx);
        act_cpu_plin_free(ctx);
        act_pool_destroy(ctx->pool);
        free(ctx);
    }
    free(be);
}

static act_buf cpu_alloc(act_backend *be, size_t n, act_dtype dt) {
    act_cpu_ctx *ctx = be->ctx;
    act_buf r = act_nobuf();
    if (dt == ACT_DT_ACT) dt = ACT_DT_F32;
    size_t bytes;
    if (!act_mul_ok(n, act_dtype_size(dt), &bytes)) {
        act_errf(be->err, sizeof be->err, "cpu alloc: %zu elements overflow", n);
        return r;
    }
    if (ctx->n_allocs == ctx->cap_allocs) {
        size_t cap = ctx->cap_allocs ? 2 * ctx->cap_allocs : 64;
        void **a = realloc(ctx->allocs, cap * sizeof *a);
        if (!a) {
            act_errf(be->err, sizeof be->err, "cpu alloc: out of memory");
            return r;
        }
        ctx->allocs = a;
        ctx->cap_allocs = cap;
    }
    void *p = act_aligned_alloc(bytes);
    if (!p) {
        act_errf(be->err, sizeof be->err, "cpu alloc: out of memory for %zu bytes", bytes);
        return r;
    }
    ctx->allocs[ctx->n_allocs++] = p;
    ctx->bytes += bytes;
    r.p = p;
    r.dt = dt;
    return r;
}

static void *cpu_host_alloc(act_backend *be, size_t bytes) {
    void *p = act_aligned_alloc(bytes);   /* zeroed: the timing model's outputs are these zeros */
    if (!p) act_errf(be->err, sizeof be->err, "cpu host_alloc: out of memory for %zu bytes", bytes);
    return p;
}
static void cpu_host_free(act_backend *be, void *p) { act_aligned_free(p); }
/* the scratch load_weights sizes: conv workspaces, Winograd row scratch, the packed linears' */
static size_t cpu_workspace_bytes(act_backend *be) {
    const act_cpu_ctx *ctx = be->ctx;
    size_t f = ctx->ws_plin ? ctx->ws_plin_elems : 0;
    if (ctx->ws_col)
        f += ctx->ws_col_elems + ctx->ws_out_elems +
             ((size_t)act_pool_threads(ctx->pool) + 1) * (ctx->ws_rows_elems ? ctx->ws_rows_elems : 1);
    return f * sizeof(float);
}
static size_t cpu_device_bytes(act_backend *be) {
    return ((act_cpu_ctx *)be->ctx)->bytes + cpu_workspace_bytes(be);
}

/* Weights are read in place from the model's blob; the conv workspaces are sized here, the
 * Winograd filters of the 3x3 stride-1 convs made (cpu_winograd.c) and the decoder's weights
 * packed for few-row products (cpu_linear_packed.c). */
static int cpu_load_weights(act_backend *be, const act_model *m) {
    act_cpu_ctx *ctx = be->ctx;
    size_t col, out, rows;
    if (act_cpu_conv_workspace(m, &col, &out, &rows, be->err, sizeof be->err)) return -1;
    col *= ACT_CPU_CONV_GROUP;
    out *= ACT_CPU_CONV_GROUP;
    if (col > ctx->ws_col_elems || out > ctx->ws_out_elems || rows > ctx->ws_rows_elems) {
        float *wc = act_aligned_alloc(col * sizeof(float)), *wo = act_aligned_alloc(out * sizeof(float));
        /* one row scratch per thread and the zero row (W <= rows floats; zeroed here, never written) */
        float *wr = act_aligned_alloc(((size_t)act_pool_threads(ctx->pool) + 1) * (rows ? rows : 1) *
                                      sizeof(float));
        if (!wc || !wo || !wr) {
            act_aligned_free(wc);
            act_aligned_free(wo);
            act_aligned_free(wr);
            return act_errf(be->err, sizeof be->err, "cpu load_weights: out of memory for conv "
                            "workspaces of %zu + %zu floats", col, out);
        }
        act_aligned_free(ctx->ws_col);
        act_aligned_free(ctx->ws_out);
        act_aligned_free(ctx->ws_rows);
        ctx->ws_col = wc;
        ctx->ws_col_elems = col;
        ctx->ws_out = wo;
        ctx->ws_out_elems = out;
        ctx->ws_rows = wr;
        ctx->ws_rows_elems = rows;
    }
    if (act_cpu_wino_load(ctx, m, be->err, sizeof be->err)) return -1;
    return act_cpu_plin_load(ctx, m, be->err, sizeof be->err);
}

static int cpu_graph_replay(act_backend *be, int key) { return 0; }

/* ACT_CPU_TIMING_MODEL=BASE_US[,PER_SAMPLE_US] (benchmarks of act-serve only): every step is
 * "replayed" as a busy wait of BASE + PER x batch microseconds and computes nothing (the outputs
 * stay zero), the way a host thread spins on a GPU step. act-serve's own costs (receive, queue,
 * batching, reply) can then be measured on a CPU machine at a GPU's step times. Frames a step
 * would gather are not read either: as on a GPU that pulls them over PCIe, the host copies nothing. */
static int cpu_timed_replay(act_backend *be, int key) {
    const act_cpu_ctx *ctx = be->ctx;
    double until = now_ms() + (ctx->model_base_us + ctx->model_per_us * ACT_FWD_KEY_BATCH(key)) * 1e-3;
    while (now_ms() < until) {
    }
    return 1;
}

static int parse_timing_model(act_cpu_ctx *ctx, const char *v, char *err, size_t errlen) {
    char *end;
    double base = strtod(v, &end), per = 0.0;
    if (end != v && *end == ',') {
        const char *p = end + 1;
        per = strtod(p, &end);
        if (end == p) end = (char *)v;   /* "150," is malformed */
    }
    if (end == v || *end || !(base >= 0.0 && base <= 1e6) || !(per >= 0.0 && per <= 1e6))
        return act_errf(err, errlen, "cpu backend: ACT_CPU_TIMING_MODEL='%s' is not BASE_US[,PER_"
                        "SAMPLE_US] (e.g. 150,2: each step a 150 us + 2 us per sample busy wait)", v);
    ctx->timing_model = 1;
    ctx->model_base_us = base;
    ctx->model_per_us = per;
    return 0;
}
static int cpu_begin_capture(act_backend *be, int key) { return 0; }
static int cpu_end_capture(act_backend *be, int key) { return 0; }
static int cpu_sync(act_backend *be) { return 0; }

static void cpu_section_mark(act_backend *be, int stage) {
    act_cpu_ctx *ctx = be->ctx;
    double t = now_ms();
    if (ctx->section_open >= 0) ctx->section_acc[ctx->section_open] += t - ctx->section_t0;
    ctx->section_open = (stage >= 0 && stage < ACT_SECTION_COUNT) ? stage : -1;
    ctx->section_t0 = t;
}

static int cpu_section_ms(act_backend *be, double *ms) {
    act_cpu_ctx *ctx = be->ctx;
    for (int i = 0; i < ACT_SECTION_COUNT; i++) {
        ms[i] = ctx->section_acc[i];
        ctx->section_acc[i] = 0.0;
    }
    return 0;
}

static int cpu_upload(act_backend *be, act_buf dst, const void *host, size_t n) {
    memcpy(dst.p, host, n * act_dtype_size(dst.dt));
    return 0;
}

/* Host memory is the CPU's own: registering it only hands the same address back. */
static int cpu_host_register(act_backend *be, void *p, size_t bytes, void **dev) {
    (void)be;
    (void)bytes;
    *dev = p;
    return 0;
}
static int cpu_host_unregister(act_backend *be, void *p) { return 0; }

typedef struct gather_job { uint8_t *dst; const uint8_t *ptrs; size_t item_bytes; } gather_job;

static void gather_task(void *arg, int t, int lo, int hi) {
    const gather_job *j = arg;
    (void)t;
    for (int i = lo; i < hi; i++) {
        uint64_t a;
        memcpy(&a, j->ptrs + (size_t)i * sizeof a, sizeof a);
        memcpy(j->dst + (size_t)i * j->item_bytes, (const void *)(uintptr_t)a, j->item_bytes);
    }
}

/* one frame per item, on the backend's threads (as the session's copy would have run) */
static int cpu_gather(act_backend *be, act_buf dst, act_buf ptrs, int items, size_t item_bytes) {
    gather_job j = {dst.p, ptrs.p, item_bytes};
    act_pool_run(((act_cpu_ctx *)be->ctx)->pool, gather_task, &j, items);
    return 0;
}

static int cpu_upload_rows(act_backend *be, act_buf dst, const void *host, size_t n, int rows,
                           size_t host_pitch) {
    size_t es = act_dtype_size(dst.dt);
    for (int r = 0; r < rows; r++)
        memcpy((char *)dst.p + (size_t)r * n * es, (const char *)host + (size_t)r * host_pitch * es, n * es);
    return 0;
}

static int cpu_download(act_backend *be, float *host, act_buf src, size_t n) {
    if (src.dt != ACT_DT_F32)
        return act_errf(be->err, sizeof be->err, "cpu download: source dtype %d is not fp32", src.dt);
    memcpy(host, src.p, n * sizeof(float));
    return 0;
}

static int cpu_copy(act_backend *be, act_buf dst, act_buf src, size_t n) {
    if (dst.dt != src.dt)
        return act_errf(be->err, sizeof be->err, "cpu copy: dtypes %d -> %d (the CPU backend "
                        "holds fp32 only)", src.dt, dst.dt);
    memmove(dst.p, src.p, n * act_dtype_size(dst.dt));
    return 0;
}

static int cpu_gather_rows(act_backend *be, act_buf dst, act_buf src, int rows, size_t n,
                           size_t src_stride) {
    if (dst.dt != src.dt)
        return act_errf(be->err, sizeof be->err, "cpu gather_rows: dtypes %d -> %d (the CPU "
                        "backend holds fp32 only)", src.dt, dst.dt);
    size_t es = act_dtype_size(dst.dt);
    for (int r = 0; r < rows; r++)
        memmove((char *)dst.p + (size_t)r * n * es, (const char *)src.p + (size_t)r * src_stride * es,
                n * es);
    return 0;
}

/* OpenBLAS reserves a buffer (128 MiB of address space in common builds) for each thread that
 * runs a product, and where that allocation fails it retries forever instead of failing: under
 * an address-space limit (ulimit -v) without room for them a step hangs. Said once a process,
 * where the limit leaves less than 2 GiB above what the process maps already (the weights, the
 * activations and those buffers are still to come). */
static void warn_address_limit(int threads) {
    static int said;
    struct rlimit rl;
    if (said || !act_cpu_blas_is_openblas() || getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY) return;
    unsigned long long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%llu", &pages) != 1) pages = 0;
        fclose(f);
    }
    if ((unsigned long long)rl.rlim_cur > pages * (unsigned long long)act_page_size() + (2ull << 30)) return;
    said = 1;
    fprintf(stderr, "act-engine: warning: an address-space limit is set (ulimit -v: %llu MiB): OpenBLAS reserves "
            "about 128 MiB of it for each of the %d thread%s that run%s products and, where that fails, retries "
            "forever instead of failing (a step that hangs); limit memory with a cgroup instead (docker --memory, "
            "systemd MemoryMax=), or leave that room\n", (unsigned long long)(rl.rlim_cur >> 20), threads,
            threads == 1 ? "" : "s", threads == 1 ? "s" : "");
}

int act_backend_cpu_create(act_precision prec, act_backend **out, char *err, size_t errlen) {
    *out = NULL;
    if (prec != ACT_FP32)
        return act_errf(err, errlen, "cpu backend: precision %s is not supported (fp32 only; "
                        "tf32/bf16/fp16 need --device cuda)",
                        prec == ACT_TF32 ? "tf32" : prec == ACT_BF16 ? "bf16" : "fp16");
    act_backend *be = calloc(1, sizeof *be);
    act_cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        return act_errf(err, errlen, "cpu backend: out of memory");
    }
    ctx->section_open = -1;
    ctx->pool = act_pool_create(act_cpu_threads());   /* NULL runs every loop inline */
    act_pool_set_spin_us(ctx->pool, act_cpu_spin_us());
    be->name = "cpu";
    be->image_channels = 3;
    be->ctx = ctx;
    be->precision = prec;
    int nt = act_pool_threads(ctx->pool);
    /* with ACT_CPU_SPLIT_GEMM=0 the GEMMs run on OpenBLAS's own threads, not the pool's: said */
    char gemm[48] = "";
    int bt = act_cpu_gemm_split_on() || !act_cpu_blas_is_openblas() ? 0 : act_cpu_blas_threads_now();
    if (bt > 0) snprintf(gemm, sizeof gemm, " on %d thread%s for its GEMMs", bt, bt == 1 ? "" : "s");
    snprintf(be->device_name, sizeof be->device_name, "cpu (fp32, %d thread%s, %s%s, own loops %s)",
             nt, nt == 1 ? "" : "s", act_cpu_blas_init(), gemm, act_cpu_clone_name());
    warn_address_limit(nt);
    const char *tm = getenv("ACT_CPU_TIMING_MODEL");
    if (tm && *tm) {
        if (parse_timing_model(ctx, tm, err, errlen)) {
            cpu_destroy(be);
            return -1;
        }
        snprintf(be->device_name, sizeof be->device_name, "cpu TIMING MODEL (steps are %g us + "
                 "%g us/sample busy waits; outputs are zeros)", ctx->model_base_us, ctx->model_per_us);
    }
    be->destroy = cpu_destroy;
    be->alloc = cpu_alloc;
    be->host_alloc = cpu_host_alloc;
    be->host_free = cpu_host_free;
    be->device_bytes = cpu_device_bytes;
    be->workspace_bytes = cpu_workspace_bytes;
    be->load_weights = cpu_load_weights;
    be->graph_replay = ctx->timing_model ? cpu_timed_replay : cpu_graph_replay;
    be->begin_capture = cpu_begin_capture;
    be->end_capture = cpu_end_capture;
    be->sync = cpu_sync;
    be->section_mark = cpu_section_mark;
    be->section_ms = cpu_section_ms;
    be->upload = cpu_upload;
    be->upload_rows = cpu_upload_rows;
    be->host_register = cpu_host_register;
    be->host_unregister = cpu_host_unregister;
    be->gather = cpu_gather;
    be->download = cpu_download;
    be->preprocess = cpu_preprocess;
    be->conv2d = cpu_conv2d;
    be->groupnorm = cpu_groupnorm;
    be->maxpool = cpu_maxpool;
    be->spatial_softmax = cpu_spatial_softmax;
    be->linear = cpu_linear;
    be->linear_group_prepare = cpu_linear_group_prepare;
    be->linear_group = cpu_linear_group;
    be->attention = cpu_attention;
    be->add_layernorm = cpu_add_layernorm;
    be->broadcast_rows = cpu_broadcast_rows;
    be->memory_assemble = cpu_memory_assemble;
    be->posterior_assemble = cpu_posterior_assemble;
    be->sinusoid_table = cpu_sinusoid_table;
    be->normalize = cpu_normalize;
    be->latent = cpu_latent;
    be->gather_rows = cpu_gather_rows;
    be->copy = cpu_copy;
    *out = be;
    return 0;
}
