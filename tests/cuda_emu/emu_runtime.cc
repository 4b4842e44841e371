/* emu_runtime.cc (CUDA emulator) - the CUDA runtime subset of cuda_runtime.h on the host, strict
 * enough to find the bugs a first GPU run would find, fast enough to run whole forward passes in
 * CI.
 *
 * Execution model
 *  - One emulated device (sm_90). Device memory is host memory (posix_memalign), registered so
 *    that copies, kernels and the emulated libraries can tell device from host pointers, and
 *    poisoned with 0xFF bytes (NaN in every float type) as real cudaMalloc returns garbage.
 *    Under AddressSanitizer each allocation has red zones: an out-of-range kernel access is
 *    reported like compute-sanitizer's memcheck would.
 *  - Streams are deferred: an operation is queued and runs when something waits for it
 *    (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a synchronous copy:
 *    the legacy stream's work and that of the blocking streams, as the legacy stream waits).
 *    So host code that reads results without synchronizing reads stale data, as on a GPU.
 *    Pageable host memory behaves as documented: a host-to-device copy from it is staged at the
 *    call, a device-to-host copy into it waits for the stream; pinned memory is read and
 *    written when the copy runs.
 *  - A kernel runs block after block. The first block runs its threads as fibers,
 *    switching at __syncthreads, __syncwarp and shuffles, which release only when every live
 *    thread of the block (or warp) has arrived; a barrier that can never release (threads of
 *    one warp split between __syncwarp and __syncthreads) is reported as a fault. When the
 *    first block met no barrier, the remaining blocks run as plain calls, thread after thread.
 *  - ACT_EMU_ORDER sets the order threads run in between barriers, and blocks in a grid:
 *    "forward" (the default: thread 0 first, block (0,0,0) first), "reverse", or "shuffle[:SEED]"
 *    (a new seeded permutation of the threads at every barrier round, and of the blocks at every
 *    launch: an affine one, k -> a k + b mod n, not every permutation). Block (0,0,0) still runs
 *    first in each: it is the block that decides fibers or plain calls (above). A kernel that reads shared or global memory another thread writes without a
 *    barrier between them gets the right answer in only some orders: forward misses a thread
 *    reading what a lower-numbered thread wrote, reverse misses the other way. Running a test
 *    suite in all three is this emulator's answer to compute-sanitizer's racecheck, which it
 *    does not replace: blocks never run at once here, so memory ordering between them (a
 *    missing __threadfence) is not modeled. Lanes of a warp do not run in lockstep in any
 *    order, so code that leans on lockstep instead of __syncwarp is caught, not hidden.
 *  - Streams are ordered by events, adversarially: work on one stream runs only when something
 *    needs it. cudaStreamWaitEvent(a, ev) queues a wait on a that, when a reaches it, runs the
 *    recording stream up to and including that record (the newest at the time of the wait) and
 *    no further; cudaEventSynchronize runs it that far too. So a stream that reads what another
 *    one writes without waiting reads the old content, which a GPU shows only now and then.
 *  - Stream capture records operations into a graph instead of queueing them; a graph launch
 *    queues the recorded operations with the argument values of capture time. A stream that
 *    waits on an event recorded in a capture joins it as another lane; waits become edges
 *    between lanes. cudaStreamEndCapture fails with cudaErrorStreamCaptureUnjoined when a lane
 *    has work after the last of its events the capturing stream (or a lane joined back) waited
 *    on. A replay runs lane 0 in order and another lane's nodes only when a node about to run
 *    waits on them (exactly that far), the rest at the end: a missing edge reads stale data.
 *    Waiting in a capture on an event recorded outside it fails (cudaErrorStreamCaptureIsolation:
 *    CUDA needs cudaEventWaitExternal, not emulated) and invalidates the capture. While a thread
 *    captures (global or thread-local mode) the calls CUDA forbids then (cudaMalloc, cudaFree,
 *    synchronous copies, stream/event/device synchronization) fail with
 *    cudaErrorStreamCaptureUnsupported and invalidate the capture, so cudaStreamEndCapture
 *    returns cudaErrorStreamCaptureInvalidated - the "operation not permitted when stream is
 *    capturing" class of bugs. A captured copy must use pinned host memory.
 *  - A kernel argument that points into host memory, a launch configuration CUDA would refuse
 *    (block > 1024 threads, grid.y/z > 65535, dynamic shared memory > 48 KB, a zero dimension),
 *    a CUDA call from inside a host function: reported with the kernel's name. Static
 *    __shared__ variables count against the 48 KB too, but the emulator learns their size only
 *    as the kernel runs (emu_static_smem, added by translate.sh), so a launch over it is a fault
 *    when it runs rather than the launch error a GPU gives.
 *  - Every operation remembers which live allocation each of its device pointers pointed into
 *    at the call (kernel arguments, library operands and workspaces, async copy and memset
 *    ranges) and checks before each run - deferred, and every replay of a captured graph -
 *    that it is still that allocation: a graph replayed after cudaFree of one of its buffers
 *    faults (a GPU would corrupt memory silently). Allocations carry serial numbers, so a new
 *    one at the freed address does not hide it. cudaFree waits for the device first, as the
 *    real one does, so work already queued on a buffer runs before the buffer goes.
 *  - Faults found while an operation runs are sticky, as on a GPU: every later call returns
 *    cudaErrorIllegalAddress. Each fault is printed to stderr ("cuda-emu: ...").
 * Not emulated: concurrency between streams (one runs at a time, in the order above), timing
 * (events read the host clock when they run), occupancy and registers, and warp-synchronous
 * code that relies on lockstep execution without __syncwarp (undefined since Volta anyway).
 * ACT_EMU_TRACE=1 prints each instantiated graph's node and lane counts, and at exit the
 * operations run (and graphLaunch: the graph launches); =2 also lists the nodes in replay order, each with its lane. ACT_EMU_FAULT_FILE=path injects a device fault: once that file
 * exists, the next operation to run faults (sticky, like an Xid on a GPU), so tests can see how
 * a program lives through a GPU that fails mid-run. Refusals a real GPU may give, read at each
 * call so tests can flip them: ACT_EMU_MALLOC=fail makes every cudaMalloc fail with
 * cudaErrorMemoryAllocation (a GPU shared with other processes, out of memory);
 * ACT_EMU_MEMGETINFO=fail makes cudaMemGetInfo fail (cudaErrorNotSupported), as a sandbox's GPU
 * proxy may; ACT_EMU_CAPTURE=refuse-begin makes cudaStreamBeginCapture fail
 * (cudaErrorStreamCaptureUnsupported), =invalidate begins every capture invalidated, as a
 * library call that does what a capture forbids leaves it (each operation recorded into it, and
 * cudaStreamEndCapture, returns cudaErrorStreamCaptureInvalidated), =refuse-instantiate makes
 * cudaGraphInstantiate fail (cudaErrorNotSupported), =refuse-launch makes cudaGraphLaunch fail
 * (cudaErrorNotSupported, nothing run). Each leaves its error in the thread's
 * last-error slot, as the real calls do. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <ucontext.h>   /* fibers on other machines than x86-64 */

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "emu_internal.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
/* the bounds of the __shared__ variables of this module (emu_device.h), from the linker */
extern "C" char __start_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_emu_shared[] __attribute__((weak, visibility("hidden")));

namespace {

struct Op {
    std::string what;
    const char *kind;   /* "kernel", "gemm", "conv", "memcpy", "memset", "host", "event", "wait" */
    std::function<void(void)> fn;
    /* device operands re-checked before every run; shared, as a graph replay copies its nodes */
    std::shared_ptr<const emu_operands> operands;
    unsigned long long seq = 0;     /* a queued operation's place among all calls, from 1 */
    int lane = 0;                   /* a graph node's lane (0: the stream the capture began on) */
    long dep = -1;                  /* a captured wait: the record node it waits on */
};

/* a registered block of memory; serial numbers tell a freed allocation from a later one that
 * got the same address */
struct Block {
    size_t bytes;
    unsigned long long serial;
};

/* One stream capture: the graph being recorded, nodes in call order. Lane 0 is the stream the
 * capture began on; a stream that waits on an event recorded in the capture joins it as the
 * next lane, and each captured wait is a node with an edge to the record node it waits on. */
struct Capture {
    bool active = true, invalid = false;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id thread;
    std::vector<Op> nodes;
    std::vector<emu_stream *> lanes;
};

struct Stream {
    unsigned flags = 0;
    std::deque<Op> queue;
    std::shared_ptr<Capture> cap;   /* the capture this stream records into; null when none */
    int lane = 0;                   /* its lane in cap */
};

}  // namespace

