/* pool.cu - max pool: one thread per output element (9 taps, NCHW). Spatial softmax: one warp
 * per (image, keypoint) over its HW logits (49 at 224x224 input), computed like PyTorch's
 * F.softmax followed by attention @ pos_grid: p = exp(x - max) / sum, then sum p * pos. */
#include "pool.cuh"
#include <math.h>

static __global__ void maxpool_kernel(const void *x, int xdt, int N, int C, int H, int W, int Ho,
                                      int Wo, void *y, int ydt) {
    size_t n = (size_t)N * C * Ho * Wo;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ox = (int)(i % Wo), oy = (int)((i / Wo) % Ho);
        size_t plane = i / ((size_t)Wo * Ho);          /* n * C + c */
        const size_t xb = plane * H * W;
        float m = -INFINITY;
        for (int ky = 0; ky < 3; ky++) {
            int iy = oy * 2 - 1 + ky;
            if (iy < 0 || iy >= H) continue;
            for (int kx = 0; kx < 3; kx++) {
                int ix = ox * 2 - 1 + kx;
                if (ix < 0 || ix >= W) continue;
                m = fmaxf(m, kld(x, xdt, xb + (size_t)iy * W + ix));
            }
        }
        kst(y, ydt, i, m);
    }
}

int act_k_maxpool(const void *x, int xdt, int N, int C, int H, int W, void *y, int ydt,
                  cudaStream_t st, char *err, size_t errlen) {
    int Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
    size_t n = (size_t)N * C * Ho * Wo;
    if (n == 0) return 0;
    size_t g = CEIL_DIV(n, (size_t)256);
    maxpool_kernel<<<(int)(g < 65535 * 8 ? g : 65535 * 8), 256, 0, st>>>(x, xdt, N, C, H, W, Ho,
                                                                          Wo, y, ydt);
    KLAUNCH(maxpool_kernel);
    return 0;
}

static __global__ void spatial_softmax_kernel(const void *x, int xdt, int NK, int K, int HW,
                                              const float *pos, void *y, int ydt) {
    int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);   /* n * K + k */
    int lane = threadIdx.x & 31;
    if (item >= NK) return;
    size_t base = (size_t)item * HW;
    float m = -INFINITY;
    for (int i = lane; i < HW; i += 32) m = fmaxf(m, kld(x, xdt, base + i));
    m = warp_max(m);
    float s = 0.0f;
    for (int i = lane; i < HW; i += 32) s += expf(kld(x, xdt, base + i) - m);
    s = warp_sum(s);
    float ex = 0.0f, ey = 0.0f;
    for (int i = lane; i < HW; i += 32) {
        float p = expf(kld(x, xdt, base + i) - m) / s;
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

int act_k_spatial_softmax(const void *x, int xdt, int N, int K, int HW, const float *pos, void *y,
                          int ydt, cudaStream_t st, char *err, size_t errlen) {
    int nk = N * K;
    if (nk == 0) return 0;
    const int warps = 4;
    spatial_softmax_kernel<<<CEIL_DIV(nk, warps), warps * 32, 0, st>>>(x, xdt, nk, K, HW, pos, y,
                                                                       ydt);
    KLAUNCH(spatial_softmax_kernel);
    return 0;
}
