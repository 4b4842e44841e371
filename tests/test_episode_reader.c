/* test_episode_reader.c - the episode reader's fast paths against the frames written, with no
 * model (engine/episode.c, episode_direct.c, episode_inflate.c):
 *   1. raw frames read by pread on 3 pool threads: contiguous and chunked (chunks of 3 frames),
 *      with and without a user block before HDF5's data, every window of 1..7 timesteps; the
 *      reader must say it took the pread path, and the bytes must be the ones written;
 *   2. a file cut short after it was opened (another process rewriting it mid-eval): each read
 *      past the cut is an error naming the dataset and saying "truncated", never stale or zero
 *      frames, and reads before the cut still work;
 *   3. gzip chunks (fetched by pread and inflated on the pool) read the same bytes, and a cut
 *      through one is the same error;
 *   4. eight more episodes of a random length (8-30 timesteps) in random layouts: contiguous or
 *      chunks of 1-8 frames, raw or gzip, user blocks of 0-4096 bytes, through 1-3;
 *   5. each episode through the read-ahead stream in batches of 1-7 (check_stream).
 * Frames are fresh random bytes each run (the seed is printed; ACT_TEST_SEED replays a run).
 * Built without HDF5, it reports itself skipped. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "episode.h"
#include "episode_stream.h"
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
static float *g_tab; /* its qpos [T][OBS]; its action is the first T x ACTD of the same numbers */
#define FRAME ((size_t)IH * IW * 3)

typedef struct { int chunk, gzip; hsize_t userblock; char want[64]; } layout;   /* gzip 2: partial edge
                                                                                 * chunks left unfiltered */

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
    free(g_tab);
    float *tab = g_tab = malloc(sizeof(float) * (size_t)T * OBS);
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
        if (l->gzip == 2) H5Pset_chunk_opts(dcpl, H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS);   /* edges raw */
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

/* the whole file (NULL on failure); *n its size */
static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    long size = f && !fseek(f, 0, SEEK_END) ? ftell(f) : -1;
    uint8_t *all = size > 0 ? malloc((size_t)size) : NULL;
    if (all && (fseek(f, 0, SEEK_SET) || fread(all, 1, (size_t)size, f) != (size_t)size)) {
        free(all);
        all = NULL;
    }
    if (f) fclose(f);
    *n = all ? (size_t)size : 0;
    return all;
}

/* the stored (compressed) bytes of dataset name's chunk at timestep t, as HDF5 reads them */
static uint8_t *stored_chunk(const char *path, const char *name, int t, size_t *n) {
    hsize_t o[4] = {(hsize_t)t, 0, 0, 0}, size = 0;
    uint32_t mask = 0;
    uint8_t *b = NULL;
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), ds = f >= 0 ? H5Dopen2(f, name, H5P_DEFAULT) : -1;
    if (ds >= 0 && H5Dget_chunk_storage_size(ds, o, &size) >= 0 && size && (b = malloc(size)) &&
        H5Dread_chunk(ds, H5P_DEFAULT, o, &mask, b) < 0) {
        free(b);
        b = NULL;
    }
    if (ds >= 0) H5Dclose(ds);
    if (f >= 0) H5Fclose(f);
    *n = b ? (size_t)size : 0;
    return b;
}

/* the offset of the first copy of needle in hay, or -1 */
static long find_bytes(const uint8_t *hay, size_t n, const uint8_t *needle, size_t len) {
    for (size_t o = 0; hay && needle && len && o + len <= n; o++)
        if (!memcmp(hay + o, needle, len)) return (long)o;
    return -1;
}

/* 5: the read-ahead stream (engine/episode_stream.c) over the same file, in batches of 1-7: each
 * batch holds timesteps [t0, t0 + n) in order, their frames, qpos, targets (action[t + k], the
 * last action past the end) and key padding; a partial batch's rows past n are stand-ins (row
 * 0's qpos, targets and is_pad) that a step at the full batch size may read */
