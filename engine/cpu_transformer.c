/* cpu_transformer.c - the transformer and small ops of the CPU backend (row-major [rows][cols]).
 * defines: cpu_linear, cpu_linear_group_prepare, cpu_linear_group, cpu_attention,
 *          cpu_add_layernorm, cpu_broadcast_rows, cpu_memory_assemble, cpu_posterior_assemble,
 *          cpu_sinusoid_table, cpu_normalize, cpu_latent
 *
 * Shapes are tiny next to the vision trunk (16-18 tokens of 256), so everything but the linear
 * layers (sgemm) is a plain loop. Each op follows the PyTorch expression it replaces, operation
 * by operation where the order changes the float result (see the comments). */
#include <math.h>
#include <string.h>
#include "cpu_ops.h"
#include "rng.h"
#include "util.h"

static float *f32(act_buf b) { return (float *)b.p; }

/* y rows of ldy elements, the linear's out columns at the start of each */
static int linear_into(act_backend *be, const act_linear *l, act_buf x, int M, act_epilogue epi,
                       float *y, int ldy) {
    const act_tensor *w = l->w;
    if (!w || w->ndim != 2 || w->dims[1] != l->in || l->row0 + l->out > w->dims[0])
        return act_errf(be->err, sizeof be->err, "cpu linear: weight '%s' does not hold rows "
                        "[%d, %d) of width %d", w ? w->name : "(null)", l->row0,
                        l->row0 + l->out, l->in);
    act_cpu_ctx *ctx = be->ctx;
    if (!act_cpu_plin_run(ctx, l, f32(x), M, epi, y, ldy)) return 0;   /* packed decoder weights */
    act_cpu_sgemm_split(ctx->pool, 1, M, l->out, l->in, f32(x), l->in,
                        w->data + (size_t)l->row0 * l->in, l->in, y, ldy);
    const float *b = l->b ? l->b->data + l->row0 : NULL;
    for (int i = 0; i < M; i++) {
        float *r = y + (size_t)i * ldy;
        for (int j = 0; j < l->out; j++) r[j] = act_cpu_epi(r[j] + (b ? b[j] : 0.0f), epi);
    }
    return 0;
}

int cpu_linear(act_backend *be, const act_linear *l, act_buf x, int M, act_epilogue epi, act_buf y) {
    return linear_into(be, l, x, M, epi, f32(y), l->out);
}

/* The CPU gains nothing from stacking: each linear writes its columns of y (the GEMM's ldc). */
int cpu_linear_group_prepare(act_backend *be, const act_linear *ls, int n) {
    for (int i = 0; i < n; i++)
        if (ls[i].in != ls[0].in || ls[i].out != ls[0].out || !ls[i].b)
            return act_errf(be->err, sizeof be->err, "cpu linear group: '%s' is not %d -> %d "
                            "with a bias like the group's first", ls[i].w ? ls[i].w->name : "(null)",
                            ls[0].in, ls[0].out);
    return 0;
}

int cpu_linear_group(act_backend *be, const act_linear *ls, int n, act_buf x, int M, act_buf y) {
    for (int i = 0; i < n; i++)
        if (linear_into(be, &ls[i], x, M, ACT_EPI_NONE, f32(y) + (size_t)i * ls[0].out,
                        n * ls[0].out))
            return -1;
    return 0;
}

/* One query row against Lk keys, softmax with masked keys left out (exp(-inf) = 0), computed
 * online (running max, rescaled accumulator in the output row) so no scratch is needed. */
