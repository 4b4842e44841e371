/* backend_cuda.c - the act_backend op table on one CUDA device, in C.
 * defines: act_cuda_plugin_create, act_cuda_plugin_available (the entry points of the plugin
 *          libact_cuda.so, see backend_cuda_plugin.h)
 *
 * Each op resolves its weights to device pointers and calls an extern "C" launcher from
 * kernels/<family>.cuh on the backend's own non-blocking stream; cuBLAS and cuDNN run on that stream
 * too. Nothing here synchronizes or allocates except be->sync, setup-time calls (load_weights,
 * sinusoid_table) and, in the eager first step of a shape, conv and cuBLASLt plans (host
 * memory), the measurement of their algorithms (cuDNN's Find, which may take a temporary
 * workspace, and the timing of cuBLASLt's candidates: both synchronize) and the conv workspace
 * when a plan needs it larger (below); captured and replayed steps never do.
 *
 * Weights: the model's fp32 blob is uploaded once (tensor->offset indexes it on the device as on
 * the host). For bf16/fp16 a copy of the whole blob in that type serves the GEMM and conv weights
 * at the same offsets; biases, norms and embeddings always read fp32. In bf16/fp16 the fp32 blob
 * is then given back except for those small tensors: they move into a compact fp32 buffer
 * (f32_off maps a tensor to its place there), so the weights hold ~0.5x the fp32 bytes, not 1.5x.
 * Activations (alloc ACT_DT_ACT) are fp32 for fp32/tf32 and bf16/fp16 otherwise.
 *
 * Graphs: the first step of a key runs eagerly (begin_capture returns 0 without capturing), so
 * cuDNN plans, cuBLAS heuristics and lazily loaded kernels are all set up outside any capture;
 * the next step of that key is captured, instantiated and launched by end_capture, which keeps
 * the executable graph; graph_replay launches a kept one. An op that fails during a capture
 * ends the capture, so the stream is usable again after the error; the forward pass then runs
 * that step, and the next ones of its key until a retry's capture holds, eagerly (act_fwd_step,
 * ACT_CUDA_GRAPH_RETRY). ACT_CUDA_GRAPHS=0 runs every step eagerly.
 *
 * The conv workspace is as large as the largest plan needs (the algorithm measured fastest, or
 * with ACT_CUDA_CONV_ALGO=heuristic cuDNN's first-ranked one, within CONV_WS_LIMIT), not the
 * limit: it grows when an eager first step makes a plan that needs more, after waiting for the
 * stream, and the graphs captured so far (which hold the old pointer) are dropped, to be
 * captured again at their next step. The new one is allocated before the old one is freed, so
 * a growth that runs out of memory fails that step only: the old workspace and the graphs stay,
 * and the plan is made again at the shape's next step. Warming every batch size eagerly before
 * capturing any (act-serve does) makes that a no-op.
 *
 * Feature maps are NCHW for fp32/tf32 and NHWC for bf16/fp16 (cuDNN's tensor-core kernels read
 * NHWC directly; on NCHW they add transposes); ACT_CUDA_LAYOUT=nchw|nhwc overrides, for the
 * device check's A/B. The layout is the backend's (be->feature_nhwc): preprocess writes it, the
 * vision ops read and write it, and in NHWC the 3x3/7x7 conv filters are rearranged to KRSC once
 * at weight load, in the precision's copy (fp32: in place through a temporary). A conv is a
 * cuDNN plan per (layer, N, H, W), with bias/residual/ReLU in cuDNN's fused call where it takes
 * them (else one bias/residual/activation kernel after it); where cuDNN offers no algorithm, the
 * direct kernel of conv.cu runs it with the epilogue fused. A linear layer
 * whose input is F32 in a bf16/fp16 session converts it into a scratch buffer sized at alloc
 * time (the largest F32 buffer), so no step allocates.
 *
 * Streams: everything runs on st except the upload lane, a second stream that the forward pass
 * uses at large batches (pipeline_min_batch, ACT_CUDA_PIPELINE_MIN_BATCH) to upload camera c+1's
 * frames while camera c's trunk runs. It forks from st by an event at its first upload of a step
 * and joins back through the waits on its uploads' events, so a captured step is one graph with
 * two branches and a step ends, as always, when st does. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cudnn.h>

#include "backend_cuda_plugin.h"
#include "attention.cuh"
#include "conv.cuh"
#include "elementwise.cuh"
#include "embed.cuh"
#include "gemm.cuh"
#include "norm.cuh"
#include "pool.cuh"
#include "preprocess.cuh"

#define CONV_WS_LIMIT ((size_t)256 << 20)      /* the most workspace a conv algorithm may use */
#define CUBLAS_WS_BYTES ((size_t)32 << 20)
#define MAX_GRAPHS 1024   /* keys (batch, mode with its gather bit): warm-up at max_batch 256 alone takes 512 */
#define MAX_MARKS 64

/* a conv's cuDNN plan at one shape; plan NULL: the direct kernel runs it. ran: the plan has run
 * once (its first run is in an eager step: a refusal there hands the shape to the direct kernel) */
typedef struct { int widx, N, H, W, ran; act_conv_plan *plan; } conv_entry;
/* a cuBLASLt plan per linear call shape; plan NULL: that shape runs GEMM + bias kernel */
typedef struct {
    int widx, row0, out, M, epi, xdt, ydt;   /* epi: KLT_EPI_* */
    unsigned align_x, align_y;      /* activations: the heuristic was told these alignments */
    act_lt_plan *plan;
} lt_entry;
typedef struct { int key; cudaGraphExec_t exec; } graph_entry;
/* a prepared linear group (linear_group_prepare): its n linears' weights stacked into one
 * [n*out][in] matrix in the precision's type and their biases into one fp32 vector, so the
 * group is one GEMM; w and b stand in for tensors (index -1 - slot keys its GEMM plans) */
#define MAX_GROUPS 4
typedef struct {
    int n;                          /* the group's linears (weight index, first row) name it */
    int widx[ACT_MAX_LAYERS], row0[ACT_MAX_LAYERS];
    act_tensor w, b;
    act_linear l;                   /* the stacked linear: rows [0, n*out) of w */
    void *wst;
    float *bst;
    void *bst_low;                  /* the biases in the weights' bf16/fp16 too (else NULL) */
} lin_group;
typedef struct { float *host; size_t n; int dt; int keep; } widen_job;   /* download of bf16/fp16 */

typedef struct {
    int dev;
    cudaStream_t st;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    cudnnHandle_t dnn;
    void *blas_ws, *conv_ws;
    size_t conv_ws_bytes;           /* the most any plan made so far needs (0: none yet) */
    int adt;                        /* activation dtype (act_dtype) */
    int wdt;                        /* dtype of GEMM/conv weights */
    float *wf32;                    /* device copy of the fp32 blob (bf16/fp16: compact, below) */
    size_t *f32_off;                /* bf16/fp16: element offset in wf32 by tensor index */
    void *wlow;                     /* bf16/fp16 copy of the blob, or NULL */
    void *scratch;                  /* F32 -> activation conversion for linear inputs */
    size_t scratch_elems;
    void **allocs;
    int n_allocs, cap_allocs;
    size_t bytes;
    size_t free_at_setup, total_mem;   /* cudaMemGetInfo once the context exists (driver_memory) */
    conv_entry *convs;
    int n_convs, cap_convs;
    lt_entry *lts;
    int n_lts, cap_lts;
    lin_group groups[MAX_GROUPS];
    int n_groups;
    int group_on;                   /* linear_group offered: the decoder's cross-attention K/V
                                     * as one GEMM over stacked weights, which cost
                                     * dec_layers x 2E x E more (1.5 MiB in bf16, 3 MiB in fp32
                                     * for the full model); ACT_CUDA_LINEAR_GROUP=0 turns it off */
    int warned_lt;                  /* the GEMM + bias kernel fallback of linears was reported */
    int warned_lt_bias;             /* the bias in the output's type (fp32 refused) was reported */
    graph_entry graphs[MAX_GRAPHS];
    int n_graphs;
    int warm[MAX_GRAPHS];           /* keys whose first, eager step has run and succeeded */
    int n_warm;
    int capturing;
    int eager_step;                 /* begin_capture let this step run eagerly */
    int graphs_off;                 /* ACT_CUDA_GRAPHS=0: every step runs eagerly */
    int warned_direct;              /* the direct-conv fallback was reported */
    int conv_fuse;                  /* try cuDNN's fused conv+bias+activation (cu_setup says when) */
    int conv_direct, gemm_gemmex;   /* ACT_CUDA_CONV=direct, ACT_CUDA_GEMM=gemmex (cu_setup) */
    int conv_find;                  /* measure new conv plans' candidates (ACT_CUDA_CONV_ALGO) */
    int warned_find;                /* a failed measurement was reported */
    int gemm_measure;               /* time new cuBLASLt plans' candidates (ACT_CUDA_GEMM_ALGO) */
    int gelu_tanh;                  /* GELU linears may use cuBLASLt's tanh-form epilogue
                                     * (decided with ACT_CUDA_GELU's check at create) */
    int nhwc;                       /* feature maps NHWC, conv filters KRSC (else NCHW / KCRS) */
    /* ACT_CUDA_STEM_CHANNELS (NHWC only): the image and the stem conv's input carry stem_c
     * channels, the ones past 3 zero, and each trunk's stem filter is a KRSC copy of stem_c
     * channels in stem_w (filter i of stem_idx[i], stem_bytes each); 3: none of that */
    int stem_c;
    void *stem_w;
    int stem_idx[ACT_MAX_CAMS], n_stem;
    size_t stem_bytes;
    widen_job **jobs;               /* widen jobs captured into graphs, freed at destroy */
    int n_jobs, cap_jobs;
    cudaEvent_t ev[MAX_MARKS];
    int ev_stage[MAX_MARKS];
    int n_marks;
    /* the upload lane: a second stream for frame uploads, forked from st by lane_fork at its
     * first upload of a step, joined back by the wait on its last ticket */
    cudaStream_t lane;
    cudaEvent_t lane_fork, lane_ev[ACT_MAX_CAMS];
    int lane_open, lane_last;
} cuda_ctx;

#define CTX(be) ((cuda_ctx *)(be)->ctx)

/* The checked-call macros of kernels/ write into (err, errlen); ops bind those to be->err. */
#define BE_ERR char *err = be->err; size_t errlen = sizeof be->err; (void)err; (void)errlen

static int grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

/* An op failed: if a capture is open, close it so the stream leaves capture mode, after
 * joining the upload lane back when it is forked into the capture (ending a capture with a
 * stream still forked into it fails, cudaErrorStreamCaptureUnjoined, and may leave that stream
 * capturing, which would fail every later step that uses it). The runtime keeps a failed call's
 * error in the thread's last-error slot, where the next launch check would find it and fail an
 * unrelated op: clear it (a sticky device fault stays, as it should). An eager step joins the
 * lane back too, so the sync after a failed step also waits for the lane's uploads from the
 * staging buffers, which the caller may rewrite once act_run has returned. */