static void check_stream(const char *path, uint8_t *frames[CAMS], const char *how) {
    enum { H = 4 };
    act_config cfg = config();
    cfg.pred_horizon = H;
    int batch = 1 + (int)(rnd() % 7), t = 0;
    char *paths[1] = {(char *)path}, err[1024];
    act_stream *st = NULL;
    if (act_stream_open(paths, 1, &cfg, batch, &st, err, sizeof err)) {
        CHECK(0, "%s: stream: %s", how, err);
        return;
    }
    const act_ep_batch *b;
    while ((b = act_stream_next(st)) != NULL) {
        int n = T - t < batch ? T - t : batch;
        CHECK(!b->failed && b->T == T && b->t0 == t && b->n == n && b->first == (t == 0) && b->last == (t + n == T),
              "%s batch %d: failed %d (%s), T %d, t0 %d, n %d (want %d at %d)", how, batch, b->failed, b->err, b->T,
              b->t0, b->n, n, t);
        if (b->failed || b->n != n) break;
        for (int c = 0; c < CAMS; c++)
            CHECK(!memcmp(b->images[c], frames[c] + (size_t)t * FRAME, FRAME * (size_t)n),
                  "%s batch %d at %d: camera %d's frames differ", how, batch, t, c);
        CHECK(!memcmp(b->qpos, g_tab + (size_t)t * OBS, sizeof(float) * (size_t)n * OBS), "%s at %d: qpos", how, t);
        for (int i = 0; i < n; i++)
            for (int k = 0; k < H; k++) {
                int src = t + i + k < T ? t + i + k : T - 1;
                CHECK(!memcmp(b->targets + ((size_t)i * H + k) * ACTD, g_tab + (size_t)src * ACTD, sizeof(float) * ACTD) &&
                          b->is_pad[i * H + k] == (t + i + k >= T),
                      "%s at %d: target or is_pad of row %d step %d", how, t, i, k);
            }
        for (int i = n; i < batch; i++)
            CHECK(!memcmp(b->qpos + (size_t)i * OBS, b->qpos, sizeof(float) * OBS) &&
                      !memcmp(b->targets + (size_t)i * H * ACTD, b->targets, sizeof(float) * H * ACTD) &&
                      !memcmp(b->is_pad + (size_t)i * H, b->is_pad, H),
                  "%s batch %d at %d: row %d of %d is not a stand-in (row 0's)", how, batch, t, i, n);
        t += n;
    }
    CHECK(t == T, "%s batch %d: the stream delivered %d of %d timesteps", how, batch, t, T);
    act_stream_close(st);
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
    check_stream(path, frames, how);
    /* 2: cut the file short after the open, in the middle of camera 1's frame T-5 (raw) or of the
     * compressed chunk holding its frame T-1 (gzip), found by their bytes in the file */
    {
        size_t size = 0, zlen1 = 0, zlen0 = 0;
        uint8_t *all = slurp(path, &size);
        uint8_t *z1 = l->gzip ? stored_chunk(path, "observations/images/c1", (T - 1) / l->chunk * l->chunk, &zlen1) : NULL;
        uint8_t *z0 = l->gzip ? stored_chunk(path, "observations/images/c0", 0, &zlen0) : NULL;
        long at1 = l->gzip ? find_bytes(all, size, z1, zlen1) : find_bytes(all, size, frames[1] + (size_t)(T - 5) * FRAME, FRAME);
        long at0 = l->gzip ? find_bytes(all, size, z0, zlen0) : find_bytes(all, size, frames[0], 2 * FRAME);
        long cut = at1 < 0 ? -1 : at1 + (long)(l->gzip ? zlen1 : FRAME) / 2;
        /* camera 0's first frames (raw) or first chunk (gzip) lie wholly before the cut? (HDF5 may
         * place a later chunk in space freed earlier in the file) */
        int before = at0 >= 0 && cut >= 0 && at0 + (long)(l->gzip ? zlen0 : 2 * FRAME) <= cut;
        free(all);
        free(z1);
        free(z0);
        CHECK(cut > 0, "%s: the bytes to cut in were not found in the file", how);
        if (cut > 0 && truncate(path, cut) == 0) {
            int rc = act_episode_read_frames(ep, 1, T - 7, 7, got, err, sizeof err);
            CHECK(rc != 0, "%s userblock %llu: a read past the cut succeeded", how, (unsigned long long)l->userblock);
            /* HDF5's own read of a raw chunk cut short fills the rest with zeros and succeeds:
             * then the file's new size is what fails the read */
            CHECK(rc == 0 || (strstr(err, "images/c1") && strstr(err, "truncated")) ||
                  (!strcmp(how, "hdf5") && strstr(err, "changed while it was being read")),
                  "%s: the error should name the dataset and say truncated: %s", how, err);
            rc = act_episode_read_frames(ep, 1, T - 1, 1, got, err, sizeof err);
            CHECK(rc != 0, "%s: a read of the last frame after the cut succeeded", how);
            if (before) {   /* its frames are still there, but the file is not the one opened */
                rc = act_episode_read_frames(ep, 0, 0, 2, got, err, sizeof err);
                CHECK(rc != 0 && strstr(err, "changed while it was being read") && strstr(err, "size changed"),
                      "%s: a read before the cut should say the file changed: rc %d, %s", how, rc, err);
            }
        }
    }
    act_episode_close(ep);
out:
    for (int c = 0; c < CAMS; c++) free(frames[c]);
    free(got);
    unlink(path);
}

