/* emu_dnn.cc (CUDA emulator) - cuDNN's legacy forward convolution on the host.
 *
 * Descriptors are plain records. Everything a convolution call needs is checked at the call,
 * as the real library does before it launches: inconsistent shapes give BAD_PARAM,
 * configurations cuDNN (or this emulator) has no kernel for give NOT_SUPPORTED, an operand
 * outside device memory is a fault. The work is queued on the handle's stream with emu_enqueue
 * (ACT_EMU_TRACE=2 names each node "<call> algo <n> math <m>": the algorithm it was asked to
 * run and the convolution descriptor's cudnnMathType_t, 1 for CUDNN_TENSOR_OP_MATH)
 * and captures the descriptors by value, so a graph replays exactly what was recorded; the
 * operands and the workspace are re-checked at every run, so a replay after one was freed
 * faults.
 *
 * Find (cudnnFindConvolutionForwardAlgorithmEx) ranks the same list, since nothing can be timed
 * here; it keeps the real call's effects on its caller (below).
 * The heuristics imitate cuDNN's shape: several entries, a non-GEMM algorithm first for FLOAT
 * data (conv.cu's fp32 mode must skip it), tensor-op entries for HALF/BFLOAT16, each with the
 * workspace it needs; the workspace query returns the same number and a convolution given
 * less refuses with BAD_PARAM. Every algorithm computes the same thing here: im2col per image,
 * then one OpenBLAS sgemm [K x CRS] x [CRS x HoWo]. Numerics follow the math type: FLOAT data
 * with FMA_MATH is plain fp32; with the other math types x and w are first rounded to TF32, as
 * Ampere and later cuDNN do; HALF/BFLOAT16 products are exact in fp32 and accumulate in fp32,
 * the output rounded to nearest even.
 *
 * Layouts: each tensor and filter descriptor keeps its own format, NCHW or NHWC (a filter in
 * NHWC is KRSC), and a convolution honours each operand's independently (real cuDNN restricts
 * the combinations per algorithm; the emulator accepts them all). The math does not depend on
 * it: an NHWC x is gathered per image into an fp32 NCHW scratch, KRSC weights are widened into
 * KCRS, and y and z are read and written through out_index. fp32 NCHW keeps its in-place path. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "cudnn.h"
#include "emu_internal.h"

struct emu_dnn_handle { cudaStream_t stream; };
struct emu_dnn_tensor { int set; cudnnDataType_t t; int n, c, h, w; cudnnTensorFormat_t f; };
struct emu_dnn_filter { int set; cudnnDataType_t t; int k, c, h, w; cudnnTensorFormat_t f; };
struct emu_dnn_conv { int set; int ph, pw, sh, sw, dh, dw; cudnnMathType_t math; };
struct emu_dnn_act { int set; cudnnActivationMode_t mode; cudnnNanPropagation_t nan; };

/* one convolution's geometry, checked */
struct conv_shape {
    cudnnDataType_t t;
    int N, C, H, W, K, R, S, Ho, Wo;
    int ph, pw, sh, sw, dh, dw;
};

static int emulated_type(cudnnDataType_t t) {
    return t == CUDNN_DATA_FLOAT || t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16;
}
static int known_type(cudnnDataType_t t) {
    return emulated_type(t) || t == CUDNN_DATA_DOUBLE || t == CUDNN_DATA_INT8 ||
           t == CUDNN_DATA_INT32;
}
static cudaDataType_t cuda_type(cudnnDataType_t t) {
    return t == CUDNN_DATA_HALF ? CUDA_R_16F : t == CUDNN_DATA_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F;
}
static size_t type_size(cudnnDataType_t t) { return t == CUDNN_DATA_FLOAT ? 4 : 2; }

