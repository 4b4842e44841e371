/* test_episode_tiles.c - gzip tiles (chunks of (t, y, x, c) that are not whole frames, like
 * h5py's automatic chunks), and the same tiles stored uncompressed, through the pool's reader and
 * its row cache (engine/episode_inflate.c) against the frames written, in every order a caller
 * may read them:
 *   - windows anywhere, short windows, the same window twice, batches forward and backward,
 *     cameras interleaved (each camera keeps its own rows of inflated tiles, and a window that
 *     ends inside a row leaves it for the next: a stale or misplaced row shows as wrong bytes);
 *   - eleven fixed tile shapes (one channel, two, three; tiles of one frame and of more frames
 *     than the episode has; edge tiles hanging over the frame; 4608 tiles, which the open's
 *     chunk check finds by size, episode_check.c) and 30 random ones;
 *   - tiles of exactly 4 MiB (the pool's limit) and of 4 MiB + 64 KiB (HDF5's path), and rows
 *     of tiles too large to keep (past 64 MiB);
 *   - each inflater the build has (ACT_EPISODE_INFLATE: libdeflate, zlib), and no filter at all
 *     ("raw": the fetched bytes copied into place);
 *   - tiles fetched by pread at the places of the chunk table read at open (episode_index.c: walked
 *     in HDF5 1.10.5-1.10.9, listed by H5Dchunk_iter in 1.10.10+ and 1.14+), and for a third of
 *     the random shapes through H5Dread_chunk (ACT_EPISODE_PREAD=0);
 *   - half the random shapes with reads held to two rows of tiles at once (ACT_EPISODE_TILE_JOBS:
 *     longer windows are read in parts), and a row past the limit refused by name.
 * Frames are fresh random bytes (the seed is printed; ACT_TEST_SEED replays a run). The pool has
 * ACT_EPISODE_THREADS threads (3 unless set: 1 leaves every read to HDF5). Built without HDF5,
 * it reports itself skipped. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "episode.h"
#include "episode_index.h"     /* ACT_EP_INDEX */
#include "episode_inflate.h"   /* act_ep_inflater_check */
#include "test_common.h"

#ifndef ACT_WITH_HDF5
int main(void) {
    printf("test_episode_tiles: built without HDF5: skipped\n");
    return 77;
}
#else
#include <hdf5.h>

enum { OBS = 3, ACTD = 2, MAX_FAIL_LINES = 20 };

typedef struct {
    int T, H, W, cams;
    hsize_t tile[4]; /* (t, y, x, c) */
} shape;

