/* selftest_runtime.cc - the CUDA emulator's runtime checked on small kernels written for it:
 * barriers and shared memory, warp shuffles, deferred streams, pinned vs pageable copies, graph
 * capture and replay (and replay after a cudaFree), two streams ordered by events (eager and
 * captured as forked lanes, each run as late as its waits allow, so a missing wait reads stale
 * data), and every fault and capture rule it claims to enforce (emu_runtime.cc).
 * Faults are sticky for the process, as on a GPU, so each fault case runs in a forked child and
 * must end with the expected error. Inputs are seeded random values, never zeros. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime.h"

#include "../test_common.h"
#include "selftest_child.h"

/* ---- kernels ---- */

/* per-block sum through shared memory and __syncthreads, written by thread 0 */
static __global__ void block_sum_kernel(const float *x, int n, float *out) {
    __shared__ float part[256];
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    part[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) part[t] += part[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = part[0];
}

/* reads its static shared array before writing it: must see the poison, not a previous block */
static __global__ void stale_shared_kernel(float *out) {
    __shared__ float s[64];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[threadIdx.x];
    __syncthreads();
    s[threadIdx.x] = 1.0f;
}

/* each warp's sum by xor shuffles; every lane writes what it got */
static __global__ void warp_sum_kernel(const float *x, float *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    out[i] = v;
}

/* dynamic shared memory, reversed within the block: needs the barrier to be real */
static __global__ void reverse_kernel(const float *x, float *y) {
    float *sm = (float *)emu_dyn_smem();
    int t = threadIdx.x, n = blockDim.x, base = blockIdx.x * n;
    sm[t] = x[base + t];
    __syncthreads();
    y[base + t] = sm[n - 1 - t];
}

/* thread t reads what thread t + d (d = -1 or +1) wrote to shared memory; the barrier between
 * the write and the read only when `sync`: a race otherwise, which only some thread orders show */
static __global__ void neighbour_kernel(const float *x, float *y, int d, int sync) {
    __shared__ float s[128];
    int t = threadIdx.x, n = blockDim.x, base = blockIdx.x * n;
    s[t] = x[base + t];
    if (sync) __syncthreads();
    int u = t + d;
    y[base + t] = u >= 0 && u < n ? s[u] : 0.0f;
}

/* two block sums through one shared array, as kernels/common.cuh's block_sum; without `guard`
 * the second sum's writes are not kept from the first sum's reads: a warp ahead of the others
 * overwrites a partial sum they have yet to read */
static __device__ float sum_through(float v, float *red, int guard) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (guard) __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __global__ void two_sums_kernel(const float *x, float *y, int guard) {
    __shared__ float red[32];
    float v = x[threadIdx.x];
    float a = sum_through(v, red, guard), b = sum_through(10.0f * v, red, guard);
    y[threadIdx.x] = b - 10.0f * a;                 /* 0 up to rounding */
}

/* the order blocks run in: block b writes how many ran before it (blocks run one at a time
 * here; on a GPU this would be a race) */
static __global__ void block_sequence_kernel(int *seq, int *ran) {
    if (threadIdx.x) return;
    seq[ran[0]++] = (int)blockIdx.x;
}

/* the last block returns before the barrier the others meet: legal CUDA */
static __global__ void last_block_exits_kernel(float *y) {
    __shared__ float s[64];
    if (blockIdx.x == gridDim.x - 1) return;
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    y[blockIdx.x * 64 + threadIdx.x] = s[63 - threadIdx.x];
}

/* block b reads the value block b - 1 wrote: a race between blocks (no order is promised) */
static __global__ void chain_kernel(float *y) {
    if (threadIdx.x) return;
    int b = blockIdx.x;
    y[b] = b ? y[b - 1] + 1.0f : 1.0f;
}

static __global__ void add_kernel(float *y, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += v;
}

/* 2-D blocks: the thread index decomposition */
static __global__ void index_kernel(int *out) {
    int t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    int b = blockIdx.y * gridDim.x + blockIdx.x;
    out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 10000 + (int)(threadIdx.x * 100 +
                                                                         threadIdx.y * 10 + threadIdx.z);
}

/* bugs the emulator must catch */
static __global__ void divergent_barrier_kernel(float *y) {
    if (threadIdx.x < 16) __syncwarp();
    else __syncthreads();
    y[threadIdx.x] = 1.0f;
}
static __global__ void exited_shuffle_kernel(float *y) {
    if (threadIdx.x >= 16) return;
    y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 16);
}
/* 1 KB of static shared memory beside the launch's dynamic bytes; the emu_static_smem call is
 * what translate.sh adds after each __shared__ declaration of a kernels/*.cu file */
static __global__ void static_dynamic_smem_kernel(float *y) {
    __shared__ float tile[256]; emu_static_smem(&tile, sizeof tile);
    float *dyn = (float *)emu_dyn_smem();
    tile[threadIdx.x] = 1.0f;
    dyn[threadIdx.x] = 2.0f;
    y[threadIdx.x] = tile[threadIdx.x] + dyn[threadIdx.x];
}

/* ---- helpers ---- */

static float *dev_upload(const float *h, size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess) { fprintf(stderr, "cudaMalloc\n"); exit(1); }
    if (h) cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    return (float *)d;
}

static int child_divergent(void) {
    float *y = dev_upload(NULL, 32);
    emu_launch(divergent_barrier_kernel, 1, 32)(y);
    return cudaDeviceSynchronize() == cudaErrorIllegalAddress;
}
static int child_exited_shuffle(void) {
    float *y = dev_upload(NULL, 32);
    emu_launch(exited_shuffle_kernel, 1, 32)(y);
    return cudaDeviceSynchronize() == cudaErrorIllegalAddress;
}
/* 47 KB dynamic + 1 KB static fits in 48 KB; 1 byte more is a launch a GPU refuses */
static int child_static_dynamic_smem(void) {
    float *y = dev_upload(NULL, 32);
    emu_launch(static_dynamic_smem_kernel, 1, 32, 47 * 1024)(y);
    if (cudaDeviceSynchronize() != cudaSuccess) return 2;
    emu_launch(static_dynamic_smem_kernel, 1, 32, 47 * 1024 + 1)(y);
    return cudaDeviceSynchronize() == cudaErrorIllegalAddress;
}
static int child_host_pointer(void) {
    float *h = (float *)calloc(64, sizeof(float));
    emu_launch(add_kernel, 1, 64)(h, 1.0f, 64);
    cudaError_t e = cudaDeviceSynchronize();
    /* sticky: every later call fails too */
    void *d = NULL;
    return e == cudaErrorIllegalAddress && cudaMalloc(&d, 16) == cudaErrorIllegalAddress;
}
static int child_pinned_kernel_arg(void) {
    void *h = NULL;
    cudaMallocHost(&h, 64 * sizeof(float));
    emu_launch(add_kernel, 1, 64)((float *)h, 1.0f, 64);
    return cudaDeviceSynchronize() == cudaErrorIllegalAddress;
}

