/* test_episode_fletcher.c - HDF5's fletcher32 checksum as the pool computes it (engine/episode_fletcher.h):
 *   1. act_ep_fletcher32 equals a plain transcription of HDF5's loop (a word at a time, folded
 *      every 360 words) on random buffers of every length 0..2200, lengths around the block
 *      boundaries up to 1 MiB, and buffers of all 0xff (the largest sums) and all 0x00;
 *   2. act_ep_fletcher32_ok accepts a buffer ending in its checksum, or in that checksum with each
 *      half's bytes swapped (HDF5 before 1.6.3), and refuses any one bit flipped anywhere and
 *      buffers shorter than 4 bytes;
 *   3. against HDF5 itself (built with HDF5): datasets written with H5Pset_fletcher32, chunks of an
 *      odd byte count and of a 256x256 frame, read back raw (H5Dread_chunk) end in exactly
 *      act_ep_fletcher32 of their bytes; chunks written raw with a valid, a swapped and a wrong
 *      checksum are read by HDF5's H5Dread when and only when act_ep_fletcher32_ok accepts them.
 * The seed is printed for reproduction; ACT_TEST_SEED sets one. */
#include "test_common.h"
#include "episode_fletcher.h"
#ifdef ACT_WITH_HDF5
#include <hdf5.h>
#endif

static void fill(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
}

/* HDF5's loop, word by word: the reference */
static uint32_t slow(const uint8_t *p, size_t n) {
    uint32_t a = 0, b = 0;
    size_t words = n / 2;
    while (words) {
        size_t k = words > 360 ? 360 : words;
        words -= k;
        for (; k; k--, p += 2) {
            a += (uint32_t)p[0] << 8 | p[1];
            b += a;
        }
        a = (a & 0xffff) + (a >> 16);
        b = (b & 0xffff) + (b >> 16);
    }
    if (n & 1) {
        a += (uint32_t)p[0] << 8;
        b += a;
        a = (a & 0xffff) + (a >> 16);
        b = (b & 0xffff) + (b >> 16);
    }
    a = (a & 0xffff) + (a >> 16);
    b = (b & 0xffff) + (b >> 16);
    return b << 16 | a;
}

