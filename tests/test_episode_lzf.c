/* test_episode_lzf.c - the LZF decoder of h5py's lzf episodes (engine/episode_lzf.h):
 *   1. random buffers (runs, repeats at every distance, noise) encoded by a plain greedy LZF
 *      encoder here decode to themselves, exactly into a buffer of their size;
 *   2. the decoder's edge cases: a run copied from 1 byte back, a length-extended reference, a
 *      reference at the largest distance (8192); every length at distances 1..20, 255, 256, with
 *      and without bytes after it (the fast copies' room);
 *   3. damaged streams are refused, never read or written out of bounds (run it under ASan):
 *      a literal run past the input's end, a reference missing its distance byte or its length
 *      byte, a reference before the output's start, and output past the buffer (INF_TOO_LONG);
 *   4. registered as HDF5's filter 32000 (built with HDF5): H5Dread of chunks written raw by
 *      H5Dwrite_chunk gives a valid stream's bytes and a raw-stored chunk's (filter skipped in
 *      its mask), and fails on a stream that decodes short of the chunk or past it.
 * The seed is printed for reproduction; ACT_TEST_SEED sets one. */
#include "test_common.h"
#include "episode_lzf.h"
#ifdef ACT_WITH_HDF5
#include <hdf5.h>
#endif

/* a greedy LZF encoder: the longest match (3..264 bytes, up to 8192 back) among distances
 * 1..8 and the last place of the next three bytes (a hash table, as liblzf keeps), else a literal */
static size_t encode(const uint8_t *in, size_t n, uint8_t *out) {
    static size_t last[1 << 16];
    size_t ip = 0, op = 0, lit_at = 0, lit = 0;
    memset(last, 0, sizeof last);   /* 0: none (positions are stored + 1) */
    while (ip < n) {
        size_t best = 0, dist = 0, cand[9];
        unsigned h = ip + 2 < n ? ((unsigned)in[ip] << 8 ^ (unsigned)in[ip + 1] << 4 ^ in[ip + 2]) & 0xFFFF : 0;
        for (size_t d = 1; d <= 8; d++) cand[d - 1] = d;
        cand[8] = ip + 2 < n && last[h] ? ip - (last[h] - 1) : 0;
        if (ip + 2 < n) last[h] = ip + 1;
        for (int c = 0; c < 9; c++) {
            size_t d = cand[c], l = 0;
            if (d < 1 || d > 8192 || d > ip) continue;
            while (l < 264 && ip + l < n && in[ip + l] == in[ip + l - d]) l++;
            if (l > best) best = l, dist = d;
        }
        if (best >= 3) {
            if (lit) out[lit_at] = (uint8_t)(lit - 1), lit = 0;
            size_t len = best - 2, off = dist - 1;
            if (len < 7) {
                out[op++] = (uint8_t)((len << 5) | (off >> 8));
            } else {
                out[op++] = (uint8_t)((7 << 5) | (off >> 8));
                out[op++] = (uint8_t)(len - 7);
            }
            out[op++] = (uint8_t)(off & 255);
            ip += best;
        } else {
            if (!lit) lit_at = op++;
            out[op++] = in[ip++];
            if (++lit == 32) out[lit_at] = 31, lit = 0;
        }
    }
    if (lit) out[lit_at] = (uint8_t)(lit - 1);
    return op;
}

static void fill(uint8_t *b, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t k = 1 + rnd() % 300, kind = rnd() % 4;
        for (size_t j = 0; j < k && i < n; j++, i++) {
            if (kind == 0) b[i] = (uint8_t)rnd();                           /* noise */
            else if (kind == 1) b[i] = i ? b[i - 1] : 7;                     /* a run */
            else if (kind == 2) b[i] = i >= 3 ? b[i - 3] : (uint8_t)i;       /* a pixel repeated */
            else {                                                           /* a far repeat */
                size_t d = 1 + rnd() % 8192;
                b[i] = i >= d ? b[i - d] : (uint8_t)rnd();
            }
        }
    }
}

/* src[n] as literal runs of up to 32 bytes at enc + *e */
static void put_literals(uint8_t *enc, size_t *e, const uint8_t *src, size_t n) {
    for (size_t i = 0; i < n; i += 32) {
        size_t k = n - i < 32 ? n - i : 32;
        enc[(*e)++] = (uint8_t)(k - 1);
        memcpy(enc + *e, src + i, k);
        *e += k;
    }
}

static int decode(const uint8_t *in, size_t len, uint8_t *out, size_t cap, size_t *got) {
    return act_ep_lzf_decode(in, len, out, cap, got);
}

#ifdef ACT_WITH_HDF5
/* 4: one dataset of 4 chunks of (1, 16, 16, 3) with filter 32000, each chunk's stored bytes
 * written as given; then each chunk read back through HDF5's pipeline */
