/* conv.cu - cuDNN convolution plans. A plan starts with the algorithm cuDNN's heuristics
 * (cudnnGetConvolutionForwardAlgorithm_v7) put first, which runs nothing on the GPU, so a plan
 * can be made at the first call of a shape even while a CUDA graph is being captured; outside a
 * capture the backend may then have conv_find.cu measure the candidates and take the fastest.
 * fp32 is the parity mode: FMA math only (cuDNN's default math allows TF32 on Ampere and
 * later) and only the GEMM-family algorithms, whose rounding is that of a plain dot product.
 * tf32 keeps to the GEMM family too: a Winograd or FFT transform multiplies the operands'
 * rounding error (TF32's 2^-11, not fp32's 2^-24) by its transform's growth, which the 2e-3
 * tf32 parity budget (1.0e-3 used by the plain products) cannot absorb.
 * bf16/fp16 take tensor-op math, but keep to the GEMM family too (no FFT or Winograd) unless
 * ACT_CUDA_CONV_TRANSFORMS16=1: cuDNN may rank them first for 16-bit 3x3 convs, and their
 * transforms in half precision have never been held to the 2e-2 parity budget on a GPU (the
 * NHWC tensor-core GEMM kernels are what the parity runs measured).
 * Bias, residual and ReLU go into the convolution itself where cuDNN's fused call
 * (cudnnConvolutionBiasActivationForward) takes them: one graph node instead of two. Whether it
 * does for a plan (data type, algorithm) is learnt at the plan's first use, which is in the
 * eager first step of a batch size, never inside a capture. */
#include "conv_plan.cuh"
#include <stdlib.h>
#include <string.h>

static cudnnDataType_t dnn_type(int dt) {
    return dt == KDT_BF16 ? CUDNN_DATA_BFLOAT16 : dt == KDT_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

static int gemm_family(cudnnConvolutionFwdAlgo_t a) {
    return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}

int act_k_conv_transforms16(void) {   /* ACT_CUDA_CONV_TRANSFORMS16, read once */
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("ACT_CUDA_CONV_TRANSFORMS16");
        v = e && *e && strcmp(e, "0") != 0;
    }
    return v;
}

int act_k_conv_usable(const cudnnConvolutionFwdAlgoPerf_t *c, int prec, size_t ws_limit) {
    if (c->status != CUDNN_STATUS_SUCCESS || c->memory > ws_limit) return 0;
    if (prec >= 2) return act_k_conv_transforms16() || gemm_family(c->algo);
    int tensor_op = c->mathType == CUDNN_TENSOR_OP_MATH ||
                    c->mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    /* tf32 takes tensor ops, but not ALLOW_CONVERSION: that lets cuDNN compute fp32 in fp16 */
    return gemm_family(c->algo) &&
           (prec == 1 ? c->mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION : !tensor_op);
}

int act_k_conv_pick(cudnnHandle_t h, act_conv_plan *p, const cudnnConvolutionFwdAlgoPerf_t *perf,
                    int got, char *err, size_t errlen) {
    for (int i = 0; i < got; i++) {
        if (!act_k_conv_usable(&perf[i], p->key.prec, p->ws_limit)) continue;
        if (p->key.prec != 0) KCUDNN(cudnnSetConvolutionMathType(p->cd, perf[i].mathType));
        size_t ws = 0;
        if (cudnnGetConvolutionForwardWorkspaceSize(h, p->xd, p->wd, p->cd, p->yd, perf[i].algo,
                                                    &ws) != CUDNN_STATUS_SUCCESS ||
            ws > p->ws_limit)
            continue;
        p->algo = perf[i].algo;
        p->math = p->key.prec != 0 ? perf[i].mathType : p->math;
        p->ws = ws;
        return 0;
    }
    return 1;
}

/* The descriptors of the fused call (bias: one value per output channel, in the data type);
 * where one cannot be made the plan simply never fuses. */