struct emu_stream : Stream {};
/* An event's last record: an operation queued on `st` (seq), or a node of a capture. `gen`
 * counts records, so that only the newest one marks the event done when it runs. */
struct emu_event {
    unsigned flags = 0;
    double t = 0;
    bool recorded = false, done = false;
    unsigned long gen = 0;
    emu_stream *st = nullptr;
    unsigned long long seq = 0;
    std::shared_ptr<Capture> cap;
    size_t node = 0;
};
/* a graph's nodes in replay order (see linearize) and how many lanes it has */
struct emu_graph { std::vector<Op> ops; int lanes = 1; };
struct emu_graph_exec { std::vector<Op> ops; int lanes = 1; };

namespace {

std::recursive_mutex g_mu;
emu_stream g_null;                               /* the legacy default stream (handle 0) */
std::set<emu_stream *> g_streams;
std::set<emu_event *> g_events;
std::set<emu_graph_exec *> g_execs;
std::map<uintptr_t, Block> g_dev, g_pinned;      /* by base address */
std::map<uintptr_t, Block> g_registered;         /* cudaHostRegister'ed host ranges */
size_t g_dev_bytes;
unsigned long long g_serial;                     /* of the last allocation */
cudaError_t g_sticky = cudaSuccess;
thread_local cudaError_t t_last = cudaSuccess;
thread_local bool t_in_host_fn = false;
thread_local Capture *t_capture = nullptr;       /* a non-relaxed capture this thread began */
const char *g_running = "";                      /* the operation running now (fault messages) */
unsigned long long g_seq;                        /* of the last queued operation */
std::map<std::string, unsigned long> g_counts;
int g_trace = 0;                                 /* ACT_EMU_TRACE: 1 counts, 2 every node */
const char *g_fault_file = nullptr;              /* ACT_EMU_FAULT_FILE */

constexpr size_t kDevTotal = (size_t)80 << 30;

double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* operations executed (a replayed graph counts each node again), by kind */
void print_counts() {
    if (!g_trace || g_counts.empty()) return;
    fprintf(stderr, "cuda-emu: operations run:");
    for (auto &kv : g_counts) fprintf(stderr, " %s=%lu", kv.first.c_str(), kv.second);
    fprintf(stderr, "\n");
}

struct Init {
    Init() {
        const char *t = getenv("ACT_EMU_TRACE");
        g_trace = t ? atoi(t) : 0;
        const char *f = getenv("ACT_EMU_FAULT_FILE");
        g_fault_file = f && *f ? f : nullptr;
        const char *o = getenv("ACT_EMU_ORDER");
        if (o && *o && emu_set_order(o) != 0) {
            /* a test run meant to shuffle must not silently run forward */
            fprintf(stderr, "cuda-emu: ACT_EMU_ORDER=%s: expected forward, reverse or "
                    "shuffle[:SEED]\n", o);
            exit(2);
        }
        atexit(print_counts);
    }
} g_init;

/* ACT_EMU_CAPTURE (see the top), read at each call */
bool capture_mode(const char *want) {
    const char *e = getenv("ACT_EMU_CAPTURE");
    return e && !strcmp(e, want);
}

cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess) t_last = e;
    return e;
}

emu_stream *resolve(cudaStream_t st) {
    if (!st) return &g_null;
    return g_streams.count(st) ? st : nullptr;
}

/* which registered block holds p; nullptr when none. Pointers one past the end count as inside. */
const std::pair<const uintptr_t, Block> *find_in(const std::map<uintptr_t, Block> &m,
                                                 const void *p) {
    uintptr_t a = (uintptr_t)p;
    auto it = m.upper_bound(a);
    if (it == m.begin()) return nullptr;
    --it;
    if (a <= it->first + it->second.bytes) return &*it;
    return nullptr;
}

/* appends p to *keep when it points into (not one past) a live device allocation */
void remember(const char *what, int arg, const void *p, emu_operands *keep) {
    auto *b = find_in(g_dev, p);
    if (b && (uintptr_t)p < b->first + b->second.bytes)
        keep->push_back(emu_operand{what, arg, p, b->second.serial});
}

/* before an operation runs: is every operand's allocation still the one of the call? */
bool operands_live(const Op &op) {
    for (const emu_operand &o : *op.operands) {
        auto *b = find_in(g_dev, o.p);
        if (b && b->second.serial == o.alloc) continue;
        bool kernel = !strcmp(op.kind, "kernel");
        if (kernel)
            emu_fault("kernel %s, %s %d (%p) points into device memory freed since the launch "
                      "was recorded (a graph replayed after cudaFree?)", op.what.c_str(), o.what,
                      o.arg, o.p);
        else
            emu_fault("%s (%p) points into device memory freed since the call was recorded (a "
                      "graph replayed after cudaFree?)", o.what, o.p);
        return false;
    }
    return true;
}

/* calls that block the host or allocate are forbidden while this thread captures */
bool capture_forbids(const char *call) {
    if (!t_capture) return false;
    if (!t_capture->invalid)
        fprintf(stderr, "cuda-emu: %s during stream capture: not permitted, the capture is "
                "invalidated (cudaErrorStreamCaptureUnsupported)\n", call);
    t_capture->invalid = true;
    t_last = cudaErrorStreamCaptureUnsupported;
    return true;
}

/* entry checks of every runtime call: a CUDA call inside a host function, a sticky fault */
bool api_blocked(cudaError_t *e) {
    if (t_in_host_fn) {
        fprintf(stderr, "cuda-emu: a CUDA call from inside a cudaLaunchHostFunc callback (not "
                "permitted by CUDA)\n");
        *e = ret(cudaErrorNotPermitted);
        return true;
    }
    if (g_sticky != cudaSuccess) {
        *e = ret(g_sticky);
        return true;
    }
    return false;
}
#define API_ENTRY() std::lock_guard<std::recursive_mutex> lk_(g_mu); \
    { cudaError_t e_; if (api_blocked(&e_)) return e_; } (void)0
/* after a fault every call fails, but a free or destroy still releases the host memory behind
 * it (and returns the fault), so that leak checkers see only real leaks */
#define FREE_ENTRY() std::lock_guard<std::recursive_mutex> lk_(g_mu); \
    { cudaError_t e_; if (api_blocked(&e_) && g_sticky == cudaSuccess) return e_; } (void)0

/* runs one operation: the injected fault, the operand checks, then the work. A wait runs other
 * streams' operations from inside its own, hence the saved name. */
void run_op(Op &op) {
    if (g_sticky != cudaSuccess) return;          /* a faulted context runs nothing more */
    const char *outer = g_running;
    g_running = op.what.c_str();
    if (g_fault_file && access(g_fault_file, F_OK) == 0)
        emu_fault("injected fault (ACT_EMU_FAULT_FILE %s exists)", g_fault_file);
    else if (!op.operands || operands_live(op)) {         /* else faulted: nothing more runs */
        g_counts[op.kind]++;
        op.fn();
    }
    g_running = outer;
}

bool stream_alive(emu_stream *s) { return s == &g_null || g_streams.count(s); }

/* runs s's queued operations up to and including the one numbered `upto`, and no further.
 * Each is taken off the queue before it runs, so a wait inside it that reaches back into s
 * finds only later operations (a wait always refers to an earlier call). */
void run_until(emu_stream *s, unsigned long long upto) {
    while (!s->queue.empty() && s->queue.front().seq <= upto) {
        Op op = std::move(s->queue.front());
        s->queue.pop_front();
        run_op(op);
    }
    if (g_sticky != cudaSuccess) s->queue.clear();
}

void flush(emu_stream *s) { run_until(s, ~0ull); }

void flush_all() {
    flush(&g_null);
    for (emu_stream *s : g_streams) flush(s);
}

/* what a synchronous call on the legacy stream waits for: its own work and that of every
 * blocking stream (one created without cudaStreamNonBlocking) */
void flush_legacy() {
    flush(&g_null);
    for (emu_stream *s : g_streams)
        if (!(s->flags & cudaStreamNonBlocking)) flush(s);
}

cudaError_t enqueue_op(emu_stream *s, const char *kind, std::string what,
                       std::function<void(void)> fn, emu_operands operands = {}, long dep = -1) {
    Op op{std::move(what), kind, std::move(fn), nullptr};
    if (!operands.empty()) op.operands = std::make_shared<const emu_operands>(std::move(operands));
    if (s->cap) {
        if (s->cap->invalid) return cudaErrorStreamCaptureInvalidated;
        op.lane = s->lane;
        op.dep = dep;
        s->cap->nodes.push_back(std::move(op));
        return cudaSuccess;
    }
    op.seq = ++g_seq;
    s->queue.push_back(std::move(op));
    return cudaSuccess;
}

