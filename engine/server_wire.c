/* server_wire.c - receive buffers for frames: a connection's c->in, a request's r->wire.
 *
 * A PREDICT's raw frames stay in the buffer they were received into (the request takes it, see
 * on_predict), and the inference thread registers such a buffer with the session at its first
 * batch, so that a step reads TCP frames in place as it reads shared memory: the host copies
 * nothing after the kernel's recv. A registration locks whole pages, so each buffer is whole
 * pages of its own, and the page before its data holds its header (an act_regmem: a registered
 * buffer the I/O thread frees is retired to the inference thread, which unregisters it first).
 */
#define _GNU_SOURCE
#include "server_internal.h"

#include <stdlib.h>
#include <string.h>
#include "util.h"

static act_wire *hdr_of(uint8_t *p) { return (act_wire *)(p - act_page_size()); }

static void wire_release(act_regmem *mem) { free(mem); }   /* the header starts the allocation */

uint8_t *act_wire_alloc(size_t cap)
{
    size_t pg = act_page_size(), total = 0;
    if (cap > SIZE_MAX - 2 * pg) return NULL;
    void *base = act_page_alloc(pg + cap, &total);   /* the header page, then the data's */
    if (!base) return NULL;
    act_wire *h = base;
    memset(h, 0, sizeof *h);
    h->mem.p = (uint8_t *)base + pg;
    h->mem.bytes = total - pg;
    h->mem.release = wire_release;
    return (uint8_t *)base + pg;
}

act_wire *act_wire_of(uint8_t *p) { return p ? hdr_of(p) : NULL; }

void act_wire_free(act_server *s, uint8_t *p)
{
    if (p) act_regmem_drop(s, &hdr_of(p)->mem);
}
