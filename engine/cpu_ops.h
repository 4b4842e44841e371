/* cpu_ops.h - internals shared by the CPU backend's files (not a public header).
 * defines: act_cpu_ctx, act_cpu_sgemm, the cpu_* op functions that backend_cpu.c puts in the
 * op table, act_cpu_conv_workspace, the Winograd convs (cpu_winograd.c).
 *
 * The CPU backend is plain C11, fp32 only, feature maps NCHW. Buffers are host memory, so an
 * act_buf's p is used directly and weights are read in place from the model's blob (the Winograd
 * filters of the 3x3 stride-1 convs are the one copy made, at load_weights). All scratch
 * (the im2col and GEMM workspaces) is sized from the model at load_weights, so no op allocates. */
#ifndef ACT_CPU_OPS_H
#define ACT_CPU_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>   /* getenv (act_cpu_switch_on) */
#include <string.h>
#include "backend.h"
#include "pool.h"
#include "util.h"

/* Winograd filters of a model's 3x3 stride-1 convs (cpu_winograd.c); 3 trunks x 16; m: the
 * output tile, F(m x m, 3x3) with m 2 or 4; group: images per pass; packed: u is in
 * act_cpu_pgemm's layout (all three chosen at load) */
#define ACT_CPU_WINO_MAX 64
typedef struct act_cpu_wino { const act_tensor *w; const float *u; int m, group, packed; } act_cpu_wino;

/* decoder weights packed for act_cpu_pgemm (cpu_linear_packed.c): 6 tensors a layer */
#define ACT_CPU_PLIN_MAX (6 * ACT_MAX_LAYERS)
typedef struct act_cpu_plin { const act_tensor *w; const float *p; } act_cpu_plin;

typedef struct act_cpu_ctx {
    void **allocs;            /* every alloc() block, freed at destroy */
    size_t n_allocs, cap_allocs;
    size_t bytes;             /* sum of alloc() sizes: the "device" memory of this backend */
    float *ws_col;            /* im2col columns of ACT_CPU_CONV_GROUP images of the largest conv */
    size_t ws_col_elems;
    float *ws_out;            /* GEMM output of such a group, before the NCHW epilogue */
    size_t ws_out_elems;
    float *ws_rows;           /* per thread, Winograd row scratch (act_cpu_wino_rows); then a zero row */
    size_t ws_rows_elems;     /* of one thread */
    act_pool *pool;
    int timing_model;         /* ACT_CPU_TIMING_MODEL: steps are busy waits (backend_cpu.c) */
    double model_base_us, model_per_us;
    act_cpu_wino wino[ACT_CPU_WINO_MAX];   /* transformed filters, by the conv's weight tensor */
    int n_wino;
    float *wino_data;         /* one block holding every wino[i].u */
    size_t wino_bytes;        /* counted in bytes (weights the backend made) */
    unsigned long wino_convs; /* convolutions run by Winograd (for tests and profiles) */
    unsigned long wino4_convs; /* of those, by F(4x4,3x3) */
    unsigned long packed_convs; /* of those, by act_cpu_pgemm over filters packed at load */
    unsigned long stem_convs; /* convolutions run by cpu_stem.c (the same) */
    act_cpu_plin plin[ACT_CPU_PLIN_MAX];   /* packed decoder weights, by tensor */
    int n_plin;
    float *plin_data;         /* one block holding every plin[i].p */
    size_t plin_bytes;        /* counted in bytes */
    float *ws_plin;           /* x^T and y^T of one packed linear */
    size_t ws_plin_elems;
    unsigned long plin_calls; /* linears run over packed weights (tests, profiles) */
    double section_acc[ACT_SECTION_COUNT];
    double section_t0;
    int section_open;         /* section being timed (act_section), -1 when none */
} act_cpu_ctx;

/* C[M][N] = A[M][K] * op(B); op(B) = B [K][N] (trans_b 0) or B^T with B [N][K] (trans_b 1).
 * OpenBLAS when built with it, else a cache-blocked loop. */
void act_cpu_sgemm(int trans_b, int M, int N, int K, const float *A, int lda, const float *B,
                   int ldb, float *C, int ldc);

/* The same product on the pool's threads, each a block of C's rows or columns (cpu_gemm.c);
 * on the calling thread when small, or when act_cpu_gemm_split_on is 0. */
void act_cpu_sgemm_split(act_pool *pool, int trans_b, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc);
/* 1: the backend threads the products (OpenBLAS set to one thread); 0: ACT_CPU_SPLIT_GEMM=0, or
 * a BLAS that threads itself */
int act_cpu_gemm_split_on(void);
/* 1: the BLAS linked is OpenBLAS (its thread count is the backend's to set) */
int act_cpu_blas_is_openblas(void);
/* OpenBLAS's thread count now (after act_cpu_blas_init set it); 0: not OpenBLAS */
int act_cpu_blas_threads_now(void);