static int fail(act_backend *be) {
    cuda_ctx *c = CTX(be);
    if (c->lane_open) {
        cudaEventRecord(c->lane_ev[c->lane_last], c->lane);
        cudaStreamWaitEvent(c->st, c->lane_ev[c->lane_last], 0);
    }
    if (c->capturing) {
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(c->st, &g);
        if (g) cudaGraphDestroy(g);
        c->capturing = 0;
    }
    cudaGetLastError();
    c->lane_open = 0;
    return -1;
}
/* launchers write their message into be->err (KE); CK checks a runtime call in an op */
#define KE be->err, sizeof be->err
#define TRY(call) do { if ((call) != 0) return fail(be); } while (0)
#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    act_kerr(KE, __FILE__, __LINE__, #call, cudaGetErrorString(e_)); return fail(be); } } while (0)

static int dt_of(const cuda_ctx *c, act_dtype dt) { return dt == ACT_DT_ACT ? c->adt : (int)dt; }

static const float *wf(act_backend *be, const act_tensor *t) {
    cuda_ctx *c = CTX(be);
    if (!t) return NULL;
    if (!c->f32_off) return c->wf32 + t->offset;
    /* a tensor kept only in bf16/fp16: NULL, so a misuse faults instead of reading another */
    return c->f32_off[t->index] == (size_t)-1 ? NULL : c->wf32 + c->f32_off[t->index];
}
/* GEMM/conv weight pointer at element offset off (in the precision's weight copy) */
static const void *wlow(act_backend *be, size_t off) {
    cuda_ctx *c = CTX(be);
    if (c->wdt == ACT_DT_F32) return c->wf32 + off;
    return (const char *)c->wlow + off * 2;
}

static int weights_ready(act_backend *be) {
    if (CTX(be)->wf32) return 0;
    snprintf(be->err, sizeof be->err, "cuda backend: load_weights was not called");
    return -1;
}

/* ---------------- memory ---------------- */

static act_buf cu_alloc(act_backend *be, size_t n, act_dtype dt) {
    cuda_ctx *c = CTX(be);
    act_buf b = {NULL, (act_dtype)dt_of(c, dt)};
    size_t bytes = (n ? n : 1) * act_dtype_size(b.dt);
    if (grow((void **)&c->allocs, &c->cap_allocs, c->n_allocs + 1, sizeof(void *))) {
        snprintf(be->err, sizeof be->err, "cuda alloc: out of host memory");
        return b;
    }
    cudaError_t e = cudaSetDevice(c->dev);
    if (e == cudaSuccess) e = cudaMalloc(&b.p, bytes);
    if (e != cudaSuccess) {
        snprintf(be->err, sizeof be->err, "cuda alloc: cudaMalloc(%zu bytes): %s", bytes,
                 cudaGetErrorString(e));
        b.p = NULL;
        return b;
    }
    c->allocs[c->n_allocs++] = b.p;
    c->bytes += bytes;
    /* an F32 buffer may feed a linear layer of a bf16/fp16 session: keep a conversion scratch
     * as large as the largest F32 buffer, allocated now rather than inside a step */
    if (b.dt == ACT_DT_F32 && c->adt != ACT_DT_F32 && n > c->scratch_elems) {
        if (c->scratch) { cudaFree(c->scratch); c->bytes -= c->scratch_elems * 2; }
        c->scratch = NULL;
        c->scratch_elems = 0;
        e = cudaMalloc(&c->scratch, n * 2);
        if (e != cudaSuccess) {
            snprintf(be->err, sizeof be->err, "cuda alloc: scratch cudaMalloc(%zu bytes): %s",
                     n * 2, cudaGetErrorString(e));
            c->scratch = NULL;
            b.p = NULL;            /* the buffer stays in allocs and is freed at destroy */
            return b;
        }
        c->scratch_elems = n;
        c->bytes += n * 2;
    }
    return b;
}

static void *cu_host_alloc(act_backend *be, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        snprintf(be->err, sizeof be->err, "cuda host_alloc: cudaMallocHost(%zu bytes): %s", bytes,
                 cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cu_host_free(act_backend *be, void *p) { if (p) cudaFreeHost(p); }

static size_t cu_device_bytes(act_backend *be) { return CTX(be)->bytes; }

static int cu_driver_memory(act_backend *be, size_t *held, size_t *before, size_t *total) {
    cuda_ctx *c = CTX(be);
    size_t free_now = 0, total_now = 0;
    /* be->err is the step's: a figure's failure is only its absence (-1) */
    if (!c->total_mem) return -1;   /* cudaMemGetInfo failed at setup */
    cudaError_t e = cudaSetDevice(c->dev);     /* the caller may be another host thread */
    if (e == cudaSuccess) e = cudaMemGetInfo(&free_now, &total_now);
    if (e != cudaSuccess) {
        cudaGetLastError();   /* not a step's error: leave no trace for the next launch check */
        return -1;
    }
    *held = c->free_at_setup > free_now ? c->free_at_setup - free_now : 0;
    *before = c->total_mem > c->free_at_setup ? c->total_mem - c->free_at_setup : 0;
    *total = c->total_mem;
    return 0;
}

/* every conv of the model's trunks (stem, and each block's two convs and downsample), at most
 * ACT_MAX_CAMS * 21; the keypoint 1x1 conv is built by the forward pass from tr->kp_w */
static int trunk_convs(const act_model *m, const act_conv **cv) {
    int n = 0;
    for (int t = 0; t < m->n_trunks; t++) {
        const act_trunk *tr = &m->trunks[t];
        cv[n++] = &tr->conv1;
        for (int l = 0; l < 4; l++)
            for (int b = 0; b < 2; b++) {
                cv[n++] = &tr->blocks[l][b].conv1;
                cv[n++] = &tr->blocks[l][b].conv2;
                if (tr->blocks[l][b].has_down) cv[n++] = &tr->blocks[l][b].down;
            }
    }
    return n;
}

/* NHWC: every conv filter with taps (k > 1; a 1x1 filter is the same in both layouts) becomes
 * KRSC in the weight copy the convs read. bf16/fp16 rewrite their copy from the untouched fp32
 * blob; fp32 goes through a temporary as large as the largest filter. */
static int filters_to_krsc(act_backend *be, const act_model *m) {
    cuda_ctx *c = CTX(be);
    BE_ERR;
    const act_conv *cv[ACT_MAX_CAMS * 21];
    int n = trunk_convs(m, cv);
    size_t most = 0;
    for (int i = 0; i < n; i++)
        if (cv[i]->k > 1 && (size_t)cv[i]->w->numel > most) most = (size_t)cv[i]->w->numel;
    float *tmp = NULL;
    if (c->wdt == ACT_DT_F32 && most) KCHECK(cudaMalloc((void **)&tmp, most * 4));
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const act_conv *v = cv[i];
        if (v->k == 1) continue;
        float *src = c->wf32 + v->w->offset;
        void *dst = c->wdt == ACT_DT_F32 ? (void *)tmp : (char *)c->wlow + v->w->offset * 2;
        rc = act_k_conv_weight_nhwc(src, dst, c->wdt, v->cout, v->cin, v->cin, v->k, c->st, err,
                                    errlen);
        if (!rc && c->wdt == ACT_DT_F32) {
            cudaError_t e = cudaMemcpyAsync(src, tmp, (size_t)v->w->numel * 4,
                                            cudaMemcpyDeviceToDevice, c->st);
            if (e != cudaSuccess)
                rc = act_kerr(err, errlen, __FILE__, __LINE__, "cudaMemcpyAsync",
                              cudaGetErrorString(e));
        }
    }
    if (tmp) {
        cudaError_t e = cudaStreamSynchronize(c->st);   /* tmp is in use until the stream gets here */
        cudaFree(tmp);
        if (!rc && e != cudaSuccess)
            rc = act_kerr(err, errlen, __FILE__, __LINE__, "cudaStreamSynchronize",
                          cudaGetErrorString(e));
    }
    return rc;
}

/* The tensors bf16/fp16 sessions read only in that type: every conv filter and linear weight.
 * A tensor left out here only costs its fp32 bytes; it is never read wrong. */
static void mark_low_only(const act_model *m, unsigned char *low) {
    const act_conv *cv[ACT_MAX_CAMS * 21];
    for (int i = 0, n = trunk_convs(m, cv); i < n; i++) low[cv[i]->w->index] = 1;
    for (int t = 0; t < m->n_trunks; t++)
        low[m->trunks[t].kp_w->index] = low[m->trunks[t].out_w->index] = 1;
    const act_linear *lin[] = {&m->enc_qpos, &m->enc_action, &m->latent_proj, &m->latent_out,
                               &m->dec_qpos, &m->visual_proj, &m->action_head};
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++)
        if (lin[i]->w) low[lin[i]->w->index] = 1;
    for (int i = 0; i < m->cfg.enc_layers; i++) {
        const act_enc_layer *e = &m->enc[i];
        low[e->attn.qkv.w->index] = low[e->attn.out.w->index] = 1;
        low[e->ff1.w->index] = low[e->ff2.w->index] = 1;
    }
    for (int i = 0; i < m->cfg.dec_layers; i++) {
        const act_dec_layer *d = &m->dec[i];
        low[d->self_attn.qkv.w->index] = low[d->self_attn.out.w->index] = 1;
        low[d->cross_attn.qkv.w->index] = low[d->cross_attn.out.w->index] = 1;
        low[d->ff1.w->index] = low[d->ff2.w->index] = 1;
    }
}

/* ACT_CUDA_STEM_CHANNELS: every trunk's stem filter [cout][3][k][k] as KRSC with stem_c
 * channels, the ones past 3 zero, in stem_w (the activation dtype), one after another */
static int stem_filters(act_backend *be, const act_model *m) {
    cuda_ctx *c = CTX(be);
    BE_ERR;
    const act_conv *st = &m->trunks[0].conv1;
    size_t elems = (size_t)st->cout * st->k * st->k * c->stem_c;
    c->stem_bytes = elems * act_dtype_size((act_dtype)c->wdt);
    KCHECK(cudaMalloc(&c->stem_w, (size_t)m->n_trunks * c->stem_bytes));
    c->bytes += (size_t)m->n_trunks * c->stem_bytes;
    for (int t = 0; t < m->n_trunks; t++) {
        const act_conv *v = &m->trunks[t].conv1;
        if (v->cin != 3 || (size_t)v->cout * v->k * v->k * c->stem_c != elems) {
            snprintf(be->err, sizeof be->err, "ACT_CUDA_STEM_CHANNELS: trunk %d's stem '%s' is "
                     "%d -> %d channels %dx%d, unlike trunk 0's 3 -> %d %dx%d", t, v->w->name,
                     v->cin, v->cout, v->k, v->k, st->cout, st->k, st->k);
            return -1;
        }
        c->stem_idx[t] = v->w->index;
        if (act_k_conv_weight_nhwc(c->wf32 + v->w->offset, (char *)c->stem_w + t * c->stem_bytes,
                                   c->wdt, v->cout, 3, c->stem_c, v->k, c->st, err, errlen))
            return -1;
    }
    c->n_stem = m->n_trunks;
    return 0;
}