/* gzip 0: the camera datasets are stored without filters */
static int write_episode(const char *path, const shape *s, uint8_t *const *frames, int gzip) {
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return -1;
    float *tab = malloc(sizeof(float) * (size_t)s->T * OBS);
    for (int i = 0; i < s->T * OBS; i++) tab[i] = (float)(i % 7) + 0.5f;
    hsize_t dq[2] = {(hsize_t)s->T, OBS}, da[2] = {(hsize_t)s->T, ACTD};
    hsize_t d4[4] = {(hsize_t)s->T, (hsize_t)s->H, (hsize_t)s->W, 3};
    hsize_t mx[4] = {H5S_UNLIMITED, (hsize_t)s->H, (hsize_t)s->W, 3};
    hid_t sq = H5Screate_simple(2, dq, NULL), sa = H5Screate_simple(2, da, NULL);
    /* a tile longer than the episode needs a dataset that may grow in time */
    hid_t s4 = H5Screate_simple(4, d4, s->tile[0] > (hsize_t)s->T ? mx : NULL);
    hid_t g = H5Gcreate2(f, "observations", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t gi = H5Gcreate2(g, "images", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int rc = 0;
    hid_t ds = H5Dcreate2(g, "qpos", H5T_IEEE_F32LE, sq, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    rc |= H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, tab) < 0;
    H5Dclose(ds);
    ds = H5Dcreate2(f, "action", H5T_IEEE_F32LE, sa, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    rc |= H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, tab) < 0;
    H5Dclose(ds);
    for (int c = 0; c < s->cams; c++) {
        hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
        H5Pset_chunk(dcpl, 4, s->tile);
        if (gzip) H5Pset_deflate(dcpl, 1);
        char name[16];
        snprintf(name, sizeof name, "c%d", c);
        ds = H5Dcreate2(gi, name, H5T_STD_U8LE, s4, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        rc |= ds < 0 || H5Dwrite(ds, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, frames[c]) < 0;
        H5Dclose(ds);
        H5Pclose(dcpl);
    }
    H5Sclose(s4);
    H5Sclose(sq);
    H5Sclose(sa);
    H5Gclose(gi);
    H5Gclose(g);
    free(tab);
    return (H5Fclose(f) < 0 || rc) ? -1 : 0;
}

/* one window [t0, t0 + n) of camera cam against the frames written */
static void check_window(act_episode *ep, const shape *s, uint8_t *const *frames, uint8_t *got,
                         int cam, int t0, int n, const char *how, const char *what) {
    size_t frame = (size_t)s->H * s->W * 3;
    char err[1024] = "";
    memset(got, 0xA5, frame * n);
    int rc = act_episode_read_frames(ep, cam, t0, n, got, err, sizeof err);
    int ok = rc == 0 && !memcmp(got, frames[cam] + (size_t)t0 * frame, frame * n);
    if (!ok && g_fail >= MAX_FAIL_LINES) {   /* counted, not printed */
        g_checks++;
        g_fail++;
        return;
    }
    CHECK(ok, "%s, T=%d %dx%d, %s: camera %d [%d, %d): %s", how, s->T, s->H, s->W, what, cam, t0,
          t0 + n, rc ? err : "wrong bytes");
}

/* tiles per chunk of frames: across y, x and channels */
static int tiles_per_row(const shape *s) {
    return (int)(((hsize_t)s->H + s->tile[1] - 1) / s->tile[1] * (((hsize_t)s->W + s->tile[2] - 1) / s->tile[2]) *
                 ((3 + s->tile[3] - 1) / s->tile[3]));
}

/* split: a read may inflate no more than two rows of tiles at once (ACT_EPISODE_TILE_JOBS), so
 * longer windows are read in parts (episode_inflate.c) */
static void check_shape(const char *path, const shape *s, int reads, const char *inflater, int split) {
    int gzip = strcmp(inflater, "raw") != 0;
    size_t frame = (size_t)s->H * s->W * 3;
    char jobs[32];
    snprintf(jobs, sizeof jobs, "%d", 2 * tiles_per_row(s));
    if (split) setenv("ACT_EPISODE_TILE_JOBS", jobs, 1);
    else unsetenv("ACT_EPISODE_TILE_JOBS");
    uint8_t *frames[ACT_MAX_CAMS];
    for (int c = 0; c < s->cams; c++) {
        frames[c] = malloc(frame * s->T);
        for (size_t j = 0; j < frame * s->T; j++) frames[c][j] = (uint8_t)(rnd() >> 56);
    }
    if (write_episode(path, s, frames, gzip)) {
        CHECK(0, "writing the episode %s failed", path);
        goto out;
    }
    act_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.obs_dim = OBS;
    cfg.action_dim = ACTD;
    cfg.num_cams = s->cams;
    cfg.image_h = s->H;
    cfg.image_w = s->W;
    for (int c = 0; c < s->cams; c++)
        snprintf(cfg.camera_names[c], sizeof cfg.camera_names[c], "c%d", c);
    act_episode *ep = NULL;
    char err[1024], how[200];
    if (act_episode_open(path, &cfg, &ep, err, sizeof err)) {
        CHECK(0, "open, tiles (%llu, %llu, %llu, %llu): %s", (unsigned long long)s->tile[0],
              (unsigned long long)s->tile[1], (unsigned long long)s->tile[2],
              (unsigned long long)s->tile[3], err);
        goto out;
    }
    act_episode_reader(ep, 0, how, sizeof how);
    /* tiles up to 4 MiB are inflated by the pool with the inflater asked for; larger ones are
     * left to HDF5 (episode_inflate.c bounds the pool threads' scratch), as are those a row of
     * which (all tiles of one first timestep) is over the bytes a read holds */
    const char *cap_env = getenv("ACT_EPISODE_READ_MIB");
    double cap = (cap_env ? atof(cap_env) : 256) * (1 << 20);
    double row = (double)s->tile[0] * s->tile[1] * s->tile[2] * s->tile[3] * tiles_per_row(s);
    int pool = s->tile[0] * s->tile[1] * s->tile[2] * s->tile[3] <= (4u << 20) && row <= cap;
    CHECK(pool ? (gzip ? strstr(how, "gzip chunks of (") && !strncmp(how, inflater, strlen(inflater))
                       : !strncmp(how, "pool, raw chunks of (", 21))
               : !strcmp(how, "hdf5"),
          "tiles (%llu, %llu, %llu, %llu) should take %s, not: %s",
          (unsigned long long)s->tile[0], (unsigned long long)s->tile[1],
          (unsigned long long)s->tile[2], (unsigned long long)s->tile[3],
          pool ? "the pool's tile path" : "HDF5's path", how);
    /* the pool fetches tiles by pread at the places of the chunk table read at open
     * (episode_index.c), or through H5Dread_chunk with ACT_EPISODE_PREAD=0 or an HDF5 that gets
     * no table (1.12.0-1.12.2) */
    const char *pe = getenv("ACT_EPISODE_PREAD");
    int pread = ACT_EP_INDEX && !(pe && !strcmp(pe, "0"));
    CHECK(!pool || (strstr(how, ", pread") != NULL) == pread, "tiles (%llu, %llu, %llu, %llu): fetched %s, not: %s",
          (unsigned long long)s->tile[0], (unsigned long long)s->tile[1], (unsigned long long)s->tile[2],
          (unsigned long long)s->tile[3], pread ? "by pread" : "through HDF5", how);
    uint8_t *got = malloc(frame * s->T);
    int T = s->T;
    for (int r = 0; r < reads; r++) {
        int cam = (int)(rnd() % s->cams), t0, n;
        switch (rnd() % 5) {
        case 0:   /* a window anywhere */
            t0 = (int)(rnd() % T);
            n = 1 + (int)(rnd() % (T - t0));
            check_window(ep, s, frames, got, cam, t0, n, how, "a window");
            break;
        case 1:   /* a short one, then the same again (served from the rows kept) */
            t0 = (int)(rnd() % T);
            n = 1 + (int)(rnd() % (T - t0 < 3 ? T - t0 : 3));
            check_window(ep, s, frames, got, cam, t0, n, how, "a short window");
            check_window(ep, s, frames, got, cam, t0, n, how, "the same window again");
            break;
        case 2: { /* batches forward, cameras interleaved (eval's order) */
            int b = 1 + (int)(rnd() % (2 * s->tile[0] + 3));
            for (int t = 0; t < T; t += b)
                for (int c = 0; c < s->cams; c++)
                    check_window(ep, s, frames, got, c, t, T - t < b ? T - t : b, how,
                                 "batches forward");
            break;
        }
        case 3: { /* batches backward: each window before the rows kept */
            int b = 1 + (int)(rnd() % (2 * s->tile[0] + 3));
            for (int end = T; end > 0; end -= b) {
                int t = end - b < 0 ? 0 : end - b;
                check_window(ep, s, frames, got, cam, t, end - t, how, "batches backward");
            }
            break;
        }
        default: { /* batches of the sizes eval and bench use */
            static const int sizes[] = {1, 4, 7, 50, 51, 64, 128};
            int b = sizes[rnd() % 7];
            for (int t = 0; t < T; t += b)
                check_window(ep, s, frames, got, cam, t, T - t < b ? T - t : b, how,
                             "batches of eval's sizes");
        }
        }
    }
    act_episode_close(ep);
    free(got);
out:
    for (int c = 0; c < s->cams; c++) free(frames[c]);
    unlink(path);
}

/* one row of tiles past what a read takes: a clear error naming the dataset and the way out */
static void check_too_many(const char *path, int gzip) {
    static const shape s = {6, 16, 16, 1, {2, 4, 4, 1}};   /* 48 tiles for every 2 frames */
    size_t frame = (size_t)s.H * s.W * 3;
    uint8_t *frames[1] = {malloc(frame * s.T)}, *got = malloc(frame * s.T);
    for (size_t j = 0; j < frame * s.T; j++) frames[0][j] = (uint8_t)(rnd() >> 56);
    act_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.obs_dim = OBS;
    cfg.action_dim = ACTD;
    cfg.num_cams = 1;
    cfg.image_h = s.H;
    cfg.image_w = s.W;
    snprintf(cfg.camera_names[0], sizeof cfg.camera_names[0], "c0");
    act_episode *ep = NULL;
    char err[1024] = "";
    setenv("ACT_EPISODE_TILE_JOBS", "47", 1);
    int rc = write_episode(path, &s, frames, gzip) || act_episode_open(path, &cfg, &ep, err, sizeof err);
    CHECK(rc == 0, "the episode of 48 tiles a row: %s", err);
    if (rc == 0) {
        rc = act_episode_read_frames(ep, 0, 0, 1, got, err, sizeof err);
        CHECK(rc != 0 && strstr(err, "observations/images/c0") && strstr(err, "48 tiles for every 2 frames") &&
                  strstr(err, gzip ? "in gzip tiles" : "in uncompressed tiles") &&
                  strstr(err, "h5repack -l observations/images/c0:CHUNK=1x16x16x3"),
              "48 tiles a row past a limit of 47 should be refused by name (%s): rc %d, %s", gzip ? "gzip" : "raw",
              rc, err);
        setenv("ACT_EPISODE_TILE_JOBS", "48", 1);   /* one row at a time: read in parts */
        rc = act_episode_read_frames(ep, 0, 1, 5, got, err, sizeof err);
        CHECK(rc == 0 && !memcmp(got, frames[0] + frame, frame * 5), "a row a part, [1, 6): %s",
              rc ? err : "wrong bytes");
    }
    if (ep) act_episode_close(ep);
    free(frames[0]);
    free(got);
    unlink(path);
}

int main(void) {
    seed_rng("test_episode_tiles");
    setenv("ACT_EPISODE_THREADS", "3", 0);
    char dir[] = "/tmp/act_test_tiles_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/ep.hdf5", dir);
    static const shape fixed[] = {
        {23, 20, 18, 2, {5, 8, 8, 1}},   {23, 20, 18, 2, {5, 8, 8, 2}},
        {23, 20, 18, 2, {5, 8, 8, 3}},   {30, 32, 32, 3, {7, 12, 10, 2}},
        {17, 16, 16, 1, {4, 16, 16, 1}}, {17, 16, 16, 1, {4, 16, 16, 2}},
        {19, 16, 16, 2, {1, 5, 16, 3}},  {19, 16, 16, 2, {19, 16, 7, 1}},
        {10, 9, 9, 2, {3, 9, 9, 2}},     {25, 24, 20, 2, {50, 8, 8, 1}},   /* tiles past T */
        {24, 64, 64, 1, {1, 8, 8, 1}},   /* 4608 tiles: the open's check goes by size */
    };
    const char *inf = act_ep_inflater();
    if (inf && !strcmp(inf, "hdf5")) {   /* built without zlib and libdeflate: no pool reader */
        printf("test_episode_tiles: built without an inflater, every tile is HDF5's: skipped\n");
        rmdir(dir);
        return 77;
    }
    static const char *inflaters[] = {"libdeflate", "zlib", "raw"};   /* raw: no filter */
    int ran = 0;
    for (int i = 0; i < 3; i++) {
        if (strcmp(inflaters[i], "raw")) setenv("ACT_EPISODE_INFLATE", inflaters[i], 1);
        else unsetenv("ACT_EPISODE_INFLATE");
        char e[256];
        if (strcmp(inflaters[i], "raw") && act_ep_inflater_check(e, sizeof e)) {
            printf("%s: not in this build\n", inflaters[i]);
            continue;
        }
        ran++;
        int before = g_checks;
        for (size_t k = 0; k < sizeof fixed / sizeof *fixed; k++)
            check_shape(path, &fixed[k], 150, inflaters[i], 0);
        for (int k = 0; k < 30; k++) {
            shape s;
            s.H = 4 + (int)(rnd() % 30);
            s.W = 4 + (int)(rnd() % 30);
            s.T = 2 + (int)(rnd() % 40);
            s.cams = 1 + (int)(rnd() % 3);
            s.tile[0] = 1 + rnd() % 12;
            s.tile[1] = 1 + rnd() % s.H;
            s.tile[2] = 1 + rnd() % s.W;
            s.tile[3] = 1 + rnd() % 3;
            if (s.tile[1] == (hsize_t)s.H && s.tile[2] == (hsize_t)s.W && s.tile[3] == 3)
                s.tile[3] = 1;   /* whole frames are the other path's (test_episode_reader) */
            if (s.tile[0] > (hsize_t)s.T) s.tile[0] = s.T;
            if (k % 3 == 2) setenv("ACT_EPISODE_PREAD", "0", 1);   /* a third fetched through HDF5 */
            check_shape(path, &s, 80, inflaters[i], k & 1);
            unsetenv("ACT_EPISODE_PREAD");
        }
        /* 4 MiB tiles are the pool's; 4 MiB + 64 KiB ones HDF5's (bounding the scratch); a row
         * of 64 x 600 x 600 x 3 bytes (65.9 MiB: 1083 tiles of 64 frames, 3 of them written)
         * is past the 64 MiB a camera's row cache keeps, so every window fetches it anew */
        static const shape big[] = {{70, 256, 256, 1, {64, 256, 256, 1}},
                                    {70, 256, 256, 1, {65, 256, 256, 1}},
                                    {3, 600, 600, 1, {64, 32, 32, 1}}};
        for (int k = 0; k < 3; k++) check_shape(path, &big[k], 8, inflaters[i], 0);
        printf("%s: %d windows checked\n", inflaters[i], g_checks - before);
    }
    unsetenv("ACT_EPISODE_INFLATE");
    /* reads held to 1 MiB: rows of 384 KiB are read two at a time, rows of 3 MiB are HDF5's */
    setenv("ACT_EPISODE_READ_MIB", "1", 1);
    static const shape capped[] = {{40, 128, 128, 1, {8, 32, 32, 1}}, {20, 256, 256, 1, {16, 64, 64, 1}}};
    for (int k = 0; k < 2; k++) {
        check_shape(path, &capped[k], 60, act_ep_inflater(), 0);   /* the build's default inflater */
        check_shape(path, &capped[k], 60, "raw", 0);
    }
    unsetenv("ACT_EPISODE_READ_MIB");
    check_too_many(path, 1);
    check_too_many(path, 0);
    unsetenv("ACT_EPISODE_TILE_JOBS");
    rmdir(dir);
    CHECK(ran > 1, "no inflater in this build: the gzip tile reader was not tested");
    printf("test_episode_tiles: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
#endif
