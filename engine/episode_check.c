/* episode_check.c - each stored chunk's size checked before HDF5 reads it (see episode_check.h). */
#include "episode_check.h"
#include "episode_direct.h"   /* ACT_EP_CHUNK_INFO */
#include "episode_fletcher.h"
#include "episode_inflate.h"  /* act_ep_inflate_one */
#include "episode_lzf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(ACT_WITH_HDF5) && ACT_EP_CHUNK_INFO
#ifdef ACT_WITH_LIBDEFLATE
#include <libdeflate.h>
#endif

#define MAX_FILTERS 16
#define MAX_CHECK_CHUNK ((size_t)1 << 30)   /* a chunk larger than this is refused: no episode needs it */
#define BY_SIZE_FROM 4096                   /* chunks in a dataset from which locate() goes by size */
#define BY_SIZE_MAX_CHUNK ((size_t)64 << 20)

typedef struct {
    const char *path, *name;
    char *err;
    size_t errlen;
} ctx;

static void coords(char *buf, size_t len, const hsize_t *o, int rank) {
    int w = snprintf(buf, len, "(");
    for (int i = 0; i < rank && w > 0 && (size_t)w < len; i++)
        w += snprintf(buf + w, len - (size_t)w, "%s%llu", i ? ", " : "", (unsigned long long)o[i]);
    if (w > 0 && (size_t)w < len) snprintf(buf + w, len - (size_t)w, ")");
}

static int fail(const ctx *c, const hsize_t *o, int rank, const char *fmt, ...) {
    char at[96], msg[200];
    coords(at, sizeof at, o, rank);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    H5Eclear2(H5E_DEFAULT);
    snprintf(c->err, c->errlen, "%s: dataset '%s': the chunk at %s %s (damaged file)", c->path, c->name, at, msg);
    return -1;
}

/* A chunk's filter mask, address and stored size (the address: HADDR_UNDEF when never written).
 * H5Dget_chunk_info_by_coord answers by walking the dataset's whole chunk index in HDF5 1.10, so
 * a check of every chunk that way is quadratic: 76800 gzip tiles of (1, 4, 4, 1) took 123 s to
 * open, 19200 of (1, 8, 8, 1) 4.1 s. by_size: the stored size from H5Dget_chunk_storage_size (one
 * B-tree lookup), the mask from the chunk's raw bytes (H5Dread_chunk into probe, of cap bytes),
 * and by_coord only for a chunk of 0 stored bytes (unallocated, or a damaged entry: its address
 * says which). A chunk larger than probe is left with mask 0: every size check below refuses it
 * anyway. Filtered datasets only: for an unfiltered one HDF5 1.10's storage size is the nominal
 * chunk size, not the stored one (a chunk stored half a frame short reads as whole). */
static herr_t locate(hid_t ds, const act_ep_index *ix, const hsize_t *o, int by_size, uint8_t *probe, size_t cap,
                     unsigned *mask, haddr_t *addr, hsize_t *size) {
    if (ix) return act_ep_index_at(ix, o, mask, addr, size);   /* the table read at open */
    if (!by_size) return H5Dget_chunk_info_by_coord(ds, o, mask, addr, size);
    if (H5Dget_chunk_storage_size(ds, o, size) < 0) return -1;
    if (*size == 0) return H5Dget_chunk_info_by_coord(ds, o, mask, addr, size);
    *mask = 0;
    *addr = 0;   /* allocated: the check uses the address for no more than that */
    uint32_t m = 0;
    if (*size <= cap) {
        if (H5Dread_chunk(ds, H5P_DEFAULT, o, &m, probe) < 0) return -1;
        *mask = m;
    }
    return 0;
}

/* The chunk at o, listed (by the table or H5Dget_chunk_info_by_coord, both of which walk the
 * index's leaves in order) with `size` stored bytes, is also what H5Dread finds: HDF5 reads by a
 * search down the index, whose inner keys the listing never reads. A damaged inner key (a version
 * 1 B-tree's key lowered) sends the search past chunks that are listed, which HDF5 then reads as
 * unallocated: zeros, while a table's pread reads the stored frames. H5Dget_chunk_storage_size
 * searches as H5Dread does (~1 us a chunk): it must find the chunk, with the same stored size
 * where the dataset is filtered (unfiltered, 1.10 answers the nominal size). 1 when it does.
 * (A chunk listed at 0 stored bytes is the size checks' below.) */
