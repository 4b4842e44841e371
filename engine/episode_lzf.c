/* episode_lzf.c - h5py's LZF filter, decompression only (design: episode_lzf.h).
 *
 * The format: a stream of instructions, each led by a control byte c.
 *   c < 32: a literal run; the next c + 1 bytes are copied to the output.
 *   else:   a back reference of length (c >> 5) + 2 (c >> 5 == 7: plus the next byte) at
 *           distance ((c & 31) << 8) + the following byte + 1 behind the output's end; it may
 *           overlap what it writes (a run), so it is copied a byte at a time when it does. */
#include "episode_lzf.h"
#include "episode_inflate.h"   /* INF_* */

#include <pthread.h>
#include <string.h>

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
            memcpy(out + op, ip, n);
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
        if (dist >= n) {
            memcpy(dst, ref, n);
        } else {
            for (size_t i = 0; i < n; i++) dst[i] = ref[i];
        }
        op += n;
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
