/* conv_find.cu - choose a plan's algorithm by measuring the candidates on the GPU
 * (cudnnFindConvolutionForwardAlgorithmEx), the way PyTorch's cudnn.benchmark does, instead of
 * taking the heuristics' first. Find runs each candidate on the real input and weights, writes
 * y and synchronizes, so it belongs in an eager step, never in a capture.
 * The workspace a measurement may use, and so what its choice may need, is capped by the caller
 * (the backend: what it holds already, or what the heuristics' choice needs if more), so that
 * measuring never makes the session hold more device memory than the heuristics would.
 * A conv that will take its bias through cuDNN's fused call with the identity activation
 * (keep_fusion) can do so only on IMPLICIT_PRECOMP_GEMM; it keeps that algorithm whenever Find
 * found it usable, because the bias kernel another algorithm needs is a graph node more (~1-2 us
 * at batch 1) and a pass over the activations at large batches, more than a faster bare
 * convolution of these shapes is likely to win back.
 * What one measurement chose is kept for the process, keyed by device, data type, precision,
 * layout, geometry, keep_fusion and whether 16-bit transforms were allowed (a choice made among
 * the GEMM family says nothing of a Winograd the switch would allow, and one made with the
 * switch is no choice for a run without it): the ResNet's repeated shapes (layer1's four 3x3 convs) and
 * every later session of the same model measure nothing again; with ACT_CUDA_ALGO_CACHE=FILE
 * every later process too (algo_cache.cuh). A failed measurement, or one where nothing usable
 * fit the cap, is remembered too, as "keep the heuristics' choice" (for this process only).
 * ACT_CUDA_ALGO_LOG=1 prints each measured choice beside the heuristics' (log_choice). */
#include "conv_plan.cuh"
#include "algo_cache.cuh"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIND_CACHE 512

typedef struct {
    act_conv_key key;
    int keep_fusion;
    int transforms;                 /* 16-bit FFT/Winograd allowed (act_k_conv_transforms16) */
    int measured;                   /* 1: algo/math chosen by a measurement, 0: keep heuristics */
    cudnnConvolutionFwdAlgo_t algo;
    cudnnMathType_t math;
} find_entry;

/* keyed by (key, keep_fusion, transforms), which hold only ints: no padding for memcmp to read */
static_assert(offsetof(find_entry, measured) == sizeof(act_conv_key) + 2 * sizeof(int), "packed key");
static_assert(offsetof(act_conv_key, dev) == 0, "the device leads the key");

/* an entry read from ACT_CUDA_ALGO_CACHE names an algorithm and math type cuDNN knows (whether
 * the plan can take them is checked where they are used, by apply) */
static int find_valid(const void *entry) {
    const find_entry *e = (const find_entry *)entry;
    return (e->measured == 0 || e->measured == 1) && (e->keep_fusion == 0 || e->keep_fusion == 1) &&
           (e->transforms == 0 || e->transforms == 1) &&
           (int)e->algo >= 0 && (int)e->algo < CUDNN_CONVOLUTION_FWD_ALGO_COUNT &&
           (e->math == CUDNN_DEFAULT_MATH || e->math == CUDNN_TENSOR_OP_MATH ||
            e->math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION || e->math == CUDNN_FMA_MATH);
}

ACT_ALGO_CACHE(find_cache, find_entry, FIND_CACHE, offsetof(find_entry, measured), "conv",
               cudnnGetVersion, find_valid);

/* the cache's key for plan p's measurement (the rest of *e zero) */
static void entry_for(const act_conv_plan *p, int keep_fusion, find_entry *e) {
    memset(e, 0, sizeof *e);
    e->key = p->key;
    e->keep_fusion = keep_fusion;
    e->transforms = p->key.prec >= 2 && act_k_conv_transforms16();
}

/* act_k_conv_pick with the workspace held to cap as well as to the plan's limit */
static int pick_within(cudnnHandle_t h, act_conv_plan *p,
                       const cudnnConvolutionFwdAlgoPerf_t *perf, int n, size_t cap, char *err,
                       size_t errlen) {
    size_t limit = p->ws_limit;
    if (cap < limit) p->ws_limit = cap;
    int r = act_k_conv_pick(h, p, perf, n, err, errlen);
    p->ws_limit = limit;
    return r;
}

/* put (algo, math) into the plan as its choice if its workspace fits cap; 1 if the plan cannot
 * take it (kept as it was) */
static int apply(cudnnHandle_t h, act_conv_plan *p, cudnnConvolutionFwdAlgo_t algo,
                 cudnnMathType_t math, size_t cap, char *err, size_t errlen) {
    cudnnConvolutionFwdAlgoPerf_t one;
    memset(&one, 0, sizeof one);
    one.algo = algo;
    one.mathType = math;
    one.status = CUDNN_STATUS_SUCCESS;
    int r = pick_within(h, p, &one, 1, cap, err, errlen);
    if (r != 0 && cudnnSetConvolutionMathType(p->cd, p->math) != CUDNN_STATUS_SUCCESS && r == 1)
        r = act_kerr(err, errlen, __FILE__, __LINE__, "cudnnSetConvolutionMathType",
                     "cannot restore the heuristics' math type");
    return r;
}