static int found_by_lookup(hid_t ds, const hsize_t *o, int nf, hsize_t size) {
    hsize_t s = 0;
    return H5Dget_chunk_storage_size(ds, o, &s) >= 0 && s > 0 && (nf == 0 || s == size);
}

/* by size from BY_SIZE_FROM chunks of a filtered dataset; ACT_EPISODE_CHECK_LOOKUP=by-coord or
 * by-size forces one for every filtered dataset (tests) */
static int lookup_by_size(double spans, size_t max_raw, int nf) {
    const char *e = getenv("ACT_EPISODE_CHECK_LOOKUP");
    int want = e && !strcmp(e, "by-size") ? 1 : e && !strcmp(e, "by-coord") ? 0 : spans >= BY_SIZE_FROM;
    return want && nf > 0 && max_raw <= BY_SIZE_MAX_CHUNK;
}

int act_ep_check_chunks(hid_t ds, const act_ep_index *ix, const char *path, const char *name, int mode,
                        char *err, size_t errlen) {
    ctx c = {path, name, err, errlen};
    int skip_inflated = mode & ACT_EP_CHECK_SKIP_POOL, sums = mode & ACT_EP_CHECK_SUMS;
    hid_t dcpl = H5Dget_create_plist(ds), type = H5Dget_type(ds), space = H5Dget_space(ds);
    int rc = 0, rank = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    uint8_t *raw = NULL, *a = NULL, *b = NULL, *probe = NULL;
    void *dec = NULL;
    hsize_t dims[8], cd[8], o[8] = {0};
    if (dcpl < 0 || type < 0 || rank < 1 || rank > 8 || H5Pget_layout(dcpl) != H5D_CHUNKED ||
        H5Pget_chunk(dcpl, 8, cd) != rank || H5Sget_simple_extent_dims(space, dims, NULL) != rank)
        goto out;   /* not chunked (or unreadable: the read says so) */

    /* the pipeline, in the order the writer applied it */
    int nf = H5Pget_nfilters(dcpl), ids[MAX_FILTERS], has_deflate = 0, has_lzf = 0;
    if (nf > MAX_FILTERS) nf = MAX_FILTERS;
    for (int i = 0; i < nf; i++) {
        unsigned flags, cdv[8];
        size_t ncd = 8;
        char fname[64] = "";
        ids[i] = (int)H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cdv, sizeof fname, fname, NULL);
        if (ids[i] == H5Z_FILTER_DEFLATE) has_deflate = 1;
        if (ids[i] == ACT_EP_FILTER_LZF) has_lzf = 1;
        if (ids[i] != H5Z_FILTER_DEFLATE && ids[i] != ACT_EP_FILTER_LZF && ids[i] != H5Z_FILTER_SHUFFLE &&
            ids[i] != H5Z_FILTER_FLETCHER32) {
            H5Eclear2(H5E_DEFAULT);
            snprintf(err, errlen, "%s: dataset '%s' is stored with the HDF5 filter '%s' (id %d): act-engine reads "
                     "episodes stored raw, with gzip or h5py's lzf (shuffle, fletcher32); re-save it, e.g. "
                     "h5repack -f GZIP=4 IN.hdf5 OUT.hdf5", path, name, fname[0] ? fname : "?", ids[i]);
            rc = -1;
            goto out;
        }
    }
#if !defined(ACT_WITH_LIBDEFLATE) && !defined(ACT_WITH_ZLIB)
    if (has_deflate) goto out;   /* nothing here to inflate with: left to HDF5 unchecked */
    (void)dec;                   /* no inflater to give it */
#endif
    int has_codec = has_deflate || has_lzf;   /* a filter that changes a chunk's size */

    double cb = (double)H5Tget_size(type), spans = 1;
    for (int i = 0; i < rank; i++) {
        cb *= (double)cd[i];
        spans *= cd[i] ? (double)((dims[i] + cd[i] - 1) / cd[i]) : 0;
    }
    if (spans == 0) goto out;
    if (sums && !has_codec && cb > (double)MAX_CHECK_CHUNK) goto out;   /* no chunk that large is read to check */
    if (has_codec && cb > (double)MAX_CHECK_CHUNK) {   /* decoding one needs buffers of that size */
        snprintf(err, errlen, "%s: dataset '%s' has chunks of %.0f bytes, more than the %zu an episode's reader "
                 "takes (damaged file?)", path, name, cb, MAX_CHECK_CHUNK);
        rc = -1;
        goto out;
    }
    size_t chunk = (size_t)cb, max_raw = chunk + (chunk >> 6) + 4096 + 4 * MAX_FILTERS;
    unsigned copts = 0;   /* H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS: edge chunks are stored unfiltered */
    int raw_edges = H5Pget_chunk_opts(dcpl, &copts) >= 0 && (copts & H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS);