/* Graphs replayed after one of their buffers was freed. cudaFree waits for the device, so only
 * a graph launched after the free can reach freed memory. */
static const char *kStaleLaunch = "points into device memory freed since the launch was recorded "
                                  "(a graph replayed after cudaFree?)";
static const char *kStaleCall = "points into device memory freed since the call was recorded "
                                "(a graph replayed after cudaFree?)";

/* a graph of add_kernel(y += 1) on a fresh stream, instantiated; NULL when a call failed */
static cudaGraphExec_t capture_add(cudaStream_t st, float *y, int n) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return NULL;
    emu_launch(add_kernel, 1, n, 0, st)(y, 1.0f, n);
    if (cudaStreamEndCapture(st, &g) == cudaSuccess) cudaGraphInstantiate(&ex, g, 0);
    cudaGraphDestroy(g);
    return ex;
}

static int child_replay_after_free(void) {
    cudaStream_t st;
    cudaStreamCreate(&st);
    float *a = dev_upload(NULL, 32);
    cudaGraphExec_t ex = capture_add(st, a, 32);
    if (!ex || cudaFree(a) != cudaSuccess || cudaGraphLaunch(ex, st) != cudaSuccess) return 2;
    return cudaStreamSynchronize(st) == cudaErrorIllegalAddress;
}
/* the engine's regrow: free, then allocate the same size again (the allocator may well hand
 * back the same address; the graph still points at the old allocation) */
static int child_replay_after_realloc(void) {
    cudaStream_t st;
    cudaStreamCreate(&st);
    float *a = dev_upload(NULL, 4096);
    cudaGraphExec_t ex = capture_add(st, a, 1024);
    if (!ex || cudaFree(a) != cudaSuccess) return 2;
    float *b = dev_upload(NULL, 4096);
    fprintf(stderr, "selftest: reallocation %s the freed address\n", b == a ? "reuses" : "moves from");
    if (cudaGraphLaunch(ex, st) != cudaSuccess) return 2;
    return cudaStreamSynchronize(st) == cudaErrorIllegalAddress;
}
/* a captured copy and memset whose source / destination was freed */
static int child_copy_after_free(void) {
    cudaStream_t st;
    cudaStreamCreate(&st);
    float *a = dev_upload(NULL, 32), *b = dev_upload(NULL, 32);
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    cudaMemcpyAsync(b, a, 32 * sizeof(float), cudaMemcpyDeviceToDevice, st);
    if (cudaStreamEndCapture(st, &g) != cudaSuccess || cudaGraphInstantiate(&ex, g, 0)) return 2;
    if (cudaFree(a) != cudaSuccess || cudaGraphLaunch(ex, st) != cudaSuccess) return 2;
    return cudaStreamSynchronize(st) == cudaErrorIllegalAddress;
}
static int child_memset_after_free(void) {
    cudaStream_t st;
    cudaStreamCreate(&st);
    float *a = dev_upload(NULL, 32);
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    cudaMemsetAsync(a + 8, 0, 8 * sizeof(float), st);
    if (cudaStreamEndCapture(st, &g) != cudaSuccess || cudaGraphInstantiate(&ex, g, 0)) return 2;
    if (cudaFree(a) != cudaSuccess || cudaGraphLaunch(ex, st) != cudaSuccess) return 2;
    return cudaStreamSynchronize(st) == cudaErrorIllegalAddress;
}

/* what must not fault: deferred work on a buffer freed before the stream was synchronized (the
 * free waits for it, as a real cudaFree does), a graph dropped after a free and never
 * replayed, a replayed graph given NULL and one-past-the-end pointers of a freed neighbour */
static void check_free_rules(void) {
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    float h[64], *pin = NULL;
    for (int i = 0; i < 64; i++) h[i] = urand(-1, 1);
    cudaMallocHost((void **)&pin, sizeof h);
    float *a = dev_upload(h, 64);
    emu_launch(add_kernel, 1, 64, 0, st)(a, 3.0f, 64);
    cudaMemcpyAsync(pin, a, sizeof h, cudaMemcpyDeviceToHost, st);
    CHECK(cudaFree(a) == cudaSuccess, "cudaFree with deferred work on the buffer");
    CHECK(cudaStreamSynchronize(st) == cudaSuccess, "deferred work on a freed buffer faulted");
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += pin[i] != h[i] + 3.0f;
    CHECK(bad == 0, "the deferred kernel did not run before cudaFree: %d values wrong", bad);
    float *b = dev_upload(h, 64);
    cudaGraphExec_t ex = capture_add(st, b, 64);
    CHECK(ex != NULL, "capture");
    cudaFree(b);
    CHECK(cudaGraphExecDestroy(ex) == cudaSuccess, "destroying a graph on freed memory");
    CHECK(cudaStreamSynchronize(st) == cudaSuccess, "a dropped graph faulted");
    float *c = dev_upload(h, 64), *gone = dev_upload(NULL, 16);
    cudaGraph_t g = NULL;
    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    emu_launch(add_kernel, 1, 64, 0, st)(c, 1.0f, 64);
    emu_launch(add_kernel, 1, 1, 0, st)((float *)NULL, 1.0f, 0);
    emu_launch(add_kernel, 1, 1, 0, st)(gone + 16, 1.0f, 0);     /* an empty view at the end */
    CHECK(cudaStreamEndCapture(st, &g) == cudaSuccess && cudaGraphInstantiate(&ex, g, 0) == 0,
          "capture with NULL and one-past-the-end arguments");
    cudaGraphDestroy(g);
    cudaFree(gone);
    for (int r = 0; r < 3; r++) cudaGraphLaunch(ex, st);
    cudaMemcpyAsync(pin, c, sizeof h, cudaMemcpyDeviceToHost, st);
    CHECK(cudaStreamSynchronize(st) == cudaSuccess, "replays with every buffer live faulted");
    bad = 0;
    for (int i = 0; i < 64; i++) bad += pin[i] != h[i] + 3.0f;
    CHECK(bad == 0, "three live replays: %d values wrong", bad);
    cudaGraphExecDestroy(ex);
    cudaFree(c);
    cudaFreeHost(pin);
    cudaStreamDestroy(st);
}

