/* util.c - error formatting and checked allocation (see util.h). */
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int act_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void *act_array_alloc(size_t n, size_t size) {
    size_t bytes;
    if (!act_mul_ok(n, size, &bytes)) return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *act_aligned_alloc(size_t bytes) {
    /* aligned_alloc wants a size that is a multiple of the alignment */
    size_t rounded = (bytes + 63u) & ~(size_t)63u;
    if (rounded < bytes) return NULL;
    if (rounded == 0) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (p) memset(p, 0, rounded);
    return p;
}

void act_aligned_free(void *p) { free(p); }
