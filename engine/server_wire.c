/* server_wire.c - receive buffers for frames: a connection's c->in, a request's r->wire.
 *
 * A PREDICT's raw frames stay in the buffer they were received into (the request takes it, see
 * on_predict), and the inference thread registers such a buffer with the session at its first
 * batch, so that a step reads TCP frames in place as it reads shared memory: the host copies
 * nothing after the kernel's recv. A registration locks whole pages, so each buffer is whole
 * pages of its own, and the page before its data holds a header saying whether it is
 * registered (reg, under the server's mu). The I/O thread, which frees buffers, hands a
 * registered one to the inference thread (the retired list) instead: it unregisters it first.
 */
#define _GNU_SOURCE
#include "server_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the page size (4 KiB on x86, up to 64 KiB on aarch64 hosts), once */
static size_t page(void)
{
    static size_t pg;
    if (!pg) {
        long v = sysconf(_SC_PAGESIZE);
        pg = v > 0 ? (size_t)v : 4096;
    }
    return pg;
}

static act_wire *hdr_of(uint8_t *p) { return (act_wire *)(p - page()); }

uint8_t *act_wire_alloc(size_t cap)
{
    void *base = NULL;
    size_t pg = page();
    if (cap > SIZE_MAX - 2 * pg) return NULL;
    size_t bytes = (cap + pg - 1) / pg * pg;
    if (posix_memalign(&base, pg, pg + bytes)) return NULL;
    act_wire *h = base;
    memset(h, 0, sizeof *h);
    h->cap = bytes;
    return (uint8_t *)base + pg;
}

act_wire *act_wire_of(uint8_t *p) { return p ? hdr_of(p) : NULL; }
uint8_t *act_wire_data(act_wire *h) { return (uint8_t *)h + page(); }

void act_wire_release(act_wire *h) { free(h); }

void act_wire_free(act_server *s, uint8_t *p)
{
    if (!p) return;
    act_wire *h = hdr_of(p);
    pthread_mutex_lock(&s->mu);
    int reg = h->reg == 1;
    if (reg) {   /* the device may read it: the inference thread lets go first */
        h->next = s->retired_wire;
        s->retired_wire = h;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (!reg) free(h);
}
