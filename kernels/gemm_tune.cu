/* gemm_tune.cu - choose a cuBLASLt plan's algorithm by timing the heuristic's candidates on the
 * GPU, as torch.compile's max-autotune times its GEMM choices, instead of taking the heuristic's
 * first. The candidates run on the step's own operands and write y, and the measurement waits
 * for its events, so it belongs in an eager step, never in a capture.
 * Every candidate is one the plan's preference allowed (the workspace the backend holds, the
 * operands' real alignments, split-K sums kept in fp32), so a measured choice needs no more
 * memory and rounds no differently in kind than the heuristic's first.
 * How: each candidate runs once untimed (lazy kernel loading; a candidate cuBLASLt refuses to
 * run is dropped here, so a first choice that would be refused at its first real run is
 * replaced by a usable one), then one run of the first usable candidate is timed to size the
 * batches: reps runs per batch so that a batch lasts about TUNE_TARGET_MS (a 16-row GEMM on an
 * H200 is a few us, near the events' resolution; where batches are graphs, the first
 * candidate's graph is timed once more and sized again, since the plain run's time held the
 * host's launch cost as well), then TUNE_ROUNDS rounds of one batch per
 * candidate, interleaved so that a drift in clocks hits all alike; a candidate's time is its
 * fastest batch. Each batch is one captured graph of its reps runs where the stream can capture
 * (else plain launches): a batch-1 decoder GEMM takes a few us, about cuBLASLt's host cost per
 * call, so launched one by one the events would time the host's launch rate, every candidate
 * alike; in a graph the runs follow each other on the GPU as they do in the step's own graph.
 * Another than the first usable is taken only when it is faster by more than TUNE_MARGIN, so
 * that noise does not trade the heuristic's choice for an equal one.
 * What one measurement chose is kept for the process, keyed by device, data types, shape,
 * precision, epilogue and alignments (act_lt_key): identical linears (the decoder's six layers)
 * and every later session of the same model measure nothing again; with ACT_CUDA_ALGO_CACHE=FILE
 * every later process too (algo_cache.cuh). A measurement with a single usable candidate is
 * remembered as "keep the heuristic's first". ACT_CUDA_ALGO_LOG=1 prints each measurement's
 * choice and times (log_choice). */
#include "gemm_plan.cuh"
#include "algo_cache.cuh"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TUNE_CACHE 1024
#define TUNE_ROUNDS 2
#define TUNE_MAX_REPS 64
#define TUNE_TARGET_MS 0.05f
#define TUNE_MARGIN 0.97f

typedef struct {
    act_lt_key key;
    int measured;                   /* 1: algo chosen by a measurement, 0: keep the first */
    cublasLtMatmulAlgo_t algo;
} tune_entry;

static_assert(offsetof(tune_entry, measured) == sizeof(act_lt_key), "the key leads the entry");
static_assert(offsetof(act_lt_key, dev) == 0, "the device leads the key");

/* an entry read from ACT_CUDA_ALGO_CACHE: its algorithm is checked where it is used (adopt) */
static int tune_valid(const void *entry) {
    const tune_entry *e = (const tune_entry *)entry;
    return e->measured == 0 || e->measured == 1;
}

ACT_ALGO_CACHE(tune_cache, tune_entry, TUNE_CACHE, sizeof(act_lt_key), "gemm", cublasLtGetVersion,
               tune_valid);

/* make the plan run candidate algo (found by its bytes among the plan's own candidates; one
 * that is not there, from a cuBLASLt that ranks differently now, leaves the plan as it is):
 * 0, or -1 when it is not there */
static int adopt(act_lt_plan *p, const cublasLtMatmulAlgo_t *algo) {
    for (int i = 0; i < p->n_cand; i++)
        if (!memcmp(&p->cand[i], algo, sizeof *algo)) {
            p->algo = p->cand[i];
            p->ws = p->cand_ws[i];
            return 0;
        }
    return -1;
}

static cublasStatus_t run_cand(cublasLtHandle_t lt, const act_lt_plan *p, int i, const void *W,
                               const void *x, void *y, void *ws, size_t ws_bytes,
                               cudaStream_t st) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(lt, p->op, &alpha, W, p->a, x, p->b, &beta, y, p->d, y, p->d,
                          &p->cand[i], ws, ws_bytes, st);
}

#define NEV (2 + 2 * TUNE_ROUNDS * KLT_CANDIDATES)

/* what a measurement found: the chosen candidate (-1: none would run), the first usable one,
 * how many were usable, and each timed one's time per run (us; 0 when not timed) */
