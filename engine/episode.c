/* episode.c - HDF5 episode reader (see episode.h).
 * Every failure names the file and the dataset. HDF5's own error-stack printing is silenced;
 * instead the innermost message of its stack is appended to ours ("... (HDF5: ...)"), which is
 * what tells a truncated file from a corrupt chunk. Each camera's dataset gets a chunk cache big
 * enough for one chunk, so a file chunked per frame or per many frames is decompressed once per
 * chunk, not once per hyperslab read. */
#include "episode.h"
#include "episode_check.h"
#include "episode_direct.h"
#include "episode_index.h"
#include "episode_inflate.h"
#include "episode_lzf.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifdef ACT_WITH_HDF5
#include <hdf5.h>

typedef struct h5_episode {
    hid_t file;
    hid_t img[ACT_MAX_CAMS];
    char img_name[ACT_MAX_CAMS][ACT_NAME_LEN + 32];
    int pool_kind[ACT_MAX_CAMS];       /* ACT_EP_POOL_*: gzip or lzf chunks, raw ones (episode_inflate.c) */
    int pool_cd[ACT_MAX_CAMS][4];      /* of this shape (t, y, x, c) */
    int pool_fl[ACT_MAX_CAMS];         /* 1: each chunk ends in a fletcher32 checksum the pool checks */
    int direct_ok[ACT_MAX_CAMS];   /* 1: raw frames read by pread (episode_direct.c) */
    act_ep_direct direct[ACT_MAX_CAMS];
    act_ep_index index[ACT_MAX_CAMS];   /* a chunked camera's chunk table (episode_index.h), or empty */
    int pool_ix[ACT_MAX_CAMS];     /* 1: the pool preads camera c's tiles at the table's places */
    int fd;                        /* HDF5's descriptor of the file, for those reads; < 0: none */
    uint64_t file_size;
    struct stat opened;            /* fd's status at open: a file rewritten in place is noticed */
    act_ep_scratch scratch;
    act_ep_rowcache rows[ACT_MAX_CAMS];   /* gzip tiles: the rows a read keeps for the next */
} h5_episode;

static herr_t innermost_cb(unsigned n, const H5E_error2_t *e, void *data) {
    if (n == 0 && e->desc) snprintf((char *)data, 200, "%s", e->desc);
    return 0;
}

/* Formats "<path>: <message> (HDF5: <innermost error>)" and clears HDF5's stack. */
static int ep_fail(char *err, size_t errlen, const char *path, const char *fmt, ...) {
    char msg[400], h5[200] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_cb, h5);
    H5Eclear2(H5E_DEFAULT);
    if (h5[0])
        snprintf(err, errlen, "%s: %s (HDF5: %s)", path, msg, h5);
    else
        snprintf(err, errlen, "%s: %s", path, msg);
    return -1;
}

/* Checks that `name` exists, link by link, so "observations/images/front" missing says which
 * part is missing instead of HDF5's generic failure. */
static int ep_exists(hid_t file, const char *name) {
    char part[256];
    const char *p = name;
    while ((p = strchr(p, '/')) != NULL) {
        size_t len = (size_t)(p - name);
        if (len >= sizeof part) return 0;
        memcpy(part, name, len);
        part[len] = '\0';
        if (H5Lexists(file, part, H5P_DEFAULT) <= 0) return 0;
        p++;
    }
    return H5Lexists(file, name, H5P_DEFAULT) > 0;
}

static const char *class_name(H5T_class_t c) {
    switch (c) {
    case H5T_INTEGER: return "int";
    case H5T_FLOAT: return "float";
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    default: return "non-numeric";
    }
}

static void fmt_shape(char *buf, size_t len, const hsize_t *d, int n);

/* A dataset whose layout stores less than its shape needs: HDF5 1.10 reads past its own buffers
 * for some of those (fuzz_episode, 2026-12-03: a contiguous dataset with nothing stored, whose
 * read copied from a null buffer; unfiltered chunks of 48 bytes where the chunk shape says
 * 12288, copied whole), and reads the others as fill values (zeros) without a word: a recording
 * interrupted after its datasets were sized. Compact and contiguous: the stored bytes must cover
 * the shape. Chunked: no chunk longer than a fixed dimension (gzip chunks of a damaged shape of
 * 4 x 262144 pixels for 4 x 4 frames were copied whole from their 48 inflated bytes), every
 * chunk the shape spans must be stored, and without filters each is exactly one chunk's bytes,
 * so their sum is the count times that; episode_check.c then checks each chunk's own size (and
 * what each compressed one inflates to). Virtual datasets and external raw files are refused:
 * HDF5 reads a missing source, or one cut short, as zeros.
 * 1 (err set) when short or damaged. */