/* ---- checks ---- */

static void check_barriers_and_shuffles(void) {
    const int n = 1000, blocks = (n + 255) / 256;
    float h[1024], got[8];
    for (int i = 0; i < n; i++) h[i] = urand(-1, 1);
    float *x = dev_upload(h, n), *out = dev_upload(NULL, blocks);
    emu_launch(block_sum_kernel, blocks, 256)(x, n, out);
    CHECK(cudaGetLastError() == cudaSuccess, "block_sum launch");
    cudaMemcpy(got, out, blocks * sizeof(float), cudaMemcpyDeviceToHost);
    for (int b = 0; b < blocks; b++) {
        double want = 0;
        for (int i = b * 256; i < n && i < (b + 1) * 256; i++) want += h[i];
        CHECK(fabs(got[b] - want) < 1e-4, "block_sum block %d: %g, want %g", b, got[b], want);
    }
    float *w = dev_upload(h, 256), *wo = dev_upload(NULL, 256), wg[256];
    emu_launch(warp_sum_kernel, 2, 128)(w, wo);
    cudaMemcpy(wg, wo, sizeof wg, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < 256; i++) {
        double want = 0;
        for (int j = i & ~31; j < (i & ~31) + 32; j++) want += h[j];
        bad += fabs(wg[i] - want) > 1e-4;
    }
    CHECK(bad == 0, "warp_sum: %d lanes wrong", bad);
    float *r = dev_upload(NULL, 256), rg[256];
    emu_launch(reverse_kernel, 2, 128, 128 * sizeof(float))(w, r);
    cudaMemcpy(rg, r, sizeof rg, cudaMemcpyDeviceToHost);
    bad = 0;
    for (int i = 0; i < 256; i++) bad += rg[i] != h[(i & ~127) + 127 - (i & 127)];
    CHECK(bad == 0, "reverse through dynamic shared memory: %d wrong", bad);
    int *idx = NULL, ih[2 * 3 * 4 * 2 * 2];
    cudaMalloc((void **)&idx, sizeof ih);
    emu_launch(index_kernel, dim3(3, 2), dim3(4, 2, 2))(idx);
    cudaMemcpy(ih, idx, sizeof ih, cudaMemcpyDeviceToHost);
    CHECK(ih[(1 * 3 + 2) * 16 + (1 * 2 + 1) * 4 + 3] == 5 * 10000 + 311,
          "thread/block index decomposition: %d", ih[(1 * 3 + 2) * 16 + (1 * 2 + 1) * 4 + 3]);
    float *so = dev_upload(NULL, 128), sg[128];
    emu_launch(stale_shared_kernel, 2, 64)(so);
    cudaMemcpy(sg, so, sizeof sg, cudaMemcpyDeviceToHost);
    bad = 0;
    for (int i = 0; i < 128; i++) bad += sg[i] == sg[i];
    CHECK(bad == 0, "static shared memory not poisoned per block: %d values not NaN", bad);
    cudaFree(x); cudaFree(out); cudaFree(w); cudaFree(wo); cudaFree(r); cudaFree(idx); cudaFree(so);
}

/* ACT_EMU_ORDER's orders: correct kernels agree in every order; a missing barrier, or blocks
 * depending on each other, shows in the orders that run the reader before the writer */
/* wrong values in block 0 (it runs first, as fibers) and in block 1 (without a barrier in the
 * kernel: plain calls, thread after thread in the order's permutation) */
static void wrong_neighbours(const float *x, float *xd, float *yd, int d, int sync, int bad[2]) {
    float y[256];
    emu_launch(neighbour_kernel, 2, 128)(xd, yd, d, sync);
    cudaMemcpy(y, yd, sizeof y, cudaMemcpyDeviceToHost);
    bad[0] = bad[1] = 0;
    for (int i = 0; i < 256; i++) {
        int t = i & 127, u = t + d;
        bad[i / 128] += y[i] != (u >= 0 && u < 128 ? x[i + d] : 0.0f);
    }
}

/* seq[0..64): the blocks of a 64-block launch in the order they ran; 1 if it is a permutation */
static int block_sequence(int *seqd, int *rand_d, int seq[64]) {
    cudaMemsetAsync(rand_d, 0, sizeof(int), 0);
    emu_launch(block_sequence_kernel, 64, 32)(seqd, rand_d);
    cudaMemcpy(seq, seqd, 64 * sizeof(int), cudaMemcpyDeviceToHost);
    int seen[64] = {0};
    for (int i = 0; i < 64; i++) {
        if (seq[i] < 0 || seq[i] >= 64 || seen[seq[i]]) return 0;
        seen[seq[i]] = 1;
    }
    return 1;
}

static int chain_in_order(float *yd) {
    float y[64];
    cudaMemsetAsync(yd, 0xff, sizeof y, 0);      /* NaN: no earlier run's chain to read */
    emu_launch(chain_kernel, 64, 32)(yd);
    cudaMemcpy(y, yd, sizeof y, cudaMemcpyDeviceToHost);
    for (int b = 0; b < 64; b++)
        if (y[b] != b + 1.0f) return 0;
    return 1;
}

static int wrong_two_sums(const float *xd, float *yd, int guard) {
    float y[128];
    emu_launch(two_sums_kernel, 1, 128)(xd, yd, guard);
    cudaMemcpy(y, yd, sizeof y, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < 128; i++) bad += !(fabsf(y[i]) < 1e-3f);
    return bad;
}