/* The order a graph replays its nodes in, as late for the side lanes as the edges allow, so
 * that a node that forgot to wait for another lane's work reads what was there before: lane 0
 * in call order; a node of another lane runs only when a node about to run waits on it (then
 * exactly up to the record waited on); what is left of the other lanes runs at the end. */
std::vector<Op> linearize(const std::vector<Op> &nodes, int nlanes) {
    std::vector<std::vector<size_t>> lane(nlanes);
    for (size_t i = 0; i < nodes.size(); i++) lane[nodes[i].lane].push_back(i);
    std::vector<size_t> next(nlanes, 0);
    std::vector<Op> out;
    std::function<void(int, size_t)> run_to = [&](int l, size_t upto) {
        while (next[l] < lane[l].size() && lane[l][next[l]] <= upto) {
            size_t i = lane[l][next[l]++];
            if (nodes[i].dep >= 0) run_to(nodes[nodes[i].dep].lane, (size_t)nodes[i].dep);
            out.push_back(nodes[i]);
        }
    };
    for (int l = 0; l < nlanes; l++) run_to(l, SIZE_MAX);
    return out;
}

/* CUDA's rule at the end of a capture: every stream that joined it must be joined back, that
 * is, have no work after the last of its records that the capturing stream waited on (or a
 * lane joined back before that wait). Returns the first lane with such work, 0 when none.
 * Records and waits are not work (CUDA makes them edges, not nodes). */
int unjoined_lane(const std::vector<Op> &nodes, int nlanes) {
    std::vector<long> joined(nlanes, -1);                 /* per lane: joined up to this node */
    joined[0] = (long)nodes.size();
    for (bool grew = true; grew;) {
        grew = false;
        for (size_t i = 0; i < nodes.size(); i++) {
            const Op &n = nodes[i];
            if (n.dep < 0 || (long)i > joined[n.lane]) continue;
            int from = nodes[n.dep].lane;
            if (n.dep > joined[from]) {
                joined[from] = n.dep;
                grew = true;
            }
        }
    }
    for (size_t i = 0; i < nodes.size(); i++) {
        const Op &n = nodes[i];
        if (strcmp(n.kind, "event") && strcmp(n.kind, "wait") && (long)i > joined[n.lane])
            return n.lane;
    }
    return 0;
}

/* ---------------- fibers ---------------- */

enum FState { F_READY, F_WAIT_BLOCK, F_WAIT_WARP, F_WAIT_SHFL, F_DONE };
#ifdef EMU_ASAN
constexpr size_t kStack = 256 << 10;                /* ASan's frames are larger */
#else
constexpr size_t kStack = 64 << 10;                 /* kernels use little stack; fewer TLB misses */
#endif
constexpr int kMaxThreads = 1024;

/* Fiber switching. glibc's swapcontext saves and restores the signal mask with a system call
 * at every switch, which took 70% of the emulator's time in the end-to-end tests; on x86-64 a
 * switch needs only the callee-saved registers, the stack pointer and the FP control words
 * (the System V ABI's preserved state), so it is done here in a few instructions. */
#if defined(__x86_64__)
extern "C" void emu_ctx_switch(void **save_sp, void *to_sp);
asm(".text\n"
    ".globl emu_ctx_switch\n"
    ".hidden emu_ctx_switch\n"
    ".type emu_ctx_switch,@function\n"
    "emu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_ctx_switch,.-emu_ctx_switch\n");
struct Ctx { void *sp = nullptr; };
/* a stack that emu_ctx_switch "returns" into entry on, 16-byte aligned as at a call */
void ctx_init(Ctx *c, char *stack, size_t size, void (*entry)()) {
    uint64_t *top = (uint64_t *)(((uintptr_t)(stack + size)) & ~(uintptr_t)15);
    top[-1] = 0;                                  /* entry's return address: it never returns */
    top[-2] = (uint64_t)(uintptr_t)entry;
    for (int i = 3; i <= 8; i++) top[-i] = 0;     /* rbp rbx r12 r13 r14 r15 */
    top[-9] = 0x1f80ull | (0x037full << 32);      /* default MXCSR, x87 control word */
    c->sp = &top[-9];
}
void ctx_switch(Ctx *from, Ctx *to) { emu_ctx_switch(&from->sp, to->sp); }
#else
struct Ctx { ucontext_t uc; };
void ctx_init(Ctx *c, char *stack, size_t size, void (*entry)()) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}
void ctx_switch(Ctx *from, Ctx *to) { swapcontext(&from->uc, &to->uc); }
#endif

struct Fiber {
    Ctx ctx;
    char *stack = nullptr;
    FState st = F_READY;
    void *fake = nullptr;           /* ASan fake-stack handle while switched out */
};

Fiber g_fib[kMaxThreads];
Ctx g_sched, g_dead;                /* g_dead: where a finished fiber's last switch saves to */
[[maybe_unused]] const void *g_sched_bottom;     /* ASan's view of the scheduler stack */
[[maybe_unused]] size_t g_sched_size;
[[maybe_unused]] void *g_sched_fake;
int g_cur = -1, g_nthreads = 0;
bool g_fiber_mode = false, g_block_synced = false;
/* ACT_EMU_ORDER (see the top): the order threads run in between barriers, and blocks */
enum { ORDER_FORWARD, ORDER_REVERSE, ORDER_SHUFFLE };
int g_order = ORDER_FORWARD;
unsigned long long g_order_rng = 1;              /* xorshift64 state of the shuffle order */
int g_perm[kMaxThreads];                         /* this round's thread order */
const emu_thread_fn *g_fn;
const char *g_kernel = "";
/* shuffle slots, two sets used alternately: a lane that has read and moved on to the next
 * shuffle writes the other set, so one barrier per shuffle suffices (lanes cannot get two
 * shuffles apart: the next one's barrier waits for every lane) */
unsigned long long g_slot[2][kMaxThreads];
unsigned g_shfl_gen[kMaxThreads];
std::vector<unsigned char> g_smem;
size_t g_dyn_bytes;                              /* this launch's dynamic shared memory */
std::set<const void *> g_static_vars;            /* its static __shared__ variables met so far */
size_t g_static_bytes;                           /* and their bytes */
bool g_smem_faulted;

void set_thread_index(int t) {
    threadIdx.x = t % blockDim.x;
    threadIdx.y = (t / blockDim.x) % blockDim.y;
    threadIdx.z = t / (blockDim.x * blockDim.y);
}

void fiber_yield(FState why) {
    Fiber &f = g_fib[g_cur];
    f.st = why;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&f.fake, g_sched_bottom, g_sched_size);
#endif
    ctx_switch(&f.ctx, &g_sched);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(f.fake, &g_sched_bottom, &g_sched_size);
#endif
}

void fiber_main() {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &g_sched_bottom, &g_sched_size);
#endif
    (*g_fn)();
    g_fib[g_cur].st = F_DONE;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, g_sched_bottom, g_sched_size);
#endif
    ctx_switch(&g_dead, &g_sched);                /* never resumed */
}

unsigned long long order_next(void) {
    unsigned long long x = g_order_rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return g_order_rng = x;
}

/* g_perm[0..n) = the order the threads of a block run in this round */
void order_threads(int n) {
    for (int i = 0; i < n; i++) g_perm[i] = g_order == ORDER_REVERSE ? n - 1 - i : i;
    if (g_order == ORDER_SHUFFLE)
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(order_next() % (unsigned long long)(i + 1)), t = g_perm[i];
            g_perm[i] = g_perm[j];
            g_perm[j] = t;
        }
}

