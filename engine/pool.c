/* pool.c - helper threads for loops the engine runs itself (interface: pool.h).
 * defines: act_pool_create, act_pool_threads, act_pool_run, act_pool_destroy, act_pool_cores,
 *          act_pool_env_threads
 *
 * Users: the CPU backend (OpenBLAS threads the GEMMs; everything between them - Winograd
 * transforms, im2col, epilogues - would otherwise run on one core while the others wait) and
 * act-serve's inference thread (a batch's frames copied into the session's input buffers).
 * act_pool_run runs the first range on the caller and returns when all are done. Helpers sleep
 * on a condition variable between calls: they never spin, so they take no core from OpenBLAS's
 * threads during a GEMM. A pool of one thread has no helpers and runs inline. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include "pool.h"

struct act_pool {
    int n;                        /* threads including the caller */
    pthread_t *tid;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long gen;            /* bumped per run: helpers wait for a new one */
    int pending;                  /* helpers still working on this run */
    int quit;
    act_pool_task fn;
    void *arg;
    int items;
};

static void range(int items, int n, int i, int *lo, int *hi) {
    *lo = (int)((long long)items * i / n);
    *hi = (int)((long long)items * (i + 1) / n);
}

typedef struct { act_pool *p; int idx; } helper_arg;

static void *helper(void *a) {
    act_pool *p = ((helper_arg *)a)->p;
    int idx = ((helper_arg *)a)->idx;
    free(a);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->quit) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        act_pool_task fn = p->fn;
        void *arg = p->arg;
        int lo, hi;
        range(p->items, p->n, idx, &lo, &hi);
        pthread_mutex_unlock(&p->mu);
        if (lo < hi) fn(arg, idx, lo, hi);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

act_pool *act_pool_create(int threads) {
    act_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    if (threads < 1) threads = 1;
    p->n = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    if (threads > 1 && !(p->tid = calloc((size_t)threads - 1, sizeof *p->tid))) return p;
    for (int i = 1; i < threads; i++) {   /* a helper that cannot start leaves a smaller pool */
        helper_arg *a = malloc(sizeof *a);
        if (!a) break;
        a->p = p;
        a->idx = i;
        if (pthread_create(&p->tid[i - 1], NULL, helper, a)) {
            free(a);
            break;
        }
        p->n = i + 1;
    }
    return p;
}

int act_pool_threads(const act_pool *p) { return p ? p->n : 1; }

void act_pool_run(act_pool *p, act_pool_task fn, void *arg, int items) {
    if (items <= 0) return;
    if (!p || p->n == 1 || items == 1) {
        fn(arg, 0, 0, items);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->items = items;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    int lo, hi;
    range(items, p->n, 0, &lo, &hi);
    if (lo < hi) fn(arg, 0, lo, hi);
    pthread_mutex_lock(&p->mu);
    while (p->pending) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void act_pool_destroy(act_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->tid[i - 1], NULL);
    free(p->tid);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p);
}

int act_pool_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 1024 ? 1024 : (int)n;
}

int act_pool_env_threads(const char *env, int dflt) {
    const char *e = getenv(env);
    char *end;
    long v = e && *e ? strtol(e, &end, 10) : 0;
    if (e && *e && !*end && v >= 1 && v <= 64) return (int)v;
    return dflt < 1 ? 1 : dflt > 64 ? 64 : dflt;
}
