/* episode_direct.c - raw frames read with pread on the episode pool's threads (design:
 * episode_direct.h).
 * defines: act_ep_pread_on, act_ep_pread, act_ep_direct_probe, act_ep_read_direct
 *
 * A read of frames [t0, t0 + n) is split by frames over the pool's threads; each thread preads
 * its frames, one call per run of frames that lie together in the file (its whole share for a
 * contiguous dataset, the part of each chunk for a chunked one). Every place is checked against
 * the file's size before it is read, and a read that comes back short is an error naming the
 * dataset and the frame, as HDF5's path would give for a truncated file. */
#define _POSIX_C_SOURCE 200809L
#include "episode_direct.h"
#include "episode_inflate.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int act_ep_pread_on(void) { return act_env_switch_on("ACT_EPISODE_PREAD"); }   /* 'off' is named, not taken */

size_t act_ep_pread(int fd, uint8_t *p, size_t n, uint64_t off) {
    size_t done = 0;
    while (done < n) {
        ssize_t got = pread(fd, p + done, n - done, (off_t)(off + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            if (got == 0) errno = 0;
            break;
        }
        done += (size_t)got;
    }
    return done;
}

#ifdef ACT_WITH_HDF5

#define CHUNK_INFO ACT_EP_CHUNK_INFO

int act_ep_direct_probe(hid_t file, hid_t ds, int T, int H, int W, uint64_t file_size, int filtered,
                        act_ep_direct *d) {
    int ok = 0;
    size_t frame = (size_t)H * W * 3;
    hid_t dcpl = H5Dget_create_plist(ds);
    memset(d, 0, sizeof *d);
    if (dcpl < 0 || (H5Pget_nfilters(dcpl) != 0) != !!filtered || H5Pget_external_count(dcpl) != 0)
        goto out;
    H5D_layout_t layout = H5Pget_layout(dcpl);
    if (layout == H5D_CONTIGUOUS && !filtered) {
        haddr_t a = H5Dget_offset(ds);   /* from the start of the file, user block included */
        if (a == HADDR_UNDEF || (uint64_t)a > file_size || (uint64_t)T * frame > file_size - (uint64_t)a)
            goto out;
        d->base = (uint64_t)a;
        ok = 1;
    } else if (layout == H5D_CHUNKED && CHUNK_INFO && (d->k = act_ep_frame_chunk(dcpl, H, W)) > 0) {
        hid_t fcpl = H5Fget_create_plist(file);
        hsize_t ub = 0;
        if (fcpl < 0 || H5Pget_userblock(fcpl, &ub) < 0) ub = 0;
        if (fcpl >= 0) H5Pclose(fcpl);
        d->base = (uint64_t)ub;   /* HDF5 1.10's count; episode.c tries 0 as well */
        ok = 1;
    }
out:
    if (dcpl >= 0) H5Pclose(dcpl);
    H5Eclear2(H5E_DEFAULT);
    return ok;
}

int act_ep_chunk_place(const act_ep_index *ix, hid_t ds, uint64_t base, int fd, uint64_t *file_size,
                       const hsize_t o[4], uint64_t *off, uint64_t *size, unsigned *mask) {
    hsize_t sz = 0;
    haddr_t a = HADDR_UNDEF;
    int r = -1;
    *mask = 0;
    if (ix) r = act_ep_index_at(ix, o, mask, &a, &sz);   /* the table read at open */
#if CHUNK_INFO
    else r = H5Dget_chunk_info_by_coord(ds, o, mask, &a, &sz);
#else
    (void)ds;
#endif
    if (r < 0 || a == HADDR_UNDEF || sz == 0) {
        H5Eclear2(H5E_DEFAULT);
        return 1;
    }
    *off = (uint64_t)a + base;
    *size = (uint64_t)sz;
    struct stat st;   /* past the size seen at open: the file may have grown since */
    if ((*off > *file_size || *size > *file_size - *off) && !fstat(fd, &st)) *file_size = (uint64_t)st.st_size;
    return *off > *file_size || *size > *file_size - *off ? -1 : 0;
}

int act_ep_chunk_at(const act_ep_direct *d, int fd, uint64_t *file_size, hid_t ds, const char *path,
                    const char *name, int t, uint64_t *off, uint64_t *size, unsigned *mask, char *err,
                    size_t errlen) {
    hsize_t o[4] = {(hsize_t)(t / d->k) * (hsize_t)d->k, 0, 0, 0};
    int r = act_ep_chunk_place(d->ix, ds, d->base, fd, file_size, o, off, size, mask);
    if (r < 0)
        snprintf(err, errlen, "%s: dataset '%s': the chunk at timestep %d lies past the end of the file "
                 "(truncated file)", path, name, (int)o[0]);
    return r;
}

typedef struct direct_job {
    int fd;
    int t0, k;                /* k == 0: contiguous from base */
    uint64_t base;
    const uint64_t *addr;     /* chunked: the file offset of chunk (t0 / k + i) */
    size_t frame;
    uint8_t *dst;
    int bad_t[ACT_POOL_MAX_THREADS];      /* per pool thread: the frame that failed, or -1 */
    int bad_errno[ACT_POOL_MAX_THREADS];  /* its errno (0: the file ended) */
} direct_job;

static void direct_task(void *arg, int th, int lo, int hi) {
    direct_job *q = arg;
    for (int i = lo; i < hi;) {
        int t = q->t0 + i, run = hi - i;
        uint64_t off;
        if (q->k == 0) {
            off = q->base + (uint64_t)t * q->frame;
        } else {   /* up to the end of t's chunk */
            int in = t % q->k, left = q->k - in;
            if (run > left) run = left;
            off = q->addr[t / q->k - q->t0 / q->k] + (uint64_t)in * q->frame;
        }
        size_t want = (size_t)run * q->frame, got = act_ep_pread(q->fd, q->dst + (size_t)i * q->frame, want, off);
        if (got < want) {   /* the frame the read stopped in */
            q->bad_t[th] = t + (int)(got / q->frame);
            q->bad_errno[th] = errno;
            return;
        }
        i += run;
    }
}

int act_ep_read_direct(const act_ep_direct *d, int fd, uint64_t file_size, hid_t ds, const char *path,
                       const char *name, int t0, int n, size_t frame, uint8_t *dst, char *err,
                       size_t errlen) {
    direct_job q;
    memset(&q, 0, sizeof q);
    q.fd = fd;
    q.t0 = t0;
    q.k = d->k;
    q.base = d->base;
    q.frame = frame;
    q.dst = dst;
    for (int th = 0; th < ACT_POOL_MAX_THREADS; th++) q.bad_t[th] = -1;
    uint64_t *addr = NULL;
    if (d->k > 0) {
        int first = t0 / d->k, nch = (t0 + n - 1) / d->k - first + 1;
        if (!(addr = malloc(sizeof *addr * (size_t)nch))) {
            snprintf(err, errlen, "%s: out of memory reading '%s'", path, name);
            return -1;
        }
        for (int i = 0; i < nch; i++) {
            uint64_t size = 0;
            unsigned mask = 0;
            int r = act_ep_chunk_at(d, fd, &file_size, ds, path, name, (first + i) * d->k, &addr[i], &size, &mask,
                                    err, errlen);
            if (r == 0 && (mask || size != (uint64_t)d->k * frame)) r = 1;   /* not k frames of raw bytes */
            if (r) {
                free(addr);
                return r;   /* 1: unallocated (HDF5 fills it) or not raw; -1: past the end */
            }
        }
        q.addr = addr;
    }
    act_ep_pool_run(direct_task, &q, n);
    free(addr);
    int bad = -1, bad_errno = 0;
    for (int th = 0; th < ACT_POOL_MAX_THREADS; th++)
        if (q.bad_t[th] >= 0 && (bad < 0 || q.bad_t[th] < bad)) {
            bad = q.bad_t[th];
            bad_errno = q.bad_errno[th];
        }
    if (bad < 0) return 0;
    snprintf(err, errlen, "%s: dataset '%s': frame %d cannot be read: %s", path, name, bad,
             bad_errno ? strerror(bad_errno) : "the file ends before it (truncated file)");
    return -1;
}

#endif