static int storage_short(const char *path, hid_t ds, const char *name, const hsize_t *dims, int rank,
                         size_t elem, char *err, size_t errlen) {
    hid_t dcpl = H5Dget_create_plist(ds);
    H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
    double have = (double)H5Dget_storage_size(ds), need = (double)elem;   /* doubles: a damaged */
    for (int i = 0; i < rank; i++) need *= (double)dims[i];                /* shape may overflow */
    char shp[96];
    fmt_shape(shp, sizeof shp, dims, rank);
    int bad = 0;
    if (layout == H5D_VIRTUAL)
        bad = ep_fail(err, errlen, path, "dataset '%s' is a virtual dataset (its data lives in other files, and HDF5 "
                      "reads a missing one as zeros): act-engine reads self-contained episodes; copy it into one "
                      "file, e.g. h5repack IN.hdf5 OUT.hdf5", name);
    else if (dcpl >= 0 && H5Pget_external_count(dcpl) > 0)
        bad = ep_fail(err, errlen, path, "dataset '%s' keeps its data in external raw files (HDF5 reads past their "
                      "end as zeros): act-engine reads self-contained episodes; copy it into one file, e.g. "
                      "h5repack IN.hdf5 OUT.hdf5", name);
    else if (layout == H5D_CHUNKED && H5Pget_chunk(dcpl, 0, NULL) != rank)
        /* HDF5 1.10 reads such a dataset by walking chunks of the wrong rank: a fuzzed file of
         * (3, 4, 4, 3) frames in chunks of (2, 2, 2) kept H5Dread busy for minutes */
        bad = ep_fail(err, errlen, path, "dataset '%s' %s has chunks of rank %d, not %d (damaged file)", name, shp,
                      H5Pget_chunk(dcpl, 0, NULL), rank);
    else if (layout == H5D_COMPACT || layout == H5D_CONTIGUOUS) {
        if (have < need)
            bad = ep_fail(err, errlen, path, "dataset '%s' stores %.0f bytes, but its shape %s of %zu-byte "
                          "values needs %.0f (damaged file, or data never written)", name, have, shp, elem, need);
    }
#if ACT_EP_CHUNK_INFO
    hsize_t cd[8], nchunks = 0;
    hid_t all = layout == H5D_CHUNKED && !bad ? H5Dget_space(ds) : -1;   /* 1.10 refuses H5S_ALL here */
    hsize_t maxd[8];
    if (all >= 0 && H5Pget_chunk(dcpl, 8, cd) == rank && H5Sget_simple_extent_dims(all, NULL, maxd) == rank &&
        H5Dget_num_chunks(ds, all, &nchunks) >= 0) {
        double chunk = (double)elem, spans = 1;
        int over = -1;   /* a chunk longer than a fixed dimension: HDF5 never writes one */
        for (int i = 0; i < rank; i++) {
            chunk *= (double)cd[i];
            spans *= cd[i] ? (double)((dims[i] + cd[i] - 1) / cd[i]) : 0;
            if (maxd[i] != H5S_UNLIMITED && cd[i] > maxd[i] && over < 0) over = i;
        }
        if (over >= 0) {
            char csh[96];
            fmt_shape(csh, sizeof csh, cd, rank);
            bad = ep_fail(err, errlen, path, "dataset '%s' %s has chunks of %s, longer than its fixed dimension %d "
                          "(damaged file)", name, shp, csh, over);
        } else if ((double)nchunks < spans)
            bad = ep_fail(err, errlen, path, "dataset '%s' %s stores %llu of its %.0f chunks: part of it was never "
                          "written (an interrupted recording?) or the file is damaged", name, shp,
                          (unsigned long long)nchunks, spans);
        else if (H5Pget_nfilters(dcpl) == 0 && have != chunk * (double)nchunks)
            bad = ep_fail(err, errlen, path, "dataset '%s' %s stores %.0f bytes in %llu unfiltered chunks of %.0f "
                          "bytes each (damaged file)", name, shp, have, (unsigned long long)nchunks, chunk);
    }
    if (all >= 0) H5Sclose(all);
#endif
    if (dcpl >= 0) H5Pclose(dcpl);
    if (!bad) H5Eclear2(H5E_DEFAULT);
    return bad ? 1 : 0;
}

/* ds's chunk table read into ix (episode_index.c, from the file: fd, file_size), before HDF5
 * walks that index itself: 1, err set, when its version 1 B-tree has a node pointing back up the
 * tree (act_ep_index's loops: HDF5 1.10 would recurse until the stack overflows in
 * H5Dget_storage_size or H5Dread). */
static int index_loops(const char *path, hid_t file, hid_t ds, int fd, uint64_t file_size, const char *name,
                       act_ep_index *ix, char *err, size_t errlen) {
    act_ep_index_build(file, ds, fd, file_size, ix);
    int loops = ix->loops;
    if (loops)
        ep_fail(err, errlen, path, "dataset '%s': its chunk index has a B-tree node at its parent's level or "
                "above (a tree that may point back up itself, which HDF5 1.10 would follow until its stack "
                "overflows): damaged file", name);
    return loops;
}

