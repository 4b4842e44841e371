/* server_shm.c - shared memory a same-host client attached to its Unix-socket connection.
 *
 * Such a client writes its camera frames into a memfd it created, passes the descriptor once
 * (SHM_ATTACH, SCM_RIGHTS), and then sends only offsets: ~590 KB per request that neither side
 * copies through the kernel. The server maps the file read-only, and only when the client has
 * sealed it against shrinking: a file truncated under a live mapping would turn the inference
 * thread's reads into SIGBUS. Growing or rewriting the pixels is the client's business (the
 * contents are only ever read as pixels; every size and offset comes from the socket and is
 * checked). A mapping lives while its connection or any request read from it does: the count
 * is touched by the I/O thread only, which both parses requests and takes finished ones back.
 */
#define _GNU_SOURCE
#include "server_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static void shm_release(act_regmem *mem)
{
    munmap((void *)mem->p, mem->bytes);
    free((act_shm *)mem);
}

int act_shm_map(int fd, uint64_t size, act_shm **out, char *msg, size_t msglen)
{
    struct stat st;
    *out = NULL;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(msg, msglen, "SHM_ATTACH: the descriptor is not a memfd (regular file)");
        return ACT_E_BAD_SHM;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        snprintf(msg, msglen, "SHM_ATTACH: the memfd is not sealed against shrinking (create it with "
                              "MFD_ALLOW_SEALING, then F_ADD_SEALS F_SEAL_SHRINK)");
        return ACT_E_BAD_SHM;
    }
    if ((uint64_t)st.st_size < size) {
        snprintf(msg, msglen, "SHM_ATTACH: the memfd holds %lld bytes, the message says %llu",
                 (long long)st.st_size, (unsigned long long)size);
        return ACT_E_BAD_SHM;
    }
    act_shm *m = malloc(sizeof *m);
    if (!m) {
        snprintf(msg, msglen, "SHM_ATTACH: out of memory");
        return ACT_E_INTERNAL;
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(msg, msglen, "SHM_ATTACH: cannot map %llu bytes: %s", (unsigned long long)size, strerror(errno));
        free(m);
        return ACT_E_BAD_SHM;
    }
    memset(m, 0, sizeof *m);
    m->mem.p = p;
    m->mem.bytes = (size_t)size;
    m->mem.release = shm_release;
    m->refs = 1;
    *out = m;
    return 0;
}

void act_shm_unref(act_server *s, act_shm *m)
{
    if (m && --m->refs == 0) act_regmem_drop(s, &m->mem);
}
