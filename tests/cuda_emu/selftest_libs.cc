/* selftest_libs.cc (CUDA emulator) - checks the emulated cuBLAS GEMM, cuBLASLt matmul (with its
 * bias/ReLU epilogues) and cuDNN convolutions (NCHW, NHWC and mixed operand layouts) against
 * double-precision loops on random data, and their error paths, through the public calls only
 * (device buffers from cudaMalloc, results read back after a stream sync).
 *
 * Tolerances: each result r is compared with the double reference e as
 *   |r - e| <= 2e-5 * S + u * |e|
 * where S = |alpha| sum |a b| + |beta c0| + |bias| (the sum of the magnitudes added: an fp32
 * dot product of length <= 200 is off by at most ~1.2e-5 S) and u is the output rounding
 * (0 for fp32, 2^-10 for fp16, 2^-7 for bf16: twice the half ulp). Operands are generated in
 * their storage type, so the reference sees exactly the stored values; the TF32 cases round
 * them with this file's own TF32 rounding and also check that the rounding really changed the
 * result (their error against the unrounded reference is over ten times the exact mode's).
 * Graphs replayed after an operand or a workspace was freed must fault (each in a forked child,
 * its stderr checked for the message); the same graphs replayed with everything live must give
 * the eager call's result bit for bit. The other fault checks run last: a fault is sticky, as on
 * a GPU. Exit 0 pass, 1 fail. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <functional>
#include <vector>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <cudnn.h>
#include <cuda_runtime.h>
#include "emu_internal.h"
#include "../test_common.h"
#include "selftest_child.h"

typedef std::vector<float> vec;

static cudaStream_t g_st;

static const char *tname(cudaDataType_t t) {
    return t == CUDA_R_16F ? "f16" : t == CUDA_R_16BF ? "bf16" : "f32";
}
static size_t tsize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
static double out_ulp(cudaDataType_t t) {
    return t == CUDA_R_16F ? 1.0 / 1024 : t == CUDA_R_16BF ? 1.0 / 128 : 0.0;
}

/* TF32 rounding written independently of the runtime's: keep 10 mantissa bits, nearest even */
static float tf32(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) {
        u += 0xfffu + ((u >> 13) & 1u);
        u &= 0xffffe000u;
    }
    memcpy(&v, &u, 4);
    return v;
}

/* n random values in [-1, 1], as stored in type t (so the reference sees what the device has) */
static vec rand_vec(size_t n, cudaDataType_t t) {
    vec v(n);
    std::vector<char> tmp(tsize(t));
    for (size_t i = 0; i < n; i++) {
        emu_store(tmp.data(), t, 0, urand(-1.0f, 1.0f));
        v[i] = emu_load(tmp.data(), t, 0);
    }
    return v;
}

static void *to_device(const vec &v, cudaDataType_t t) {
    std::vector<char> host(v.size() * tsize(t) + 1);
    for (size_t i = 0; i < v.size(); i++) emu_store(host.data(), t, i, v[i]);
    void *d = NULL;
    if (cudaMalloc(&d, host.size()) != cudaSuccess ||
        cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "selftest: cannot make a device buffer of %zu bytes\n", host.size());
        exit(1);
    }
    return d;
}

static vec from_device(const void *d, cudaDataType_t t, size_t n) {
    std::vector<char> host(n * tsize(t) + 1);
    CHECK(cudaMemcpy(host.data(), d, n * tsize(t), cudaMemcpyDeviceToHost) == cudaSuccess,
          "read back %zu elements", n);
    vec v(n);
    for (size_t i = 0; i < n; i++) v[i] = emu_load(host.data(), t, i);
    return v;
}

/* compares got with the reference; returns the summed |got - exact| for the TF32 checks */
struct cmp {
    int bad = 0;
    double worst = 0, dev_exact = 0;
    void one(double got, double want, double scale, double exact, double ulp) {
        double tol = 2e-5 * scale + ulp * fabs(want) + 1e-30;
        double e = fabs(got - want);
        if (!(e <= tol)) bad++;
        if (e / tol > worst || got != got) worst = got != got ? INFINITY : e / tol;
        dev_exact += fabs(got - exact);
    }
};

/* ---------------- GEMM ---------------- */

/* element (i, j) of op(A) op(B) in double: with the operands as the GEMM reads them (TF32-rounded
 * when tf32), exactly, and the sum of magnitudes (for the tolerance) */
static void ref_dot(const vec &A, int lda, cublasOperation_t ta, const vec &B, int ldb,
                    cublasOperation_t tb, int k, int i, int j, bool tf32_in, double *sum,
                    double *exact, double *mag) {
    *sum = *exact = *mag = 0;
    for (int p = 0; p < k; p++) {
        float a = ta == CUBLAS_OP_N ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p];
        float b = tb == CUBLAS_OP_N ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
        *exact += (double)a * b;
        if (tf32_in) {
            a = tf32(a);
            b = tf32(b);
        }
        *sum += (double)a * b;
        *mag += fabs((double)a * b);
    }
}

struct gemm_args {
    cublasOperation_t ta, tb;
    int m, n, k;
    cudaDataType_t t, tc;
    cublasComputeType_t comp;
    int tf32; /* the expected operand rounding */
    float alpha, beta;
};

static double gemm_case(cublasHandle_t h, const gemm_args &g) {
    int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
    int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
    int lda = ar + 3, ldb = br + 1, ldc = g.m + 2; /* padded: the padding must stay untouched */
    vec A = rand_vec((size_t)lda * ac, g.t), B = rand_vec((size_t)ldb * bc, g.t);
    vec C0 = rand_vec((size_t)ldc * g.n, g.tc);
    /* beta 0 must not read C: NaN there must not reach the result */
    if (g.beta == 0.0f)
        for (int j = 0; j < g.n; j++)
            for (int i = 0; i < g.m; i++) C0[(size_t)j * ldc + i] = NAN;
    void *dA = to_device(A, g.t), *dB = to_device(B, g.t), *dC = to_device(C0, g.tc);
    float alpha = g.alpha, beta = g.beta;
    cublasStatus_t s = cublasGemmEx(h, g.ta, g.tb, g.m, g.n, g.k, &alpha, dA, g.t, lda, dB, g.t,
                                    ldb, &beta, dC, g.tc, ldc, g.comp, CUBLAS_GEMM_DEFAULT);
    alpha = beta = 99.0f; /* read at the call: later changes must not matter */
    CHECK(s == CUBLAS_STATUS_SUCCESS, "gemm %s->%s ops %d%d: status %s", tname(g.t),
          tname(g.tc), g.ta, g.tb, cublasGetStatusString(s));
    CHECK(cudaStreamSynchronize(g_st) == cudaSuccess, "gemm sync");
    vec C = from_device(dC, g.tc, (size_t)ldc * g.n);
    cmp c;
    int pad_changed = 0;
    for (int j = 0; j < g.n; j++) {
        for (int i = 0; i < g.m; i++) {
            double sum, sum_exact, mag;
            ref_dot(A, lda, g.ta, B, ldb, g.tb, g.k, i, j, g.tf32, &sum, &sum_exact, &mag);
            double c0 = g.beta != 0.0f ? g.beta * (double)C0[(size_t)j * ldc + i] : 0.0;
            c.one(C[(size_t)j * ldc + i], g.alpha * sum + c0, fabs(g.alpha) * mag + fabs(c0),
                  g.alpha * sum_exact + c0, out_ulp(g.tc));
        }
        for (int i = g.m; i < ldc; i++)
            pad_changed += memcmp(&C[(size_t)j * ldc + i], &C0[(size_t)j * ldc + i], 4) != 0;
    }
    CHECK(c.bad == 0, "gemm %s->%s ops %d%d m%d n%d k%d comp %d beta %g: %d of %d wrong, worst "
          "%.2f x tolerance", tname(g.t), tname(g.tc), g.ta, g.tb, g.m, g.n, g.k, g.comp,
          g.beta, c.bad, g.m * g.n, c.worst);
    CHECK(pad_changed == 0, "gemm wrote %d elements of C's padding rows", pad_changed);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    return c.dev_exact;
}

static void gemm_tests(cublasHandle_t h) {
    const cudaDataType_t types[3] = {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF};
    const cublasOperation_t ops[3] = {CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C};
    for (cudaDataType_t t : types)
        for (int wide = 0; wide < (t == CUDA_R_32F ? 1 : 2); wide++)
            for (cublasOperation_t ta : ops)
                for (cublasOperation_t tb : ops) {
                    cudaDataType_t tc = wide ? CUDA_R_32F : t;
                    cublasComputeType_t comp =
                        t == CUDA_R_32F ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
                    float beta = (ta + tb) % 2 ? 0.5f : 0.0f;
                    gemm_case(h, {ta, tb, 13, 7, 33, t, tc, comp, 0, 0.75f, beta});
                }
    gemm_case(h, {CUBLAS_OP_T, CUBLAS_OP_N, 64, 48, 100, CUDA_R_16BF, CUDA_R_16BF,
                  CUBLAS_COMPUTE_32F, 0, 1.0f, 1.0f});
    gemm_case(h, {CUBLAS_OP_N, CUBLAS_OP_N, 5, 4, 0, CUDA_R_32F, CUDA_R_32F,
                  CUBLAS_COMPUTE_32F_PEDANTIC, 0, 1.0f, 0.5f});

    /* TF32: FAST_TF32, or 32F under the handle's TF32 math mode; PEDANTIC and DEFAULT are exact */
    gemm_args g = {CUBLAS_OP_T, CUBLAS_OP_N, 32, 32, 64, CUDA_R_32F, CUDA_R_32F,
                   CUBLAS_COMPUTE_32F_PEDANTIC, 0, 1.0f, 0.0f};
    double exact = gemm_case(h, g);
    g.comp = CUBLAS_COMPUTE_32F;
    double plain = gemm_case(h, g);
    g.comp = CUBLAS_COMPUTE_32F_FAST_TF32;
    g.tf32 = 1;
    double fast = gemm_case(h, g);
    /* the reduction flag or-ed in keeps the mode (the backend sets both) */
    CHECK(cublasSetMathMode(h, (cublasMath_t)(CUBLAS_TF32_TENSOR_OP_MATH |
                                              CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)) ==
              CUBLAS_STATUS_SUCCESS, "math mode");
    CHECK(cublasSetMathMode(h, (cublasMath_t)(8 | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)) ==
              CUBLAS_STATUS_INVALID_VALUE, "an unknown math mode with the flag is refused");
    g.comp = CUBLAS_COMPUTE_32F;
    double mode = gemm_case(h, g);
    g.comp = CUBLAS_COMPUTE_32F_PEDANTIC;
    g.tf32 = 0;
    double pedantic = gemm_case(h, g);
    CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH) == CUBLAS_STATUS_SUCCESS, "math mode");
    CHECK(fast > 10 * exact && mode > 10 * exact,
          "TF32 rounding has no visible effect: deviation from exact %g (FAST_TF32), %g (TF32 "
          "math mode) vs %g (PEDANTIC)", fast, mode, exact);
    CHECK(plain < 10 * exact + 1e-6 && pedantic < 10 * exact + 1e-6,
          "exact modes deviate like TF32: %g (32F, default math), %g (PEDANTIC under TF32 mode) "
          "vs %g", plain, pedantic, exact);
}

