/* backend.h - the interface the forward pass is written against, once.
 * defines: act_backend (op table), act_buf, act_backend_cpu_create, act_backend_cuda_create
 *
 * A backend owns memory (act_buf) and runs ops on it. The forward pass (forward.c) knows only
 * logical shapes; the physical layout of feature maps (NCHW on the CPU, whatever the CUDA
 * backend prefers, be->feature_nhwc) is private to the vision ops of each backend, which consume
 * and produce it consistently: preprocess -> conv2d/groupnorm/maxpool -> spatial_softmax; the
 * shapes in the comments below are logical. Batch is outermost in every layout, so a view at
 * image offsets (act_at) is one in any. Transformer tensors
 * are row-major [rows][cols] everywhere.
 *
 * Activation dtype: alloc(ACT_DT_ACT) gives the backend's activation type (fp32 on the CPU;
 * fp32, bf16 or fp16 on CUDA by precision). Ops accumulate in fp32. Weights are passed as
 * act_tensor / act_conv / act_linear from model.h; a backend resolves them to its own copies by
 * tensor->offset (all weights live in one blob, uploaded once) or tensor->index.
 *
 * Every op returns 0 or -1; on -1 the backend's err holds the message.
 * Ops are enqueued in order on one stream; between begin_capture and end_capture they are
 * recorded (CUDA graphs) - so no op may allocate or synchronize.
 */
#ifndef ACT_BACKEND_H
#define ACT_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "act.h"
#include "model.h"

typedef enum { ACT_DT_F32 = 0, ACT_DT_BF16 = 1, ACT_DT_F16 = 2, ACT_DT_U8 = 3, ACT_DT_ACT = 100 } act_dtype;

typedef struct act_buf { void *p; act_dtype dt; } act_buf;   /* p == NULL: no buffer */

size_t act_dtype_size(act_dtype dt);
static inline act_buf act_at(act_buf b, size_t elems) {        /* view at an element offset */
    act_buf r = b;
    if (b.p) r.p = (char *)b.p + elems * act_dtype_size(b.dt);
    return r;
}
static inline act_buf act_nobuf(void) { act_buf r = {0, ACT_DT_F32}; return r; }

typedef enum { ACT_EPI_NONE = 0, ACT_EPI_RELU = 1, ACT_EPI_GELU = 2 } act_epilogue;

/* a normalization that rides along with another op's launch (preprocess's side jobs): F32 x
 * [rows][dim] -> y (F32 or the activation dtype), forward only, as the normalize op computes it */
typedef struct {
    act_buf x, y;
    int rows, dim;
    const act_tensor *lo, *hi;
    act_norm_type type;
    float eps;
} act_norm_job;
#define ACT_MAX_NORM_JOBS 2

typedef struct act_backend act_backend;
struct act_backend {
    const char *name;
    void *ctx;
    char err[ACT_ERR_LEN];
    act_precision precision;
    char device_name[128];
    /* physical layout of vision feature maps (the preprocess output and every conv2d, groupnorm,
     * maxpool and spatial_softmax tensor): 0 NCHW, 1 NHWC. Only code that reads or writes such a
     * tensor from the host (the op harness) needs it; the forward pass never looks inside them. */
    int feature_nhwc;
    /* channels of the preprocess output and of the stem conv's input: 3, or on an NHWC backend 4
     * or 8 with the ones past 3 zero (CUDA's ACT_CUDA_STEM_CHANNELS); the forward pass sizes the
     * image buffer by it, and the stem's conv2d takes that many input channels */
    int image_channels;
    /* 1: begin_capture records steps as graphs that graph_replay relaunches (CUDA, unless
     * ACT_CUDA_GRAPHS=0); 0: every step runs eagerly, whatever the session asked for */
    int graphs;

    void (*destroy)(act_backend *be);

