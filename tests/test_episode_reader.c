/* test_episode_reader.c - the episode reader's fast paths against the frames written, with no
 * model (engine/episode.c, episode_direct.c, episode_inflate.c):
 *   1. raw frames read by pread on 3 pool threads: contiguous and chunked (chunks of 3 frames),
 *      with and without a user block before HDF5's data, every window of 1..7 timesteps; the
 *      reader must say it took the pread path, and the bytes must be the ones written;
 *   2. a file cut short after it was opened (another process rewriting it mid-eval): each read
 *      past the cut is an error naming the dataset and saying "truncated", never stale or zero
 *      frames, and reads before the cut still work;
 *   3. gzip chunks (inflated on the pool) read the same bytes;
 *   4. eight more episodes of a random length (8-30 timesteps) in random layouts: contiguous or
 *      chunks of 1-8 frames, raw or gzip, user blocks of 0-4096 bytes, through 1-3.
 * Frames are fresh random bytes each run (the seed is printed; ACT_TEST_SEED replays a run).
 * Built without HDF5, it reports itself skipped. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "episode.h"
#include "test_common.h"

#ifndef ACT_WITH_HDF5
int main(void) {
    printf("test_episode_reader: built without HDF5: skipped\n");
    return 77;
}
#else
#include <hdf5.h>

enum { IH = 12, IW = 10, CAMS = 2, OBS = 3, ACTD = 2 };
static int T = 17;   /* timesteps of the episode being checked */
#define FRAME ((size_t)IH * IW * 3)

typedef struct { int chunk, gzip; hsize_t userblock; char want[64]; } layout;

static void fill(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
}