typedef struct {
    int best, first, n_usable;
    float us[KLT_CANDIDATES];
    int reps, graphs;               /* runs per timed batch; 1 when the batches were graphs */
} tune_result;

/* reps runs of candidate i as one graph (*out), or -1 where the stream cannot capture them (the
 * caller then launches them one by one); nothing is left in the last-error slot */
static int batch_graph(cublasLtHandle_t lt, const act_lt_plan *p, int i, const void *W,
                       const void *x, void *y, void *ws, size_t ws_bytes, cudaStream_t st,
                       int reps, cudaGraphExec_t *out) {
    cudaGraph_t g = NULL;
    *out = NULL;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    int ok = 1;
    for (int k = 0; k < reps && ok; k++)
        ok = run_cand(lt, p, i, W, x, y, ws, ws_bytes, st) == CUBLAS_STATUS_SUCCESS;
    cudaError_t e = cudaStreamEndCapture(st, &g);
    if (ok && e == cudaSuccess && g) e = cudaGraphInstantiate(out, g, 0);
    if (g) cudaGraphDestroy(g);
    if (!ok || e != cudaSuccess || !*out) {
        cudaGetLastError();
        *out = NULL;
        return -1;
    }
    /* its work on the device now, not inside the first timed batch (a failure only costs that) */
    if (cudaGraphUpload(*out, st) != cudaSuccess) cudaGetLastError();
    return 0;
}

/* TUNE_ROUNDS rounds of one timed batch of reps runs per usable candidate, between events
 * ev[2], ev[3], ... in order: each batch one launch of gx[i], or reps plain launches when gx is
 * NULL. 0 once the last event has passed; 1 when a graph launch was refused (nothing enqueued
 * by it; the caller times again without graphs); -1 with err on an error. */
static int time_batches(cublasLtHandle_t lt, const act_lt_plan *p, const int *usable,
                        const void *W, const void *x, void *y, void *ws, size_t ws_bytes,
                        cudaStream_t st, int reps, const cudaGraphExec_t *gx, cudaEvent_t *ev,
                        char *err, size_t errlen) {
    int e = 2;
    for (int r = 0; r < TUNE_ROUNDS; r++)
        for (int i = 0; i < p->n_cand; i++) {
            if (!usable[i]) continue;
            KCHECK(cudaEventRecord(ev[e], st));
            if (gx && cudaGraphLaunch(gx[i], st) != cudaSuccess) {
                cudaGetLastError();
                return 1;
            }
            for (int k = 0; k < reps && !gx; k++) {
                cublasStatus_t s = run_cand(lt, p, i, W, x, y, ws, ws_bytes, st);
                if (s != CUBLAS_STATUS_SUCCESS)
                    return act_kerr(err, errlen, __FILE__, __LINE__, "cublasLtMatmul",
                                    cublasLtGetStatusString(s));
            }
            KCHECK(cudaEventRecord(ev[e + 1], st));
            e += 2;
        }
    KCHECK(cudaEventSynchronize(ev[e - 1]));
    return 0;
}

/* runs a timed batch should have when one takes run_ms: about TUNE_TARGET_MS, 1 to TUNE_MAX_REPS */
static int reps_for(float run_ms) {
    if (run_ms >= TUNE_TARGET_MS) return 1;
    int reps = (int)ceilf(TUNE_TARGET_MS / fmaxf(run_ms, 1e-4f));
    return reps > TUNE_MAX_REPS ? TUNE_MAX_REPS : reps;
}

/* g (reps runs of one candidate) launched three times, the last two each between events (ev[0],
 * ev[1]; ev[1], ev[2]): the first keeps the GPU busy while the events and the next launches are
 * queued behind it, so an interval is the runs', not the host's launch gaps. *ms is one run's
 * time at the GPU's pace, the smaller of the two (a stall in one, e.g. a loaded CI host running
 * the emulator, would otherwise size the batches too short). 0; 1 when a launch was refused
 * (the caller times without graphs); -1 with err. */
static int graph_run_ms(cudaGraphExec_t g, int reps, cudaStream_t st, cudaEvent_t *ev, float *ms,
                        char *err, size_t errlen) {
    for (int k = 0; k < 3; k++) {
        if (k > 0) KCHECK(cudaEventRecord(ev[k - 1], st));
        if (cudaGraphLaunch(g, st) != cudaSuccess) {
            cudaGetLastError();
            return 1;
        }
    }
    KCHECK(cudaEventRecord(ev[2], st));
    KCHECK(cudaEventSynchronize(ev[2]));
    float a, b;
    KCHECK(cudaEventElapsedTime(&a, ev[0], ev[1]));
    KCHECK(cudaEventElapsedTime(&b, ev[1], ev[2]));
    *ms = fminf(a, b) / (float)reps;
    return 0;
}