static void put_le(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t swapped(uint32_t f) { return (f & 0x00ff00ffu) << 8 | (f >> 8 & 0x00ff00ffu); }

/* 1 */
static void sums(void) {
    enum { BIG = 1 << 20 };
    uint8_t *b = malloc(BIG + 1);
    fill(b, BIG + 1);
    for (size_t n = 0; n <= 2200; n++) {
        size_t at = rnd() % 64;   /* any alignment */
        CHECK(act_ep_fletcher32(b + at, n) == slow(b + at, n), "random, %zu bytes at +%zu", n, at);
    }
    const size_t edges[] = {719, 720, 721, 1439, 1440, 1441, 7200, 65535, 65536, 196608, 196609, BIG};
    for (size_t i = 0; i < sizeof edges / sizeof *edges; i++)
        CHECK(act_ep_fletcher32(b + 1, edges[i]) == slow(b + 1, edges[i]), "random, %zu bytes", edges[i]);
    for (int v = 0; v < 2; v++) {
        memset(b, v ? 0xff : 0x00, BIG + 1);
        for (size_t i = 0; i < sizeof edges / sizeof *edges; i++)
            CHECK(act_ep_fletcher32(b, edges[i]) == slow(b, edges[i]), "all 0x%02x, %zu bytes", v ? 0xff : 0,
                  edges[i]);
    }
    free(b);
}

/* 2 */
static void verdicts(void) {
    enum { N = 3001 };
    uint8_t b[N + 4];
    for (int round = 0; round < 20; round++) {
        size_t n = 1 + rnd() % N;
        fill(b, n);
        uint32_t f = act_ep_fletcher32(b, n);
        put_le(b + n, f);
        CHECK(act_ep_fletcher32_ok(b, n + 4), "a valid checksum refused (%zu bytes)", n);
        for (int k = 0; k < 32; k++) {   /* one bit flipped: in the data or in the checksum */
            size_t bit = rnd() % ((n + 4) * 8);
            b[bit / 8] ^= (uint8_t)(1u << bit % 8);
            CHECK(!act_ep_fletcher32_ok(b, n + 4), "bit %zu of %zu bytes flipped, accepted", bit, n + 4);
            b[bit / 8] ^= (uint8_t)(1u << bit % 8);
        }
        put_le(b + n, swapped(f));
        CHECK(act_ep_fletcher32_ok(b, n + 4), "the pre-1.6.3 (swapped) checksum refused");
        put_le(b + n, f ^ 0x00010000u);
        CHECK(!act_ep_fletcher32_ok(b, n + 4), "a checksum off by one in sum2 accepted");
    }
    memset(b, 0, 8);
    for (size_t n = 0; n < 4; n++) CHECK(!act_ep_fletcher32_ok(b, n), "%zu bytes accepted", n);
    CHECK(act_ep_fletcher32_ok(b, 4), "an empty buffer's checksum (0) refused");
}

#ifdef ACT_WITH_HDF5
static hid_t dataset(hid_t file, const char *name, const hsize_t *dims, const hsize_t *cdim) {
    hid_t space = H5Screate_simple(4, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 4, cdim);
    H5Pset_fletcher32(dcpl);
    hid_t ds = H5Dcreate2(file, name, H5T_NATIVE_UINT8, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Pclose(dcpl);
    H5Sclose(space);
    return ds;
}

/* 3 */
static void against_hdf5(void) {
    char path[] = "/tmp/act_test_fletcher_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        CHECK(0, "mkstemp failed");
        return;
    }
    close(fd);
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    /* HDF5 writes the checksums: chunks of 7 * 9 * 3 = 189 bytes (odd) and of a whole frame */
    const struct { const char *name; hsize_t dims[4], cdim[4]; } sets[2] = {
        {"odd", {4, 14, 18, 3}, {1, 7, 9, 3}}, {"frame", {3, 256, 256, 3}, {1, 256, 256, 3}}};
    for (int s = 0; s < 2; s++) {
        const hsize_t *d = sets[s].dims, *c = sets[s].cdim;
        size_t total = d[0] * d[1] * d[2] * d[3], chunk = c[0] * c[1] * c[2] * c[3];
        uint8_t *x = malloc(total), *raw = malloc(chunk + 4), *want = malloc(chunk);
        fill(x, total);
        hid_t ds = dataset(file, sets[s].name, d, c);
        CHECK(ds >= 0 && H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) >= 0, "write %s",
              sets[s].name);
        int n = 0;
        for (hsize_t t = 0; t < d[0]; t += c[0])
            for (hsize_t y = 0; y < d[1]; y += c[1])
                for (hsize_t z = 0; z < d[2]; z += c[2], n++) {
                    hsize_t o[4] = {t, y, z, 0}, size = 0;
                    uint32_t mask = 1;
                    CHECK(H5Dget_chunk_storage_size(ds, o, &size) >= 0 && size == chunk + 4,
                          "%s: chunk %d stores %llu bytes", sets[s].name, n, (unsigned long long)size);
                    if (size != chunk + 4 || H5Dread_chunk(ds, H5P_DEFAULT, o, &mask, raw) < 0) continue;
                    for (hsize_t i = 0; i < c[1]; i++)   /* the chunk's bytes, row by row */
                        memcpy(want + i * c[2] * 3, x + (((t * d[1]) + y + i) * d[2] + z) * 3, c[2] * 3);
                    uint32_t stored = (uint32_t)raw[chunk] | (uint32_t)raw[chunk + 1] << 8 |
                                      (uint32_t)raw[chunk + 2] << 16 | (uint32_t)raw[chunk + 3] << 24;
                    CHECK(mask == 0 && !memcmp(raw, want, chunk), "%s: chunk %d's stored bytes", sets[s].name, n);
                    CHECK(stored == act_ep_fletcher32(raw, chunk), "%s: chunk %d: HDF5 stored %08x, we compute %08x",
                          sets[s].name, n, stored, act_ep_fletcher32(raw, chunk));
                    CHECK(act_ep_fletcher32_ok(raw, chunk + 4), "%s: chunk %d refused", sets[s].name, n);
                }
        H5Dclose(ds);
        free(x);
        free(raw);
        free(want);
    }
    /* chunks written raw with a valid, a swapped and a wrong checksum: HDF5's verdict is ours */
    enum { CH = 7 * 9 * 3 };
    hsize_t dims[4] = {4, 7, 9, 3}, cdim[4] = {1, 7, 9, 3};
    hid_t ds = dataset(file, "given", dims, cdim);
    uint8_t chunks[4][CH + 4];
    for (int i = 0; i < 4; i++) {
        fill(chunks[i], CH);
        uint32_t f = act_ep_fletcher32(chunks[i], CH);
        put_le(chunks[i] + CH, i == 0 ? f : i == 1 ? swapped(f) : i == 2 ? f + 1 : f ^ 0xffff0000u);
        hsize_t o[4] = {(hsize_t)i, 0, 0, 0};
        CHECK(H5Dwrite_chunk(ds, H5P_DEFAULT, 0, o, CH + 4, chunks[i]) >= 0, "write chunk %d", i);
    }
    H5Dclose(ds);
    H5Fclose(file);
    file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ds = H5Dopen2(file, "given", H5P_DEFAULT);
    hsize_t one[4] = {1, 7, 9, 3};
    hid_t mem = H5Screate_simple(4, one, NULL);
    for (int i = 0; i < 4; i++) {
        hsize_t o[4] = {(hsize_t)i, 0, 0, 0};
        hid_t fs = H5Dget_space(ds);
        uint8_t got[CH];
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, o, NULL, one, NULL);
        int hdf5_ok = H5Dread(ds, H5T_NATIVE_UINT8, mem, fs, H5P_DEFAULT, got) >= 0 && !memcmp(got, chunks[i], CH);
        H5Sclose(fs);
        int ours = act_ep_fletcher32_ok(chunks[i], CH + 4);
        CHECK(hdf5_ok == ours && ours == (i < 2), "chunk %d: HDF5 reads it: %d, we accept it: %d", i, hdf5_ok, ours);
    }
    H5Eclear2(H5E_DEFAULT);
    H5Sclose(mem);
    H5Dclose(ds);
    H5Fclose(file);
    unlink(path);
}
#endif

int main(void) {
    seed_rng("test_episode_fletcher");
    sums();
    verdicts();
#ifdef ACT_WITH_HDF5
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);   /* the failing reads are expected */
    against_hdf5();
#endif
    if (g_fail) {
        fprintf(stderr, "test_episode_fletcher: %d of %d checks failed\n", g_fail, g_checks);
        return 1;
    }
    printf("test_episode_fletcher: ok\n");
    return 0;
}
