/* pool.cu - max pool: one thread per output element (9 taps). Spatial softmax: one warp
 * per (image, keypoint) over its HW logits (49 at 224x224 input), computed like PyTorch's
 * F.softmax followed by attention @ pos_grid: p = exp(x - max) / sum, then sum p * pos.
 * Feature maps are NCHW, or NHWC when nhwc is set (the layout the backend chose; output index
 * order follows the same layout, so consecutive threads stay on consecutive addresses). */
#include "pool.cuh"
#include <math.h>
#include <stdint.h>

/* the input rows (or columns) [lo, hi) of output o's 3-wide, stride-2, pad-1 window */
static __device__ __forceinline__ void pool_window(int o, int n, int *lo, int *hi) {
    *lo = o * 2 - 1 < 0 ? 0 : o * 2 - 1;
    *hi = o * 2 + 2 > n ? n : o * 2 + 2;
}

static __global__ void maxpool_kernel(const void *x, int xdt, int N, int C, int H, int W, int Ho,
                                      int Wo, int nhwc, void *y, int ydt) {
    size_t n = (size_t)N * C * Ho * Wo;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ox, oy;
        size_t xb, step;                               /* first tap of the plane; one pixel */
        if (nhwc) {
            int c = (int)(i % C);
            size_t pix = i / C;                        /* (img * Ho + oy) * Wo + ox */
            ox = (int)(pix % Wo);
            oy = (int)((pix / Wo) % Ho);
            xb = pix / ((size_t)Wo * Ho) * H * W * C + c;
            step = (size_t)C;
        } else {
            ox = (int)(i % Wo);
            oy = (int)((i / Wo) % Ho);
            xb = i / ((size_t)Wo * Ho) * H * W;        /* plane n * C + c */
            step = 1;
        }
        int y0, y1, x0, x1;
        pool_window(oy, H, &y0, &y1);
        pool_window(ox, W, &x0, &x1);
        float m = -INFINITY;
        for (int iy = y0; iy < y1; iy++)
            for (int ix = x0; ix < x1; ix++)
                m = fmaxf(m, kld(x, xdt, xb + ((size_t)iy * W + ix) * step));
        kst(y, ydt, i, m);
    }
}

/* NHWC with the channels in 16-byte packs (8 bf16/fp16 or 4 fp32 of one pixel): a thread per
 * output pack, two divisions and nine 16-byte loads for its P values instead of four divisions
 * and nine 2-byte loads per value. The maximum is exact, so the values are the scalar kernel's. */
template <int DT, int P>
static __device__ __forceinline__ void maxpool_pack(const uint4 *x, uint4 *y, unsigned i,
                                                    unsigned cpk, int H, int W, int Ho, int Wo) {
    unsigned pix = i / cpk, cp = i - pix * cpk;     /* pix = (img * Ho + oy) * Wo + ox */
    unsigned row = pix / Wo, img = row / Ho;
    int ox = (int)(pix - row * Wo), oy = (int)(row - img * Ho);
    int y0, y1, x0, x1;
    pool_window(oy, H, &y0, &y1);
    pool_window(ox, W, &x0, &x1);
    float m[P];
#pragma unroll
    for (int k = 0; k < P; k++) m[k] = -INFINITY;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++) {
            k_pack16 t;
            t.u = x[(((size_t)img * H + iy) * W + ix) * cpk + cp];
#pragma unroll
            for (int k = 0; k < P; k++) m[k] = fmaxf(m[k], pk_get<DT>(t, k));
        }
    k_pack16 o;
#pragma unroll
    for (int k = 0; k < P; k++) pk_set<DT>(o, k, m[k]);
    y[i] = o.u;
}

static __global__ void maxpool_vec_kernel(const uint4 *x, int dt, unsigned n, unsigned cpk, int H,
                                          int W, int Ho, int Wo, uint4 *y) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        if (dt == KDT_BF16) maxpool_pack<KDT_BF16, 8>(x, y, i, cpk, H, W, Ho, Wo);
        else if (dt == KDT_F16) maxpool_pack<KDT_F16, 8>(x, y, i, cpk, H, W, Ho, Wo);
        else maxpool_pack<KDT_F32, 4>(x, y, i, cpk, H, W, Ho, Wo);
    }
}

int act_k_maxpool(const void *x, int xdt, int N, int C, int H, int W, int nhwc, void *y, int ydt,
                  cudaStream_t st, char *err, size_t errlen) {
    int Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
    size_t n = (size_t)N * C * Ho * Wo;
    if (n == 0) return 0;
    int per = xdt == KDT_F32 ? 4 : 8;   /* packs below 2^31: the 32-bit grid stride cannot wrap */
    if (nhwc && xdt == ydt && xdt <= KDT_F16 && C % per == 0 && n / per <= 0x7fffffffu &&
        (((uintptr_t)x | (uintptr_t)y) & 15) == 0) {
        size_t np = n / per;
        maxpool_vec_kernel<<<act_grid(np), 256, 0, st>>>((const uint4 *)x, xdt, (unsigned)np,
                                                         (unsigned)(C / per), H, W, Ho, Wo,
                                                         (uint4 *)y);
        KLAUNCH(maxpool_vec_kernel);
        return 0;
    }
    maxpool_kernel<<<act_grid(n), 256, 0, st>>>(x, xdt, N, C, H, W, Ho, Wo, nhwc, y, ydt);
    KLAUNCH(maxpool_kernel);
    return 0;
}

static __global__ void spatial_softmax_kernel(const void *x, int xdt, int NK, int K, int HW,
                                              int nhwc, const float *pos, void *y, int ydt) {
    int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);   /* n * K + k */
    int lane = threadIdx.x & 31;
    if (item >= NK) return;
    /* logit i of the item at base + i * step */
    size_t base = nhwc ? (size_t)(item / K) * HW * K + item % K : (size_t)item * HW;
    size_t step = nhwc ? (size_t)K : 1;
    float m = -INFINITY;
    for (int i = lane; i < HW; i += 32) m = fmaxf(m, kld(x, xdt, base + i * step));
    m = warp_max(m);
    float s = 0.0f;
    for (int i = lane; i < HW; i += 32) s += expf(kld(x, xdt, base + i * step) - m);
    s = warp_sum(s);
    float ex = 0.0f, ey = 0.0f;
    for (int i = lane; i < HW; i += 32) {
        float p = expf(kld(x, xdt, base + i * step) - m) / s;
        ex += p * pos[2 * i];
        ey += p * pos[2 * i + 1];
    }
    ex = warp_sum(ex);
    ey = warp_sum(ey);
    if (lane == 0) {
        kst(y, ydt, (size_t)item * 2, ex);
        kst(y, ydt, (size_t)item * 2 + 1, ey);
    }
}

int act_k_spatial_softmax(const void *x, int xdt, int N, int K, int HW, int nhwc, const float *pos,
                          void *y, int ydt, cudaStream_t st, char *err, size_t errlen) {
    int nk = N * K;
    if (nk == 0) return 0;
    const int warps = 4;
    spatial_softmax_kernel<<<CEIL_DIV(nk, warps), warps * 32, 0, st>>>(x, xdt, nk, K, HW, nhwc,
                                                                       pos, y, ydt);
    KLAUNCH(spatial_softmax_kernel);
    return 0;
}