static void gemm_errors(cublasHandle_t h) {
    vec v = rand_vec(64, CUDA_R_32F);
    void *d = to_device(v, CUDA_R_32F);
    float one = 1.0f, zero = 0.0f;
    auto call = [&](cublasOperation_t ta, int m, int n, int k, int lda, int ldb, int ldc,
                    cudaDataType_t ta_t, cudaDataType_t tb_t, cudaDataType_t tc_t,
                    cublasComputeType_t comp) {
        return cublasGemmEx(h, ta, CUBLAS_OP_N, m, n, k, &one, d, ta_t, lda, d, tb_t, ldb, &zero,
                            d, tc_t, ldc, comp, CUBLAS_GEMM_DEFAULT);
    };
    const cudaDataType_t F = CUDA_R_32F, H = CUDA_R_16F, BF = CUDA_R_16BF;
    const cublasComputeType_t C32 = CUBLAS_COMPUTE_32F;
    cublasStatus_t s;
    s = call(CUBLAS_OP_N, 4, 4, 4, 3, 4, 4, F, F, F, C32);
    CHECK(s == CUBLAS_STATUS_INVALID_VALUE, "lda < m gave %s", cublasGetStatusString(s));
    s = call(CUBLAS_OP_T, 4, 4, 5, 4, 5, 4, F, F, F, C32);
    CHECK(s == CUBLAS_STATUS_INVALID_VALUE, "lda < k under op T gave %s", cublasGetStatusString(s));
    s = call(CUBLAS_OP_N, 4, 4, 4, 4, 4, 3, F, F, F, C32);
    CHECK(s == CUBLAS_STATUS_INVALID_VALUE, "ldc < m gave %s", cublasGetStatusString(s));
    s = call(CUBLAS_OP_N, 4, -1, 4, 4, 4, 4, F, F, F, C32);
    CHECK(s == CUBLAS_STATUS_INVALID_VALUE, "n < 0 gave %s", cublasGetStatusString(s));
    s = call(CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, H, H, H, CUBLAS_COMPUTE_16F);
    CHECK(s == CUBLAS_STATUS_NOT_SUPPORTED, "compute 16F gave %s", cublasGetStatusString(s));
    s = call(CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, H, BF, F, C32);
    CHECK(s == CUBLAS_STATUS_NOT_SUPPORTED, "A f16, B bf16 gave %s", cublasGetStatusString(s));
    s = call(CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, BF, BF, H, C32);
    CHECK(s == CUBLAS_STATUS_NOT_SUPPORTED, "bf16 -> f16 gave %s", cublasGetStatusString(s));
    s = call(CUBLAS_OP_N, 0, 4, 4, 4, 4, 4, F, F, F, C32);
    CHECK(s == CUBLAS_STATUS_SUCCESS, "m = 0 gave %s", cublasGetStatusString(s));
    s = cublasSetWorkspace(h, (char *)d + 4, 64);
    CHECK(s == CUBLAS_STATUS_INVALID_VALUE, "misaligned workspace gave %s", cublasGetStatusString(s));
    cudaFree(d);
}

/* ---------------- cuBLASLt ---------------- */

/* one cuBLASLt problem: D[m][n] (ld m + 2) = epilogue(op(A) op(B) + bias) with beta 0 */
struct lt_args {
    cublasOperation_t ta, tb;
    int m, n, k;
    cudaDataType_t t, td;
    cublasComputeType_t comp;
    uint32_t epi;
    int bias_type;  /* -1: the attribute is left unset (D's type) */
    int tf32;       /* the expected operand rounding */
};

struct lt_op {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, d = NULL;
    ~lt_op() {
        cublasLtMatmulDescDestroy(op);
        cublasLtMatrixLayoutDestroy(a);
        cublasLtMatrixLayoutDestroy(b);
        cublasLtMatrixLayoutDestroy(d);
    }
};

/* descriptors of g with the given lds; 0 when any call fails (reported) */
static int lt_make(const lt_args &g, int lda, int ldb, int ldd, const void *bias, lt_op *o) {
    int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
    int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
    int32_t ta = g.ta, tb = g.tb, bt = g.bias_type;
    int ok = cublasLtMatmulDescCreate(&o->op, g.comp, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulDescSetAttribute(o->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, 4) == 0 &&
             cublasLtMatmulDescSetAttribute(o->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, 4) == 0 &&
             cublasLtMatmulDescSetAttribute(o->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epi, 4) == 0 &&
             cublasLtMatmulDescSetAttribute(o->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                            sizeof bias) == 0 &&
             (bt == -1 || cublasLtMatmulDescSetAttribute(
                              o->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, 4) == 0) &&
             cublasLtMatrixLayoutCreate(&o->a, g.t, ar, ac, lda) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatrixLayoutCreate(&o->b, g.t, br, bc, ldb) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatrixLayoutCreate(&o->d, g.td, g.m, g.n, ldd) == CUBLAS_STATUS_SUCCESS;
    CHECK(ok, "cuBLASLt descriptors for %s->%s m%d n%d k%d", tname(g.t), tname(g.td), g.m, g.n,
          g.k);
    return ok;
}

/* the heuristic's first `want` algorithms under alignment al for every matrix; returns the
 * count */
static int lt_algo(cublasLtHandle_t lt, const lt_op &o, uint32_t al, uint64_t ws,
                   cublasLtMatmulHeuristicResult_t *r, cublasStatus_t *st, int want = 1) {
    cublasLtMatmulPreference_t pref = NULL;
    int n = 0;
    *st = cublasLtMatmulPreferenceCreate(&pref);
    if (*st == CUBLAS_STATUS_SUCCESS)
        *st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws, sizeof ws);
    for (int i = 0; i < 4 && *st == CUBLAS_STATUS_SUCCESS; i++)
        *st = cublasLtMatmulPreferenceSetAttribute(
            pref, (cublasLtMatmulPreferenceAttributes_t)(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i),
            &al, sizeof al);
    const uint32_t red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, stray = 8;
    if (*st == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                             &stray, sizeof stray) != CUBLAS_STATUS_INVALID_VALUE)
        *st = CUBLAS_STATUS_INTERNAL_ERROR;   /* a mask bit no scheme has must be refused */
    if (*st == CUBLAS_STATUS_SUCCESS)
        *st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                   &red, sizeof red);
    if (*st == CUBLAS_STATUS_SUCCESS)
        *st = cublasLtMatmulAlgoGetHeuristic(lt, o.op, o.a, o.b, o.d, o.d, pref, want, r, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    return n;
}

static void *g_lt_ws;
static const size_t LT_WS = 4 << 20;

/* runs g against double loops; returns the summed |got - exact| for the TF32 check */
static double lt_case(cublasLtHandle_t lt, const lt_args &g) {
    int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
    int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
    int lda = ar + 1, ldb = br + 3, ldd = g.m + 2;
    cudaDataType_t bt = g.bias_type == -1 ? g.td : (cudaDataType_t)g.bias_type;
    vec A = rand_vec((size_t)lda * ac, g.t), B = rand_vec((size_t)ldb * bc, g.t);
    vec bias = rand_vec(g.m, bt), D0((size_t)ldd * g.n, NAN); /* beta 0: D is never read */
    void *dA = to_device(A, g.t), *dB = to_device(B, g.t), *dD = to_device(D0, g.td);
    void *dbias = to_device(bias, bt);
    lt_op o;
    double dev_exact = 0;
    cublasLtMatmulHeuristicResult_t r;
    cublasStatus_t s;
    if (lt_make(g, lda, ldb, ldd, dbias, &o) && lt_algo(lt, o, 256, LT_WS, &r, &s) == 1) {
        CHECK(r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= LT_WS,
              "heuristic result state %d, workspace %zu", r.state, r.workspaceSize);
        float alpha = 1.0f, beta = 0.0f;
        s = cublasLtMatmul(lt, o.op, &alpha, dA, o.a, dB, o.b, &beta, dD, o.d, dD, o.d, &r.algo,
                           g_lt_ws, LT_WS, g_st);
        CHECK(s == CUBLAS_STATUS_SUCCESS, "cublasLtMatmul %s->%s epi %u: %s", tname(g.t),
              tname(g.td), g.epi, cublasLtGetStatusString(s));
        CHECK(cudaStreamSynchronize(g_st) == cudaSuccess, "lt sync");
        vec D = from_device(dD, g.td, (size_t)ldd * g.n);
        cmp c;
        int pad_changed = 0;
        for (int j = 0; j < g.n; j++) {
            for (int i = 0; i < g.m; i++) {
                double sum, sum_exact, mag;
                ref_dot(A, lda, g.ta, B, ldb, g.tb, g.k, i, j, g.tf32, &sum, &sum_exact, &mag);
                double add = (g.epi & CUBLASLT_EPILOGUE_BIAS) ? bias[i] : 0.0;
                double want = sum + add, exact = sum_exact + add;
                if (g.epi & CUBLASLT_EPILOGUE_RELU) {
                    want = want > 0 ? want : 0;
                    exact = exact > 0 ? exact : 0;
                }
                c.one(D[(size_t)j * ldd + i], want, mag + fabs(add), exact, out_ulp(g.td));
            }
            for (int i = g.m; i < ldd; i++) pad_changed += !std::isnan(D[(size_t)j * ldd + i]);
        }
        CHECK(c.bad == 0, "lt %s->%s ops %d%d m%d n%d k%d comp %d epi %u bias %s: %d of %d wrong, "
              "worst %.2f x tolerance", tname(g.t), tname(g.td), g.ta, g.tb, g.m, g.n, g.k, g.comp,
              g.epi, tname(bt), c.bad, g.m * g.n, c.worst);
        CHECK(pad_changed == 0, "lt wrote %d elements of D's padding rows", pad_changed);
        dev_exact = c.dev_exact;
    } else {
        CHECK(0, "no cuBLASLt algorithm for %s->%s epi %u (status %s)", tname(g.t), tname(g.td),
              g.epi, cublasLtGetStatusString(s));
    }
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dD);
    cudaFree(dbias);
    return dev_exact;
}