    /* ---- memory (setup time only, never inside a step) ---- */
    act_buf (*alloc)(act_backend *be, size_t n, act_dtype dt);     /* p == NULL on failure */
    void *(*host_alloc)(act_backend *be, size_t bytes);           /* pinned on CUDA */
    void (*host_free)(act_backend *be, void *p);
    size_t (*device_bytes)(act_backend *be);
    /* optional (NULL: none): the part of device_bytes that is scratch the backend sizes itself
     * (the CPU's conv workspaces), counted by act_session_memory as workspace, not weights */
    size_t (*workspace_bytes)(act_backend *be);
    /* optional (NULL: no such view): the device's memory as its driver counts it, for a figure
     * that includes what device_bytes cannot see (library handles' internal buffers, graph
     * executables, allocation rounding). *held: device memory used now less at the backend's
     * setup, once the context existed (the whole device's count: another process's allocations
     * on a shared device land here too); *before: used at that moment (the context itself, and
     * other processes); *total: the device's memory. 0, or -1 where the driver cannot say
     * (be->err untouched: this may run beside a step). */
    int (*driver_memory)(act_backend *be, size_t *held, size_t *before, size_t *total);
    /* prepare weights for this model (CUDA: one upload of the blob + precision copies) */
    int (*load_weights)(act_backend *be, const act_model *m);

    /* ---- step structure ---- */
    /* graph cache keyed by an int: replay returns 1 if a graph for key ran, 0 if none exists */
    int (*graph_replay)(act_backend *be, int key);
    /* 1: capturing; 0: the step runs eagerly (a key's first step, or no graphs); -1: error */
    int (*begin_capture)(act_backend *be, int key);
    int (*end_capture)(act_backend *be, int key);     /* instantiates and launches the captured step */
    int (*sync)(act_backend *be);                     /* wait for the step; the only host sync */
    /* profiling: a mark opens section `sec` (act_section) and closes the one before; a mark of
     * ACT_SECTION_COUNT closes the last. May be a no-op. section_ms hands back (and clears) the
     * milliseconds per section since it was last called: ms[ACT_SECTION_COUNT]. */
    void (*section_mark)(act_backend *be, int sec);
    int (*section_ms)(act_backend *be, double *ms);

    /* ---- transfers (from/to host buffers made by host_alloc; async on CUDA) ---- */
    int (*upload)(act_backend *be, act_buf dst, const void *host, size_t n);    /* n elems of dst.dt; host has dst.dt elements (U8 or F32) */
    /* rows x n elements into dst, dense; host row r starts host_pitch elements after row r-1
     * (every camera's frames from their staging blocks in one transfer) */
    int (*upload_rows)(act_backend *be, act_buf dst, const void *host, size_t n, int rows,
                       size_t host_pitch);
    int (*download)(act_backend *be, float *host, act_buf src, size_t n);      /* converts to fp32 */

    /* ---- frames read where they lie (optional: NULL on a backend that cannot) ----
     * host_register makes [p, p + bytes) of the caller's host memory readable by the device in
     * place (CUDA: page-locked and mapped, read-only) and gives its device address in *dev (the
     * same pointer on the CPU); host_unregister undoes it. Setup-time calls: never inside a step.
     * gather copies `items` blocks of item_bytes each into dst (U8), densely, item i from the
     * device address held in ptrs (U8, `items` little-endian uint64s made from host_register
     * addresses): every camera's frames in one op when each batch element's frames lie in a
     * different registered block (act-serve's shared-memory clients), with no host copy. */
    int (*host_register)(act_backend *be, void *p, size_t bytes, void **dev);
    int (*host_unregister)(act_backend *be, void *p);
    int (*gather)(act_backend *be, act_buf dst, act_buf ptrs, int items, size_t item_bytes);

