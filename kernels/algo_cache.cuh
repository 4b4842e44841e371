/* algo_cache.cuh - the process-wide memory of measured algorithm choices, shared by
 * conv_find.cu (cuDNN's Find) and gemm_tune.cu (cuBLASLt's candidates timed): a fixed table of
 * entries, each starting with the key it is found by, behind one lock. A key must have no
 * padding (it is compared with memcmp); the first entry for a key stays, and a full table stops
 * remembering (measuring again is then only slower).
 * defines: act_algo_cache, ACT_ALGO_CACHE, act_algo_cache_get, act_algo_cache_put */
#ifndef ACT_KERNELS_ALGO_CACHE_CUH
#define ACT_KERNELS_ALGO_CACHE_CUH
#include <pthread.h>
#include <stddef.h>
#include <string.h>

typedef struct {
    pthread_mutex_t mu;
    unsigned char *slots;           /* cap entries of size bytes */
    int n, cap;
    size_t size, key_bytes;         /* an entry's size; its first key_bytes are its key */
} act_algo_cache;

/* a file's cache `name` of up to cap entries of type, keyed by their first key_bytes bytes */
#define ACT_ALGO_CACHE(name, type, cap, key_bytes)                                             \
    static unsigned char name##_slots[(cap) * sizeof(type)];                                   \
    static act_algo_cache name = {PTHREAD_MUTEX_INITIALIZER, name##_slots, 0, (cap),           \
                                  sizeof(type), (key_bytes)}

/* the slot holding entry's key, or NULL; with c->mu held */
static inline unsigned char *act_algo_cache_find(act_algo_cache *c, const void *entry) {
    for (int i = 0; i < c->n; i++)
        if (!memcmp(c->slots + (size_t)i * c->size, entry, c->key_bytes))
            return c->slots + (size_t)i * c->size;
    return NULL;
}

/* 1 with the stored entry for entry's key copied into entry; 0 when there is none */
static inline int act_algo_cache_get(act_algo_cache *c, void *entry) {
    pthread_mutex_lock(&c->mu);
    const unsigned char *s = act_algo_cache_find(c, entry);
    if (s) memcpy(entry, s, c->size);
    pthread_mutex_unlock(&c->mu);
    return s != NULL;
}

static inline void act_algo_cache_put(act_algo_cache *c, const void *entry) {
    pthread_mutex_lock(&c->mu);
    if (!act_algo_cache_find(c, entry) && c->n < c->cap)
        memcpy(c->slots + (size_t)c->n++ * c->size, entry, c->size);
    pthread_mutex_unlock(&c->mu);
}

#endif
