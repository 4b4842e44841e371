/* preprocess.cu - one thread per output pixel (its three channels, and any padding).
 * The arithmetic follows PyTorch's CPU upsample_bilinear2d (align_corners=False) on the float
 * image: scale = in/out in float, src = scale*(dst+0.5)-0.5 clamped at 0, taps x0 and
 * x0+1 (clamped to the edge), weights l1 = src - x0, l0 = 1 - l1, combined as
 * h0*(w0*a + w1*b) + h1*(w0*c + w1*d); pixel values are u8 / 255 (a division, like x / 255).
 * Resize, crop and normalization happen in one pass: the crop only offsets the output window,
 * so the resized image is never materialized. Reads are 3-byte HWC gathers; at 256x256x3 per
 * camera the kernel is far from any bandwidth limit, so no shared-memory staging. The output is
 * NCHW, or NHWC when nhwc is set (the feature-map layout the backend chose), where each pixel
 * may carry 1 or 5 zero channels after its three (ACT_CUDA_STEM_CHANNELS: the stem conv's input
 * padded to 4 or 8 channels, a shape cuDNN's tensor-core kernels take as it is).
 * gather brings frames that lie in the clients' page-locked host memory (one block column per
 * frame) into one dense device buffer first; preprocess then reads that as it reads an upload.
 * The threads past the image's elements normalize the side jobs (the step's qpos and actions),
 * so those ride along instead of costing a launch (a graph node) each. */
#include <stdint.h>
#include <string.h>
#include "preprocess.cuh"

static __device__ __forceinline__ float px(const unsigned char *f, int wi, int y, int x, int c) {
    return (float)f[((size_t)y * wi + x) * 3 + c] / 255.0f;
}

/* the side jobs by value (kernel parameters; unused ones empty); read with constant indices
 * only (an address taken or a variable index would copy the whole struct to every thread's local
 * memory) */
typedef struct { act_k_norm_side j[ACT_K_NORM_SIDES]; } norm_sides;
static_assert(ACT_K_NORM_SIDES == 2, "preprocess_kernel reads side jobs 0 and 1 by name");

static __device__ __forceinline__ void norm_side_elem(const act_k_norm_side &q, size_t e) {
    int d = (int)(e % q.dim);
    kst(q.y, q.ydt, e, act_norm_value(kld(q.x, q.xdt, e), q.lo[d], q.hi[d], q.type, q.eps, 0));
}

static __global__ void preprocess_kernel(const unsigned char *frames, int B, int hi, int wi,
                                         int rh, int rw, int top, int left, int ho, int wo,
                                         int imagenet, int nhwc, int cs, void *out, int odt,
                                         norm_sides side, size_t total) {
    /* n output pixels, then total - n side elements */
    size_t hw = (size_t)ho * wo, n = (size_t)B * hw;
    float sh = (float)hi / (float)rh, sw = (float)wi / (float)rw;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        if (i >= n) {   /* past the image: the side jobs' elements, one after another */
            size_t e = i - n, n0 = (size_t)side.j[0].rows * side.j[0].dim;
            if (e < n0) norm_side_elem(side.j[0], e);
            else norm_side_elem(side.j[1], e - n0);
            continue;
        }
        /* pixel i = (b, y, x): two divisions for its three values, the taps and weights shared */
        size_t b = i / hw;
        int q = (int)(i - b * hw), y = q / wo, x = q - y * wo;
        const unsigned char *f = frames + b * hi * wi * 3;
        float sy = fmaxf(sh * ((float)(y + top) + 0.5f) - 0.5f, 0.0f);
        float sx = fmaxf(sw * ((float)(x + left) + 0.5f) - 0.5f, 0.0f);
        int y0 = (int)sy, x0 = (int)sx;
        int y1 = y0 + (y0 < hi - 1 ? 1 : 0), x1 = x0 + (x0 < wi - 1 ? 1 : 0);
        float h1 = sy - (float)y0, h0 = 1.0f - h1, w1 = sx - (float)x0, w0 = 1.0f - w1;
#pragma unroll
        for (int c = 0; c < 3; c++) {
            float v = h0 * (w0 * px(f, wi, y0, x0, c) + w1 * px(f, wi, y0, x1, c)) +
                      h1 * (w0 * px(f, wi, y1, x0, c) + w1 * px(f, wi, y1, x1, c));
            if (imagenet) {
                float mean = c == 0 ? 0.485f : (c == 1 ? 0.456f : 0.406f);
                float sd = c == 0 ? 0.229f : (c == 1 ? 0.224f : 0.225f);
                v = (v - mean) / sd;
            }
            kst(out, odt, nhwc ? i * cs + c : (b * 3 + c) * hw + q, v);
        }
        for (int c = 3; c < cs; c++) kst(out, odt, i * cs + c, 0.0f);   /* the stem's padding */
    }
}

