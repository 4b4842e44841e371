/* util.c - error formatting and checked allocation (see util.h). */
#include "util.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

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

#if defined(__SANITIZE_ADDRESS__)
#define ACT_ALLOC_PLAIN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ACT_ALLOC_PLAIN 1
#endif
#endif

#ifdef ACT_ALLOC_PLAIN
/* Under AddressSanitizer every block comes from its allocator, red zones and all. */
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
#else
/* Blocks from 1 MiB up are their own anonymous mappings: the kernel's zero pages, faulted in
 * only where they are written. A session sized for batch 256 then holds only the memory the
 * batches it really runs touch (a CPU act-serve for 32 held ~920 MB before its first request
 * when every block was memset). Smaller blocks come from malloc and are cleared. Either way a
 * header just below the block says how to give it back. */
#define ACT_MAP_MIN ((size_t)1 << 20)

typedef struct {
    void *base;          /* what malloc or mmap returned */
    size_t map_bytes;    /* the mapping's length; 0 for malloc */
} alloc_header;

void *act_aligned_alloc(size_t bytes) {
    size_t rounded = (bytes + 63u) & ~(size_t)63u;
    if (rounded < bytes) return NULL;
    if (rounded == 0) rounded = 64;
    if (rounded >= ACT_MAP_MIN) {
        size_t page = act_page_size(), map = rounded + page;
        if (map < rounded) return NULL;
        void *base = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) return NULL;
        unsigned char *p = (unsigned char *)base + page;
        alloc_header *h = (alloc_header *)p - 1;
        h->base = base;
        h->map_bytes = map;
        return p;
    }
    unsigned char *base = aligned_alloc(64, rounded + 64);
    if (!base) return NULL;
    memset(base + 64, 0, rounded);
    alloc_header *h = (alloc_header *)(base + 64) - 1;
    h->base = base;
    h->map_bytes = 0;
    return base + 64;
}

void act_aligned_free(void *p) {
    if (!p) return;
    alloc_header *h = (alloc_header *)p - 1;
    if (h->map_bytes) munmap(h->base, h->map_bytes);
    else free(h->base);
}
#endif

size_t act_page_size(void) {
    long pg = sysconf(_SC_PAGESIZE);
    return pg > 0 ? (size_t)pg : 4096;
}

void *act_page_alloc(size_t bytes, size_t *rounded) {
    size_t page = act_page_size();
    if (bytes > SIZE_MAX - page) return NULL;
    size_t n = (bytes + page - 1) / page * page;
    void *p = NULL;
    if (posix_memalign(&p, page, n ? n : page)) return NULL;
    if (rounded) *rounded = n ? n : page;
    return p;
}

char *act_path_dir(const char *path, char *dir, size_t n) {
    snprintf(dir, n, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, n, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    return dir;
}

double act_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void act_env_ignored(const char *name, const char *value, const char *expect) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static const char *said[64];   /* the names warned about (string literals of the callers) */
    static int n_said;
    pthread_mutex_lock(&mu);
    int seen = 0;
    for (int i = 0; i < n_said && !seen; i++) seen = !strcmp(said[i], name);
    if (!seen && n_said < 64) said[n_said++] = name;
    pthread_mutex_unlock(&mu);
    if (!seen)
        fprintf(stderr, "act-engine: ignoring %s='%s' (expected %s); the default runs\n", name, value, expect);
}

void act_catch_signals(const int *sigs, int n, void (*handler)(int), int flags) {
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < n; i++)
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) sigaction(sigs[i], &sa, NULL);
}

size_t act_find_nonfinite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return n;
}

int act_env_switch_on(const char *name) {
    const char *e = getenv(name);
    if (e && *e && strcmp(e, "0") && strcmp(e, "1")) act_env_ignored(name, e, "0 or 1");
    return !(e && e[0] == '0' && e[1] == '\0');
}
