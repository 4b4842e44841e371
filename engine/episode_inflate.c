/* episode_inflate.c - gzip frame chunks inflated on the pool's threads (design: episode_inflate.h).
 * defines: act_ep_scratch_free, act_ep_inflate_threads, act_ep_pool_run, act_ep_inflater,
 *          act_ep_inflater_check, act_ep_frame_chunk, act_ep_pool_chunk, act_ep_read_pool,
 *          act_ep_inflate_one
 *
 * A read of frames [t0, t0 + n) covers chunks first..last. Their compressed bytes are read one by
 * one through HDF5 (the library is not thread-safe; this is I/O only), side by side in one
 * scratch buffer; then each chunk is inflated on a pool thread, straight into the caller's
 * buffer when the chunk lies inside the window, else into scratch and the frames inside the window
 * copied out. Every size is checked before it is used: a chunk that claims more bytes than a
 * compressed chunk can take, or inflates to another size than k frames, is an error naming the
 * timestep, as is the inflater's own verdict (bad data, bad checksum).
 *
 * The inflater is libdeflate when the build found it (whole-buffer decompression, 2.3-3.3x
 * zlib's speed on 256x256 frames: bench/NOTES.md), else zlib; ACT_EPISODE_INFLATE=zlib picks zlib
 * in a libdeflate build (for comparisons). Both check the stream's Adler-32.
 *
 * Uncompressed tiles go the same way without the inflate: their bytes, fetched the same way, are
 * scattered into the window straight from the fetch buffer (or copied into the row kept). */
#define _POSIX_C_SOURCE 200809L
#include "episode_inflate.h"
#include "episode_direct.h"
#include "episode_fletcher.h"
#include "episode_lzf.h"
#include "cpu_ops.h"   /* ACT_CPU_VEC_CLONES */

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


void act_ep_rowcache_free(act_ep_rowcache *r) {
    free(r->buf[0]);
    free(r->buf[1]);
    memset(r, 0, sizeof *r);
}

void act_ep_scratch_free(act_ep_scratch *s) {
    free(s->raw);
    free(s->tmp);
    free(s->thr);
    memset(s, 0, sizeof *s);
}

int act_ep_inflate_threads(void) {
    static int n = 0;
    if (!n) n = act_pool_env_threads("ACT_EPISODE_THREADS", act_pool_cores() < 8 ? act_pool_cores() : 8);
    return n;
}

int act_ep_pool_on(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("ACT_EPISODE_THREADS");
        on = !(e && strtol(e, NULL, 10) == 1 && act_ep_inflate_threads() == 1);
    }
    return on;
}

static act_pool *g_pool;
static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;

void act_ep_pool_run(act_pool_task fn, void *arg, int items) {
    pthread_mutex_lock(&g_pool_mu);
    if (!g_pool) g_pool = act_pool_create(act_ep_inflate_threads());
    act_pool_run(g_pool, fn, arg, items);
    pthread_mutex_unlock(&g_pool_mu);
}

const char *act_ep_inflater(void) {
#if defined(ACT_WITH_HDF5) && (defined(ACT_WITH_ZLIB) || defined(ACT_WITH_LIBDEFLATE))
    const char *e = getenv("ACT_EPISODE_INFLATE");
#ifdef ACT_WITH_LIBDEFLATE
    if (!e || !*e || !strcmp(e, "libdeflate")) return "libdeflate";
#endif
#ifdef ACT_WITH_ZLIB
    if (!e || !*e || !strcmp(e, "zlib")) return "zlib";
#endif
    return NULL;   /* a name this build does not have */
#else
    return "hdf5";
#endif
}

int act_ep_inflater_check(char *err, size_t errlen) {
    if (act_ep_inflater()) return 0;
    snprintf(err, errlen, "ACT_EPISODE_INFLATE='%s' names no inflater of this build: it has %s",
             getenv("ACT_EPISODE_INFLATE"),
#if defined(ACT_WITH_LIBDEFLATE) && defined(ACT_WITH_ZLIB)
             "libdeflate and zlib"
#elif defined(ACT_WITH_LIBDEFLATE)
             "libdeflate only"
#else
             "zlib only"
#endif
    );
    return -1;
}

