/* emu_blaslt.cc (CUDA emulator) - the cuBLASLt calls of kernels/gemm.cu on the host: handle,
 * matrix layouts, matmul descriptors, preferences, the algorithm heuristic and cublasLtMatmul
 * with the DEFAULT / RELU / BIAS / RELU_BIAS epilogues.
 *
 * Checked as emu_blas.cc checks cublasGemmEx: dimensions that do not fit together give
 * INVALID_VALUE, type combinations without a kernel NOT_SUPPORTED, and an operand, bias or
 * workspace outside device memory is a fault (at the call, and before every run if it was freed
 * since). Descriptor attributes must come with their exact
 * size, as the real library demands. The heuristic returns up to two algorithms (as many as
 * asked for) when the problem is supported: #0 claims up to 1 MiB of workspace (what the
 * preference allows), so a caller's workspace plumbing is exercised, #1 none. An algorithm
 * remembers the alignments the preference allowed and the problem it was chosen for, and
 * cublasLtMatmul refuses (NOT_SUPPORTED) a call whose pointers are less aligned or whose
 * descriptors differ, so a caller that lies to the heuristic is caught here rather than by a
 * misaligned-address fault on a GPU. Both compute alike; a run is listed by ACT_EMU_TRACE=2 as
 * "cublasLtMatmul #i" (counted as cublasLtMatmul), so a test can see which one a caller chose.
 *
 * Numerics: operands widened (TF32/16-bit rounding as in emu_blas.cc), multiplied by sgemm in
 * fp32, then bias (fp32, or read in the output type) added and ReLU applied in fp32, and the
 * result rounded once to D's type: a fused epilogue works on the fp32 accumulator.
 *
 * ACT_EMU_CUBLASLT=none makes the heuristic offer nothing; =refuse makes every cublasLtMatmul
 * return NOT_SUPPORTED before it enqueues anything; =strict-bias takes a bias epilogue only with
 * the bias in D's type, as cublasLt.h documents it (outside IMMA and fp8), refusing an fp32 bias
 * beside a 16-bit D; =refuse-first refuses every run of algorithm #0, =refuse-others of the
 * others; =slow-first makes each run of #0 take 2 ms more (a host sleep, which events time), so
 * a caller that times the candidates has a clear winner; =slightly-slow-first 10 us more plus
 * the run's own time again (a spin: twice as slow, and still short enough that a caller times
 * small shapes in batches of several runs; a bare 10 us was within the noise of a loaded CI
 * host running ASan, where even a 6-row GEMM takes 50+ us on the emulator); =slow-launch
 * makes every call that is not captured take 400 us more (a host's launch cost, which a caller
 * timing one plain call mistakes for the GEMM's; a graph's nodes do not pay it) (all read at
 * each call, to test a caller's fallbacks and choices). */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <string>
#include <vector>
#include "cublasLt.h"
#include "emu_internal.h"

struct cublasLtContext { int live; };