/* 7: the file rewritten in place (same bytes: only its modification time moves) between two reads
 * of an open episode: the second read fails, naming the change, on every reader path */
static void check_rewritten(const char *path, const layout *l) {
    uint8_t *frames[CAMS], *got = malloc(FRAME * 2);
    for (int c = 0; c < CAMS; c++) {
        frames[c] = malloc(FRAME * T);
        fill(frames[c], FRAME * T);
    }
    act_config cfg = config();
    act_episode *ep = NULL;
    char err[1024];
    CHECK(write_episode(path, l, frames) == 0, "rewritten: cannot write the episode");
    if (act_episode_open(path, &cfg, &ep, err, sizeof err) == 0) {
        int rc = act_episode_read_frames(ep, 0, 0, 2, got, err, sizeof err);
        CHECK(rc == 0, "%s: a read before the rewrite failed: %s", l->want, err);
        size_t n = 0;
        uint8_t *all = slurp(path, &n);
        struct timespec pause = {0, 20 * 1000 * 1000};
        nanosleep(&pause, NULL);   /* a later modification time, even on a coarse clock */
        FILE *f = fopen(path, "r+b");
        CHECK(all && f && fwrite(all, 1, n, f) == n && fclose(f) == 0, "rewritten: cannot rewrite %s", path);
        free(all);
        rc = act_episode_read_frames(ep, 0, 0, 2, got, err, sizeof err);
        CHECK(rc != 0 && strstr(err, "changed while it was being read") && strstr(err, path),
              "%s: a read after the file was rewritten in place: rc %d, '%s'", l->want, rc, rc ? err : "");
        act_episode_close(ep);
    } else {
        CHECK(0, "rewritten: open: %s", err);
    }
    for (int c = 0; c < CAMS; c++) free(frames[c]);
    free(got);
    unlink(path);
}

/* 6: a recording interrupted after its datasets were sized: camera 1's frames (chunks of 3,
 * gzip or not) written only up to timestep `upto`, or 'action' created but never written
 * (contiguous, allocated late). HDF5 would read the rest as zeros; the open must refuse the file
 * and name the dataset. upto == T writes everything: that file must open. */