/* Opens `name` and checks its rank and stored size; dims are returned, and its chunk table in ix
 * (the caller's to free; empty on failure). want_float: float of any width (converted to float32
 * on read); else uint8. fd, file_size: HDF5's descriptor of the file (or < 0) and its size. */
static hid_t open_checked(const char *path, hid_t file, int fd, uint64_t file_size, const char *name, int rank,
                          hsize_t *dims, int want_float, act_ep_index *ix, char *err, size_t errlen) {
    memset(ix, 0, sizeof *ix);
    if (!ep_exists(file, name)) {
        ep_fail(err, errlen, path, "missing dataset '%s'", name);
        return -1;
    }
    hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
    if (ds < 0) {
        ep_fail(err, errlen, path, "dataset '%s' cannot be opened (not a dataset, or the file is damaged)", name);
        return -1;
    }
    act_ep_lzf_register_for(ds);   /* h5py's lzf, for HDF5's own path */
    hid_t type = H5Dget_type(ds), space = H5Dget_space(ds);
    int ok = type >= 0 && space >= 0;
    if (!ok) ep_fail(err, errlen, path, "dataset '%s': unreadable type or dataspace", name);
    if (ok) {
        H5T_class_t cls = H5Tget_class(type);
        size_t size = H5Tget_size(type);
        if (want_float && cls != H5T_FLOAT) {
            ep_fail(err, errlen, path, "dataset '%s' has dtype %s%zu, expected float", name,
                    class_name(cls), size * 8);
            ok = 0;
        } else if (!want_float && (cls != H5T_INTEGER || size != 1 || H5Tget_sign(type) != H5T_SGN_NONE)) {
            ep_fail(err, errlen, path, "dataset '%s' has dtype %s%s%zu, expected uint8", name,
                    cls == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "",
                    class_name(cls), size * 8);
            ok = 0;
        }
    }
    if (ok) {
        int nd = H5Sget_simple_extent_ndims(space);
        if (nd != rank) {
            ep_fail(err, errlen, path, "dataset '%s' has rank %d, expected %d", name, nd, rank);
            ok = 0;
        } else {
            H5Sget_simple_extent_dims(space, dims, NULL);
        }
    }
    if (ok) ok = !index_loops(path, file, ds, fd, file_size, name, ix, err, errlen);
    if (ok) ok = !storage_short(path, ds, name, dims, rank, H5Tget_size(type), err, errlen);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (!ok) {
        act_ep_index_free(ix);
        H5Dclose(ds);
        return -1;
    }
    return ds;
}

static void fmt_shape(char *buf, size_t len, const hsize_t *d, int n) {
    int o = snprintf(buf, len, "(");
    for (int i = 0; i < n && o < (int)len; i++)
        o += snprintf(buf + o, len - (size_t)o, "%s%llu", i ? ", " : "", (unsigned long long)d[i]);
    if (o < (int)len) snprintf(buf + o, len - (size_t)o, ")");
}

/* Reads a (T, width) float dataset whole into a new float32 array and checks it is finite. Its
 * chunks (a recorder appending a row a step may store one a chunk) are checked against the chunk
 * table where one is read (fd: HDF5's descriptor, or < 0), as the cameras' are. */
static int read_table(const char *path, hid_t file, int fd, uint64_t file_size, const char *name, int width,
                      int *T, float **out, char *err, size_t errlen) {
    hsize_t d[2];
    act_ep_index ix;
    hid_t ds = open_checked(path, file, fd, file_size, name, 2, d, 1, &ix, err, errlen);
    if (ds < 0) return -1;
    char shp[64];
    fmt_shape(shp, sizeof shp, d, 2);
    int bad = 0;
    float *buf = NULL;
    if (d[1] != (hsize_t)width || d[0] < 1 || d[0] > (1u << 24))
        bad = ep_fail(err, errlen, path, "dataset '%s' has shape %s, expected (T, %d) with T >= 1", name, shp, width);
    else if (*T >= 0 && d[0] != (hsize_t)*T)
        bad = ep_fail(err, errlen, path, "dataset '%s' has %llu timesteps, 'action' has %d", name,
                      (unsigned long long)d[0], *T);
    else if (!(buf = malloc(sizeof(float) * d[0] * d[1])))
        bad = ep_fail(err, errlen, path, "out of memory reading '%s'", name);
    else
        bad = act_ep_check_chunks(ds, &ix, path, name, 0, err, errlen) != 0;
    act_ep_index_free(&ix);
    if (bad) {
        free(buf);
        H5Dclose(ds);
        return -1;
    }
    if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
        ep_fail(err, errlen, path, "dataset '%s' cannot be read (truncated or corrupt file)", name);
        act_ep_check_sums(ds, NULL, path, name, err, errlen);   /* names a chunk failing its checksum */
        free(buf);
        H5Dclose(ds);
        return -1;
    }
    H5Dclose(ds);
    for (hsize_t i = 0; i < d[0] * d[1]; i++) {
        if (!isfinite(buf[i])) {
            free(buf);
            return ep_fail(err, errlen, path, "dataset '%s' has a value that is not finite or beyond float32's "
                           "range at t=%llu, column %llu",
                           name, (unsigned long long)(i / d[1]), (unsigned long long)(i % d[1]));
        }
    }
    *T = (int)d[0];
    *out = buf;
    return 0;
}