static void check_orders(void) {
    float x[256];
    for (int i = 0; i < 256; i++) x[i] = urand(-1, 1);
    float *xd = dev_upload(x, 256), *yd = dev_upload(NULL, 256), *cd = dev_upload(NULL, 64);
    int *seqd = NULL, *ran = NULL, seq[64];
    cudaMalloc((void **)&seqd, 64 * sizeof(int));
    cudaMalloc((void **)&ran, sizeof(int));
    const char *bad_specs[] = {"sideways", "shuffle:", "shuffle:1x", "shufflex", "shuffle:-1",
                               "shuffle: 5", "shuffle:+5", "shuffle:99999999999999999999999", ""};
    for (const char *b : bad_specs) CHECK(emu_set_order(b) == -1, "ACT_EMU_ORDER \"%s\" accepted", b);
    CHECK(emu_set_order("shuffle:0") == 0 && emu_set_order("shuffle:18446744073709551615") == 0,
          "a good shuffle seed refused");
    const char *orders[] = {"forward", "reverse", "shuffle", "shuffle:7"};
    for (const char *o : orders) {
        CHECK(emu_set_order(o) == 0, "order %s refused", o);
        check_barriers_and_shuffles();           /* correct kernels: right in every order */
        int nb[2];
        for (int d = -1; d <= 1; d += 2) {
            wrong_neighbours(x, xd, yd, d, 1, nb);
            CHECK(nb[0] == 0 && nb[1] == 0, "order %s, neighbour %+d with the barrier: wrong", o, d);
        }
        /* a block that returns before the barrier, whichever runs first: no fault */
        float *ld = dev_upload(NULL, 256), lh[256];
        emu_launch(last_block_exits_kernel, 4, 64)(ld);
        CHECK(cudaMemcpy(lh, ld, sizeof lh, cudaMemcpyDeviceToHost) == cudaSuccess &&
              lh[64 + 5] == 58.0f, "order %s: a legal early return of the last block failed", o);
        cudaFree(ld);
        /* without the barrier: both the probe block (fibers) and the plain block show it */
        int lo[2], hi[2];
        wrong_neighbours(x, xd, yd, -1, 0, lo);
        wrong_neighbours(x, xd, yd, +1, 0, hi);
        for (int blk = 0; blk < 2; blk++) {
            const char *how = blk ? "plain calls" : "fibers";
            if (!strcmp(o, "forward"))
                CHECK(lo[blk] == 0 && hi[blk] > 0, "forward, %s: lower neighbour %d wrong (0 "
                      "expected), upper %d (>0 expected)", how, lo[blk], hi[blk]);
            else if (!strcmp(o, "reverse"))
                CHECK(lo[blk] > 0 && hi[blk] == 0, "reverse, %s: lower neighbour %d wrong (>0 "
                      "expected), upper %d (0 expected)", how, lo[blk], hi[blk]);
            else
                CHECK(lo[blk] > 0 && hi[blk] > 0, "%s, %s: lower neighbour %d wrong, upper %d "
                      "(both >0 expected)", o, how, lo[blk], hi[blk]);
        }
        /* the blocks' order: forward 0..63; reverse 0 (the probe), then 63..1; shuffle neither */
        int perm = block_sequence(seqd, ran, seq), fwd = 1, rev = seq[0] == 0;
        for (int i = 0; i < 64; i++) fwd &= seq[i] == i;
        for (int i = 1; i < 64; i++) rev &= seq[i] == 64 - i;
        CHECK(perm && seq[0] == 0, "order %s: blocks did not each run once, (0,0,0) first", o);
        if (!strcmp(o, "forward")) CHECK(fwd, "forward: blocks out of order");
        else if (!strcmp(o, "reverse")) CHECK(rev, "reverse: blocks not 0, 63, 62, ..., 1");
        else CHECK(!fwd && !rev, "%s: the blocks ran forward or reversed", o);
        int chain = chain_in_order(cd);
        int war = wrong_two_sums(xd, yd, 0);
        CHECK(wrong_two_sums(xd, yd, 1) == 0, "order %s: two guarded block sums wrong", o);
        if (!strcmp(o, "forward"))               /* the warps move in step: not seen */
            CHECK(war == 0, "forward: unguarded block sums %d wrong (0 expected)", war);
        else
            CHECK(war > 0, "%s: unguarded block sums right: a warp running ahead was not "
                  "modeled", o);
        CHECK(chain == !strcmp(o, "forward"), "order %s: block b reading block b-1's value %s", o,
              chain ? "saw it written" : "read it unwritten");
    }
    emu_set_order("forward");
    cudaFree(xd); cudaFree(yd); cudaFree(cd); cudaFree(seqd); cudaFree(ran);
}

static void check_deferred_streams(void) {
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    float h[64], *pin = NULL;
    for (int i = 0; i < 64; i++) h[i] = urand(-1, 1);
    cudaMallocHost((void **)&pin, sizeof h);
    float *d = dev_upload(h, 64);
    emu_launch(add_kernel, 1, 64, 0, st)(d, 2.0f, 64);
    memset(pin, 0, sizeof h);
    cudaMemcpyAsync(pin, d, sizeof h, cudaMemcpyDeviceToHost, st);
    CHECK(pin[5] == 0.0f, "a pinned download landed before the stream was synchronized");
    cudaStreamSynchronize(st);
    CHECK(pin[5] == h[5] + 2.0f, "after synchronize: %g, want %g", pin[5], h[5] + 2.0f);
    /* pageable upload is staged at the call: changing the source afterwards changes nothing */
    float src[64];
    memcpy(src, h, sizeof h);
    cudaMemcpyAsync(d, src, sizeof h, cudaMemcpyHostToDevice, st);
    src[7] = 1234.0f;
    float back[64];
    cudaMemcpyAsync(back, d, sizeof h, cudaMemcpyDeviceToHost, st);   /* pageable: synchronous */
    CHECK(back[7] == h[7], "pageable upload not staged at the call: %g", back[7]);
    /* pinned upload reads the source when it runs */
    memcpy(pin, h, sizeof h);
    cudaMemcpyAsync(d, pin, sizeof h, cudaMemcpyHostToDevice, st);
    pin[9] = 99.0f;
    cudaStreamSynchronize(st);
    cudaMemcpy(back, d, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(back[9] == 99.0f, "pinned upload read its source early: %g", back[9]);
    /* a 2D upload: 3 rows of 10 values, 20 apart in pinned memory, land dense */
    for (int i = 0; i < 64; i++) pin[i] = urand(-1, 1);
    CHECK(cudaMemcpy2DAsync(d, 10 * sizeof(float), pin, 20 * sizeof(float), 10 * sizeof(float), 3,
                            cudaMemcpyHostToDevice, st) == cudaSuccess, "cudaMemcpy2DAsync");
    cudaStreamSynchronize(st);
    cudaMemcpy(back, d, 30 * sizeof(float), cudaMemcpyDeviceToHost);
    int wrong = 0;
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < 10; j++) wrong += back[r * 10 + j] != pin[r * 20 + j];
    CHECK(wrong == 0, "cudaMemcpy2DAsync: %d values wrong", wrong);
    CHECK(cudaMemcpy2DAsync(d, 8, pin, 80, 16, 2, cudaMemcpyHostToDevice, st) == cudaErrorInvalidPitchValue,
          "a width wider than the destination pitch was accepted");
    CHECK(cudaMemcpy2DAsync(d, 80, pin, 40, 40, 4, cudaMemcpyHostToDevice, st) == cudaErrorInvalidValue,
          "a 2D upload past the end of its device block was accepted");
    cudaGetLastError();
    /* fresh device memory is poisoned (NaN), never zeros */
    float *fresh = dev_upload(NULL, 4), fh[4];
    cudaMemcpy(fh, fresh, sizeof fh, cudaMemcpyDeviceToHost);
    CHECK(fh[0] != fh[0], "fresh device memory is not poisoned: %g", fh[0]);
    cudaFree(fresh);
    cudaFree(d);
    cudaFreeHost(pin);
    cudaStreamDestroy(st);
}