static void check_unwritten(const char *path, int gzip, int upto, int action_unwritten) {
    uint8_t *frames[CAMS];
    for (int c = 0; c < CAMS; c++) {
        frames[c] = malloc(FRAME * T);
        fill(frames[c], FRAME * T);
    }
    layout l = {3, gzip, 0, ""};
    CHECK(write_episode(path, &l, frames) == 0, "unwritten: cannot write the episode");
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    const char *name = action_unwritten ? "action" : "observations/images/c1";
    H5Ldelete(f, name, H5P_DEFAULT);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), ds;
    if (action_unwritten) {
        hsize_t d2[2] = {T, ACTD};
        hid_t s2 = H5Screate_simple(2, d2, NULL);
        H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_LATE);
        ds = H5Dcreate2(f, name, H5T_IEEE_F32LE, s2, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        H5Sclose(s2);
    } else {
        hsize_t d4[4] = {T, IH, IW, 3}, ch[4] = {3, IH, IW, 3}, start[4] = {0}, count[4] = {(hsize_t)upto, IH, IW, 3};
        hid_t s4 = H5Screate_simple(4, d4, NULL), ms = H5Screate_simple(4, count, NULL);
        H5Pset_chunk(dcpl, 4, ch);
        if (gzip) H5Pset_deflate(dcpl, 4);
        ds = H5Dcreate2(f, name, H5T_STD_U8LE, s4, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        H5Sselect_hyperslab(s4, H5S_SELECT_SET, start, NULL, count, NULL);
        H5Dwrite(ds, H5T_NATIVE_UCHAR, ms, s4, H5P_DEFAULT, frames[1]);
        H5Sclose(ms);
        H5Sclose(s4);
    }
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Fclose(f);
    act_config cfg = config();
    act_episode *ep = NULL;
    char err[1024] = "";
    int rc = act_episode_open(path, &cfg, &ep, err, sizeof err);
    if (!action_unwritten && upto == T) {
        CHECK(rc == 0, "gzip %d, every frame written: open failed: %s", gzip, err);
    } else {
        CHECK(rc != 0, "%s: %s written up to %d of %d: the open succeeded (the rest would read as zeros)",
              gzip ? "gzip" : "raw", name, action_unwritten ? 0 : upto, T);
        CHECK(rc == 0 || (strstr(err, name) && strstr(err, "never written")),
              "the error should name '%s' and say never written: %s", name, err);
    }
    if (!rc) act_episode_close(ep);
    for (int c = 0; c < CAMS; c++) free(frames[c]);
    unlink(path);
}

/* A gzip chunk of whole frames that inflates to half a frame, at timestep `at` of camera c0: the
 * pool inflates those chunks itself and checks their size, so the open's chunk check leaves them
 * out; nothing at open may then hand such a chunk to HDF5's own filter pipeline, which copies a
 * whole chunk out of the shorter buffer (under ASan: a heap-buffer-overflow in H5Dread). The
 * open's reads of the first and last frames (to check where pread finds the chunks) and of the
 * last frame (zero_tail, with qpos and action 0 at the end) were such reads. The open or the
 * read must fail naming the dataset; nothing may read past a buffer. */
