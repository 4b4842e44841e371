/* episode_index.c - a chunked dataset's chunk index read from the file in one pass (see
 * episode_index.h). Formats: the HDF5 file format specification, version 3.0 (object headers
 * IV.A.1.a/b, layout message IV.A.2.i, version 1 B-trees III.A.1). All integers little-endian. */
#define _POSIX_C_SOURCE 200809L
#include "episode_index.h"

#ifdef ACT_WITH_HDF5
#include "episode_direct.h"   /* act_ep_pread */
#include "util.h"

#include <stdlib.h>
#include <string.h>

#if ACT_EP_INDEX

#define MAX_CELLS ((size_t)1 << 22)       /* 64 MiB of table: no episode comes near */
#define MAX_BLOCKS 64                     /* object header blocks (continuations) */
#define MAX_BLOCK ((uint64_t)1 << 20)     /* bytes in one */
#define MAX_LEVEL 32                      /* B-tree depth: 64 entries a node, 2^192 chunks */

#if ACT_EP_INDEX_WALK
typedef struct {
    int fd;
    uint64_t fsize, base;   /* file bytes; what is added to a file address to get an offset */
    int sa, ss;             /* sizes of addresses and lengths */
} fctx;

static uint64_t le(const uint8_t *p, int w) {
    uint64_t v = 0;
    for (int i = w - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static int undef(uint64_t a, int sa) {
    return sa == 8 ? a == UINT64_MAX : a == (((uint64_t)1 << (8 * sa)) - 1);
}

/* n bytes at file address a; 0, or -1 when they are not all in the file */
static int rd(const fctx *f, uint64_t a, void *buf, size_t n) {
    if (a > f->fsize || f->base > f->fsize - a || n > f->fsize - a - f->base) return -1;
    return act_ep_pread(f->fd, buf, n, a + f->base) == n ? 0 : -1;
}

/* The layout message of the object header at address oh: its bytes into msg (up to cap), its
 * length returned; -1 when the header is not one this reads or holds none. */
static long find_layout(const fctx *f, uint64_t oh, uint8_t *msg, size_t cap) {
    uint8_t hdr[64];
    uint64_t blk_a[MAX_BLOCKS], blk_n[MAX_BLOCKS];
    int nblk = 0, v2 = 0, crt = 0;
    if (rd(f, oh, hdr, 16) != 0) return -1;
    if (hdr[0] == 1 && hdr[1] == 0) {   /* version 1: 16-byte prefix, messages 8-aligned */
        blk_a[0] = oh + 16;
        blk_n[0] = le(hdr + 8, 4);
    } else if (!memcmp(hdr, "OHDR", 4) && hdr[4] == 2) {
        v2 = 1;
        int flags = hdr[5], p = 6, w = 1 << (flags & 3);
        if (flags & 0x20) p += 16;   /* times */
        if (flags & 0x10) p += 4;    /* attribute phase change */
        if (rd(f, oh, hdr, (size_t)p + (size_t)w) != 0) return -1;
        crt = (flags & 0x04) != 0;   /* messages carry a creation order */
        blk_a[0] = oh + (uint64_t)p + (uint64_t)w;
        blk_n[0] = le(hdr + p, w);
    } else {
        return -1;
    }
    nblk = 1;
    uint8_t *buf = NULL;
    long found = -1;
    for (int b = 0; b < nblk && found < 0; b++) {
        uint64_t a = blk_a[b], n = blk_n[b];
        if (n > MAX_BLOCK) break;
        uint8_t *nb = realloc(buf, (size_t)n + 1);
        if (!nb) break;
        buf = nb;
        if (rd(f, a, buf, (size_t)n) != 0) break;
        size_t p = 0, len = (size_t)n;
        if (v2 && b > 0) {   /* a continuation block: "OCHK", messages, checksum */
            if (len < 8 || memcmp(buf, "OCHK", 4)) break;
            p = 4;
            len -= 4;
        }
        size_t hsz = v2 ? 4u + (crt ? 2u : 0u) : 8u;
        while (p + hsz <= len) {
            unsigned type = v2 ? buf[p] : (unsigned)le(buf + p, 2);
            size_t msz = (size_t)le(buf + p + (v2 ? 1 : 2), 2);
            const uint8_t *d = buf + p + hsz;
            if (msz > len - p - hsz) break;
            if (type == 0x08) {
                if (msz > cap) break;
                memcpy(msg, d, msz);
                found = (long)msz;
                break;
            }
            if (type == 0x10) {   /* continuation: address, length */
                if (msz < (size_t)(f->sa + f->ss) || nblk == MAX_BLOCKS) break;
                blk_a[nblk] = le(d, f->sa);
                blk_n[nblk] = le(d + f->sa, f->ss);
                nblk++;
            }
            p += hsz + msz;
        }
    }
    free(buf);
    return found;
}

typedef struct {
    const fctx *f;
    int nd;                 /* key dimensions: the dataset's rank + 1 */
    hsize_t dims[8];
    act_ep_index *ix;
    size_t records, nodes, max_nodes, max_entries;
    size_t next;            /* the least cell the next chunk may have: keys ascend */
    uint64_t bytes;
} walk_ctx;

/* the node at address a, which must be at level want (-1: the root, any level up to MAX_LEVEL).
 * Chunks must come in ascending order of their offsets, as HDF5's lookups by binary search
 * assume (a table in another order could name another chunk than H5Dread reads), each must lie
 * inside the file, and a node holds at most the 2K entries the file's B-tree rank K allows. */
static int walk(walk_ctx *w, uint64_t a, int want) {
    const fctx *f = w->f;
    uint8_t hdr[8 + 16];
    size_t hlen = 8 + 2 * (size_t)f->sa, ks = 8 + 8 * (size_t)w->nd, es = ks + (size_t)f->sa;
    if (++w->nodes > w->max_nodes || rd(f, a, hdr, hlen) != 0) return -1;
    int level = hdr[5];
    size_t entries = (size_t)le(hdr + 6, 2);
    if (memcmp(hdr, "TREE", 4) || hdr[4] != 1 || level > MAX_LEVEL || (want >= 0 && level != want) ||
        entries > w->max_entries)
        return -1;
    size_t blen = entries * es + ks;
    uint8_t *body = malloc(blen);
    if (!body || rd(f, a + hlen, body, blen) != 0) {
        free(body);
        return -1;
    }
    act_ep_index *ix = w->ix;
    int rc = 0;
    for (size_t i = 0; i < entries && rc == 0; i++) {
        const uint8_t *key = body + i * es;
        uint64_t child = le(key + ks, f->sa);
        if (undef(child, f->sa)) {
            rc = -1;
        } else if (level > 0) {
            rc = walk(w, child, level - 1);
        } else {
            size_t cell = 0;
            if (le(key + 8 + 8 * (size_t)ix->rank, 8) != 0) rc = -1;   /* the element dimension */
            for (int d = 0; d < ix->rank && rc == 0; d++) {
                uint64_t o = le(key + 8 + 8 * (size_t)d, 8);
                if (o % ix->cd[d] || o >= w->dims[d]) rc = -1;
                else cell = cell * ix->spans[d] + (size_t)(o / ix->cd[d]);
            }
            if (rc == 0 && cell < w->next) rc = -1;   /* out of order, or twice in the index */
            uint32_t size = (uint32_t)le(key, 4);
            if (rc == 0 && (child > f->fsize - f->base || size > f->fsize - f->base - child)) rc = -1;
            if (rc == 0) {
                w->next = cell + 1;
                ix->rec[cell].addr = (haddr_t)child;
                ix->rec[cell].size = size;
                ix->rec[cell].mask = (uint32_t)le(key + 4, 4);
                w->records++;
                w->bytes += ix->rec[cell].size;
            }
        }
    }
    free(body);
    return rc;
}

#define MAX_LOOP_NODES ((size_t)1 << 16)   /* inner nodes and leaves tree_loops reads at most */

/* 1 when a node of the version 1 B-tree at a (level want; -1: the root) or below it has a child at
 * its own level or above: the only way the tree can point back up itself, which HDF5 1.10 follows
 * forever (it recurses by each node's own level). Only the nodes' levels and child addresses are
 * read, whatever else is wrong with them (the walk may have stopped at a bad leaf before the bad
 * inner node). 0: no such child found; -1: a node unreadable, or *budget nodes read. */
static int tree_loops(const fctx *f, uint64_t a, int want, int nd, size_t *budget) {
    uint8_t hdr[8 + 16];
    size_t hlen = 8 + 2 * (size_t)f->sa, ks = 8 + 8 * (size_t)nd, es = ks + (size_t)f->sa;
    if (*budget == 0) return -1;
    (*budget)--;
    if (rd(f, a, hdr, hlen) != 0 || memcmp(hdr, "TREE", 4) || hdr[4] != 1) return -1;
    int level = hdr[5];
    if (want >= 0 && level > want) return 1;
    if (level == 0) return 0;   /* any level up to 255 descends: each step goes down one, so at most 255 deep */
    size_t entries = (size_t)le(hdr + 6, 2);
    if (entries > 1024) return -1;
    uint8_t *body = malloc(entries * es);
    if (!body || rd(f, a + hlen, body, entries * es) != 0) {
        free(body);
        return -1;
    }
    int r = 0;
    for (size_t i = 0; i < entries && r != 1; i++) {
        uint64_t child = le(body + i * es + ks, f->sa);
        if (!undef(child, f->sa)) r = tree_loops(f, child, level - 1, nd, budget) == 1 ? 1 : r;
    }
    free(body);
    return r;
}

#endif /* ACT_EP_INDEX_WALK */

/* ACT_EPISODE_INDEX=0, or ACT_EPISODE_PREAD=0 (every byte through HDF5): no table */
static int off_env(void) { return !act_env_switch_on("ACT_EPISODE_INDEX") || !act_ep_pread_on(); }

/* ACT_EPISODE_INDEX_SKEW=N (tests): N added to every address in the table once HDF5 has agreed
 * with it, so that every place it names is wrong by N bytes: what the open's frame checks
 * (episode.c) must catch */
static uint64_t skew_env(void) {
    const char *e = getenv("ACT_EPISODE_INDEX_SKEW");
    return e ? strtoull(e, NULL, 10) : 0;
}

/* the cell's coordinates */
static void coords_of(const act_ep_index *ix, size_t cell, hsize_t *o) {
    for (int d = ix->rank - 1; d >= 0; d--) {
        o[d] = (hsize_t)(cell % ix->spans[d]) * ix->cd[d];
        cell /= ix->spans[d];
    }
}

/* HDF5's answers for the first, middle and last chunks stored, against the table's: 0 when they
 * agree (addresses as H5Dget_chunk_info_by_coord gives them) */
static int agrees(hid_t ds, const act_ep_index *ix, size_t records) {
    size_t want[3] = {0, records / 2, records ? records - 1 : 0}, seen = 0;
    int k = 0;
    for (size_t cell = 0; cell < ix->n && k < 3; cell++) {
        if (ix->rec[cell].addr == HADDR_UNDEF) continue;
        while (k < 3 && want[k] == seen) {
            hsize_t o[8];
            unsigned mask = 0;
            haddr_t a = HADDR_UNDEF;
            hsize_t sz = 0;
            coords_of(ix, cell, o);
            if (H5Dget_chunk_info_by_coord(ds, o, &mask, &a, &sz) < 0 || a != ix->rec[cell].addr ||
                sz != ix->rec[cell].size || mask != ix->rec[cell].mask)
                return -1;
            k++;
        }
        seen++;
    }
    return records && k < 3 ? -1 : 0;
}

/* the table filled (records chunks, bytes stored) is one HDF5 agrees with: the same count, the
 * same total of stored bytes, the same first, middle and last chunks */
static int hdf5_agrees(hid_t ds, hid_t space, const act_ep_index *ix, size_t records, uint64_t bytes) {
    hsize_t nchunks = 0;
    return H5Dget_num_chunks(ds, space, &nchunks) >= 0 && nchunks == records &&
           (hsize_t)H5Dget_storage_size(ds) == (hsize_t)bytes && agrees(ds, ix, records) == 0;
}

static void clear_cells(act_ep_index *ix) {
    for (size_t i = 0; i < ix->n; i++) ix->rec[i] = (act_ep_chunk_rec){HADDR_UNDEF, 0, 0};
}

#if ACT_EP_INDEX_WALK
/* a layout message of version 4, chunked (msg[0] 4, msg[1] 2, n bytes): 1 when it names the
 * chunk shape HDF5 gave (flags, dimensionality, the width of each dimension, the dimensions, the
 * last the element's size) */
static int layout_v4(const uint8_t *msg, long n, const act_ep_index *ix, size_t elem) {
    int nd = ix->rank + 1, w = msg[4];
    if (msg[3] != nd || w < 1 || w > 8 || n < 5 + (long)w * nd) return 0;
    for (int d = 0; d < nd; d++)
        if (le(msg + 5 + (size_t)w * (size_t)d, w) != (d < ix->rank ? (uint64_t)ix->cd[d] : (uint64_t)elem)) return 0;
    return 1;
}

/* What the walk needs of the file: its address and length sizes, its user block (HDF5's base
 * for addresses), the B-tree's K, and the dataset's object header address. 0, or -1. */
typedef struct { size_t sa, ss; hsize_t ub; unsigned ik; uint64_t addr; } file_geom;
static int geom_of(hid_t file, hid_t ds, file_geom *g) {
    hid_t fcpl = H5Fget_create_plist(file);
    H5O_info_t oi;
    memset(g, 0, sizeof *g);
    int bad = fcpl < 0 || H5Pget_sizes(fcpl, &g->sa, &g->ss) < 0 || (g->sa != 4 && g->sa != 8) ||
              (g->ss != 4 && g->ss != 8) || H5Pget_userblock(fcpl, &g->ub) < 0 ||
              H5Pget_istore_k(fcpl, &g->ik) < 0 || g->ik < 1 || H5Oget_info2(ds, &oi, H5O_INFO_BASIC) < 0;
    if (fcpl >= 0) H5Pclose(fcpl);
    g->addr = bad ? 0 : (uint64_t)oi.addr;
    return bad ? -1 : 0;
}

/* The layout message's B-tree root, from base b (0: the user block's end, 1: the file's start):
 * with *f set, 1 and *root when it is a version 3 chunked layout of the chunk shape cd (rank
 * dims, then the element's size), 0 when it is one whose tree is empty (no chunk written), -1
 * when it is not (*v4 set when it is a version 4 chunked layout, given ix). */
static int layout_root(const file_geom *g, int b, int fd, uint64_t file_size, int rank, const hsize_t *cd,
                       size_t elem, const act_ep_index *ix, fctx *f, uint64_t *root, int *v4) {
    uint64_t base = b ? 0 : (uint64_t)g->ub;
    if (base > file_size) return -1;
    *f = (fctx){fd, file_size, base, (int)g->sa, (int)g->ss};
    uint8_t msg[256];
    long n = find_layout(f, g->addr, msg, sizeof msg);
    int nd = rank + 1;
    if (v4 && ix && n >= 5 && msg[0] == 4 && msg[1] == 2 && !*v4) *v4 = layout_v4(msg, n, ix, elem);
    if (n < 3 + (long)g->sa + 4L * nd || msg[0] != 3 || msg[1] != 2 || msg[2] != nd) return -1;
    for (int d = 0; d < nd; d++)
        if (le(msg + 3 + g->sa + 4 * (size_t)d, 4) != (d < rank ? (uint64_t)cd[d] : (uint64_t)elem)) return -1;
    *root = le(msg + 3, (int)g->sa);
    return !undef(*root, (int)g->sa);
}

/* 1 when ds's version 1 B-tree has a node pointing back up the tree (tree_loops), from either
 * base. Run before anything asks HDF5 to walk that index, whatever the table then does (turned
 * off, too many cells, a walk that fails): HDF5 1.10 would recurse until its stack overflows. */
static int chunk_tree_loops(const file_geom *g, hid_t dcpl, hid_t type, int fd, uint64_t file_size, int rank) {
    hsize_t cd[32];
    if (fd < 0 || rank < 1 || rank > 31 || H5Pget_layout(dcpl) != H5D_CHUNKED || H5Pget_chunk(dcpl, 32, cd) != rank)
        return 0;
    for (int b = 0; b < (g->ub ? 2 : 1); b++) {
        fctx f;
        uint64_t root;
        size_t budget = MAX_LOOP_NODES;
        if (layout_root(g, b, fd, file_size, rank, cd, H5Tget_size(type), NULL, &f, &root, NULL) == 1 &&
            tree_loops(&f, root, -1, rank + 1, &budget) == 1)
            return 1;
    }
    return 0;
}

/* 1.10: the layout message found from the object header's address, the B-tree walked, from the
 * user block's end (HDF5's base) or, failing that, the file's start; 1 when HDF5 agrees. A layout
 * message of version 4 (whose indexes the walk does not read) sets *v4. */
static int fill_walk(const file_geom *g, hid_t ds, hid_t space, hid_t type, const hsize_t *dims, int fd,
                     uint64_t file_size, act_ep_index *ix, int *v4) {
    int ok = 0, rank = ix->rank;
    for (int b = 0; b < (g->ub ? 2 : 1) && !ok; b++) {
        fctx f;
        uint64_t root = 0;
        int has = layout_root(g, b, fd, file_size, rank, ix->cd, H5Tget_size(type), ix, &f, &root, v4);
        if (has < 0) continue;   /* not a layout the walk reads, from this base */
        walk_ctx w = {&f, rank + 1, {0}, ix, 0, 0, ix->n + 64, 2 * (size_t)g->ik, 0, 0};
        memcpy(w.dims, dims, sizeof(hsize_t) * (size_t)rank);
        clear_cells(ix);
        if (has == 1 && walk(&w, root, -1) != 0) continue;
        if (!hdf5_agrees(ds, space, ix, w.records, w.bytes)) continue;
        ix->base = f.base;
        ok = 1;
    }
    return ok;
}
#endif

#if ACT_EP_INDEX_ITER
typedef struct {
    act_ep_index *ix;
    const hsize_t *dims;
    size_t records;
    size_t next;   /* the least cell the next chunk may have */
    uint64_t bytes;
} iter_ctx;

/* one chunk H5Dchunk_iter lists: on the grid, inside the dataset, and after the one before in
 * row-major order. The indexes of the layouts recorders write (time the first or only unlimited
 * dimension, or none) list their chunks so, and a version 1 B-tree whose keys do not ascend is
 * one HDF5's searches could read otherwise (see walk); another order only costs the table. */
static int iter_cb(const hsize_t *off, unsigned mask, haddr_t addr, hsize_t size, void *op) {
    iter_ctx *c = op;
    act_ep_index *ix = c->ix;
    size_t cell = 0;
    for (int d = 0; d < ix->rank; d++) {
        if (off[d] % ix->cd[d] || off[d] >= c->dims[d]) return -1;
        cell = cell * ix->spans[d] + (size_t)(off[d] / ix->cd[d]);
    }
    if (addr == HADDR_UNDEF || size == 0 || size > UINT32_MAX || cell < c->next) return -1;
    ix->rec[cell] = (act_ep_chunk_rec){addr, (uint32_t)size, (uint32_t)mask};
    c->next = cell + 1;
    c->records++;
    c->bytes += size;
    return 0;
}

/* the first chunk's stored bytes read at its address plus base equal what H5Dread_chunk gives */
static int reads_at(const act_ep_index *ix, int fd, uint64_t file_size, uint64_t base, const uint8_t *want,
                    uint8_t *got) {
    for (size_t cell = 0; cell < ix->n; cell++) {
        const act_ep_chunk_rec *r = &ix->rec[cell];
        if (r->addr == HADDR_UNDEF) continue;
        uint64_t at = (uint64_t)r->addr + base;
        return at >= base && at <= file_size && r->size <= file_size - at &&
               act_ep_pread(fd, got, r->size, at) == r->size && !memcmp(want, got, r->size);
    }
    return 0;
}

/* H5Dchunk_iter (1.10.10+, 1.12.3+, 1.14+) lists every chunk in one pass, whatever the index
 * (version 1 B-tree, or layout version 4's arrays and version 2 B-tree); 1 when HDF5 agrees and
 * every chunk lies inside the file. Its addresses, like H5Dget_chunk_info_by_coord's, count from
 * the user block's end before 1.14.4 and from the file's start since (HDF5 pull request 4236; 1.10
 * and 1.12 ended before it). With a user block, the base is the one at which the first chunk
 * reads as H5Dread_chunk gives it, if exactly one does; else the library version's. */
static int fill_iter(hid_t file, hid_t ds, hid_t space, const hsize_t *dims, int fd, uint64_t file_size,
                     act_ep_index *ix) {
    hid_t fcpl = H5Fget_create_plist(file);
    hsize_t ub = 0;
    unsigned maj = 0, min = 0, rel = 0;
    int ok = fcpl >= 0 && H5Pget_userblock(fcpl, &ub) >= 0 && H5get_libversion(&maj, &min, &rel) >= 0;
    if (fcpl >= 0) H5Pclose(fcpl);
    if (!ok) return 0;
    iter_ctx c = {ix, dims, 0, 0, 0};
    clear_cells(ix);
    if (H5Dchunk_iter(ds, H5P_DEFAULT, iter_cb, &c) < 0 || !hdf5_agrees(ds, space, ix, c.records, c.bytes)) return 0;
    int from_start = maj > 1 || min > 14 || (min == 14 && rel >= 4);
    ix->base = from_start ? 0 : (uint64_t)ub;
    size_t first = 0;
    while (first < ix->n && ix->rec[first].addr == HADDR_UNDEF) first++;
    if (ub && first < ix->n && ix->rec[first].size <= MAX_BLOCK * 64) {   /* up to 64 MiB */
        uint32_t sz = ix->rec[first].size, m = 0;
        hsize_t o[8];
        coords_of(ix, first, o);
        uint8_t *want = malloc(sz), *got = malloc(sz);
        if (want && got && H5Dread_chunk(ds, H5P_DEFAULT, o, &m, want) >= 0) {
            int at_ub = reads_at(ix, fd, file_size, (uint64_t)ub, want, got),
                at_0 = reads_at(ix, fd, file_size, 0, want, got);
            if (at_ub != at_0) ix->base = at_ub ? (uint64_t)ub : 0;
        }
        free(want);
        free(got);
    }
    for (size_t i = 0; i < ix->n; i++) {   /* every chunk inside the file */
        const act_ep_chunk_rec *r = &ix->rec[i];
        uint64_t at = (uint64_t)r->addr + ix->base;
        if (r->addr != HADDR_UNDEF && (at < ix->base || at > file_size || r->size > file_size - at)) return 0;
    }
    return 1;
}
#endif

int act_ep_index_build(hid_t file, hid_t ds, int fd, uint64_t file_size, act_ep_index *ix) {
    memset(ix, 0, sizeof *ix);
    int ok = 0, v4 = 0, loops = 0;
    hid_t dcpl = H5Dget_create_plist(ds), space = H5Dget_space(ds), type = H5Dget_type(ds);
    hsize_t dims[8];
    int rank = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
#if ACT_EP_INDEX_WALK
    /* first, and whatever follows: the table may be off (ACT_EPISODE_INDEX=0), or too large to
     * keep, yet HDF5 still walks this tree (H5Dget_storage_size), so a loop must be seen here */
    file_geom g;
    int have_geom = geom_of(file, ds, &g) == 0;
    if (have_geom && dcpl >= 0 && type >= 0) loops = chunk_tree_loops(&g, dcpl, type, fd, file_size, rank);
#endif
    if (loops || fd < 0 || off_env()) goto out;
    if (dcpl < 0 || space < 0 || type < 0 || rank < 1 || rank > 7 || H5Pget_layout(dcpl) != H5D_CHUNKED ||
        H5Pget_chunk(dcpl, 8, ix->cd) != rank || H5Sget_simple_extent_dims(space, dims, NULL) != rank)
        goto out;
    ix->rank = rank;
    double cells = 1;
    for (int d = 0; d < rank; d++) {
        if (ix->cd[d] == 0) goto out;
        ix->spans[d] = (dims[d] + ix->cd[d] - 1) / ix->cd[d];
        cells *= (double)ix->spans[d];
    }
    if (cells < 1 || cells > (double)MAX_CELLS) goto out;
    ix->n = (size_t)cells;
    if (!(ix->rec = malloc(ix->n * sizeof *ix->rec))) goto out;
#if ACT_EP_INDEX_WALK
    ok = have_geom && fill_walk(&g, ds, space, type, dims, fd, file_size, ix, &v4);
#else
    ok = fill_iter(file, ds, space, dims, fd, file_size, ix);
#endif
    uint64_t skew = ok ? skew_env() : 0;
    for (size_t i = 0; i < ix->n && skew; i++)
        if (ix->rec[i].addr != HADDR_UNDEF) ix->rec[i].addr += skew;
out:
    if (!ok) {
        act_ep_index_free(ix);
        ix->v4_unread = v4;
        ix->loops = loops;
    }
    if (dcpl >= 0) H5Pclose(dcpl);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    H5Eclear2(H5E_DEFAULT);
    return ok;
}

#else /* HDF5 before 1.10.5 (no H5Dget_chunk_info_by_coord), or 1.12-1.13 (no H5O_info_t addr, no
       * H5Dchunk_iter of the final signature) */

int act_ep_index_build(hid_t file, hid_t ds, int fd, uint64_t file_size, act_ep_index *ix) {
    (void)file, (void)ds, (void)fd, (void)file_size;
    memset(ix, 0, sizeof *ix);
    return 0;
}

#endif

int act_ep_index_at(const act_ep_index *ix, const hsize_t *o, unsigned *mask, haddr_t *addr, hsize_t *size) {
    size_t cell = 0;
    if (!ix->n) return -1;
    for (int d = 0; d < ix->rank; d++) {
        if (o[d] % ix->cd[d] || o[d] / ix->cd[d] >= ix->spans[d]) return -1;
        cell = cell * ix->spans[d] + (size_t)(o[d] / ix->cd[d]);
    }
    const act_ep_chunk_rec *r = &ix->rec[cell];
    *addr = r->addr;
    *size = r->addr == HADDR_UNDEF ? 0 : r->size;
    *mask = r->addr == HADDR_UNDEF ? 0 : r->mask;
    return 0;
}

void act_ep_index_free(act_ep_index *ix) {
    free(ix->rec);
    memset(ix, 0, sizeof *ix);
}

#endif