/* Dataset access list with a chunk cache holding one chunk of this dataset (capped at 256 MiB). */
static hid_t frame_access(hid_t file, const char *name) {
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
    hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
    if (ds < 0) return dapl;
    hid_t dcpl = H5Dget_create_plist(ds);
    if (dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED) {
        hsize_t cd[4];
        if (H5Pget_chunk(dcpl, 4, cd) == 4) {
            double bytes = (double)cd[0] * cd[1] * cd[2] * cd[3];
            size_t cache = bytes > 256.0 * 1024 * 1024 ? 256u << 20 : (size_t)bytes + (1u << 20);
            H5Pset_chunk_cache(dapl, 521, cache, 1.0);
        }
    }
    if (dcpl >= 0) H5Pclose(dcpl);
    H5Dclose(ds);
    H5Eclear2(H5E_DEFAULT);
    return dapl;
}

/* Frames [t0, t0 + n) of camera cam by HDF5 itself (a hyperslab read). */
static int h5_read_frames(act_episode *ep, int cam, int t0, int n, uint8_t *dst, char *err, size_t errlen) {
    h5_episode *h = ep->impl;
    hsize_t start[4] = {(hsize_t)t0, 0, 0, 0};
    hsize_t count[4] = {(hsize_t)n, (hsize_t)ep->image_h, (hsize_t)ep->image_w, 3};
    hid_t fspace = H5Dget_space(h->img[cam]);
    hid_t mspace = H5Screate_simple(4, count, NULL);
    int rc = 0;
    if (fspace < 0 || mspace < 0 ||
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
        H5Dread(h->img[cam], H5T_NATIVE_UCHAR, mspace, fspace, H5P_DEFAULT, dst) < 0) {
        rc = ep_fail(err, errlen, ep->path, "dataset '%s': frames [%d, %d) cannot be read (truncated or corrupt file)",
                     h->img_name[cam], t0, t0 + n);
        act_ep_check_sums(h->img[cam], &h->index[cam], ep->path, h->img_name[cam], err, errlen);   /* names a bad one */
    }
    if (mspace >= 0) H5Sclose(mspace);
    if (fspace >= 0) H5Sclose(fspace);
    return rc;
}

/* gzip or lzf chunks, raw tiles, or chunks with fletcher32 checksums of camera cam go to
 * episode_inflate.c */
static int inflated(const h5_episode *h, int cam) {
    return h->pool_kind[cam] != ACT_EP_POOL_NONE && act_ep_pool_on();
}

/* Frames [t0, t0 + n) of camera c on the pool's threads: gzip chunks inflated (their compressed
 * bytes fetched by pread when d locates them or ix, the chunk table, has their places, else
 * through HDF5) or raw tiles scattered (fetched the same two ways), or raw frames by pread at d.
 * As act_ep_read_pool / act_ep_read_direct: 0, -1 (err), 1 (leave it to HDF5). */
static int pool_read(act_episode *ep, int c, const act_ep_direct *d, const act_ep_index *ix, int t0, int n,
                     uint8_t *dst, char *err, size_t errlen) {
    h5_episode *h = ep->impl;
    size_t frame = (size_t)ep->image_h * ep->image_w * 3;
    if (inflated(h, c))
        return act_ep_read_pool(h->img[c], h->pool_kind[c], h->pool_fl[c], h->pool_cd[c], ep->image_h, ep->image_w,
                                d, ix, d || ix ? h->fd : -1, h->file_size, ep->path, h->img_name[c], t0, n, dst,
                                &h->scratch, &h->rows[c], err, errlen);
    return act_ep_read_direct(d, h->fd, h->file_size, h->img[c], ep->path, h->img_name[c], t0, n, frame, dst,
                              err, errlen);
}

/* Frames [t0, t0 + n) of camera c for the open's own looks at them (the pread check's reference
 * frames, zero_tail's last frame), never through a chunk the open's check left out: a camera the
 * pool inflates had its gzip chunks' sizes left to that pool, and HDF5's own filter pipeline
 * would copy a whole chunk out of a shorter inflated one (a heap over-read found by
 * test_episode_reader under ASan). Such a camera is read by the pool without a locator
 * (H5Dread_chunk, then the size-checked inflate); HDF5 reads what that path leaves to it
 * (unallocated chunks, or filter-skipped ones, which made the check cover every chunk). */
static int checked_read(act_episode *ep, int c, int t0, int n, uint8_t *dst, char *err, size_t errlen) {
    int r = inflated(ep->impl, c) ? pool_read(ep, c, NULL, NULL, t0, n, dst, err, errlen) : 1;
    return r > 0 ? h5_read_frames(ep, c, t0, n, dst, err, errlen) : r;
}

