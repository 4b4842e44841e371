/* cpu_linear_packed.c - the decoder's linears at few rows, on act_cpu_pgemm over weights packed
 * at load.
 * defines: act_cpu_plin_load, act_cpu_plin_free, act_cpu_plin_run
 *
 * At batch 1 a decoder linear is y[16][out] = x[16][in] W^T: every weight is used by 16 rows
 * only, so the step streams the decoder's 38 MB of weights for 0.28 GFLOP. OpenBLAS runs these
 * at 21-28 GFLOP/s on one thread of the session-13 Xeon (it packs W, the large operand, on every
 * call); act_cpu_pgemm over W packed once at load reads each weight once, in order: 45-49 GFLOP/s
 * at 16 rows, 14 vs 7 at the 5 memory rows of the cross-attention K/V (bench/NOTES.md).
 *
 * The product is computed transposed, y^T = W x^T (W the 8-row-panel A operand, x^T the B
 * operand, its rows the kernel's columns), so it pays only while x^T fits one 48-column pass
 * (M <= 48 rows: the decoder at batch 1-3, the K/V at batch 1-9); beyond that W would be read
 * once per pass and OpenBLAS, which packs it once, is faster. The output panels go over the
 * backend's threads; each thread writes its columns of y with the bias and activation.
 * Which weights: the decoder layers' in_proj, out_proj, linear1 and linear2 tensors (any row
 * view in 8s of them), where act_cpu_pgemm runs (AVX-512) and the backend threads its products;
 * ACT_CPU_PACKED_LINEAR=0 keeps OpenBLAS. The packed copy is counted in the backend's bytes. */
#include <string.h>
#include "cpu_ops.h"
#include "model.h"
#include "util.h"

/* rows of x that one pass of act_cpu_pgemm's widest block covers */
#define PLIN_MAX_ROWS 48

static int packable(const act_tensor *w) {
    return w && w->data && w->ndim == 2 && w->dims[0] % 8 == 0 && w->dims[0] > 0 && w->dims[1] > 0;
}

static void add(const act_tensor *w, const act_tensor **list, int *n, size_t *floats) {
    if (!packable(w)) return;
    for (int i = 0; i < *n; i++)
        if (list[i] == w) return;
    if (*n >= ACT_CPU_PLIN_MAX) return;
    list[(*n)++] = w;
    *floats += (size_t)w->dims[0] * w->dims[1];
}

void act_cpu_plin_free(act_cpu_ctx *ctx) {
    ctx->bytes -= ctx->plin_bytes;
    act_aligned_free(ctx->plin_data);
    act_aligned_free(ctx->ws_plin);
    ctx->plin_data = ctx->ws_plin = NULL;
    ctx->plin_bytes = 0;
    ctx->n_plin = 0;
}

int act_cpu_plin_load(act_cpu_ctx *ctx, const act_model *m, char *err, size_t errlen) {
    act_cpu_plin_free(ctx);
    if (!act_cpu_switch_on("ACT_CPU_PACKED_LINEAR") || !act_cpu_pgemm_ok() || !act_cpu_gemm_split_on())
        return 0;
    const act_tensor *list[ACT_CPU_PLIN_MAX];
    int n = 0;
    size_t floats = 0;
    for (int l = 0; l < m->cfg.dec_layers && l < ACT_MAX_LAYERS; l++) {
        const act_dec_layer *d = &m->dec[l];
        add(d->self_attn.qkv.w, list, &n, &floats);
        add(d->self_attn.out.w, list, &n, &floats);
        add(d->cross_attn.qkv.w, list, &n, &floats);
        add(d->cross_attn.out.w, list, &n, &floats);
        add(d->ff1.w, list, &n, &floats);
        add(d->ff2.w, list, &n, &floats);
    }
    if (!n) return 0;
    /* scratch: x^T and y^T of the widest linear at PLIN_MAX_ROWS rows */
    size_t wide = 0;
    for (int i = 0; i < n; i++) {
        if ((size_t)list[i]->dims[0] > wide) wide = (size_t)list[i]->dims[0];
        if ((size_t)list[i]->dims[1] > wide) wide = (size_t)list[i]->dims[1];
    }
    size_t bytes, ws = 2 * wide * PLIN_MAX_ROWS;
    if (!act_mul_ok(floats, sizeof(float), &bytes) || !(ctx->plin_data = act_aligned_alloc(bytes)) ||
        !(ctx->ws_plin = act_aligned_alloc(ws * sizeof(float)))) {
        act_cpu_plin_free(ctx);
        return act_errf(err, errlen, "cpu load_weights: out of memory for %zu floats of packed "
                        "decoder weights (ACT_CPU_PACKED_LINEAR=0 runs without them)", floats);
    }
    float *p = ctx->plin_data;
    for (int i = 0; i < n; i++) {
        int rows = (int)list[i]->dims[0], K = (int)list[i]->dims[1];
        const float *w = list[i]->data;
        for (int r = 0; r < rows; r++)
            for (int k = 0; k < K; k++) p[act_cpu_pgemm_pack_index(r, k, K)] = w[(size_t)r * K + k];
        ctx->plin[i].w = list[i];
        ctx->plin[i].p = p;
        p += (size_t)rows * K;
    }
    ctx->n_plin = n;
    ctx->ws_plin_elems = ws;
    ctx->plin_bytes = bytes;
    ctx->bytes += bytes;
    return 0;
}

typedef struct plin_job {
    const float *wp, *xt, *bias;
    float *yt, *y;
    int M, K, ldy;
    act_epilogue epi;
} plin_job;

/* output panels [lo, hi) of 8 rows of y^T, then their columns of y */
static void plin_task(void *arg, int t, int lo, int hi) {
    const plin_job *q = arg;
    int j0 = 8 * lo, nj = 8 * (hi - lo);
    act_cpu_pgemm(nj, q->M, q->K, q->wp + (size_t)j0 * q->K, q->xt, q->M, q->yt + (size_t)j0 * q->M, q->M);
    for (int i = 0; i < q->M; i++) {
        float *r = q->y + (size_t)i * q->ldy;
        for (int j = j0; j < j0 + nj; j++)
            r[j] = act_cpu_epi(q->yt[(size_t)j * q->M + i] + (q->bias ? q->bias[j] : 0.0f), q->epi);
    }
}

int act_cpu_plin_run(act_cpu_ctx *ctx, const act_linear *l, const float *x, int M,
                     act_epilogue epi, float *y, int ldy) {
    if (M < 1 || M > PLIN_MAX_ROWS || l->row0 % 8 || l->out % 8) return 1;
    const float *wp = NULL;
    for (int i = 0; i < ctx->n_plin; i++)
        if (ctx->plin[i].w == l->w) wp = ctx->plin[i].p;
    int K = l->in;
    if (!wp || (size_t)K * M + (size_t)l->out * M > ctx->ws_plin_elems) return 1;
    float *xt = ctx->ws_plin, *yt = xt + (size_t)K * M;
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) xt[(size_t)k * M + i] = x[(size_t)i * K + k];
    plin_job q = {wp + (size_t)l->row0 * K, xt, l->b ? l->b->data + l->row0 : NULL, yt, y, M, K,
                  ldy, epi};
    act_pool_run(ctx->pool, plin_task, &q, l->out / 8);
    ctx->plin_calls++;
    return 0;
}
