/* elementwise.cu - grid-stride elementwise kernels, one thread per element.
 * These sit between cuBLAS/cuDNN calls (bias + residual + activation epilogues) and at the ends
 * of the step (normalization). They are memory-bound and tiny at batch 1; what matters is that
 * each one is a single launch over the whole tensor. */
#include <stdint.h>
#include "elementwise.cuh"

static __global__ void bias_res_act_kernel(void *y, int ydt, const float *bias, const void *res,
                                           int rdt, size_t n, int C, size_t inner, int epi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = kld(y, ydt, i);
        if (bias) v += bias[(i / inner) % (size_t)C];
        if (res) v += kld(res, rdt, i);
        if (epi == 1) v = fmaxf(v, 0.0f);
        else if (epi == 2) v = act_gelu(v);
        kst(y, ydt, i, v);
    }
}

/* The common case, channels innermost (NHWC convs, linears): each thread takes 16 bytes of y
 * (8 bf16/fp16 or 4 fp32 values of consecutive channels, which share one channel index) and of
 * the residual, so a 16-byte load per operand and one 32-bit division per pack instead of two
 * 64-bit ones per element. P values a pack, DT their dtype (compile-time: the packs stay in
 * registers). */
template <int DT, int P>
static __device__ __forceinline__ void bra_pack(void *y, const float *bias, const void *res,
                                                unsigned p, unsigned cpk, int epi) {
    k_pack16 yp, rp;
    yp.u = ((const uint4 *)y)[p];
    rp.u = res ? ((const uint4 *)res)[p] : make_uint4(0, 0, 0, 0);
    unsigned c = (p % cpk) * P;
#pragma unroll
    for (int k = 0; k < P; k++) {
        float v = pk_get<DT>(yp, k);
        if (bias) v += bias[c + k];
        if (res) v += pk_get<DT>(rp, k);
        if (epi == 1) v = fmaxf(v, 0.0f);
        else if (epi == 2) v = act_gelu(v);
        pk_set<DT>(yp, k, v);
    }
    ((uint4 *)y)[p] = yp.u;
}

static __global__ void bias_res_act_vec_kernel(void *y, int ydt, const float *bias,
                                               const void *res, unsigned npk, unsigned cpk,
                                               int epi) {
    for (unsigned p = blockIdx.x * blockDim.x + threadIdx.x; p < npk; p += gridDim.x * blockDim.x) {
        if (ydt == KDT_BF16) bra_pack<KDT_BF16, 8>(y, bias, res, p, cpk, epi);
        else if (ydt == KDT_F16) bra_pack<KDT_F16, 8>(y, bias, res, p, cpk, epi);
        else bra_pack<KDT_F32, 4>(y, bias, res, p, cpk, epi);
    }
}

int act_k_bias_res_act(void *y, int ydt, const float *bias, const void *res, int rdt,
                       size_t outer, int C, size_t inner, int epi, cudaStream_t st,
                       char *err, size_t errlen) {
    size_t n = outer * (size_t)C * inner;
    if (n == 0 || (!bias && !res && epi == 0)) return 0;
    int per = ydt == KDT_F32 ? 4 : 8;   /* values in 16 bytes; packs below 2^31 (32-bit stride) */
    if (inner == 1 && C % per == 0 && n / per <= 0x7fffffffu && (!res || rdt == ydt) &&
        ((uintptr_t)y & 15) == 0 && ((uintptr_t)res & 15) == 0 && ydt <= KDT_F16) {
        size_t npk = n / per;
        bias_res_act_vec_kernel<<<act_grid(npk), 256, 0, st>>>(y, ydt, bias, res, (unsigned)npk,
                                                               (unsigned)(C / per), epi);
        KLAUNCH(bias_res_act_vec_kernel);
        return 0;
    }
    bias_res_act_kernel<<<act_grid(n), 256, 0, st>>>(y, ydt, bias, res, rdt, n, C, inner, epi);
    KLAUNCH(bias_res_act_kernel);
    return 0;
}

static __global__ void normalize_kernel(const void *x, int xdt, void *y, int ydt, int rows,
                                        int dim, const float *lo, const float *hi, int type,
                                        float eps, int inverse) {
    int n = rows * dim;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int d = i % dim;
        kst(y, ydt, i, act_norm_value(kld(x, xdt, i), lo[d], hi[d], type, eps, inverse));
    }
}

int act_k_normalize(const void *x, int xdt, void *y, int ydt, int rows, int dim, const float *lo,
                    const float *hi, int type, float eps, int inverse, cudaStream_t st,
                    char *err, size_t errlen) {
    size_t n = (size_t)rows * dim;
    if (n == 0) return 0;
    normalize_kernel<<<act_grid(n), 256, 0, st>>>(x, xdt, y, ydt, rows, dim, lo, hi, type, eps,
                                                  inverse);
    KLAUNCH(normalize_kernel);
    return 0;
}

static __global__ void convert_kernel(void *dst, int ddt, const void *src, int sdt, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        kst(dst, ddt, i, kld(src, sdt, i));
}

int act_k_convert(void *dst, int ddt, const void *src, int sdt, size_t n, cudaStream_t st,
                  char *err, size_t errlen) {
    if (n == 0 || (dst == src && ddt == sdt)) return 0;
    if (((ddt > KDT_F16 || sdt > KDT_F16) && ddt != sdt) || dst == src) {
        snprintf(err, errlen, "copy: cannot convert dtype %d to %d%s", sdt, ddt,
                 dst == src ? " in place" : "");
        return -1;
    }
    if (ddt == sdt) {
        size_t es = ddt == KDT_F32 ? 4 : ddt == KDT_BF16 || ddt == KDT_F16 ? 2 : 1;   /* 3: u8 */
        KCHECK(cudaMemcpyAsync(dst, src, n * es, cudaMemcpyDeviceToDevice, st));
        return 0;
    }
    convert_kernel<<<act_grid(n), 256, 0, st>>>(dst, ddt, src, sdt, n);
    KLAUNCH(convert_kernel);
    return 0;
}

static __global__ void gather_rows_kernel(void *dst, int ddt, const void *src, int sdt,
                                          size_t total, size_t n, size_t stride) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        kst(dst, ddt, i, kld(src, sdt, (i / n) * stride + i % n));
}

int act_k_gather_rows(void *dst, int ddt, const void *src, int sdt, int rows, size_t n,
                      size_t stride, cudaStream_t st, char *err, size_t errlen) {
    size_t total = (size_t)rows * n;
    if (total == 0) return 0;
    if (ddt > KDT_F16 || sdt > KDT_F16 || (stride && stride < n)) {
        snprintf(err, errlen, "gather_rows: dtypes %d -> %d, row stride %zu is neither 0 (broadcast) nor >= the row length %zu",
                 sdt, ddt, stride, n);
        return -1;
    }
    gather_rows_kernel<<<act_grid(total), 256, 0, st>>>(dst, ddt, src, sdt, total, n, stride);
    KLAUNCH(gather_rows_kernel);
    return 0;
}

static __global__ void broadcast_kernel(const float *t, size_t n, size_t total, void *out,
                                        int odt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        kst(out, odt, i, t[i % n]);
}

int act_k_broadcast_rows(const float *t, int B, size_t n, void *out, int odt, cudaStream_t st,
                         char *err, size_t errlen) {
    size_t total = (size_t)B * n;
    if (total == 0) return 0;
    broadcast_kernel<<<act_grid(total), 256, 0, st>>>(t, n, total, out, odt);
    KLAUNCH(broadcast_kernel);
    return 0;
}