static void fused_fill(act_conv_plan *p, cudnnDataType_t t, int cout) {
    p->fused = -1;
    if (cudnnCreateTensorDescriptor(&p->bd) != CUDNN_STATUS_SUCCESS ||
        cudnnSetTensor4dDescriptor(p->bd, CUDNN_TENSOR_NCHW, t, 1, cout, 1, 1) != CUDNN_STATUS_SUCCESS ||
        cudnnCreateActivationDescriptor(&p->relu) != CUDNN_STATUS_SUCCESS ||
        cudnnSetActivationDescriptor(p->relu, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0) !=
            CUDNN_STATUS_SUCCESS ||
        cudnnCreateActivationDescriptor(&p->ident) != CUDNN_STATUS_SUCCESS ||
        cudnnSetActivationDescriptor(p->ident, CUDNN_ACTIVATION_IDENTITY, CUDNN_PROPAGATE_NAN,
                                     0.0) != CUDNN_STATUS_SUCCESS)
        return;
    p->fused = 0;
}

static int plan_fill(cudnnHandle_t h, act_conv_plan *p, int dt, int prec, int nhwc, int N,
                     int cin, int H, int W, int cout, int k, int stride, int pad, size_t ws_limit,
                     char *err, size_t errlen) {
    cudnnDataType_t t = dnn_type(dt);
    cudnnTensorFormat_t f = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    int dev = 0;
    KCHECK(cudaGetDevice(&dev));
    act_conv_key key = {dev, dt, prec, nhwc, N, cin, H, W, cout, k, stride, pad};
    p->key = key;
    KCUDNN(cudnnCreateTensorDescriptor(&p->xd));
    KCUDNN(cudnnCreateTensorDescriptor(&p->yd));
    KCUDNN(cudnnCreateFilterDescriptor(&p->wd));
    KCUDNN(cudnnCreateConvolutionDescriptor(&p->cd));
    KCUDNN(cudnnSetTensor4dDescriptor(p->xd, f, t, N, cin, H, W));
    KCUDNN(cudnnSetFilter4dDescriptor(p->wd, t, f, cout, cin, k, k));
    KCUDNN(cudnnSetConvolution2dDescriptor(p->cd, pad, pad, stride, stride, 1, 1,
                                           CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    cudnnMathType_t math = act_k_conv_math(prec);
    KCUDNN(cudnnSetConvolutionMathType(p->cd, math));
    int n, c;
    KCUDNN(cudnnGetConvolution2dForwardOutputDim(p->cd, p->xd, p->wd, &n, &c, &p->Ho, &p->Wo));
    KCUDNN(cudnnSetTensor4dDescriptor(p->yd, f, t, N, cout, p->Ho, p->Wo));
    p->math = math;
    p->ws_limit = ws_limit;
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0;
    KCUDNN(cudnnGetConvolutionForwardAlgorithm_v7(h, p->xd, p->wd, p->cd, p->yd,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf));
    int r = act_k_conv_pick(h, p, perf, got, err, errlen);
    if (r < 0) return -1;
    if (r == 0) {
        /* a measurement (conv_find.cu) may choose among the same candidates: the workspace it
         * gets is the most any of them needs */
        p->find_ws = p->ws;
        for (int i = 0; i < got; i++)
            if (act_k_conv_usable(&perf[i], prec, ws_limit) && perf[i].memory > p->find_ws)
                p->find_ws = perf[i].memory;
        fused_fill(p, t, cout);
        return 0;
    }
    snprintf(err, errlen, "conv: cuDNN offers no usable algorithm for N=%d cin=%d %dx%d -> cout=%d "
             "k=%d stride=%d (dtype %d, precision %d, %s, workspace limit %zu bytes)",
             N, cin, H, W, cout, k, stride, dt, prec, nhwc ? "NHWC" : "NCHW", ws_limit);
    return -1;
}

int act_k_conv_plan(cudnnHandle_t h, int dt, int prec, int nhwc, int N, int cin, int H, int W,
                    int cout, int k, int stride, int pad, size_t ws_limit, act_conv_plan **out,
                    char *err, size_t errlen) {
    act_conv_plan *p = (act_conv_plan *)calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, errlen, "conv: out of host memory for a plan");
        return -1;
    }
    if (plan_fill(h, p, dt, prec, nhwc, N, cin, H, W, cout, k, stride, pad, ws_limit, err,
                  errlen)) {
        act_k_conv_plan_free(p);
        return -1;
    }
    *out = p;
    return 0;
}