#ifdef ACT_WITH_LIBDEFLATE   /* the inflater the reader uses (ACT_EPISODE_INFLATE) */
    const char *inflater = act_ep_inflater();
    if (has_deflate && inflater && !strcmp(inflater, "libdeflate") && !(dec = libdeflate_alloc_decompressor()))
        goto nomem;
#endif

    int v4 = ix && !ix->n && ix->v4_unread;
    if (ix && !ix->n) ix = NULL;
    if (v4 && nf == 0) {
        /* layout version 4, unfiltered, no table (1.10): its index stores no chunk sizes, so
         * every chunk is one chunk's bytes by format and there is nothing to check per chunk
         * (storage_short, episode.c, has counted the chunks never written); asking each chunk's
         * place by coordinates would walk the index each time (2500 appended frames: ~0.25 ms
         * a lookup) */
        goto out;
    }
    int by_size = !ix && lookup_by_size(v4 ? BY_SIZE_FROM : spans, max_raw, nf);   /* v4: at any count */
    if (by_size && !(probe = malloc(max_raw))) goto nomem;
    for (;;) {   /* every chunk of the grid, as coordinates o */
        unsigned mask = 0;
        haddr_t addr = HADDR_UNDEF;
        hsize_t size = 0;
        if (locate(ds, ix, o, by_size, probe, max_raw, &mask, &addr, &size) < 0) {
            rc = fail(&c, o, rank, "cannot be located in the chunk index");
            break;
        }
        if (skip_inflated && ((mask != 0 && addr != HADDR_UNDEF) || size == 0)) {
            /* a chunk stored with a filter skipped, or one of 0 stored bytes (unallocated, or a
             * damaged index's entry: the inflater takes both for unallocated), sends every read
             * window holding it to HDF5, the inflater's chunks in that window too: all of them are
             * checked here after all (a 0-byte entry then fails below) */
            skip_inflated = 0;
            memset(o, 0, sizeof o);
            continue;
        }
        if (addr != HADDR_UNDEF && size > 0 && !by_size && !found_by_lookup(ds, o, nf, size)) {
            rc = fail(&c, o, rank, "is in the chunk index's list, but HDF5's lookup of its coordinates does not "
                      "find it (damaged index: HDF5 would read it as zeros)");
            break;
        }
        int edge = 0;
        for (int i = 0; i < rank; i++) edge |= o[i] + cd[i] > dims[i];
        int live = 0, nflet = 0, deflated = 0;   /* filters applied to this chunk (mask bit i: skipped) */
        for (int i = 0; i < nf && !(raw_edges && edge); i++)
            if (!(mask & (1u << i))) {
                live++;
                nflet += ids[i] == H5Z_FILTER_FLETCHER32;
                deflated |= ids[i] == H5Z_FILTER_DEFLATE || ids[i] == ACT_EP_FILTER_LZF;
            }
        if (addr == HADDR_UNDEF) {
            /* never written: storage_short (episode.c) counts these */
        } else if (!live) {
            if (size != chunk)
                rc = fail(&c, o, rank, "stores %llu bytes unfiltered, but a chunk holds %llu", (unsigned long long)size,
                          (unsigned long long)chunk);
        } else if (!(skip_inflated && mask == 0)) {
            if (!deflated && size != chunk + 4 * (size_t)nflet)
                rc = fail(&c, o, rank, "stores %llu bytes, but a chunk holds %llu", (unsigned long long)size,
                          (unsigned long long)(chunk + 4 * (size_t)nflet));
            else if (deflated && (size < 1 || size > max_raw))
                rc = fail(&c, o, rank, "claims %llu compressed bytes for a chunk of %llu", (unsigned long long)size,
                          (unsigned long long)chunk);
            if (rc) break;
            if (!deflated && !(sums && nflet)) goto next;   /* shuffle and fletcher32 alone: the size says it all */
            if (!raw && (!(raw = malloc(max_raw)) || (has_codec && (!(a = malloc(chunk + 4 * MAX_FILTERS)) ||
                                                                    !(b = malloc(chunk + 4 * MAX_FILTERS))))))
                goto nomem;   /* a and b: what a codec decodes into */
            uint32_t got_mask = 0;
            if (H5Dread_chunk(ds, H5P_DEFAULT, o, &got_mask, raw) < 0) {
                rc = fail(&c, o, rank, "cannot be read (truncated or corrupt file)");
                break;
            }
            /* undo the filters, last applied first */
            const uint8_t *cur = raw;
            size_t len = (size_t)size;
            int fl_left = nflet;
            for (int i = nf - 1; i >= 0 && rc == 0; i--) {
                if (mask & (1u << i)) continue;
                if (ids[i] == H5Z_FILTER_FLETCHER32) {
                    fl_left--;
                    if (len < 4) rc = fail(&c, o, rank, "is too short for its fletcher32 checksum (%zu bytes)", len);
                    else if (!act_ep_fletcher32_ok(cur, len))
                        rc = fail(&c, o, rank, "does not match its fletcher32 checksum");
                    else len -= 4;
                } else if (ids[i] == H5Z_FILTER_DEFLATE || ids[i] == ACT_EP_FILTER_LZF) {
                    size_t want = chunk + 4 * (size_t)fl_left;   /* what the earlier filters leave */
                    uint8_t *dst = cur == a ? b : a;
                    size_t got = 0;
                    int lzf = ids[i] == ACT_EP_FILTER_LZF;
                    int v = lzf ? act_ep_lzf_decode(cur, len, dst, want, &got) : INF_BAD_DATA;
#if defined(ACT_WITH_LIBDEFLATE) || defined(ACT_WITH_ZLIB)
                    if (!lzf) v = act_ep_inflate_one(dec, cur, len, dst, want, &got);
#endif   /* else not reached for gzip: such a build checks no gzip chunk */
                    if (v == INF_TOO_LONG)
                        rc = fail(&c, o, rank, "%s to more than the %zu bytes of a chunk", lzf ? "decodes" : "inflates",
                                  want);
                    else if (v == INF_NOMEM)
                        goto nomem;
                    else if (v != INF_OK)
                        rc = fail(&c, o, rank, "is not a valid %s stream (%zu compressed bytes)", lzf ? "LZF" : "gzip",
                                  len);
                    cur = dst;
                    len = got;
                }   /* shuffle: same length */
            }
            if (rc == 0 && len != chunk)
                rc = fail(&c, o, rank, "%s to %llu bytes, but a chunk holds %llu", has_deflate ? "inflates" : "decodes",
                          (unsigned long long)len,
                          (unsigned long long)chunk);
        }
        if (rc) break;
    next:;
        int i = rank - 1;   /* the next chunk's coordinates */
        while (i >= 0 && (o[i] += cd[i]) >= dims[i]) o[i--] = 0;
        if (i < 0) break;
    }
    goto out;
