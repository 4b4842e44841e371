/* preprocess.cu - one thread per output pixel and channel.
 * The arithmetic follows PyTorch's CPU upsample_bilinear2d (align_corners=False) on the float
 * image: scale = in/out in float, src = scale*(dst+0.5)-0.5 clamped at 0, taps x0 and
 * x0+1 (clamped to the edge), weights l1 = src - x0, l0 = 1 - l1, combined as
 * h0*(w0*a + w1*b) + h1*(w0*c + w1*d); pixel values are u8 / 255 (a division, like x / 255).
 * Resize, crop and normalization happen in one pass: the crop only offsets the output window,
 * so the resized image is never materialized. Reads are 3-byte HWC gathers; at 256x256x3 per
 * camera the kernel is far from any bandwidth limit, so no shared-memory staging. The output is
 * NCHW, or NHWC when nhwc is set (the feature-map layout the backend chose). */
#include "preprocess.cuh"

static __device__ __forceinline__ float px(const unsigned char *f, int wi, int y, int x, int c) {
    return (float)f[((size_t)y * wi + x) * 3 + c] / 255.0f;
}

static __global__ void preprocess_kernel(const unsigned char *frames, int B, int hi, int wi,
                                         int rh, int rw, int top, int left, int ho, int wo,
                                         int imagenet, int nhwc, void *out, int odt) {
    size_t n = (size_t)B * 3 * ho * wo;
    float sh = (float)hi / (float)rh, sw = (float)wi / (float)rw;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int x, y, c;
        if (nhwc) {
            c = (int)(i % 3);
            x = (int)((i / 3) % wo);
            y = (int)((i / ((size_t)3 * wo)) % ho);
        } else {
            x = (int)(i % wo);
            y = (int)((i / wo) % ho);
            c = (int)((i / ((size_t)wo * ho)) % 3);
        }
        int b = (int)(i / ((size_t)3 * wo * ho));
        const unsigned char *f = frames + (size_t)b * hi * wi * 3;
        float sy = fmaxf(sh * ((float)(y + top) + 0.5f) - 0.5f, 0.0f);
        float sx = fmaxf(sw * ((float)(x + left) + 0.5f) - 0.5f, 0.0f);
        int y0 = (int)sy, x0 = (int)sx;
        int y1 = y0 + (y0 < hi - 1 ? 1 : 0), x1 = x0 + (x0 < wi - 1 ? 1 : 0);
        float h1 = sy - (float)y0, h0 = 1.0f - h1, w1 = sx - (float)x0, w0 = 1.0f - w1;
        float v = h0 * (w0 * px(f, wi, y0, x0, c) + w1 * px(f, wi, y0, x1, c)) +
                  h1 * (w0 * px(f, wi, y1, x0, c) + w1 * px(f, wi, y1, x1, c));
        if (imagenet) {
            float mean = c == 0 ? 0.485f : (c == 1 ? 0.456f : 0.406f);
            float sd = c == 0 ? 0.229f : (c == 1 ? 0.224f : 0.225f);
            v = (v - mean) / sd;
        }
        kst(out, odt, i, v);
    }
}

int act_k_preprocess(const unsigned char *frames, int B, int hi, int wi, int rh, int rw, int top,
                     int left, int ho, int wo, int imagenet, int nhwc, void *out, int odt,
                     cudaStream_t st, char *err, size_t errlen) {
    size_t n = (size_t)B * 3 * ho * wo;
    if (n == 0) return 0;
    preprocess_kernel<<<act_grid(n), 256, 0, st>>>(
        frames, B, hi, wi, rh, rw, top, left, ho, wo, imagenet, nhwc, out, odt);
    KLAUNCH(preprocess_kernel);
    return 0;
}
