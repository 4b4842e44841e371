/* emu_device.h (CUDA emulator) - what kernel code sees: thread indices, qualifiers, barriers,
 * warp shuffles, the launch template. Included by cuda_runtime.h in C++ only.
 *
 * A launch becomes one closure per kernel launch, run block after block on the host. Threads
 * of a block run as fibers (emu_runtime.cc) so that __syncthreads, __syncwarp and the shuffles
 * really wait for the others; a kernel whose first block meets no barrier runs its other blocks
 * as plain calls (thread after thread), which is what makes the emulator fast enough for CI. */
#ifndef EMU_DEVICE_H
#define EMU_DEVICE_H

#include <math.h>
#include <string.h>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

/* set by the emulator before each thread runs; read like CUDA's built-in variables */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
/* one copy per block: blocks run one after another, so a function-local static is exactly
 * "shared by the threads of the running block". They all live in the section emu_shared, which
 * the runtime fills with 0xFF bytes (NaN) before every block, as real shared memory starts as
 * garbage: a read before the block wrote shows up as NaN. */
#define __shared__ static __attribute__((section("emu_shared")))

void __syncthreads(void);
/* the emulator's thread and block order (ACT_EMU_ORDER; emu_runtime.cc): "forward", "reverse"
 * or "shuffle[:SEED]"; 0, or -1 for anything else. For the emulator's own tests. */
int emu_set_order(const char *spec);
void __syncwarp(unsigned mask = 0xffffffffu);
/* the warp-exchange primitive under every shuffle: lane publishes v, then reads lane src's */
unsigned long long emu_shfl_raw(unsigned mask, unsigned long long v, int src_lane);
void *emu_dyn_smem(void);
/* a kernel's static __shared__ variable at p, of bytes (translate.sh adds the call after each
 * declaration inside a function): a GPU refuses a launch whose static and dynamic shared memory
 * together pass 48 KB (without the cudaFuncAttributeMaxDynamicSharedMemorySize opt-in), which
 * the launch-time check of the dynamic bytes alone cannot see */
void emu_static_smem(const void *p, size_t bytes);

template <class T> static inline T emu_shfl(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    unsigned long long raw = 0;
    memcpy(&raw, &v, sizeof(T));
    raw = emu_shfl_raw(mask, raw, src);
    T r;
    memcpy(&r, &raw, sizeof(T));
    return r;
}
int emu_lane(void);                       /* the running thread's lane (linear id % 32) */
template <class T> static inline T __shfl_sync(unsigned m, T v, int src, int w = 32) {
    int lane = emu_lane();
    return emu_shfl(m, v, (lane & ~(w - 1)) + (src & (w - 1)));
}
template <class T> static inline T __shfl_xor_sync(unsigned m, T v, int x, int w = 32) {
    int lane = emu_lane(), src = lane ^ x;
    if ((src & ~(w - 1)) != (lane & ~(w - 1))) src = lane;
    return emu_shfl(m, v, src);
}
template <class T> static inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32) {
    int lane = emu_lane(), src = lane + (int)d;
    if ((src & ~(w - 1)) != (lane & ~(w - 1))) src = lane;
    return emu_shfl(m, v, src);
}
template <class T> static inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32) {
    int lane = emu_lane(), src = lane - (int)d;
    if (src < 0 || (src & ~(w - 1)) != (lane & ~(w - 1))) src = lane;
    return emu_shfl(m, v, src);
}

/* device math spelled the CUDA way (glibc already declares __expf and __logf as expf/logf) */
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
/* the low 32 bits of (hi:lo) >> (shift & 31) */
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    shift &= 31;
    return shift ? (lo >> shift) | (hi << (32 - shift)) : lo;
}
#define __restrict__ __restrict
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <class T> static inline T atomicMax(T *p, T v) { T o = *p; if (v > o) *p = v; return o; }

/* ---- launches ---- */
typedef std::function<void(void)> emu_thread_fn;
/* a pointer argument of a launch: its position in the kernel's parameter list (from 1) */
struct emu_ptr_arg { int pos; const void *p; };
/* checks the configuration and the pointer arguments (a host pointer is a fault; the device
 * allocations they point into are re-checked at every run, see emu_operands), records the
 * launch on the stream (run now, later, or in a graph); the error is also what the next
 * cudaGetLastError returns */
cudaError_t emu_submit_launch(const char *name, dim3 grid, dim3 block, size_t smem,
                              cudaStream_t st, emu_thread_fn fn, const emu_ptr_arg *ptrs,
                              int nptrs);

/* the pointer-typed arguments of a launch, in order */
template <class Tuple, size_t... I>
static inline int emu_ptr_args(const Tuple &t, std::index_sequence<I...>, emu_ptr_arg *out) {
    int n = 0;
    auto one = [&n, out](const auto &a, int pos) {
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_pointer_v<A>) out[n++] = emu_ptr_arg{pos, (const void *)a};
    };
    (one(std::get<I>(t), (int)I + 1), ...);
    return n;
}

template <class... P> struct emu_launch_t {
    void (*k)(P...);
    const char *name;
    dim3 g, b;
    size_t smem;
    cudaStream_t st;
    template <class... A> void operator()(A &&...a) const {
        /* arguments are copied at launch, converted to the kernel's parameter types, as CUDA does */
        std::tuple<std::decay_t<P>...> args(std::forward<A>(a)...);
        emu_ptr_arg ptrs[sizeof...(P) + 1];
        int n = emu_ptr_args(args, std::index_sequence_for<P...>{}, ptrs);
        void (*kf)(P...) = k;
        emu_submit_launch(name, g, b, smem, st, [kf, args]() { std::apply(kf, args); }, ptrs, n);
    }
};
template <class... P>
static inline emu_launch_t<P...> emu_launch_(void (*k)(P...), const char *name, dim3 g, dim3 b,
                                            size_t smem = 0, cudaStream_t st = 0) {
    return emu_launch_t<P...>{k, name, g, b, smem, st};
}
#define emu_launch(k, ...) emu_launch_(k, #k, __VA_ARGS__)

#endif