    /* ---- upload lane (optional: NULL on a backend whose uploads simply run in order) ----
     * At batches of at least pipeline_min_batch (0: never) the forward pass uploads each
     * camera's frames on a second queue while the trunk already runs on the cameras before it.
     * upload_lane enqueues one upload there, tagged with ticket (0..ACT_MAX_CAMS-1); lane_wait
     * makes every op after it wait for that upload. The forward pass waits for every ticket it
     * issued, in order, before the step ends (the last wait joins the lane back). */
    int pipeline_min_batch;
    int (*upload_lane)(act_backend *be, act_buf dst, const void *host, size_t n, int ticket);
    int (*lane_wait)(act_backend *be, int ticket);

    /* ---- vision ---- */
    /* frames u8 [B][hi][wi][3] -> out image [B][3][ho][wo] (logical), cfg gives resize/crop/imagenet;
     * and the nside (<= ACT_MAX_NORM_JOBS) normalizations in side, in the same launch (the
     * step's qpos and recorded actions: one graph node fewer each) */
    int (*preprocess)(act_backend *be, act_buf frames, int B, int hi, int wi,
                      const act_config *cfg, act_buf out, const act_norm_job *side, int nside);
    /* y = epi(conv(x) + b + residual); x [N][cin][H][W] -> y [N][cout][Ho][Wo]; residual may be empty */
    int (*conv2d)(act_backend *be, const act_conv *c, act_buf x, int N, int H, int W,
                  act_buf residual, act_epilogue epi, act_buf y);
    /* y = epi(GroupNorm(x; groups, gamma, beta, eps 1e-5) + residual), x [N][C][HW] */
    int (*groupnorm)(act_backend *be, act_buf x, int N, int C, int HW, int groups,
                     const act_tensor *gamma, const act_tensor *beta, act_buf residual,
                     act_epilogue epi, act_buf y);
    /* 3x3 stride 2 pad 1 max pool: x [N][C][H][W] -> y [N][C][Ho][Wo] */
    int (*maxpool)(act_backend *be, act_buf x, int N, int C, int H, int W, act_buf y);
    /* x [N][K][HW] -> softmax over HW per keypoint -> expected (x, y) under pos_grid [HW][2]
     * -> y [N][2K] interleaved x0,y0,x1,y1,... (row-major, a transformer tensor) */
    int (*spatial_softmax)(act_backend *be, act_buf x, int N, int K, int HW,
                           const act_tensor *pos_grid, act_buf y);