/* the padded stem filter of cv, or NULL when cv is no stem (or the stem is not padded) */
static const void *stem_filter(const cuda_ctx *c, const act_conv *cv) {
    for (int i = 0; i < c->n_stem; i++)
        if (c->stem_idx[i] == cv->w->index)
            return (const char *)c->stem_w + i * c->stem_bytes;
    return NULL;
}

/* bf16/fp16: keep in fp32 only the tensors read in fp32 (see mark_low_only), packed into a new
 * buffer; the full fp32 blob is freed. */
static int compact_f32(act_backend *be, const act_model *m) {
    cuda_ctx *c = CTX(be);
    BE_ERR;
    const act_weights *w = m->w;
    unsigned char *low = calloc((size_t)w->n_tensors + 1, 1);
    c->f32_off = calloc((size_t)w->n_tensors + 1, sizeof *c->f32_off);
    if (!low || !c->f32_off) {
        free(low);
        snprintf(be->err, sizeof be->err, "cuda load_weights: out of host memory");
        return -1;
    }
    mark_low_only(m, low);
    size_t keep = 0;
    for (int i = 0; i < w->n_tensors; i++) {
        c->f32_off[i] = low[i] ? (size_t)-1 : keep;
        if (!low[i]) keep += ((size_t)w->tensors[i].numel + 15) & ~(size_t)15;   /* 64-byte aligned */
    }
    float *compact = NULL;
    cudaError_t e = cudaMalloc((void **)&compact, (keep ? keep : 1) * 4);
    for (int i = 0; i < w->n_tensors && e == cudaSuccess; i++)
        if (!low[i] && w->tensors[i].numel)
            e = cudaMemcpyAsync(compact + c->f32_off[i], c->wf32 + w->tensors[i].offset,
                                (size_t)w->tensors[i].numel * 4, cudaMemcpyDeviceToDevice, c->st);
    free(low);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->st);   /* the old blob is read until here */
    if (e != cudaSuccess) {
        if (compact) cudaFree(compact);
        return act_kerr(err, errlen, __FILE__, __LINE__, "compact fp32 weights",
                        cudaGetErrorString(e));
    }
    cudaFree(c->wf32);
    c->bytes -= (w->blob_elems ? w->blob_elems : 1) * 4;
    c->wf32 = compact;
    c->bytes += (keep ? keep : 1) * 4;
    return 0;
}

static int cu_linear_group_prepare(act_backend *be, const act_linear *ls, int n);

static int cu_load_weights(act_backend *be, const act_model *m) {
    cuda_ctx *c = CTX(be);
    BE_ERR;
    const act_weights *w = m->w;
    if (c->wf32 || c->wlow) {
        snprintf(be->err, sizeof be->err, "cuda backend: load_weights called twice");
        return -1;
    }
    size_t n = w->blob_elems ? w->blob_elems : 1;
    KCHECK(cudaMalloc((void **)&c->wf32, n * 4));
    c->bytes += n * 4;
    /* on our stream: a pageable cudaMemcpy may return before its DMA lands, and the conversion
     * below runs on a non-blocking stream that would not wait for it */
    KCHECK(cudaMemcpyAsync(c->wf32, w->blob, w->blob_elems * 4, cudaMemcpyHostToDevice, c->st));
    if (c->wdt != ACT_DT_F32) {
        KCHECK(cudaMalloc(&c->wlow, n * 2));
        c->bytes += n * 2;
        if (act_k_convert(c->wlow, c->wdt, c->wf32, ACT_DT_F32, w->blob_elems, c->st, err, errlen))
            return -1;
    }
    if (c->stem_c > 3 && stem_filters(be, m)) return -1;   /* from the untouched KCRS blob */
    if (c->nhwc && filters_to_krsc(be, m)) return -1;
    if (c->wdt != ACT_DT_F32 && compact_f32(be, m)) return -1;
    KCHECK(cudaStreamSynchronize(c->st));
    if (c->group_on && m->cfg.dec_layers > 1) {   /* the forward pass's kv_group, stacked now */
        act_linear kv[ACT_MAX_LAYERS];
        for (int i = 0; i < m->cfg.dec_layers; i++) kv[i] = m->dec[i].cross_attn.kv;
        if (cu_linear_group_prepare(be, kv, m->cfg.dec_layers)) return -1;
    }
    return 0;
}

/* ---------------- step structure ---------------- */

/* The step-structure calls below check their runtime calls with CK, as ops do: a failure's
 * error is taken out of the thread's last-error slot, where the next step's first launch check
 * would find it and fail an unrelated op. */
static int cu_graph_replay(act_backend *be, int key) {
    cuda_ctx *c = CTX(be);
    CK(cudaSetDevice(c->dev));              /* the step may run on another host thread */
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].key == key) {
            CK(cudaGraphLaunch(c->graphs[i].exec, c->st));
            return 1;
        }
    return 0;
}

static int key_warm(const cuda_ctx *c, int key) {
    for (int i = 0; i < c->n_warm; i++)
        if (c->warm[i] == key) return 1;
    return 0;
}

static int cu_begin_capture(act_backend *be, int key) {
    cuda_ctx *c = CTX(be);
    if (c->capturing) {
        snprintf(be->err, sizeof be->err, "cuda begin_capture(%d): a capture is already open", key);
        return -1;
    }
    CK(cudaSetDevice(c->dev));
    c->eager_step = 0;                      /* a failed eager step never reached end_capture */
    if (!key_warm(c, key)) {   /* first step of the key (until one succeeds), no room for its
                                * graph, or no graphs at all (end_capture marks none warm) */
        c->eager_step = 1;
        return 0;
    }
    CK(cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal));
    c->capturing = 1;
    return 1;
}

static int cu_end_capture(act_backend *be, int key) {
    cuda_ctx *c = CTX(be);
    if (c->eager_step) {        /* it succeeded: the key's plans are made, its next step is captured */
        c->eager_step = 0;
        if (!c->graphs_off && !key_warm(c, key) && c->n_warm < MAX_GRAPHS) c->warm[c->n_warm++] = key;
        return 0;
    }
    if (!c->capturing) {
        snprintf(be->err, sizeof be->err, "cuda end_capture(%d): no capture is open", key);
        return -1;
    }
    if (c->lane_open) {
        snprintf(be->err, sizeof be->err, "cuda end_capture(%d): the upload lane's last upload "
                 "(ticket %d) was never waited for", key, c->lane_last);
        return fail(be);
    }
    cudaGraph_t g = NULL;
    c->capturing = 0;
    cudaError_t e = cudaStreamEndCapture(c->st, &g);
    if (e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        act_kerr(KE, __FILE__, __LINE__, "cudaStreamEndCapture", cudaGetErrorString(e));
        return fail(be);
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        act_kerr(KE, __FILE__, __LINE__, "cudaGraphInstantiate", cudaGetErrorString(e));
        return fail(be);
    }
    int slot = -1;
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].key == key) slot = i;
    if (slot < 0 && c->n_graphs >= MAX_GRAPHS) {
        cudaGraphExecDestroy(exec);
        snprintf(be->err, sizeof be->err, "cuda end_capture(%d): more than %d graphs", key,
                 MAX_GRAPHS);
        return -1;
    }
    /* launched before it is kept: a graph whose first launch fails is not left in a slot that
     * the step (now eager for this key, forward.c) would never replay or free */
    e = cudaGraphLaunch(exec, c->st);
    if (e != cudaSuccess) {
        cudaGraphExecDestroy(exec);
        act_kerr(KE, __FILE__, __LINE__, "cudaGraphLaunch", cudaGetErrorString(e));
        return fail(be);
    }
    if (slot >= 0) cudaGraphExecDestroy(c->graphs[slot].exec);
    else slot = c->n_graphs++;
    c->graphs[slot].key = key;
    c->graphs[slot].exec = exec;
    return 0;
}

static int cu_sync(act_backend *be) {
    cuda_ctx *c = CTX(be);
    BE_ERR;
    if (c->lane_open) {
        snprintf(be->err, sizeof be->err, "cuda sync: the upload lane's last upload (ticket %d) "
                 "was never waited for", c->lane_last);
        c->lane_open = 0;
        cudaStreamSynchronize(c->lane);
        return -1;
    }
    KCHECK(cudaStreamSynchronize(c->st));
    return 0;
}

/* Profiling: each mark records an event tagged with the section (act_section) that starts
 * there; a section's time runs to the next mark. ACT_SECTION_UPLOAD starts a new step's list; a
 * mark of ACT_SECTION_COUNT (or beyond) closes the last section. Marks inside a capture are
 * dropped. */
static void cu_section_mark(act_backend *be, int stage) {
    cuda_ctx *c = CTX(be);
    if (c->capturing) return;
    if (stage == ACT_SECTION_UPLOAD || c->n_marks >= MAX_MARKS) c->n_marks = 0;
    if (cudaEventRecord(c->ev[c->n_marks], c->st) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    c->ev_stage[c->n_marks++] = stage;
}

static int cu_section_ms(act_backend *be, double *ms) {
    cuda_ctx *c = CTX(be);
    BE_ERR;
    for (int i = 0; i < ACT_SECTION_COUNT; i++) ms[i] = 0.0;
    if (c->n_marks == 0) return 0;
    KCHECK(cudaEventSynchronize(c->ev[c->n_marks - 1]));
    for (int i = 0; i + 1 < c->n_marks; i++) {
        int s = c->ev_stage[i];
        if (s < 0 || s >= ACT_SECTION_COUNT) continue;
        float t = 0.0f;
        KCHECK(cudaEventElapsedTime(&t, c->ev[i], c->ev[i + 1]));
        ms[s] += t;
    }
    c->n_marks = 0;
    return 0;
}

/* ---------------- transfers ---------------- */

static int cu_upload(act_backend *be, act_buf dst, const void *host, size_t n) {
    if (n == 0) return 0;
    /* the first op of an eager step (graphs off), which may run on another host thread than the
     * last one: make our device current there (begin_capture/graph_replay do it otherwise) */
    if (!CTX(be)->capturing) CK(cudaSetDevice(CTX(be)->dev));
    CK(cudaMemcpyAsync(dst.p, host, n * act_dtype_size(dst.dt), cudaMemcpyHostToDevice,
                       CTX(be)->st));
    return 0;
}

/* Pinned in place and mapped for the device, read-only: act-serve maps its clients' shared
 * memory PROT_READ, and the driver refuses to pin such pages for writing. */
static int cu_host_register(act_backend *be, void *p, size_t bytes, void **dev) {
    cuda_ctx *c = CTX(be);
    CK(cudaSetDevice(c->dev));
    int ro = 0;
    if (cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, c->dev) != cudaSuccess) {
        ro = 0;
        cudaGetLastError();   /* not left for the next launch check */
    }
    unsigned flags = cudaHostRegisterMapped | (ro ? cudaHostRegisterReadOnly : 0);
    CK(cudaHostRegister(p, bytes, flags));
    cudaError_t e = cudaHostGetDevicePointer(dev, p, 0);
    if (e != cudaSuccess) {
        cudaHostUnregister(p);
        act_kerr(KE, __FILE__, __LINE__, "cudaHostGetDevicePointer", cudaGetErrorString(e));
        return fail(be);
    }
    return 0;
}