static void hdf5_filter(void) {
    enum { CH = 16 * 16 * 3 };
    char path[] = "/tmp/act_test_lzf_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        CHECK(0, "mkstemp failed");
        return;
    }
    close(fd);
    uint8_t frame[CH], enc[CH * 2], got[CH];
    fill(frame, CH);
    hsize_t dims[4] = {4, 16, 16, 3}, cdim[4] = {1, 16, 16, 3};
    unsigned cdv[3] = {4, 4, CH};
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), space = H5Screate_simple(4, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 4, cdim);
    H5Pset_filter(dcpl, ACT_EP_FILTER_LZF, H5Z_FLAG_OPTIONAL, 3, cdv);
    hid_t ds = H5Dcreate2(file, "x", H5T_NATIVE_UINT8, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    CHECK(ds >= 0, "cannot create a dataset with filter 32000");
    size_t e = encode(frame, CH, enc), e_short = encode(frame, CH / 2, enc + e);
    uint8_t *longer = malloc(CH + 64);
    fill(longer, CH + 64);
    uint8_t *enc_long = malloc((CH + 64) * 2);
    size_t e_long = encode(longer, CH + 64, enc_long);
    const struct { const uint8_t *b; size_t n; uint32_t mask; int ok; const char *what; } c[4] = {
        {enc, e, 0, 1, "a valid stream"}, {enc + e, e_short, 0, 0, "a stream of half a chunk"},
        {enc_long, e_long, 0, 0, "a stream 64 bytes past the chunk"}, {frame, CH, 1, 1, "a chunk stored raw"}};
    for (int i = 0; i < 4; i++) {
        hsize_t off[4] = {(hsize_t)i, 0, 0, 0};
        CHECK(H5Dwrite_chunk(ds, H5P_DEFAULT, c[i].mask, off, c[i].n, c[i].b) >= 0, "write chunk %d", i);
    }
    H5Dclose(ds);
    H5Fclose(file);
    act_ep_lzf_register();   /* after the create: HDF5 creates no dataset with a filter that cannot encode */
    file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ds = H5Dopen2(file, "x", H5P_DEFAULT);
    hsize_t one[4] = {1, 16, 16, 3};
    hid_t mem = H5Screate_simple(4, one, NULL);
    for (int i = 0; i < 4; i++) {
        hsize_t off[4] = {(hsize_t)i, 0, 0, 0};
        hid_t fs = H5Dget_space(ds);
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, one, NULL);
        memset(got, 0xA5, CH);
        herr_t r = H5Dread(ds, H5T_NATIVE_UINT8, mem, fs, H5P_DEFAULT, got);
        H5Sclose(fs);
        if (c[i].ok)
            CHECK(r >= 0 && !memcmp(got, frame, CH), "%s: read %s", c[i].what, r < 0 ? "failed" : "other bytes");
        else
            CHECK(r < 0, "%s: HDF5's read succeeded", c[i].what);
    }
    H5Eclear2(H5E_DEFAULT);
    H5Sclose(mem);
    H5Dclose(ds);
    H5Fclose(file);
    H5Pclose(dcpl);
    H5Sclose(space);
    free(longer);
    free(enc_long);
    unlink(path);
}
#endif