/* the environment switches, read at each call so tests can flip them: ACT_EMU_CUDNN=none makes
 * cuDNN offer nothing; =refuse-run offers its algorithms but refuses to run any of them
 * (NOT_SUPPORTED at the call, nothing queued), as a real cuDNN may for a heuristic's pick;
 * =refuse-capture refuses them (the same way) only on a stream that is capturing, as a library
 * call that cannot be captured does, the capture left valid;
 * =fail-run answers every run with EXECUTION_FAILED (nothing queued), as a CUDA fault met
 * inside cuDNN does;
 * =find-reverse and =find-fail change what Find answers (at the Find call below);
 * =convert-first ranks first, for fp32 data, a tensor-op algorithm with
 * CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION (fp32 computed in fp16), which a real cuDNN may offer to
 * a tf32 plan; running a float conv with that math type is a fault here, in every mode */
static int dnn_mode(const char *want) {
    const char *e = getenv("ACT_EMU_CUDNN");
    return e && strcmp(e, want) == 0;
}
static int dnn_disabled(void) { return dnn_mode("none"); }
static int dnn_refuses_runs(cudnnHandle_t h) {
    return dnn_mode("refuse-run") || (dnn_mode("refuse-capture") && emu_stream_capturing(h->stream));
}
/* what a run answers instead of running: NOT_SUPPORTED (refused), EXECUTION_FAILED, or SUCCESS */
static cudnnStatus_t dnn_run_verdict(cudnnHandle_t h) {
    if (dnn_mode("fail-run")) return CUDNN_STATUS_EXECUTION_FAILED;
    return dnn_refuses_runs(h) ? CUDNN_STATUS_NOT_SUPPORTED : CUDNN_STATUS_SUCCESS;
}

static int out_dim(int in, int pad, int k, int stride, int dil) {
    int span = (k - 1) * dil + 1;
    return in + 2 * pad < span ? 0 : (in + 2 * pad - span) / stride + 1;
}

/* x, w, conv (and y when given) -> shape; BAD_PARAM when they do not fit together */
static cudnnStatus_t make_shape(const emu_dnn_tensor *x, const emu_dnn_filter *w,
                                const emu_dnn_conv *cd, const emu_dnn_tensor *y, conv_shape *s) {
    if (!x || !w || !cd || !x->set || !w->set || !cd->set) return CUDNN_STATUS_BAD_PARAM;
    if (x->c != w->c || x->t != w->t) return CUDNN_STATUS_BAD_PARAM;
    *s = conv_shape{x->t, x->n, x->c, x->h, x->w, w->k, w->h, w->w, 0, 0,
                    cd->ph, cd->pw, cd->sh, cd->sw, cd->dh, cd->dw};
    s->Ho = out_dim(s->H, s->ph, s->R, s->sh, s->dh);
    s->Wo = out_dim(s->W, s->pw, s->S, s->sw, s->dw);
    if (s->Ho <= 0 || s->Wo <= 0) return CUDNN_STATUS_BAD_PARAM;
    if (y && (!y->set || y->t != s->t || y->n != s->N || y->c != s->K || y->h != s->Ho ||
              y->w != s->Wo))
        return CUDNN_STATUS_BAD_PARAM;
    return CUDNN_STATUS_SUCCESS;
}

static size_t im2col_bytes(const conv_shape &s) {
    return (size_t)s.C * s.R * s.S * s.Ho * s.Wo * type_size(s.t);
}

static cudnnStatus_t algo_workspace_base(const conv_shape &s, cudnnConvolutionFwdAlgo_t algo,
                                          size_t *bytes) {
    if (dnn_disabled()) return CUDNN_STATUS_NOT_SUPPORTED;
    switch (algo) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: *bytes = 0; return CUDNN_STATUS_SUCCESS;
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM:
        *bytes = im2col_bytes(s);
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM:
        if (s.t != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
        *bytes = (size_t)s.N * im2col_bytes(s);
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: {
        if (s.R != 3 || s.S != 3 || s.sh != 1 || s.sw != 1 ||
            s.dh != 1 || s.dw != 1)
            return CUDNN_STATUS_NOT_SUPPORTED;
        /* F(4x4, 3x3): 6x6 transforms of the input tiles, the filters and the output tiles */
        size_t tiles = (size_t)((s.Ho + 3) / 4) * ((s.Wo + 3) / 4);
        *bytes = 36 * ((size_t)s.N * s.C * tiles + (size_t)s.K * s.C + (size_t)s.N * s.K * tiles) * 4;
        return CUDNN_STATUS_SUCCESS;
    }
    default: return CUDNN_STATUS_NOT_SUPPORTED;
    }
}

