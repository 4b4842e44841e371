/* test_episode_index.c - the chunk table read from the file (engine/episode_index.c) against
 * HDF5's own answer (H5Dget_chunk_info_by_coord) for every cell of the chunk grid, in files
 * written here with the HDF5 C library:
 *   - whole frames and tiles, fixed and growable (appended frame by frame, as a recorder does),
 *     gzip and none, edge chunks hanging over the dataset;
 *   - 5000 chunks (a B-tree of three levels: HDF5's nodes hold 64 entries), partly written
 *     datasets (cells never written are HADDR_UNDEF in both), a user block of 512 bytes (node
 *     addresses count from its end), and object headers of version 2 (libver 1.8);
 *   - where no table may come: libver latest (layout version 4, whose indexes this does not
 *     read), a contiguous dataset, ACT_EPISODE_INDEX=0, and files damaged in the index itself (a
 *     node's signature, its level, a key's offset, a child's address, two chunks out of order, a
 *     chunk past the file's end, a node over its entries): no table, no crash. (Chunks out of
 *     order and one past the end get past HDF5's count and spot checks: the walk itself must
 *     refuse them. The entries' cap bounds memory; what lies past the 64th entry fails anyway.)
 * With H5Dchunk_iter (1.10.10+, 1.14+) the table is HDF5's own list: the same comparison, with
 * layout version 4's indexes (extensible and fixed arrays, version 2 B-tree, a single chunk)
 * giving tables too, and a damaged index giving none or one that is HDF5's answer in every cell.
 * Frames are fresh random bytes (the seed is printed; ACT_TEST_SEED replays a run). Built
 * without HDF5, or with an HDF5 whose table is not read (1.12.0-1.12.2), it reports itself
 * skipped. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_common.h"

#ifndef ACT_WITH_HDF5
int main(void) {
    printf("test_episode_index: built without HDF5: skipped\n");
    return 77;
}
#else
#include "episode_index.h"

#if !ACT_EP_INDEX
int main(void) {
    printf("test_episode_index: this HDF5 (%d.%d.%d) gets no chunk table: skipped\n", H5_VERS_MAJOR, H5_VERS_MINOR,
           H5_VERS_RELEASE);
    return 77;
}
#else

enum { H = 16, W = 12 };

typedef struct {
    const char *what;
    int T;              /* frames */
    hsize_t cd[4];      /* chunk shape (t, y, x, c) */
    int grow;           /* 1: created empty, unlimited in time, appended frame by frame; 2: and
                         * unlimited in height too */
    int gzip;
    int written;        /* frames written (the rest never is): T unless fewer */
    int userblock;      /* bytes */
    int libver;         /* 0: default; 18: 1.8 bounds (object header v2); 99: latest (layout v4) */
    int contiguous;
    int want_table;
} layout;