/* 1 when frames 0 and T-1 of camera c read through locator d or chunk table ix equal HDF5's
 * (ref: those two, by checked_read). The camera's row cache is emptied before each read (a row of
 * tiles HDF5's reads kept would answer it: the check would compare HDF5's bytes with themselves)
 * and after. */
static int places_agree(act_episode *ep, int c, const act_ep_direct *d, const act_ep_index *ix, const uint8_t *ref,
                        uint8_t *got) {
    h5_episode *h = ep->impl;
    size_t frame = (size_t)ep->image_h * ep->image_w * 3;
    char e[256];
    int ok = 1;
    for (int i = 0; i < 2 && ok; i++) {
        h->rows[c].row1[0] = h->rows[c].row1[1] = 0;
        ok = !pool_read(ep, c, d, ix, i ? ep->T - 1 : 0, 1, got, e, sizeof e) &&
             !memcmp(ref + (size_t)i * frame, got, frame);
    }
    h->rows[c].row1[0] = h->rows[c].row1[1] = 0;
    return ok;
}

/* frames 0 and T-1 of camera c through HDF5 (checked_read) into ref, or NULL */
static uint8_t *reference_frames(act_episode *ep, int c) {
    size_t frame = (size_t)ep->image_h * ep->image_w * 3;
    uint8_t *ref = malloc(2 * frame);
    char e[256];
    if (ref && (checked_read(ep, c, 0, 1, ref, e, sizeof e) || checked_read(ep, c, ep->T - 1, 1, ref + frame, e,
                                                                            sizeof e))) {
        free(ref);
        ref = NULL;
    }
    return ref;
}

/* HDF5's descriptor of the file (the sec2 driver's), its size and status, once at open */
static void file_setup(h5_episode *h) {
    int *handle = NULL;
    hid_t fapl = H5Fget_access_plist(h->file);
    h->fd = -2;   /* none */
    if (fapl >= 0 && H5Pget_driver(fapl) == H5FD_SEC2 && H5Fget_vfd_handle(h->file, fapl, (void **)&handle) >= 0 &&
        handle && *handle >= 0 && fstat(*handle, &h->opened) == 0) {
        h->fd = *handle;
        h->file_size = (uint64_t)h->opened.st_size;
    }
    if (fapl >= 0) H5Pclose(fapl);
    H5Eclear2(H5E_DEFAULT);
}

/* qpos and actions were read at open, frames are read batch by batch: a file rewritten in place
 * meanwhile (cp, cat >, rsync --inplace, h5py "w" onto the same path) would pair one recording's
 * frames with another's qpos. Its size or modification time changing fails the episode; a file
 * replaced by rename keeps the opened inode, which is read consistently. 0 or -1 (err). */
static int unchanged(const act_episode *ep, char *err, size_t errlen) {
    const h5_episode *h = ep->impl;
    struct stat st;
    if (h->fd < 0 || fstat(h->fd, &st) != 0) return 0;
    if (st.st_size == h->opened.st_size && st.st_mtim.tv_sec == h->opened.st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == h->opened.st_mtim.tv_nsec)
        return 0;
    snprintf(err, errlen, "%s: the file changed while it was being read (%s): its frames and its qpos/actions "
             "may come from different recordings; rerun once nothing writes to it", ep->path,
             st.st_size != h->opened.st_size ? "its size changed" : "it was modified");
    return -1;
}

/* A recorder that sizes its datasets for the longest episode and stops early leaves the last
 * timesteps unwritten; in a contiguous dataset (h5py's default) that storage exists and reads as
 * zeros, so the chunk checks cannot see it. Trailing timesteps whose qpos and action rows are all
 * exactly 0.0 (an arm may rest at zero with a zero command) whose last frame is black in every
 * camera too (no camera sees that) are refused. */
static int zero_tail(act_episode *ep, char *err, size_t errlen) {
    int t = ep->T;
    for (; t > 0; t--) {
        int zero = 1;
        for (int j = 0; j < ep->obs_dim && zero; j++) zero = ep->qpos[(size_t)(t - 1) * ep->obs_dim + j] == 0.0f;
        for (int j = 0; j < ep->action_dim && zero; j++) zero = ep->action[(size_t)(t - 1) * ep->action_dim + j] == 0.0f;
        if (!zero) break;
    }
    if (t == ep->T) return 0;
    size_t frame = (size_t)ep->image_h * ep->image_w * 3;
    uint8_t *f = malloc(frame);
    int black = f != NULL;
    for (int c = 0; c < ep->num_cams && black; c++) {
        char e[256];
        black = checked_read(ep, c, ep->T - 1, 1, f, e, sizeof e) == 0;
        for (size_t i = 0; i < frame && black; i++) black = f[i] == 0;
    }
    free(f);
    H5Eclear2(H5E_DEFAULT);
    if (!black) return 0;   /* a real scene at rest (or unreadable: the reads will say so) */
    snprintf(err, errlen, "%s: timesteps %d-%d of %d have qpos and action all exactly 0 and the last frame is black "
             "in every camera (never written? a recording stopped before it filled datasets sized for a longer "
             "one); cut the datasets to the recorded length", ep->path, t, ep->T - 1, ep->T);
    return -1;
}