static void check_capture(void) {
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    float h[32], *pin = NULL;
    for (int i = 0; i < 32; i++) h[i] = urand(-1, 1);
    cudaMallocHost((void **)&pin, sizeof h);
    float *d = dev_upload(h, 32);
    /* a graph replays its kernels with the values of capture time, on today's memory */
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "begin");
    emu_launch(add_kernel, 1, 32, 0, st)(d, 1.5f, 32);
    cudaMemcpyAsync(pin, d, sizeof h, cudaMemcpyDeviceToHost, st);
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(st, &g) == cudaSuccess && g, "end capture");
    cudaGraphExec_t ex = NULL;
    CHECK(cudaGraphInstantiate(&ex, g, 0) == cudaSuccess, "instantiate");
    cudaGraphDestroy(g);
    cudaMemcpy(pin, d, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(pin[3] == h[3], "capture ran the kernel: %g", pin[3]);
    cudaGraphLaunch(ex, st);
    cudaGraphLaunch(ex, st);
    cudaStreamSynchronize(st);
    CHECK(pin[3] == h[3] + 3.0f, "two replays: %g, want %g", pin[3], h[3] + 3.0f);
    /* forbidden calls during capture: each fails and invalidates the capture */
    const char *names[4] = {"cudaMalloc", "cudaStreamSynchronize", "cudaMemcpy", "pageable copy"};
    for (int k = 0; k < 4; k++) {
        cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
        emu_launch(add_kernel, 1, 32, 0, st)(d, 1.0f, 32);
        cudaError_t e;
        void *p = NULL;
        float page[32];
        if (k == 0) e = cudaMalloc(&p, 64);
        else if (k == 1) e = cudaStreamSynchronize(st);
        else if (k == 2) e = cudaMemcpy(page, d, sizeof page, cudaMemcpyDeviceToHost);
        else e = cudaMemcpyAsync(page, d, sizeof page, cudaMemcpyDeviceToHost, st);
        CHECK(e == cudaErrorStreamCaptureUnsupported, "%s during capture returned %d", names[k], e);
        g = NULL;
        CHECK(cudaStreamEndCapture(st, &g) == cudaErrorStreamCaptureInvalidated && !g,
              "capture not invalidated by %s", names[k]);
        cudaGetLastError();
    }
    /* the stream works again after an invalidated capture */
    emu_launch(add_kernel, 1, 32, 0, st)(d, 1.0f, 32);
    CHECK(cudaStreamSynchronize(st) == cudaSuccess, "stream after a failed capture");
    /* a refused configuration is an ordinary (not sticky) error */
    emu_launch(add_kernel, 1, 1025, 0, st)(d, 1.0f, 32);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads accepted");
    emu_launch(add_kernel, dim3(1, 70000), 32, 0, st)(d, 1.0f, 32);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid.y 70000 accepted");
    CHECK(cudaGetLastError() == cudaSuccess, "error not cleared by cudaGetLastError");
    cudaGraphExecDestroy(ex);
    cudaFree(d);
    cudaFreeHost(pin);
    cudaStreamDestroy(st);
}

/* the refusals tests inject (ACT_EMU_MALLOC, ACT_EMU_CAPTURE): each fails its call with the
 * error the real one would give, leaves it in the last-error slot, and nothing after it */
static void check_injected_refusals(void) {
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    float h[32];
    for (int i = 0; i < 32; i++) h[i] = urand(-1, 1);
    float *d = dev_upload(h, 32);
    void *p = NULL;
    setenv("ACT_EMU_MALLOC", "fail", 1);
    CHECK(cudaMalloc(&p, 64) == cudaErrorMemoryAllocation && !p, "ACT_EMU_MALLOC=fail: allocated");
    unsetenv("ACT_EMU_MALLOC");
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "the refused cudaMalloc's error");
    CHECK(cudaMalloc(&p, 64) == cudaSuccess && p, "cudaMalloc after ACT_EMU_MALLOC");
    cudaFree(p);
    setenv("ACT_EMU_CAPTURE", "refuse-begin", 1);
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) ==
          cudaErrorStreamCaptureUnsupported, "ACT_EMU_CAPTURE=refuse-begin: capture began");
    emu_launch(add_kernel, 1, 32, 0, st)(d, 1.0f, 32);   /* not captured: it runs */
    CHECK(cudaStreamSynchronize(st) == cudaSuccess, "the stream after a refused begin");
    setenv("ACT_EMU_CAPTURE", "invalidate", 1);
    cudaGetLastError();
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess,
          "ACT_EMU_CAPTURE=invalidate: begin");
    emu_launch(add_kernel, 1, 32, 0, st)(d, 1.0f, 32);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated, "a launch into an invalidated "
          "capture");
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(st, &g) == cudaErrorStreamCaptureInvalidated && !g,
          "ACT_EMU_CAPTURE=invalidate: the capture ended with a graph");
    setenv("ACT_EMU_CAPTURE", "refuse-instantiate", 1);
    cudaGetLastError();
    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    emu_launch(add_kernel, 1, 32, 0, st)(d, 1.0f, 32);
    CHECK(cudaStreamEndCapture(st, &g) == cudaSuccess && g, "refuse-instantiate: end capture");
    cudaGraphExec_t ex = NULL;
    CHECK(cudaGraphInstantiate(&ex, g, 0) == cudaErrorNotSupported && !ex,
          "ACT_EMU_CAPTURE=refuse-instantiate: instantiated");
    CHECK(cudaGetLastError() == cudaErrorNotSupported, "the refused instantiate's error");
    unsetenv("ACT_EMU_CAPTURE");
    CHECK(cudaGraphInstantiate(&ex, g, 0) == cudaSuccess && ex, "instantiate without refusal");
    cudaGraphDestroy(g);
    cudaGraphExecDestroy(ex);
    float back[32];
    cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost);
    CHECK(back[5] == h[5] + 1.0f, "only the uncaptured launch ran: %g, want %g", back[5],
          h[5] + 1.0f);
    cudaFree(d);
    cudaStreamDestroy(st);
}