static int write_file(const char *path, const layout *l) {
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE), fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (l->userblock) H5Pset_userblock(fcpl, (hsize_t)l->userblock);
    if (l->libver == 18) H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18);
    if (l->libver == 99) H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, fapl);
    H5Pclose(fcpl);
    H5Pclose(fapl);
    if (f < 0) return -1;
    hsize_t dims[4] = {(hsize_t)(l->grow ? 0 : l->T), H, W, 3}, maxd[4] = {H5S_UNLIMITED, H, W, 3};
    if (l->grow == 2) maxd[1] = H5S_UNLIMITED;   /* two unlimited dimensions: layout v4's version 2 B-tree */
    hid_t space = H5Screate_simple(4, dims, l->grow ? maxd : NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (!l->contiguous) H5Pset_chunk(dcpl, 4, l->cd);
    if (l->gzip) H5Pset_deflate(dcpl, 4);
    hid_t ds = H5Dcreate2(f, "frames", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Sclose(space);
    H5Pclose(dcpl);
    int rc = ds < 0;
    uint8_t frame[H * W * 3];
    for (int t = 0; t < l->written && !rc; t++) {
        for (size_t i = 0; i < sizeof frame; i++) frame[i] = (uint8_t)rnd();
        if (l->grow) {
            hsize_t nd[4] = {(hsize_t)t + 1, H, W, 3};
            rc |= H5Dset_extent(ds, nd) < 0;
        }
        hid_t fs = H5Dget_space(ds);
        hsize_t start[4] = {(hsize_t)t, 0, 0, 0}, count[4] = {1, H, W, 3};
        hid_t ms = H5Screate_simple(4, count, NULL);
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
        rc |= H5Dwrite(ds, H5T_NATIVE_UINT8, ms, fs, H5P_DEFAULT, frame) < 0;
        H5Sclose(ms);
        H5Sclose(fs);
    }
    if (l->grow && l->written < l->T) {   /* grown past what was written */
        hsize_t nd[4] = {(hsize_t)l->T, H, W, 3};
        rc |= H5Dset_extent(ds, nd) < 0;
    }
    if (ds >= 0) H5Dclose(ds);
    H5Fclose(f);
    return rc ? -1 : 0;
}

typedef struct {
    hid_t file, ds;
    int fd;
    uint64_t size;
} opened;

static int open_file(const char *path, opened *o) {
    struct stat st;
    o->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    o->ds = o->file >= 0 ? H5Dopen2(o->file, "frames", H5P_DEFAULT) : -1;
    o->fd = open(path, O_RDONLY);
    o->size = o->fd >= 0 && fstat(o->fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    return o->ds >= 0 && o->fd >= 0 ? 0 : -1;
}

static void close_file(opened *o) {
    if (o->ds >= 0) H5Dclose(o->ds);
    if (o->file >= 0) H5Fclose(o->file);
    if (o->fd >= 0) close(o->fd);
}

/* every cell of the grid: the table's answer is HDF5's, and every chunk's bytes read from the file
 * at its address plus the table's base are the ones H5Dread_chunk gives (what the base means: the
 * user block's size, or 0 where HDF5 counts from the file's start); the number of cells never
 * written */
static int compare_all(const char *what, hid_t ds, int fd, const act_ep_index *ix, int *unwritten) {
    uint8_t *want = malloc((size_t)1 << 20), *got = malloc((size_t)1 << 20);
    int misread = 0;
    hid_t space = H5Dget_space(ds);
    hsize_t dims[4], o[4] = {0};
    H5Sget_simple_extent_dims(space, dims, NULL);
    H5Sclose(space);
    int bad = 0, cells = 0;
    *unwritten = 0;
    for (;;) {
        unsigned m1 = 0, m2 = 7;
        haddr_t a1 = HADDR_UNDEF, a2 = 0;
        hsize_t s1 = 0, s2 = 7;
        int r1 = H5Dget_chunk_info_by_coord(ds, o, &m1, &a1, &s1), r2 = act_ep_index_at(ix, o, &m2, &a2, &s2);
        cells++;
        *unwritten += a1 == HADDR_UNDEF;
        if (r2 == 0 && a2 != HADDR_UNDEF && s2 <= ((hsize_t)1 << 20)) {
            uint32_t m = 0;
            ssize_t n = pread(fd, got, (size_t)s2, (off_t)(a2 + ix->base));
            if (H5Dread_chunk(ds, H5P_DEFAULT, o, &m, want) < 0 || n != (ssize_t)s2 || memcmp(want, got, (size_t)s2))
                misread++;
        }
        if (r1 < 0 || r2 < 0 || m1 != m2 || a1 != a2 || s1 != s2) {
            if (bad++ < 5)
                printf("  %s: chunk (%llu, %llu, %llu, %llu): HDF5 addr %llu size %llu mask %u, table %llu %llu %u "
                       "(rc %d %d)\n", what, (unsigned long long)o[0], (unsigned long long)o[1],
                       (unsigned long long)o[2], (unsigned long long)o[3], (unsigned long long)a1,
                       (unsigned long long)s1, m1, (unsigned long long)a2, (unsigned long long)s2, m2, r1, r2);
        }
        int i = 3;
        while (i >= 0 && (o[i] += ix->cd[i]) >= dims[i]) o[i--] = 0;
        if (i < 0) break;
    }
    H5Eclear2(H5E_DEFAULT);
    free(want);
    free(got);
    CHECK(cells == (int)ix->n, "%s: %d cells walked, the table has %zu", what, cells, ix->n);
    CHECK(misread == 0, "%s: %d chunks read at address + base %llu differ from H5Dread_chunk's", what, misread,
          (unsigned long long)ix->base);
    return bad;
}

static void run_layout(const char *dir, const layout *l) {
    char path[512];
    snprintf(path, sizeof path, "%s/index.h5", dir);
    if (write_file(path, l) != 0) {
        CHECK(0, "%s: cannot write the file", l->what);
        return;
    }
    opened o;
    CHECK(open_file(path, &o) == 0, "%s: cannot open it", l->what);
    act_ep_index ix;
    int got = act_ep_index_build(o.file, o.ds, o.fd, o.size, &ix);
    CHECK(got == l->want_table, "%s: table %d, want %d", l->what, got, l->want_table);
    if (got) {
        int unwritten = 0, bad = compare_all(l->what, o.ds, o.fd, &ix, &unwritten);
        CHECK(bad == 0, "%s: %d chunks where the table and HDF5 differ", l->what, bad);
        CHECK((unwritten > 0) == (l->written < l->T), "%s: %d cells never written", l->what, unwritten);
        hsize_t off[4] = {1, 0, 0, 0};   /* off the grid (when chunks are longer than 1) */
        unsigned m;
        haddr_t a;
        hsize_t s;
        if (l->cd[0] > 1) CHECK(act_ep_index_at(&ix, off, &m, &a, &s) < 0, "%s: an offset off the grid", l->what);
        printf("  %-44s %6zu cells, %d never written: table = HDF5\n", l->what, ix.n, unwritten);
    } else if (!l->want_table) {
        printf("  %-44s no table (as it should be)%s\n", l->what, ix.v4_unread ? ", layout v4 seen" : "");
    }
    /* without a table, a layout message of version 4 is told (the reader then asks HDF5 no
     * chunk's place by coordinates); never with one, nor for other layouts */
    const char *off = getenv("ACT_EPISODE_INDEX");
    int want_v4 = !got && l->libver == 99 && ACT_EP_INDEX_WALK && !(off && !strcmp(off, "0"));
    CHECK(ix.v4_unread == want_v4, "%s: v4_unread %d, want %d", l->what, ix.v4_unread, want_v4);
    CHECK(ix.n == 0 || got, "%s: an empty answer keeps cells", l->what);
    act_ep_index_free(&ix);
    close_file(&o);
    unlink(path);
}

/* --- damaged indexes --- */

/* the file offset of the first B-tree node (signature "TREE") after from, or -1 */
static long find_tree(const uint8_t *b, long n, long from) {
    for (long i = from; i + 4 <= n; i++)
        if (!memcmp(b + i, "TREE", 4) && b[i + 4] == 1) return i;
    return -1;
}

static void damage_case(const char *dir, const char *what, const layout *l, int mode) {
    char path[512];
    snprintf(path, sizeof path, "%s/damaged.h5", dir);
    if (write_file(path, l) != 0) {
        CHECK(0, "%s: cannot write", what);
        return;
    }
    FILE *fp = fopen(path, "r+b");
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    uint8_t *b = malloc((size_t)n);
    fseek(fp, 0, SEEK_SET);
    CHECK(fread(b, 1, (size_t)n, fp) == (size_t)n, "%s: read back", what);
    long root = find_tree(b, n, 0), leaf = -1;
    for (long i = root; i >= 0; i = find_tree(b, n, i + 4))
        if (b[i + 5] == 0) {
            leaf = i;
            break;
        }
    CHECK(root >= 0 && leaf >= 0, "%s: no B-tree node found", what);
    if (leaf >= 0) {
        long key0 = leaf + 8 + 16;   /* 8-byte addresses: "TREE", type, level, entries, 2 siblings */
        switch (mode) {
        case 0: b[leaf] = 'X'; break;                  /* signature */
        case 1: b[leaf + 5] = 3; break;                /* level */
        case 2: b[key0 + 8] ^= 0x01; break;            /* the first key's time offset: off the grid */
        case 3: memset(b + key0 + 8 + 40, 0xff, 8); break;   /* its child's address: undefined */
        case 4: {   /* the second and third keys' time offsets swapped: chunks out of order */
            uint8_t t[8];
            memcpy(t, b + key0 + 56 + 8, 8);
            memcpy(b + key0 + 56 + 8, b + key0 + 112 + 8, 8);
            memcpy(b + key0 + 112 + 8, t, 8);
            break;
        }
        case 5:   /* the first chunk's address at the file's end */
            for (int i = 0; i < 8; i++) b[key0 + 48 + i] = (uint8_t)((uint64_t)n >> (8 * i));
            break;
        case 6: b[leaf + 6] = 65, b[leaf + 7] = 0; break;   /* 65 entries: HDF5's nodes hold 2K = 64 */
        case 7:   /* the root's second child is the root itself: HDF5 1.10 recurses until the stack
                   * overflows; the walk must say so (loops) before HDF5 walks the index */
            for (int i = 0; i < 8; i++) b[root + 24 + 48 + 8 + 48 + i] = (uint8_t)((uint64_t)root >> (8 * i));
            break;
        case 8:   /* the same, the root claiming level 200 (past the walk's depth limit) */
            for (int i = 0; i < 8; i++) b[root + 24 + 48 + 8 + 48 + i] = (uint8_t)((uint64_t)root >> (8 * i));
            b[root + 5] = 200;
            break;
        }
        fseek(fp, 0, SEEK_SET);
        fwrite(b, 1, (size_t)n, fp);
    }
    fclose(fp);
    free(b);
    opened o;
    if (open_file(path, &o) == 0) {
        act_ep_index ix;
        int got = act_ep_index_build(o.file, o.ds, o.fd, o.size, &ix);
#if ACT_EP_INDEX_ITER
        /* HDF5 lists the chunks (H5Dchunk_iter): a damage its parser reads past may leave a
         * table, which must then be HDF5's answer cell by cell; chunks out of order or past the
         * file's end never */
        int unwritten = 0;
        CHECK(!got || (mode != 4 && mode != 5 && compare_all(what, o.ds, o.fd, &ix, &unwritten) == 0),
              "%s: a table from a damaged index, not HDF5's", what);
        printf("  %-44s %s\n", what, got ? "a table, HDF5's answer in every cell" : "no table");
#else
        CHECK(!got && ix.n == 0 && !ix.rec, "%s: a table from a damaged index", what);
        CHECK(ix.loops == (mode == 1 || mode >= 7), "%s: loops %d", what, ix.loops);
        printf("  %-44s no table%s\n", what, ix.loops ? ", a node at its parent's level or above" : "");
#endif
        act_ep_index_free(&ix);
    } else {
        printf("  %-44s HDF5 refuses the file\n", what);
    }
    close_file(&o);
    unlink(path);
}

int main(void) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    seed_rng("test_episode_index");
    char dir[] = "/tmp/act_index_XXXXXX";
    if (!mkdtemp(dir)) {
        printf("test_episode_index: cannot make a temporary folder\n");
        return 1;
    }
    const layout layouts[] = {
        {"whole frames, 40", 40, {1, H, W, 3}, 0, 0, 40, 0, 0, 0, 1},
        {"whole frames, appended, 300", 300, {1, H, W, 3}, 1, 0, 300, 0, 0, 0, 1},
        {"whole frames gzip, appended, 300", 300, {1, H, W, 3}, 1, 1, 300, 0, 0, 0, 1},
        {"5 frames a chunk, edge chunk, 53", 53, {5, H, W, 3}, 0, 0, 53, 0, 0, 0, 1},
        {"tiles (3, 8, 5, 1), edge tiles, 31", 31, {3, 8, 5, 1}, 0, 0, 31, 0, 0, 0, 1},
        {"tiles gzip (2, 16, 4, 2), appended, 45", 45, {2, 16, 4, 2}, 1, 1, 45, 0, 0, 0, 1},
        {"5000 chunks (three levels)", 5000, {1, H, W, 3}, 1, 0, 5000, 0, 0, 0, 1},
        {"partly written (30 of 70)", 70, {1, H, W, 3}, 0, 0, 30, 0, 0, 0, 1},
        {"grown past what was written", 70, {4, H, W, 3}, 1, 0, 50, 0, 0, 0, 1},
        {"never written", 20, {1, H, W, 3}, 0, 0, 0, 0, 0, 0, 1},
        {"user block of 512 bytes", 120, {1, H, W, 3}, 1, 0, 120, 512, 0, 0, 1},
        {"object header v2 (libver 1.8)", 120, {1, H, W, 3}, 1, 1, 120, 0, 18, 0, 1},
        /* layout version 4: its indexes are listed by H5Dchunk_iter (1.10.10+, 1.14+), never walked here */
        {"libver latest, appended (extensible array)", 120, {1, H, W, 3}, 1, 0, 120, 0, 99, 0, ACT_EP_INDEX_ITER},
        {"libver latest, fixed gzip (fixed array)", 90, {2, H, W, 3}, 0, 1, 90, 0, 99, 0, ACT_EP_INDEX_ITER},
        {"libver latest, tiles, partly written", 60, {4, 8, 5, 1}, 0, 0, 25, 0, 99, 0, ACT_EP_INDEX_ITER},
        {"libver latest, one chunk (single chunk)", 12, {12, H, W, 3}, 0, 0, 12, 0, 99, 0, ACT_EP_INDEX_ITER},
        {"libver latest, 2 unlimited (v2 B-tree)", 80, {1, 8, W, 3}, 2, 0, 80, 0, 99, 0, ACT_EP_INDEX_ITER},
        {"libver latest, 2 unlimited gzip (v2 B-tree)", 60, {2, 8, W, 3}, 2, 1, 60, 0, 99, 0, ACT_EP_INDEX_ITER},
        {"libver latest, user block of 1024", 100, {1, H, W, 3}, 1, 1, 100, 1024, 99, 0, ACT_EP_INDEX_ITER},
        {"contiguous", 20, {1, H, W, 3}, 0, 0, 20, 0, 0, 1, 0},
    };
    printf("test_episode_index: the chunk table against H5Dget_chunk_info_by_coord, cell by cell\n");
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) run_layout(dir, &layouts[i]);

    setenv("ACT_EPISODE_INDEX", "0", 1);
    layout off = layouts[1];
    off.what = "ACT_EPISODE_INDEX=0";
    off.want_table = 0;
    run_layout(dir, &off);
    unsetenv("ACT_EPISODE_INDEX");

    printf("damaged indexes (300 appended frames):\n");
    const char *modes[] = {"a leaf's signature", "a leaf's level", "a key's offset off the grid",
                           "a child's address undefined", "two chunks out of order", "a chunk past the file's end",
                           "a leaf of more than 2K entries", "the root its own child",
                           "the root at level 200, its own child"};
    for (int m = 0; m < 9; m++) damage_case(dir, modes[m], &layouts[1], m);
    rmdir(dir);
    printf("test_episode_index: %d checks, %d failed\n", g_checks, g_fail);
    if (g_fail) return 1;
    return 0;
}
#endif
#endif