/* Camera c's frames (raw), or its gzip chunks' compressed bytes, read by pread (episode_direct.c)
 * on HDF5's own file descriptor, when the layout allows it and the first and last frames read
 * that way equal HDF5's (for gzip: the chunks HDF5 fetches by their coordinates, inflated and
 * size-checked by the pool: checked_read): a check of what the addresses mean, at two frames per
 * camera. A chunked
 * dataset in a file with a user block has two candidate bases (HDF5 1.10 counts chunk addresses
 * from the block's end, later versions may count from the file's start): exactly one may agree.
 * Anything short of that leaves the camera to HDF5 (or, for gzip, to H5Dread_chunk), which says
 * what is wrong. */
static void direct_setup(act_episode *ep, int c) {
    h5_episode *h = ep->impl;
    act_ep_direct d;
    if (h->fd < 0 ||
        !act_ep_direct_probe(h->file, h->img[c], ep->T, ep->image_h, ep->image_w, h->file_size,
                             inflated(h, c) && h->pool_kind[c] == ACT_EP_POOL_GZIP, &d))
        return;
    if (d.k > 0 && h->index[c].n) d.ix = &h->index[c];   /* chunks found in the table, not by HDF5 */
    /* layout version 4 without a table (HDF5 1.10): each chunk's place by coordinates would walk
     * the whole index at every read (2500 appended frames: ~0.25 ms a lookup); HDF5's own read,
     * or for gzip the pool's H5Dread_chunk, finds chunks with the index's own lookup */
    if (d.k > 0 && !d.ix && h->index[c].v4_unread) return;
    uint8_t *ref = reference_frames(ep, c), *got = malloc((size_t)ep->image_h * ep->image_w * 3);
    if (ref && got) {
        act_ep_direct alt = d;
        alt.base = 0;
        int a = places_agree(ep, c, &d, NULL, ref, got);
        int b = d.k > 0 && d.base > 0 && places_agree(ep, c, &alt, NULL, ref, got);
        if (a != b) {
            h->direct[c] = a ? d : alt;
            h->direct_ok[c] = 1;
        }
    }
    H5Eclear2(H5E_DEFAULT);
    free(ref);
    free(got);
}

/* Camera c's tiles (raw or gzip, on the pool) fetched by pread at the chunk table's places, when
 * its first and last frames read that way equal HDF5's (places_agree), as direct_setup checks the
 * whole-frame locator. */
static void tiles_setup(act_episode *ep, int c) {
    h5_episode *h = ep->impl;
    if (h->fd < 0 || !h->index[c].n || !inflated(h, c) || h->direct_ok[c]) return;
    uint8_t *ref = reference_frames(ep, c), *got = malloc((size_t)ep->image_h * ep->image_w * 3);
    h->pool_ix[c] = ref && got && places_agree(ep, c, NULL, &h->index[c], ref, got);
    H5Eclear2(H5E_DEFAULT);
    free(ref);
    free(got);
}

int act_episode_open(const char *path, const act_config *cfg, act_episode **out,
                     char *err, size_t errlen) {
    *out = NULL;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (act_ep_inflater_check(err, errlen)) return -1;   /* a misspelt ACT_EPISODE_INFLATE */
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        return -1;
    }
#if H5_VERSION_GE(1, 12, 0)
    htri_t is_h5 = H5Fis_accessible(path, H5P_DEFAULT);
#else
    htri_t is_h5 = H5Fis_hdf5(path);