/* ---- two streams: events, waits, forked capture ---- */

/* y = 2x: a kernel that reads a buffer another stream writes */
static __global__ void double_kernel(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}

enum { kN = 64 };

static void fill(float *p, int n) {
    for (int i = 0; i < n; i++) p[i] = urand(-1, 1);
}
/* how many of got[0..n) differ from 2 * want[i] */
static int doubled_wrong(const float *got, const float *want, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) bad += got[i] != 2.0f * want[i];
    return bad;
}

/* Eager waits. The side stream's work runs as late as the waits allow, so a kernel that did
 * not wait reads the buffer's old content. */
static void check_eager_waits(void) {
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaEvent_t ready, never;
    CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming) == cudaSuccess &&
          cudaEventCreateWithFlags(&never, cudaEventDisableTiming) == cudaSuccess,
          "cudaEventCreateWithFlags(cudaEventDisableTiming)");
    float old[kN], fresh[kN], later[kN], back[kN], *pin = NULL, *pin2 = NULL, *out = NULL;
    fill(old, kN);
    fill(fresh, kN);
    fill(later, kN);
    cudaMallocHost((void **)&pin, sizeof fresh);
    cudaMallocHost((void **)&pin2, sizeof fresh);
    cudaMallocHost((void **)&out, sizeof fresh);
    float *d = dev_upload(old, kN), *d2 = dev_upload(old, kN), *y = dev_upload(NULL, kN);

    /* with the wait: the kernel sees the upload */
    memcpy(pin, fresh, sizeof fresh);
    cudaMemcpyAsync(d, pin, sizeof fresh, cudaMemcpyHostToDevice, b);
    cudaEventRecord(ready, b);
    CHECK(cudaStreamWaitEvent(a, ready, 0) == cudaSuccess, "cudaStreamWaitEvent");
    emu_launch(double_kernel, 1, kN, 0, a)(d, y, kN);
    cudaMemcpyAsync(out, y, sizeof fresh, cudaMemcpyDeviceToHost, a);
    CHECK(cudaStreamSynchronize(a) == cudaSuccess, "synchronize after a wait");
    CHECK(doubled_wrong(out, fresh, kN) == 0, "a kernel that waited for the upload: %d values "
          "wrong", doubled_wrong(out, fresh, kN));

    /* without it: the upload on b has not run when a is synchronized */
    memcpy(pin, later, sizeof later);
    cudaMemcpyAsync(d, pin, sizeof later, cudaMemcpyHostToDevice, b);
    emu_launch(double_kernel, 1, kN, 0, a)(d, y, kN);
    cudaMemcpyAsync(out, y, sizeof later, cudaMemcpyDeviceToHost, a);
    cudaStreamSynchronize(a);
    CHECK(doubled_wrong(out, fresh, kN) == 0, "a kernel that did not wait: %d values are not the "
          "old content (the side stream ran early)", doubled_wrong(out, fresh, kN));
    cudaStreamSynchronize(b);
    cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost);
    CHECK(memcmp(back, later, sizeof back) == 0, "the side stream's upload after synchronizing it");

    /* a wait runs the side stream only as far as the record it waits on: the second upload (d2)
     * and anything after the record stay queued; re-recording the event later changes nothing */
    memcpy(pin, fresh, sizeof fresh);
    memcpy(pin2, later, sizeof later);
    cudaMemcpyAsync(d, pin, sizeof fresh, cudaMemcpyHostToDevice, b);
    cudaEventRecord(ready, b);
    cudaStreamWaitEvent(a, ready, 0);
    cudaMemcpyAsync(d2, pin2, sizeof later, cudaMemcpyHostToDevice, b);
    cudaEventRecord(ready, b);
    emu_launch(double_kernel, 1, kN, 0, a)(d2, y, kN);
    cudaMemcpyAsync(out, y, sizeof old, cudaMemcpyDeviceToHost, a);
    cudaStreamSynchronize(a);
    CHECK(doubled_wrong(out, old, kN) == 0, "a wait ran the side stream past its record: %d "
          "values are not d2's old content", doubled_wrong(out, old, kN));
    /* cudaEventSynchronize runs the recording stream up to the newest record */
    CHECK(cudaEventSynchronize(ready) == cudaSuccess, "cudaEventSynchronize");
    cudaMemcpy(back, d2, sizeof back, cudaMemcpyDeviceToHost);
    CHECK(memcmp(back, later, sizeof back) == 0, "cudaEventSynchronize did not run the stream up "
          "to the re-recorded event");

    /* a never-recorded event is complete: waiting on it is a no-op */
    CHECK(cudaStreamWaitEvent(a, never, 0) == cudaSuccess, "waiting on a never-recorded event");
    emu_launch(double_kernel, 1, kN, 0, a)(d2, y, kN);
    cudaMemcpyAsync(out, y, sizeof later, cudaMemcpyDeviceToHost, a);
    CHECK(cudaStreamSynchronize(a) == cudaSuccess && doubled_wrong(out, later, kN) == 0,
          "a stream after waiting on a never-recorded event");

    /* timing: refused for cudaEventDisableTiming events, as real CUDA does */
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreateWithFlags(&t1, cudaEventBlockingSync);
    cudaEventRecord(t0, a);
    cudaEventRecord(never, a);
    cudaEventRecord(t1, a);
    cudaEventSynchronize(t1);
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess && ms >= 0, "elapsed time: %g", ms);
    CHECK(cudaEventElapsedTime(&ms, t0, never) == cudaErrorInvalidResourceHandle,
          "elapsed time of a cudaEventDisableTiming event");
    cudaEvent_t bad = NULL;
    CHECK(cudaEventCreateWithFlags(&bad, 0x4) == cudaErrorInvalidValue, "interprocess flag "
          "accepted");
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "last error");
    CHECK(cudaGetLastError() == cudaSuccess, "error not cleared");
    cudaEventDestroy(t0); cudaEventDestroy(t1); cudaEventDestroy(ready); cudaEventDestroy(never);
    cudaFree(d); cudaFree(d2); cudaFree(y);
    cudaFreeHost(pin); cudaFreeHost(pin2); cudaFreeHost(out);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
}