/* NOT_SUPPORTED when this emulated cuDNN has no kernel for algo on this shape. An algorithm
 * that takes a workspace takes ACT_EMU_CONV_WS_PER_IMAGE=bytes more per image (read at each
 * call; default 0): the test models' workspaces are too small to grow with the batch past
 * the whole MiB the backend allocates by, as a full-size model's do */
static cudnnStatus_t algo_workspace(const conv_shape &s, cudnnConvolutionFwdAlgo_t algo,
                                    size_t *bytes) {
    cudnnStatus_t st = algo_workspace_base(s, algo, bytes);
    const char *e = getenv("ACT_EMU_CONV_WS_PER_IMAGE");
    if (st == CUDNN_STATUS_SUCCESS && *bytes && e && *e)
        *bytes += strtoull(e, NULL, 10) * (size_t)s.N;
    return st;
}

/* col[(c R + r) S + q][oy Wo + ox] = x[c][oy sh - ph + r dh][ox sw - pw + q dw], 0 outside */
static void im2col(const float *x, const conv_shape &s, float *col) {
    size_t P = (size_t)s.Ho * s.Wo;
    for (int c = 0; c < s.C; c++)
        for (int r = 0; r < s.R; r++)
            for (int q = 0; q < s.S; q++) {
                float *row = col + ((size_t)(c * s.R + r) * s.S + q) * P;
                for (int oy = 0; oy < s.Ho; oy++) {
                    float *dst = row + (size_t)oy * s.Wo;
                    int iy = oy * s.sh - s.ph + r * s.dh;
                    if (iy < 0 || iy >= s.H) {
                        memset(dst, 0, sizeof(float) * s.Wo);
                        continue;
                    }
                    const float *src = x + ((size_t)c * s.H + iy) * s.W;
                    for (int ox = 0; ox < s.Wo; ox++) {
                        int ix = ox * s.sw - s.pw + q * s.dw;
                        dst[ox] = ix >= 0 && ix < s.W ? src[ix] : 0.0f;
                    }
                }
            }
}

/* dst[c][p] = src[p][c] for one [P][C] block: an NHWC image into NCHW, a KRSC filter into KCRS */
static void channels_first(const float *src, size_t P, size_t C, float *dst) {
    for (size_t p = 0; p < P; p++)
        for (size_t c = 0; c < C; c++) dst[c * P + p] = src[p * C + c];
}

/* element (n, k, p = oy Wo + ox) of an N x K x Ho x Wo output-shaped tensor in format f */
static size_t out_index(cudnnTensorFormat_t f, size_t n, size_t k, size_t p, size_t K, size_t P) {
    return f == CUDNN_TENSOR_NHWC ? (n * P + p) * K + k : (n * K + k) * P + p;
}

/* what one queued convolution does; the fused call fills the epilogue fields */
struct conv_job {
    conv_shape s;
    cudnnTensorFormat_t xf, wf, yf, zf;
    int tf32;
    float alpha, beta;
    const void *x, *w;
    void *y;
    int fused;
    int algo;                       /* the algorithm asked for: named in the trace */
    int math;                       /* the descriptor's cudnnMathType_t: named in the trace */
    float alpha2;
    const void *z, *bias;
    cudnnActivationMode_t act;
    cudnnNanPropagation_t nan;
};

static float activate(float v, cudnnActivationMode_t act, cudnnNanPropagation_t nan) {
    if (act != CUDNN_ACTIVATION_RELU) return v;
    if (isnan(v)) return nan == CUDNN_PROPAGATE_NAN ? v : 0.0f;
    return v > 0.0f ? v : 0.0f;
}