static int cu_host_unregister(act_backend *be, void *p) {
    CK(cudaSetDevice(CTX(be)->dev));
    CK(cudaHostUnregister(p));
    return 0;
}

static int cu_gather(act_backend *be, act_buf dst, act_buf ptrs, int items, size_t item_bytes) {
    TRY(act_k_gather(dst.p, ptrs.p, items, item_bytes, CTX(be)->st, KE));
    return 0;
}

static int cu_upload_rows(act_backend *be, act_buf dst, const void *host, size_t n, int rows,
                          size_t host_pitch) {
    if (n == 0 || rows <= 0) return 0;
    if (!CTX(be)->capturing) CK(cudaSetDevice(CTX(be)->dev));   /* as cu_upload */
    size_t es = act_dtype_size(dst.dt);
    if (host_pitch * es <= (size_t)INT_MAX) {   /* cudaDevAttrMaxPitch is 2^31 - 1 */
        CK(cudaMemcpy2DAsync(dst.p, n * es, host, host_pitch * es, n * es, (size_t)rows,
                             cudaMemcpyHostToDevice, CTX(be)->st));
        return 0;
    }
    for (int r = 0; r < rows; r++)   /* a max_batch past ~10000 frames: one copy per row */
        TRY(cu_upload(be, act_at(dst, (size_t)r * n), (const char *)host + (size_t)r * host_pitch * es, n));
    return 0;
}

static int lane_ticket(act_backend *be, const char *op, int ticket) {
    if (ticket >= 0 && ticket < ACT_MAX_CAMS) return 0;
    snprintf(be->err, sizeof be->err, "cuda %s: ticket %d is outside 0..%d", op, ticket, ACT_MAX_CAMS - 1);
    return -1;
}

/* An upload on the lane stream. The lane's first upload of a step forks it from st, so it
 * starts only after everything queued on st before (the previous step's readers of dst);
 * under capture that fork makes the lane part of the same graph. */
static int cu_upload_lane(act_backend *be, act_buf dst, const void *host, size_t n, int ticket) {
    cuda_ctx *c = CTX(be);
    if (lane_ticket(be, "upload_lane", ticket)) return fail(be);
    if (!c->capturing) CK(cudaSetDevice(c->dev));
    if (!c->lane_open) {
        CK(cudaEventRecord(c->lane_fork, c->st));
        CK(cudaStreamWaitEvent(c->lane, c->lane_fork, 0));
        c->lane_open = 1;
    }
    if (n) CK(cudaMemcpyAsync(dst.p, host, n * act_dtype_size(dst.dt), cudaMemcpyHostToDevice, c->lane));
    CK(cudaEventRecord(c->lane_ev[ticket], c->lane));
    c->lane_last = ticket;
    return 0;
}

static int cu_lane_wait(act_backend *be, int ticket) {
    cuda_ctx *c = CTX(be);
    if (lane_ticket(be, "lane_wait", ticket)) return fail(be);
    CK(cudaStreamWaitEvent(c->st, c->lane_ev[ticket], 0));
    if (ticket == c->lane_last) c->lane_open = 0;   /* all of the lane's work is joined back */
    return 0;
}