/* An episode with `frames[c]` (T x FRAME bytes) for cameras c0, c1 in layout l. */
static int write_episode(const char *path, const layout *l, uint8_t *frames[CAMS]) {
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    if (l->userblock) H5Pset_userblock(fcpl, l->userblock);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
    H5Pclose(fcpl);
    if (f < 0) return -1;
    float *tab = malloc(sizeof(float) * (size_t)T * OBS);
    if (!tab) return -1;
    for (int i = 0; i < T * OBS; i++) tab[i] = urand(-1.0f, 1.0f);
    hsize_t d2[2] = {T, OBS}, d2a[2] = {T, ACTD};
    hid_t s = H5Screate_simple(2, d2, NULL), sa = H5Screate_simple(2, d2a, NULL);
    hid_t g = H5Gcreate2(f, "observations", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t gi = H5Gcreate2(g, "images", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t ds = H5Dcreate2(g, "qpos", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, tab);
    H5Dclose(ds);
    ds = H5Dcreate2(f, "action", H5T_IEEE_F32LE, sa, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, tab);
    H5Dclose(ds);
    hsize_t d4[4] = {T, IH, IW, 3}, ch[4] = {(hsize_t)l->chunk, IH, IW, 3};
    hid_t s4 = H5Screate_simple(4, d4, NULL);
    for (int c = 0; c < CAMS; c++) {
        hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
        if (l->chunk) H5Pset_chunk(dcpl, 4, ch);
        if (l->gzip) H5Pset_deflate(dcpl, 4);
        char name[8];
        snprintf(name, sizeof name, "c%d", c);
        ds = H5Dcreate2(gi, name, H5T_STD_U8LE, s4, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        H5Dwrite(ds, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, frames[c]);
        H5Dclose(ds);
        H5Pclose(dcpl);
    }
    H5Sclose(s4);
    H5Sclose(s);
    H5Sclose(sa);
    H5Gclose(gi);
    H5Gclose(g);
    free(tab);
    return H5Fclose(f) < 0 ? -1 : 0;
}

static act_config config(void) {
    act_config c;
    memset(&c, 0, sizeof c);
    c.obs_dim = OBS;
    c.action_dim = ACTD;
    c.num_cams = CAMS;
    c.image_h = IH;
    c.image_w = IW;
    strcpy(c.camera_names[0], "c0");
    strcpy(c.camera_names[1], "c1");
    return c;
}

static void check_layout(const layout *l, const char *path) {
    uint8_t *frames[CAMS], *got = malloc(FRAME * T);
    for (int c = 0; c < CAMS; c++) {
        frames[c] = malloc(FRAME * T);
        fill(frames[c], FRAME * T);
    }
    act_config cfg = config();
    act_episode *ep = NULL;
    char err[1024], how[128];
    CHECK(write_episode(path, l, frames) == 0, "%s: cannot write the episode", l->want);
    if (act_episode_open(path, &cfg, &ep, err, sizeof err)) {
        CHECK(0, "chunk %d userblock %llu: open: %s", l->chunk, (unsigned long long)l->userblock, err);
        goto out;
    }
    for (int c = 0; c < CAMS; c++) {
        act_episode_reader(ep, c, how, sizeof how);
        CHECK(strstr(how, l->want) != NULL, "chunk %d gzip %d userblock %llu camera %d: read by '%s', expected '%s'",
              l->chunk, l->gzip, (unsigned long long)l->userblock, c, how, l->want);
    }
    /* 1 and 3: every window of 1..7 timesteps */
    for (int c = 0; c < CAMS; c++)
        for (int n = 1; n <= 7; n++)
            for (int t0 = 0; t0 + n <= T; t0++) {
                memset(got, 0xA5, FRAME * (size_t)n);
                int rc = act_episode_read_frames(ep, c, t0, n, got, err, sizeof err);
                CHECK(rc == 0, "%s camera %d [%d, %d): %s", how, c, t0, t0 + n, err);
                CHECK(rc || !memcmp(got, frames[c] + (size_t)t0 * FRAME, FRAME * (size_t)n),
                      "%s camera %d [%d, %d): other bytes than written", how, c, t0, t0 + n);
            }
    /* 2: cut the file short in the middle of the last camera's frames, after the open (raw only:
     * a gzip chunk is read whole into scratch and its cut is an inflate error, test_episode_inflate.py) */
    if (!l->gzip) {
        FILE *f = fopen(path, "rb");
        long size = 0;
        if (f && !fseek(f, 0, SEEK_END)) size = ftell(f);
        if (f) fclose(f);
        /* where frame T-5 of camera 1 starts: find its bytes in the file */
        uint8_t *all = malloc((size_t)size);
        f = fopen(path, "rb");
        size_t rd = f ? fread(all, 1, (size_t)size, f) : 0;
        if (f) fclose(f);
        long cut = -1;
        for (long o = 0; rd == (size_t)size && o + (long)FRAME <= size; o++)
            if (!memcmp(all + o, frames[1] + (size_t)(T - 5) * FRAME, FRAME)) {
                cut = o + (long)FRAME / 2;
                break;
            }
        free(all);
        CHECK(cut > 0, "frame %d of camera 1 not found in the file", T - 5);
        if (cut > 0 && truncate(path, cut) == 0) {
            int rc = act_episode_read_frames(ep, 1, T - 7, 4, got, err, sizeof err);
            CHECK(rc != 0, "chunk %d userblock %llu: a read past the cut succeeded", l->chunk,
                  (unsigned long long)l->userblock);
            CHECK(rc == 0 || (strstr(err, "images/c1") && strstr(err, "truncated")),
                  "the error should name the dataset and say truncated: %s", err);
            rc = act_episode_read_frames(ep, 1, T - 1, 1, got, err, sizeof err);
            CHECK(rc != 0, "a read of the last frame after the cut succeeded");
            /* chunk 0 of camera 0 lies before the cut */
            rc = act_episode_read_frames(ep, 0, 0, 2, got, err, sizeof err);
            CHECK(rc == 0 && !memcmp(got, frames[0], 2 * FRAME), "a read before the cut failed: %s", err);
        }
    }
    act_episode_close(ep);
out:
    for (int c = 0; c < CAMS; c++) free(frames[c]);
    free(got);
    unlink(path);
}

int main(void) {
    seed_rng("test_episode_reader");
    setenv("ACT_EPISODE_THREADS", "3", 1);   /* the pool's paths; 1 would leave all to HDF5 */
    char path[] = "/tmp/act_test_episode_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        return 1;
    }
    close(fd);
    const layout layouts[] = {
        {0, 0, 0, "pread, contiguous"},
        {3, 0, 0, "pread, chunks of 3 frames"},
        {0, 0, 512, "pread, contiguous"},
        {3, 0, 1024, "pread, chunks of 3 frames"},
        {1, 0, 0, "pread, chunks of 1 frames"},
        {3, 1, 0, "gzip chunks of 3 frames"},
        {2, 1, 512, "gzip chunks of 2 frames"},
    };
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) check_layout(&layouts[i], path);
    /* and episodes of a random length (8-30) in random layouts */
    static const int chunks[] = {0, 1, 2, 4, 5, 7, 8};
    static const hsize_t blocks[] = {0, 512, 1024, 4096};
    for (int i = 0; i < 8; i++) {
        layout l;
        memset(&l, 0, sizeof l);
        T = 8 + (int)(rnd() % 23);
        l.chunk = chunks[rnd() % 7];
        l.gzip = l.chunk && rnd() % 3 == 0;
        l.userblock = blocks[rnd() % 4];
        if (!l.chunk) snprintf(l.want, sizeof l.want, "pread, contiguous");
        else snprintf(l.want, sizeof l.want, "%s chunks of %d frames", l.gzip ? "gzip" : "pread,", l.chunk);
        check_layout(&l, path);
    }
    printf("test_episode_reader: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
#endif