unsigned long long gcd_u64(unsigned long long a, unsigned long long b) {
    while (b) {
        unsigned long long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* switches to fiber t until it waits or ends; false after a fault inside */
bool run_fiber(int t) {
    g_cur = t;
    set_thread_index(t);
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&g_sched_fake, g_fib[t].stack, kStack);
#endif
    ctx_switch(&g_sched, &g_fib[t].ctx);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(g_sched_fake, nullptr, nullptr);
#endif
    return g_sticky == cudaSuccess;
}

/* Warp w of an n-thread block once none of its lanes is ready: releases its warp barrier
 * (__syncwarp or a shuffle) when every live lane waits there. 1 when released, 0 when not,
 * -1 after a fault; adds its live lanes to *live. */
int settle_warp(int w, int n, int *live) {
    int lo = w * 32, hi = lo + 32 < n ? lo + 32 : n, ww = 0, wb = 0, done = 0, shfl = 0;
    for (int t = lo; t < hi; t++) {
        ww += g_fib[t].st == F_WAIT_WARP || g_fib[t].st == F_WAIT_SHFL;
        shfl += g_fib[t].st == F_WAIT_SHFL;
        wb += g_fib[t].st == F_WAIT_BLOCK;
        done += g_fib[t].st == F_DONE;
    }
    if (ww && wb) {
        emu_fault("kernel %s, block (%u,%u,%u): warp %d has lanes waiting in __syncwarp or "
                  "a shuffle and lanes waiting in __syncthreads: divergent barrier",
                  g_kernel, blockIdx.x, blockIdx.y, blockIdx.z, w);
        return -1;
    }
    if (shfl && done) {
        emu_fault("kernel %s, block (%u,%u,%u): a full-mask shuffle in warp %d after %d of "
                  "its lanes exited (their values are undefined)", g_kernel, blockIdx.x,
                  blockIdx.y, blockIdx.z, w, done);
        return -1;
    }
    *live += hi - lo - done;
    if (!ww) return 0;
    for (int t = lo; t < hi; t++)            /* no lane of this warp is elsewhere: complete */
        if (g_fib[t].st == F_WAIT_WARP || g_fib[t].st == F_WAIT_SHFL) g_fib[t].st = F_READY;
    return 1;
}

/* Runs the block's fibers until every one has ended; false after a fault. Between two
 * __syncthreads:
 *  - forward: in rounds, every ready thread (0 first) until it waits, then the warp barriers
 *    every lane has reached are released - the warps move in step;
 *  - reverse / shuffle: one warp at a time (the last first / a random one), its lanes (the last
 *    first / in a random order) run and its warp barriers release until all of them wait in
 *    __syncthreads or ended; then the next warp. A warp that overwrites shared memory another
 *    warp has yet to read, without a __syncthreads between, is then caught too.
 * Then the block barrier releases. */
bool schedule_block(int n) {
    int nw = (n + 31) / 32, warps[kMaxThreads / 32];
    for (;;) {
        order_threads(n);
        int live = 0;
        if (g_order == ORDER_FORWARD) {
            for (int k = 0; k < n; k++)
                if (g_fib[g_perm[k]].st == F_READY && !run_fiber(g_perm[k])) return false;
            int released = 0;
            for (int w = 0; w < nw; w++) {
                int r = settle_warp(w, n, &live);
                if (r < 0) return false;
                released += r;
            }
            if (released) continue;
        } else {
            /* the warps' order: g_perm's order of each warp's first lane to appear */
            int m = 0;
            bool seen[kMaxThreads / 32] = {};
            for (int k = 0; k < n; k++)
                if (!seen[g_perm[k] / 32]) {
                    seen[g_perm[k] / 32] = true;
                    warps[m++] = g_perm[k] / 32;
                }
            for (int i = 0; i < nw; i++) {
                int w = warps[i], r;
                do {
                    for (int k = 0; k < n; k++) {   /* this warp's lanes in g_perm's order */
                        int t = g_perm[k];
                        if (t / 32 == w && g_fib[t].st == F_READY && !run_fiber(t)) return false;
                    }
                    int lv = 0;
                    r = settle_warp(w, n, &lv);
                    if (r < 0) return false;
                    if (!r) live += lv;
                } while (r);
            }
        }
        if (!live) return true;
        /* no warp barrier pending, so every live thread waits in __syncthreads */
        for (int t = 0; t < n; t++)
            if (g_fib[t].st == F_WAIT_BLOCK) g_fib[t].st = F_READY;
    }
}

bool run_block_fibers(int n) {
    for (int t = 0; t < n; t++) {
        Fiber &f = g_fib[t];
        if (!f.stack) {
            void *p = mmap(nullptr, kStack, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) {
                emu_fault("kernel %s: cannot map a fiber stack: %s", g_kernel, strerror(errno));
                return false;
            }
            f.stack = (char *)p;
        }
        ctx_init(&f.ctx, f.stack, kStack, fiber_main);
        g_shfl_gen[t] = 0;
        f.st = F_READY;
    }
    g_fiber_mode = true;
    bool ok = schedule_block(n);
    g_fiber_mode = false;
    return ok;
}

void run_kernel(const char *name, dim3 grid, dim3 block, size_t smem, const emu_thread_fn &fn) {
    gridDim = grid;
    blockDim = block;
    g_fn = &fn;
    g_kernel = name;
    g_dyn_bytes = smem;
    g_static_vars.clear();
    g_static_bytes = 0;
    g_smem_faulted = false;
    int n = (int)(block.x * block.y * block.z);
    g_nthreads = n;
    if (g_smem.size() < smem) g_smem.resize(smem);
    bool plain = false;
    size_t shared_bytes = (size_t)((uintptr_t)__stop_emu_shared - (uintptr_t)__start_emu_shared);
    /* Block (0,0,0) runs first in every order: whether it meets a barrier decides fibers or
     * plain calls for the rest, as in forward order, so a block that legally returns before a
     * barrier cannot fault a kernel in one order and not another. The others follow as block
     * (mul * k + add) mod nblocks for k = 0, 1, ...: a bijection, as mul is coprime to
     * nblocks; the identity forward, k -> nblocks - 1 - k reversed. */
    unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z, mul = 1, add = 0;
    if (g_order == ORDER_REVERSE) {
        mul = nblocks - 1;
        add = nblocks - 1;
    } else if (g_order == ORDER_SHUFFLE && nblocks > 1) {
        mul = order_next() % nblocks;
        while (gcd_u64(mul, nblocks) != 1) mul = (mul + 1) % nblocks;
        add = order_next() % nblocks;
    }
    for (unsigned long long k = 0; k <= nblocks; k++) {
        unsigned long long b = 0;                    /* k == 0: block (0,0,0), the probe */
        if (k > 0) {
            b = (unsigned long long)(((unsigned __int128)mul * (k - 1) + add) % nblocks);
            if (b == 0) continue;                    /* it ran first */
        }
        blockIdx.x = (unsigned)(b % grid.x);
        blockIdx.y = (unsigned)(b / grid.x % grid.y);
        blockIdx.z = (unsigned)(b / grid.x / grid.y);
        if (smem) memset(g_smem.data(), 0xff, smem);   /* shared memory starts as garbage */
        if (shared_bytes) memset(__start_emu_shared, 0xff, shared_bytes);
        if (!plain) {
            g_block_synced = false;
            if (!run_block_fibers(n)) return;
            if (k == 0) plain = !g_block_synced;     /* the probe alone decides */
            continue;
        }
        order_threads(n);
        for (int i = 0; i < n; i++) {
            int t = g_perm[i];
            g_cur = t;
            set_thread_index(t);
            fn();
            if (g_sticky != cudaSuccess) return;
        }
    }
    g_cur = -1;
}

/* a barrier reached outside fiber mode: the kernel synchronizes in some blocks only */
bool barrier_outside_fibers(const char *what) {
    if (g_fiber_mode) {
        g_block_synced = true;
        return false;
    }
    emu_fault("kernel %s: %s in block (%u,%u,%u) although the first block run met no barrier: the "
              "emulator cannot run a kernel whose blocks synchronize differently", g_kernel, what,
              blockIdx.x, blockIdx.y, blockIdx.z);
    return true;
}

const char *err_name(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotPermitted: return "operation not permitted";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of two independent captures";
    case cudaErrorStreamCaptureUnmatched: return "the capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined: return "the capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    }
    return "unrecognized error code";
}

}  // namespace

int emu_set_order(const char *spec) {
    if (!strcmp(spec, "forward")) g_order = ORDER_FORWARD;
    else if (!strcmp(spec, "reverse")) g_order = ORDER_REVERSE;
    else if (!strncmp(spec, "shuffle", 7) && (!spec[7] || spec[7] == ':')) {
        unsigned long long seed = 1;
        if (spec[7]) {                               /* digits only, and they must fit */
            const char *d = spec + 8;
            if (!*d) return -1;
            for (const char *q = d; *q; q++)
                if (*q < '0' || *q > '9') return -1;
            errno = 0;
            seed = strtoull(d, nullptr, 10);
            if (errno == ERANGE) return -1;
        }
        g_order = ORDER_SHUFFLE;
        g_order_rng = seed * 0x9E3779B97F4A7C15ull + 1;  /* never 0: xorshift would stay there */
        if (!g_order_rng) g_order_rng = 1;
    } else return -1;
    return 0;
}

/* ---------------- device-side entry points ---------------- */

void __syncthreads(void) {
    if (barrier_outside_fibers("__syncthreads")) return;
    fiber_yield(F_WAIT_BLOCK);
}

void __syncwarp(unsigned mask) {
    if (barrier_outside_fibers("__syncwarp")) return;
    if (mask != 0xffffffffu) {
        emu_fault("kernel %s: __syncwarp with a partial mask %08x is not emulated", g_kernel, mask);
        return;
    }
    fiber_yield(F_WAIT_WARP);
}