#endif
    if (is_h5 == 0) {
        H5Eclear2(H5E_DEFAULT);
        snprintf(err, errlen, "%s: not an HDF5 file (or its superblock is damaged)", path);
        return -1;
    }
    /* the check itself failed (memory, a read error): say HDF5's reason, not "not HDF5" */
    if (is_h5 < 0) return ep_fail(err, errlen, path, "cannot be checked as an HDF5 file");
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) return ep_fail(err, errlen, path, "cannot open as HDF5 (truncated or corrupt file)");

    act_episode *ep = calloc(1, sizeof *ep);
    h5_episode *h = calloc(1, sizeof *h);
    if (!ep || !h) {
        free(ep);
        free(h);
        H5Fclose(file);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    snprintf(ep->path, sizeof ep->path, "%s", path);
    ep->impl = h;
    h->file = file;
    h->fd = -1;
    for (int c = 0; c < ACT_MAX_CAMS; c++) h->img[c] = -1;
    ep->obs_dim = cfg->obs_dim;
    ep->action_dim = cfg->action_dim;
    ep->num_cams = cfg->num_cams;
    ep->image_h = cfg->image_h;
    ep->image_w = cfg->image_w;

    file_setup(h);
    int T = -1;
    if (read_table(path, file, h->fd, h->file_size, "action", cfg->action_dim, &T, &ep->action, err, errlen) != 0 ||
        read_table(path, file, h->fd, h->file_size, "observations/qpos", cfg->obs_dim, &T, &ep->qpos, err,
                   errlen) != 0)
        goto fail;
    ep->T = T;
    for (int c = 0; c < cfg->num_cams; c++) {
        char *name = h->img_name[c];
        snprintf(name, sizeof h->img_name[c], "observations/images/%s", cfg->camera_names[c]);
        hsize_t d[4];
        hid_t ds = open_checked(path, file, h->fd, h->file_size, name, 4, d, 0, &h->index[c], err, errlen);
        if (ds < 0) {
            if (!ep_exists(file, name)) {
                snprintf(err + strlen(err), errlen - strlen(err),
                         " (the model's cameras are %d: ", cfg->num_cams);
                for (int k = 0; k < cfg->num_cams; k++)
                    snprintf(err + strlen(err), errlen - strlen(err), "%s%s", k ? "," : "",
                             cfg->camera_names[k]);
                snprintf(err + strlen(err), errlen - strlen(err), ")");
            }
            goto fail;
        }
        H5Dclose(ds);
        char shp[96];
        fmt_shape(shp, sizeof shp, d, 4);
        if (d[0] != (hsize_t)T) {
            ep_fail(err, errlen, path, "dataset '%s' has %llu timesteps, 'action' has %d", name,
                    (unsigned long long)d[0], T);
            goto fail;
        }
        if (d[1] != (hsize_t)cfg->image_h || d[2] != (hsize_t)cfg->image_w || d[3] != 3) {
            ep_fail(err, errlen, path, "dataset '%s' has shape %s, expected (T, %d, %d, 3): the model takes %dx%d RGB frames",
                    name, shp, cfg->image_h, cfg->image_w, cfg->image_h, cfg->image_w);
            goto fail;
        }
        hid_t dapl = frame_access(file, name);
        h->img[c] = H5Dopen2(file, name, dapl);
        H5Pclose(dapl);
        if (h->img[c] < 0) {
            ep_fail(err, errlen, path, "dataset '%s' cannot be opened", name);
            goto fail;
        }
        h->pool_kind[c] = act_ep_pool_chunk(h->img[c], cfg->image_h, cfg->image_w, h->pool_cd[c], &h->pool_fl[c]);
        int mode = inflated(h, c) ? ACT_EP_CHECK_SKIP_POOL : 0;
        if (act_ep_check_chunks(h->img[c], &h->index[c], path, name, mode, err, errlen) != 0) goto fail;
        if (act_ep_pool_on() && act_ep_pread_on()) {
            direct_setup(ep, c);
            tiles_setup(ep, c);
        }
    }
    if (zero_tail(ep, err, errlen) != 0) goto fail;
    *out = ep;
    return 0;
fail:
    act_episode_close(ep);
    return -1;
}

int act_episode_read_frames(act_episode *ep, int cam, int t0, int n, uint8_t *dst,
                            char *err, size_t errlen) {
    h5_episode *h = ep->impl;
    if (cam < 0 || cam >= ep->num_cams || t0 < 0 || n < 1 || t0 + n > ep->T) {
        snprintf(err, errlen, "%s: frame window [%d, %d) of camera %d is out of range (T=%d)",
                 ep->path, t0, t0 + n, cam, ep->T);
        return -1;
    }
    int r = 1;
    if (inflated(h, cam) || h->direct_ok[cam])
        r = pool_read(ep, cam, h->direct_ok[cam] ? &h->direct[cam] : NULL, h->pool_ix[cam] ? &h->index[cam] : NULL,
                      t0, n, dst, err, errlen);
    if (r > 0) r = h5_read_frames(ep, cam, t0, n, dst, err, errlen);   /* 1: a chunk that path leaves to HDF5 */
    return r == 0 ? unchanged(ep, err, errlen) : r;
}