namespace {

const uint64_t LAYOUT_MAGIC = 0x4c61796f75744c74ull, DESC_MAGIC = 0x446573634c744d6dull,
               PREF_MAGIC = 0x507265664c744d6dull, ALGO_MAGIC = 0x416c676f4c744d6dull;
const size_t ALGO_WS = (size_t)1 << 20;
const int N_ALGOS = 2;

struct layout {
    uint64_t magic;
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct desc {
    uint64_t magic;
    cublasComputeType_t comp;
    cudaDataType_t scale;
    int32_t ta, tb;
    uint32_t epi;
    const void *bias;
    int32_t bias_type;
};
struct pref {
    uint64_t magic;
    uint64_t ws;
    uint32_t align[4];
};
/* what cublasLtMatmulAlgo_t carries between the heuristic and the matmul */
struct algo {
    uint64_t magic;
    uint64_t problem;     /* fingerprint of descriptor + layouts */
    uint64_t ws;
    uint32_t align[5];    /* A, B, C, D, bias */
    uint32_t index;       /* its place in the heuristic's list */
};
static_assert(sizeof(layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout fits");
static_assert(sizeof(desc) <= sizeof(cublasLtMatmulDescOpaque_t), "desc fits");
static_assert(sizeof(pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "pref fits");
static_assert(sizeof(algo) <= sizeof(cublasLtMatmulAlgo_t), "algo fits");

template <class T, class O> T *as(O *o, uint64_t magic) {
    T *t = reinterpret_cast<T *>(o);
    return t && t->magic == magic ? t : nullptr;
}

size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
int is_data_type(int t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

int env_is(const char *v) {
    const char *e = getenv("ACT_EMU_CUBLASLT");
    return e && strcmp(e, v) == 0;
}

unsigned align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned n = 1;
    while (n < 256 && !(a & n)) n <<= 1;
    return n;
}

size_t extent(const layout *l) {
    if (l->rows == 0 || l->cols == 0) return 0;
    return ((l->cols - 1) * (uint64_t)l->ld + l->rows) * type_size(l->type);
}

/* the problem as checked by both the heuristic and the matmul */
struct problem {
    uint64_t m, n, k;
    emu_rounding rnd;
    int bias_type;        /* resolved: D's type when the attribute is -1 */
    uint64_t print;
};

cublasStatus_t check_problem(const desc *d, const layout *a, const layout *b, const layout *c,
                             const layout *dd, problem *p) {
    if (!d || !a || !b || !c || !dd) return CUBLAS_STATUS_INVALID_VALUE;
    emu_rounding rnd = EMU_ROUND_NONE;
    switch (d->comp) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC: break;
    case CUBLAS_COMPUTE_32F_FAST_TF32: rnd = EMU_ROUND_TF32; break;
    case CUBLAS_COMPUTE_32F_FAST_16F: rnd = EMU_ROUND_F16; break;
    case CUBLAS_COMPUTE_32F_FAST_16BF: rnd = EMU_ROUND_BF16; break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (d->scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!is_data_type(a->type) || b->type != a->type || c->type != dd->type ||
        (dd->type != a->type && dd->type != CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a->type != CUDA_R_32F) rnd = EMU_ROUND_NONE;   /* 16-bit operands are exact in any mode */
    uint64_t am = d->ta == CUBLAS_OP_N ? a->rows : a->cols, ak = d->ta == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t bk = d->tb == CUBLAS_OP_N ? b->rows : b->cols, bn = d->tb == CUBLAS_OP_N ? b->cols : b->rows;
    if (am != dd->rows || bn != dd->cols || ak != bk || c->rows != dd->rows || c->cols != dd->cols ||
        c->ld != dd->ld)
        return CUBLAS_STATUS_INVALID_VALUE;
    uint32_t e = d->epi;
    if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_RELU && e != CUBLASLT_EPILOGUE_BIAS &&
        e != CUBLASLT_EPILOGUE_RELU_BIAS && e != CUBLASLT_EPILOGUE_GELU && e != CUBLASLT_EPILOGUE_GELU_BIAS)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    int bt = d->bias_type == -1 ? (int)dd->type : d->bias_type;
    if ((e & CUBLASLT_EPILOGUE_BIAS) && bt != (int)dd->type &&
        (bt != CUDA_R_32F || env_is("strict-bias")))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *p = problem{dd->rows, dd->cols, ak, rnd, bt, 0};
    /* FNV-1a over what the algorithm depends on; shapes are free to vary as on a GPU only in
     * the sense that a different problem must ask the heuristic again */
    uint64_t v[12] = {(uint64_t)d->comp, (uint64_t)d->ta, (uint64_t)d->tb, e, (uint64_t)bt,
                      (uint64_t)a->type, (uint64_t)dd->type, am, bn, ak,
                      (uint64_t)a->ld ^ ((uint64_t)b->ld << 32), (uint64_t)dd->ld};
    uint64_t h = 1469598103934665603ull;
    for (uint64_t x : v)
        for (int i = 0; i < 8; i++) h = (h ^ ((x >> (8 * i)) & 0xff)) * 1099511628211ull;
    p->print = h;
    return CUBLAS_STATUS_SUCCESS;
}

int ld_ok(const layout *l) { return l->ld >= (int64_t)(l->rows > 1 ? l->rows : 1); }

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle) {
    if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
    *lightHandle = (cublasLtHandle_t)calloc(1, sizeof(cublasLtContext));
    if (!*lightHandle) return CUBLAS_STATUS_ALLOC_FAILED;
    (*lightHandle)->live = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (!lightHandle || !lightHandle->live) return CUBLAS_STATUS_NOT_INITIALIZED;
    lightHandle->live = 0;
    free(lightHandle);
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusString(cublasStatus_t status) { return cublasGetStatusString(status); }

/* the version of an emulated cuBLASLt: 13.0.0's number, which a real one of that version gives */
size_t cublasLtGetVersion(void) { return 130000; }

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    *matLayout = NULL;
    if (!is_data_type(type) || ld < 0 || rows > INT32_MAX || cols > INT32_MAX)
        return CUBLAS_STATUS_INVALID_VALUE;
    auto *o = (cublasLtMatrixLayoutOpaque_t *)calloc(1, sizeof(cublasLtMatrixLayoutOpaque_t));
    if (!o) return CUBLAS_STATUS_ALLOC_FAILED;
    *reinterpret_cast<layout *>(o) = layout{LAYOUT_MAGIC, type, rows, cols, ld};
    *matLayout = o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    if (matLayout) {
        if (!as<layout>(matLayout, LAYOUT_MAGIC)) return CUBLAS_STATUS_INVALID_VALUE;
        reinterpret_cast<layout *>(matLayout)->magic = 0;
        free(matLayout);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    *matmulDesc = NULL;
    auto *o = (cublasLtMatmulDescOpaque_t *)calloc(1, sizeof(cublasLtMatmulDescOpaque_t));
    if (!o) return CUBLAS_STATUS_ALLOC_FAILED;
    *reinterpret_cast<desc *>(o) = desc{DESC_MAGIC, computeType, scaleType, CUBLAS_OP_N,
                                        CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL, -1};
    *matmulDesc = o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    if (matmulDesc) {
        if (!as<desc>(matmulDesc, DESC_MAGIC)) return CUBLAS_STATUS_INVALID_VALUE;
        reinterpret_cast<desc *>(matmulDesc)->magic = 0;
        free(matmulDesc);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes) {
    desc *d = as<desc>(matmulDesc, DESC_MAGIC);
    if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        if (sizeInBytes != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        int32_t v;
        memcpy(&v, buf, sizeof v);
        if (v < CUBLAS_OP_N || v > CUBLAS_OP_C) return CUBLAS_STATUS_INVALID_VALUE;
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : d->tb) = v;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (sizeInBytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->epi, buf, sizeof d->epi);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (sizeInBytes != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->bias, buf, sizeof d->bias);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        if (sizeInBytes != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->bias_type, buf, sizeof d->bias_type);
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    *p = NULL;
    auto *o = (cublasLtMatmulPreferenceOpaque_t *)calloc(1,
                                                        sizeof(cublasLtMatmulPreferenceOpaque_t));
    if (!o) return CUBLAS_STATUS_ALLOC_FAILED;
    *reinterpret_cast<pref *>(o) = pref{PREF_MAGIC, 0, {256, 256, 256, 256}};
    *p = o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    if (p) {
        if (!as<pref>(p, PREF_MAGIC)) return CUBLAS_STATUS_INVALID_VALUE;
        reinterpret_cast<pref *>(p)->magic = 0;
        free(p);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes) {
    pref *q = as<pref>(p, PREF_MAGIC);
    if (!q || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        if (sizeInBytes != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&q->ws, buf, sizeof q->ws);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        if (sizeInBytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&q->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, sizeof(uint32_t));
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: {
        /* the emulated algorithms never split K: any mask keeps them, but not a stray bit */
        uint32_t m;
        if (sizeInBytes != sizeof m) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&m, buf, sizeof m);
        return m & ~(uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK ? CUBLAS_STATUS_INVALID_VALUE
                                                             : CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
        break;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                              cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc,
                                              cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc,
                                              cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference,
                                              int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount) {
    if (!lightHandle || !lightHandle->live) return CUBLAS_STATUS_NOT_INITIALIZED;
    const desc *d = as<desc>(operationDesc, DESC_MAGIC);
    const pref *q = as<pref>(preference, PREF_MAGIC);
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount || !q)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returnAlgoCount = 0;
    const layout *a = as<layout>(Adesc, LAYOUT_MAGIC), *b = as<layout>(Bdesc, LAYOUT_MAGIC);
    const layout *c = as<layout>(Cdesc, LAYOUT_MAGIC), *dd = as<layout>(Ddesc, LAYOUT_MAGIC);
    problem p;
    cublasStatus_t s = check_problem(d, a, b, c, dd, &p);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!ld_ok(a) || !ld_ok(b) || !ld_ok(dd)) return CUBLAS_STATUS_INVALID_VALUE;
    if (env_is("none")) return CUBLAS_STATUS_SUCCESS;
    /* no kernel reads an element at an address its own size does not divide */
    const size_t need[5] = {type_size(a->type), type_size(b->type), type_size(c->type),
                            type_size(dd->type), (d->epi & CUBLASLT_EPILOGUE_BIAS)
                                                     ? type_size((cudaDataType_t)p.bias_type) : 1};
    algo g = {ALGO_MAGIC, p.print, q->ws < ALGO_WS ? q->ws : ALGO_WS, {0, 0, 0, 0, 0}, 0};
    for (int i = 0; i < 4; i++) {
        if (q->align[i] < need[i] || (q->align[i] & (q->align[i] - 1))) return CUBLAS_STATUS_SUCCESS;
        g.align[i] = q->align[i];
    }
    /* the bias pointer is not dereferenced, but its alignment is read from it */
    g.align[4] = (d->epi & CUBLASLT_EPILOGUE_BIAS) ? align_of(d->bias) : 1;
    if (g.align[4] < need[4]) return CUBLAS_STATUS_SUCCESS;
    int n = requestedAlgoCount < N_ALGOS ? requestedAlgoCount : N_ALGOS;
    for (int i = 0; i < n; i++) {
        g.index = (uint32_t)i;
        if (i > 0) g.ws = 0;
        cublasLtMatmulHeuristicResult_t r;
        memset(&r, 0, sizeof r);
        memcpy(&r.algo, &g, sizeof g);
        r.workspaceSize = g.ws;
        r.state = CUBLAS_STATUS_SUCCESS;
        r.wavesCount = 1.0f;
        heuristicResultsArray[i] = r;
    }
    *returnAlgoCount = n;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algop,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
    if (!lightHandle || !lightHandle->live) return CUBLAS_STATUS_NOT_INITIALIZED;
    const desc *dp = as<desc>(computeDesc, DESC_MAGIC);
    const layout *a = as<layout>(Adesc, LAYOUT_MAGIC), *b = as<layout>(Bdesc, LAYOUT_MAGIC);
    const layout *c = as<layout>(Cdesc, LAYOUT_MAGIC), *dd = as<layout>(Ddesc, LAYOUT_MAGIC);
    if (!alpha || !beta || !algop) return CUBLAS_STATUS_INVALID_VALUE;
    problem p;
    cublasStatus_t s = check_problem(dp, a, b, c, dd, &p);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!ld_ok(a) || !ld_ok(b) || !ld_ok(dd)) return CUBLAS_STATUS_INVALID_VALUE;
    algo g;
    memcpy(&g, algop, sizeof g);
    if (g.magic != ALGO_MAGIC || g.problem != p.print) return CUBLAS_STATUS_NOT_SUPPORTED;
    const desc d = *dp;   /* the call reads the descriptor now; later changes must not matter */
    int has_bias = (d.epi & CUBLASLT_EPILOGUE_BIAS) != 0, relu = (d.epi & CUBLASLT_EPILOGUE_RELU) != 0;
    int gelu = (d.epi & CUBLASLT_EPILOGUE_GELU) != 0;
    if (has_bias && !d.bias) return CUBLAS_STATUS_INVALID_VALUE;
    if (workspaceSizeInBytes < g.ws || (workspaceSizeInBytes && !workspace) ||
        (uintptr_t)workspace % 256)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (align_of(A) < g.align[0] || align_of(B) < g.align[1] || align_of(C) < g.align[2] ||
        align_of(D) < g.align[3] || (has_bias && align_of(d.bias) < g.align[4]))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (env_is("refuse") || (env_is("refuse-first") && g.index == 0) ||
        (env_is("refuse-others") && g.index != 0))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const int slow = g.index != 0 ? 0 : env_is("slow-first") ? 1 : env_is("slightly-slow-first") ? 2 : 0;
    if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    int kk = p.k > 0;
    emu_operands used;
    if (!emu_on_device("cublasLtMatmul", "operand A", A, kk ? extent(a) : 0, &used) ||
        !emu_on_device("cublasLtMatmul", "operand B", B, kk ? extent(b) : 0, &used) ||
        !emu_on_device("cublasLtMatmul", "operand C", C, be != 0.0f ? extent(c) : 0, &used) ||
        !emu_on_device("cublasLtMatmul", "operand D", D, extent(dd), &used) ||
        !emu_on_device("cublasLtMatmul", "the bias", d.bias,
                       has_bias ? p.m * type_size((cudaDataType_t)p.bias_type) : 0, &used) ||
        !emu_on_device("cublasLtMatmul", "the workspace", workspace, g.ws, &used))
        return CUBLAS_STATUS_EXECUTION_FAILED;

    const layout la = *a, lb = *b, lc = *c, ld = *dd;
    /* slow-launch: a call launched on its own (not captured) takes 400 us more between events,
     * as a host's launch cost does on a GPU that waits for it; its graph-launched twin does not.
     * (The emulator runs a stream's work when it is waited for, so a host spin here would fall
     * outside the events: the spin is the operation's.) */
    const bool launch_cost = env_is("slow-launch") && !emu_stream_capturing(stream);
    auto op = [=]() {
        if (launch_cost) {
            struct timespec t0, t;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            do clock_gettime(CLOCK_MONOTONIC, &t);
            while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 400000);
        }
        if (slow == 1) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, nullptr);
        }
        struct timespec run0;
        clock_gettime(CLOCK_MONOTONIC, &run0);
        uint64_t m = p.m, n = p.n, k = p.k;
        std::vector<float> acc(m * n, 0.0f);
        if (k > 0) {
            std::vector<float> a32 = emu_widen(A, la.type, la.rows, la.cols, la.ld, p.rnd);
            std::vector<float> b32 = emu_widen(B, lb.type, lb.rows, lb.cols, lb.ld, p.rnd);
            cblas_sgemm(CblasColMajor, d.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                        d.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, (int)m, (int)n, (int)k,
                        al, a32.data(), (int)la.rows, b32.data(), (int)lb.rows, 0.0f, acc.data(),
                        (int)m);
        }
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                float v = acc[j * m + i];
                if (be != 0.0f) v += be * emu_load(C, lc.type, j * lc.ld + i);
                if (has_bias) v += emu_load(d.bias, (cudaDataType_t)p.bias_type, i);
                if (relu) v = v > 0.0f ? v : 0.0f;
                /* cuBLASLt's GELU is the tanh approximation, not the erf form */
                if (gelu) v = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
                emu_store(D, ld.type, j * ld.ld + i, v);
            }
        if (slow == 2) {   /* a spin: a sleep this short would take the timer's slack */
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            const long own = (t.tv_sec - run0.tv_sec) * 1000000000L + (t.tv_nsec - run0.tv_nsec);
            const long until = 2 * own + 10000;
            do clock_gettime(CLOCK_MONOTONIC, &t);
            while ((t.tv_sec - run0.tv_sec) * 1000000000L + (t.tv_nsec - run0.tv_nsec) < until);
        }
    };
    return emu_enqueue_as(stream, "cublasLtMatmul", "cublasLtMatmul #" + std::to_string(g.index),
                          op, std::move(used)) == cudaSuccess
               ? CUBLAS_STATUS_SUCCESS
               : CUBLAS_STATUS_EXECUTION_FAILED;
}

}