int emu_lane(void) { return g_cur & 31; }

unsigned long long emu_shfl_raw(unsigned mask, unsigned long long v, int src_lane) {
    if (barrier_outside_fibers("a warp shuffle")) return v;
    if (mask != 0xffffffffu) {
        emu_fault("kernel %s: a shuffle with a partial mask %08x is not emulated", g_kernel, mask);
        return v;
    }
    int me = g_cur, src = (me & ~31) + src_lane;
    unsigned set = g_shfl_gen[me]++ & 1;
    g_slot[set][me] = v;
    fiber_yield(F_WAIT_SHFL);                    /* every lane has published */
    if (src >= g_nthreads) {
        emu_fault("kernel %s, block (%u,%u,%u), thread %d: shuffle from lane %d, which does not "
                  "exist (the block size is not a multiple of 32)", g_kernel, blockIdx.x,
                  blockIdx.y, blockIdx.z, me, src_lane);
        return v;
    }
    return g_slot[set][src];
}

void *emu_dyn_smem(void) { return g_smem.data(); }

void emu_static_smem(const void *p, size_t bytes) {
    if (!g_static_vars.insert(p).second) return;
    g_static_bytes += bytes;
    if (g_static_bytes + g_dyn_bytes > 48 * 1024 && !g_smem_faulted) {
        g_smem_faulted = true;
        emu_fault("kernel %s: %zu bytes of static and %zu of dynamic shared memory pass 48 KB: a "
                  "GPU refuses this launch (too many resources requested)", g_kernel,
                  g_static_bytes, g_dyn_bytes);
    }
}