static void run_conv(const conv_job &j) {
    const conv_shape &s = j.s;
    cudaDataType_t ct = cuda_type(s.t);
    size_t crs = (size_t)s.C * s.R * s.S, P = (size_t)s.Ho * s.Wo, chw = (size_t)s.C * s.H * s.W;
    /* fp32 NCHW data read exactly is used in place; anything else goes through fp32 copies */
    int exact = s.t == CUDNN_DATA_FLOAT && !j.tf32;
    int x_nhwc = j.xf == CUDNN_TENSOR_NHWC, w_krsc = j.wf == CUDNN_TENSOR_NHWC;
    emu_rounding rnd = j.tf32 ? EMU_ROUND_TF32 : EMU_ROUND_NONE;
    int direct_out = s.t == CUDNN_DATA_FLOAT && !j.fused && j.yf == CUDNN_TENSOR_NCHW;
    int pointwise = s.R == 1 && s.S == 1 && s.sh == 1 && s.sw == 1 && s.ph == 0 && s.pw == 0;
    std::vector<float> w32, x32, x_nchw, col, out;
    const float *wf = (const float *)j.w;
    if (!exact || w_krsc) {
        w32 = emu_widen(j.w, ct, (size_t)s.K * crs, 1, (size_t)s.K * crs, rnd);
        if (w_krsc) {
            std::vector<float> kcrs(w32.size());
            for (int k = 0; k < s.K; k++)
                channels_first(w32.data() + k * crs, (size_t)s.R * s.S, s.C, kcrs.data() + k * crs);
            w32.swap(kcrs);
        }
        wf = w32.data();
    }
    if (x_nhwc) x_nchw.resize(chw);
    if (!pointwise) col.resize(crs * P);
    if (!direct_out) out.resize((size_t)s.K * P);
    for (int n = 0; n < s.N; n++) {
        const float *xf = (const float *)j.x + n * chw;
        if (!exact || x_nhwc) {
            x32 = emu_widen((const char *)j.x + n * chw * type_size(s.t), ct, chw, 1, chw, rnd);
            xf = x32.data();
        }
        if (x_nhwc) {
            channels_first(xf, (size_t)s.H * s.W, s.C, x_nchw.data());
            xf = x_nchw.data();
        }
        if (!pointwise) im2col(xf, s, col.data());
        const float *cf = pointwise ? xf : col.data();
        float beta = j.fused ? 0.0f : j.beta;
        float *o = direct_out ? (float *)j.y + (size_t)n * s.K * P : out.data();
        if (!direct_out && beta != 0.0f)
            for (int k = 0; k < s.K; k++)
                for (size_t p = 0; p < P; p++)
                    out[(size_t)k * P + p] = emu_load(j.y, ct, out_index(j.yf, n, k, p, s.K, P));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.K, (int)P, (int)crs, j.alpha,
                    wf, (int)crs, cf, (int)P, beta, o, (int)P);
        if (direct_out) continue;
        for (int k = 0; k < s.K; k++)
            for (size_t p = 0; p < P; p++) {
                float v = out[(size_t)k * P + p];
                if (j.fused) {
                    if (j.alpha2 != 0.0f)
                        v += j.alpha2 * emu_load(j.z, ct, out_index(j.zf, n, k, p, s.K, P));
                    v = activate(v + emu_load(j.bias, ct, k), j.act, j.nan);
                }
                emu_store(j.y, ct, out_index(j.yf, n, k, p, s.K, P), v);
            }
    }
}

