/* fuzz_lzf.c - the LZF decoder of h5py's lzf episodes (engine/episode_lzf.c), against a plain
 * one written from the format alone, instruction by instruction and a byte at a time.
 *
 * The input: two bytes, the output's room (little-endian, 0..65535), then the stream. The
 * engine's decoder writes into a heap buffer of exactly that room (ASan sees a byte written or
 * read past it: its fast paths copy 8, 16 or 32 bytes at a time, past an instruction's end where
 * room is left), and must agree with the plain decoder on the verdict, the decoded length and
 * every decoded byte. */
#include "fuzz.h"

#include <string.h>

#include "episode_lzf.h"

/* the format, read as plainly as it is written (episode_lzf.c's header) */
static int plain_decode(const uint8_t *in, size_t len, uint8_t *out, size_t cap, size_t *got)
{
    size_t ip = 0, op = 0;
    *got = 0;
    while (ip < len) {
        unsigned c = in[ip++];
        if (c < 32) {   /* c + 1 literal bytes */
            size_t n = (size_t)c + 1;
            if (len - ip < n) return INF_BAD_DATA;
            if (cap - op < n) return INF_TOO_LONG;
            for (size_t i = 0; i < n; i++) out[op++] = in[ip++];
            continue;
        }
        size_t n = c >> 5;   /* a reference: (c >> 5) + 2 bytes, (c >> 5) == 7 extended by a byte */
        if (ip >= len) return INF_BAD_DATA;
        if (n == 7) {
            n += in[ip++];
            if (ip >= len) return INF_BAD_DATA;
        }
        n += 2;
        size_t dist = ((size_t)(c & 31) << 8) + in[ip++] + 1;
        if (dist > op) return INF_BAD_DATA;
        if (cap - op < n) return INF_TOO_LONG;
        for (size_t i = 0; i < n; i++, op++) out[op] = out[op - dist];
    }
    *got = op;
    return INF_OK;
}

int act_fuzz_lzf(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    size_t cap = (size_t)data[0] | (size_t)data[1] << 8;
    const uint8_t *in = data + 2;
    size_t len = size - 2;
    uint8_t *in_copy = malloc(len ? len : 1), *out = malloc(cap ? cap : 1), *want = malloc(cap ? cap : 1);
    FUZZ_ASSERT(in_copy && out && want, "out of memory");
    memcpy(in_copy, in, len);   /* a buffer of exactly the stream's bytes: a read past it is seen */
    size_t got = 0, want_got = 0;
    int v = act_ep_lzf_decode(in_copy, len, out, cap, &got);
    int w = plain_decode(in, len, want, cap, &want_got);
    FUZZ_ASSERT(v == w, "verdict %d, the plain decoder's %d (room %zu, %zu stream bytes)", v, w, cap, len);
    FUZZ_ASSERT(got == want_got, "decoded %zu bytes, the plain decoder %zu", got, want_got);
    if (v == INF_OK) {
        for (size_t i = 0; i < got; i++)
            FUZZ_ASSERT(out[i] == want[i], "byte %zu of %zu: %d, the plain decoder's %d", i, got, out[i], want[i]);
    }
    free(in_copy);
    free(out);
    free(want);
    return 0;
}