cudaError_t emu_submit_launch(const char *name, dim3 grid, dim3 block, size_t smem,
                              cudaStream_t st, emu_thread_fn fn, const emu_ptr_arg *ptrs,
                              int nptrs) {
    API_ENTRY();
    emu_stream *s = resolve(st);
    if (!s) return ret(cudaErrorInvalidResourceHandle);
    unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
    const char *why = nullptr;
    if (!grid.x || !grid.y || !grid.z || !nt) why = "a zero grid or block dimension";
    else if (nt > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
        why = "more than 1024 threads per block (or block.z > 64)";
    else if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
        why = "grid.x > 2^31-1 or grid.y/z > 65535";
    else if (smem > 48 * 1024) why = "more than 48 KB of dynamic shared memory";
    if (why) {
        fprintf(stderr, "cuda-emu: launch of %s refused: %s (grid %u,%u,%u block %u,%u,%u, "
                "%zu bytes shared)\n", name, why, grid.x, grid.y, grid.z, block.x, block.y,
                block.z, smem);
        if (s->cap) s->cap->invalid = true;
        return ret(cudaErrorInvalidConfiguration);
    }
    emu_operands operands;
    for (int i = 0; i < nptrs; i++) {
        const void *p = ptrs[i].p;
        /* NULL and device pointers (one past the end included) are fine; the ones inside an
         * allocation are re-checked when the launch runs */
        if (!p || find_in(g_dev, p)) {
            remember("argument", ptrs[i].pos, p, &operands);
            continue;
        }
        emu_fault("kernel %s was given a pointer to %s as argument %d", name,
                  find_in(g_pinned, p) ? "pinned host memory (cudaMallocHost)" : "host memory",
                  ptrs[i].pos);
        return cudaSuccess;                       /* the launch itself succeeds, as on a GPU */
    }
    std::string nm(name);
    return ret(enqueue_op(s, "kernel", nm, [nm, grid, block, smem, fn]() {
        run_kernel(nm.c_str(), grid, block, smem, fn);
    }, std::move(operands)));
}

/* ---------------- emu_internal.h ---------------- */

cudaError_t emu_enqueue_as(cudaStream_t st, const char *kind, std::string what,
                           std::function<void(void)> op, emu_operands operands) {
    API_ENTRY();
    emu_stream *s = resolve(st);
    if (!s) return ret(cudaErrorInvalidResourceHandle);
    return ret(enqueue_op(s, kind, std::move(what), std::move(op), std::move(operands)));
}

cudaError_t emu_enqueue(cudaStream_t st, const char *what, std::function<void(void)> op,
                        emu_operands operands) {
    return emu_enqueue_as(st, what, what, std::move(op), std::move(operands));
}

int emu_stream_capturing(cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> lk(g_mu);
    emu_stream *s = resolve(st);
    return s && s->cap != nullptr;
}

int emu_is_device_range(const void *p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> lk(g_mu);
    auto *b = find_in(g_dev, p);
    return b && (uintptr_t)p + bytes <= b->first + b->second.bytes;
}

int emu_on_device(const char *call, const char *what, const void *p, size_t bytes,
                  emu_operands *keep) {
    if (bytes == 0) return 1;
    if (emu_is_device_range(p, bytes)) {
        std::lock_guard<std::recursive_mutex> lk(g_mu);
        remember(what, 0, p, keep);
        return 1;
    }
    emu_fault("%s: %s (%zu bytes at %p) is not in device memory", call, what, bytes, p);
    return 0;
}

void emu_fault(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuda-emu: FAULT%s%s: %s\n", *g_running ? " in " : "", g_running, msg);
    if (g_sticky == cudaSuccess) g_sticky = cudaErrorIllegalAddress;
}

float emu_load(const void *p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_16BF) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (t == CUDA_R_16F) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

void emu_store(void *p, cudaDataType_t t, size_t i, float v) {
    if (t == CUDA_R_16BF) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (t == CUDA_R_16F) ((__half *)p)[i] = __float2half_rn(v);
    else ((float *)p)[i] = v;
}

float emu_round_tf32(float v) {
    /* ACT_EMU_TF32=truncate: the low 13 bits dropped, as a tensor core does with fp32 registers
     * that no conversion rounded first (which of the two a real library does is its choice) */
    static const int trunc = [] {
        const char *e = getenv("ACT_EMU_TF32");
        return e && !strcmp(e, "truncate");
    }();
    uint32_t b;
    memcpy(&b, &v, 4);
    if ((b & 0x7f800000u) == 0x7f800000u) return v;          /* inf, NaN */
    b = trunc ? b & 0xffffe000u : (b + 0xfffu + ((b >> 13) & 1u)) & 0xffffe000u;
    memcpy(&v, &b, 4);
    return v;
}

float emu_round_operand(float v, emu_rounding r) {
    uint16_t h;
    switch (r) {
    case EMU_ROUND_TF32: return emu_round_tf32(v);
    case EMU_ROUND_F16: emu_store(&h, CUDA_R_16F, 0, v); return emu_load(&h, CUDA_R_16F, 0);
    case EMU_ROUND_BF16: emu_store(&h, CUDA_R_16BF, 0, v); return emu_load(&h, CUDA_R_16BF, 0);
    default: return v;
    }
}

std::vector<float> emu_widen(const void *p, cudaDataType_t t, size_t rows, size_t cols, size_t ld,
                             emu_rounding r) {
    std::vector<float> out(rows * cols);
    for (size_t j = 0; j < cols; j++)
        for (size_t i = 0; i < rows; i++) out[j * rows + i] = emu_round_operand(emu_load(p, t, j * ld + i), r);
    return out;
}

/* ---------------- runtime API ---------------- */

extern "C" {

cudaError_t cudaGetDeviceCount(int *n) {
    API_ENTRY();
    if (!n) return ret(cudaErrorInvalidValue);
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) {
    API_ENTRY();
    return ret(dev == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int *dev) {
    API_ENTRY();
    if (!dev) return ret(cudaErrorInvalidValue);
    *dev = 0;
    return cudaSuccess;
}

/* the compute capability the emulator reports: 9.0 (an H200), or ACT_EMU_CC=XY (e.g. 80: an
 * A100), so the backend's refusal of a GPU older than its kernels can be exercised */
static int emu_cc(void) {
    const char *e = getenv("ACT_EMU_CC");
    int v = e && *e ? atoi(e) : 90;
    return v >= 10 && v <= 999 ? v : 90;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int dev) {
    API_ENTRY();
    if (!prop) return ret(cudaErrorInvalidValue);
    if (dev != 0) return ret(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "CUDA emulator on the host (not a GPU)");
    prop->major = emu_cc() / 10;
    prop->minor = emu_cc() % 10;
    prop->totalGlobalMem = kDevTotal;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->multiProcessorCount = 132;
    prop->maxThreadsPerBlock = 1024;
    prop->warpSize = 32;
    prop->clockRate = 1980000;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    API_ENTRY();
    if (capture_forbids("cudaDeviceSynchronize")) return cudaErrorStreamCaptureUnsupported;
    flush_all();
    return ret(g_sticky);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    API_ENTRY();
    const char *refuse = getenv("ACT_EMU_MEMGETINFO");   /* =fail: as a sandbox's GPU proxy may */
    if (refuse && !strcmp(refuse, "fail")) return ret(cudaErrorNotSupported);
    if (free_bytes) *free_bytes = kDevTotal - g_dev_bytes;
    if (total_bytes) *total_bytes = kDevTotal;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    API_ENTRY();
    if (!p) return ret(cudaErrorInvalidValue);
    if (capture_forbids("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    const char *refuse = getenv("ACT_EMU_MALLOC");   /* see the top */
    if (refuse && !strcmp(refuse, "fail")) return ret(cudaErrorMemoryAllocation);
    if (bytes > kDevTotal - g_dev_bytes) return ret(cudaErrorMemoryAllocation);
    void *q = nullptr;
    if (posix_memalign(&q, 256, bytes)) return ret(cudaErrorMemoryAllocation);
    memset(q, 0xff, bytes);
    g_dev[(uintptr_t)q] = Block{bytes, ++g_serial};
    g_dev_bytes += bytes;
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    FREE_ENTRY();
    if (capture_forbids("cudaFree")) return cudaErrorStreamCaptureUnsupported;
    if (!p) return cudaSuccess;
    auto it = g_dev.find((uintptr_t)p);
    if (it == g_dev.end()) {
        fprintf(stderr, "cuda-emu: cudaFree(%p): not a pointer cudaMalloc returned\n", p);
        return ret(cudaErrorInvalidValue);
    }
    flush_all();                                  /* cudaFree waits for the device */
    g_dev_bytes -= it->second.bytes;
    g_dev.erase(it);
    free(p);
    return ret(g_sticky);
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
    API_ENTRY();
    if (!p) return ret(cudaErrorInvalidValue);
    if (capture_forbids("cudaMallocHost")) return cudaErrorStreamCaptureUnsupported;
    void *q = nullptr;
    if (posix_memalign(&q, 4096, bytes ? bytes : 1)) return ret(cudaErrorMemoryAllocation);
    g_pinned[(uintptr_t)q] = Block{bytes ? bytes : 1, ++g_serial};
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    FREE_ENTRY();
    if (capture_forbids("cudaFreeHost")) return cudaErrorStreamCaptureUnsupported;
    if (!p) return cudaSuccess;
    auto it = g_pinned.find((uintptr_t)p);
    if (it == g_pinned.end()) {
        fprintf(stderr, "cuda-emu: cudaFreeHost(%p): not a pointer cudaMallocHost returned\n", p);
        return ret(cudaErrorInvalidValue);
    }
    flush_all();
    g_pinned.erase(it);
    free(p);
    return ret(g_sticky);
}

/* Registered host memory: page-locked in place on a GPU, here only remembered, so that copies
 * from it count as pinned and a second registration of the same pages fails as it does there.
 * Kernels that read it through cudaHostGetDevicePointer addresses read the host pages. */
cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags) {
    API_ENTRY();
    if (capture_forbids("cudaHostRegister")) return cudaErrorStreamCaptureUnsupported;
    if (!p || !bytes || (flags & ~0x0fu)) return ret(cudaErrorInvalidValue);
    /* ACT_EMU_HOST_REGISTER=refuse: a runtime that pins no host memory (read at each call) */
    const char *refuse = getenv("ACT_EMU_HOST_REGISTER");
    if (refuse && !strcmp(refuse, "refuse")) return ret(cudaErrorNotSupported);
    /* the driver locks whole pages: two ranges that share a page cannot both be registered */
    uintptr_t a = (uintptr_t)p, pg = 4096, lo = a & ~(pg - 1), hi = (a + bytes + pg - 1) & ~(pg - 1);
    for (auto &r : g_registered) {
        uintptr_t rlo = r.first & ~(pg - 1), rhi = (r.first + r.second.bytes + pg - 1) & ~(pg - 1);
        if (lo < rhi && rlo < hi) return ret(cudaErrorHostMemoryAlreadyRegistered);
    }
    g_registered[a] = Block{bytes, ++g_serial};
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p) {
    FREE_ENTRY();
    if (capture_forbids("cudaHostUnregister")) return cudaErrorStreamCaptureUnsupported;
    auto it = g_registered.find((uintptr_t)p);
    if (it == g_registered.end()) return ret(cudaErrorHostMemoryNotRegistered);
    flush_all();                                  /* as cudaFreeHost: waits for the device */
    {   /* memory freed (unmapped) while registered: the device could have read another's pages */
        uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t lo = it->first & ~(pg - 1), hi = (it->first + it->second.bytes + pg - 1) & ~(pg - 1);
        if (msync((void *)lo, hi - lo, MS_ASYNC) != 0 && errno == ENOMEM)
            fprintf(stderr, "cuda-emu: cudaHostUnregister(%p): the memory was unmapped while registered\n", p);
    }
    g_registered.erase(it);
    return ret(g_sticky);
}

cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned flags) {
    API_ENTRY();
    if (!dev || flags) return ret(cudaErrorInvalidValue);
    if (!find_in(g_registered, host) && !find_in(g_pinned, host)) return ret(cudaErrorInvalidValue);
    *dev = host;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int dev) {
    API_ENTRY();
    if (!value || dev != 0) return ret(cudaErrorInvalidValue);
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = emu_cc() / 10; return cudaSuccess;   /* as cudaGetDeviceProperties */
    case cudaDevAttrComputeCapabilityMinor: *value = emu_cc() % 10; return cudaSuccess;
    case cudaDevAttrHostRegisterReadOnlySupported: *value = 1; return cudaSuccess;
    }
    return ret(cudaErrorInvalidValue);
}

}  // extern "C"

namespace {

/* the checks every copy makes: kind against where the pointers really are */
/* a copy's destination and source spans (bytes from the first byte written/read to the last)
 * against its kind: each device span inside one cudaMalloc block, each host span outside */
cudaError_t check_copy_spans(void *dst, size_t dspan, const void *src, size_t sspan,
                             cudaMemcpyKind kind, const char *call) {
    size_t bytes = dspan > sspan ? dspan : sspan;
    bool dd = emu_is_device_range(dst, dspan), sd = emu_is_device_range(src, sspan);
    bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) return cudaSuccess;
    if (kind == cudaMemcpyHostToHost) want_dd = want_sd = false;
    if (dd != want_dd || sd != want_sd) {
        fprintf(stderr, "cuda-emu: %s(%p <- %p, %zu bytes, kind %d): the destination is %s and "
                "the source %s (a device range must lie inside one cudaMalloc block)\n", call, dst,
                src, bytes, (int)kind, dd ? "device memory" : "not device memory",
                sd ? "device memory" : "not device memory");
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

cudaError_t check_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                       const char *call) {
    return check_copy_spans(dst, bytes, src, bytes, kind, call);
}

/* the host side of a copy (NULL for device to device) */
const void *copy_host_side(void *dst, const void *src, cudaMemcpyKind kind) {
    return kind == cudaMemcpyHostToDevice ? src : kind == cudaMemcpyDeviceToHost ? dst : nullptr;
}

bool pinned_range(const void *p, size_t bytes) {
    auto *b = find_in(g_pinned, p);
    if (!b) b = find_in(g_registered, p);
    return b && (uintptr_t)p + bytes <= b->first + b->second.bytes;
}

}  // namespace

extern "C" {

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    API_ENTRY();
    if (capture_forbids("cudaMemcpy")) return cudaErrorStreamCaptureUnsupported;
    if (!bytes) return cudaSuccess;
    cudaError_t e = check_copy(dst, src, bytes, kind, "cudaMemcpy");
    if (e) return ret(e);
    flush_legacy();                               /* the legacy stream's earlier work first */
    g_counts["memcpy"]++;
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t st) {
    API_ENTRY();
    emu_stream *s = resolve(st);
    if (!s) return ret(cudaErrorInvalidResourceHandle);
    if (!bytes) return cudaSuccess;
    cudaError_t e = check_copy(dst, src, bytes, kind, "cudaMemcpyAsync");
    if (e) {
        if (s->cap) s->cap->invalid = true;
        return ret(e);
    }
    const void *host = copy_host_side(dst, src, kind);
    bool pageable = host && !pinned_range(host, bytes);
    if (pageable && s->cap) {
        fprintf(stderr, "cuda-emu: cudaMemcpyAsync with pageable host memory %p during stream "
                "capture: a graph needs pinned memory (cudaMallocHost); capture invalidated\n",
                host);
        s->cap->invalid = true;
        return ret(cudaErrorStreamCaptureUnsupported);
    }
    emu_operands operands;
    remember("the destination", 0, dst, &operands);
    remember("the source", 0, src, &operands);
    if (pageable && kind == cudaMemcpyHostToDevice) {     /* staged now, lands in stream order */
        auto staged = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                                    (const unsigned char *)src + bytes);
        return ret(enqueue_op(s, "memcpy", "cudaMemcpyAsync H2D (pageable)",
                              [dst, staged]() { memcpy(dst, staged->data(), staged->size()); },
                              std::move(operands)));
    }
    static const char *dir[5] = {"H2H", "H2D", "D2H", "D2D", "default"};
    char what[96];
    snprintf(what, sizeof what, "cudaMemcpyAsync %s %zu bytes", dir[kind <= 4 ? kind : 4], bytes);
    e = enqueue_op(s, "memcpy", what, [dst, src, bytes]() { memmove(dst, src, bytes); },
                   std::move(operands));
    if (e) return ret(e);
    if (pageable && kind == cudaMemcpyDeviceToHost) flush(s);   /* returns when it has landed */
    return ret(g_sticky);
}

