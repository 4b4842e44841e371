/* episode_check.h - every stored chunk of an episode's dataset checked for its size before HDF5
 * reads it.
 * defines: act_ep_check_chunks, act_ep_check_sums
 *
 * HDF5 1.10 copies a whole chunk's bytes out of whatever its filter pipeline returned, and out of
 * an unfiltered chunk's stored bytes, without comparing the two sizes: a gzip chunk that inflates
 * to half a frame, or an unfiltered chunk stored short (another one long by as much, so their sum
 * looks right), makes H5Dread read past its own buffer (heap garbage as input, or a crash; review
 * of 2026-12-04). So at open, for a chunked dataset: its filters must be ones whose output size
 * can be checked (gzip, h5py's lzf, shuffle, fletcher32; any other is refused by name), every unfiltered
 * chunk must store exactly one chunk's bytes, and every compressed chunk is fetched raw
 * (H5Dread_chunk) and undone here - fletcher32 checks and strips its 4 bytes, gzip or lzf decodes,
 * shuffle keeps the length - to exactly one chunk's bytes. Chunks that episode_inflate.c will inflate itself
 * (gzip chunks, whole frames or tiles, stored with every filter applied) are checked there as
 * they are read, so the caller may leave them out here (unless one chunk sends its read window
 * to HDF5: stored with a filter skipped, or 0 bytes in the index, which the inflater takes for
 * unallocated; then all are checked here); episode.c's own reads at open go the same way
 * (checked_read). Chunks are found in the chunk table read at open (episode_index.h), else by
 * their coordinates in the index, or in a filtered dataset of 4096 chunks or more by their
 * stored size and raw bytes: HDF5 1.10 walks the whole index for each lookup by coordinates
 * (76800 gzip tiles: 123 s, then 0.2 s by size; 21504 raw tiles of (1, 8, 8, 1) a camera:
 * 13.9 s, 0.16 s from the table). */
#ifndef ACT_EPISODE_CHECK_H
#define ACT_EPISODE_CHECK_H

#include <stddef.h>

#ifdef ACT_WITH_HDF5
#include <hdf5.h>
#include "episode_index.h"

/* act_ep_check_chunks' modes (bits) */
enum {
    ACT_EP_CHECK_SKIP_POOL = 1,   /* filtered chunks whose filter mask is 0 are not decoded here
                                     (episode_inflate.c checks them), unless some chunk has a
                                     filter mask or 0 stored bytes (above) */
    ACT_EP_CHECK_SUMS = 2         /* chunks with a live fletcher32 and no codec are fetched and
                                     their checksums checked too (else their size says enough) */
};
/* 0, or -1 with err naming path, the dataset and the chunk (or a filter refused), -2 with err
 * saying memory ran out; mode: ACT_EP_CHECK_* bits, 0 for the open's check of a dataset HDF5
 * reads. Does nothing for a
 * layout that is not chunked, or with an HDF5 older than 1.10.5 (no chunk index queries); the
 * size checks of filtered chunks need zlib or libdeflate in the build. ix: the dataset's chunk
 * table (episode_index.h), where the chunks are found without asking HDF5; NULL or empty: HDF5's
 * lookups. */
int act_ep_check_chunks(hid_t ds, const act_ep_index *ix, const char *path, const char *name, int mode,
                        char *err, size_t errlen);
/* After HDF5 failed to read dataset ds: when it is stored with fletcher32, every chunk's checksum
 * is checked (act_ep_check_chunks with ACT_EP_CHECK_SUMS: the whole dataset is read and every
 * compressed chunk decoded again, seconds for a long episode, on this error path only), and -1
 * with err naming the first chunk that check refuses, for its checksum or anything else (HDF5 1.14
 * says only "filter returned failure during read"); else 0 with err untouched (no checksums, no
 * chunk refused, chunks over 1 GiB, or out of memory). */
int act_ep_check_sums(hid_t ds, const act_ep_index *ix, const char *path, const char *name, char *err,
                      size_t errlen);
#endif

#endif