/* the checks and the queueing shared by both convolution calls */
static cudnnStatus_t convolve(const char *call, cudnnHandle_t h, const void *alpha,
                              const emu_dnn_tensor *xd, const void *x, const emu_dnn_filter *wd,
                              const void *w, const emu_dnn_conv *cd,
                              cudnnConvolutionFwdAlgo_t algo, void *ws, size_t ws_size,
                              const emu_dnn_tensor *yd, void *y, conv_job *j,
                              emu_operands *used) {
    if (!h || !alpha) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = make_shape(xd, wd, cd, yd, &j->s);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (j->s.t == CUDNN_DATA_FLOAT && cd->math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
        emu_fault("%s: fp32 data run with CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, which lets cuDNN compute "
                  "it in fp16 (fp32 and tf32 plans must never take it)", call);
    size_t need = 0;
    st = algo_workspace(j->s, algo, &need);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (ws_size < need || (need > 0 && !ws)) return CUDNN_STATUS_BAD_PARAM;
    const conv_shape &s = j->s;
    size_t es = type_size(s.t);
    if (!emu_on_device(call, "x", x, (size_t)s.N * s.C * s.H * s.W * es, used) ||
        !emu_on_device(call, "w", w, (size_t)s.K * s.C * s.R * s.S * es, used) ||
        !emu_on_device(call, "y", y, (size_t)s.N * s.K * s.Ho * s.Wo * es, used) ||
        !emu_on_device(call, "the workspace", ws, need, used))
        return CUDNN_STATUS_EXECUTION_FAILED;
    j->tf32 = s.t == CUDNN_DATA_FLOAT && cd->math != CUDNN_FMA_MATH;
    j->algo = (int)algo;
    j->math = (int)cd->math;
    j->alpha = *(const float *)alpha;
    j->xf = xd->f;
    j->wf = wd->f;
    j->yf = yd->f;
    j->x = x;
    j->w = w;
    j->y = y;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t enqueue(cudnnHandle_t h, const char *call, const conv_job &j,
                             emu_operands used) {
    auto op = [j]() {
        run_conv(j);
    };
    return emu_enqueue_as(h->stream, call, std::string(call) + " algo " + std::to_string(j.algo) +
                                                   " math " + std::to_string(j.math), op,
                          std::move(used)) == cudaSuccess
               ? CUDNN_STATUS_SUCCESS
               : CUDNN_STATUS_EXECUTION_FAILED;
}

template <class T> static cudnnStatus_t create(T **d) {
    if (!d) return CUDNN_STATUS_BAD_PARAM;
    *d = (T *)calloc(1, sizeof(T));
    return *d ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}

extern "C" {

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) { return create(handle); }

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
    if (!handle) return CUDNN_STATUS_BAD_PARAM;
    free(handle);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
    if (!handle) return CUDNN_STATUS_BAD_PARAM;
    handle->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}

/* the version of an emulated cuDNN: 9.10.0's number */
size_t cudnnGetVersion(void) { return 91000; }

const char *cudnnGetErrorString(cudnnStatus_t status) {
    switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_ALLOC_FAILED: return "CUDNN_STATUS_ALLOC_FAILED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_INVALID_VALUE: return "CUDNN_STATUS_INVALID_VALUE";
    case CUDNN_STATUS_ARCH_MISMATCH: return "CUDNN_STATUS_ARCH_MISMATCH";
    case CUDNN_STATUS_MAPPING_ERROR: return "CUDNN_STATUS_MAPPING_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    }
    return "CUDNN_STATUS_UNKNOWN";
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *desc) { return create(desc); }
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) {
    free(desc);
    return CUDNN_STATUS_SUCCESS;
}

/* format and type: BAD_PARAM when not a cuDNN value at all, NOT_SUPPORTED when real but not
 * emulated (DOUBLE, INT8, INT32, in either format); NCHW and NHWC both emulated */
