/* episode_inflate.h - gzip frame chunks of an episode decompressed on several threads.
 * defines: act_ep_scratch, act_ep_frame_chunk, act_ep_has_filter, act_ep_pool_chunk,
 *          act_ep_inflate_threads, act_ep_pool_run, act_ep_inflater, act_ep_inflater_check,
 *          act_ep_read_pool, act_ep_inflate_one,
 *          act_ep_scratch_free, act_ep_rowcache, act_ep_rowcache_free
 *
 * libhdf5 runs its deflate filter on the calling thread, one chunk after another, and at ~1-5 ms
 * per 256x256 frame triple that single thread caps batch evaluation at a few hundred timesteps per
 * second, far below a GPU's rate. For a camera dataset whose only filter is gzip (shuffle aside),
 * the raw chunks are read through HDF5 (H5Dread_chunk: I/O only) and inflated with libdeflate (or
 * zlib) on the engine's pool threads, whether a chunk holds whole frames or a tile of them (h5py's
 * automatic chunks, e.g. (50, 32, 32, 1), on which HDF5 itself ran at ~130 timesteps/s and
 * inflated a chunk that two reads share twice). Uncompressed tiles (the same automatic chunks of
 * a dataset stored without gzip) take the same path less the inflate: HDF5 scatters each tile's
 * bytes into interleaved pixels one byte at a time. A fletcher32 checksum after either (h5py's
 * `fletcher32=True`) is checked on the same threads (episode_fletcher.h). Anything else (edge
 * chunks stored unfiltered, ACT_EPISODE_THREADS=1) takes HDF5's own path (episode.c), after
 * episode_check.c checked every chunk's size. */
#ifndef ACT_EPISODE_INFLATE_H
#define ACT_EPISODE_INFLATE_H

#include <stddef.h>
#include <stdint.h>

#include "episode_direct.h"
#include "episode_verdict.h"
#include "pool.h"

typedef struct act_ep_scratch {   /* per open episode: reused across reads */
    uint8_t *raw, *tmp, *thr;     /* compressed bytes; partial whole-frame chunks; a tile per thread */
    size_t raw_cap, tmp_cap, thr_cap;
} act_ep_scratch;

void act_ep_scratch_free(act_ep_scratch *s);

/* Per camera of an open episode: the inflated tiles of up to two rows of tiles (every tile with
 * the same first timestep). A read whose window ends inside a row keeps that row, and the next
 * window, which starts in it, copies its part from here instead of fetching and inflating those
 * tiles again (eval reads windows of --batch timesteps in order; with h5py's 50-frame tiles and
 * windows of 64 that was about every second row read twice). */
typedef struct act_ep_rowcache {
    uint8_t *buf[2];
    size_t cap[2];
    int row1[2];                  /* the row's first timestep + 1; 0: empty */
} act_ep_rowcache;

void act_ep_rowcache_free(act_ep_rowcache *r);

/* ACT_EPISODE_THREADS, else the usable cores (at most 8) */
int act_ep_inflate_threads(void);
/* 0 when ACT_EPISODE_THREADS=1 asks for HDF5's own path always; else 1: the pool reads, with one
 * thread (inline) on a host of one usable core, where it still beats HDF5's path (each gzip chunk
 * inflated once, by libdeflate, instead of at open and again by HDF5's zlib; raw tiles copied
 * whole instead of scattered a byte at a time) */
int act_ep_pool_on(void);

/* runs fn over [0, items) on the episode readers' pool (act_ep_inflate_threads threads, made at
 * the first call), one run at a time; shared by the gzip path and episode_direct.c */
void act_ep_pool_run(act_pool_task fn, void *arg, int items);

/* the inflater those threads use: "libdeflate" (when built with it, unless ACT_EPISODE_INFLATE=zlib),
 * "zlib", "hdf5" (built with neither, or without HDF5); NULL when ACT_EPISODE_INFLATE names one
 * this build lacks (act_ep_read_pool then fails saying so) */
const char *act_ep_inflater(void);
/* 0, or -1 with err naming ACT_EPISODE_INFLATE's value and the inflaters this build has */
int act_ep_inflater_check(char *err, size_t errlen);

/* Inflates one zlib stream in[in_len] into out[cap]: by libdeflate with dec (a
 * libdeflate_decompressor, in builds with libdeflate), else by zlib; *got the inflated length.
 * INF_TOO_LONG when it needs more than cap. */