#ifdef ACT_WITH_HDF5
int act_ep_frame_chunk(hid_t dcpl, int H, int W) {
    hsize_t cd[4];
    if (H5Pget_layout(dcpl) != H5D_CHUNKED || H5Pget_chunk(dcpl, 4, cd) != 4 || cd[1] != (hsize_t)H ||
        cd[2] != (hsize_t)W || cd[3] != 3 || cd[0] < 1 || cd[0] > (1u << 20))
        return 0;
    return (int)cd[0];
}

int act_ep_has_filter(hid_t ds, H5Z_filter_t id) {
    hid_t dcpl = H5Dget_create_plist(ds);
    unsigned flags = 0, cd[8];
    size_t n = 8;
    int has = dcpl >= 0 && H5Pget_filter_by_id2(dcpl, id, &flags, &n, cd, 0, NULL, NULL) >= 0;
    if (dcpl >= 0) H5Pclose(dcpl);
    H5Eclear2(H5E_DEFAULT);
    return has;
}
#endif

#if defined(ACT_WITH_HDF5) && (defined(ACT_WITH_ZLIB) || defined(ACT_WITH_LIBDEFLATE))
#ifdef ACT_WITH_ZLIB
#include <zlib.h>
#endif
#ifdef ACT_WITH_LIBDEFLATE
#include <libdeflate.h>
#endif

#define MAX_CHUNK_BYTES ((size_t)32 << 20)
#define MAX_TILE_BYTES ((size_t)4 << 20)    /* a tile (part of a frame): one per pool thread */
#define MAX_ROW_BYTES ((size_t)64 << 20)    /* a row of tiles kept for the next window */

/* the most chunk bytes one read holds (256 MiB; ACT_EPISODE_READ_MIB sets another, for tests): a
 * longer window is read in parts, and a dataset one row of whose chunks (every chunk of the same
 * first timestep) is larger is left to HDF5 from the open on, checked there. Long tiles such as
 * (1000, 16, 16, 1) of 480x640 frames would otherwise fetch ~0.9 GB for every window. */
static double max_read_bytes(void) {
    const char *e = getenv("ACT_EPISODE_READ_MIB");
    long v = e ? strtol(e, NULL, 10) : 0;
    return (double)(v > 0 && v < (1L << 20) ? v : 256) * (1 << 20);
}

/* the bytes of one row of chunks of shape c (t, y, x, c) over (H, W, 3) frames, edge tiles whole */
static double row_bytes_of(const int *c, int H, int W) {
    return (double)c[0] * c[1] * c[2] * c[3] * (double)((H + c[1] - 1) / c[1]) * ((W + c[2] - 1) / c[2]) *
           ((3 + c[3] - 1) / c[3]);
}

int act_ep_pool_chunk(hid_t ds, int H, int W, int cd[4], int *fletcher) {
    int kind = ACT_EP_POOL_NONE;
    *fletcher = 0;
    hsize_t c[4];
    hid_t dcpl = H5Dget_create_plist(ds), type = H5Dget_type(ds);
    if (dcpl < 0 || type < 0 || H5Pget_layout(dcpl) != H5D_CHUNKED || H5Pget_chunk(dcpl, 4, c) != 4) goto out;
    /* the pool copies the stored bytes: a 1-byte type with fewer bits, or bits at an offset, is
     * converted by HDF5's read (a 4-bit value at offset 2 is stored as 60 and read as 15) */
    if (H5Tget_precision(type) != 8 || H5Tget_offset(type) != 0) goto out;
    double bytes = 1;
    for (int i = 0; i < 4; i++) bytes *= (double)c[i];
    int whole = c[1] == (hsize_t)H && c[2] == (hsize_t)W && c[3] == 3;
    if (c[0] < 1 || c[1] < 1 || c[2] < 1 || c[3] < 1 || c[1] > (hsize_t)H || c[2] > (hsize_t)W || c[3] > 3 ||
        c[0] > (1u << 20) || bytes > (double)MAX_CHUNK_BYTES || (!whole && bytes > (double)MAX_TILE_BYTES))
        goto out;
    int ci[4] = {(int)c[0], (int)c[1], (int)c[2], (int)c[3]};
    if (row_bytes_of(ci, H, W) > max_read_bytes()) goto out;
    int nf = H5Pget_nfilters(dcpl), deflate = 0, lzf = 0, f32 = 0, other = 0;
    if (nf < 0 || nf > 3) goto out;
    for (int i = 0; i < nf; i++) {   /* gzip or lzf, perhaps shuffle: of 1-byte pixels it moves nothing */
        unsigned flags, cdv[8] = {0};
        size_t ncd = 8;
        char fname[64];
        H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cdv, sizeof fname, fname, NULL);
        if (id == H5Z_FILTER_DEFLATE) deflate++;
        else if (id == ACT_EP_FILTER_LZF) lzf++;
        else if (id == H5Z_FILTER_FLETCHER32 && i == nf - 1) f32++;   /* applied last: checked first */
        else if (!(id == H5Z_FILTER_SHUFFLE && (ncd < 1 || cdv[0] == 1))) other++;
    }
    unsigned copts = 0;   /* edge chunks stored unfiltered: HDF5's path reads those */
    if (nf > 0 && H5Pget_chunk_opts(dcpl, &copts) >= 0 && (copts & H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS)) other++;
    if (deflate + lzf == 0) {
        /* raw (shuffle aside): tiles are the pool's, whole frames episode_direct.c's (pread),
         * unless they carry checksums (pread cannot check them: the pool's then). H5Dread_chunk
         * writes a chunk's stored size, which only the open's check (episode_check.c, HDF5
         * 1.10.5 on) holds to one chunk: without it they stay HDF5's */
        if (ACT_EP_CHUNK_INFO && (!whole || f32) && !other && H5Pget_external_count(dcpl) == 0)
            kind = ACT_EP_POOL_RAW;
    } else if (deflate + lzf == 1 && !other) {
        kind = deflate ? ACT_EP_POOL_GZIP : ACT_EP_POOL_LZF;
    }
    if (kind) {
        *fletcher = f32;
        for (int i = 0; i < 4; i++) cd[i] = (int)c[i];
    }
