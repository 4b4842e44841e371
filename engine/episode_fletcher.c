/* episode_fletcher.c - HDF5's fletcher32 checksum (design: episode_fletcher.h).
 *
 * HDF5 adds each 16-bit word to sum1 and then sum1 to sum2, folding both ((x & 0xffff) + (x >> 16))
 * after every 360 words, all in uint32_t arithmetic. Inside a block the sums are plain integers,
 * so a block's effect can be computed in any order: with s = the sum of its n words and
 * t = the sum of word i times (n - i), sum1 += s and sum2 += n * sum1 + t (mod 2^32, as HDF5's
 * wraps, if ever), and those two sums vectorize where the running ones cannot. */
#include "episode_fletcher.h"
#include "cpu_ops.h"   /* ACT_CPU_VEC_CLONES */

#define BLOCK 360

/* s and t of one block of n <= BLOCK words. Its first m = 16 * K words run as 16 lanes, lane l
 * holding words l, l + 16, ...: a[l] their sum, b[l] the running sum of a[l] after each group, so
 * b[l] weighs word kL + l by K - k; over those words t = n - m times their sum plus
 * 16 * sum(b) - sum(l * a[l]). Adds only in the loop, which the compilers vectorize (a multiply
 * per word ran slower than the plain loop). The last n - m words are added one by one. */
ACT_CPU_VEC_CLONES
static void block_sums(const uint8_t *restrict p, uint32_t n, uint32_t *s_out, uint32_t *t_out) {
    enum { L = 16 };
    uint32_t a[L] = {0}, b[L] = {0}, m = n / L * L, s = 0, t = 0;
    for (uint32_t k = 0; k < m; k += L, p += 2 * L)
        for (int l = 0; l < L; l++) {
            a[l] += (uint32_t)p[2 * l] << 8 | p[2 * l + 1];
            b[l] += a[l];
        }
    for (int l = 0; l < L; l++) {
        s += a[l];
        t += L * b[l] - (uint32_t)l * a[l];
    }
    t += (n - m) * s;
    for (uint32_t i = m; i < n; i++, p += 2) {
        uint32_t w = (uint32_t)p[0] << 8 | p[1];
        s += w;
        t += (n - i) * w;
    }
    *s_out = s;
    *t_out = t;
}

static uint32_t fold(uint32_t x) { return (x & 0xffff) + (x >> 16); }

uint32_t act_ep_fletcher32(const uint8_t *p, size_t n) {
    uint32_t sum1 = 0, sum2 = 0;
    size_t words = n / 2;
    while (words) {
        uint32_t k = words > BLOCK ? BLOCK : (uint32_t)words, s, t;
        block_sums(p, k, &s, &t);
        sum2 += k * sum1 + t;
        sum1 += s;
        sum1 = fold(sum1);
        sum2 = fold(sum2);
        p += 2 * (size_t)k;
        words -= k;
    }
    if (n % 2) {   /* the odd last byte, as a word's high byte */
        sum1 += (uint32_t)*p << 8;
        sum2 += sum1;
        sum1 = fold(sum1);
        sum2 = fold(sum2);
    }
    return fold(sum2) << 16 | fold(sum1);
}

int act_ep_fletcher32_matches(const uint8_t *p, size_t n, const uint8_t sum[4]) {
    uint32_t stored = (uint32_t)sum[0] | (uint32_t)sum[1] << 8 | (uint32_t)sum[2] << 16 | (uint32_t)sum[3] << 24;
    uint32_t f = act_ep_fletcher32(p, n), swapped = (f & 0x00ff00ffu) << 8 | (f >> 8 & 0x00ff00ffu);
    return stored == f || stored == swapped;
}

int act_ep_fletcher32_ok(const uint8_t *p, size_t n) {
    return n >= 4 && act_ep_fletcher32_matches(p, n - 4, p + n - 4);
}