int act_ep_inflate_one(void *dec, const uint8_t *in, size_t in_len, uint8_t *out, size_t cap, size_t *got);

#ifdef ACT_WITH_HDF5
#include <hdf5.h>
/* k when the dataset creation list dcpl chunks (T, H, W, 3) frames as (k, H, W, 3), k whole frames
 * (1 <= k <= 2^20), whatever its filters; else 0 (shared by the gzip and the pread paths) */
int act_ep_frame_chunk(hid_t dcpl, int H, int W);
/* 1 when dataset ds is stored with HDF5 filter id (its error stack cleared either way) */
int act_ep_has_filter(hid_t ds, H5Z_filter_t id);
/* What the pool reads of a (T, H, W, 3) uint8 dataset (act_ep_pool_chunk). */
enum { ACT_EP_POOL_NONE, ACT_EP_POOL_GZIP, ACT_EP_POOL_RAW, ACT_EP_POOL_LZF };
/* ACT_EP_POOL_GZIP when the dataset is chunked with gzip alone (or gzip and shuffle, which leaves
 * 1-byte values where they are), whatever the chunk shape cd (t, y, x, c) - whole frames
 * (k, H, W, 3) of at most 32 MiB, or tiles such as h5py's automatic (50, 32, 32, 1) of at most
 * 4 MiB (each pool thread holds one); ACT_EP_POOL_LZF for the same with h5py's lzf in gzip's place
 * (episode_lzf.h); ACT_EP_POOL_RAW when it is chunked in tiles of at
 * most 4 MiB with no filter at all (h5py's automatic chunks of an uncompressed dataset, which
 * every resizable one is: a recorder that appends frames writes (64, 32, 32, 1); HDF5 copies
 * those into interleaved pixels a byte at a time, ~300 timesteps/s; shuffle may come with them),
 * or in tiles or whole frames with fletcher32; so act_ep_read_pool can read it. *fletcher = 1
 * when the last filter the writer applied (the first a read undoes) is fletcher32 (h5py's order:
 * shuffle, gzip or lzf, fletcher32), whose checksum the pool then checks before it decodes; a
 * fletcher32 anywhere else leaves the dataset to HDF5. ACT_EP_POOL_NONE: it cannot (also when
 * built without zlib and libdeflate, for raw tiles with HDF5 before 1.10.5, whose open cannot
 * check their stored sizes, for a 1-byte type of fewer than 8 bits or at an offset, which HDF5's
 * read converts, and when one row of chunks is
 * over the 256 MiB a read holds); raw whole frames without checksums are episode_direct.c's. cd
 * is set for every kind. */
int act_ep_pool_chunk(hid_t ds, int H, int W, int cd[4], int *fletcher);
/* Frames [t0, t0 + n) of an (T, H, W, 3) dataset with chunks cd of the given kind
 * (act_ep_pool_chunk) into dst. With a locator loc (episode_direct.h: the chunks' user-block
 * base, checked at open; whole-frame gzip chunks only) and the file's descriptor fd, each chunk's
 * compressed bytes are fetched by pread on the inflating thread itself; so are any chunk's (tiles
 * too, raw or gzip) found in the chunk table ix (episode_index.h; episode.c checked at open what
 * its addresses mean); without either (NULL), one by one through H5Dread_chunk first. A
 * whole-frame chunk inside the window inflates straight into dst; any other chunk into its
 * thread's scratch (or, for tiles, into rows: the window's last row when the window ends inside
 * it), whence the part inside the window is copied out. Raw tiles are copied into the window
 * from the bytes fetched (each of exactly one tile's size: episode_check.c checked every stored
 * size at open). With fletcher, each stored chunk's checksum is checked on the pool's thread
 * before anything else, and a chunk whose checksum does not match is an error naming it, as
 * HDF5's read fails on it. rows may be NULL (no reuse). A
 * window of more than 2^18 chunks (tiny tiles) is read in parts split at chunk boundaries; one
 * row of tiles past that is an error naming h5repack. 0: done; -1: error in err (file, dataset,
 * chunk); 1: a chunk this path does not handle (unallocated, or stored with its filter skipped):
 * use H5Dread. */
int act_ep_read_pool(hid_t ds, int kind, int fletcher, const int cd[4], int H, int W, const act_ep_direct *loc,
                     const act_ep_index *ix, int fd, uint64_t file_size, const char *path, const char *name, int t0,
                     int n, uint8_t *dst, act_ep_scratch *s, act_ep_rowcache *rows, char *err, size_t errlen);
#endif

#endif