/* C[M][N] = A[M][K] * B[K][N] with A packed at load in panels of 8 rows (cpu_pgemm.c; M a
 * multiple of 8): A[i][k] at act_cpu_pgemm_pack_index(i, k, K). One thread. Only where
 * act_cpu_pgemm_ok() (an AVX-512 CPU); the Winograd filters of layer3-4 and the decoder's
 * weights use it. */
int act_cpu_pgemm_ok(void);
size_t act_cpu_pgemm_pack_index(int i, int k, int K);
void act_cpu_pgemm(int M, int N, int K, const float *Ap, const float *B, int ldb, float *C, int ldc);

/* Prepares the GEMM library once per process (see cpu_gemm.c); returns its name for display. */
const char *act_cpu_blas_init(void);
/* Threads for the backend's own loops and products: ACT_CPU_THREADS, else the BLAS's thread
 * count at start (OPENBLAS_NUM_THREADS, else GOTO_NUM_THREADS, else OMP_NUM_THREADS: OpenBLAS
 * reads all three), else the online cores (at most 64). */
int act_cpu_threads(void);
/* How long the pool's threads spin between parallel loops before they sleep (act_pool_set_spin_us):
 * ACT_POOL_SPIN_US, 0..10000 microseconds, default 100 (0 with ACT_CPU_SPLIT_GEMM=0). */
long act_cpu_spin_us(void);

/* Images whose convolution runs as one GEMM: one policy step's cameras (3), so the weights are
 * packed once per conv and the GEMM is wide enough to thread well (F(4x4) Winograd convs take one
 * image at a time: wino_group in cpu_winograd.c). */
#define ACT_CPU_CONV_GROUP 3

/* Per image, the largest im2col (or Winograd input) matrix and the largest conv (or Winograd
 * product) output, in elements, over the model's convs; rows: the Winograd row scratch. */
int act_cpu_conv_workspace(const act_model *m, size_t *col_elems, size_t *out_elems,
                           size_t *rows_elems, char *err, size_t errlen);

/* a CPU path switch for A/B runs (act_env_switch_on, util.h) */
static inline int act_cpu_switch_on(const char *name) { return act_env_switch_on(name); }

/* ---- Winograd F(2x2,3x3) and F(4x4,3x3) for 3x3 stride-1 pad-1 convs (cpu_winograd.c) ---- */
int act_cpu_wino_shape(const act_conv *c);         /* k 3, stride 1, pad 1 */
/* the output tile m of a Winograd-shaped conv: 4 up to 128 x 128 channels, else 2;
 * ACT_CPU_WINO_TILE=2|4 forces one (A/B runs, tests) */
int act_cpu_wino_tile(const act_conv *c);
/* (m+2)^2 positions x the m x m tiles of an H x W map: V's floats per input channel */
size_t act_cpu_wino_span(const act_conv *c, int H, int W);
size_t act_cpu_wino_rows(int W);                    /* row scratch per thread for width W (either tile) */
int act_cpu_wino_load(act_cpu_ctx *ctx, const act_model *m, char *err, size_t errlen);  /* ACT_CPU_WINOGRAD=0: none */
void act_cpu_wino_free(act_cpu_ctx *ctx);
/* 0: done; 1: not a conv of the loaded model, or its map is larger (im2col takes it) */
int act_cpu_wino_conv(act_cpu_ctx *ctx, const act_conv *c, const float *x, int N, int H, int W,
                      const float *residual, act_epilogue epi, float *y);

/* ---- the decoder's linears at few rows over weights packed at load (cpu_linear_packed.c) ---- */
int act_cpu_plin_load(act_cpu_ctx *ctx, const act_model *m, char *err, size_t errlen);  /* none: 0 */
void act_cpu_plin_free(act_cpu_ctx *ctx);
/* y rows of ldy floats = epi(x W[row0:row0+out]^T + b); 0: done, 1: not packed or too many rows
 * (the caller runs the BLAS) */
int act_cpu_plin_run(act_cpu_ctx *ctx, const act_linear *l, const float *x, int M,
                     act_epilogue epi, float *y, int ldy);

/* ---- the trunk's first conv computed directly (cpu_stem.c) ---- */
/* 0: done; 1: not its conv (it takes <= 4 input channels, output channels a multiple of 16,
 * stride 1 or 2, no residual, ReLU or nothing after; none with ACT_CPU_STEM=0) or the
 * workspaces are too small: im2col takes it */
int act_cpu_stem_conv(act_cpu_ctx *ctx, const act_conv *c, const float *x, int N, int H, int W,
                      const float *residual, act_epilogue epi, float *y);

