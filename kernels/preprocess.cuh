/* preprocess.cuh - uint8 HWC camera frames -> the backbone's input image on the device.
 * defines: act_k_preprocess, act_k_gather */
#ifndef ACT_KERNELS_PREPROCESS_CUH
#define ACT_KERNELS_PREPROCESS_CUH
#include "common.cuh"
#ifdef __cplusplus
extern "C" {
#endif

/* a normalization done by the same launch: y[r][d] = act_norm_value(x[r][d], lo[d], hi[d],
 * type, eps, 0) for r < rows, d < dim (x dtype xdt, y ydt) */
typedef struct {
    const void *x;
    void *y;
    const float *lo, *hi;
    int xdt, ydt, rows, dim, type;
    float eps;
} act_k_norm_side;
#define ACT_K_NORM_SIDES 2

/* frames u8 [B][hi][wi][3] -> /255 -> bilinear resize to rh x rw (half-pixel centers, no
 * antialias) -> window [top, top+ho) x [left, left+wo) of the resized image (the center crop;
 * top = left = 0 and ho, wo = rh, rw without crop) -> optional ImageNet mean/std ->
 * out [B][3][ho][wo] (NCHW; nhwc: [B][ho][wo][cs], cs 3, 4 or 8, the channels past 3 zero:
 * the stem's input padded, ACT_CUDA_STEM_CHANNELS), dtype odt; and the nside (at most
 * ACT_K_NORM_SIDES) normalizations of side, by the same grid (the step's qpos and actions: a
 * launch fewer each). */
int act_k_preprocess(const unsigned char *frames, int B, int hi, int wi, int rh, int rw, int top,
                     int left, int ho, int wo, int imagenet, int nhwc, int cs, void *out, int odt,
                     const act_k_norm_side *side, int nside, cudaStream_t st, char *err,
                     size_t errlen);

/* dst[i * item_bytes + j] = ptrs[i][j] for i < items, j < item_bytes: frames read where they lie
 * (page-locked mapped host memory, over PCIe) into one dense device buffer. ptrs: `items`
 * device addresses in device memory. 16-byte loads where an item's address and size allow. */
int act_k_gather(unsigned char *dst, const unsigned long long *ptrs, int items, size_t item_bytes,
                 cudaStream_t st, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