out:
    if (dcpl >= 0) H5Pclose(dcpl);
    if (type >= 0) H5Tclose(type);
    H5Eclear2(H5E_DEFAULT);
    return kind;
}

enum {
    INF_SHORT_READ = INF_NOMEM + 1,   /* verdicts of the pool's fetch, before any inflate: a short pread */
    INF_BAD_SUM                       /* a fletcher32 checksum that does not match */
};

typedef struct chunk_job {
    uint8_t *src;             /* the compressed bytes (scratch) */
    size_t src_len;
    size_t src_off;           /* where src lies in the scratch (set as the sizes are summed) */
    uint64_t file_off;        /* with a locator: where they are in the file (pread by the task) */
    int read_errno;           /* INF_SHORT_READ: pread's errno (0: the file ended) */
    uint8_t *dst;             /* the window (whole chunk inside it), scratch, a row kept, or NULL:
                                 a tile inflated into its thread's scratch */
    int cached;               /* 1: a tile of a row kept from the last read, at dst (nothing to fetch) */
    int o[4];                 /* the chunk's origin (t, y, x, c) */
    int partial;              /* 1: only part of it is in the window (dst is scratch) */
    int direct;               /* 1: raw whole frames with a checksum, all inside the window: pread
                                 straight into dst (the checksum after them read apart), no scratch */
    int verdict;              /* INF_* */
    size_t got;               /* bytes it inflated to */
} chunk_job;

typedef struct inflate_job {
    chunk_job *c;
    size_t want;              /* a chunk's bytes */
    int libdeflate;
    int raw;                  /* 1: uncompressed tiles: src is the tile itself */
    int fd;                   /* < 0: src already read */
    const int *cd;            /* the chunk shape (t, y, x, c) */
    int tiles;                /* 1: chunks are tiles, each group copied into the window by scatter */
    int nc;                   /* chunks per group: 1, or the tiles of one (t, y, x) across channels */
    int H, W, t0, n;          /* tiles: the window [t0, t0 + n) of (T, H, W, 3) frames in out */
    uint8_t *out, *thr;       /* tiles: the window; one chunk's scratch per pool thread */
    int lzf;                  /* 1: h5py's lzf chunks (episode_lzf.h), not gzip */
    int fletcher;             /* 1: each stored chunk ends in a fletcher32 checksum (episode_fletcher.h) */
} inflate_job;

/* The part inside the window of a group of tiles - the nc tiles of one (t, y, x) origin, one per
 * channel range, inflated at src[0..nc) - written to where it belongs there. A group at a time, so
 * each byte of the window is written in one pass, in order: tiles of one channel (h5py's
 * (k, 32, 32, 1)) copied alone wrote every third byte, three passes over the same lines, and took
 * a quarter of the reader's time. */