/* rows of width bytes, pitches apart on each side: the ranges checked are the spans from the
 * first row's start to the last row's end, which is what a GPU reads and writes */
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, enum cudaMemcpyKind kind, cudaStream_t st) {
    API_ENTRY();
    emu_stream *s = resolve(st);
    if (!s) return ret(cudaErrorInvalidResourceHandle);
    if (width > dpitch || width > spitch) {
        fprintf(stderr, "cuda-emu: cudaMemcpy2DAsync: width %zu exceeds a pitch (dst %zu, src %zu)\n",
                width, dpitch, spitch);
        if (s->cap) s->cap->invalid = true;
        return ret(cudaErrorInvalidPitchValue);
    }
    if (!width || !height) return cudaSuccess;
    size_t dspan = (height - 1) * dpitch + width, sspan = (height - 1) * spitch + width;
    cudaError_t e = check_copy_spans(dst, dspan, src, sspan, kind, "cudaMemcpy2DAsync");
    if (e) {
        if (s->cap) s->cap->invalid = true;
        return ret(e);
    }
    const void *host = copy_host_side(dst, src, kind);
    size_t hspan = kind == cudaMemcpyHostToDevice ? sspan : dspan;
    if (host && !pinned_range(host, hspan)) {
        fprintf(stderr, "cuda-emu: cudaMemcpy2DAsync with pageable host memory %p: not emulated "
                "(the engine copies from pinned staging)\n", host);
        if (s->cap) s->cap->invalid = true;
        return ret(cudaErrorInvalidValue);
    }
    emu_operands operands;
    remember("the destination", 0, dst, &operands);
    remember("the source", 0, src, &operands);
    char what[96];
    snprintf(what, sizeof what, "cudaMemcpy2DAsync %zu rows x %zu bytes", height, width);
    return ret(enqueue_op(s, "memcpy", what, [=]() {
        for (size_t r = 0; r < height; r++)
            memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    }, std::move(operands)));
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t st) {
    API_ENTRY();
    emu_stream *s = resolve(st);
    if (!s) return ret(cudaErrorInvalidResourceHandle);
    if (!bytes) return cudaSuccess;
    if (!emu_is_device_range(p, bytes)) {
        fprintf(stderr, "cuda-emu: cudaMemsetAsync(%p, %zu bytes): not inside one cudaMalloc "
                "block\n", p, bytes);
        if (s->cap) s->cap->invalid = true;
        return ret(cudaErrorInvalidValue);
    }
    emu_operands operands;
    remember("the destination", 0, p, &operands);
    return ret(enqueue_op(s, "memset", "cudaMemsetAsync",
                          [p, value, bytes]() { memset(p, value, bytes); }, std::move(operands)));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *st, unsigned flags) {
    API_ENTRY();
    if (!st) return ret(cudaErrorInvalidValue);
    emu_stream *s = new emu_stream;
    s->flags = flags;
    g_streams.insert(s);
    *st = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *st) { return cudaStreamCreateWithFlags(st, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t st) {
    FREE_ENTRY();
    emu_stream *s = resolve(st);
    if (!s || s == &g_null) return ret(cudaErrorInvalidResourceHandle);
    if (s->cap) {
        fprintf(stderr, "cuda-emu: cudaStreamDestroy of a stream that is capturing\n");
        return ret(cudaErrorIllegalState);
    }
    flush(s);                                     /* queued work still completes */
    g_streams.erase(s);
    delete s;
    return ret(g_sticky);
}

cudaError_t cudaStreamSynchronize(cudaStream_t st) {
    API_ENTRY();
    emu_stream *s = resolve(st);
    if (!s) return ret(cudaErrorInvalidResourceHandle);
    if (s->cap) {
        fprintf(stderr, "cuda-emu: cudaStreamSynchronize of a capturing stream%s: not permitted; "
                "capture invalidated\n", s->lane ? " (joined to a capture)" : "");
        s->cap->invalid = true;
        return ret(cudaErrorStreamCaptureUnsupported);
    }
    if (capture_forbids("cudaStreamSynchronize")) return cudaErrorStreamCaptureUnsupported;
    flush(s);
    return ret(g_sticky);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t st, cudaHostFn_t fn, void *user) {
    API_ENTRY();
    emu_stream *s = resolve(st);
    if (!s) return ret(cudaErrorInvalidResourceHandle);
    if (!fn) return ret(cudaErrorInvalidValue);
    return ret(enqueue_op(s, "host", "cudaLaunchHostFunc", [fn, user]() {
        t_in_host_fn = true;
        fn(user);
        t_in_host_fn = false;
    }));
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags) {
    API_ENTRY();
    if (!ev) return ret(cudaErrorInvalidValue);
    if (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming)) {
        fprintf(stderr, "cuda-emu: cudaEventCreateWithFlags(0x%x): flags other than "
                "cudaEventBlockingSync and cudaEventDisableTiming are not emulated\n", flags);
        return ret(cudaErrorInvalidValue);
    }
    emu_event *e = new emu_event;
    e->flags = flags;
    g_events.insert(e);
    *ev = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *ev) { return cudaEventCreateWithFlags(ev, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    FREE_ENTRY();
    if (!g_events.count(ev)) return ret(cudaErrorInvalidResourceHandle);
    flush_all();                                  /* a queued record still points at it */
    g_events.erase(ev);
    delete ev;
    return ret(g_sticky);
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st) {
    API_ENTRY();
    emu_stream *s = resolve(st);
    if (!s || !g_events.count(ev)) return ret(cudaErrorInvalidResourceHandle);
    unsigned long gen = ++ev->gen;
    cudaError_t e = enqueue_op(s, "event", "cudaEventRecord", [ev, gen]() {
        if (ev->gen != gen) return;               /* re-recorded since: that record decides */
        ev->t = now_s();
        ev->done = true;
    });
    if (e) return ret(e);
    ev->recorded = true;
    ev->done = false;
    ev->st = s;
    if (s->cap) {
        ev->cap = s->cap;
        ev->node = s->cap->nodes.size() - 1;
    } else {
        ev->cap = nullptr;
        ev->seq = s->queue.back().seq;
    }
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    API_ENTRY();
    if (!g_events.count(ev)) return ret(cudaErrorInvalidResourceHandle);
    if (capture_forbids("cudaEventSynchronize")) return cudaErrorStreamCaptureUnsupported;
    if (ev->cap && ev->cap->active) {
        fprintf(stderr, "cuda-emu: cudaEventSynchronize of an event recorded in a capture that "
                "is still going on\n");
        return ret(cudaErrorCapturedEvent);
    }
    if (!ev->recorded || ev->done || !stream_alive(ev->st)) return ret(g_sticky);
    if (ev->cap) flush(ev->st);                   /* its record runs with a graph launched there */
    else run_until(ev->st, ev->seq);              /* that far, not further */
    return ret(g_sticky);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    API_ENTRY();
    if (!ms) return ret(cudaErrorInvalidValue);
    if (!g_events.count(a) || !g_events.count(b)) return ret(cudaErrorInvalidResourceHandle);
    if ((a->flags | b->flags) & cudaEventDisableTiming) {
        fprintf(stderr, "cuda-emu: cudaEventElapsedTime of an event created with "
                "cudaEventDisableTiming\n");
        return ret(cudaErrorInvalidResourceHandle);
    }
    if (!a->recorded || !b->recorded) return ret(cudaErrorInvalidResourceHandle);
    if (!a->done || !b->done) return ret(cudaErrorNotReady);
    *ms = (float)((b->t - a->t) * 1e3);
    return cudaSuccess;
}

/* The waiting stream s either is outside any capture (an eager wait: a queued operation that,
 * when s reaches it, runs the recording stream as far as the record and no further; nothing
 * makes it run earlier), or waits inside a capture (a node with an edge to the record node), or
 * joins the capture the event was recorded in as a new lane. */
cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned flags) {
    API_ENTRY();
    emu_stream *s = resolve(st);
    if (!s || !g_events.count(ev)) return ret(cudaErrorInvalidResourceHandle);
    if (flags != cudaEventWaitDefault) {
        fprintf(stderr, "cuda-emu: cudaStreamWaitEvent flags 0x%x are not emulated\n", flags);
        if (s->cap) s->cap->invalid = true;
        return ret(cudaErrorInvalidValue);
    }
    if (!ev->recorded) return cudaSuccess;        /* CUDA: a never-recorded event is complete */
    Capture *c = ev->cap.get();
    if (c && !c->active) {
        fprintf(stderr, "cuda-emu: cudaStreamWaitEvent on an event last recorded in a stream "
                "capture that has ended (record it again outside the capture)\n");
        if (s->cap) s->cap->invalid = true;
        return ret(cudaErrorCapturedEvent);
    }
    if (s->cap && !c) {
        fprintf(stderr, "cuda-emu: cudaStreamWaitEvent in a capturing stream on an event "
                "recorded outside the capture: CUDA needs cudaEventWaitExternal for that; capture "
                "invalidated\n");
        s->cap->invalid = true;
        return ret(cudaErrorStreamCaptureIsolation);
    }
    if (s->cap && c != s->cap.get()) {
        fprintf(stderr, "cuda-emu: cudaStreamWaitEvent would merge two separate stream captures; "
                "both invalidated\n");
        s->cap->invalid = c->invalid = true;
        return ret(cudaErrorStreamCaptureMerge);
    }
    if (c && !s->cap) {
        if (s == &g_null) {
            fprintf(stderr, "cuda-emu: the legacy default stream waits on an event recorded in a "
                    "capture: it cannot join a capture; capture invalidated\n");
            c->invalid = true;
            return ret(cudaErrorStreamCaptureUnsupported);
        }
        s->cap = ev->cap;
        s->lane = (int)c->lanes.size();
        c->lanes.push_back(s);
    }
    if (c)
        return ret(enqueue_op(s, "wait", "cudaStreamWaitEvent", []() {}, {}, (long)ev->node));
    emu_stream *from = ev->st;
    unsigned long long upto = ev->seq;
    return ret(enqueue_op(s, "wait", "cudaStreamWaitEvent", [from, upto]() {
        if (stream_alive(from)) run_until(from, upto);
    }));
}