/* the measurement itself, events made by the caller */
static int measure(cublasLtHandle_t lt, const act_lt_plan *p, const void *W, const void *x,
                   void *y, void *ws, size_t ws_bytes, cudaStream_t st, int graphs, cudaEvent_t *ev,
                   tune_result *res, char *err, size_t errlen) {
    int usable[KLT_CANDIDATES], first = -1;
    memset(res, 0, sizeof *res);
    res->best = res->first = -1;
    for (int i = 0; i < p->n_cand; i++) {
        cublasStatus_t s = run_cand(lt, p, i, W, x, y, ws, ws_bytes, st);
        /* EXECUTION_FAILED is a CUDA error on the stream; anything else refused the candidate
         * before enqueuing it */
        if (s == CUBLAS_STATUS_EXECUTION_FAILED)
            return act_kerr(err, errlen, __FILE__, __LINE__, "cublasLtMatmul",
                            cublasLtGetStatusString(s));
        usable[i] = s == CUBLAS_STATUS_SUCCESS;
        res->n_usable += usable[i];
        if (usable[i] && first < 0) first = i;
    }
    res->best = res->first = first;
    if (res->n_usable < 2) return 0;
    float one;
    KCHECK(cudaEventRecord(ev[0], st));
    cublasStatus_t s = run_cand(lt, p, first, W, x, y, ws, ws_bytes, st);
    if (s != CUBLAS_STATUS_SUCCESS)
        return act_kerr(err, errlen, __FILE__, __LINE__, "cublasLtMatmul",
                        cublasLtGetStatusString(s));
    KCHECK(cudaEventRecord(ev[1], st));
    KCHECK(cudaEventSynchronize(ev[1]));
    KCHECK(cudaEventElapsedTime(&one, ev[0], ev[1]));
    int reps = reps_for(one);
    /* every candidate as a graph, or every one as plain launches: a mix would time some at the
     * GPU's pace and others at the host's. Graphs whatever the plain run took: only a graph's
     * time tells a slow GEMM from a slow launch (a large GEMM pays a few runs more for it) */
    cudaGraphExec_t gx[KLT_CANDIDATES] = {0};
    int as_graphs = graphs;
    if (as_graphs) {
        /* the plain run above timed the host's launch cost too (a few us, as long as a small
         * GEMM itself): the first candidate's graph, launched, times a run at the GPU's pace,
         * and where its batches would fall short of the target they get more runs */
        float run = 0.0f;
        int r = batch_graph(lt, p, first, W, x, y, ws, ws_bytes, st, reps, &gx[first]) ? 1
                : graph_run_ms(gx[first], reps, st, ev, &run, err, errlen);
        if (r < 0) {
            cudaGraphExecDestroy(gx[first]);
            return -1;
        }
        if (r == 0 && reps_for(run) > reps) {
            reps = reps_for(run);
            cudaGraphExecDestroy(gx[first]);
            r = batch_graph(lt, p, first, W, x, y, ws, ws_bytes, st, reps, &gx[first]);
        }
        as_graphs = r == 0;
    }
    for (int i = 0; i < p->n_cand && as_graphs; i++)
        if (usable[i] && !gx[i] && batch_graph(lt, p, i, W, x, y, ws, ws_bytes, st, reps, &gx[i])) as_graphs = 0;
    int rc = time_batches(lt, p, usable, W, x, y, ws, ws_bytes, st, reps, as_graphs ? gx : NULL, ev,
                          err, errlen);
    int rc_graphs = rc != 1;
    if (rc == 1)   /* a graph launch refused: every candidate as plain launches, anew */
        rc = time_batches(lt, p, usable, W, x, y, ws, ws_bytes, st, reps, NULL, ev, err, errlen);
    for (int i = 0; i < p->n_cand; i++)
        if (gx[i]) cudaGraphExecDestroy(gx[i]);   /* one still in flight (an error) is freed when done */
    if (rc) return rc;
    float t[KLT_CANDIDATES];
    int e = 2;
    for (int r = 0; r < TUNE_ROUNDS; r++)
        for (int i = 0; i < p->n_cand; i++) {
            if (!usable[i]) continue;
            float ms;
            KCHECK(cudaEventElapsedTime(&ms, ev[e], ev[e + 1]));
            if (r == 0 || ms < t[i]) t[i] = ms;
            e += 2;
        }
    int b = first;
    for (int i = first + 1; i < p->n_cand; i++)
        if (usable[i] && t[i] < t[b]) b = i;
    if (b != first && !(t[b] < TUNE_MARGIN * t[first])) b = first;
    res->best = b;
    for (int i = 0; i < p->n_cand; i++)
        if (usable[i]) res->us[i] = 1e3f * t[i] / (float)reps;
    res->reps = reps;
    res->graphs = as_graphs && rc_graphs;
    return 0;
}