int cpu_attention(act_backend *be, act_buf q, int qs, act_buf k, act_buf v, int kvs, int B, int Lq,
                  int Lk, int nh, int dh, act_buf key_pad, act_buf out) {
    const uint8_t *pad = (const uint8_t *)key_pad.p;
    float scale = 1.0f / sqrtf((float)dh);
    int E = nh * dh;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < Lq; i++) {
                const float *qi = f32(q) + ((size_t)b * Lq + i) * qs + (size_t)h * dh;
                float *o = f32(out) + ((size_t)b * Lq + i) * E + (size_t)h * dh;
                float m = -INFINITY, l = 0.0f;
                memset(o, 0, sizeof(float) * dh);
                for (int j = 0; j < Lk; j++) {
                    if (pad && pad[(size_t)b * Lk + j]) continue;
                    const float *kj = f32(k) + ((size_t)b * Lk + j) * kvs + (size_t)h * dh;
                    const float *vj = f32(v) + ((size_t)b * Lk + j) * kvs + (size_t)h * dh;
                    float s = 0.0f;
                    for (int d = 0; d < dh; d++) s += qi[d] * kj[d];
                    s *= scale;
                    if (s > m) {
                        float r = expf(m - s);
                        l *= r;
                        for (int d = 0; d < dh; d++) o[d] *= r;
                        m = s;
                    }
                    float p = expf(s - m);
                    l += p;
                    for (int d = 0; d < dh; d++) o[d] += p * vj[d];
                }
                if (l > 0.0f)
                    for (int d = 0; d < dh; d++) o[d] /= l;
            }
    return 0;
}

/* y = LN(x + d): the sum is written to y first (safe when y aliases x), then normalized with
 * biased variance, as nn.LayerNorm. */
int cpu_add_layernorm(act_backend *be, act_buf x, act_buf d, const act_ln *ln, float eps, int rows,
                      int E, act_buf y) {
    for (int r = 0; r < rows; r++) {
        const float *xr = f32(x) + (size_t)r * E, *dr = f32(d) + (size_t)r * E;
        float *yr = f32(y) + (size_t)r * E;
        double sum = 0.0, sq = 0.0;
        for (int i = 0; i < E; i++) {
            yr[i] = xr[i] + dr[i];
            sum += yr[i];
        }
        double mean = sum / E;
        for (int i = 0; i < E; i++) sq += (yr[i] - mean) * (yr[i] - mean);
        float rstd = (float)(1.0 / sqrt(sq / E + eps)), fm = (float)mean;
        for (int i = 0; i < E; i++) yr[i] = (yr[i] - fm) * rstd * ln->w->data[i] + ln->b->data[i];
    }
    return 0;
}

int cpu_broadcast_rows(act_backend *be, const act_tensor *t, int B, int R, int E, act_buf out) {
    if (t->numel < (int64_t)R * E)
        return act_errf(be->err, sizeof be->err, "cpu broadcast_rows: '%s' has %lld values, "
                        "expected %d x %d", t->name, (long long)t->numel, R, E);
    for (int b = 0; b < B; b++) memcpy(f32(out) + (size_t)b * R * E, t->data, sizeof(float) * R * E);
    return 0;
}

/* memory = cat(latent, qpos, visual) + pos, then + type embedding: two additions, in that
 * order, as ACTPolicyHead._memory. */
int cpu_memory_assemble(act_backend *be, act_buf lat, act_buf qp, act_buf vis, int B, int ncam,
                        int E, act_buf pos, const act_tensor *type_embed, act_buf out) {
    int Lm = 2 + ncam;
    for (int b = 0; b < B; b++)
        for (int l = 0; l < Lm; l++) {
            const float *src = l == 0 ? f32(lat) + (size_t)b * E
                             : l == 1 ? f32(qp) + (size_t)b * E
                                      : f32(vis) + ((size_t)(l - 2) * B + b) * E;
            const float *p = f32(pos) + (size_t)l * E;
            const float *ty = type_embed->data + (size_t)(l < 2 ? l : 2) * E;
            float *o = f32(out) + ((size_t)b * Lm + l) * E;
            for (int i = 0; i < E; i++) o[i] = (src[i] + p[i]) + ty[i];
        }
    return 0;
}