cudaError_t cudaStreamBeginCapture(cudaStream_t st, enum cudaStreamCaptureMode mode) {
    API_ENTRY();
    emu_stream *s = resolve(st);
    if (!s) return ret(cudaErrorInvalidResourceHandle);
    if (s == &g_null) {
        fprintf(stderr, "cuda-emu: the legacy default stream cannot be captured\n");
        return ret(cudaErrorStreamCaptureUnsupported);
    }
    if (s->cap) return ret(cudaErrorIllegalState);
    if (mode != cudaStreamCaptureModeRelaxed && t_capture) {
        fprintf(stderr, "cuda-emu: a second capture begun by a thread that is capturing\n");
        return ret(cudaErrorIllegalState);
    }
    if (capture_mode("refuse-begin")) return ret(cudaErrorStreamCaptureUnsupported);
    s->cap = std::make_shared<Capture>();
    s->cap->invalid = capture_mode("invalidate");
    s->cap->mode = mode;
    s->cap->thread = std::this_thread::get_id();
    s->cap->lanes.push_back(s);
    s->lane = 0;
    if (mode != cudaStreamCaptureModeRelaxed) t_capture = s->cap.get();
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *graph) {
    std::lock_guard<std::recursive_mutex> lk(g_mu);
    if (graph) *graph = nullptr;
    emu_stream *s = resolve(st);
    if (!s) return ret(cudaErrorInvalidResourceHandle);
    if (!s->cap) return ret(cudaErrorIllegalState);
    std::shared_ptr<Capture> c = s->cap;
    if (s->lane != 0) {
        fprintf(stderr, "cuda-emu: cudaStreamEndCapture on a stream that joined a capture (end it "
                "on the stream that began it)\n");
        return ret(cudaErrorStreamCaptureUnmatched);
    }
    if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
        return ret(cudaErrorStreamCaptureUnmatched);
    for (emu_stream *l : c->lanes) l->cap = nullptr;      /* every lane stops capturing */
    c->active = false;
    if (t_capture == c.get()) t_capture = nullptr;
    std::vector<Op> nodes;
    nodes.swap(c->nodes);                         /* an event recorded in it may outlive it */
    if (!graph) return ret(cudaErrorInvalidValue);
    if (c->invalid) return ret(cudaErrorStreamCaptureInvalidated);
    int lane = unjoined_lane(nodes, (int)c->lanes.size());
    if (lane) {
        fprintf(stderr, "cuda-emu: cudaStreamEndCapture: lane %d of the capture (a stream that "
                "joined it by waiting on one of its events) has work after the last event the "
                "capturing stream waited on: it was never joined back "
                "(cudaErrorStreamCaptureUnjoined)\n", lane);
        return ret(cudaErrorStreamCaptureUnjoined);
    }
    if (g_sticky != cudaSuccess) return ret(g_sticky);
    emu_graph *g = new emu_graph;
    g->ops = linearize(nodes, (int)c->lanes.size());
    g->lanes = (int)c->lanes.size();
    *graph = g;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags) {
    API_ENTRY();
    if (!exec || !graph) return ret(cudaErrorInvalidValue);
    *exec = nullptr;
    if (capture_mode("refuse-instantiate")) return ret(cudaErrorNotSupported);
    emu_graph_exec *x = new emu_graph_exec;
    x->ops = graph->ops;
    x->lanes = graph->lanes;
    g_execs.insert(x);
    *exec = x;
    if (g_trace) {
        std::map<std::string, int> kinds;
        for (auto &op : x->ops) kinds[op.kind]++;
        fprintf(stderr, "cuda-emu: graph instantiated: %zu nodes in %d lane%s:", x->ops.size(),
                x->lanes, x->lanes == 1 ? "" : "s");
        for (auto &kv : kinds) fprintf(stderr, " %s=%d", kv.first.c_str(), kv.second);
        fprintf(stderr, "\n");
        if (g_trace > 1)                          /* in replay order */
            for (auto &op : x->ops)
                fprintf(stderr, "cuda-emu:   [lane %d] %s\n", op.lane, op.what.c_str());
    }
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t st) {
    API_ENTRY();
    emu_stream *s = resolve(st);
    if (!s || !g_execs.count(exec)) return ret(cudaErrorInvalidResourceHandle);
    if (capture_mode("refuse-launch")) return ret(cudaErrorNotSupported);
    if (s->cap) {
        fprintf(stderr, "cuda-emu: cudaGraphLaunch into a capturing stream is not emulated\n");
        return ret(cudaErrorStreamCaptureUnsupported);
    }
    for (auto &op : exec->ops) {
        s->queue.push_back(op);
        s->queue.back().seq = ++g_seq;
    }
    g_counts["graphLaunch"]++;   /* ACT_EMU_TRACE's count at exit: launches, not their nodes */
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    std::lock_guard<std::recursive_mutex> lk(g_mu);
    delete graph;
    return cudaSuccess;
}

/* the upload of an executable's work to the device ahead of its first launch: nothing to do
 * here but check the handles, and that the stream is not capturing (CUDA refuses that too) */
cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t st) {
    API_ENTRY();
    emu_stream *s = resolve(st);
    if (!s || !g_execs.count(exec)) return ret(cudaErrorInvalidResourceHandle);
    if (s->cap) return ret(cudaErrorStreamCaptureUnsupported);
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    std::lock_guard<std::recursive_mutex> lk(g_mu);
    if (!exec) return cudaSuccess;
    if (!g_execs.count(exec)) return ret(cudaErrorInvalidResourceHandle);
    g_execs.erase(exec);                          /* a queued launch holds copies of the nodes */
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    std::lock_guard<std::recursive_mutex> lk(g_mu);
    cudaError_t e = g_sticky != cudaSuccess ? g_sticky : t_last;
    t_last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) {
    std::lock_guard<std::recursive_mutex> lk(g_mu);
    return g_sticky != cudaSuccess ? g_sticky : t_last;
}

const char *cudaGetErrorString(cudaError_t e) { return err_name(e); }

}  // extern "C"
