/* cuda_fp16.h (CUDA emulator) - __half as its 16 bits, with CUDA's conversions (round to
 * nearest even through the compiler's _Float16, which GCC implements exactly in software or
 * with F16C). */
#ifndef EMU_CUDA_FP16_H
#define EMU_CUDA_FP16_H
#include <stdint.h>
#include <string.h>
#include "cuda_runtime.h"
struct __half { uint16_t x; };
static inline float __half2float(__half h) {
    _Float16 v;
    memcpy(&v, &h.x, 2);
    return (float)v;
}
static inline __half __float2half_rn(float f) {
    _Float16 v = (_Float16)f;
    __half h;
    memcpy(&h.x, &v, 2);
    return h;
}
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline unsigned short __half_as_ushort(__half h) { return h.x; }
static inline __half __ushort_as_half(unsigned short u) {
    __half h;
    h.x = u;
    return h;
}
/* a pair, 4-byte aligned as CUDA's, for two-element loads */
struct __attribute__((aligned(4))) __half2 { __half x, y; };
static inline float2 __half22float2(__half2 h) {
    float2 f = {__half2float(h.x), __half2float(h.y)};
    return f;
}
#endif