nomem:
    snprintf(err, errlen, "%s: dataset '%s': out of memory checking its chunks", path, name);
    rc = -2;
out:
#ifdef ACT_WITH_LIBDEFLATE
    if (dec) libdeflate_free_decompressor(dec);
#endif
    free(raw);
    free(a);
    free(b);
    free(probe);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (rc == 0) H5Eclear2(H5E_DEFAULT);
    return rc;
}

int act_ep_check_sums(hid_t ds, const act_ep_index *ix, const char *path, const char *name, char *err,
                      size_t errlen) {
    char *e = act_ep_has_filter(ds, H5Z_FILTER_FLETCHER32) ? malloc(errlen ? errlen : 1) : NULL;
    int rc = e ? act_ep_check_chunks(ds, ix, path, name, ACT_EP_CHECK_SUMS, e, errlen ? errlen : 1) : 0;
    if (rc == -1) snprintf(err, errlen, "%s", e);   /* a chunk named (not out of memory: -2) */
    free(e);
    return rc == -1 ? -1 : 0;
}

#elif defined(ACT_WITH_HDF5)

int act_ep_check_chunks(hid_t ds, const act_ep_index *ix, const char *path, const char *name, int mode,
                        char *err, size_t errlen) {
    (void)ds, (void)ix, (void)path, (void)name, (void)mode, (void)err, (void)errlen;
    return 0;   /* HDF5 older than 1.10.5: no chunk index queries */
}

int act_ep_check_sums(hid_t ds, const act_ep_index *ix, const char *path, const char *name, char *err,
                      size_t errlen) {
    (void)ds, (void)ix, (void)path, (void)name, (void)err, (void)errlen;
    return 0;
}

#endif