int act_k_conv_find_need(cudnnHandle_t h, act_conv_plan *p, int keep_fusion, size_t ws_cap,
                         size_t *ws_bytes, char *err, size_t errlen) {
    find_entry e;
    entry_for(p, keep_fusion, &e);
    if (!act_algo_cache_get(&find_cache, &e)) {
        *ws_bytes = p->find_ws < ws_cap ? p->find_ws : ws_cap;
        return 1;
    }
    /* a choice over this cap (measured beside a larger workspace) keeps the heuristics' */
    if (e.measured && apply(h, p, e.algo, e.math, ws_cap, err, errlen) < 0) return -1;
    return 0;
}

/* the time Find gave algo (ms), or -1 when it did not run it */
static float found_ms(const cudnnConvolutionFwdAlgoPerf_t *perf, int n,
                      cudnnConvolutionFwdAlgo_t algo) {
    for (int i = 0; i < n; i++)
        if (perf[i].algo == algo && perf[i].status == CUDNN_STATUS_SUCCESS) return perf[i].time;
    return -1.0f;
}

/* with ACT_CUDA_ALGO_LOG set (not 0): one line on stderr per measured shape, the chosen
 * algorithm beside the heuristics' with Find's times, so a GPU run shows what measuring changed */
static void log_choice(const act_conv_plan *p, cudnnConvolutionFwdAlgo_t heur,
                       const cudnnConvolutionFwdAlgoPerf_t *perf, int n) {
    if (!act_algo_log()) return;
    static const char *const names[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                        "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
    const int nn = (int)(sizeof names / sizeof *names);
    static const char *const prec[] = {"fp32", "tf32", "bf16", "fp16"};
    const act_conv_key *k = &p->key;
    fprintf(stderr, "act-engine: algo: cuDNN conv %s N%d C%d %dx%d -> K%d, %dx%d stride %d: "
            "measured %s (%.3f ms), the heuristics' %s (%.3f ms)\n",
            k->prec >= 0 && k->prec < 4 ? prec[k->prec] : "?", k->N, k->cin, k->H, k->W, k->cout,
            k->k, k->k, k->stride, (int)p->algo < nn ? names[p->algo] : "?",
            found_ms(perf, n, p->algo), (int)heur < nn ? names[heur] : "?",
            found_ms(perf, n, heur));
}

int act_k_conv_find(cudnnHandle_t h, act_conv_plan *p, int keep_fusion, const void *x,
                    const void *w, void *y, void *ws, size_t ws_size, char *err, size_t errlen) {
    find_entry e;
    entry_for(p, keep_fusion, &e);
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0;
    const cudnnConvolutionFwdAlgo_t heur = p->algo;
    /* Find explores the math types the descriptor allows: the precision's own, as planned */
    cudnnStatus_t s = cudnnSetConvolutionMathType(p->cd, act_k_conv_math(p->key.prec));
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnFindConvolutionForwardAlgorithmEx(h, p->xd, x, p->wd, w, p->cd, p->yd, y,
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf,
                                                   ws, ws_size);
    int r;
    if (s != CUDNN_STATUS_SUCCESS) {
        act_kerr(err, errlen, __FILE__, __LINE__, "cudnnFindConvolutionForwardAlgorithmEx",
                 cudnnGetErrorString(s));
        r = -1;
    } else {
        /* the fastest usable one (IMPLICIT_PRECOMP_GEMM first for keep_fusion); none usable
         * (all over the workspace, or no GEMM-family one in fp32/tf32) keeps the heuristics'
         * choice */
        cudnnConvolutionFwdAlgoPerf_t fusable[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        int nf = 0;
        for (int i = 0; keep_fusion && i < got; i++)
            if (perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM)
                fusable[nf++] = perf[i];
        r = nf ? pick_within(h, p, fusable, nf, ws_size, err, errlen) : 1;
        if (r == 1) r = pick_within(h, p, perf, got, ws_size, err, errlen);
        if (r == 0) {
            e.measured = 1;
            e.algo = p->algo;
            e.math = p->math;
            log_choice(p, heur, perf, got);
        }
    }
    /* the descriptor's math type must be the chosen algorithm's whatever happened above */
    if (cudnnSetConvolutionMathType(p->cd, p->math) != CUDNN_STATUS_SUCCESS && r >= 0)
        r = act_kerr(err, errlen, __FILE__, __LINE__, "cudnnSetConvolutionMathType",
                     "cannot set the chosen math type");
    act_algo_cache_put(&find_cache, &e, e.measured);
    return r;
}