static void lt_tests(cublasLtHandle_t lt) {
    const cudaDataType_t types[3] = {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF};
    const uint32_t epis[4] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_RELU,
                              CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_RELU_BIAS};
    for (cudaDataType_t t : types)
        for (int wide = 0; wide < (t == CUDA_R_32F ? 1 : 2); wide++)
            for (uint32_t epi : epis)
                for (int f32_bias = 0; f32_bias < 2; f32_bias++) {
                    cudaDataType_t td = wide ? CUDA_R_32F : t;
                    cublasComputeType_t comp =
                        t == CUDA_R_32F ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
                    /* the act-engine shape (A op T, B op N), and the others on some cases */
                    cublasOperation_t ta = epi == CUBLASLT_EPILOGUE_RELU ? CUBLAS_OP_N : CUBLAS_OP_T;
                    cublasOperation_t tb = epi == CUBLASLT_EPILOGUE_DEFAULT ? CUBLAS_OP_T : CUBLAS_OP_N;
                    lt_case(lt, {ta, tb, 13, 7, 33, t, td, comp, epi, f32_bias ? CUDA_R_32F : -1, 0});
                }
    /* batch-1 shape of the model: one column */
    lt_case(lt, {CUBLAS_OP_T, CUBLAS_OP_N, 64, 1, 48, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F,
                 CUBLASLT_EPILOGUE_RELU_BIAS, CUDA_R_32F, 0});
    /* TF32 operand rounding shows, PEDANTIC stays exact */
    lt_args g = {CUBLAS_OP_T, CUBLAS_OP_N, 32, 32, 64, CUDA_R_32F, CUDA_R_32F,
                 CUBLAS_COMPUTE_32F_PEDANTIC, CUBLASLT_EPILOGUE_BIAS, CUDA_R_32F, 0};
    double exact = lt_case(lt, g);
    g.comp = CUBLAS_COMPUTE_32F_FAST_TF32;
    g.tf32 = 1;
    double fast = lt_case(lt, g);
    CHECK(fast > 10 * exact, "lt TF32 rounding has no visible effect: %g vs PEDANTIC %g", fast,
          exact);
}

static void lt_errors(cublasLtHandle_t lt) {
    vec v = rand_vec(4096, CUDA_R_32F);
    char *d = (char *)to_device(v, CUDA_R_32F);  /* cudaMalloc: 256-byte aligned */
    float one = 1.0f, zero = 0.0f;
    cublasLtMatmulHeuristicResult_t r;
    cublasStatus_t s;
    lt_args g = {CUBLAS_OP_T, CUBLAS_OP_N, 8, 4, 16, CUDA_R_32F, CUDA_R_32F,
                 CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_BIAS, CUDA_R_32F, 0};
    {
        lt_op o;
        lt_make(g, 16, 16, 8, d, &o);
        int32_t v32 = 0;
        s = cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_TRANSA, &v32, 8);
        CHECK(s == CUBLAS_STATUS_INVALID_VALUE, "attribute of the wrong size gave %s",
              cublasLtGetStatusString(s));
        /* the default 256-byte alignment: an operand 4 bytes off is refused at the call */
        int n = lt_algo(lt, o, 256, LT_WS, &r, &s);
        CHECK(n == 1, "heuristic: %d algorithms (%s)", n, cublasLtGetStatusString(s));
        s = cublasLtMatmul(lt, o.op, &one, d + 4, o.a, d + 1024, o.b, &zero, d + 2048, o.d,
                           d + 2048, o.d, &r.algo, g_lt_ws, LT_WS, g_st);
        CHECK(s == CUBLAS_STATUS_NOT_SUPPORTED, "A less aligned than the heuristic was told gave %s",
              cublasLtGetStatusString(s));
        s = cublasLtMatmul(lt, o.op, &one, d, o.a, d + 1024, o.b, &zero, d + 2048, o.d, d + 2048,
                           o.d, &r.algo, g_lt_ws, r.workspaceSize - 1, g_st);
        CHECK(s == CUBLAS_STATUS_INVALID_VALUE, "workspace below the algorithm's gave %s",
              cublasLtGetStatusString(s));
        n = lt_algo(lt, o, 4, LT_WS, &r, &s);
        s = cublasLtMatmul(lt, o.op, &one, d + 4, o.a, d + 1024, o.b, &zero, d + 2048, o.d,
                           d + 2048, o.d, &r.algo, g_lt_ws, LT_WS, g_st);
        CHECK(n == 1 && s == CUBLAS_STATUS_SUCCESS, "4-byte alignment told: %d algorithms, %s", n,
              cublasLtGetStatusString(s));
        n = lt_algo(lt, o, 2, LT_WS, &r, &s);
        CHECK(n == 0 && s == CUBLAS_STATUS_SUCCESS, "2-byte alignment for fp32: %d algorithms, %s",
              n, cublasLtGetStatusString(s));
        setenv("ACT_EMU_CUBLASLT", "none", 1);
        n = lt_algo(lt, o, 256, LT_WS, &r, &s);
        unsetenv("ACT_EMU_CUBLASLT");
        CHECK(n == 0 && s == CUBLAS_STATUS_SUCCESS, "ACT_EMU_CUBLASLT=none: %d algorithms, %s", n,
              cublasLtGetStatusString(s));
        CHECK(cudaStreamSynchronize(g_st) == cudaSuccess, "lt sync");
    }
    {
        /* an algorithm from one problem, used for another */
        lt_op o1, o2;
        lt_args g2 = g;
        g2.epi = CUBLASLT_EPILOGUE_RELU_BIAS;
        lt_make(g, 16, 16, 8, d, &o1);
        lt_make(g2, 16, 16, 8, d, &o2);
        int n = lt_algo(lt, o1, 256, LT_WS, &r, &s);
        s = cublasLtMatmul(lt, o2.op, &one, d, o2.a, d + 1024, o2.b, &zero, d + 2048, o2.d,
                           d + 2048, o2.d, &r.algo, g_lt_ws, LT_WS, g_st);
        CHECK(n == 1 && s == CUBLAS_STATUS_NOT_SUPPORTED, "another problem's algorithm gave %s",
              cublasLtGetStatusString(s));
    }
    auto heur = [&](lt_args a, int lda, int ldb, int ldd) {
        lt_op o;
        lt_make(a, lda, ldb, ldd, d, &o);
        lt_algo(lt, o, 256, LT_WS, &r, &s);
        return s;
    };
    lt_args e = g;
    e.k = 17; /* A's layout says k = 17 */
    {
        lt_op oa, ob;
        lt_make(e, 17, 16, 8, d, &oa);
        lt_make(g, 16, 16, 8, d, &ob);
        int n = 0;
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        s = cublasLtMatmulAlgoGetHeuristic(lt, ob.op, oa.a, ob.b, ob.d, ob.d, pref, 1, &r, &n);
        cublasLtMatmulPreferenceDestroy(pref);
        CHECK(s == CUBLAS_STATUS_INVALID_VALUE, "k of A != k of B gave %s",
              cublasLtGetStatusString(s));
    }
    s = heur(g, 15, 16, 8);
    CHECK(s == CUBLAS_STATUS_INVALID_VALUE, "lda < rows gave %s", cublasLtGetStatusString(s));
    e = g;
    e.t = CUDA_R_16BF;
    e.td = CUDA_R_16F;
    s = heur(e, 16, 16, 8);
    CHECK(s == CUBLAS_STATUS_NOT_SUPPORTED, "bf16 -> f16 gave %s", cublasLtGetStatusString(s));
    e = g;
    e.bias_type = CUDA_R_16F;
    s = heur(e, 16, 16, 8);
    CHECK(s == CUBLAS_STATUS_NOT_SUPPORTED, "f16 bias with f32 D gave %s",
          cublasLtGetStatusString(s));
    e = g;
    e.comp = CUBLAS_COMPUTE_16F;
    s = heur(e, 16, 16, 8);
    CHECK(s == CUBLAS_STATUS_NOT_SUPPORTED, "compute 16F gave %s", cublasLtGetStatusString(s));
    e = g;
    e.epi = 128; /* an epilogue the emulator has no kernel for (RELU_AUX's flag) */
    s = heur(e, 16, 16, 8);
    CHECK(s == CUBLAS_STATUS_NOT_SUPPORTED, "unknown epilogue gave %s", cublasLtGetStatusString(s));
    cudaFree(d);
}

/* The heuristic's candidate list (what a caller that times them chooses from): two when asked
 * for more, #0 with workspace and #1 without, computing alike; ACT_EMU_CUBLASLT=refuse-first /
 * refuse-others refuse the runs of #0 / the others, slow-first makes a run of #0 last 2 ms
 * more by the events */