    /* ---- transformer ---- */
    /* y[M][out] = epi(x[M][in] W^T + b); x is the activation dtype or F32 (normalized inputs;
     * a 16-bit backend converts it first), y the activation dtype or F32 */
    int (*linear)(act_backend *be, const act_linear *l, act_buf x, int M, act_epilogue epi, act_buf y);
    /* A group of n linears of one shape (in -> out, each with a bias, no activation) that always
     * read the same input, side by side: y[M][n * out], linear i in columns [i*out, (i+1)*out)
     * (the cross-attention K/V of every decoder layer, from the one memory). Optional: with
     * NULL the forward pass runs each linear before its layer.
     * linear_group_prepare is a setup-time call, made once per group before any linear_group
     * on it (CUDA: stacks the weights, so the group is one GEMM); linear_group gets the same
     * array. */
    int (*linear_group_prepare)(act_backend *be, const act_linear *ls, int n);
    int (*linear_group)(act_backend *be, const act_linear *ls, int n, act_buf x, int M, act_buf y);
    /* softmax(q k^T / sqrt(dh)) v per head; q rows [B][Lq] with row stride qs (elements), k/v rows
     * [B][Lk] with row stride kvs; head h uses columns [h*dh, (h+1)*dh); out [B][Lq][nh*dh] dense.
     * key_pad: optional U8 [B][Lk], 1 = key masked out. */
    int (*attention)(act_backend *be, act_buf q, int qs, act_buf k, act_buf v, int kvs,
                     int B, int Lq, int Lk, int nh, int dh, act_buf key_pad, act_buf out);
    /* y = LayerNorm(x + attention(...) W_out^T + b_out) * w + b: attention as above (out of
     * nh*dh = E columns), the output projection `out` (E -> E), the residual x and the post-norm
     * in one op; rows B*Lq, y may alias x. Optional (NULL: the forward pass runs attention,
     * linear and add_layernorm), and used only up to fused_attn_max_rows rows. */
    int fused_attn_max_rows;
    int (*attention_out_ln)(act_backend *be, act_buf q, int qs, act_buf k, act_buf v, int kvs,
                            int B, int Lq, int Lk, int nh, int dh, act_buf key_pad,
                            const act_linear *out, act_buf x, const act_ln *ln, float eps,
                            act_buf y);
    /* y = LayerNorm(x + d) * w + b, rows of E; y may alias x */
    int (*add_layernorm)(act_backend *be, act_buf x, act_buf d, const act_ln *ln, float eps,
                         int rows, int E, act_buf y);
    /* out[b][r] = t[r] for b < B, t a weight tensor of R rows of E (decoder queries) */
    int (*broadcast_rows)(act_backend *be, const act_tensor *t, int B, int R, int E, act_buf out);
    /* decoder memory: out[b][0] = lat[b], out[b][1] = qp[b], out[b][2+c] = vis[c*B + b]
     * each + pos[l] + type[min(l,2)]; pos is a sinusoid table [>= 2+ncam][E] (act_buf F32) */
    int (*memory_assemble)(act_backend *be, act_buf lat, act_buf qp, act_buf vis, int B, int ncam,
                           int E, act_buf pos, const act_tensor *type_embed, act_buf out);
    /* posterior tokens: out[b][0] = cls, out[b][1] = qp[b], out[b][2+h] = act[b*H + h], + pos[l] */
    int (*posterior_assemble)(act_backend *be, const act_tensor *cls, act_buf qp, act_buf act,
                              int B, int H, int E, act_buf pos, act_buf out);
    /* sinusoid table [L][E] in fp32 exactly as _build_sinusoidal_table (setup time) */
    int (*sinusoid_table)(act_backend *be, int L, int E, act_buf out);
    /* (de)normalization, F32 in, y F32 or the activation dtype: min_max
     * y = 2(x-lo)/max(hi-lo,eps) - 1, mean_std y = (x-lo)/max(hi,eps); inverse undoes it.
     * x, y [rows][dim] */
    int (*normalize)(act_backend *be, act_buf x, int rows, int dim, const act_tensor *lo,
                     const act_tensor *hi, act_norm_type type, float eps, int inverse, act_buf y);
    /* ml [B][2L] = mu | logvar -> mu, logvar F32 [B][L], kl F32 [B] (sum over dims), and
     * z [B][L] = mu (sample = 0) or mu + eps * exp(logvar/2), eps = act_normal_eps(seed, b*L+i)
     * with seed read from the U8 buffer seed8 (8 bytes, little endian) */
    int (*latent)(act_backend *be, act_buf ml, int B, int L, int sample, act_buf seed8,
                  act_buf mu, act_buf logvar, act_buf kl, act_buf z);
    /* convert/copy n elements between buffers of any float dtypes */
    int (*copy)(act_backend *be, act_buf dst, act_buf src, size_t n);
    /* dst[r][j] = src[r * src_stride + j] for r < rows, j < n, any float dtypes: one op for
     * what would be a copy per row (the posterior's cls token of every batch element); with
     * src_stride 0 every row is src's first (a broadcast: the decoder's constant prefix) */
    int (*gather_rows)(act_backend *be, act_buf dst, act_buf src, int rows, size_t n,
                       size_t src_stride);
};

int act_backend_cpu_create(act_precision prec, act_backend **out, char *err, size_t errlen);
/* Returns -1 with a clear message when built without CUDA or when no device is usable. */
int act_backend_cuda_create(int device, act_precision prec, act_backend **out, char *err, size_t errlen);

#endif