static cudnnStatus_t check_layout(cudnnTensorFormat_t f, cudnnDataType_t t) {
    if ((f != CUDNN_TENSOR_NCHW && f != CUDNN_TENSOR_NHWC) || !known_type(t))
        return CUDNN_STATUS_BAD_PARAM;
    if (!emulated_type(t)) return CUDNN_STATUS_NOT_SUPPORTED;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
                                         cudnnDataType_t dataType, int n, int c, int h, int w) {
    if (!desc || n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = check_layout(format, dataType);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    *desc = emu_dnn_tensor{1, dataType, n, c, h, w, format};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *desc) { return create(desc); }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) {
    free(desc);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
    if (!desc || k <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = check_layout(format, dataType);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    *desc = emu_dnn_filter{1, dataType, k, c, h, w, format};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *desc) {
    return create(desc); /* zeroed: math CUDNN_DEFAULT_MATH, as in cuDNN */
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc) {
    free(desc);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h,
                                              int pad_w, int u, int v, int dilation_h,
                                              int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType) {
    if (!desc || pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 ||
        dilation_w <= 0 || (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION) ||
        !known_type(computeType))
        return CUDNN_STATUS_BAD_PARAM;
    /* true convolution (flipped filters) and non-FLOAT compute are not emulated */
    if (mode != CUDNN_CROSS_CORRELATION || computeType != CUDNN_DATA_FLOAT)
        return CUDNN_STATUS_NOT_SUPPORTED;
    desc->set = 1;
    desc->ph = pad_h;
    desc->pw = pad_w;
    desc->sh = u;
    desc->sw = v;
    desc->dh = dilation_h;
    desc->dw = dilation_w;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc,
                                          cudnnMathType_t mathType) {
    if (!desc || mathType < CUDNN_DEFAULT_MATH || mathType > CUDNN_FMA_MATH)
        return CUDNN_STATUS_BAD_PARAM;
    desc->math = mathType;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                    const cudnnTensorDescriptor_t inputTensorDesc,
                                                    const cudnnFilterDescriptor_t filterDesc,
                                                    int *n, int *c, int *h, int *w) {
    conv_shape s;
    if (!n || !c || !h || !w) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = make_shape(inputTensorDesc, filterDesc, convDesc, NULL, &s);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    *n = s.N;
    *c = s.K;
    *h = s.Ho;
    *w = s.Wo;
    return CUDNN_STATUS_SUCCESS;
}

/* The candidates, best first, as cuDNN's heuristics rank them (see the header): at most
 * `room` entries into perf, each with its status and workspace; returns how many. */
static int candidates(const conv_shape &s, cudnnMathType_t math, int room,
                      cudnnConvolutionFwdAlgoPerf_t *perf) {
    struct { cudnnConvolutionFwdAlgo_t algo; cudnnMathType_t math; } list[5];
    int n = 0;
    if (s.t == CUDNN_DATA_FLOAT) {
        if (dnn_mode("convert-first"))   /* a tensor-op algorithm that may compute fp32 in fp16 */
            list[n++] = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION};
        list[n++] = {CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, math};
        list[n++] = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, math};
        list[n++] = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, math};
        list[n++] = {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, math};
    } else {
        /* a real cuDNN may rank a transform first for 16-bit 3x3 convs (opencv#17685 saw
         * WINOGRAD_NONFUSED there); the backend keeps out of it (kernels/conv.cu) */
        list[n++] = {CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, CUDNN_TENSOR_OP_MATH};
        list[n++] = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_TENSOR_OP_MATH};
        list[n++] = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_TENSOR_OP_MATH};
        list[n++] = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_DEFAULT_MATH};
    }
    if (n > room) n = room;
    for (int i = 0; i < n; i++) {
        cudnnConvolutionFwdAlgoPerf_t *p = &perf[i];
        memset(p, 0, sizeof *p);
        p->algo = list[i].algo;
        p->mathType = list[i].math;
        p->determinism = CUDNN_DETERMINISTIC;
        p->status = algo_workspace(s, p->algo, &p->memory);
        /* heuristics measure nothing, so no time; no workspace for an unusable entry */
        p->time = -1.0f;
        if (p->status != CUDNN_STATUS_SUCCESS) p->memory = 0;
    }
    return n;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle,
                                                     const cudnnTensorDescriptor_t srcDesc,
                                                     const cudnnFilterDescriptor_t filterDesc,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t destDesc,
                                                     const int requestedAlgoCount,
                                                     int *returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t *perfResults) {
    conv_shape s;
    if (!handle || requestedAlgoCount < 1 || !returnedAlgoCount || !perfResults)
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = make_shape(srcDesc, filterDesc, convDesc, destDesc, &s);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    *returnedAlgoCount = candidates(s, convDesc->math, requestedAlgoCount, perfResults);
    return CUDNN_STATUS_SUCCESS;
}