static void lt_candidates(cublasLtHandle_t lt) {
    lt_args g = {CUBLAS_OP_T, CUBLAS_OP_N, 24, 5, 40, CUDA_R_16BF, CUDA_R_16BF,
                 CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_RELU_BIAS, CUDA_R_32F, 0};
    vec A = rand_vec((size_t)40 * 24, g.t), B = rand_vec((size_t)40 * 5, g.t);
    vec bias = rand_vec(24, CUDA_R_32F), D0((size_t)24 * 5, NAN);
    void *dA = to_device(A, g.t), *dB = to_device(B, g.t), *dbias = to_device(bias, CUDA_R_32F);
    void *dD[2] = {to_device(D0, g.td), to_device(D0, g.td)};
    lt_op o;
    lt_make(g, 40, 40, 24, dbias, &o);
    cublasLtMatmulHeuristicResult_t r[8];
    cublasStatus_t s;
    int n = lt_algo(lt, o, 256, LT_WS, r, &s, 8);
    CHECK(s == CUBLAS_STATUS_SUCCESS && n == 2, "8 candidates asked for: %d (%s)", n,
          cublasLtGetStatusString(s));
    if (n != 2) return;
    CHECK(r[0].workspaceSize == ((size_t)1 << 20) && r[1].workspaceSize == 0 &&
              memcmp(&r[0].algo, &r[1].algo, sizeof r[0].algo),
          "candidates: workspaces %zu and %zu, algorithms %s", r[0].workspaceSize,
          r[1].workspaceSize, memcmp(&r[0].algo, &r[1].algo, sizeof r[0].algo) ? "differ" : "equal");
    const float one = 1.0f, zero = 0.0f;
    auto run = [&](int i, void *D) {
        return cublasLtMatmul(lt, o.op, &one, dA, o.a, dB, o.b, &zero, D, o.d, D, o.d,
                              &r[i].algo, g_lt_ws, LT_WS, g_st);
    };
    for (int i = 0; i < 2; i++) {
        s = run(i, dD[i]);
        CHECK(s == CUBLAS_STATUS_SUCCESS, "candidate #%d: %s", i, cublasLtGetStatusString(s));
    }
    CHECK(cudaStreamSynchronize(g_st) == cudaSuccess, "lt candidates sync");
    vec d0 = from_device(dD[0], g.td, D0.size()), d1 = from_device(dD[1], g.td, D0.size());
    CHECK(!memcmp(d0.data(), d1.data(), d0.size() * sizeof d0[0]) && d0[0] == d0[0],
          "the two candidates computed different results");
    const char *modes[2] = {"refuse-first", "refuse-others"};
    for (int m = 0; m < 2; m++) {
        setenv("ACT_EMU_CUBLASLT", modes[m], 1);
        cublasStatus_t s0 = run(0, dD[0]), s1 = run(1, dD[1]);
        unsetenv("ACT_EMU_CUBLASLT");
        CHECK((s0 == CUBLAS_STATUS_NOT_SUPPORTED) == (m == 0) &&
                  (s1 == CUBLAS_STATUS_NOT_SUPPORTED) == (m == 1) &&
                  (s0 == CUBLAS_STATUS_SUCCESS || s1 == CUBLAS_STATUS_SUCCESS),
              "ACT_EMU_CUBLASLT=%s: #0 %s, #1 %s", modes[m], cublasLtGetStatusString(s0),
              cublasLtGetStatusString(s1));
    }
    cudaEvent_t ev[2];
    float ms = 0;
    cudaEventCreate(&ev[0]);
    cudaEventCreate(&ev[1]);
    setenv("ACT_EMU_CUBLASLT", "slow-first", 1);
    cudaEventRecord(ev[0], g_st);
    s = run(0, dD[0]);
    cudaEventRecord(ev[1], g_st);
    unsetenv("ACT_EMU_CUBLASLT");
    CHECK(s == CUBLAS_STATUS_SUCCESS && cudaEventSynchronize(ev[1]) == cudaSuccess &&
              cudaEventElapsedTime(&ms, ev[0], ev[1]) == cudaSuccess && ms >= 2.0f,
          "ACT_EMU_CUBLASLT=slow-first: a run of #0 took %g ms by the events (%s)", ms,
          cublasLtGetStatusString(s));
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    for (void *p : {dA, dB, dbias, dD[0], dD[1]}) cudaFree(p);
}

/* ---------------- convolution ---------------- */

static cudaDataType_t cuda_of(cudnnDataType_t t) {
    return t == CUDNN_DATA_HALF ? CUDA_R_16F : t == CUDNN_DATA_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* which operands are channels-last (a filter in NHWC is KRSC); the rest are NCHW */
enum { X_NHWC = 1, W_KRSC = 2, Y_NHWC = 4, Z_NHWC = 8, ALL_NHWC = 15 };

struct conv_args {
    cudnnDataType_t dt;
    cudnnMathType_t math;
    int N, C, H, W, K, R, stride, pad, dil;
    float alpha, beta;
    int tf32;                /* the expected operand rounding */
    int fused;               /* 0 plain, 1 ReLU into a separate y, 2 identity with z == y */
    float alpha2;
    int layout = 0;          /* X_NHWC | W_KRSC | Y_NHWC | Z_NHWC; z == y takes y's format */
};

static cudnnTensorFormat_t fmt(int layout, int bit) {
    return layout & bit ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
}

/* flat index of element (n, c, y, x) of an N x C x H x W tensor, or (k, c, r, q) of a filter */
static size_t at(cudnnTensorFormat_t f, int n, int c, int y, int x, int C, int H, int W) {
    return f == CUDNN_TENSOR_NHWC ? (((size_t)n * H + y) * W + x) * C + c
                                  : (((size_t)n * C + c) * H + y) * W + x;
}

struct descs {
    cudnnTensorDescriptor_t x, y, z, b;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t c;
    cudnnActivationDescriptor_t a;
    int Ho, Wo;
};

static int make_descs(const conv_args &g, descs *d) {
    memset(d, 0, sizeof *d);
    int n, c, ok = 1;
    ok &= cudnnCreateTensorDescriptor(&d->x) == CUDNN_STATUS_SUCCESS;
    ok &= cudnnCreateTensorDescriptor(&d->y) == CUDNN_STATUS_SUCCESS;
    ok &= cudnnCreateTensorDescriptor(&d->z) == CUDNN_STATUS_SUCCESS;
    ok &= cudnnCreateTensorDescriptor(&d->b) == CUDNN_STATUS_SUCCESS;
    ok &= cudnnCreateFilterDescriptor(&d->w) == CUDNN_STATUS_SUCCESS;
    ok &= cudnnCreateConvolutionDescriptor(&d->c) == CUDNN_STATUS_SUCCESS;
    ok &= cudnnCreateActivationDescriptor(&d->a) == CUDNN_STATUS_SUCCESS;
    ok &= cudnnSetTensor4dDescriptor(d->x, fmt(g.layout, X_NHWC), g.dt, g.N, g.C, g.H, g.W) == 0;
    ok &= cudnnSetFilter4dDescriptor(d->w, g.dt, fmt(g.layout, W_KRSC), g.K, g.C, g.R, g.R) == 0;
    ok &= cudnnSetConvolution2dDescriptor(d->c, g.pad, g.pad, g.stride, g.stride, g.dil, g.dil,
                                          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT) == 0;
    ok &= cudnnSetConvolutionMathType(d->c, g.math) == 0;
    ok &= cudnnGetConvolution2dForwardOutputDim(d->c, d->x, d->w, &n, &c, &d->Ho, &d->Wo) == 0;
    int span = (g.R - 1) * g.dil + 1;
    int Ho = (g.H + 2 * g.pad - span) / g.stride + 1, Wo = (g.W + 2 * g.pad - span) / g.stride + 1;
    CHECK(ok && n == g.N && c == g.K && d->Ho == Ho && d->Wo == Wo,
          "conv descriptors: output %dx%dx%dx%d, expected %dx%dx%dx%d", n, c, d->Ho, d->Wo, g.N,
          g.K, Ho, Wo);
    ok &= cudnnSetTensor4dDescriptor(d->y, fmt(g.layout, Y_NHWC), g.dt, g.N, g.K, Ho, Wo) == 0;
    ok &= cudnnSetTensor4dDescriptor(d->z, fmt(g.layout, Z_NHWC), g.dt, g.N, g.K, Ho, Wo) == 0;
    /* the bias stays NCHW in every layout: for 1 x K x 1 x 1 both formats are the same memory */
    ok &= cudnnSetTensor4dDescriptor(d->b, CUDNN_TENSOR_NCHW, g.dt, 1, g.K, 1, 1) == 0;
    ok &= cudnnSetActivationDescriptor(d->a, g.fused == 2 ? CUDNN_ACTIVATION_IDENTITY
                                                          : CUDNN_ACTIVATION_RELU,
                                       CUDNN_PROPAGATE_NAN, 0.0) == 0;
    return ok && d->Ho == Ho && d->Wo == Wo;
}

static void free_descs(descs *d) {
    cudnnDestroyTensorDescriptor(d->x);
    cudnnDestroyTensorDescriptor(d->y);
    cudnnDestroyTensorDescriptor(d->z);
    cudnnDestroyTensorDescriptor(d->b);
    cudnnDestroyFilterDescriptor(d->w);
    cudnnDestroyConvolutionDescriptor(d->c);
    cudnnDestroyActivationDescriptor(d->a);
}

/* runs the convolution with `algo` and checks it; returns the summed deviation from the
 * reference on unrounded operands */
static double conv_run(cudnnHandle_t h, const conv_args &g, const descs &d,
                       cudnnConvolutionFwdAlgo_t algo, size_t ws_bytes) {
    cudaDataType_t t = cuda_of(g.dt);
    size_t nx = (size_t)g.N * g.C * g.H * g.W, nw = (size_t)g.K * g.C * g.R * g.R;
    size_t ny = (size_t)g.N * g.K * d.Ho * d.Wo;
    vec x = rand_vec(nx, t), w = rand_vec(nw, t), y0 = rand_vec(ny, t), z = rand_vec(ny, t);
    vec bias = rand_vec(g.K, t);
    if (!g.fused && g.beta == 0.0f)
        for (float &v : y0) v = NAN; /* beta 0 must not read y */
    void *dx = to_device(x, t), *dw = to_device(w, t), *dy = to_device(y0, t);
    void *dz = g.fused == 2 ? dy : to_device(z, t), *db = to_device(bias, t), *ws = NULL;
    if (g.fused == 2) z = y0;
    if (ws_bytes) CHECK(cudaMalloc(&ws, ws_bytes) == cudaSuccess, "workspace");
    float alpha = g.alpha, beta = g.beta, alpha2 = g.alpha2;
    cudnnStatus_t s = g.fused
        ? cudnnConvolutionBiasActivationForward(h, &alpha, d.x, dx, d.w, dw, d.c, algo, ws,
                                                ws_bytes, &alpha2, g.fused == 2 ? d.y : d.z, dz,
                                                d.b, db, d.a, d.y, dy)
        : cudnnConvolutionForward(h, &alpha, d.x, dx, d.w, dw, d.c, algo, ws, ws_bytes, &beta,
                                  d.y, dy);
    alpha = beta = alpha2 = 99.0f; /* read at the call: later changes must not matter */
    CHECK(s == CUDNN_STATUS_SUCCESS, "conv algo %d: %s", algo, cudnnGetErrorString(s));
    CHECK(cudaStreamSynchronize(g_st) == cudaSuccess, "conv sync");
    vec y = from_device(dy, t, ny);
    cudnnTensorFormat_t xf = fmt(g.layout, X_NHWC), wf = fmt(g.layout, W_KRSC);
    cudnnTensorFormat_t yf = fmt(g.layout, Y_NHWC);
    cudnnTensorFormat_t zf = g.fused == 2 ? yf : fmt(g.layout, Z_NHWC);
    cmp c;
    for (int n = 0; n < g.N; n++)
        for (int k = 0; k < g.K; k++)
            for (int oy = 0; oy < d.Ho; oy++)
                for (int ox = 0; ox < d.Wo; ox++) {
                    double sum = 0, sum_exact = 0, mag = 0;
                    for (int ci = 0; ci < g.C; ci++)
                        for (int r = 0; r < g.R; r++)
                            for (int q = 0; q < g.R; q++) {
                                int iy = oy * g.stride - g.pad + r * g.dil;
                                int ix = ox * g.stride - g.pad + q * g.dil;
                                if (iy < 0 || iy >= g.H || ix < 0 || ix >= g.W) continue;
                                float a = x[at(xf, n, ci, iy, ix, g.C, g.H, g.W)];
                                float b = w[at(wf, k, ci, r, q, g.C, g.R, g.R)];
                                sum_exact += (double)a * b;
                                if (g.tf32) {
                                    a = tf32(a);
                                    b = tf32(b);
                                }
                                sum += (double)a * b;
                                mag += fabs((double)a * b);
                            }
                    size_t i = at(yf, n, k, oy, ox, g.K, d.Ho, d.Wo);
                    double add = 0;
                    if (g.fused)
                        add = g.alpha2 * (double)z[at(zf, n, k, oy, ox, g.K, d.Ho, d.Wo)] + bias[k];
                    else if (g.beta != 0.0f)
                        add = g.beta * (double)y0[i];
                    double want = g.alpha * sum + add, exact = g.alpha * sum_exact + add;
                    double scale = fabs(g.alpha) * mag + fabs(add);
                    if (g.fused == 1) {
                        want = want > 0 ? want : 0;
                        exact = exact > 0 ? exact : 0;
                    }
                    c.one(y[i], want, scale, exact, out_ulp(t));
                }
    CHECK(c.bad == 0, "conv %s math %d N%d C%d %dx%d K%d k%d s%d p%d d%d beta %g fused %d "
          "layout %d algo %d: %d of %zu wrong, worst %.2f x tolerance", tname(t), g.math, g.N,
          g.C, g.H, g.W, g.K, g.R, g.stride, g.pad, g.dil, g.beta, g.fused, g.layout, algo, c.bad,
          ny, c.worst);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dy);
    if (dz != dy) cudaFree(dz);
    cudaFree(db);
    cudaFree(ws);
    return c.dev_exact;
}

