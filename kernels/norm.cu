/* norm.cu - normalization kernels. Both use two passes over the data (mean, then the mean of
 * squared deviations) rather than E[x^2] - E[x]^2, which loses digits when |mean| >> std; the
 * data is re-read from L1/L2, cheap at these sizes. Each element is read and written by the
 * same thread after all reductions, so in-place use (y == x) is safe.
 *  - GroupNorm: one block per (image, group); a group is contiguous in NCHW.
 *  - add_layernorm: one warp per row (E = 256 here: 8 elements per lane). */
#include "norm.cuh"

/* element i of group (n, g): NCHW keeps a group contiguous (channel i / HW); NHWC interleaves
 * it with the other groups (pixel i / cpg, channel g * cpg + i % cpg) */
static __device__ __forceinline__ size_t gn_index(int nhwc, int n, int g, int C, int HW, int cpg,
                                                  size_t i, int *c) {
    if (nhwc) {
        *c = g * cpg + (int)(i % cpg);
        return ((size_t)n * HW + i / cpg) * C + *c;
    }
    *c = g * cpg + (int)(i / HW);
    return ((size_t)n * C + (size_t)g * cpg) * HW + i;
}

static __global__ void groupnorm_kernel(const void *x, int xdt, int C, int HW, int groups,
                                        int nhwc, float eps, const float *gamma,
                                        const float *beta, const void *res, int rdt, int epi,
                                        void *y, int ydt) {
    __shared__ float red[32];
    int cpg = C / groups;
    size_t cnt = (size_t)cpg * HW;
    int n = blockIdx.x / groups, g = blockIdx.x % groups;   /* blockIdx.x = n * groups + g */
    int c;
    float s = 0.0f;
    for (size_t i = threadIdx.x; i < cnt; i += blockDim.x)
        s += kld(x, xdt, gn_index(nhwc, n, g, C, HW, cpg, i, &c));
    float mean = block_sum(s, red) / (float)cnt;
    s = 0.0f;
    for (size_t i = threadIdx.x; i < cnt; i += blockDim.x) {
        float dv = kld(x, xdt, gn_index(nhwc, n, g, C, HW, cpg, i, &c)) - mean;
        s += dv * dv;
    }
    float rstd = 1.0f / sqrtf(block_sum(s, red) / (float)cnt + eps);
    for (size_t i = threadIdx.x; i < cnt; i += blockDim.x) {
        size_t at = gn_index(nhwc, n, g, C, HW, cpg, i, &c);
        float v = (kld(x, xdt, at) - mean) * rstd * gamma[c] + beta[c];
        if (res) v += kld(res, rdt, at);
        if (epi == 1) v = fmaxf(v, 0.0f);
        else if (epi == 2) v = act_gelu(v);
        kst(y, ydt, at, v);
    }
}

int act_k_groupnorm(const void *x, int xdt, int N, int C, int HW, int groups, int nhwc, float eps,
                    const float *gamma, const float *beta, const void *res, int rdt, int epi,
                    void *y, int ydt, cudaStream_t st, char *err, size_t errlen) {
    if (groups <= 0 || C % groups) {
        snprintf(err, errlen, "groupnorm: %d channels are not divisible into %d groups", C, groups);
        return -1;
    }
    if (N == 0) return 0;
    groupnorm_kernel<<<N * groups, 256, 0, st>>>(x, xdt, C, HW, groups, nhwc, eps, gamma, beta,
                                                 res, rdt, epi, y, ydt);
    KLAUNCH(groupnorm_kernel);
    return 0;
}

static __global__ void add_layernorm_kernel(const void *x, int xdt, const void *d, int ddt,
                                            const float *w, const float *b, float eps, int rows,
                                            int E, void *y, int ydt) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows) return;                           /* whole warps exit together */
    size_t base = (size_t)row * E;
    float s = 0.0f;
    for (int i = lane; i < E; i += 32)
        s += kld(x, xdt, base + i) + (d ? kld(d, ddt, base + i) : 0.0f);
    float mean = warp_sum(s) / (float)E;
    s = 0.0f;
    for (int i = lane; i < E; i += 32) {
        float dv = kld(x, xdt, base + i) + (d ? kld(d, ddt, base + i) : 0.0f) - mean;
        s += dv * dv;
    }
    float rstd = 1.0f / sqrtf(warp_sum(s) / (float)E + eps);
    for (int i = lane; i < E; i += 32) {
        float v = kld(x, xdt, base + i) + (d ? kld(d, ddt, base + i) : 0.0f);
        kst(y, ydt, base + i, (v - mean) * rstd * w[i] + b[i]);
    }
}

int act_k_add_layernorm(const void *x, int xdt, const void *d, int ddt, const float *w,
                        const float *b, float eps, int rows, int E, void *y, int ydt,
                        cudaStream_t st, char *err, size_t errlen) {
    if (rows == 0) return 0;
    const int warps = 4;
    add_layernorm_kernel<<<CEIL_DIV(rows, warps), warps * 32, 0, st>>>(x, xdt, d, ddt, w, b, eps,
                                                                      rows, E, y, ydt);
    KLAUNCH(add_layernorm_kernel);
    return 0;
}