int main(void) {
    seed_rng("test_episode_lzf");

    enum { N = 40000 };
    uint8_t *in = malloc(N), *enc = malloc(N + N / 32 + 64), *out = malloc(N + 16);
    for (int round = 0; round < 20; round++) {   /* 1 */
        size_t n = 1 + rnd() % N, got = 0;
        fill(in, n);
        size_t e = encode(in, n, enc);
        memset(out, 0xA5, N + 16);
        int v = decode(enc, e, out, n, &got);
        CHECK(v == INF_OK && got == n && !memcmp(in, out, n), "round %d: %zu bytes (%zu encoded): verdict %d, got %zu",
              round, n, e, v, got);
        CHECK(out[n] == 0xA5, "round %d: wrote past the output's end", round);
        if (n > 1) {   /* one byte short of room */
            v = decode(enc, e, out, n - 1, &got);
            CHECK(v == INF_TOO_LONG, "round %d: a buffer a byte short gave verdict %d", round, v);
        }
    }

    size_t got = 0;   /* 2 */
    const uint8_t run[] = {0, 'x', 0xE0, 20, 0};   /* 'x', then 7 + 20 + 2 bytes from 1 back */
    CHECK(decode(run, sizeof run, out, 64, &got) == INF_OK && got == 30, "run: got %zu", got);
    for (size_t i = 0; i < got; i++) CHECK(out[i] == 'x', "run: byte %zu is %d", i, out[i]);
    uint8_t far[8192 + 300], *f = far;
    for (int i = 0; i < 256; i++) {   /* 8192 literal bytes in 256 runs of 32 */
        *f++ = 31;
        for (int j = 0; j < 32; j++) *f++ = (uint8_t)(i * 32 + j) ^ (uint8_t)(i >> 3);
    }
    *f++ = (uint8_t)((1 << 5) | 31);   /* 3 bytes from 8192 back: the stream's first three */
    *f++ = 255;
    uint8_t *big = malloc(8192 + 3);
    CHECK(decode(far, (size_t)(f - far), big, 8195, &got) == INF_OK && got == 8195 && !memcmp(big + 8192, big, 3),
          "largest distance: got %zu", got);
    free(big);

    /* 2b: one reference of every length 3..264 at every distance 1..20, 255 and 256 (the decoder
     * copies runs of a short period by a table, and 16 or 8 bytes at a time past the reference's
     * end where there is room): after it, 0 or 40 bytes of literals, so it ends the buffer or not */
    const size_t dists[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 255, 256};
    int sweep_bad = 0;
    for (size_t di = 0; di < sizeof dists / sizeof dists[0]; di++)
        for (size_t len = 3; len <= 264; len++)
            for (int tail = 0; tail <= 40; tail += 40) {
                size_t d = dists[di], e = 0, n = d + len + (size_t)tail;
                uint8_t want[256 + 264 + 40];
                for (size_t i = 0; i < n; i++) want[i] = i < d || i >= d + len ? (uint8_t)rnd() : want[i - d];
                put_literals(enc, &e, want, d);   /* the period's bytes */
                size_t l = len - 2, off = d - 1;
                if (l < 7) {
                    enc[e++] = (uint8_t)(l << 5 | off >> 8);
                } else {
                    enc[e++] = (uint8_t)(7 << 5 | off >> 8);
                    enc[e++] = (uint8_t)(l - 7);
                }
                enc[e++] = (uint8_t)(off & 255);
                put_literals(enc, &e, want + d + len, (size_t)tail);
                memset(out, 0xA5, n + 16);
                int v = decode(enc, e, out, n, &got);
                if ((v != INF_OK || got != n || memcmp(out, want, n) || out[n] != 0xA5) && sweep_bad++ == 0)
                    CHECK(0, "distance %zu, length %zu, %d bytes after: verdict %d, got %zu of %zu", d, len, tail, v,
                          got, n);
            }
    CHECK(sweep_bad == 0, "%d of the length x distance sweep's streams decoded wrong", sweep_bad);

    const struct {   /* 3 */
        const char *what;
        uint8_t s[8];
        size_t n;
        int want;
    } bad[] = {
        {"a literal run past the input's end", {4, 'a', 'b'}, 3, INF_BAD_DATA},
        {"a reference with no distance byte", {0, 'a', 0x20}, 3, INF_BAD_DATA},
        {"a long reference with no length byte", {0, 'a', 0xE0}, 3, INF_BAD_DATA},
        {"a long reference with no distance byte", {0, 'a', 0xE0, 5}, 4, INF_BAD_DATA},
        {"a reference before the output's start", {0, 'a', 0x20, 1}, 4, INF_BAD_DATA},
        {"a reference as the first instruction", {0x20, 0}, 2, INF_BAD_DATA},
        {"a reference at distance 8192 into 1 byte", {0, 'a', 0x3F, 255}, 4, INF_BAD_DATA},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int v = decode(bad[i].s, bad[i].n, out, 64, &got);
        CHECK(v == bad[i].want, "%s: verdict %d, want %d", bad[i].what, v, bad[i].want);
    }
    CHECK(decode(run, sizeof run, out, 29, &got) == INF_TOO_LONG, "a run past the output's end");
    uint8_t lits[2 + 33];   /* a literal byte, then 32, into 1..32 bytes of room: refused, nothing past them written */
    for (size_t j = 0; j < sizeof lits; j++) lits[j] = (uint8_t)rnd();
    lits[0] = 0;
    lits[2] = 31;
    for (size_t room = 1; room <= 32; room += 1) {
        memset(out, 0xA5, 128);
        int v = decode(lits, sizeof lits, out, room, &got);
        size_t past = room;
        while (past < 128 && out[past] == 0xA5) past++;
        CHECK(v == INF_TOO_LONG && past == 128 && out[0] == lits[1], "literals into %zu bytes: verdict %d, wrote byte %zu",
              room, v, past);
    }
    CHECK(decode(run, 2, out, 0, &got) == INF_TOO_LONG, "a literal into no room");
    CHECK(decode(run, 0, out, 0, &got) == INF_OK && got == 0, "an empty stream");

    free(in);
    free(enc);
    free(out);
#ifdef ACT_WITH_HDF5
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);   /* the failing reads are expected */
    hdf5_filter();
#endif
    if (g_fail) {
        fprintf(stderr, "test_episode_lzf: %d of %d checks failed\n", g_fail, g_checks);
        return 1;
    }
    printf("test_episode_lzf: ok\n");
    return 0;
}