/* n pixels from three planes. Built for AVX2 and AVX-512 too (cpu_ops.h): the compilers interleave
 * with byte shuffles there, 2.5x the baseline's byte stores (14 against 5.6 GB/s on rows of 32 in
 * cache, this VM), and this loop was the uncompressed tiles' largest cost. */
ACT_CPU_VEC_CLONES
static void planes_to_pixels(uint8_t *restrict d, const uint8_t *restrict r, const uint8_t *restrict g,
                             const uint8_t *restrict b, int n) {
    for (int x = 0; x < n; x++) {
        d[3 * x] = r[x];
        d[3 * x + 1] = g[x];
        d[3 * x + 2] = b[x];
    }
}

static void scatter(const inflate_job *q, const chunk_job *c, uint8_t *const *src) {
    const int *cd = q->cd, *o = c->o, nc = q->nc;
    int ta = o[0] < q->t0 ? q->t0 : o[0], tb = o[0] + cd[0] < q->t0 + q->n ? o[0] + cd[0] : q->t0 + q->n;
    int hb = o[1] + cd[1] <= q->H ? cd[1] : q->H - o[1];   /* edge tiles hang over the frame */
    int wb = o[2] + cd[2] <= q->W ? cd[2] : q->W - o[2];
    for (int t = ta; t < tb; t++)
        for (int y = 0; y < hb; y++) {
            size_t at = (((size_t)(t - o[0]) * cd[1] + y) * cd[2]) * cd[3];   /* the row in each tile */
            uint8_t *d = q->out + (((size_t)(t - q->t0) * q->H + o[1] + y) * q->W + o[2]) * 3;
            if (nc == 1) {   /* all three channels in one tile */
                memcpy(d, src[0] + at, (size_t)wb * 3);
            } else if (nc == 3) {   /* one channel per tile: planes to pixels */
                planes_to_pixels(d, src[0] + at, src[1] + at, src[2] + at, wb);
            } else {   /* two channels per tile: (0, 1) and (2) */
                for (int x = 0; x < wb; x++)
                    for (int ch = 0; ch < 3; ch++)
                        d[3 * x + ch] = src[ch / cd[3]][at + (size_t)x * cd[3] + ch % cd[3]];
            }
        }
}

#ifdef ACT_WITH_LIBDEFLATE
/* one decompressor per pool thread (index = the pool's thread number), made at its first use and
 * kept: act_ep_pool_run serializes the pool's runs, so a thread's slot is only its own */
static struct libdeflate_decompressor *g_dec[ACT_POOL_MAX_THREADS];
#endif

int act_ep_inflate_one(void *dec, const uint8_t *in, size_t in_len, uint8_t *out, size_t cap, size_t *got) {
    *got = 0;
#ifdef ACT_WITH_LIBDEFLATE
    if (dec) {
        enum libdeflate_result r = libdeflate_zlib_decompress(dec, in, in_len, out, cap, got);
        return r == LIBDEFLATE_SUCCESS ? INF_OK : r == LIBDEFLATE_INSUFFICIENT_SPACE ? INF_TOO_LONG : INF_BAD_DATA;
    }
#endif
#ifdef ACT_WITH_ZLIB
    uLongf len = (uLongf)cap;
    int z = uncompress(out, &len, in, (uLong)in_len);
    *got = (size_t)len;
    return z == Z_OK ? INF_OK : z == Z_BUF_ERROR ? INF_TOO_LONG : z == Z_MEM_ERROR ? INF_NOMEM : INF_BAD_DATA;
#else
    (void)in, (void)in_len, (void)out, (void)cap;
    return INF_BAD_DATA;   /* libdeflate only, and no decompressor given */
#endif
}

/* Items are groups of q->nc chunks (a tile per channel range, or a whole-frame chunk alone): each
 * fetched if a locator gave its place, inflated (into its dst, else its thread's scratch; a raw
 * tile is its fetched bytes, copied only into a row kept; raw whole frames inside the window are
 * fetched into it), and a group of tiles whose every chunk came to exactly one chunk copied into
 * the window. */
