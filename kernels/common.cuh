/* common.cuh - what every kernel file shares: dtype-generic loads/stores, grid sizing, and the
 * checked-call macros that turn a CUDA error into a "file:line: call: message" string.
 * defines: KDT_*, kld, kst, k_pack16, pk_get, pk_set, act_norm_value, CEIL_DIV, act_grid,
 *          act_kerr, KCHECK, KLAUNCH
 *
 * Kernels take their buffers as void * plus a dtype code (the values of act_dtype: 0 F32,
 * 1 BF16, 2 F16) and convert on load/store, so one kernel serves every precision and any mix of
 * F32 and activation buffers that the forward pass hands an op. Arithmetic is always fp32.
 * Launchers are extern "C", take a stream and an error buffer, and return 0 or -1: they never
 * exit and never synchronize (launch errors only; execution errors surface at be->sync). */
#ifndef ACT_KERNELS_COMMON_CUH
#define ACT_KERNELS_COMMON_CUH

#include <stddef.h>
#include <stdio.h>
#include <cuda_runtime.h>

enum { KDT_F32 = 0, KDT_BF16 = 1, KDT_F16 = 2 };

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

/* blocks of 256 threads for a grid-stride loop over n elements: one element per thread up to
 * 65535 * 8 blocks, the loop covers the rest */
static inline int act_grid(size_t n) {
    size_t g = CEIL_DIV(n, (size_t)256);
    return (int)(g < 65535 * 8 ? (g ? g : 1) : 65535 * 8);
}

static inline int act_kerr(char *err, size_t errlen, const char *file, int line,
                           const char *call, const char *msg) {
    if (err && errlen) snprintf(err, errlen, "%s:%d: %s: %s", file, line, call, msg);
    return -1;
}

/* a checked CUDA runtime call inside a function that has char *err, size_t errlen */
#define KCHECK(call) do { cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) return act_kerr(err, errlen, __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
} while (0)
/* after a <<<>>> launch: configuration errors are reported here, not at the next sync */
#define KLAUNCH(name) KCHECK(cudaGetLastError()); (void)0

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

static __device__ __forceinline__ float kld(const void *p, int dt, size_t i) {
    if (dt == KDT_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == KDT_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}
static __device__ __forceinline__ void kst(void *p, int dt, size_t i, float v) {
    if (dt == KDT_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (dt == KDT_F16) ((__half *)p)[i] = __float2half_rn(v);
    else ((float *)p)[i] = v;
}
/* 16 bytes of a tensor as one load or store: 4 fp32 or 8 bf16/fp16 values (their bits), read
 * and written through pk_get/pk_set with indices known at compile time, so the pack stays in
 * registers (a union: the one type pun C++ compilers define; a cast pointer would not be) */
union k_pack16 { uint4 u; float f[4]; unsigned short s[8]; };
template <int DT> static __device__ __forceinline__ float pk_get(const k_pack16 &p, int k) {
    if (DT == KDT_F32) return p.f[k];
    if (DT == KDT_BF16) return __uint_as_float((unsigned)p.s[k] << 16);
    return __half2float(__ushort_as_half(p.s[k]));
}
template <int DT> static __device__ __forceinline__ void pk_set(k_pack16 &p, int k, float v) {
    if (DT == KDT_F32) p.f[k] = v;
    else if (DT == KDT_BF16) p.s[k] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    else p.s[k] = __half_as_ushort(__float2half_rn(v));
}
static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result */
static __device__ __forceinline__ float block_sum(float v, float *shared32) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();                     /* shared32 may still be read by a previous call */
    if (lane == 0) shared32[wid] = v;
    __syncthreads();
    v = lane < nw ? shared32[lane] : 0.0f;
    return warp_sum(v);
}
/* (de)normalization of value v of dimension d (the normalize op's formula; type 0 min_max with
 * lo/hi = min/max, 1 mean_std with lo/hi = mean/std) */
static __device__ __forceinline__ float act_norm_value(float v, float lo, float hi, int type,
                                                       float eps, int inverse) {
    if (type == 0) {
        float range = fmaxf(hi - lo, eps);
        return inverse ? (v + 1.0f) / 2.0f * range + lo : 2.0f * (v - lo) / range - 1.0f;
    }
    float sd = fmaxf(hi, eps);
    return inverse ? v * sd + lo : (v - lo) / sd;
}
static __device__ __forceinline__ float act_gelu(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}
#endif

#endif
