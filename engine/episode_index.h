/* episode_index.h - a chunked dataset's whole chunk index, read once at open.
 * defines: act_ep_index, ACT_EP_INDEX(_WALK, _ITER), act_ep_index_build, act_ep_index_at, act_ep_index_free
 *
 * HDF5 (1.10 and 1.14 alike) answers H5Dget_chunk_info_by_coord by walking the dataset's whole
 * chunk index, so a lookup costs ~20 ns per chunk stored: the open's size check of every chunk and
 * the readers' one lookup per chunk per read grow as the square of an episode's length (ACT's own
 * recorder's layout, one uncompressed frame per chunk: 700 steps read at 7000 timesteps/s against
 * 12000 contiguous, 2500 at 3600 against 8200). 1.10 has no public call that lists the chunks in
 * one pass, so there this reads the index from the file itself: the dataset's object header
 * (version 1 or 2) for its layout message (version 3, chunked), then the version 1 B-tree the
 * message names, node by node, into a table of every chunk's address, stored size and filter
 * mask. 1.10.10+, 1.12.3+ and 1.14+ list every chunk in one pass (H5Dchunk_iter, whatever the
 * index, layout version 4's arrays and version 2 B-trees included): there the table is filled
 * from that list.
 *
 * The table is an accelerator, never an authority: any structure the walk does not know (layout
 * version 4 indexes, another file driver, node types, levels that do not step down by one),
 * chunk offsets off the grid, out of order or repeated, chunks past the file's end, more chunks
 * than the grid holds give no table, and a table is kept only if HDF5 agrees with it: the same
 * number of chunks (H5Dget_num_chunks walks the tree with HDF5's own parser), the same total of
 * stored bytes (H5Dget_storage_size), and the same address, size and mask for the first, middle
 * and last chunks looked up by coordinates. Without a table the callers ask HDF5 chunk by chunk,
 * as before. ACT_EPISODE_INDEX=0 turns it off (comparisons, tests). */
#ifndef ACT_EPISODE_INDEX_H
#define ACT_EPISODE_INDEX_H

#include <stddef.h>
#include <stdint.h>

#ifdef ACT_WITH_HDF5
#include <hdf5.h>

/* ITER: listed by H5Dchunk_iter, any index, where the build found it with its final callback
 * (CMakeLists.txt: 1.10.10+, 1.12.3+, 1.14+); WALK: else, in 1.10.5-1.10.9, the index walked here
 * (H5O_info_t's addr, H5Dget_chunk_info_by_coord to agree with); else (1.12.0-1.12.2): no table */
#ifdef ACT_HAVE_H5DCHUNK_ITER
#define ACT_EP_INDEX_ITER 1
#else
#define ACT_EP_INDEX_ITER 0
#endif
#define ACT_EP_INDEX_WALK (!ACT_EP_INDEX_ITER && H5_VERSION_GE(1, 10, 5) && !H5_VERSION_GE(1, 12, 0))
#define ACT_EP_INDEX (ACT_EP_INDEX_WALK || ACT_EP_INDEX_ITER)

typedef struct act_ep_chunk_rec {
    haddr_t addr;    /* as H5Dget_chunk_info_by_coord gives it; HADDR_UNDEF: never written */
    uint32_t size;   /* stored bytes */
    uint32_t mask;   /* filters skipped */
} act_ep_chunk_rec;

typedef struct act_ep_index {
    int rank;
    hsize_t cd[8];       /* chunk shape */
    hsize_t spans[8];    /* chunks along each dimension */
    size_t n;            /* cells of the grid (the product of spans); 0: no table */
    uint64_t base;       /* added to an address, the file offset (the user block's size) */
    act_ep_chunk_rec *rec;   /* n cells, row-major over spans */
    int v4_unread;       /* no table (n 0), and the walk (1.10) found the dataset's layout message to
                          * be version 4, whose indexes it does not read. HDF5 1.10's by-coordinate
                          * lookups walk those at ~0.1-0.2 us a chunk, so episode_check.c and
                          * episode.c ask it no chunk's place by coordinates (unfiltered chunks
                          * have no stored size there: each is one chunk's bytes by format) */
    int loops;           /* no table: the loop check (1.10; run on every chunked dataset first,
                          * the table on or off) met a child node at its parent's level or
                          * above. HDF5 1.10 recurses by each node's own level, so a node that
                          * points back up the tree sends every call that walks the index
                          * (H5Dget_storage_size, H5Dread) into endless recursion: a stack
                          * overflow (fuzzing found one; 1.14.5 does not recurse so). Every
                          * cycle has such a child; the open refuses the file first */
} act_ep_index;

/* Reads ds's chunk index (ds in file, whose bytes fd reads; file_size bytes long) into ix. 1: a
 * table HDF5 agrees with (above); 0: none (ix empty but for v4_unread: ask HDF5). Never an
 * error: what is wrong with a damaged file is HDF5's to say. */
int act_ep_index_build(hid_t file, hid_t ds, int fd, uint64_t file_size, act_ep_index *ix);

/* The chunk at coordinates o (a multiple of the chunk shape), as H5Dget_chunk_info_by_coord
 * answers: addr HADDR_UNDEF and size 0 when never written. 0, or -1 off the grid. */
int act_ep_index_at(const act_ep_index *ix, const hsize_t *o, unsigned *mask, haddr_t *addr, hsize_t *size);

void act_ep_index_free(act_ep_index *ix);
#endif

#endif