int cpu_posterior_assemble(act_backend *be, const act_tensor *cls, act_buf qp, act_buf act, int B,
                           int H, int E, act_buf pos, act_buf out) {
    int Lp = H + 2;
    for (int b = 0; b < B; b++)
        for (int l = 0; l < Lp; l++) {
            const float *src = l == 0 ? cls->data
                             : l == 1 ? f32(qp) + (size_t)b * E
                                      : f32(act) + ((size_t)b * H + (l - 2)) * E;
            const float *p = f32(pos) + (size_t)l * E;
            float *o = f32(out) + ((size_t)b * Lp + l) * E;
            for (int i = 0; i < E; i++) o[i] = src[i] + p[i];
        }
    return 0;
}

/* _build_sinusoidal_table in float32: div = exp(arange(0, E, 2) * c) with the double constant
 * c = -ln(10000)/E rounded to float first (PyTorch casts a Python scalar to the tensor's float
 * type), sin/cos of the float product position * div. */
int cpu_sinusoid_table(act_backend *be, int L, int E, act_buf out) {
    float c = (float)(-log(10000.0) / (double)(E > 1 ? E : 1));
    for (int l = 0; l < L; l++) {
        float *row = f32(out) + (size_t)l * E;
        for (int i = 0; 2 * i < E; i++) {
            float div = expf((float)(2 * i) * c);
            float a = (float)l * div;
            row[2 * i] = sinf(a);
            if (2 * i + 1 < E) row[2 * i + 1] = cosf(a);
        }
    }
    return 0;
}

int cpu_normalize(act_backend *be, act_buf x, int rows, int dim, const act_tensor *lo,
                  const act_tensor *hi, act_norm_type type, float eps, int inverse, act_buf y) {
    if (lo->numel != dim || hi->numel != dim)
        return act_errf(be->err, sizeof be->err, "cpu normalize: stats '%s'/'%s' have %lld/%lld "
                        "values, expected %d", lo->name, hi->name, (long long)lo->numel,
                        (long long)hi->numel, dim);
    for (int r = 0; r < rows; r++) {
        const float *xr = f32(x) + (size_t)r * dim;
        float *yr = f32(y) + (size_t)r * dim;
        for (int i = 0; i < dim; i++) {
            float a = lo->data[i], b = hi->data[i];
            if (type == ACT_NORM_MIN_MAX) {
                float range = fmaxf(b - a, eps);
                yr[i] = inverse ? (xr[i] + 1.0f) / 2.0f * range + a : 2.0f * (xr[i] - a) / range - 1.0f;
            } else {
                float sd = fmaxf(b, eps);
                yr[i] = inverse ? xr[i] * sd + a : (xr[i] - a) / sd;
            }
        }
    }
    return 0;
}

/* kl = sum_i -0.5 (1 + logvar - mu^2 - exp(logvar)), the seed's klds summed over dims (its
 * batch mean is left to the caller). */
int cpu_latent(act_backend *be, act_buf ml, int B, int L, int sample, act_buf seed8, act_buf mu,
               act_buf logvar, act_buf kl, act_buf z) {
    uint64_t seed = 0;
    if (sample) {
        const uint8_t *s = (const uint8_t *)seed8.p;
        for (int i = 7; i >= 0; i--) seed = (seed << 8) | s[i];
    }
    for (int b = 0; b < B; b++) {
        const float *row = f32(ml) + (size_t)b * 2 * L;
        double acc = 0.0;
        for (int i = 0; i < L; i++) {
            float m = row[i], lv = row[L + i];
            f32(mu)[(size_t)b * L + i] = m;
            f32(logvar)[(size_t)b * L + i] = lv;
            acc += -0.5f * (1.0f + lv - m * m - expf(lv));
            float zz = m;
            if (sample) zz = m + act_normal_eps(seed, (uint64_t)b * L + i) * expf(0.5f * lv);
            f32(z)[(size_t)b * L + i] = zz;
        }
        f32(kl)[b] = (float)acc;
    }
    return 0;
}
