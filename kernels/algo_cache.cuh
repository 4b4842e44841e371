/* algo_cache.cuh - the memory of measured algorithm choices, shared by conv_find.cu (cuDNN's
 * Find) and gemm_tune.cu (cuBLASLt's candidates timed): a fixed table of entries, each starting
 * with the key it is found by (whose first int is the device), behind one lock. A key must have
 * no padding (it is compared with memcmp); the first entry for a key stays, and a full table
 * stops remembering (measuring again is then only slower).
 * With ACT_CUDA_ALGO_CACHE=FILE the measured choices outlive the process: the table reads FILE
 * at its first use and appends each new measured choice to it as one line
 *     act-algo 1 KIND TAG HEX
 * (KIND conv or gemm; TAG the device's name and compute capability, the library's version and
 * the entry's size; HEX the entry's bytes), so a restarted server, or a replica sharing the
 * file, measures nothing again and takes the same algorithms. A line of another TAG (another
 * GPU model, cuDNN or cuBLASLt) is skipped, and so is one the table's check refuses; one write()
 * per line with O_APPEND keeps lines of processes appending together whole. An unreadable or
 * unwritable file is said once and costs only the measurements. The choices themselves are
 * checked again where they are used (a cuBLASLt algorithm must be among the plan's own
 * candidates, a cuDNN one must fit the plan), so a stale line can cost speed, never a wrong
 * result.
 * defines: act_algo_cache, ACT_ALGO_CACHE, act_algo_cache_get, act_algo_cache_put, act_algo_log */
#ifndef ACT_KERNELS_ALGO_CACHE_CUH
#define ACT_KERNELS_ALGO_CACHE_CUH
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ACT_ALGO_LINE 1024          /* longest line of the file read */
#define ACT_ALGO_TAG 192
#define ACT_ALGO_DEVS 16            /* devices whose tags a load remembers */

typedef struct {
    pthread_mutex_t mu;
    unsigned char *slots;           /* cap entries of size bytes */
    int n, cap;
    size_t size, key_bytes;         /* an entry's size; its first key_bytes are its key */
    const char *kind;               /* the file's name for this table: conv, gemm */
    size_t (*lib_version)(void);    /* the version of the library whose algorithms these are */
    int (*valid)(const void *entry);/* 1 when a line's entry holds values this code can use */
    int loaded;                     /* ACT_CUDA_ALGO_CACHE has been read (or is unset) */
    int warned;                     /* its trouble has been said */
} act_algo_cache;

/* a file's cache `name` of up to cap entries of type, keyed by their first key_bytes bytes;
 * kind, lib_version and valid as in act_algo_cache */
#define ACT_ALGO_CACHE(name, type, cap, key_bytes, kind, lib_version, valid)                   \
    static unsigned char name##_slots[(cap) * sizeof(type)];                                   \
    static act_algo_cache name = {PTHREAD_MUTEX_INITIALIZER, name##_slots, 0, (cap),           \
                                  sizeof(type), (key_bytes), (kind), (lib_version), (valid),   \
                                  0, 0}

/* the slot holding entry's key, or NULL; with c->mu held */
static inline unsigned char *act_algo_cache_find(act_algo_cache *c, const void *entry) {
    for (int i = 0; i < c->n; i++)
        if (!memcmp(c->slots + (size_t)i * c->size, entry, c->key_bytes))
            return c->slots + (size_t)i * c->size;
    return NULL;
}

/* ACT_CUDA_ALGO_LOG set (not 0): measured and loaded choices are said on stderr */
static inline int act_algo_log(void) {
    const char *v = getenv("ACT_CUDA_ALGO_LOG");
    return v && *v && strcmp(v, "0");
}

static inline const char *act_algo_cache_path(void) {
    const char *p = getenv("ACT_CUDA_ALGO_CACHE");
    return p && *p ? p : NULL;
}

/* TAG of c's entries on device dev; 0, or -1 when the device cannot be asked */
static inline int act_algo_cache_tag(const act_algo_cache *c, int dev, char *tag, size_t n) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    char name[64];
    size_t i = 0;
    for (; prop.name[i] && i + 1 < sizeof name; i++) {
        char ch = prop.name[i];
        int plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '-';
        name[i] = plain ? ch : '_';
    }
    name[i] = 0;
    snprintf(tag, n, "%s/sm%d%d/%s%zu/%zu", name, prop.major, prop.minor, c->kind,
             c->lib_version(), c->size);
    return 0;
}

/* what is wrong with the file, said once a table */
static inline void act_algo_cache_warn(act_algo_cache *c, const char *what, const char *why) {
    if (c->warned) return;
    c->warned = 1;
    fprintf(stderr, "act-engine: algorithm cache %s: %s (%s)\n", act_algo_cache_path(), what, why);
}