void act_episode_reader(const act_episode *ep, int cam, char *buf, size_t len) {
    const h5_episode *h = ep->impl;
    const char *inf = act_ep_inflater();
    int lzf = cam >= 0 && cam < ep->num_cams && h->pool_kind[cam] == ACT_EP_POOL_LZF;
    const char *by = lzf ? "pool" : inf ? inf : "?", *codec = lzf ? "lzf" : "gzip";   /* who decodes what */
    const char *sum = cam >= 0 && cam < ep->num_cams && h->pool_fl[cam] ? ", fletcher32" : "";
    if (cam < 0 || cam >= ep->num_cams)
        snprintf(buf, len, "no camera %d", cam);
    else if (inflated(h, cam) && h->pool_kind[cam] == ACT_EP_POOL_RAW)
        snprintf(buf, len, "pool, raw chunks of (%d, %d, %d, %d)%s%s", h->pool_cd[cam][0], h->pool_cd[cam][1],
                 h->pool_cd[cam][2], h->pool_cd[cam][3], sum, h->pool_ix[cam] ? ", pread" : "");
    else if (inflated(h, cam) && h->pool_cd[cam][1] == ep->image_h && h->pool_cd[cam][2] == ep->image_w &&
             h->pool_cd[cam][3] == 3)
        snprintf(buf, len, "%s, %s chunks of %d frames%s%s", by, codec, h->pool_cd[cam][0], sum,
                 h->direct_ok[cam] || h->pool_ix[cam] ? ", pread" : "");
    else if (inflated(h, cam))
        snprintf(buf, len, "%s, %s chunks of (%d, %d, %d, %d)%s%s", by, codec, h->pool_cd[cam][0], h->pool_cd[cam][1],
                 h->pool_cd[cam][2], h->pool_cd[cam][3], sum, h->pool_ix[cam] ? ", pread" : "");
    else if (h->direct_ok[cam] && h->direct[cam].k > 0)
        snprintf(buf, len, "pread, chunks of %d frames", h->direct[cam].k);
    else if (h->direct_ok[cam])
        snprintf(buf, len, "pread, contiguous");
    else
        snprintf(buf, len, "hdf5");
}

void act_episode_close(act_episode *ep) {
    if (!ep) return;
    h5_episode *h = ep->impl;
    if (h) {
        for (int c = 0; c < ACT_MAX_CAMS; c++)
            if (h->img[c] >= 0) H5Dclose(h->img[c]);
        if (h->file >= 0) H5Fclose(h->file);
        H5Eclear2(H5E_DEFAULT);
        act_ep_scratch_free(&h->scratch);
        for (int c = 0; c < ACT_MAX_CAMS; c++) act_ep_rowcache_free(&h->rows[c]);
        for (int c = 0; c < ACT_MAX_CAMS; c++) act_ep_index_free(&h->index[c]);
        free(h);
    }
    free(ep->qpos);
    free(ep->action);
    free(ep);
}

void act_episode_library(char *buf, size_t len) {
    unsigned maj = 0, min = 0, rel = 0;
    H5get_libversion(&maj, &min, &rel);
    snprintf(buf, len, "HDF5 %u.%u.%u (built against %d.%d.%d), chunk table: %s", maj, min, rel, H5_VERS_MAJOR,
             H5_VERS_MINOR, H5_VERS_RELEASE,
             ACT_EP_INDEX_ITER ? "H5Dchunk_iter" : ACT_EP_INDEX_WALK ? "walked" : "none");
}

#else /* !ACT_WITH_HDF5 */

int act_episode_open(const char *path, const act_config *cfg, act_episode **out,
                     char *err, size_t errlen) {
    (void)cfg;
    *out = NULL;
    snprintf(err, errlen, "%s: act-engine was built without HDF5, episodes cannot be read "
             "(install libhdf5-dev and rebuild)", path);
    return -1;
}

int act_episode_read_frames(act_episode *ep, int cam, int t0, int n, uint8_t *dst,
                            char *err, size_t errlen) {
    (void)ep, (void)cam, (void)t0, (void)n, (void)dst;
    snprintf(err, errlen, "act-engine was built without HDF5");
    return -1;
}

void act_episode_reader(const act_episode *ep, int cam, char *buf, size_t len) {
    (void)ep, (void)cam;
    snprintf(buf, len, "none (built without HDF5)");
}

void act_episode_close(act_episode *ep) { (void)ep; }

void act_episode_library(char *buf, size_t len) { snprintf(buf, len, "no HDF5"); }

#endif

/* appends to buf[len] at *at (stops writing, but keeps counting, once it is full) */
static void append(char *buf, size_t len, size_t *at, const char *a, const char *b) {
    int w = snprintf(*at < len ? buf + *at : NULL, *at < len ? len - *at : 0, "%s%s", a, b);
    if (w > 0) *at += (size_t)w;
}

void act_episode_readers(const act_episode *ep, const act_config *cfg, char *buf, size_t len) {
    char how[ACT_MAX_CAMS][128];
    int n = ep->num_cams < ACT_MAX_CAMS ? ep->num_cams : ACT_MAX_CAMS, done[ACT_MAX_CAMS] = {0};
    size_t at = 0;
    if (len) buf[0] = '\0';
    for (int k = 0; k < n; k++) act_episode_reader(ep, k, how[k], sizeof how[k]);
    for (int k = 0; k < n; k++) {
        if (done[k]) continue;
        for (int j = k; j < n; j++) {   /* every camera read as k is, in config order */
            if (done[j] || strcmp(how[j], how[k])) continue;
            done[j] = 1;
            append(buf, len, &at, j == k ? (at ? "; " : "") : ", ", cfg->camera_names[j]);
        }
        append(buf, len, &at, ": ", how[k]);
    }
}