static float half_bits_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0x1f) bits = sign | 0x7f800000u | (m << 13);
    else if (e) bits = sign | ((e + 112) << 23) | (m << 13);
    else if (!m) bits = sign;
    else {
        float f = ldexpf((float)m, -24);               /* subnormal half */
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Host node after a bf16/fp16 download: the 2-byte values sit in the first half of the fp32
 * host buffer; widening from the end backwards never overwrites a value not yet read. */
static void CUDART_CB widen_host(void *ud) {
    widen_job *j = (widen_job *)ud;
    const uint16_t *h = (const uint16_t *)j->host;
    for (size_t i = j->n; i-- > 0;) {
        uint16_t v = h[i];
        float f;
        if (j->dt == ACT_DT_BF16) {
            uint32_t bits = (uint32_t)v << 16;
            memcpy(&f, &bits, 4);
        } else {
            f = half_bits_to_float(v);
        }
        j->host[i] = f;
    }
    if (!j->keep) free(j);
}

static int cu_download(act_backend *be, float *host, act_buf src, size_t n) {
    cuda_ctx *c = CTX(be);
    if (n == 0) return 0;
    CK(cudaMemcpyAsync(host, src.p, n * act_dtype_size(src.dt), cudaMemcpyDeviceToHost, c->st));
    if (src.dt == ACT_DT_F32) return 0;
    widen_job *j = (widen_job *)malloc(sizeof *j);
    if (!j || (c->capturing && grow((void **)&c->jobs, &c->cap_jobs, c->n_jobs + 1, sizeof *c->jobs))) {
        free(j);
        snprintf(be->err, sizeof be->err, "cuda download: out of host memory");
        return fail(be);
    }
    j->host = host;
    j->n = n;
    j->dt = src.dt;
    j->keep = c->capturing;
    if (j->keep) c->jobs[c->n_jobs++] = j;
    cudaError_t e = cudaLaunchHostFunc(c->st, widen_host, j);
    if (e != cudaSuccess) {
        if (!j->keep) free(j);
        act_kerr(KE, __FILE__, __LINE__, "cudaLaunchHostFunc", cudaGetErrorString(e));
        return fail(be);
    }
    return 0;
}

/* ---------------- vision ---------------- */

_Static_assert(ACT_K_NORM_SIDES == ACT_MAX_NORM_JOBS, "preprocess's side jobs: one limit");

static int cu_preprocess(act_backend *be, act_buf frames, int B, int hi, int wi,
                         const act_config *cfg, act_buf out, const act_norm_job *side, int nside) {
    act_k_norm_side ks[ACT_K_NORM_SIDES];
    if (nside < 0 || nside > ACT_K_NORM_SIDES) {
        snprintf(be->err, sizeof be->err, "preprocess: %d side normalizations (at most %d)",
                 nside, ACT_K_NORM_SIDES);
        return fail(be);
    }
    if (nside) TRY(weights_ready(be));
    for (int k = 0; k < nside; k++) {
        const act_norm_job *j = &side[k];
        act_k_norm_side q = {j->x.p, j->y.p, wf(be, j->lo), wf(be, j->hi), (int)j->x.dt,
                             (int)j->y.dt, j->rows, j->dim, (int)j->type, j->eps};
        ks[k] = q;
    }
    int rh = cfg->input_h, rw = cfg->input_w, ho = rh, wo = rw, top = 0, left = 0;
    if (cfg->crop_h > 0 && cfg->crop_w > 0) {
        if (cfg->crop_h > rh || cfg->crop_w > rw) {
            snprintf(be->err, sizeof be->err, "preprocess: crop %dx%d is larger than the resized "
                     "image %dx%d", cfg->crop_h, cfg->crop_w, rh, rw);
            return fail(be);
        }
        ho = cfg->crop_h;
        wo = cfg->crop_w;
        top = (int)nearbyint((rh - ho) / 2.0);        /* torchvision: int(round(x)), half-even */
        left = (int)nearbyint((rw - wo) / 2.0);
    }
    TRY(act_k_preprocess((const unsigned char *)frames.p, B, hi, wi, rh, rw, top, left, ho, wo,
                         cfg->imagenet_norm, CTX(be)->nhwc, CTX(be)->stem_c, out.p, out.dt, ks, nside,
                         CTX(be)->st, KE));
    return 0;
}

/* Grow the conv workspace to need bytes (see the header): only outside a capture, after the
 * stream has finished with the old one; captured graphs that used the old one are dropped. */
static int conv_ws_reserve(act_backend *be, size_t need) {
    cuda_ctx *c = CTX(be);
    BE_ERR;
    if (need <= c->conv_ws_bytes) return 0;
    if (c->capturing) {
        snprintf(be->err, sizeof be->err, "conv2d: a new plan needs %zu bytes of workspace (%zu "
                 "held) inside a graph capture; the first step of a shape must run eagerly",
                 need, c->conv_ws_bytes);
        return -1;
    }
    need = (need + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);   /* whole MiB */
    KCHECK(cudaStreamSynchronize(c->st));
    /* the new one first: when it cannot be had (out of memory), the old one and the graphs that
     * hold it stay as they were, and every shape planned so far runs on */
    void *ws = NULL, *old = c->conv_ws;
    KCHECK(cudaMalloc(&ws, need));
    for (int i = 0; i < c->n_graphs; i++) cudaGraphExecDestroy(c->graphs[i].exec);
    c->n_graphs = 0;
    c->bytes += need - c->conv_ws_bytes;
    c->conv_ws = ws;
    c->conv_ws_bytes = need;
    if (old) KCHECK(cudaFree(old));
    return 0;
}

/* The direct kernel takes over a conv: say so once (slow but exact, the run stays correct) */
static void conv_to_direct(act_backend *be, const act_conv *cv) {
    cuda_ctx *c = CTX(be);
    if (!c->warned_direct)
        fprintf(stderr, "act-engine: %s; conv '%s' and any like it run on the direct kernel\n",
                be->err, cv->w->name);
    c->warned_direct = 1;
}

/* Measure a new plan's candidates (see conv.cuh) on this step's x and w, outside a capture,
 * writing y (so never where y holds a residual to accumulate onto). The choice may need at most
 * the workspace held already or, if more, what the heuristics' choice needs (whole MiB, as
 * conv_ws_reserve allocates), so measuring never makes the session hold more than the
 * heuristics would (the memory goal); the measurement uses the conv workspace, or a temporary
 * one when the heuristics' choice needs more than is held. keep_fusion: the conv's bias will go
 * through cuDNN's fused call with the identity activation. A failed measurement keeps the
 * heuristics' choice (said once); only a CUDA error is an error. */
static int conv_measure(act_backend *be, const act_conv *cv, act_conv_plan *p, int keep_fusion,
                        const void *x, const void *w, void *y) {
    cuda_ctx *c = CTX(be);
    size_t mib = (size_t)1 << 20, need = 0;
    size_t cap = (act_k_conv_ws(p) + mib - 1) / mib * mib;
    if (cap < c->conv_ws_bytes) cap = c->conv_ws_bytes;
    int r = act_k_conv_find_need(c->dnn, p, keep_fusion, cap, &need, KE);
    if (r <= 0) return r < 0 ? fail(be) : 0;
    void *ws = c->conv_ws, *tmp_ws = NULL;
    if (need > c->conv_ws_bytes) {
        CK(cudaMalloc(&tmp_ws, need));
        ws = tmp_ws;
    }
    r = act_k_conv_find(c->dnn, p, keep_fusion, x, w, y, ws, tmp_ws ? need : c->conv_ws_bytes,
                        KE);
    cudaError_t e = cudaGetLastError();
    cudaFree(tmp_ws);
    if (e != cudaSuccess) {
        snprintf(be->err, sizeof be->err, "conv2d '%s': measuring its algorithms: %s",
                 cv->w->name, cudaGetErrorString(e));
        return fail(be);
    }
    if (r < 0 && !c->warned_find) {
        fprintf(stderr, "act-engine: %s; conv '%s' and any like it keep cuDNN's heuristic "
                "algorithm\n", be->err, cv->w->name);
        c->warned_find = 1;
    }
    return 0;
}

/* The cuDNN plan of a conv at (N, H, W), made at its first call (and measured then, outside a
 * capture, unless ACT_CUDA_CONV_ALGO=heuristic or y holds the residual); (*out)->plan NULL
 * means the direct kernel runs it (cuDNN offered no algorithm, refused to run the one it
 * offered, or ACT_CUDA_CONV=direct). */
static int conv_plan_for(act_backend *be, const act_conv *cv, int N, int H, int W,
                         const void *x, const void *w, void *y, int y_holds_residual,
                         act_epilogue epi, conv_entry **out) {
    cuda_ctx *c = CTX(be);
    for (int i = 0; i < c->n_convs; i++) {
        conv_entry *e = &c->convs[i];
        if (e->widx == cv->w->index && e->N == N && e->H == H && e->W == W) {
            *out = e;
            return 0;
        }
    }
    if (grow((void **)&c->convs, &c->cap_convs, c->n_convs + 1, sizeof *c->convs)) {
        snprintf(be->err, sizeof be->err, "conv2d: out of host memory for a plan");
        return -1;
    }
    act_conv_plan *p = NULL;
    if (!c->conv_direct &&
        act_k_conv_plan(c->dnn, c->wdt, be->precision, c->nhwc, N, cv->cin, H, W, cv->cout,
                        cv->k, cv->stride, cv->pad, CONV_WS_LIMIT, &p, KE)) {
        conv_to_direct(be, cv);
        p = NULL;
    }
    int keep_fusion = c->conv_fuse && cv->b && epi == ACT_EPI_NONE;
    if (p && c->conv_find && !c->capturing && !y_holds_residual &&
        conv_measure(be, cv, p, keep_fusion, x, w, y)) {
        act_k_conv_plan_free(p);
        return -1;
    }
    /* a plan whose workspace cannot be had is not kept: the shape is planned again next time */
    if (p && conv_ws_reserve(be, act_k_conv_ws(p))) {
        act_k_conv_plan_free(p);
        return -1;
    }
    conv_entry e = {cv->w->index, N, H, W, 0, p};
    c->convs[c->n_convs] = e;
    *out = &c->convs[c->n_convs++];
    return 0;
}

/* cuDNN refused to run a plan it had offered (a status returned at the call, before anything
 * was queued): at the plan's first run, outside a capture, the direct kernel takes the shape
 * over; later (the plan ran before) it is an error. 1: taken over, -1: error. */
static int conv_refused(act_backend *be, const act_conv *cv, conv_entry *e) {
    cuda_ctx *c = CTX(be);
    if (e->ran || c->capturing) return fail(be);
    cudaGetLastError();
    conv_to_direct(be, cv);
    act_k_conv_plan_free(e->plan);
    e->plan = NULL;
    return 1;
}

static int cu_conv2d(act_backend *be, const act_conv *cv, act_buf x, int N, int H, int W,
                     act_buf residual, act_epilogue epi, act_buf y) {
    cuda_ctx *c = CTX(be);
    TRY(weights_ready(be));
    if ((int)x.dt != c->wdt || (int)y.dt != c->wdt) {
        snprintf(be->err, sizeof be->err, "conv2d '%s': input dtype %d and output dtype %d must "
                 "be the activation dtype %d", cv->w->name, x.dt, y.dt, c->wdt);
        return fail(be);
    }
    const void *w = wlow(be, cv->w->offset);
    /* a padded stem (ACT_CUDA_STEM_CHANNELS): its input has stem_c channels, so has its filter */
    act_conv padded;
    const void *ws = stem_filter(c, cv);
    if (ws) {
        padded = *cv;
        padded.cin = c->stem_c;
        cv = &padded;
        w = ws;
    }
    /* a residual that is y itself is accumulated by cuDNN (beta = 1) */
    int res_in_y = residual.p && residual.p == y.p;
    conv_entry *e;
    TRY(conv_plan_for(be, cv, N, H, W, x.p, w, y.p, res_in_y, epi, &e));
    act_conv_plan *p = e->plan;
    int r = 1;
    /* a refusal (-1) at a plan's first run hands the shape to the direct kernel; a CUDA fault
     * inside cuDNN (-2) is this step's error, never a fallback that would hide its cause */
    if (p && c->conv_fuse) {
        r = act_k_conv_run_fused(c->dnn, p, x.p, w, cv->b ? wlow(be, cv->b->offset) : NULL,
                                 residual.p, epi, y.p, c->conv_ws, c->conv_ws_bytes, KE);
        if (r == -2) return fail(be);
        if (r < 0 && conv_refused(be, cv, e) < 0) return -1;
    }
    if (e->plan && r == 1) {
        int rr = act_k_conv_run(c->dnn, p, x.p, w, res_in_y ? 1.0f : 0.0f, y.p, c->conv_ws,
                                c->conv_ws_bytes, KE);
        if (rr == -2) return fail(be);
        if (rr && conv_refused(be, cv, e) < 0) return -1;
    }
    if (!e->plan) {
        TRY(act_k_conv_direct(x.p, w, c->wdt, c->nhwc, N, cv->cin, H, W, cv->cout, cv->k,
                              cv->stride, cv->pad, wf(be, cv->b), residual.p, residual.dt, epi,
                              y.p, c->st, KE));
        return 0;
    }
    e->ran = 1;
    if (r == 0) return 0;          /* fused: bias, residual and activation are done */
    int Ho, Wo;
    act_k_conv_out_dims(p, &Ho, &Wo);
    /* bias by channel: [N][C][HoWo] is outer N, inner HoWo; [N*HoWo][C] is outer N*HoWo, inner 1 */
    size_t hw = (size_t)Ho * Wo;
    TRY(act_k_bias_res_act(y.p, y.dt, wf(be, cv->b), res_in_y ? NULL : residual.p, residual.dt,
                           c->nhwc ? N * hw : (size_t)N, cv->cout, c->nhwc ? 1 : hw, epi, c->st,
                           KE));
    return 0;
}

static int cu_groupnorm(act_backend *be, act_buf x, int N, int C, int HW, int groups,
                        const act_tensor *gamma, const act_tensor *beta, act_buf residual,
                        act_epilogue epi, act_buf y) {
    TRY(weights_ready(be));
    TRY(act_k_groupnorm(x.p, x.dt, N, C, HW, groups, CTX(be)->nhwc, 1e-5f, wf(be, gamma),
                        wf(be, beta), residual.p, residual.dt, epi, y.p, y.dt, CTX(be)->st, KE));
    return 0;
}

static int cu_maxpool(act_backend *be, act_buf x, int N, int C, int H, int W, act_buf y) {
    TRY(act_k_maxpool(x.p, x.dt, N, C, H, W, CTX(be)->nhwc, y.p, y.dt, CTX(be)->st, KE));
    return 0;
}

static int cu_spatial_softmax(act_backend *be, act_buf x, int N, int K, int HW,
                              const act_tensor *pos_grid, act_buf y) {
    TRY(weights_ready(be));
    TRY(act_k_spatial_softmax(x.p, x.dt, N, K, HW, CTX(be)->nhwc, wf(be, pos_grid), y.p, y.dt,
                              CTX(be)->st, KE));
    return 0;
}

/* ---------------- transformer ---------------- */

/* A linear with a bias is one cublasLtMatmul with the bias (and ReLU or GELU) in its epilogue.
 * GELU goes there only in bf16/fp16 (gelu_tanh): cuBLASLt's is the tanh form, at most 4.7e-4
 * from the model's erf GELU, under those outputs' rounding but not under fp32 parity. Bias-less
 * linears and erf GELU are cublasGemmEx plus the bias/activation kernel, and so is any shape
 * cuBLASLt declines (said once on stderr) or every linear under ACT_CUDA_GEMM=gemmex. Plans are
 * made at a shape's first call, which is in the eager first step of a key, so no heuristic and
 * no measurement of its candidates (lt_measure) runs in a capture. */
static void lt_give_up(act_backend *be, const act_linear *l, lt_entry *e) {
    cuda_ctx *c = CTX(be);
    if (!c->warned_lt)
        fprintf(stderr, "act-engine: %s; linear '%s' and any like it run as GEMM + bias kernel\n",
                be->err, l->w->name);
    c->warned_lt = 1;
    act_k_lt_plan_free(e->plan);
    e->plan = NULL;
}

/* A new plan's algorithm, timed among the heuristic's candidates on this call's own operands
 * (ACT_CUDA_GEMM_ALGO=measure, the default; the choice is kept for the process), or the
 * heuristic's first (=heuristic, or inside a capture, where nothing may wait). bias: the one the
 * plan's runs take. */
static int lt_measure(act_backend *be, lt_entry *e, const void *W, const void *x,
                      const void *bias, void *y) {
    cuda_ctx *c = CTX(be);
    if (!c->gemm_measure || c->capturing) return 0;
    return act_k_lt_measure(c->lt, e->plan, c->dev, W, x, bias, y, c->blas_ws, CUBLAS_WS_BYTES,
                            c->st, !c->graphs_off, KE);
}

/* bias: fp32; bias_low: the same values in the weights' bf16/fp16 (NULL in fp32/tf32), the
 * second choice beside a 16-bit output where cuBLASLt refuses an fp32 bias */
static int lt_plan_for(act_backend *be, const act_linear *l, int M, int epi, const void *W,
                       const void *x, int xdt, const float *bias, const void *bias_low,
                       act_buf y, lt_entry **out) {
    cuda_ctx *c = CTX(be);
    unsigned ax = act_k_align(x), ay = act_k_align(y.p);
    for (int i = 0; i < c->n_lts; i++) {
        lt_entry *e = &c->lts[i];
        if (e->widx == l->w->index && e->row0 == l->row0 && e->out == l->out && e->M == M &&
            e->epi == epi && e->xdt == xdt && e->ydt == (int)y.dt && e->align_x == ax &&
            e->align_y == ay) {
            *out = e;
            return 0;
        }
    }
    if (grow((void **)&c->lts, &c->cap_lts, c->n_lts + 1, sizeof *c->lts)) {
        snprintf(be->err, sizeof be->err, "linear '%s': out of host memory for a plan",
                 l->w->name);
        return -1;
    }
    lt_entry e = {l->w->index, l->row0, l->out, M, epi, xdt, (int)y.dt, ax, ay, NULL};
    c->lts[c->n_lts] = e;
    *out = &c->lts[c->n_lts++];
    if (c->gemm_gemmex) return 0;
    int tf32 = be->precision == ACT_TF32;
    if (!act_k_lt_plan(c->lt, c->wdt, xdt, y.dt, M, l->out, l->in, tf32, epi, W, x, bias,
                       ACT_DT_F32, y.p, CUBLAS_WS_BYTES, &(*out)->plan, KE))
        return lt_measure(be, *out, W, x, bias, y.p);
    if (bias_low && (int)y.dt == c->wdt) {   /* a 16-bit output (bias_low: bf16/fp16 only) */
        char why[sizeof be->err];
        snprintf(why, sizeof why, "%s", be->err);
        if (!act_k_lt_plan(c->lt, c->wdt, xdt, y.dt, M, l->out, l->in, tf32, epi, W, x,
                           bias_low, y.dt, y.p, CUBLAS_WS_BYTES, &(*out)->plan, KE)) {
            if (!c->warned_lt_bias)
                fprintf(stderr, "act-engine: %s; linear '%s' and any like it take the bias in "
                        "the output's type\n", why, l->w->name);
            c->warned_lt_bias = 1;
            return lt_measure(be, *out, W, x, bias_low, y.p);
        }
    }
    lt_give_up(be, l, *out);
    return 0;
}

/* y = epi(x W^T + bias), W and bias the device copies of l's rows (or a group's stack),
 * bias_low the bias in the weights' bf16/fp16 (NULL in fp32/tf32) */
static int linear_with(act_backend *be, const act_linear *l, const void *W, const float *bias,
                       const void *bias_low, act_buf x, int M, act_epilogue epi, act_buf y) {
    cuda_ctx *c = CTX(be);
    const void *xp = x.p;
    int xdt = x.dt;
    if (xdt != c->wdt) {            /* e.g. F32 normalized qpos into a bf16 GEMM */
        size_t n = (size_t)M * l->in;
        if (xdt != ACT_DT_F32 || n > c->scratch_elems) {
            snprintf(be->err, sizeof be->err, "linear '%s': input dtype %d does not match the "
                     "weights (%d) and no conversion buffer of %zu elements exists", l->w->name,
                     xdt, c->wdt, n);
            return fail(be);
        }
        TRY(act_k_convert(c->scratch, c->wdt, x.p, xdt, n, c->st, KE));
        xp = c->scratch;
        xdt = c->wdt;
    }
    if (bias && (epi != ACT_EPI_GELU || c->gelu_tanh) && M > 0) {
        lt_entry *e;
        int lt_epi = epi == ACT_EPI_RELU ? KLT_EPI_RELU : epi == ACT_EPI_GELU ? KLT_EPI_GELU_TANH
                                                                             : KLT_EPI_BIAS;
        TRY(lt_plan_for(be, l, M, lt_epi, W, xp, xdt, bias, bias_low, y, &e));
        if (e->plan) {
            int refused;
            const void *b = act_k_lt_bias_dt(e->plan) == ACT_DT_F32 ? (const void *)bias : bias_low;
            if (!act_k_lt_run(c->lt, e->plan, W, xp, b, y.p, c->blas_ws, CUBLAS_WS_BYTES,
                              c->st, &refused, KE))
                return 0;
            if (!refused) return fail(be);
            lt_give_up(be, l, e);   /* nothing was enqueued: this call and later ones fall back */
        }
    }
    TRY(act_k_linear(c->blas, W, c->wdt, xp, xdt, y.p, y.dt, M, l->out, l->in,
                     be->precision == ACT_TF32, KE));
    TRY(act_k_bias_res_act(y.p, y.dt, bias, NULL, 0, (size_t)M, l->out, 1, epi, c->st, KE));
    return 0;
}

static int cu_linear(act_backend *be, const act_linear *l, act_buf x, int M, act_epilogue epi,
                     act_buf y) {
    TRY(weights_ready(be));
    int low = l->b && CTX(be)->wdt != ACT_DT_F32;
    return linear_with(be, l, wlow(be, l->w->offset + (size_t)l->row0 * l->in),
                       l->b ? wf(be, l->b) + l->row0 : NULL,
                       low ? wlow(be, l->b->offset + l->row0) : NULL, x, M, epi, y);
}

static lin_group *find_group(cuda_ctx *c, const act_linear *ls, int n) {
    for (int i = 0; i < c->n_groups; i++) {
        lin_group *g = &c->groups[i];
        int same = g->n == n;
        for (int j = 0; j < n && same; j++)
            same = g->widx[j] == ls[j].w->index && g->row0[j] == ls[j].row0;
        if (same) return g;
    }
    return NULL;
}

static void group_free(cuda_ctx *c, lin_group *g) {
    if (g->wst) cudaFree(g->wst);
    if (g->bst) cudaFree(g->bst);
    if (g->bst_low) cudaFree(g->bst_low);
    g->wst = NULL;
    g->bst = NULL;
    g->bst_low = NULL;
}

/* Setup time: copy the n linears' rows (weights in the precision's copy, biases in fp32) into
 * one stacked matrix and vector, on the stream, and wait for them. load_weights stacks the
 * decoder's cross-attention K/V this way, so their bytes count as weights; the forward pass's
 * call then finds them. */
static int cu_linear_group_prepare(act_backend *be, const act_linear *ls, int n) {
    cuda_ctx *c = CTX(be);
    BE_ERR;
    if (weights_ready(be)) return -1;
    if (n < 1 || n > ACT_MAX_LAYERS) {
        snprintf(be->err, sizeof be->err, "cuda linear group: %d linears (1 to %d)", n,
                 ACT_MAX_LAYERS);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (!ls[i].w || !ls[i].b || ls[i].in != ls[0].in || ls[i].out != ls[0].out) {
            snprintf(be->err, sizeof be->err, "cuda linear group: '%s' is not %d -> %d with a "
                     "bias like the group's first", ls[i].w ? ls[i].w->name : "(null)", ls[0].in,
                     ls[0].out);
            return -1;
        }
    if (find_group(c, ls, n)) return 0;
    if (c->n_groups == MAX_GROUPS) {
        snprintf(be->err, sizeof be->err, "cuda linear group: more than %d groups", MAX_GROUPS);
        return -1;
    }
    lin_group *g = &c->groups[c->n_groups];
    memset(g, 0, sizeof *g);
    size_t per = (size_t)ls[0].out * ls[0].in, esz = act_dtype_size((act_dtype)c->wdt);
    size_t wbytes = (size_t)n * per * esz, bbytes = (size_t)n * ls[0].out * sizeof(float);
    size_t lbytes = c->wdt != ACT_DT_F32 ? (size_t)n * ls[0].out * esz : 0;   /* bst_low */
    cudaError_t e = cudaSetDevice(c->dev);
    if (e == cudaSuccess) e = cudaMalloc(&g->wst, wbytes);
    if (e == cudaSuccess) e = cudaMalloc((void **)&g->bst, bbytes);
    if (e == cudaSuccess && lbytes) e = cudaMalloc(&g->bst_low, lbytes);
    for (int i = 0; i < n && e == cudaSuccess; i++) {
        e = cudaMemcpyAsync((char *)g->wst + i * per * esz,
                            wlow(be, ls[i].w->offset + (size_t)ls[i].row0 * ls[i].in), per * esz,
                            cudaMemcpyDeviceToDevice, c->st);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(g->bst + (size_t)i * ls[0].out, wf(be, ls[i].b) + ls[i].row0,
                                (size_t)ls[0].out * sizeof(float), cudaMemcpyDeviceToDevice, c->st);
        if (e == cudaSuccess && lbytes)
            e = cudaMemcpyAsync((char *)g->bst_low + (size_t)i * ls[0].out * esz,
                                wlow(be, ls[i].b->offset + ls[i].row0), (size_t)ls[0].out * esz,
                                cudaMemcpyDeviceToDevice, c->st);
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->st);
    if (e != cudaSuccess) {
        group_free(c, g);
        cudaGetLastError();
        return act_kerr(err, errlen, __FILE__, __LINE__, "linear group stack",
                        cudaGetErrorString(e));
    }
    c->bytes += wbytes + bbytes + lbytes;
    for (int i = 0; i < n; i++) {
        g->widx[i] = ls[i].w->index;
        g->row0[i] = ls[i].row0;
    }
    g->n = n;
    snprintf(g->w.name, sizeof g->w.name, "%.40s x%d (stacked)", ls[0].w->name, n);
    memcpy(g->b.name, g->w.name, sizeof g->b.name);
    g->w.index = g->b.index = -1 - c->n_groups;
    g->w.ndim = 2;
    g->w.dims[0] = (int64_t)n * ls[0].out;
    g->w.dims[1] = ls[0].in;
    act_linear l = {&g->w, &g->b, 0, n * ls[0].out, ls[0].in};
    g->l = l;
    c->n_groups++;
    return 0;
}

static int cu_linear_group(act_backend *be, const act_linear *ls, int n, act_buf x, int M,
                           act_buf y) {
    lin_group *g = find_group(CTX(be), ls, n);
    if (!g) {
        snprintf(be->err, sizeof be->err, "cuda linear group of %d from '%s': not prepared", n,
                 ls[0].w->name);
        return fail(be);
    }
    return linear_with(be, &g->l, g->wst, g->bst, g->bst_low, x, M, ACT_EPI_NONE, y);
}

static int cu_attention(act_backend *be, act_buf q, int qs, act_buf k, act_buf v, int kvs, int B,
                        int Lq, int Lk, int nh, int dh, act_buf key_pad, act_buf out) {
    if (k.dt != v.dt) {
        snprintf(be->err, sizeof be->err, "attention: k and v dtypes differ (%d, %d)", k.dt, v.dt);
        return fail(be);
    }
    TRY(act_k_attention(q.p, q.dt, qs, k.p, v.p, k.dt, kvs, B, Lq, Lk, nh, dh,
                        (const unsigned char *)key_pad.p, out.p, out.dt, CTX(be)->st, KE));
    return 0;
}

static int cu_attention_out_ln(act_backend *be, act_buf q, int qs, act_buf k, act_buf v, int kvs,
                               int B, int Lq, int Lk, int nh, int dh, act_buf key_pad,
                               const act_linear *out, act_buf x, const act_ln *ln, float eps,
                               act_buf y) {
    cuda_ctx *c = CTX(be);
    TRY(weights_ready(be));
    if (k.dt != v.dt || out->in != nh * dh || out->out != nh * dh) {
        snprintf(be->err, sizeof be->err, "attention+out+ln: k/v dtypes %d/%d, projection '%s' "
                 "%d -> %d for %d heads of %d", k.dt, v.dt, out->w->name, out->in, out->out, nh, dh);
        return fail(be);
    }
    const void *W = wlow(be, out->w->offset + (size_t)out->row0 * out->in);
    TRY(act_k_attention_out_ln(q.p, q.dt, qs, k.p, v.p, k.dt, kvs, B, Lq, Lk, nh, dh,
                               (const unsigned char *)key_pad.p, W, c->wdt, wf(be, out->b) + out->row0,
                               x.p, x.dt, wf(be, ln->w), wf(be, ln->b), eps, y.p, y.dt, c->st, KE));
    return 0;
}

static int cu_add_layernorm(act_backend *be, act_buf x, act_buf d, const act_ln *ln, float eps,
                            int rows, int E, act_buf y) {
    TRY(weights_ready(be));
    TRY(act_k_add_layernorm(x.p, x.dt, d.p, d.dt, wf(be, ln->w), wf(be, ln->b), eps, rows, E, y.p,
                            y.dt, CTX(be)->st, KE));
    return 0;
}

static int cu_broadcast_rows(act_backend *be, const act_tensor *t, int B, int R, int E,
                             act_buf out) {
    TRY(weights_ready(be));
    TRY(act_k_broadcast_rows(wf(be, t), B, (size_t)R * E, out.p, out.dt, CTX(be)->st, KE));
    return 0;
}

static int cu_memory_assemble(act_backend *be, act_buf lat, act_buf qp, act_buf vis, int B,
                              int ncam, int E, act_buf pos, const act_tensor *type_embed,
                              act_buf out) {
    TRY(weights_ready(be));
    if (pos.dt != ACT_DT_F32) {
        snprintf(be->err, sizeof be->err, "memory_assemble: the position table must be F32");
        return fail(be);
    }
    TRY(act_k_memory_assemble(lat.p, lat.dt, qp.p, qp.dt, vis.p, vis.dt, B, ncam, E,
                              (const float *)pos.p, wf(be, type_embed), out.p, out.dt,
                              CTX(be)->st, KE));
    return 0;
}

static int cu_posterior_assemble(act_backend *be, const act_tensor *cls, act_buf qp, act_buf act,
                                 int B, int H, int E, act_buf pos, act_buf out) {
    TRY(weights_ready(be));
    if (pos.dt != ACT_DT_F32) {
        snprintf(be->err, sizeof be->err, "posterior_assemble: the position table must be F32");
        return fail(be);
    }
    TRY(act_k_posterior_assemble(wf(be, cls), qp.p, qp.dt, act.p, act.dt, B, H, E,
                                 (const float *)pos.p, out.p, out.dt, CTX(be)->st, KE));
    return 0;
}

/* Built on the host with the C library's expf/sinf/cosf, the same float32 steps as
 * _build_sinusoidal_table (and as the CPU backend), then copied once: setup time only. */
static int cu_sinusoid_table(act_backend *be, int L, int E, act_buf out) {
    if (out.dt != ACT_DT_F32 || L <= 0 || E <= 0) {
        snprintf(be->err, sizeof be->err, "sinusoid_table: needs an F32 buffer and L, E > 0 "
                 "(got dtype %d, L %d, E %d)", out.dt, L, E);
        return fail(be);
    }
    float *t = (float *)calloc((size_t)L * E, sizeof(float));
    if (!t) {
        snprintf(be->err, sizeof be->err, "sinusoid_table: out of host memory");
        return fail(be);
    }
    float k = (float)(-log(10000.0) / (double)E);
    for (int i = 0; 2 * i < E; i++) {
        float div = expf((float)(2 * i) * k);
        for (int p = 0; p < L; p++) {
            float a = (float)p * div;
            t[(size_t)p * E + 2 * i] = sinf(a);
            if (2 * i + 1 < E) t[(size_t)p * E + 2 * i + 1] = cosf(a);
        }
    }
    /* on our stream and waited for: a pageable cudaMemcpy may return before its DMA lands */
    cudaError_t e = cudaMemcpyAsync(out.p, t, (size_t)L * E * sizeof(float),
                                    cudaMemcpyHostToDevice, CTX(be)->st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(CTX(be)->st);
    free(t);
    CK(e);
    return 0;
}

static int cu_normalize(act_backend *be, act_buf x, int rows, int dim, const act_tensor *lo,
                        const act_tensor *hi, act_norm_type type, float eps, int inverse,
                        act_buf y) {
    TRY(weights_ready(be));
    TRY(act_k_normalize(x.p, x.dt, y.p, y.dt, rows, dim, wf(be, lo), wf(be, hi), (int)type, eps,
                        inverse, CTX(be)->st, KE));
    return 0;
}

static int cu_latent(act_backend *be, act_buf ml, int B, int L, int sample, act_buf seed8,
                     act_buf mu, act_buf logvar, act_buf kl, act_buf z) {
    if ((mu.p && mu.dt != ACT_DT_F32) || (logvar.p && logvar.dt != ACT_DT_F32) ||
        (kl.p && kl.dt != ACT_DT_F32)) {
        snprintf(be->err, sizeof be->err, "latent: mu, logvar and kl must be F32 buffers");
        return fail(be);
    }
    TRY(act_k_latent(ml.p, ml.dt, B, L, sample, (const unsigned char *)seed8.p, (float *)mu.p,
                     (float *)logvar.p, (float *)kl.p, z.p, z.dt, CTX(be)->st, KE));
    return 0;
}

static int cu_copy(act_backend *be, act_buf dst, act_buf src, size_t n) {
    TRY(act_k_convert(dst.p, dst.dt, src.p, src.dt, n, CTX(be)->st, KE));
    return 0;
}

static int cu_gather_rows(act_backend *be, act_buf dst, act_buf src, int rows, size_t n,
                          size_t src_stride) {
    TRY(act_k_gather_rows(dst.p, dst.dt, src.p, src.dt, rows, n, src_stride, CTX(be)->st, KE));
    return 0;
}

/* ---------------- lifetime ---------------- */

static void cu_destroy(act_backend *be) {
    if (!be) return;
    cuda_ctx *c = CTX(be);
    if (c) {
        if (c->st) {
            if (c->capturing) fail(be);
            cudaStreamSynchronize(c->st);
        }
        for (int i = 0; i < c->n_graphs; i++) cudaGraphExecDestroy(c->graphs[i].exec);
        for (int i = 0; i < c->n_convs; i++) act_k_conv_plan_free(c->convs[i].plan);
        for (int i = 0; i < c->n_lts; i++) act_k_lt_plan_free(c->lts[i].plan);
        for (int i = 0; i < c->n_groups; i++) group_free(c, &c->groups[i]);
        for (int i = 0; i < c->n_allocs; i++) cudaFree(c->allocs[i]);
        for (int i = 0; i < c->n_jobs; i++) free(c->jobs[i]);
        for (int i = 0; i < MAX_MARKS; i++) if (c->ev[i]) cudaEventDestroy(c->ev[i]);
        if (c->lane) cudaStreamSynchronize(c->lane);
        for (int i = 0; i < ACT_MAX_CAMS; i++) if (c->lane_ev[i]) cudaEventDestroy(c->lane_ev[i]);
        if (c->lane_fork) cudaEventDestroy(c->lane_fork);
        free(c->convs);
        free(c->lts);
        free(c->allocs);
        free(c->jobs);
        if (c->scratch) cudaFree(c->scratch);
        if (c->wf32) cudaFree(c->wf32);
        if (c->stem_w) cudaFree(c->stem_w);
        free(c->f32_off);
        if (c->wlow) cudaFree(c->wlow);
        if (c->conv_ws) cudaFree(c->conv_ws);
        if (c->blas_ws) cudaFree(c->blas_ws);
        if (c->blas) cublasDestroy(c->blas);
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->dnn) cudnnDestroy(c->dnn);
        if (c->st) cudaStreamDestroy(c->st);
        if (c->lane) cudaStreamDestroy(c->lane);
        free(c);
    }
    free(be);
}

unsigned act_cuda_plugin_abi(void) { return ACT_CUDA_PLUGIN_ABI; }

#if defined(ACT_CUDA_MIN_ARCH) && ACT_CUDA_MIN_ARCH > 0
/* 1 if a GPU of compute capability major.minor is older than this build's oldest kernels */
static int below_build_arch(int major, int minor) { return major * 10 + minor < ACT_CUDA_MIN_ARCH; }
#endif

int act_cuda_plugin_available(char *why, size_t whylen) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why && whylen) snprintf(why, whylen, "no usable CUDA device: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return 0;
    }
    if (n == 0) {
        if (why && whylen) snprintf(why, whylen, "no CUDA device present");
        return 0;
    }
#if defined(ACT_CUDA_MIN_ARCH) && ACT_CUDA_MIN_ARCH > 0
    /* 'auto' must not pick a GPU that this build has no kernels for */
    int usable = 0, major = 0, minor = 0;
    for (int d = 0; d < n; d++) {
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d) != cudaSuccess) {
            cudaGetLastError();
            usable++;   /* cannot tell: let the session's setup decide */
            continue;
        }
        if (!below_build_arch(major, minor)) usable++;
    }
    if (!usable) {
        if (why && whylen)
            snprintf(why, whylen, "%d CUDA device(s), none of them sm_%d or newer, where this build's kernels "
                     "start (rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%d)", n, ACT_CUDA_MIN_ARCH, major, minor);
        return 0;
    }
