/* episode_direct.h - frames of uncompressed camera datasets read with pread on several threads.
 * defines: act_ep_direct, ACT_EP_CHUNK_INFO, act_ep_pread_on, act_ep_pread, act_ep_direct_probe,
 *          act_ep_chunk_place, act_ep_chunk_at, act_ep_read_direct
 *
 * HDF5 reads a hyperslab on the calling thread: for raw frames that is one copy out of the page
 * cache at ~5.5 GB/s on one core (bench/NOTES.md), ~6-9k timesteps of three 256x256 frames per
 * second, well under what a GPU takes in batch evaluation. A dataset stored without filters,
 * either contiguous or chunked in whole frames, has each frame at a known place in the file, so
 * the frames of a read are copied by pread straight into the caller's buffer on the episode pool's
 * threads (act_ep_pool_run). HDF5 still says where: H5Dget_offset for a contiguous dataset, and
 * for a chunked one the chunk table read at open (episode_index.h, checked against HDF5 there),
 * or else H5Dget_chunk_info_by_coord once per chunk per read (episode.c reads the first and last
 * frames both ways before it trusts the addresses). Anything else (filters,
 * external storage, another file driver, unallocated chunks) takes HDF5's own path (episode.c). */
#ifndef ACT_EPISODE_DIRECT_H
#define ACT_EPISODE_DIRECT_H

#include <stddef.h>
#include <stdint.h>

#ifdef ACT_WITH_HDF5
#include "episode_index.h"
#endif

typedef struct act_ep_direct {
    uint64_t base;   /* k == 0: the file offset of frame 0 (contiguous); k > 0: what to add to
                        HDF5's chunk addresses (HDF5 1.10 gives them from the end of the user
                        block, while H5Dget_offset counts from the start of the file) */
    int k;           /* > 0: chunks of k whole frames, no filters */
#ifdef ACT_WITH_HDF5
    const act_ep_index *ix;   /* k > 0: the chunk table read at open, or NULL (HDF5's lookups) */
#endif
} act_ep_direct;

/* 0 when ACT_EPISODE_PREAD=0: frames (and gzip chunks) are then read through HDF5 alone, for
 * comparisons; else 1 */
int act_ep_pread_on(void);

/* n bytes at file offset off into p, by pread (EINTR retried): the bytes read, n or fewer with
 * errno set (0 when the file ended first) */
size_t act_ep_pread(int fd, uint8_t *p, size_t n, uint64_t off);

#ifdef ACT_WITH_HDF5
#include <hdf5.h>
#define ACT_EP_CHUNK_INFO H5_VERSION_GE(1, 10, 5)   /* H5Dget_chunk_info_by_coord */

/* 1: the (T, H, W, 3) uint8 dataset `ds` of `file` (opened by HDF5's default sec2 driver, whose
 * addresses are offsets into the one file: episode.c has checked) can be read directly (d
 * filled); 0: it cannot,
 * or a contiguous dataset's frames would pass the end of the file (file_size): HDF5 then reads it
 * and reports what is wrong. filtered = 1: the dataset's chunks are compressed (gzip, read by
 * episode_inflate.c): d locates the compressed chunks instead, which pread then fetches on the
 * inflating threads. */
int act_ep_direct_probe(hid_t file, hid_t ds, int T, int H, int W, uint64_t file_size, int filtered,
                        act_ep_direct *d);

/* Where dataset ds's chunk at coordinates o is stored: found in the chunk table ix, else (NULL)
 * asked of HDF5's index; base is added to its address. *off its file offset, *size its stored
 * bytes, *mask its skipped filters. 0; 1: not stored (HDF5 fills it), or no table and HDF5
 * 1.10.5's chunk index missing; -1: it lies past the end of the file (no message: the caller
 * names the chunk). *file_size is taken again from fd first when the chunk seems past it (the
 * file may have grown since the open). */
int act_ep_chunk_place(const act_ep_index *ix, hid_t ds, uint64_t base, int fd, uint64_t *file_size,
                       const hsize_t o[4], uint64_t *off, uint64_t *size, unsigned *mask);

/* act_ep_chunk_place for the chunk holding timestep t, through locator d (k > 0: its table and
 * base), with err naming dataset and timestep on -1. Shared by the raw and the gzip readers. */
int act_ep_chunk_at(const act_ep_direct *d, int fd, uint64_t *file_size, hid_t ds, const char *path,
                    const char *name, int t, uint64_t *off, uint64_t *size, unsigned *mask, char *err,
                    size_t errlen);

/* Frames [t0, t0 + n) of the dataset into dst, by pread on fd (the episode's file). 0: done;
 * -1: error in err (file, dataset, frames: a short read is a truncated file); 1: a chunk this path
 * does not handle (unallocated, or not k frames of raw bytes): use H5Dread. */
int act_ep_read_direct(const act_ep_direct *d, int fd, uint64_t file_size, hid_t ds, const char *path,
                       const char *name, int t0, int n, size_t frame, uint8_t *dst, char *err,
                       size_t errlen);
#endif

#endif