static void inflate_task(void *arg, int th, int lo, int hi) {
    inflate_job *q = arg;
    for (int g = lo; g < hi; g++) {
        uint8_t *bufs[3];
        int ok = 1;
        for (int j = 0; j < q->nc; j++) {
            chunk_job *c = &q->c[g * q->nc + j];
            uint8_t *dst = bufs[j] = c->dst ? c->dst
                                   : q->raw ? c->src : q->thr + ((size_t)th * q->nc + j) * q->want;
            if (c->cached) {
                c->verdict = INF_OK;
                c->got = q->want;
                continue;
            }
            if (c->direct) {   /* the frames into the window, then their checksum beside them */
                uint8_t sum[4];
                if (act_ep_pread(q->fd, dst, q->want, c->file_off) < q->want ||
                    act_ep_pread(q->fd, sum, 4, c->file_off + q->want) < 4) {
                    c->read_errno = errno;
                    c->verdict = INF_SHORT_READ;
                    ok = 0;
                    continue;
                }
                c->verdict = act_ep_fletcher32_matches(dst, q->want, sum) ? INF_OK : INF_BAD_SUM;
                c->got = q->want;
                ok &= c->verdict == INF_OK;
                continue;
            }
            if (q->fd >= 0 && act_ep_pread(q->fd, c->src, c->src_len, c->file_off) < c->src_len) {
                c->read_errno = errno;
                c->verdict = INF_SHORT_READ;
                ok = 0;
                continue;
            }
            size_t len = c->src_len;   /* the bytes the earlier filters made */
            if (q->fletcher) {
                if (!act_ep_fletcher32_ok(c->src, len)) {
                    c->verdict = INF_BAD_SUM;
                    ok = 0;
                    continue;
                }
                len -= 4;
            }
            if (q->raw) {   /* scattered from the fetched bytes; copied only into a row kept */
                c->verdict = INF_OK;
                c->got = len;
                ok &= c->got == q->want;
                if (c->got == q->want && c->dst) memcpy(dst, c->src, q->want);
                continue;
            }
            void *dec = NULL;
#ifdef ACT_WITH_LIBDEFLATE
            if (q->libdeflate && !g_dec[th] && !(g_dec[th] = libdeflate_alloc_decompressor())) {
                c->verdict = INF_NOMEM;
                ok = 0;
                continue;
            }
            if (q->libdeflate) dec = g_dec[th];
#endif
            c->verdict = q->lzf ? act_ep_lzf_decode(c->src, len, dst, q->want, &c->got)
                                : act_ep_inflate_one(dec, c->src, len, dst, q->want, &c->got);
            ok &= c->verdict == INF_OK && c->got == q->want;
        }
        if (q->tiles && ok) scatter(q, &q->c[g * q->nc], bufs);
    }
}

static int grow(uint8_t **p, size_t *cap, size_t want) {
    if (want <= *cap) return 0;
    uint8_t *q = realloc(*p, want);
    if (!q) return -1;
    *p = q;
    *cap = want;
    return 0;
}

/* the most chunks one read inflates at once (their job records: ~23 MiB); ACT_EPISODE_TILE_JOBS
 * sets another (tests) */
static int max_jobs(void) {
    const char *e = getenv("ACT_EPISODE_TILE_JOBS");
    long v = e ? strtol(e, NULL, 10) : 0;
    return v > 0 && v < (1L << 24) ? (int)v : 1 << 18;
}

/* "timestep 50" for a chunk of whole frames, "(50, 32, 64, 1)" (t, y, x, c) for a tile */
static const char *where(char *buf, size_t len, const int *o, int whole) {
    if (whole) snprintf(buf, len, "timestep %d", o[0]);
    else snprintf(buf, len, "(%d, %d, %d, %d)", o[0], o[1], o[2], o[3]);
    return buf;
}

/* -1, err naming a raw chunk that stores `size` bytes where it should hold `want` */
static int stored_size_error(const char *path, const char *name, const int *o, int whole, uint64_t size, size_t want,
                             char *err, size_t errlen) {
    char at[64];
    snprintf(err, errlen, "%s: dataset '%s': the chunk at %s stores %llu bytes, but a chunk holds %zu (damaged file)",
             path, name, where(at, sizeof at, o, whole), (unsigned long long)size, want);
    return -1;
}