#endif
    if (why && whylen) snprintf(why, whylen, "%d CUDA device(s)", n);
    return 1;
}

/* setup of the handles and fixed buffers; on error be->err says which call failed */
static int cu_setup(act_backend *be, int device) {
    cuda_ctx *c = CTX(be);
    BE_ERR;
    int n = 0;
    KCHECK(cudaGetDeviceCount(&n));
    if (device < 0 || device >= n) {
        snprintf(be->err, sizeof be->err, "cuda: device %d does not exist (%d present)", device, n);
        return -1;
    }
    KCHECK(cudaSetDevice(device));
    /* the context first, so the driver's count of what this backend holds (cu_driver_memory)
     * starts after it and covers every handle, workspace and graph made from here on */
    KCHECK(cudaFree(0));
    /* a figure, not a need: where the driver cannot say (a sandbox's GPU proxy), no driver view */
    if (cudaMemGetInfo(&c->free_at_setup, &c->total_mem) != cudaSuccess) {
        cudaGetLastError();
        c->free_at_setup = c->total_mem = 0;
    }
    struct cudaDeviceProp prop;
    KCHECK(cudaGetDeviceProperties(&prop, device));
    snprintf(be->device_name, sizeof be->device_name, "%.100s (sm_%d%d)", prop.name, prop.major,
             prop.minor);
#if defined(ACT_CUDA_MIN_ARCH) && ACT_CUDA_MIN_ARCH > 0
    if (below_build_arch(prop.major, prop.minor)) {
        snprintf(be->err, sizeof be->err, "cuda: this build's kernels are for sm_%d and newer "
                 "(CMAKE_CUDA_ARCHITECTURES); %s is sm_%d%d: rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%d",
                 ACT_CUDA_MIN_ARCH, prop.name, prop.major, prop.minor, prop.major, prop.minor);
        return -1;
    }
#endif
    if (be->precision == ACT_BF16 && prop.major < 8) {
        snprintf(be->err, sizeof be->err, "cuda: bf16 needs compute capability 8.0, %s has %d.%d",
                 prop.name, prop.major, prop.minor);
        return -1;
    }
    KCHECK(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
    for (int i = 0; i < MAX_MARKS; i++) KCHECK(cudaEventCreate(&c->ev[i]));
    KCHECK(cudaStreamCreateWithFlags(&c->lane, cudaStreamNonBlocking));
    KCHECK(cudaEventCreateWithFlags(&c->lane_fork, cudaEventDisableTiming));
    for (int i = 0; i < ACT_MAX_CAMS; i++) KCHECK(cudaEventCreateWithFlags(&c->lane_ev[i], cudaEventDisableTiming));
    KCUBLAS(cublasCreate(&c->blas));
    KCUBLAS(cublasSetStream(c->blas, c->st));
    KCHECK(cudaMalloc(&c->blas_ws, CUBLAS_WS_BYTES));
    KCUBLAS(cublasSetWorkspace(c->blas, c->blas_ws, CUBLAS_WS_BYTES));
    /* split-K partial sums stay fp32: by default cuBLAS may reduce them in a bf16/fp16 output's
     * type, a rounding per split on top of the output's own (the bf16 parity margin is ~2x) */
    KCUBLAS(cublasSetMathMode(c->blas, (cublasMath_t)((be->precision == ACT_TF32
                                                           ? CUBLAS_TF32_TENSOR_OP_MATH
                                                           : CUBLAS_DEFAULT_MATH) |
                                                      CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    /* cuBLASLt takes stream and workspace per call; it shares the cuBLAS workspace, which is
     * safe because both run in order on c->st */
    KCUBLAS(cublasLtCreate(&c->lt));
    KCUDNN(cudnnCreate(&c->dnn));
    KCUDNN(cudnnSetStream(c->dnn, c->st));
    /* cuDNN's fused conv call takes the bias in the data type: in bf16/fp16 that rounds the bias
     * (a BN-folded bias can be large). On the emulator the small models' worst bf16 error went
     * 1.6e-2 -> 4.1e-2 in one run (1.8e-2 in another; full size 1.0e-2 -> 1.2e-2), so by default
     * only fp32/tf32 fuse until a GPU run weighs the gain; ACT_CUDA_CONV_FUSE_LOWP=1 fuses
     * bf16/fp16 too, ACT_CUDA_CONV_UNFUSED=1 nothing (the device check's A/B). Read once here,
     * not per conv. */
    c->conv_fuse = !getenv("ACT_CUDA_CONV_UNFUSED") &&
                   (c->wdt == ACT_DT_F32 || getenv("ACT_CUDA_CONV_FUSE_LOWP") != NULL);
    const char *conv = getenv("ACT_CUDA_CONV"), *gemm = getenv("ACT_CUDA_GEMM");
    c->conv_direct = conv && !strcmp(conv, "direct");   /* our direct conv kernel, not cuDNN */
    c->gemm_gemmex = gemm && !strcmp(gemm, "gemmex");   /* cublasGemmEx + a bias kernel */
    c->bytes = CUBLAS_WS_BYTES;
    return 0;
}

/* *out = the environment's count `name` (0..65536), or dflt when unset or empty */
static int env_count(const char *name, int dflt, const char *expected, int *out, char *err,
                     size_t errlen) {
    const char *v = getenv(name);
    char *end = NULL;
    long n = v && *v ? strtol(v, &end, 10) : dflt;
    if (v && *v && (*end || n < 0 || n > 65536)) {
        snprintf(err, errlen, "cuda backend: %s=%s: expected %s", name, v, expected);
        return -1;
    }
    *out = (int)n;
    return 0;
}

int act_cuda_plugin_create(int device, act_precision prec, act_backend **out, char *err,
                           size_t errlen) {
    *out = NULL;
    if (prec < ACT_FP32 || prec > ACT_FP16) {
        snprintf(err, errlen, "cuda backend: unknown precision %d", (int)prec);
        return -1;
    }
    char why[256];
    if (!act_cuda_plugin_available(why, sizeof why)) {
        snprintf(err, errlen, "cuda backend: %s", why);
        return -1;
    }
    act_backend *be = (act_backend *)calloc(1, sizeof *be);
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        snprintf(err, errlen, "cuda backend: out of host memory");
        return -1;
    }
    be->ctx = c;
    be->name = "cuda";
    be->precision = prec;
    c->dev = device;
    c->adt = prec == ACT_BF16 ? ACT_DT_BF16 : prec == ACT_FP16 ? ACT_DT_F16 : ACT_DT_F32;
    c->wdt = c->adt;
    const char *lay = getenv("ACT_CUDA_LAYOUT");
    if (lay && *lay && strcmp(lay, "nchw") && strcmp(lay, "nhwc")) {
        snprintf(err, errlen, "cuda backend: ACT_CUDA_LAYOUT=%s: expected nchw or nhwc", lay);
        free(c);
        free(be);
        return -1;
    }
    /* bf16/fp16 take cuBLASLt's GELU epilogue (tanh form, see cu_linear); ACT_CUDA_GELU=erf
     * keeps the exact GELU kernel there too */
    const char *gelu = getenv("ACT_CUDA_GELU");
    if (gelu && *gelu && strcmp(gelu, "erf") && (strcmp(gelu, "tanh") || c->adt == ACT_DT_F32)) {
        snprintf(err, errlen, "cuda backend: ACT_CUDA_GELU=%s: expected erf%s", gelu,
                 c->adt == ACT_DT_F32 ? " (fp32/tf32 always use the exact erf GELU)" : " or tanh");
        free(c);
        free(be);
        return -1;
    }
    c->gelu_tanh = c->adt != ACT_DT_F32 && !(gelu && !strcmp(gelu, "erf"));
    /* conv algorithms: measured at each new shape's eager first step (cuDNN's Find, what
     * PyTorch's cudnn.benchmark does), or the heuristics' first choice without measuring */
    const char *algo = getenv("ACT_CUDA_CONV_ALGO");
    if (algo && *algo && strcmp(algo, "find") && strcmp(algo, "heuristic")) {
        snprintf(err, errlen, "cuda backend: ACT_CUDA_CONV_ALGO=%s: expected find or heuristic",
                 algo);
        free(c);
        free(be);
        return -1;
    }
    c->conv_find = !(algo && !strcmp(algo, "heuristic"));
    /* cuBLASLt algorithms likewise: timed among the heuristic's candidates at each new linear
     * shape's eager first step (what torch.compile's max-autotune does for its GEMMs), or the
     * heuristic's first */
    const char *galgo = getenv("ACT_CUDA_GEMM_ALGO");
    if (galgo && *galgo && strcmp(galgo, "measure") && strcmp(galgo, "heuristic")) {
        snprintf(err, errlen, "cuda backend: ACT_CUDA_GEMM_ALGO=%s: expected measure or "
                 "heuristic", galgo);
        free(c);
        free(be);
        return -1;
    }
    c->gemm_measure = !(galgo && !strcmp(galgo, "heuristic"));
    c->nhwc = lay && *lay ? !strcmp(lay, "nhwc") : c->adt != ACT_DT_F32;
    be->feature_nhwc = c->nhwc;
    /* the stem's input padded from 3 channels to 4 or 8 (zeros), NHWC only: a shape cuDNN's
     * tensor-core kernels may take as it is, where 3 channels may make it pad or transform the
     * image inside every call (the device check's stem-ab weighs it); NCHW keeps 3 */
    const char *stem = getenv("ACT_CUDA_STEM_CHANNELS");
    if (stem && *stem && strcmp(stem, "3") && strcmp(stem, "4") && strcmp(stem, "8")) {
        snprintf(err, errlen, "cuda backend: ACT_CUDA_STEM_CHANNELS=%s: expected 3, 4 or 8", stem);
        free(c);
        free(be);
        return -1;
    }
    c->stem_c = stem && *stem && c->nhwc ? atoi(stem) : 3;
    be->image_channels = c->stem_c;
    /* per-camera upload/trunk pipelining from this batch on: below it the transfer is too short
     * to hide behind a trunk and the extra per-camera launches cost more than it saves; and
     * attention + output projection + residual + LayerNorm as one kernel up to this many rows
     * (each block reads the whole projection: a small-batch op) */
    if (env_count("ACT_CUDA_PIPELINE_MIN_BATCH", 32, "a batch size (0 = never pipeline)",
                  &be->pipeline_min_batch, err, errlen) ||
        env_count("ACT_CUDA_FUSED_ATTN_MAX_ROWS", 32, "a row count (0 = never fuse)",
                  &be->fused_attn_max_rows, err, errlen) ||
        env_count("ACT_CUDA_LINEAR_GROUP", 1, "0 or 1", &c->group_on, err,
                  errlen)) {
        free(c);
        free(be);
        return -1;
    }
    int graphs = 1;
    if (c->group_on > 1 ||
        env_count("ACT_CUDA_GRAPHS", 1, "0 or 1", &graphs, err, errlen) || graphs > 1) {
        if (c->group_on > 1)
            snprintf(err, errlen, "cuda backend: ACT_CUDA_LINEAR_GROUP=%d: expected 0 or 1",
                     c->group_on);
        else if (graphs > 1)
            snprintf(err, errlen, "cuda backend: ACT_CUDA_GRAPHS=%d: expected 0 or 1", graphs);
        free(c);
        free(be);
        return -1;
    }
    c->graphs_off = !graphs;
    be->graphs = graphs;
    if (cu_setup(be, device)) {
        snprintf(err, errlen, "cuda backend: %s", be->err);
        cu_destroy(be);
        return -1;
    }
    be->destroy = cu_destroy;
    be->alloc = cu_alloc;
    be->host_alloc = cu_host_alloc;
    be->host_free = cu_host_free;
    be->device_bytes = cu_device_bytes;
    be->driver_memory = cu_driver_memory;
    be->load_weights = cu_load_weights;
    be->graph_replay = cu_graph_replay;
    be->begin_capture = cu_begin_capture;
    be->end_capture = cu_end_capture;
    be->sync = cu_sync;
    be->section_mark = cu_section_mark;
    be->section_ms = cu_section_ms;
    be->upload = cu_upload;
    be->upload_rows = cu_upload_rows;
    be->host_register = cu_host_register;
    be->host_unregister = cu_host_unregister;
    be->gather = cu_gather;
    be->upload_lane = cu_upload_lane;
    be->lane_wait = cu_lane_wait;
    be->download = cu_download;
    be->preprocess = cu_preprocess;
    be->conv2d = cu_conv2d;
    be->groupnorm = cu_groupnorm;
    be->maxpool = cu_maxpool;
    be->spatial_softmax = cu_spatial_softmax;
    be->linear = cu_linear;
    if (c->group_on) {
        be->linear_group_prepare = cu_linear_group_prepare;
        be->linear_group = cu_linear_group;
    }
    be->attention = cu_attention;
    be->add_layernorm = cu_add_layernorm;
    be->attention_out_ln = cu_attention_out_ln;
    be->broadcast_rows = cu_broadcast_rows;
    be->memory_assemble = cu_memory_assemble;
    be->posterior_assemble = cu_posterior_assemble;
    be->sinusoid_table = cu_sinusoid_table;
    be->normalize = cu_normalize;
    be->latent = cu_latent;
    be->copy = cu_copy;
    be->gather_rows = cu_gather_rows;
    *out = be;
    return 0;
}