/* The engine's upload pattern, captured: `copy` joins main's capture at the fork event, uploads
 * each camera and records ready[cam]; main waits ready[cam] before the kernel that reads it.
 * With late_wait, camera 1's kernel is issued before its wait (the wait, still the join, comes
 * after it). NULL when a call failed. */
struct fork_graph {
    cudaStream_t main, copy;
    cudaEvent_t fork, ready[2];
    float *pin[2], *dev[2], *y, *out;
};
static cudaGraphExec_t capture_fork(fork_graph *f, int late_wait) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    if (cudaStreamBeginCapture(f->main, cudaStreamCaptureModeThreadLocal)) return NULL;
    cudaEventRecord(f->fork, f->main);
    cudaStreamWaitEvent(f->copy, f->fork, 0);
    for (int c = 0; c < 2; c++) {
        cudaMemcpyAsync(f->dev[c], f->pin[c], kN * sizeof(float), cudaMemcpyHostToDevice, f->copy);
        cudaEventRecord(f->ready[c], f->copy);
    }
    for (int c = 0; c < 2; c++) {
        if (!(late_wait && c == 1)) cudaStreamWaitEvent(f->main, f->ready[c], 0);
        emu_launch(double_kernel, 1, kN, 0, f->main)(f->dev[c], f->y + c * kN, kN);
    }
    if (late_wait) cudaStreamWaitEvent(f->main, f->ready[1], 0);
    cudaMemcpyAsync(f->out, f->y, 2 * kN * sizeof(float), cudaMemcpyDeviceToHost, f->main);
    if (cudaStreamEndCapture(f->main, &g) == cudaSuccess) cudaGraphInstantiate(&ex, g, 0);
    cudaGraphDestroy(g);
    return ex;
}

static void fork_setup(fork_graph *f, const float *old) {
    cudaStreamCreateWithFlags(&f->main, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&f->copy, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&f->fork, cudaEventDisableTiming);
    for (int c = 0; c < 2; c++) {
        cudaEventCreateWithFlags(&f->ready[c], cudaEventDisableTiming);
        cudaMallocHost((void **)&f->pin[c], kN * sizeof(float));
        f->dev[c] = dev_upload(old + c * kN, kN);
    }
    f->y = dev_upload(NULL, 2 * kN);
    cudaMallocHost((void **)&f->out, 2 * kN * sizeof(float));
}

static void fork_free(fork_graph *f) {
    for (int c = 0; c < 2; c++) {
        cudaEventDestroy(f->ready[c]);
        cudaFreeHost(f->pin[c]);
        cudaFree(f->dev[c]);
    }
    cudaEventDestroy(f->fork);
    cudaFree(f->y);
    cudaFreeHost(f->out);
    cudaStreamDestroy(f->main);
    cudaStreamDestroy(f->copy);
}

static void check_forked_capture(void) {
    float old[2 * kN], data[4][2 * kN];     /* 0, 1: the joined graph's replays; 2, 3: late */
    fill(old, 2 * kN);
    for (int r = 0; r < 4; r++) fill(data[r], 2 * kN);
    fork_graph f;
    fork_setup(&f, old);
    cudaGraphExec_t ex = capture_fork(&f, 0);
    CHECK(ex != NULL, "capture of the fork/join upload pattern");
    for (int r = 0; ex && r < 2; r++) {
        for (int c = 0; c < 2; c++) memcpy(f.pin[c], data[r] + c * kN, kN * sizeof(float));
        cudaGraphLaunch(ex, f.main);
        CHECK(cudaStreamSynchronize(f.main) == cudaSuccess, "replay %d", r);
        CHECK(doubled_wrong(f.out, data[r], 2 * kN) == 0, "replay %d of the joined graph: %d "
              "values wrong", r, doubled_wrong(f.out, data[r], 2 * kN));
    }
    /* the copy stream is an ordinary stream again after the capture */
    emu_launch(double_kernel, 1, kN, 0, f.copy)(f.dev[0], f.y, kN);
    CHECK(cudaStreamSynchronize(f.copy) == cudaSuccess, "the joined stream after the capture");
    cudaGraphExecDestroy(ex);

    /* camera 1's kernel runs before its upload: it reads the previous replay's data */
    ex = capture_fork(&f, 1);
    CHECK(ex != NULL, "capture with a late wait");
    for (int r = 0; ex && r < 2; r++) {
        const float *prev1 = data[r + 1] + kN;    /* what dev[1] holds from the replay before */
        for (int c = 0; c < 2; c++) memcpy(f.pin[c], data[r + 2] + c * kN, kN * sizeof(float));
        cudaGraphLaunch(ex, f.main);
        CHECK(cudaStreamSynchronize(f.main) == cudaSuccess, "late-wait replay %d", r);
        CHECK(doubled_wrong(f.out, data[r + 2], kN) == 0, "late-wait replay %d, camera 0: %d "
              "values wrong", r, doubled_wrong(f.out, data[r + 2], kN));
        CHECK(doubled_wrong(f.out + kN, prev1, kN) == 0, "late-wait replay %d: camera 1's kernel "
              "did not read the stale buffer (%d values differ)", r,
              doubled_wrong(f.out + kN, prev1, kN));
    }
    float back[kN];
    cudaMemcpy(back, f.dev[1], sizeof back, cudaMemcpyDeviceToHost);
    CHECK(memcmp(back, data[3] + kN, sizeof back) == 0, "the side lane's last upload never ran");
    cudaGraphExecDestroy(ex);
    fork_free(&f);
}