/* Loops the CPU backend writes itself: also built for x86-64-v3 (AVX2 with FMA) and x86-64-v4
 * (AVX-512), picked at load by the CPU (GCC/Clang function multiversioning), as OpenBLAS picks
 * its kernels. A plain "avx2" clone would have no FMA: multiplies and adds apart, twice the
 * instructions in the direct stem's inner loop. */
/* act_cpu_wide_clone() says whether the AVX-512 clone is the one that runs (code sized for 32
 * vector registers then pays; in the others it spills); act_cpu_clone_name() names the clone
 * that runs, for the device line of reports. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && \
    !defined(ACT_NO_CLONES)
#define ACT_CPU_VEC_CLONES \
    __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
static inline int act_cpu_wide_clone(void) { return __builtin_cpu_supports("x86-64-v4"); }
static inline const char *act_cpu_clone_name(void) {
    return __builtin_cpu_supports("x86-64-v4") ? "AVX-512"
           : __builtin_cpu_supports("x86-64-v3") ? "AVX2+FMA" : "baseline x86-64";
}
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(ACT_NO_CLONES)
/* compilers without ISA-level clones: AVX2 without FMA, AVX-512 */
#define ACT_CPU_VEC_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))
static inline int act_cpu_wide_clone(void) { return __builtin_cpu_supports("avx512f"); }
static inline const char *act_cpu_clone_name(void) {
    return __builtin_cpu_supports("avx512f") ? "AVX-512"
           : __builtin_cpu_supports("avx2") ? "AVX2" : "baseline x86-64";
}
#else
#define ACT_CPU_VEC_CLONES
static inline int act_cpu_wide_clone(void) { return 0; }
static inline const char *act_cpu_clone_name(void) { return "compiler's default ISA"; }
#endif

/* ---- vision (cpu_vision.c) ---- */
/* o = epi(g + b + r) over n values of one output channel (o may be g, r NULL): a conv's bias,
 * residual and activation in PyTorch's order */
void act_cpu_conv_epilogue(float *o, const float *g, size_t n, float b, const float *r,
                           act_epilogue epi);
int cpu_preprocess(act_backend *be, act_buf frames, int B, int hi, int wi, const act_config *cfg,
                   act_buf out, const act_norm_job *side, int nside);
int cpu_conv2d(act_backend *be, const act_conv *c, act_buf x, int N, int H, int W,
               act_buf residual, act_epilogue epi, act_buf y);
int cpu_groupnorm(act_backend *be, act_buf x, int N, int C, int HW, int groups,
                  const act_tensor *gamma, const act_tensor *beta, act_buf residual,
                  act_epilogue epi, act_buf y);
int cpu_maxpool(act_backend *be, act_buf x, int N, int C, int H, int W, act_buf y);
int cpu_spatial_softmax(act_backend *be, act_buf x, int N, int K, int HW,
                        const act_tensor *pos_grid, act_buf y);

/* ---- transformer and small ops (cpu_transformer.c) ---- */
int cpu_linear(act_backend *be, const act_linear *l, act_buf x, int M, act_epilogue epi, act_buf y);
int cpu_linear_group_prepare(act_backend *be, const act_linear *ls, int n);
int cpu_linear_group(act_backend *be, const act_linear *ls, int n, act_buf x, int M, act_buf y);
int cpu_attention(act_backend *be, act_buf q, int qs, act_buf k, act_buf v, int kvs, int B, int Lq,
                  int Lk, int nh, int dh, act_buf key_pad, act_buf out);
int cpu_add_layernorm(act_backend *be, act_buf x, act_buf d, const act_ln *ln, float eps, int rows,
                      int E, act_buf y);
int cpu_broadcast_rows(act_backend *be, const act_tensor *t, int B, int R, int E, act_buf out);
int cpu_memory_assemble(act_backend *be, act_buf lat, act_buf qp, act_buf vis, int B, int ncam,
                        int E, act_buf pos, const act_tensor *type_embed, act_buf out);
int cpu_posterior_assemble(act_backend *be, const act_tensor *cls, act_buf qp, act_buf act, int B,
                           int H, int E, act_buf pos, act_buf out);
int cpu_sinusoid_table(act_backend *be, int L, int E, act_buf out);
int cpu_normalize(act_backend *be, act_buf x, int rows, int dim, const act_tensor *lo,
                  const act_tensor *hi, act_norm_type type, float eps, int inverse, act_buf y);
int cpu_latent(act_backend *be, act_buf ml, int B, int L, int sample, act_buf seed8, act_buf mu,
               act_buf logvar, act_buf kl, act_buf z);

/* y = epi(v), the activation epilogues every op shares (GELU is the exact erf form, as
 * PyTorch's activation="gelu"). */
static inline float act_cpu_epi(float v, act_epilogue epi) {
    if (epi == ACT_EPI_RELU) return v < 0.0f ? 0.0f : v;   /* NaN passes, as torch.relu */
    if (epi == ACT_EPI_GELU) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    return v;
}

#endif