/* every algorithm the heuristics offer, each checked; returns the first one's deviation */
static double conv_case(cudnnHandle_t h, const conv_args &g) {
    descs d;
    double dev = -1;
    if (!make_descs(g, &d)) {
        free_descs(&d);
        return dev;
    }
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0, usable = 0;
    cudnnStatus_t s = cudnnGetConvolutionForwardAlgorithm_v7(
        h, d.x, d.w, d.c, d.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf);
    CHECK(s == CUDNN_STATUS_SUCCESS && got >= 2, "heuristics: %s, %d entries",
          cudnnGetErrorString(s), got);
    for (int i = 0; i < got; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
        size_t ws = 0;
        s = cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.c, d.y, perf[i].algo, &ws);
        CHECK(s == CUDNN_STATUS_SUCCESS && ws == perf[i].memory,
              "workspace query for algo %d: %s, %zu bytes vs %zu in the heuristics",
              perf[i].algo, cudnnGetErrorString(s), ws, perf[i].memory);
        if (g.fused && perf[i].algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) continue;
        usable++;
        double e = conv_run(h, g, d, perf[i].algo, ws);
        if (dev < 0) dev = e;
    }
    CHECK(usable > 0, "no usable algorithm for conv %dx%d k%d s%d", g.H, g.W, g.R, g.stride);
    free_descs(&d);
    return dev;
}

static void conv_tests(cudnnHandle_t h) {
    struct geo { int C, H, W, K, R, stride, pad, dil; };
    const geo geos[] = {{3, 11, 10, 5, 1, 1, 0, 1}, {3, 11, 10, 5, 1, 2, 0, 1},
                        {3, 11, 10, 5, 3, 1, 1, 1}, {3, 11, 10, 5, 3, 2, 1, 1},
                        {4, 15, 13, 6, 7, 2, 3, 1}, {3, 12, 11, 4, 3, 1, 2, 2}};
    const cudnnDataType_t dts[] = {CUDNN_DATA_FLOAT, CUDNN_DATA_HALF, CUDNN_DATA_BFLOAT16};
    for (cudnnDataType_t dt : dts)
        for (const geo &q : geos)
            for (int acc = 0; acc < 2; acc++) {
                cudnnMathType_t math = dt == CUDNN_DATA_FLOAT ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
                conv_case(h, {dt, math, 2, q.C, q.H, q.W, q.K, q.R, q.stride, q.pad, q.dil,
                              acc ? 1.0f : 0.7f, acc ? 1.0f : 0.0f, 0, 0, 0.0f});
            }

    /* TF32: FLOAT data under the default math rounds x and w; FMA math does not */
    conv_args g = {CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, 1, 16, 9, 9, 8, 3, 1, 1, 1,
                   1.0f, 0.0f, 0, 0, 0.0f};
    double exact = conv_case(h, g);
    g.math = CUDNN_DEFAULT_MATH;
    g.tf32 = 1;
    double rounded = conv_case(h, g);
    CHECK(rounded > 10 * exact, "conv TF32 rounding has no visible effect: %g vs %g (FMA)",
          rounded, exact);

    /* fused: ReLU(alpha1 conv + alpha2 z + bias); identity with z == y (a residual in place) */
    conv_case(h, {CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, 2, 3, 10, 9, 5, 3, 1, 1, 1, 0.9f, 0.0f, 0, 1,
                  0.6f});
    conv_case(h, {CUDNN_DATA_HALF, CUDNN_TENSOR_OP_MATH, 2, 3, 10, 9, 5, 3, 2, 1, 1, 1.0f, 0.0f,
                  0, 2, 1.0f});
    conv_case(h, {CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_OP_MATH, 1, 4, 8, 8, 6, 1, 1, 0, 1, 1.0f,
                  0.0f, 0, 1, 1.0f});
}

/* channels-last operands, as the engine's bf16/fp16 trunk uses them: the same math indexed by
 * each operand's own format. Geometries are the trunk's kinds (1x1, 3x3 stride 2, the 7x7
 * stride 2 pad 3 stem on C = 3); each runs plain (alpha 0.8, beta 0.5 reads y) and fused without
 * a residual, with a separate z and with z == y, all operands NHWC. Then mixed layouts, where
 * each operand's format must be honoured on its own. */
static void nhwc_tests(cudnnHandle_t h) {
    struct geo { int C, H, W, K, R, stride, pad; };
    const geo geos[] = {{5, 9, 8, 6, 1, 1, 0}, {4, 11, 10, 6, 3, 2, 1}, {3, 15, 13, 5, 7, 2, 3}};
    const cudnnDataType_t dts[] = {CUDNN_DATA_FLOAT, CUDNN_DATA_HALF, CUDNN_DATA_BFLOAT16};
    for (cudnnDataType_t dt : dts)
        for (const geo &q : geos) {
            cudnnMathType_t math = dt == CUDNN_DATA_FLOAT ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
            conv_args g = {dt, math, 2, q.C, q.H, q.W, q.K, q.R, q.stride, q.pad, 1,
                           0.8f, 0.5f, 0, 0, 0.0f, ALL_NHWC};
            conv_case(h, g);
            g.alpha = 1.0f;
            g.beta = 0.0f;
            g.fused = 1;
            conv_case(h, g); /* ReLU, alpha2 0: no residual */
            g.alpha2 = 0.7f;
            conv_case(h, g);
            g.fused = 2;
            g.alpha2 = 1.0f;
            conv_case(h, g);
        }

    /* TF32 operand rounding applies to gathered NHWC operands as to NCHW ones */
    conv_case(h, {CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH, 1, 16, 9, 9, 8, 3, 2, 1, 1, 1.0f, 0.0f,
                  1, 0, 0.0f, ALL_NHWC});
    /* mixed: NHWC x into NCHW y (fp32's direct output), KRSC w alone, z and y in different formats */
    conv_case(h, {CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, 2, 3, 15, 13, 5, 7, 2, 3, 1, 1.0f, 1.0f, 0,
                  0, 0.0f, X_NHWC});
    conv_case(h, {CUDNN_DATA_HALF, CUDNN_TENSOR_OP_MATH, 2, 4, 11, 10, 6, 3, 2, 1, 1, 1.0f, 0.0f,
                  0, 0, 0.0f, W_KRSC});
    conv_case(h, {CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_OP_MATH, 2, 4, 11, 10, 6, 3, 2, 1, 1, 0.9f,
                  0.0f, 0, 1, 0.6f, X_NHWC | Y_NHWC});
    conv_case(h, {CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, 2, 5, 9, 8, 6, 1, 1, 0, 1, 1.0f, 0.0f, 0, 1,
                  1.0f, W_KRSC | Z_NHWC});
    conv_case(h, {CUDNN_DATA_HALF, CUDNN_TENSOR_OP_MATH, 1, 3, 15, 13, 5, 7, 2, 3, 1, 1.0f, 0.0f,
                  0, 1, 1.0f, X_NHWC | W_KRSC | Z_NHWC});
}