static inline int act_algo_hex(int ch) {
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* the entries of c's kind and this process's tags in ACT_CUDA_ALGO_CACHE into the table (the
 * first for a key stays); with c->mu held */
static inline void act_algo_cache_load(act_algo_cache *c) {
    c->loaded = 1;
    const char *path = act_algo_cache_path();
    if (!path) return;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno != ENOENT)
            act_algo_cache_warn(c, "cannot be read; every choice is measured", strerror(errno));
        return;
    }
    char tags[ACT_ALGO_DEVS][ACT_ALGO_TAG];
    int have[ACT_ALGO_DEVS] = {0};  /* 0 not asked, 1 tag made, -1 device not there */
    char line[ACT_ALGO_LINE];
    unsigned char entry[ACT_ALGO_LINE / 2];
    int bad = 0, loaded = 0, other = 0;
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (len && line[len - 1] != '\n') {
            if (feof(f)) break;   /* a last line without its end: being written just now */
            int ch;               /* too long: skip it whole */
            while ((ch = fgetc(f)) != EOF && ch != '\n') {}
            bad++;
            continue;
        }
        char kind[16], tag[ACT_ALGO_TAG], hex[ACT_ALGO_LINE];
        int version = 0;
        if (sscanf(line, "act-algo %d %15s %191s %1023s", &version, kind, tag, hex) != 4 ||
            version != 1) {
            bad++;
            continue;
        }
        if (strcmp(kind, c->kind)) continue;              /* the other table's line */
        /* an entry of another size (a build whose key has more or fewer fields) is another
         * version's line, skipped as such, not a damaged one */
        const char *sz = strrchr(tag, '/');
        if (sz && strtoull(sz + 1, NULL, 10) != (unsigned long long)c->size) {
            other++;
            continue;
        }
        size_t nh = strlen(hex);
        int ok = nh == 2 * c->size && c->size <= sizeof entry;
        for (size_t i = 0; ok && i < c->size; i++) {
            int hi = act_algo_hex(hex[2 * i]), lo = act_algo_hex(hex[2 * i + 1]);
            ok = hi >= 0 && lo >= 0;
            entry[i] = (unsigned char)(hi << 4 | lo);
        }
        int dev = 0;
        if (ok) memcpy(&dev, entry, sizeof dev);
        if (!ok || dev < 0 || !c->valid(entry)) {
            bad++;
            continue;
        }
        if (dev >= ACT_ALGO_DEVS) {
            other++;
            continue;
        }
        if (!have[dev])
            have[dev] = act_algo_cache_tag(c, dev, tags[dev], sizeof tags[dev]) ? -1 : 1;
        if (have[dev] < 0 || strcmp(tag, tags[dev])) {
            other++;
            continue;
        }
        if (!act_algo_cache_find(c, entry) && c->n < c->cap) {
            memcpy(c->slots + (size_t)c->n++ * c->size, entry, c->size);
            loaded++;
        }
    }
    if (ferror(f))
        act_algo_cache_warn(c, "cannot be read; every choice is measured", strerror(errno));
    fclose(f);
    if (bad) {
        char why[64];
        snprintf(why, sizeof why, "%d %s line%s", bad, c->kind, bad == 1 ? "" : "s");
        act_algo_cache_warn(c, "lines that are not an act-engine algorithm choice skipped", why);
    }
    if (act_algo_log())
        fprintf(stderr, "act-engine: algo: cache %s: %d %s choices loaded, %d of other devices "
                "or library versions skipped\n", path, loaded, c->kind, other);
}

/* entry as one line at the end of ACT_CUDA_ALGO_CACHE; with c->mu held */
static inline void act_algo_cache_append(act_algo_cache *c, const void *entry) {
    const char *path = act_algo_cache_path();
    if (!path) return;
    char tag[ACT_ALGO_TAG], line[ACT_ALGO_LINE];
    int dev = 0;
    memcpy(&dev, entry, sizeof dev);
    if (act_algo_cache_tag(c, dev, tag, sizeof tag)) return;
    int n = snprintf(line, sizeof line, "act-algo 1 %s %s ", c->kind, tag);
    if (n < 0 || (size_t)n + 2 * c->size + 2 > sizeof line) return;
    for (size_t i = 0; i < c->size; i++)
        n += snprintf(line + n, 3, "%02x", ((const unsigned char *)entry)[i]);
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        act_algo_cache_warn(c, "cannot be written; choices are kept for this process only",
                            strerror(errno));
        return;
    }
    ssize_t w = write(fd, line, (size_t)n);
    if (w != n)
        act_algo_cache_warn(c, "cannot be written; choices are kept for this process only",
                            w < 0 ? strerror(errno) : "short write");
    close(fd);
}

/* 1 with the stored entry for entry's key copied into entry; 0 when there is none */
static inline int act_algo_cache_get(act_algo_cache *c, void *entry) {
    pthread_mutex_lock(&c->mu);
    if (!c->loaded) act_algo_cache_load(c);
    const unsigned char *s = act_algo_cache_find(c, entry);
    if (s) memcpy(entry, s, c->size);
    pthread_mutex_unlock(&c->mu);
    return s != NULL;
}

/* entry remembered for its key unless one is already; persist: also written to
 * ACT_CUDA_ALGO_CACHE (a measured choice; not a "keep the heuristics'", which may have come
 * from a failure of this process only) */
static inline void act_algo_cache_put(act_algo_cache *c, const void *entry, int persist) {
    pthread_mutex_lock(&c->mu);
    if (!c->loaded) act_algo_cache_load(c);
    if (!act_algo_cache_find(c, entry) && c->n < c->cap) {
        memcpy(c->slots + (size_t)c->n++ * c->size, entry, c->size);
        if (persist) act_algo_cache_append(c, entry);
    }
    pthread_mutex_unlock(&c->mu);
}

#endif
