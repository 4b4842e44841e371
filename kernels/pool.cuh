/* pool.cuh - the two pooling steps of the vision trunk: the stem's 3x3/2 max pool and the
 * SpatialSoftmax keypoint readout. defines: act_k_maxpool, act_k_spatial_softmax */
#ifndef ACT_KERNELS_POOL_CUH
#define ACT_KERNELS_POOL_CUH
#include "common.cuh"
#ifdef __cplusplus
extern "C" {
#endif

/* 3x3 stride 2 pad 1 (padding = -inf): x [N][C][H][W] -> y [N][C][(H-1)/2+1][(W-1)/2+1]
 * (nhwc: x [N][H][W][C] -> y [N][Ho][Wo][C]) */
int act_k_maxpool(const void *x, int xdt, int N, int C, int H, int W, int nhwc, void *y, int ydt,
                  cudaStream_t st, char *err, size_t errlen);
/* x [N][K][HW] (nhwc: [N][HW][K]): softmax over HW, then expected (x, y) under pos [HW][2]
 * (F32) -> y [N][2K] interleaved */
int act_k_spatial_softmax(const void *x, int xdt, int N, int K, int HW, int nhwc, const float *pos,
                          void *y, int ydt, cudaStream_t st, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