/* a [N][C][H][W] tensor (or KCRS filter) rearranged to [N][H][W][C] (KRSC), or back (!to_nhwc) */
static vec relayout(const vec &a, int N, int C, int H, int W, int to_nhwc) {
    vec b(a.size());
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++) {
                    size_t i = at(CUDNN_TENSOR_NCHW, n, c, y, x, C, H, W);
                    size_t j = at(CUDNN_TENSOR_NHWC, n, c, y, x, C, H, W);
                    if (to_nhwc) b[j] = a[i];
                    else b[i] = a[j];
                }
    return b;
}

/* The layout is indexing only: the same operands given all-NCHW and all-NHWC produce bit-identical
 * outputs, in every data type and math mode, plain (beta reads y) and fused with a residual. So
 * an engine that changes only its layout sees exactly the same convolution numbers. */
static void layout_identity(cudnnHandle_t h) {
    struct mode { cudnnDataType_t dt; cudnnMathType_t math; };
    const mode modes[] = {{CUDNN_DATA_FLOAT, CUDNN_FMA_MATH}, {CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH},
                          {CUDNN_DATA_HALF, CUDNN_TENSOR_OP_MATH},
                          {CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_OP_MATH}};
    for (const mode &m : modes)
        for (int fused = 0; fused < 2; fused++) {
            conv_args g = {m.dt, m.math, 2, 3, 15, 13, 5, 7, 2, 3, 1, 0.8f, fused ? 0.0f : 0.5f,
                           0, fused, 0.7f};
            descs d[2];
            int ok = make_descs(g, &d[0]);
            g.layout = ALL_NHWC;
            ok &= make_descs(g, &d[1]);
            cudaDataType_t t = cuda_of(m.dt);
            int Ho = d[0].Ho, Wo = d[0].Wo;
            vec x = rand_vec((size_t)g.N * g.C * g.H * g.W, t);
            vec w = rand_vec((size_t)g.K * g.C * g.R * g.R, t);
            vec y0 = rand_vec((size_t)g.N * g.K * Ho * Wo, t);
            vec z = rand_vec(y0.size(), t), bias = rand_vec(g.K, t), y[2];
            for (int l = 0; ok && l < 2; l++) {
                vec xl = l ? relayout(x, g.N, g.C, g.H, g.W, 1) : x;
                vec wl = l ? relayout(w, g.K, g.C, g.R, g.R, 1) : w;
                vec yl = l ? relayout(y0, g.N, g.K, Ho, Wo, 1) : y0;
                vec zl = l ? relayout(z, g.N, g.K, Ho, Wo, 1) : z;
                void *dx = to_device(xl, t), *dw = to_device(wl, t), *dy = to_device(yl, t);
                void *dz = to_device(zl, t), *db = to_device(bias, t);
                float alpha = g.alpha, beta = g.beta, alpha2 = g.alpha2;
                cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
                cudnnStatus_t s = fused
                    ? cudnnConvolutionBiasActivationForward(h, &alpha, d[l].x, dx, d[l].w, dw,
                                                            d[l].c, algo, NULL, 0, &alpha2, d[l].z,
                                                            dz, d[l].b, db, d[l].a, d[l].y, dy)
                    : cudnnConvolutionForward(h, &alpha, d[l].x, dx, d[l].w, dw, d[l].c, algo,
                                              NULL, 0, &beta, d[l].y, dy);
                CHECK(s == CUDNN_STATUS_SUCCESS && cudaStreamSynchronize(g_st) == cudaSuccess,
                      "layout identity: %s", cudnnGetErrorString(s));
                y[l] = from_device(dy, t, y0.size());
                if (l) y[l] = relayout(y[l], g.N, g.K, Ho, Wo, 0);
                cudaFree(dx);
                cudaFree(dw);
                cudaFree(dy);
                cudaFree(dz);
                cudaFree(db);
            }
            size_t differ = 0;
            for (size_t i = 0; ok && i < y0.size(); i++)
                differ += memcmp(&y[0][i], &y[1][i], sizeof(float)) != 0;
            CHECK(ok && differ == 0, "layout identity %s math %d fused %d: %zu of %zu outputs "
                  "differ between NCHW and NHWC", tname(t), m.math, fused, differ, y0.size());
            free_descs(&d[0]);
            free_descs(&d[1]);
        }
}

/* the heuristics' shape: what conv.cu's filtering depends on */
static void heuristic_tests(cudnnHandle_t h) {
    conv_args f = {CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, 1, 3, 9, 9, 4, 3, 1, 1, 1, 1, 0, 0, 0, 0};
    descs d;
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0, tensor_op = 0, zero_ws = 0;
    if (make_descs(f, &d)) {
        cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.c, d.y, 8, &got, perf);
        CHECK(got >= 3 && perf[0].algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED &&
              perf[0].status == CUDNN_STATUS_SUCCESS,
              "FLOAT 3x3 stride 1: expected a usable WINOGRAD_NONFUSED entry first");
        int one = 0;
        cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.c, d.y, 1, &one, perf);
        CHECK(one == 1, "a request for 1 entry returned %d", one);
    }
    free_descs(&d);
    f.dt = CUDNN_DATA_BFLOAT16;
    if (make_descs(f, &d)) {
        cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.c, d.y, 8, &got, perf);
        for (int i = 0; i < got; i++) {
            tensor_op += perf[i].mathType == CUDNN_TENSOR_OP_MATH;
            zero_ws += perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM &&
                       perf[i].memory == 0 && perf[i].status == CUDNN_STATUS_SUCCESS;
        }
        CHECK(tensor_op > 0 && zero_ws > 0,
              "BFLOAT16: %d tensor-op entries, %d usable IMPLICIT_GEMM without workspace",
              tensor_op, zero_ws);
    }
    free_descs(&d);
}

/* Find (cudnnFindConvolutionForwardAlgorithmEx): the heuristics' entries ranked (reversed under
 * ACT_EMU_CUDNN=find-reverse), runnable ones first with ascending times, an entry whose
 * workspace exceeds the one given is ALLOC_FAILED, y is overwritten (NaN), =find-fail fails the
 * call, and inside a capture the call is refused (it waits for the stream) */
static void find_tests(cudnnHandle_t h) {
    conv_args f = {CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, 2, 3, 9, 9, 4, 3, 1, 1, 1, 1, 0, 0, 0, 0};
    descs d;
    if (!make_descs(f, &d)) {
        free_descs(&d);
        return;
    }
    cudnnConvolutionFwdAlgoPerf_t heur[8], perf[8];
    int nh = 0, got = 0;
    cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.c, d.y, 8, &nh, heur);
    size_t most = 0;
    for (int i = 0; i < nh; i++)
        if (heur[i].status == CUDNN_STATUS_SUCCESS && heur[i].memory > most) most = heur[i].memory;
    size_t ny = (size_t)f.N * f.K * d.Ho * d.Wo;
    void *dx = to_device(rand_vec((size_t)f.N * f.C * f.H * f.W, CUDA_R_32F), CUDA_R_32F);
    void *dw = to_device(rand_vec((size_t)f.K * f.C * f.R * f.R, CUDA_R_32F), CUDA_R_32F);
    void *dy = to_device(rand_vec(ny, CUDA_R_32F), CUDA_R_32F), *ws = NULL;
    CHECK(cudaMalloc(&ws, most) == cudaSuccess, "find workspace");
    for (int rev = 0; rev < 2; rev++) {
        if (rev) setenv("ACT_EMU_CUDNN", "find-reverse", 1);
        cudnnStatus_t s = cudnnFindConvolutionForwardAlgorithmEx(h, d.x, dx, d.w, dw, d.c, d.y,
                                                                  dy, 8, &got, perf, ws, most);
        int first = -1;
        for (int i = 0; i < nh && first < 0; i++) {
            int j = rev ? nh - 1 - i : i;
            if (heur[j].status == CUDNN_STATUS_SUCCESS) first = j;
        }
        int ranked = got < 2 || perf[1].status != CUDNN_STATUS_SUCCESS ||
                     perf[1].time > perf[0].time;
        CHECK(s == CUDNN_STATUS_SUCCESS && got == nh && first >= 0 &&
                  perf[0].algo == heur[first].algo && perf[0].time > 0 && ranked,
              "find (reverse %d): %s, %d of %d entries, first algo %d (expected %d)", rev,
              cudnnGetErrorString(s), got, nh, got ? perf[0].algo : -1,
              first >= 0 ? heur[first].algo : -1);
        vec y = from_device(dy, CUDA_R_32F, ny);
        size_t nan = 0;
        for (float v : y) nan += v != v;
        CHECK(nan == ny, "find left %zu of %zu elements of y unwritten", ny - nan, ny);
    }
    unsetenv("ACT_EMU_CUDNN");
    /* no workspace: every entry that needs some fails, after the runnable ones */
    cudnnStatus_t s = cudnnFindConvolutionForwardAlgorithmEx(h, d.x, dx, d.w, dw, d.c, d.y, dy, 8,
                                                              &got, perf, NULL, 0);
    int order_ok = s == CUDNN_STATUS_SUCCESS && got > 0 && perf[0].memory == 0, seen_fail = 0;
    for (int i = 0; i < got; i++) {
        int ok = perf[i].status == CUDNN_STATUS_SUCCESS;
        if (!ok) seen_fail = 1;
        if (ok && (seen_fail || perf[i].memory > 0)) order_ok = 0;
        if (!ok && perf[i].memory > 0 && perf[i].status != CUDNN_STATUS_ALLOC_FAILED) order_ok = 0;
    }
    CHECK(order_ok && seen_fail, "find without workspace: %s, %d entries, order or status wrong",
          cudnnGetErrorString(s), got);
    setenv("ACT_EMU_CUDNN", "find-fail", 1);
    s = cudnnFindConvolutionForwardAlgorithmEx(h, d.x, dx, d.w, dw, d.c, d.y, dy, 8, &got, perf,
                                               ws, most);
    unsetenv("ACT_EMU_CUDNN");
    CHECK(s != CUDNN_STATUS_SUCCESS, "ACT_EMU_CUDNN=find-fail: find succeeded");
    /* inside a capture: refused (the emulator also reports the forbidden synchronize) */
    cudaGraph_t g = NULL;
    if (cudaStreamBeginCapture(g_st, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
        s = cudnnFindConvolutionForwardAlgorithmEx(h, d.x, dx, d.w, dw, d.c, d.y, dy, 8, &got,
                                                   perf, ws, most);
        cudaStreamEndCapture(g_st, &g);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        CHECK(s != CUDNN_STATUS_SUCCESS, "find inside a capture succeeded");
    }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dy);
    cudaFree(ws);
    free_descs(&d);
}

