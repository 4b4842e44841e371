/* episode_lzf.c - h5py's LZF filter, decompression only (design: episode_lzf.h).
 *
 * The format: a stream of instructions, each led by a control byte c.
 *   c < 32: a literal run; the next c + 1 bytes are copied to the output.
 *   else:   a back reference of length (c >> 5) + 2 (c >> 5 == 7: plus the next byte) at
 *           distance ((c & 31) << 8) + the following byte + 1 behind the output's end; it may
 *           overlap what it writes (a run of period dist).
 * Away from the output's end both are copied in 16- or 8-byte blocks, past their length where
 * room is left (a run of a short period: its first 8 bytes by a table, then from a multiple of
 * the period of at least 8 back): 10-27% less time a frame than a memcpy or a byte loop per
 * instruction (bench/RESULTS.md, session 36). tests/fuzz/fuzz_lzf.c holds it to a plain decoder. */
#include "episode_lzf.h"
#include "episode_inflate.h"   /* act_ep_has_filter */

#include <pthread.h>
#include <string.h>

/* 16 or 8 bytes from s to d, unaligned: one load and one store each where the target has them */
static inline void copy16(uint8_t *d, const uint8_t *s) { memcpy(d, s, 16); }
static inline void copy8(uint8_t *d, const uint8_t *s) { memcpy(d, s, 8); }

int act_ep_lzf_decode(const uint8_t *in, size_t in_len, uint8_t *out, size_t cap, size_t *got) {
    const uint8_t *ip = in, *end = in + in_len;
    size_t op = 0;
    *got = 0;
    while (ip < end) {
        unsigned c = *ip++;
        if (c < 32) {
            size_t n = (size_t)c + 1;
            if ((size_t)(end - ip) < n) return INF_BAD_DATA;
            if (cap - op < n) return INF_TOO_LONG;
            if ((size_t)(end - ip) >= 32 && cap - op >= 32) {
                /* room on both sides: 32 bytes whatever n is (no call, no branch on n); the bytes
                 * past n are written over by what follows */
                copy16(out + op, ip);
                copy16(out + op + 16, ip + 16);
            } else {
                memcpy(out + op, ip, n);
            }
            ip += n;
            op += n;
            continue;
        }
        size_t n = c >> 5;
        if (ip >= end) return INF_BAD_DATA;
        if (n == 7) {
            n += *ip++;
            if (ip >= end) return INF_BAD_DATA;
        }
        n += 2;
        size_t dist = ((size_t)(c & 31) << 8) + *ip++ + 1;
        if (dist > op) return INF_BAD_DATA;
        if (cap - op < n) return INF_TOO_LONG;
        uint8_t *dst = out + op;
        const uint8_t *ref = dst - dist;
        op += n;
        if (cap - op < 16) {   /* no room to write past the reference's end: exactly */
            for (size_t i = 0; i < n; i++) dst[i] = ref[i];
            continue;
        }
        /* in 16- or 8-byte pieces, up to 15 past n, each from bytes written before it: from dist
         * back when dist is 16 or more (8 or more). A shorter period (a run: dist 3 is a flat RGB
         * colour): its first 8 bytes from the period's bytes by table, then 8 at a time from the
         * first multiple of the period of 8 or more back */
        if (dist >= 16) {
            for (size_t i = 0; i < n; i += 16) copy16(dst + i, ref + i);
        } else if (dist >= 8) {
            for (size_t i = 0; i < n; i += 8) copy8(dst + i, ref + i);
        } else {
            static const uint8_t at[8][8] = {{0}, {0, 0, 0, 0, 0, 0, 0, 0}, {0, 1, 0, 1, 0, 1, 0, 1},
                                             {0, 1, 2, 0, 1, 2, 0, 1}, {0, 1, 2, 3, 0, 1, 2, 3},
                                             {0, 1, 2, 3, 4, 0, 1, 2}, {0, 1, 2, 3, 4, 5, 0, 1},
                                             {0, 1, 2, 3, 4, 5, 6, 0}};
            static const uint8_t back[8] = {0, 8, 8, 9, 8, 10, 12, 14};
            uint8_t first[8];
            for (int j = 0; j < 8; j++) first[j] = ref[at[dist][j]];
            copy8(dst, first);
            for (size_t i = 8; i < n; i += 8) copy8(dst + i, dst + i - back[dist]);
        }
    }
    *got = op;
    return INF_OK;
}

#ifdef ACT_WITH_HDF5
#include <hdf5.h>

/* HDF5's filter callback: replaces *buf (nbytes of a stored chunk) with its decoded bytes.
 * cd_values[2], where h5py stored it, is the chunk's size, which the stream must decode to
 * exactly (HDF5 before 1.10.5, with no check at open, would copy a short one's missing bytes
 * from uninitialised memory); 0 means failure to HDF5. */
static size_t lzf_filter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[], size_t nbytes,
                         size_t *buf_size, void **buf) {
    if (!(flags & H5Z_FLAG_REVERSE)) return 0;   /* no writing */
    size_t cap = cd_nelmts >= 3 && cd_values[2] ? cd_values[2] : *buf_size;
    for (int tries = 0; tries < 8; tries++) {
        uint8_t *out = H5allocate_memory(cap ? cap : 1, 0);
        if (!out) return 0;
        size_t got = 0;
        int v = act_ep_lzf_decode(*buf, nbytes, out, cap, &got);
        if (v == INF_OK && cd_nelmts >= 3 && cd_values[2] && got != cd_values[2]) v = INF_BAD_DATA;   /* short */
        if (v == INF_OK) {
            H5free_memory(*buf);
            *buf = out;
            *buf_size = cap;
            return got;
        }
        H5free_memory(out);
        if (v != INF_TOO_LONG) return 0;
        cap = cap * 2 + 1;   /* no size stored (not h5py's writer): grow */
    }
    return 0;
}

static void register_once(void) {
    /* not H5Zfilter_avail first: it would dlopen every library in HDF5's plugin folder; H5Zregister
     * replaces a filter 32000 registered before (this decoder checks every stream it reads) */
    static const H5Z_class2_t cls = {H5Z_CLASS_T_VERS, ACT_EP_FILTER_LZF, 0, 1, "lzf (act-engine, decode only)",
                                     NULL, NULL, lzf_filter};
    H5Zregister(&cls);
    H5Eclear2(H5E_DEFAULT);
}

void act_ep_lzf_register(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_once);
}

void act_ep_lzf_register_for(hid_t ds) {
    if (act_ep_has_filter(ds, ACT_EP_FILTER_LZF)) act_ep_lzf_register();
}
#else
void act_ep_lzf_register(void) {}
#endif
