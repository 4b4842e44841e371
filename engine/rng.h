/* rng.h - the counter-based normal generator for the CVAE reparameterization.
 * defines: act_splitmix64, act_unit (a uniform stream for test and bench inputs),
 *          act_normal_eps - the same function on host and device, so CPU and CUDA draw the same
 * eps for the same (seed, index): splitmix64 of (seed, index) -> two uniforms -> Box-Muller. */
#ifndef ACT_RNG_H
#define ACT_RNG_H
#include <stdint.h>
#include <math.h>

#ifdef __CUDACC__
#define ACT_HD __host__ __device__
#else
#define ACT_HD
#endif

static ACT_HD inline uint64_t act_splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* advance a splitmix64 stream and return a uniform float in [0, 1) (24 bits) */
static inline float act_unit(uint64_t *state) {
    *state = act_splitmix64(*state);
    return (float)(*state >> 40) * (1.0f / 16777216.0f);
}

static ACT_HD inline float act_normal_eps(uint64_t seed, uint64_t idx) {
    uint64_t r = act_splitmix64(seed ^ act_splitmix64(idx));
    /* 24-bit uniforms in (0, 1] and [0, 1) */
    float u1 = ((float)(r >> 40) + 1.0f) * (1.0f / 16777216.0f);
    float u2 = (float)((r >> 8) & 0xffffffull) * (1.0f / 16777216.0f);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
}
#endif