static void conv_errors(cudnnHandle_t h) {
    conv_args g = {CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, 1, 3, 9, 9, 4, 3, 1, 1, 1, 1, 0, 0, 0, 0};
    descs d;
    if (!make_descs(g, &d)) {
        free_descs(&d);
        return;
    }
    vec v = rand_vec(1024, CUDA_R_32F);
    void *dx = to_device(v, CUDA_R_32F), *dy = to_device(v, CUDA_R_32F), *ws = NULL;
    float one = 1.0f, zero = 0.0f;
    size_t need = 0;
    cudnnStatus_t s = cudnnGetConvolutionForwardWorkspaceSize(
        h, d.x, d.w, d.c, d.y, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, &need);
    CHECK(s == CUDNN_STATUS_SUCCESS && need > 0, "PRECOMP workspace: %s, %zu bytes",
          cudnnGetErrorString(s), need);
    CHECK(cudaMalloc(&ws, need) == cudaSuccess, "workspace");
    s = cudnnConvolutionForward(h, &one, d.x, dx, d.w, dx, d.c,
                                CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, ws, need - 1,
                                &zero, d.y, dy);
    CHECK(s == CUDNN_STATUS_BAD_PARAM, "a workspace 1 byte short gave %s", cudnnGetErrorString(s));
    s = cudnnConvolutionForward(h, &one, d.x, dx, d.w, dx, d.c,
                                CUDNN_CONVOLUTION_FWD_ALGO_FFT, ws, need, &zero, d.y, dy);
    CHECK(s == CUDNN_STATUS_NOT_SUPPORTED, "FFT gave %s", cudnnGetErrorString(s));
    s = cudnnConvolutionBiasActivationForward(
        h, &one, d.x, dx, d.w, dx, d.c, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero,
        d.y, dy, d.b, dx, d.a, d.y, dy);
    CHECK(s == CUDNN_STATUS_SUCCESS, "fused ReLU with IMPLICIT_GEMM gave %s", cudnnGetErrorString(s));
    CHECK(cudaStreamSynchronize(g_st) == cudaSuccess, "sync");
    cudnnActivationDescriptor_t idn;
    cudnnCreateActivationDescriptor(&idn);
    cudnnSetActivationDescriptor(idn, CUDNN_ACTIVATION_IDENTITY, CUDNN_NOT_PROPAGATE_NAN, 0.0);
    s = cudnnConvolutionBiasActivationForward(
        h, &one, d.x, dx, d.w, dx, d.c, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero,
        d.y, dy, d.b, dx, idn, d.y, dy);
    CHECK(s == CUDNN_STATUS_NOT_SUPPORTED, "fused identity with IMPLICIT_GEMM gave %s",
          cudnnGetErrorString(s));
    cudnnDestroyActivationDescriptor(idn);
    cudnnTensorDescriptor_t wrong;
    cudnnCreateTensorDescriptor(&wrong);
    cudnnSetTensor4dDescriptor(wrong, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 4, d.Ho + 1, d.Wo);
    s = cudnnConvolutionForward(h, &one, d.x, dx, d.w, dx, d.c,
                                CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero, wrong, dy);
    CHECK(s == CUDNN_STATUS_BAD_PARAM, "y of the wrong shape gave %s", cudnnGetErrorString(s));
    cudnnDestroyTensorDescriptor(wrong);
    /* NHWC is emulated for the emulated types only; a format that is no cuDNN value is refused */
    cudnnTensorDescriptor_t td;
    cudnnFilterDescriptor_t fd;
    cudnnCreateTensorDescriptor(&td);
    cudnnCreateFilterDescriptor(&fd);
    CHECK(cudnnSetTensor4dDescriptor(td, CUDNN_TENSOR_NHWC, CUDNN_DATA_HALF, 1, 3, 9, 9) ==
              CUDNN_STATUS_SUCCESS, "NHWC HALF tensor refused");
    CHECK(cudnnSetTensor4dDescriptor(td, CUDNN_TENSOR_NHWC, CUDNN_DATA_DOUBLE, 1, 3, 9, 9) ==
              CUDNN_STATUS_NOT_SUPPORTED, "NHWC DOUBLE tensor not NOT_SUPPORTED");
    CHECK(cudnnSetTensor4dDescriptor(td, CUDNN_TENSOR_NHWC, CUDNN_DATA_INT8, 1, 3, 9, 9) ==
              CUDNN_STATUS_NOT_SUPPORTED, "NHWC INT8 tensor not NOT_SUPPORTED");
    CHECK(cudnnSetFilter4dDescriptor(fd, CUDNN_DATA_INT32, CUDNN_TENSOR_NHWC, 4, 3, 3, 3) ==
              CUDNN_STATUS_NOT_SUPPORTED, "NHWC INT32 filter not NOT_SUPPORTED");
    CHECK(cudnnSetTensor4dDescriptor(td, (cudnnTensorFormat_t)2, CUDNN_DATA_FLOAT, 1, 3, 9, 9) ==
              CUDNN_STATUS_BAD_PARAM, "tensor format 2 not BAD_PARAM");
    cudnnDestroyFilterDescriptor(fd);
    cudnnDestroyTensorDescriptor(td);

    /* ACT_EMU_CUDNN=none: cuDNN offers nothing */
    setenv("ACT_EMU_CUDNN", "none", 1);
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0, usable = 0;
    s = cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.c, d.y, 8, &got, perf);
    for (int i = 0; i < got; i++) usable += perf[i].status != CUDNN_STATUS_NOT_SUPPORTED;
    CHECK(s == CUDNN_STATUS_SUCCESS && got > 0 && usable == 0,
          "ACT_EMU_CUDNN=none: %s, %d entries, %d not NOT_SUPPORTED", cudnnGetErrorString(s), got,
          usable);
    s = cudnnConvolutionForward(h, &one, d.x, dx, d.w, dx, d.c,
                                CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero, d.y, dy);
    CHECK(s == CUDNN_STATUS_NOT_SUPPORTED, "ACT_EMU_CUDNN=none: forward gave %s",
          cudnnGetErrorString(s));
    unsetenv("ACT_EMU_CUDNN");
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(ws);
    free_descs(&d);
}

/* ---------------- graph replays after a free ---------------- */

static cudnnHandle_t g_dh;
static cublasHandle_t g_bh;
static cublasLtHandle_t g_lt;
static const char *kStale = "points into device memory freed since the call was recorded "
                            "(a graph replayed after cudaFree?)";