/* with ACT_CUDA_ALGO_LOG set (not 0): one line on stderr per measured shape, so a GPU run
 * shows where the measurement chose differently from the heuristic and what it gained */
static void log_choice(const act_lt_plan *p, const tune_result *r) {
    if (!act_algo_log()) return;
    static const char *const prec[] = {"fp32", "bf16", "fp16"};
    static const char *const epi[] = {"bias", "bias+ReLU", "bias+GELU"};
    const act_lt_key *k = &p->key;
    char what[96];
    snprintf(what, sizeof what, "%s %d x %d x %d (rows x out x in), %s",
             k->wdt == KDT_F32 && k->tf32 ? "tf32" : prec[k->wdt], k->M, k->out, k->in,
             epi[k->epi]);
    if (r->best < 0)
        fprintf(stderr, "act-engine: algo: cuBLASLt %s: none of %d candidates would run\n", what,
                p->n_cand);
    else if (r->n_usable < 2)
        fprintf(stderr, "act-engine: algo: cuBLASLt %s: candidate %d, the only one of %d that "
                "runs\n", what, r->best, p->n_cand);
    else
        fprintf(stderr, "act-engine: algo: cuBLASLt %s: candidate %d of %d (%.2f us a run), the "
                "heuristic's first %d (%.2f us); timed in batches of %d run%s %s\n", what, r->best,
                p->n_cand, r->us[r->best], r->first, r->us[r->first], r->reps,
                r->reps == 1 ? "" : "s", r->graphs ? "as graphs" : "launched one by one");
}

int act_k_lt_measure(cublasLtHandle_t lt, act_lt_plan *p, int dev, const void *W,
                     const void *x, const void *bias, void *y, void *ws, size_t ws_bytes,
                     cudaStream_t st, int graphs, char *err, size_t errlen) {
    p->key.dev = dev;
    tune_entry e;
    memset(&e, 0, sizeof e);
    e.key = p->key;
    if (act_algo_cache_get(&tune_cache, &e)) {
        /* only a choice read from ACT_CUDA_ALGO_CACHE can be missing: say so with the log */
        if (e.measured && adopt(p, &e.algo) && act_algo_log())
            fprintf(stderr, "act-engine: algo: cuBLASLt %d x %d x %d: the cached choice is not "
                    "among the heuristic's %d candidates; its first kept\n", p->key.M,
                    p->key.out, p->key.in, p->n_cand);
        return 0;
    }
    if (p->n_cand < 2) {
        act_algo_cache_put(&tune_cache, &e, 0);
        return 0;
    }
    /* p->ws is still the first candidate's need: the others' are no larger than the
     * preference's workspace, the same ws_bytes */
    if (act_k_lt_fits(p, W, x, y, bias, ws_bytes, err, errlen)) return -1;
    cublasStatus_t s = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof bias);
    if (s != CUBLAS_STATUS_SUCCESS)
        return act_kerr(err, errlen, __FILE__, __LINE__, "cublasLtMatmulDescSetAttribute",
                        cublasLtGetStatusString(s));
    cudaEvent_t ev[NEV];
    tune_result res;
    int nev = 0, r = 0;
    for (; nev < NEV; nev++) {
        cudaError_t c = cudaEventCreate(&ev[nev]);
        if (c != cudaSuccess) {
            r = act_kerr(err, errlen, __FILE__, __LINE__, "cudaEventCreate", cudaGetErrorString(c));
            break;
        }
    }
    if (r == 0) r = measure(lt, p, W, x, y, ws, ws_bytes, st, graphs, ev, &res, err, errlen);
    for (int i = 0; i < nev; i++) cudaEventDestroy(ev[i]);
    if (r != 0) return r;
    log_choice(p, &res);
    if (res.best >= 0) {
        e.measured = 1;
        e.algo = p->cand[res.best];
        adopt(p, &e.algo);
    }
    act_algo_cache_put(&tune_cache, &e, e.measured);
    return 0;
}