/* A CUDA fault met inside cuDNN (the EXECUTION_FAILED family: 5000-5999 from cuDNN 9, one code
 * before it), which no fallback can mend, as against a refusal to run a plan. */
static int cudnn_fault(cudnnStatus_t s) {
#if defined(CUDNN_MAJOR) && CUDNN_MAJOR >= 9
    return (int)s / 1000 == (int)CUDNN_STATUS_EXECUTION_FAILED / 1000;
#else
    return s == CUDNN_STATUS_EXECUTION_FAILED;
#endif
}

int act_k_conv_run(cudnnHandle_t h, const act_conv_plan *p, const void *x, const void *w,
                   float beta, void *y, void *ws, size_t ws_size, char *err, size_t errlen) {
    const float alpha = 1.0f;
    cudnnStatus_t s = cudnnConvolutionForward(h, &alpha, p->xd, x, p->wd, w, p->cd, p->algo, ws,
                                              ws_size, &beta, p->yd, y);
    if (s == CUDNN_STATUS_SUCCESS) return 0;
    act_kerr(err, errlen, __FILE__, __LINE__, "cudnnConvolutionForward", cudnnGetErrorString(s));
    return cudnn_fault(s) ? -2 : -1;
}

int act_k_conv_run_fused(cudnnHandle_t h, act_conv_plan *p, const void *x, const void *w,
                         const void *bias, const void *res, int epi, void *y, void *ws,
                         size_t ws_size, char *err, size_t errlen) {
    /* cuDNN's fused activations are ReLU and identity, identity only with this algorithm; an
     * in-place residual (res == y) keeps the accumulate path of act_k_conv_run */
    if (p->fused < 0 || !bias || (epi != 0 && epi != 1) || (res && res == y) ||
        (epi == 0 && p->algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM))
        return 1;
    const float alpha1 = 1.0f, alpha2 = res ? 1.0f : 0.0f;
    /* without a residual z is y with alpha2 = 0: the call has no "no z" form */
    cudnnStatus_t s = cudnnConvolutionBiasActivationForward(
        h, &alpha1, p->xd, x, p->wd, w, p->cd, p->algo, ws, ws_size, &alpha2, p->yd,
        res ? res : y, p->bd, bias, epi == 1 ? p->relu : p->ident, p->yd, y);
    if (s == CUDNN_STATUS_SUCCESS) {
        p->fused = 1;
        return 0;
    }
    if (cudnn_fault(s)) {
        act_kerr(err, errlen, __FILE__, __LINE__, "cudnnConvolutionBiasActivationForward",
                 cudnnGetErrorString(s));
        return -2;
    }
    if (p->fused == 0) {            /* refused at its first use: this plan runs unfused */
        p->fused = -1;
        return 1;
    }
    return act_kerr(err, errlen, __FILE__, __LINE__, "cudnnConvolutionBiasActivationForward",
                    cudnnGetErrorString(s));
}

void act_k_conv_out_dims(const act_conv_plan *p, int *Ho, int *Wo) {
    *Ho = p->Ho;
    *Wo = p->Wo;
}

size_t act_k_conv_ws(const act_conv_plan *p) { return p->ws; }