int act_ep_read_pool(hid_t ds, int kind, int fletcher, const int cd[4], int H, int W, const act_ep_direct *loc,
                     const act_ep_index *ix, int fd, uint64_t file_size, const char *path, const char *name, int t0,
                     int n, uint8_t *dst, act_ep_scratch *s, act_ep_rowcache *rows, char *err, size_t errlen) {
    int raw = kind == ACT_EP_POOL_RAW, lzf = kind == ACT_EP_POOL_LZF, k = cd[0];
    int whole = cd[1] == H && cd[2] == W && cd[3] == 3;
    int nx = (W + cd[2] - 1) / cd[2], nc = (3 + cd[3] - 1) / cd[3];   /* tiles across, channel ranges */
    int per_t = ((H + cd[1] - 1) / cd[1]) * nx * nc;
    int first = t0 / k, last = (t0 + n - 1) / k;
    size_t frame = (size_t)H * W * 3, chunk_bytes = (size_t)cd[0] * cd[1] * cd[2] * cd[3];
    /* a window of more chunks than max_jobs() (tiny tiles, a long window), or of more bytes than
     * max_read_bytes(), is read in two halves, split at a chunk boundary: its job records and
     * buffers stay bounded, and their count an int */
    double rows_in = (double)last - first + 1;
    if (rows_in * per_t > (double)max_jobs() ||
        (rows_in > 1 && rows_in * row_bytes_of(cd, H, W) > max_read_bytes())) {
        if (last == first) {
            char fix[192];
            if (lzf)   /* h5repack has no lzf filter */
                snprintf(fix, sizeof fix, "with h5py, chunks=(1, %d, %d, 3) (h5repack cannot read lzf)", H, W);
            else
                snprintf(fix, sizeof fix, "h5repack -l %s:CHUNK=1x%dx%dx3 IN.hdf5 OUT.hdf5", name, H, W);
            snprintf(err, errlen, "%s: dataset '%s' is stored in %s tiles of (%d, %d, %d, %d): %d tiles for "
                     "every %d frames, more than the %d a read takes; re-save it with larger chunks, e.g. %s", path,
                     name, raw ? "uncompressed" : lzf ? "lzf" : "gzip", cd[0], cd[1], cd[2], cd[3], per_t, k,
                     max_jobs(), fix);
            return -1;
        }
        int mid = first + (last - first + 1) / 2, n1 = mid * k - t0;
        int r = act_ep_read_pool(ds, kind, fletcher, cd, H, W, loc, ix, fd, file_size, path, name, t0, n1, dst, s,
                                 rows, err, errlen);
        return r ? r : act_ep_read_pool(ds, kind, fletcher, cd, H, W, loc, ix, fd, file_size, path, name, mid * k,
                                        n - n1, dst + (size_t)n1 * frame, s, rows, err, errlen);
    }
    int nch = (last - first + 1) * per_t;
    size_t sum = fletcher ? 4 : 0;   /* a checksum's bytes after each stored chunk */
    size_t max_src = (raw ? chunk_bytes : chunk_bytes + (chunk_bytes >> 6) + 4096) + sum;
    const char *inflater = raw ? "raw" : lzf ? "lzf" : act_ep_inflater();
    const char *what = raw ? "chunk" : lzf ? "lzf chunk" : "gzip chunk";
    char at[64];
    if (!inflater) return act_ep_inflater_check(err, errlen);
    if (fd < 0 || !whole || raw || lzf) loc = NULL;   /* the locator finds whole-frame gzip chunks only */
    if (fd < 0 || loc || (ix && !ix->n)) ix = NULL;
    /* tiles: the first row may be kept from the last read (hit), the last one kept for the next
     * (keep: the window ends inside it), in the other of the two buffers */
    size_t row_bytes = (size_t)per_t * chunk_bytes;
    int hit = -1, keep = -1;
    if (rows && !whole && row_bytes <= MAX_ROW_BYTES) {
        for (int b = 0; b < 2; b++)
            if (rows->row1[b] == first * k + 1) hit = b;
        if ((last + 1) * k > t0 + n && !(hit >= 0 && last == first)) {
            keep = hit == 0 ? 1 : 0;
            rows->row1[keep] = 0;   /* filled below; valid once the read succeeds */
            if (grow(&rows->buf[keep], &rows->cap[keep], row_bytes)) keep = -1;
        }
    }
    chunk_job *c = calloc((size_t)nch, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "%s: out of memory reading '%s'", path, name);
        return -1;
    }
    int rc = 0, partial = 0;
    size_t off = 0;
    for (int i = 0; i < nch && rc == 0; i++) {   /* sizes first: one scratch block for all */
        uint64_t sz = 0;
        unsigned mask = 0;
        int r = i % per_t;
        c[i].o[0] = (first + i / per_t) * k;   /* chunks in storage order: t, y, x, c */
        c[i].o[1] = r / (nx * nc) * cd[1];
        c[i].o[2] = r / nc % nx * cd[2];
        c[i].o[3] = r % nc * cd[3];
        if (hit >= 0 && i < per_t) {   /* a tile of the row kept last time */
            c[i].cached = 1;
            c[i].dst = rows->buf[hit] + (size_t)r * chunk_bytes;
            continue;
        }
        if (loc) {   /* located through HDF5's chunk index; the task preads the bytes */
            rc = act_ep_chunk_at(loc, fd, &file_size, ds, path, name, c[i].o[0], &c[i].file_off, &sz, &mask, err,
                                 errlen);
        } else if (ix) {   /* found in the table read at open; the task preads the bytes */
            hsize_t o[4] = {(hsize_t)c[i].o[0], (hsize_t)c[i].o[1], (hsize_t)c[i].o[2], (hsize_t)c[i].o[3]};
            rc = act_ep_chunk_place(ix, ds, ix->base, fd, &file_size, o, &c[i].file_off, &sz, &mask);
            if (rc < 0)
                snprintf(err, errlen, "%s: dataset '%s': the %s at %s lies past the end of the file (truncated "
                         "file)", path, name, what, where(at, sizeof at, c[i].o, whole));
        } else {
            hsize_t o[4] = {(hsize_t)c[i].o[0], (hsize_t)c[i].o[1], (hsize_t)c[i].o[2], (hsize_t)c[i].o[3]}, hs = 0;
            rc = H5Dget_chunk_storage_size(ds, o, &hs) < 0 || hs == 0;   /* 1: unallocated, HDF5 fills */
            sz = (uint64_t)hs;
        }
        if (rc == 0 && mask) {
            rc = 1;   /* stored with its filter skipped: HDF5's path knows what to do */
        } else if (rc == 0 && raw && sz > max_src) {   /* a short one: below, once its mask is known */
            rc = stored_size_error(path, name, c[i].o, whole, sz, chunk_bytes + sum, err, errlen);
        } else if (rc == 0 && sz > max_src) {
            snprintf(err, errlen, "%s: dataset '%s': the %s at %s claims %llu bytes, "
                     "more than a chunk of %zu bytes can compress to (corrupt file)", path, name, what,
                     where(at, sizeof at, c[i].o, whole), (unsigned long long)sz, chunk_bytes);
            rc = -1;
        }
        c[i].src_len = (size_t)sz;
        c[i].partial = whole && (c[i].o[0] < t0 || c[i].o[0] + k > t0 + n);
        /* raw whole frames reach the pool only with checksums (act_ep_pool_chunk) */
        c[i].direct = raw && whole && fletcher && ix && !c[i].partial;   /* needs no scratch */
        c[i].src_off = off;
        off += c[i].direct ? 0 : (size_t)sz;
        partial += c[i].partial;
    }
    H5Eclear2(H5E_DEFAULT);
    int nthr = act_ep_inflate_threads();
    if (rc == 0 && (grow(&s->raw, &s->raw_cap, off) || grow(&s->tmp, &s->tmp_cap, (size_t)partial * chunk_bytes) ||
                    (!whole && !raw && grow(&s->thr, &s->thr_cap, (size_t)nthr * nc * chunk_bytes)))) {
        snprintf(err, errlen, "%s: out of memory reading '%s'", path, name);
        rc = -1;
    }
    int p = 0;
    for (int i = 0; i < nch && rc == 0; i++) {
        hsize_t o[4] = {(hsize_t)c[i].o[0], (hsize_t)c[i].o[1], (hsize_t)c[i].o[2], (hsize_t)c[i].o[3]};
        uint32_t mask = 0;
        if (c[i].cached) continue;
        c[i].src = c[i].direct ? NULL : s->raw + c[i].src_off;
        if (!loc && !ix && H5Dread_chunk(ds, H5P_DEFAULT, o, &mask, c[i].src) < 0) {   /* else the task preads */
            H5Eclear2(H5E_DEFAULT);
            snprintf(err, errlen, "%s: dataset '%s': the chunk at %s cannot be read "
                     "(truncated or corrupt file)", path, name, where(at, sizeof at, c[i].o, whole));
            rc = -1;
        } else if (mask) {
            rc = 1;   /* stored with its filter skipped: HDF5's path knows what to do */
        } else if (raw && c[i].src_len != chunk_bytes + sum) {
            /* every raw chunk's size, once its mask is known (the table's, above, or H5Dread_chunk's:
             * one of a chunk's bytes may be one stored with its checksum skipped); HDF5 1.10 says the
             * nominal size, but the open checked the stored ones */
            rc = stored_size_error(path, name, c[i].o, whole, c[i].src_len, chunk_bytes + sum, err, errlen);
        }
        if (!whole)   /* a tile: into the row kept for the next read, else its thread's scratch */
            c[i].dst = keep >= 0 && i >= nch - per_t ? rows->buf[keep] + (size_t)(i - (nch - per_t)) * chunk_bytes : NULL;
        else
            c[i].dst = c[i].partial ? s->tmp + (size_t)p++ * chunk_bytes : dst + (size_t)(c[i].o[0] - t0) * frame;
    }
    if (rc == 0) {
        inflate_job q = {c, chunk_bytes, !strcmp(inflater, "libdeflate"), raw, loc || ix ? fd : -1, cd, !whole,
                         whole ? 1 : nc, H, W, t0, n, dst, s->thr, lzf, fletcher};
        act_ep_pool_run(inflate_task, &q, nch / q.nc);
        for (int i = 0; i < nch && rc == 0; i++) {
            int v = c[i].verdict;
            if (v == INF_SHORT_READ) {
                snprintf(err, errlen, "%s: dataset '%s': the %s at %s cannot be read: %s",
                         path, name, what, where(at, sizeof at, c[i].o, whole), c[i].read_errno ? strerror(c[i].read_errno)
                         : "the file ends before it (truncated file)");
                rc = -1;
                break;
            }
            if (v == INF_BAD_SUM) {
                snprintf(err, errlen, "%s: dataset '%s': the %s at %s cannot be read: its fletcher32 checksum "
                         "does not match its bytes (corrupt file)", path, name, what,
                         where(at, sizeof at, c[i].o, whole));
                rc = -1;
                break;
            }
            if (v != INF_OK || c[i].got != chunk_bytes) {
                snprintf(err, errlen, "%s: dataset '%s': the %s at %s cannot be read: "
                         "%s (%s%s)", path, name, what, where(at, sizeof at, c[i].o, whole),
                         v == INF_NOMEM ? "out of memory" : "it is corrupt",
                         inflater, v == INF_NOMEM ? "" : v == INF_OK ? ": wrong size" : v == INF_BAD_DATA
                         ? ": bad data or checksum" : ": longer than the chunk");
                rc = -1;
                break;
            }
            if (c[i].partial) {   /* copy the frames inside the window */
                int a = c[i].o[0] < t0 ? t0 : c[i].o[0], b = c[i].o[0] + k > t0 + n ? t0 + n : c[i].o[0] + k;
                memcpy(dst + (size_t)(a - t0) * frame, c[i].dst + (size_t)(a - c[i].o[0]) * frame,
                       (size_t)(b - a) * frame);
            }
        }
    }
    if (rc == 0 && keep >= 0) rows->row1[keep] = last * k + 1;
    free(c);
    return rc;
}

#elif defined(ACT_WITH_HDF5)

int act_ep_pool_chunk(hid_t ds, int H, int W, int cd[4], int *fletcher) {
    (void)ds, (void)H, (void)W, (void)cd;
    *fletcher = 0;
    return ACT_EP_POOL_NONE;   /* built without zlib or libdeflate: HDF5's own path */
}

int act_ep_read_pool(hid_t ds, int kind, int fletcher, const int cd[4], int H, int W, const act_ep_direct *loc,
                     const act_ep_index *ix, int fd, uint64_t file_size, const char *path, const char *name, int t0,
                     int n, uint8_t *dst, act_ep_scratch *s, act_ep_rowcache *rows, char *err, size_t errlen) {
    (void)ds, (void)kind, (void)fletcher, (void)cd, (void)H, (void)W, (void)loc, (void)ix, (void)fd, (void)file_size;
    (void)path;
    (void)name, (void)t0;
    (void)n, (void)dst, (void)s, (void)rows;
    (void)err, (void)errlen;
    return 1;
}

#endif