/* a 3x3 convolution (fp32, PRECOMP_GEMM, which needs a workspace) and its buffers */
struct conv_setup {
    descs d;
    void *x, *w, *y, *bias, *ws;
    size_t need, ny;
};
static int conv_setup_make(conv_setup *c) {
    conv_args g = {CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, 2, 3, 9, 9, 4, 3, 1, 1, 1, 1, 0, 0, 0, 0};
    if (!make_descs(g, &c->d)) return 0;
    c->ny = (size_t)2 * 4 * c->d.Ho * c->d.Wo;
    c->x = to_device(rand_vec(2 * 3 * 9 * 9, CUDA_R_32F), CUDA_R_32F);
    c->w = to_device(rand_vec(4 * 3 * 3 * 3, CUDA_R_32F), CUDA_R_32F);
    c->y = to_device(rand_vec(c->ny, CUDA_R_32F), CUDA_R_32F);
    c->bias = to_device(rand_vec(4, CUDA_R_32F), CUDA_R_32F);
    c->ws = NULL;
    return cudnnGetConvolutionForwardWorkspaceSize(g_dh, c->d.x, c->d.w, c->d.c, c->d.y,
                                                   CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                                                   &c->need) == CUDNN_STATUS_SUCCESS &&
           c->need > 0 && cudaMalloc(&c->ws, c->need) == cudaSuccess;
}
/* the plain convolution, or the fused one with bias and ReLU (z = y, alpha2 0) */
static int conv_call(const conv_setup &c, int fused) {
    float one = 1.0f, zero = 0.0f;
    cudnnConvolutionFwdAlgo_t a = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    cudnnStatus_t s = fused
        ? cudnnConvolutionBiasActivationForward(g_dh, &one, c.d.x, c.x, c.d.w, c.w, c.d.c, a,
                                                c.ws, c.need, &zero, c.d.y, c.y, c.d.b, c.bias,
                                                c.d.a, c.d.y, c.y)
        : cudnnConvolutionForward(g_dh, &one, c.d.x, c.x, c.d.w, c.w, c.d.c, a, c.ws, c.need,
                                  &zero, c.d.y, c.y);
    return s == CUDNN_STATUS_SUCCESS;
}
/* 8x8x8 fp32 GEMM C = A B */
static int gemm_call(const void *A, const void *B, void *C) {
    float one = 1.0f, zero = 0.0f;
    return cublasGemmEx(g_bh, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, A, CUDA_R_32F, 8, B,
                        CUDA_R_32F, 8, &zero, C, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
}
/* what `calls` enqueue on g_st, captured and instantiated; NULL when something failed */
static cudaGraphExec_t record(const std::function<int(void)> &calls) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    if (cudaStreamBeginCapture(g_st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return NULL;
    int ok = calls();
    if (cudaStreamEndCapture(g_st, &g) == cudaSuccess && ok) cudaGraphInstantiate(&ex, g, 0);
    cudaGraphDestroy(g);
    return ex;
}
/* replays ex once; 1 when the replay faulted, 2 when something before it failed */
static int replay_faults(cudaGraphExec_t ex) {
    if (!ex || cudaGraphLaunch(ex, g_st) != cudaSuccess) return 2;
    return cudaStreamSynchronize(g_st) == cudaErrorIllegalAddress;
}

/* the engine's workspace regrow without dropping its graphs: free, allocate again (the
 * allocator may hand back the same address), replay */
static int child_conv_ws(void) {
    conv_setup c;
    if (!conv_setup_make(&c)) return 2;
    cudaGraphExec_t ex = record([&] { return conv_call(c, 0); });
    void *again = NULL;
    if (cudaFree(c.ws) != cudaSuccess || cudaMalloc(&again, c.need) != cudaSuccess) return 2;
    return replay_faults(ex);
}
static int child_fused_bias(void) {
    conv_setup c;
    if (!conv_setup_make(&c)) return 2;
    cudaGraphExec_t ex = record([&] { return conv_call(c, 1); });
    if (cudaFree(c.bias) != cudaSuccess) return 2;
    return replay_faults(ex);
}
static int child_gemm_operand(void) {
    void *A = to_device(rand_vec(64, CUDA_R_32F), CUDA_R_32F);
    void *B = to_device(rand_vec(64, CUDA_R_32F), CUDA_R_32F), *C = NULL;
    if (cudaMalloc(&C, 64 * sizeof(float)) != cudaSuccess) return 2;
    cudaGraphExec_t ex = record([&] { return gemm_call(A, B, C); });
    if (cudaFree(B) != cudaSuccess) return 2;
    return replay_faults(ex);
}
static int child_lt_workspace(void) {
    lt_args g = {CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F,
                 CUBLASLT_EPILOGUE_DEFAULT, -1, 0};
    void *A = to_device(rand_vec(64, CUDA_R_32F), CUDA_R_32F), *ws = NULL;
    lt_op o;
    cublasLtMatmulHeuristicResult_t r;
    cublasStatus_t s;
    if (!lt_make(g, 8, 8, 8, NULL, &o) || lt_algo(g_lt, o, 16, LT_WS, &r, &s) != 1 ||
        r.workspaceSize == 0 || cudaMalloc(&ws, r.workspaceSize) != cudaSuccess)
        return 2;
    float one = 1.0f, zero = 0.0f;
    cudaGraphExec_t ex = record([&] {
        return cublasLtMatmul(g_lt, o.op, &one, A, o.a, A, o.b, &zero, A, o.d, A, o.d, &r.algo,
                              ws, r.workspaceSize, g_st) == CUBLAS_STATUS_SUCCESS;
    });
    if (cudaFree(ws) != cudaSuccess) return 2;
    return replay_faults(ex);
}

static void stale_tests(void) {
    /* everything live: replays run, and give what the eager calls gave */
    conv_setup c;
    if (!conv_setup_make(&c)) {
        CHECK(0, "convolution setup");
        return;
    }
    void *A = to_device(rand_vec(64, CUDA_R_32F), CUDA_R_32F);
    void *B = to_device(rand_vec(64, CUDA_R_32F), CUDA_R_32F), *C = NULL;
    CHECK(cudaMalloc(&C, 64 * sizeof(float)) == cudaSuccess, "C");
    CHECK(conv_call(c, 1) && gemm_call(A, B, C) && cudaStreamSynchronize(g_st) == cudaSuccess,
          "eager conv and gemm");
    vec y1 = from_device(c.y, CUDA_R_32F, c.ny), c1 = from_device(C, CUDA_R_32F, 64);
    cudaGraphExec_t ex = record([&] { return conv_call(c, 1) && gemm_call(A, B, C); });
    CHECK(ex != NULL, "capture of a conv and a gemm");
    cudaMemsetAsync(c.y, 0xff, c.ny * sizeof(float), g_st);   /* NaN unless the replay writes */
    cudaMemsetAsync(C, 0xff, 64 * sizeof(float), g_st);
    for (int r = 0; r < 2; r++) cudaGraphLaunch(ex, g_st);
    CHECK(cudaStreamSynchronize(g_st) == cudaSuccess, "replays with everything live faulted");
    vec y2 = from_device(c.y, CUDA_R_32F, c.ny), c2 = from_device(C, CUDA_R_32F, 64);
    CHECK(memcmp(y1.data(), y2.data(), c.ny * sizeof(float)) == 0, "replayed conv differs");
    CHECK(memcmp(c1.data(), c2.data(), 64 * sizeof(float)) == 0, "replayed gemm differs");
    cudaGraphExecDestroy(ex);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaFree(c.x);
    cudaFree(c.w);
    cudaFree(c.y);
    cudaFree(c.bias);
    cudaFree(c.ws);
    free_descs(&c.d);
    /* a freed operand or workspace: the replay faults instead of running (a conv named with its
     * algorithm, IMPLICIT_PRECOMP_GEMM = 1, and math type, FMA = 3; a cuBLASLt matmul with its
     * candidate) */
    in_child("conv replayed after its workspace was freed and reallocated", child_conv_ws,
             {"FAULT in cudnnConvolutionForward algo 1 math 3: the workspace (", kStale});
    in_child("fused conv replayed after its bias was freed", child_fused_bias,
             {"FAULT in cudnnConvolutionBiasActivationForward algo 1 math 3: bias (", kStale});
    in_child("gemm replayed after operand B was freed", child_gemm_operand,
             {"FAULT in cublasGemmEx: operand B (", kStale});
    in_child("cuBLASLt matmul replayed after its workspace was freed", child_lt_workspace,
             {"FAULT in cublasLtMatmul #0: the workspace (", kStale});
}

/* last: a fault is sticky */
static void fault_tests(cublasHandle_t bh, cublasLtHandle_t lt, cudnnHandle_t dh) {
    vec v = rand_vec(256, CUDA_R_32F);
    void *dev = to_device(v, CUDA_R_32F);
    float one = 1.0f, zero = 0.0f;
    fprintf(stderr, "selftest_libs: three expected faults follow\n");
    {
        /* the bias in host memory: the heuristic never reads it, the call must */
        lt_args g = {CUBLAS_OP_T, CUBLAS_OP_N, 4, 4, 4, CUDA_R_32F, CUDA_R_32F,
                     CUBLAS_COMPUTE_32F, CUBLASLT_EPILOGUE_BIAS, CUDA_R_32F, 0};
        const float *hbias = v.data();
        lt_op o;
        cublasLtMatmulHeuristicResult_t r;
        cublasStatus_t s;
        if (lt_make(g, 4, 4, 4, hbias, &o) && lt_algo(lt, o, 16, LT_WS, &r, &s) == 1) {
            s = cublasLtMatmul(lt, o.op, &one, dev, o.a, dev, o.b, &zero, dev, o.d, dev, o.d,
                               &r.algo, g_lt_ws, LT_WS, g_st);
            CHECK(s == CUBLAS_STATUS_EXECUTION_FAILED, "lt bias in host memory gave %s",
                  cublasLtGetStatusString(s));
        } else {
            CHECK(0, "no algorithm for the lt fault case");
        }
    }
    cublasStatus_t s = cublasGemmEx(bh, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, dev, CUDA_R_32F,
                                    4, dev, CUDA_R_32F, 4, &zero, v.data(), CUDA_R_32F, 4,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    CHECK(s == CUBLAS_STATUS_EXECUTION_FAILED, "gemm into host memory gave %s",
          cublasGetStatusString(s));
    conv_args g = {CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, 1, 3, 5, 5, 2, 1, 1, 0, 1, 1, 0, 0, 0, 0};
    descs d;
    if (make_descs(g, &d)) {
        cudnnStatus_t c = cudnnConvolutionForward(dh, &one, d.x, v.data(), d.w, dev, d.c,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL,
                                                  0, &zero, d.y, dev);
        CHECK(c == CUDNN_STATUS_EXECUTION_FAILED, "conv from host memory gave %s",
              cudnnGetErrorString(c));
    }
    free_descs(&d);
    cudaFree(dev);                  /* fails (the fault is sticky) but releases the memory */
}

int main(void) {
    seed_rng("selftest_libs");
    cublasHandle_t bh = NULL;
    cudnnHandle_t dh = NULL;
    void *bws = NULL;
    if (cudaStreamCreate(&g_st) != cudaSuccess || cublasCreate(&bh) != CUBLAS_STATUS_SUCCESS ||
        cudnnCreate(&dh) != CUDNN_STATUS_SUCCESS || cudaMalloc(&bws, 1 << 20) != cudaSuccess) {
        fprintf(stderr, "selftest_libs: cannot create a stream, handles and a workspace\n");
        return 1;
    }
    CHECK(cublasSetStream(bh, g_st) == CUBLAS_STATUS_SUCCESS, "cublasSetStream");
    CHECK(cublasSetWorkspace(bh, bws, 1 << 20) == CUBLAS_STATUS_SUCCESS, "cublasSetWorkspace");
    CHECK(cudnnSetStream(dh, g_st) == CUDNN_STATUS_SUCCESS, "cudnnSetStream");
    gemm_tests(bh);
    gemm_errors(bh);
    cublasLtHandle_t lt = NULL;
    CHECK(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate");
    CHECK(cudaMalloc(&g_lt_ws, LT_WS) == cudaSuccess, "lt workspace");
    lt_tests(lt);
    lt_errors(lt);
    lt_candidates(lt);
    heuristic_tests(dh);
    find_tests(dh);
    conv_tests(dh);
    nhwc_tests(dh);
    layout_identity(dh);
    conv_errors(dh);
    g_dh = dh;
    g_bh = bh;
    g_lt = lt;
    stale_tests();
    fault_tests(bh, lt, dh);
    cublasLtDestroy(lt);
    cublasDestroy(bh);
    cudnnDestroy(dh);
    cudaFree(bws);
    cudaStreamDestroy(g_st);
    printf("selftest_libs: %d of %d checks failed\n", g_fail, g_checks);
    return g_fail ? 1 : 0;
}