int act_k_preprocess(const unsigned char *frames, int B, int hi, int wi, int rh, int rw, int top,
                     int left, int ho, int wo, int imagenet, int nhwc, int cs, void *out, int odt,
                     const act_k_norm_side *side, int nside, cudaStream_t st, char *err,
                     size_t errlen) {
    if (nhwc ? cs != 3 && cs != 4 && cs != 8 : cs != 3) {
        snprintf(err, errlen, "preprocess: %d image channels in %s (3%s)", cs,
                 nhwc ? "NHWC" : "NCHW", nhwc ? ", 4 or 8" : " only");
        return -1;
    }
    if (nside < 0 || nside > ACT_K_NORM_SIDES) {
        snprintf(err, errlen, "preprocess: %d side normalizations (at most %d)", nside,
                 ACT_K_NORM_SIDES);
        return -1;
    }
    norm_sides ns;
    memset(&ns, 0, sizeof ns);
    size_t n = (size_t)B * ho * wo;   /* a thread per output pixel, then per side element */
    for (int k = 0, used = 0; k < nside; k++)
        if (side[k].rows > 0 && side[k].dim > 0) {   /* empty jobs are left out */
            ns.j[used++] = side[k];
            n += (size_t)side[k].rows * side[k].dim;
        }
    if (n == 0) return 0;
    preprocess_kernel<<<act_grid(n), 256, 0, st>>>(
        frames, B, hi, wi, rh, rw, top, left, ho, wo, imagenet, nhwc, cs, out, odt, ns, n);
    KLAUNCH(preprocess_kernel);
    return 0;
}

/* word q (0..3) of a, b, c, d by selects: an array indexed by q would live in local memory */
static __device__ __forceinline__ unsigned pick4(unsigned q, unsigned a, unsigned b, unsigned c,
                                                 unsigned d) {
    return q == 0 ? a : q == 1 ? b : q == 2 ? c : d;
}

/* Bytes sh..sh+15 of the 32 bytes a:b (little endian), sh in 0..15. */
static __device__ __forceinline__ uint4 shifted16(uint4 a, uint4 b, unsigned sh) {
    unsigned q = sh >> 2, r = (sh & 3) * 8;
    unsigned w0 = pick4(q, a.x, a.y, a.z, a.w), w1 = pick4(q, a.y, a.z, a.w, b.x);
    unsigned w2 = pick4(q, a.z, a.w, b.x, b.y), w3 = pick4(q, a.w, b.x, b.y, b.z);
    unsigned w4 = pick4(q, b.x, b.y, b.z, b.w);
    uint4 o;
    o.x = __funnelshift_r(w0, w1, r);
    o.y = __funnelshift_r(w1, w2, r);
    o.z = __funnelshift_r(w2, w3, r);
    o.w = __funnelshift_r(w3, w4, r);
    return o;
}

/* One block column per item (blockIdx.x), the y blocks stride over its bytes. A host read
 * crosses PCIe with microseconds of latency, so many 16-byte loads must be in flight: up to 64
 * blocks per item keep the link busy at batch 1 as at batch 256. Every read is a 16-byte word:
 * a frame that does not start on 16 bytes (raw TCP frames sit after a header of any length) is
 * read as the aligned words around it and shifted into place. Those words reach at most 15
 * bytes past the frame's end, inside the same 16 bytes and so the same locked page. */
static __global__ void gather_kernel(unsigned char *__restrict__ dst, const unsigned long long *__restrict__ ptrs,
                                     size_t item_bytes) {
    uintptr_t src = (uintptr_t)ptrs[blockIdx.x];
    unsigned char *out = dst + (size_t)blockIdx.x * item_bytes;
    size_t stride = (size_t)gridDim.y * blockDim.x, t = (size_t)blockIdx.y * blockDim.x + threadIdx.x;
    if ((((uintptr_t)out | item_bytes) & 15) == 0) {
        unsigned sh = (unsigned)(src & 15);
        const uint4 *s4 = (const uint4 *)(src - sh);
        uint4 *o4 = (uint4 *)out;
        if (sh == 0) {
            for (size_t i = t; i < item_bytes / 16; i += stride) o4[i] = s4[i];
        } else {
            for (size_t i = t; i < item_bytes / 16; i += stride) o4[i] = shifted16(s4[i], s4[i + 1], sh);
        }
    } else {
        const unsigned char *s = (const unsigned char *)src;
        for (size_t i = t; i < item_bytes; i += stride) out[i] = s[i];
    }
}

int act_k_gather(unsigned char *dst, const unsigned long long *ptrs, int items, size_t item_bytes,
                 cudaStream_t st, char *err, size_t errlen) {
    if (items <= 0 || item_bytes == 0) return 0;
    size_t per = CEIL_DIV(item_bytes / 16 ? item_bytes / 16 : item_bytes, (size_t)256);
    dim3 grid((unsigned)items, (unsigned)(per < 64 ? per : 64));
    gather_kernel<<<grid, 256, 0, st>>>(dst, ptrs, item_bytes);
    KLAUNCH(gather_kernel);
    return 0;
}