/* capture rules for the joined streams */
static void check_capture_joins(void) {
    float old[2 * kN];
    fill(old, 2 * kN);
    fork_graph f;
    fork_setup(&f, old);
    cudaGraph_t g = NULL;

    /* a fork never joined back, and one joined back before its last upload */
    for (int k = 0; k < 2; k++) {
        cudaStreamBeginCapture(f.main, cudaStreamCaptureModeThreadLocal);
        cudaEventRecord(f.fork, f.main);
        cudaStreamWaitEvent(f.copy, f.fork, 0);
        cudaMemcpyAsync(f.dev[0], f.pin[0], kN * sizeof(float), cudaMemcpyHostToDevice, f.copy);
        if (k == 1) {
            cudaEventRecord(f.ready[0], f.copy);
            cudaStreamWaitEvent(f.main, f.ready[0], 0);
            cudaMemcpyAsync(f.dev[1], f.pin[1], kN * sizeof(float), cudaMemcpyHostToDevice, f.copy);
        }
        emu_launch(double_kernel, 1, kN, 0, f.main)(f.dev[0], f.y, kN);
        g = NULL;
        cudaError_t e = cudaStreamEndCapture(f.main, &g);
        CHECK(e == cudaErrorStreamCaptureUnjoined && !g, "%s: cudaStreamEndCapture returned %d",
              k ? "upload after the join" : "fork never joined", e);
        cudaGetLastError();
        emu_launch(double_kernel, 1, kN, 0, f.copy)(f.dev[0], f.y, kN);
        CHECK(cudaStreamSynchronize(f.copy) == cudaSuccess, "the copy stream after an unjoined "
              "capture still captures");
    }

    /* joined back through a third stream: main waits on lane 2, which waited on lane 1 */
    cudaStream_t third;
    cudaEvent_t via;
    cudaStreamCreateWithFlags(&third, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&via, cudaEventDisableTiming);
    cudaStreamBeginCapture(f.main, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(f.fork, f.main);
    cudaStreamWaitEvent(f.copy, f.fork, 0);
    cudaStreamWaitEvent(third, f.fork, 0);
    cudaMemcpyAsync(f.dev[0], f.pin[0], kN * sizeof(float), cudaMemcpyHostToDevice, f.copy);
    cudaEventRecord(f.ready[0], f.copy);
    cudaStreamWaitEvent(third, f.ready[0], 0);
    emu_launch(double_kernel, 1, kN, 0, third)(f.dev[0], f.y, kN);
    cudaEventRecord(via, third);
    cudaStreamWaitEvent(f.main, via, 0);
    g = NULL;
    CHECK(cudaStreamEndCapture(f.main, &g) == cudaSuccess && g, "a lane joined back through "
          "another lane");
    cudaGraphDestroy(g);

    /* inside a capture, a wait on an event recorded outside it (CUDA wants
     * cudaEventWaitExternal), and a joined stream's synchronize: each invalidates */
    cudaEventRecord(via, third);
    cudaStreamBeginCapture(f.main, cudaStreamCaptureModeThreadLocal);
    CHECK(cudaStreamWaitEvent(f.main, via, 0) == cudaErrorStreamCaptureIsolation, "a capture "
          "waited on an event recorded outside it");
    g = NULL;
    CHECK(cudaStreamEndCapture(f.main, &g) == cudaErrorStreamCaptureInvalidated && !g,
          "capture not invalidated by a wait on an outside event");
    cudaStreamBeginCapture(f.main, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(f.fork, f.main);
    cudaStreamWaitEvent(f.copy, f.fork, 0);
    CHECK(cudaStreamSynchronize(f.copy) == cudaErrorStreamCaptureUnsupported, "a joined stream "
          "synchronized during the capture");
    CHECK(cudaStreamEndCapture(f.copy, &g) == cudaErrorStreamCaptureUnmatched, "a joined stream "
          "ended the capture");
    g = NULL;
    CHECK(cudaStreamEndCapture(f.main, &g) == cudaErrorStreamCaptureInvalidated && !g,
          "capture not invalidated by a joined stream's synchronize");
    /* a wait on an event of a capture that has ended */
    CHECK(cudaStreamWaitEvent(f.copy, f.fork, 0) == cudaErrorCapturedEvent, "a wait on an event "
          "last recorded in an ended capture");
    cudaGetLastError();
    emu_launch(double_kernel, 1, kN, 0, f.copy)(f.dev[0], f.y, kN);
    CHECK(cudaStreamSynchronize(f.copy) == cudaSuccess && cudaStreamSynchronize(f.main) == 0,
          "the streams after the failed captures");
    cudaEventDestroy(via);
    cudaStreamDestroy(third);
    fork_free(&f);
}

/* a two-lane graph replayed after the side lane's destination was freed */
static int child_lane_copy_after_free(void) {
    float old[2 * kN];
    fill(old, 2 * kN);
    fork_graph f;
    fork_setup(&f, old);
    cudaGraphExec_t ex = capture_fork(&f, 0);
    if (!ex || cudaFree(f.dev[1]) != cudaSuccess || cudaGraphLaunch(ex, f.main)) return 2;
    return cudaStreamSynchronize(f.main) == cudaErrorIllegalAddress;
}

int main(void) {
    check_barriers_and_shuffles();
    check_orders();
    check_deferred_streams();
    check_capture();
    check_injected_refusals();
    check_free_rules();
    check_eager_waits();
    check_forked_capture();
    check_capture_joins();
    in_child("threads of one warp split between __syncwarp and __syncthreads", child_divergent);
    in_child("a full-mask shuffle after half the warp returned", child_exited_shuffle);
    in_child("static + dynamic shared memory over 48 KB", child_static_dynamic_smem,
             {"1024 bytes of static and 48129 of dynamic shared memory pass 48 KB"});
    for (const char *o : {"reverse", "shuffle:3"}) {     /* a warp at a time: the same faults */
        emu_set_order(o);
        in_child("a divergent barrier, a warp at a time", child_divergent, {"divergent barrier"});
        in_child("a shuffle after exited lanes, a warp at a time", child_exited_shuffle,
                 {"after 16 of its lanes exited"});
    }
    emu_set_order("forward");
    in_child("a host pointer given to a kernel", child_host_pointer);
    in_child("a pinned host pointer given to a kernel", child_pinned_kernel_arg);
    in_child("a kernel graph replayed after its buffer was freed", child_replay_after_free,
             {"FAULT in add_kernel: kernel add_kernel, argument 1 (", kStaleLaunch});
    in_child("a kernel graph replayed after its buffer was freed and reallocated",
             child_replay_after_realloc, {"add_kernel, argument 1 (", kStaleLaunch});
    in_child("a graph copying from a freed buffer", child_copy_after_free,
             {"the source (", kStaleCall});
    in_child("a graph setting a freed buffer", child_memset_after_free,
             {"the destination (", kStaleCall});
    in_child("a two-lane graph uploading into a freed buffer", child_lane_copy_after_free,
             {"the destination (", kStaleCall});
    printf("cuda emulator runtime: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