/* Find: the emulator cannot time anything, so the "measurement" ranks the heuristics' list as
 * it is (ACT_EMU_CUDNN=find-reverse: reversed, so a plan takes another algorithm than the
 * heuristics' first; =find-fail: the call fails, as a real Find may on a sandboxed device).
 * What the real call does to its caller is kept: it waits for the handle's stream (so inside a
 * capture it is refused, as there), entries whose workspace exceeds what was given fail with
 * ALLOC_FAILED, and y is overwritten (with NaN here, so a caller that keeps a residual in y
 * fails loudly). */
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t handle,
                                                     const cudnnTensorDescriptor_t xDesc,
                                                     const void *x,
                                                     const cudnnFilterDescriptor_t wDesc,
                                                     const void *w,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t yDesc, void *y,
                                                     const int requestedAlgoCount,
                                                     int *returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t *perfResults,
                                                     void *workSpace, size_t workSpaceSizeInBytes) {
    const char *call = "cudnnFindConvolutionForwardAlgorithmEx";
    conv_shape s;
    if (!handle || requestedAlgoCount < 1 || !returnedAlgoCount || !perfResults)
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = make_shape(xDesc, wDesc, convDesc, yDesc, &s);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    size_t es = type_size(s.t), ny = (size_t)s.N * s.K * s.Ho * s.Wo;
    emu_operands used;
    if (!emu_on_device(call, "x", x, (size_t)s.N * s.C * s.H * s.W * es, &used) ||
        !emu_on_device(call, "w", w, (size_t)s.K * s.C * s.R * s.S * es, &used) ||
        !emu_on_device(call, "y", y, ny * es, &used) ||
        !emu_on_device(call, "the workspace", workSpace, workSpaceSizeInBytes, &used))
        return CUDNN_STATUS_EXECUTION_FAILED;
    if (cudaStreamSynchronize(handle->stream) != cudaSuccess) return CUDNN_STATUS_EXECUTION_FAILED;
    if (dnn_mode("find-fail")) return CUDNN_STATUS_EXECUTION_FAILED;
    cudnnConvolutionFwdAlgoPerf_t list[5];
    int n = candidates(s, convDesc->math, 5, list), k = 0;
    int reverse = dnn_mode("find-reverse");
    for (int pass = 0; pass < 2; pass++)              /* the runnable ones first, by "time" */
        for (int i = 0; i < n && k < requestedAlgoCount; i++) {
            cudnnConvolutionFwdAlgoPerf_t c = list[reverse ? n - 1 - i : i];
            if (c.status == CUDNN_STATUS_SUCCESS && c.memory > workSpaceSizeInBytes)
                c.status = CUDNN_STATUS_ALLOC_FAILED;
            if ((c.status == CUDNN_STATUS_SUCCESS) != (pass == 0)) continue;
            c.time = c.status == CUDNN_STATUS_SUCCESS ? 0.1f * (float)(k + 1) : -1.0f;
            perfResults[k++] = c;
        }
    *returnedAlgoCount = k;
    cudaDataType_t t = cuda_type(s.t);
    auto poison = [y, ny, t]() {
        for (size_t i = 0; i < ny; i++) emu_store(y, t, i, NAN);
    };
    if (emu_enqueue(handle->stream, call, poison, std::move(used)) != cudaSuccess ||
        cudaStreamSynchronize(handle->stream) != cudaSuccess)
        return CUDNN_STATUS_EXECUTION_FAILED;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle,
                                                      const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo,
                                                      size_t *sizeInBytes) {
    conv_shape s;
    if (!handle || !sizeInBytes) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = make_shape(xDesc, wDesc, convDesc, yDesc, &s);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    return algo_workspace(s, algo, sizeInBytes);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
                                      const cudnnTensorDescriptor_t xDesc, const void *x,
                                      const cudnnFilterDescriptor_t wDesc, const void *w,
                                      const cudnnConvolutionDescriptor_t convDesc,
                                      cudnnConvolutionFwdAlgo_t algo, void *workSpace,
                                      size_t workSpaceSizeInBytes, const void *beta,
                                      const cudnnTensorDescriptor_t yDesc, void *y) {
    const char *call = "cudnnConvolutionForward";
    conv_job j{};
    emu_operands used;
    if (!beta) return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = convolve(call, handle, alpha, xDesc, x, wDesc, w, convDesc, algo,
                                workSpace, workSpaceSizeInBytes, yDesc, y, &j, &used);
    if (st != CUDNN_STATUS_SUCCESS || (st = dnn_run_verdict(handle)) != CUDNN_STATUS_SUCCESS) return st;
    j.beta = *(const float *)beta;
    return enqueue(handle, call, j, std::move(used));
}

cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *desc) {
    return create(desc);
}
cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t desc) {
    free(desc);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t desc,
                                           cudnnActivationMode_t mode,
                                           cudnnNanPropagation_t reluNanOpt, double coef) {
    (void)coef; /* only the clipped ReLU and ELU read it, and they are not emulated */
    if (!desc || (mode != CUDNN_ACTIVATION_RELU && mode != CUDNN_ACTIVATION_IDENTITY) ||
        (reluNanOpt != CUDNN_NOT_PROPAGATE_NAN && reluNanOpt != CUDNN_PROPAGATE_NAN))
        return CUDNN_STATUS_BAD_PARAM;
    *desc = emu_dnn_act{1, mode, reluNanOpt};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBiasActivationForward(
    cudnnHandle_t handle, const void *alpha1, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnFilterDescriptor_t wDesc, const void *w,
    const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo, void *workSpace,
    size_t workSpaceSizeInBytes, const void *alpha2, const cudnnTensorDescriptor_t zDesc,
    const void *z, const cudnnTensorDescriptor_t biasDesc, const void *bias,
    const cudnnActivationDescriptor_t activationDesc, const cudnnTensorDescriptor_t yDesc,
    void *y) {
    const char *call = "cudnnConvolutionBiasActivationForward";
    conv_job j{};
    if (!alpha2 || !activationDesc || !activationDesc->set || !zDesc || !zDesc->set ||
        !biasDesc || !biasDesc->set || !yDesc || !yDesc->set)
        return CUDNN_STATUS_BAD_PARAM;
    if (zDesc->t != yDesc->t || zDesc->n != yDesc->n || zDesc->c != yDesc->c ||
        zDesc->h != yDesc->h || zDesc->w != yDesc->w || biasDesc->t != yDesc->t ||
        biasDesc->n != 1 || biasDesc->c != yDesc->c || biasDesc->h != 1 || biasDesc->w != 1)
        return CUDNN_STATUS_BAD_PARAM;
    /* cuDNN fuses an identity activation only into this one algorithm */
    if (activationDesc->mode == CUDNN_ACTIVATION_IDENTITY &&
        algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
        return CUDNN_STATUS_NOT_SUPPORTED;
    emu_operands used;
    cudnnStatus_t st = convolve(call, handle, alpha1, xDesc, x, wDesc, w, convDesc, algo,
                                workSpace, workSpaceSizeInBytes, yDesc, y, &j, &used);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    size_t es = type_size(j.s.t);
    if (!emu_on_device(call, "z", z, (size_t)j.s.N * j.s.K * j.s.Ho * j.s.Wo * es, &used) ||
        !emu_on_device(call, "bias", bias, (size_t)j.s.K * es, &used))
        return CUDNN_STATUS_EXECUTION_FAILED;
    if ((st = dnn_run_verdict(handle)) != CUDNN_STATUS_SUCCESS) return st;
    j.fused = 1;
    j.alpha2 = *(const float *)alpha2;
    j.zf = zDesc->f;
    j.z = z;
    j.bias = bias;
    j.act = activationDesc->mode;
    j.nan = activationDesc->nan;
    return enqueue(handle, call, j, std::move(used));
}

}