static void check_short_chunk(const char *path, int at, int zero_tail) {
    uint8_t *frames[CAMS];
    for (int c = 0; c < CAMS; c++) {
        frames[c] = malloc(FRAME * T);
        fill(frames[c], FRAME * T);
        if (zero_tail) memset(frames[c] + FRAME * (T - 1), 0, FRAME);   /* a black last frame */
    }
    layout l = {1, 1, 0, ""};
    CHECK(write_episode(path, &l, frames) == 0, "short chunk: cannot write the episode");
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (zero_tail) {   /* qpos and action 0 at the last timestep */
        const char *names[2] = {"observations/qpos", "action"};
        for (int i = 0; i < 2; i++) {
            hid_t ds = H5Dopen2(f, names[i], H5P_DEFAULT), sp = H5Dget_space(ds);
            hsize_t d[2], start[2], count[2];
            H5Sget_simple_extent_dims(sp, d, NULL);
            start[0] = d[0] - 1, start[1] = 0, count[0] = 1, count[1] = d[1];
            float zero[8] = {0};
            hid_t ms = H5Screate_simple(2, count, NULL);
            H5Sselect_hyperslab(sp, H5S_SELECT_SET, start, NULL, count, NULL);
            H5Dwrite(ds, H5T_NATIVE_FLOAT, ms, sp, H5P_DEFAULT, zero);
            H5Sclose(ms);
            H5Sclose(sp);
            H5Dclose(ds);
        }
    }
    /* a valid zlib stream of half a frame: HDF5's own gzip of a half-frame chunk */
    hsize_t d1[4] = {1, IH / 2, IW, 3}, o[4] = {0, 0, 0, 0}, size = 0;
    hid_t s1 = H5Screate_simple(4, d1, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 4, d1);
    H5Pset_deflate(dcpl, 4);
    hid_t half = H5Dcreate2(f, "half", H5T_STD_U8LE, s1, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dwrite(half, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, frames[0] + FRAME * at);
    H5Dget_chunk_storage_size(half, o, &size);
    uint8_t *z = malloc(size ? size : 1);
    uint32_t mask = 0;
    hid_t ds = H5Dopen2(f, "observations/images/c0", H5P_DEFAULT);
    o[0] = (hsize_t)at;
    hsize_t z0[4] = {0, 0, 0, 0};
    CHECK(size && H5Dread_chunk(half, H5P_DEFAULT, z0, &mask, z) >= 0 &&
          H5Dwrite_chunk(ds, H5P_DEFAULT, 0, o, (size_t)size, z) >= 0, "short chunk: cannot write it");
    H5Dclose(ds);
    H5Dclose(half);
    H5Pclose(dcpl);
    H5Sclose(s1);
    H5Fclose(f);
    free(z);
    act_config cfg = config();
    act_episode *ep = NULL;
    char err[1024] = "";
    int rc = act_episode_open(path, &cfg, &ep, err, sizeof err);
    uint8_t *buf = malloc(FRAME * T);
    if (rc == 0) rc = act_episode_read_frames(ep, 0, 0, T, buf, err, sizeof err);
    CHECK(rc != 0, "a gzip chunk of half a frame at timestep %d was read", at);
    CHECK(rc == 0 || (strstr(err, "observations/images/c0") && strstr(err, "timestep")),
          "the error should name the dataset and the timestep: %s", err);
    if (ep) act_episode_close(ep);
    free(buf);
    for (int c = 0; c < CAMS; c++) free(frames[c]);
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
        {3, 1, 0, "gzip chunks of 3 frames, pread"},
        {2, 1, 512, "gzip chunks of 2 frames, pread"},
        {4, 2, 0, "hdf5"},   /* T = 17: the last chunk partial, stored raw; every chunk checked at open */
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
        else if (l.gzip) snprintf(l.want, sizeof l.want, "gzip chunks of %d frames, pread", l.chunk);
        else snprintf(l.want, sizeof l.want, "pread, chunks of %d frames", l.chunk);
        check_layout(&l, path);
    }
    T = 17;
    for (size_t i = 0; i < 7; i += 2) check_rewritten(path, &layouts[i]);   /* raw, chunked, gzip */
    for (int gzip = 0; gzip < 2; gzip++) {
        check_unwritten(path, gzip, T, 0);       /* the control: all of it written */
        check_unwritten(path, gzip, 9, 0);       /* chunks 0-2 of 6 */
        check_unwritten(path, gzip, 15, 0);      /* all but the last chunk (frames 15-16); a chunk
                                                  * written in part is stored whole: not seen */
    }
    check_unwritten(path, 0, T, 1);
    check_short_chunk(path, 0, 0);       /* the first frame: the open's pread check reads it */
    check_short_chunk(path, T - 1, 0);   /* the last frame: that check too */
    check_short_chunk(path, T - 1, 1);   /* and zero_tail's read of the last frame */
    check_short_chunk(path, 5, 0);       /* a frame in between: only the pool reads it */
    free(g_tab);
    printf("test_episode_reader: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
#endif
