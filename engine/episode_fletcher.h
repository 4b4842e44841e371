/* episode_fletcher.h - HDF5's fletcher32 checksum filter (filter id 3), checked on the pool.
 * defines: act_ep_fletcher32, act_ep_fletcher32_matches, act_ep_fletcher32_ok
 *
 * h5py's `fletcher32=True` appends to every stored chunk a 4-byte checksum of the bytes the
 * earlier filters made (h5py applies it last: after shuffle and gzip or lzf). The pool
 * (episode_inflate.c) checks it on its threads before it decodes the chunk, as HDF5's read does,
 * so such datasets read there instead of on HDF5's single-threaded path. */
#ifndef ACT_EPISODE_FLETCHER_H
#define ACT_EPISODE_FLETCHER_H

#include <stddef.h>
#include <stdint.h>

/* HDF5's fletcher32 of p[n] (its H5_checksum_fletcher32, to the bit): 16-bit big-endian words,
 * two sums folded back to 16 bits (end-around carry) every 360 words, an odd last byte as a word's
 * high byte; the result sum2 << 16 | sum1. */
uint32_t act_ep_fletcher32(const uint8_t *p, size_t n);

/* 1 when sum[4] (a stored checksum, little-endian) is a valid checksum of p[n]: act_ep_fletcher32's
 * value, or that value with the two bytes of each 16-bit half swapped (which HDF5 before 1.6.3
 * wrote; HDF5's reader accepts both). For a chunk whose bytes and checksum were read apart. */
int act_ep_fletcher32_matches(const uint8_t *p, size_t n, const uint8_t sum[4]);

/* 1 when p[n] ends in a valid checksum of its first n - 4 bytes (as act_ep_fletcher32_matches). 0
 * otherwise, and for n < 4. */
int act_ep_fletcher32_ok(const uint8_t *p, size_t n);

#endif
