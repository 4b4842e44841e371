/* cuda_bf16.h (CUDA emulator) - __nv_bfloat16 as its 16 bits, with CUDA's conversions
 * (round to nearest even; NaN stays NaN). */
#ifndef EMU_CUDA_BF16_H
#define EMU_CUDA_BF16_H
#include <stdint.h>
#include "cuda_runtime.h"   /* emu_device.h's bit casts */
struct __nv_bfloat16 { uint16_t x; };
static inline float __bfloat162float(__nv_bfloat16 h) {
    return __uint_as_float((uint32_t)h.x << 16);
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t b = __float_as_uint(f);
    __nv_bfloat16 h;
    if ((b & 0x7fffffffu) > 0x7f800000u) h.x = (uint16_t)((b >> 16) | 0x40u);   /* quiet NaN */
    else h.x = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    return h;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
    __nv_bfloat16 h;
    h.x = u;
    return h;
}
/* a pair, 4-byte aligned as CUDA's, for two-element loads */
struct __attribute__((aligned(4))) __nv_bfloat162 { __nv_bfloat16 x, y; };
static inline float2 __bfloat1622float2(__nv_bfloat162 h) {
    float2 f = {__bfloat162float(h.x), __bfloat162float(h.y)};
    return f;
}
#endif