static __global__ void conv_direct_kernel(const void *x, const void *w, int dt, int nhwc, int N,
                                          int cin, int H, int W, int cout, int k, int s, int pad,
                                          int Ho, int Wo, const float *bias, const void *res,
                                          int rdt, int epi, void *y) {
    size_t n = (size_t)N * cout * Ho * Wo;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int ox, oy, co;
        size_t img;
        if (nhwc) {
            co = (int)(i % cout);
            ox = (int)((i / cout) % Wo);
            oy = (int)((i / ((size_t)cout * Wo)) % Ho);
            img = i / ((size_t)cout * Wo * Ho);
        } else {
            ox = (int)(i % Wo);
            oy = (int)((i / Wo) % Ho);
            co = (int)((i / ((size_t)Wo * Ho)) % cout);
            img = i / ((size_t)Wo * Ho * cout);
        }
        float acc = 0.0f;
        for (int ci = 0; ci < cin; ci++)
            for (int ky = 0; ky < k; ky++) {
                int iy = oy * s - pad + ky;
                if (iy < 0 || iy >= H) continue;
                for (int kx = 0; kx < k; kx++) {
                    int ix = ox * s - pad + kx;
                    if (ix < 0 || ix >= W) continue;
                    size_t xi = nhwc ? ((img * H + iy) * W + ix) * cin + ci
                                     : ((img * cin + ci) * H + iy) * W + ix;
                    size_t wi = nhwc ? (((size_t)co * k + ky) * k + kx) * cin + ci
                                     : (((size_t)co * cin + ci) * k + ky) * k + kx;
                    acc += kld(x, dt, xi) * kld(w, dt, wi);
                }
            }
        if (bias) acc += bias[co];
        if (res) acc += kld(res, rdt, i);
        if (epi == 1) acc = fmaxf(acc, 0.0f);
        else if (epi == 2) acc = act_gelu(acc);
        kst(y, dt, i, acc);
    }
}

int act_k_conv_direct(const void *x, const void *w, int dt, int nhwc, int N, int cin, int H, int W,
                      int cout, int k, int stride, int pad, const float *bias, const void *res,
                      int rdt, int epi, void *y, cudaStream_t st, char *err, size_t errlen) {
    int Ho = (H + 2 * pad - k) / stride + 1, Wo = (W + 2 * pad - k) / stride + 1;
    size_t n = (size_t)N * cout * Ho * Wo;
    if (n == 0) return 0;
    conv_direct_kernel<<<act_grid(n), 256, 0, st>>>(
        x, w, dt, nhwc, N, cin, H, W, cout, k, stride, pad, Ho, Wo, bias, res, rdt, epi, y);
    KLAUNCH(conv_direct_kernel);
    return 0;
}

static __global__ void weight_nhwc_kernel(const float *w, void *dst, int ddt, int K, int C, int Cs,
                                          int kk) {
    size_t n = (size_t)K * Cs * kk;                    /* kk = k * k taps; Cs >= C stored */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % Cs), tap = (int)((i / Cs) % kk);
        size_t ko = i / ((size_t)Cs * kk);
        kst(dst, ddt, i, c < C ? w[(ko * C + c) * kk + tap] : 0.0f);
    }
}

int act_k_conv_weight_nhwc(const float *w, void *dst, int ddt, int K, int C, int Cs, int k,
                           cudaStream_t st, char *err, size_t errlen) {
    if (Cs < C) {
        snprintf(err, errlen, "conv filter to KRSC: %d stored channels for %d", Cs, C);
        return -1;
    }
    size_t n = (size_t)K * Cs * k * k;
    if (n == 0) return 0;
    weight_nhwc_kernel<<<act_grid(n), 256, 0, st>>>(w, dst, ddt, K, C, Cs, k * k);
    KLAUNCH(weight_nhwc_kernel);
    return 0;
}

void act_k_conv_plan_free(act_conv_plan *p) {
    if (!p) return;
    if (p->xd) cudnnDestroyTensorDescriptor(p->xd);
    if (p->yd) cudnnDestroyTensorDescriptor(p->yd);
    if (p->wd) cudnnDestroyFilterDescriptor(p->wd);
    if (p->cd) cudnnDestroyConvolutionDescriptor(p->cd);
    if (p->bd) cudnnDestroyTensorDescriptor(p->bd);
    if (p->relu) cudnnDestroyActivationDescriptor(p->relu);
    if (p->ident) cudnnDestroyActivationDescriptor(p->ident);
    free(p);
}
