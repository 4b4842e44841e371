/* pool.c - helper threads for loops the engine runs itself (interface: pool.h).
 * defines: act_pool_create, act_pool_threads, act_pool_set_spin_us, act_pool_run,
 *          act_pool_destroy, act_pool_cores, act_pool_env_threads
 *
 * Users: the CPU backend (its own loops - Winograd transforms, im2col, epilogues - and, since
 * session 11, its GEMMs, split by cpu_gemm.c with OpenBLAS on one thread), act-serve's
 * inference thread (a batch's frames copied into the session's input buffers) and the episode
 * reader's inflate threads.
 * act_pool_run runs the first range on the caller and returns when all are done. Between runs a
 * helper sleeps on a condition variable, or, after act_pool_set_spin_us, first spins that long
 * watching for the next run; the caller likewise spins before it waits for the helpers. The CPU
 * backend's pool spins (a CPU step is ~100 runs back to back, and a futex wake-up per run cost a
 * quarter of a 2-core step: bench/NOTES.md, session 11); the others never do. A pool of one
 * thread has no helpers and runs inline. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "cores.h"
#include "pool.h"
#include "util.h"

struct act_pool {
    int n;                        /* threads including the caller */
    long long spin_ns;            /* how long a thread spins before it sleeps (0: never) */
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

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Before sleeping on a condition variable, a thread spins for up to spin_ns on what it waits
 * for (a new run for a helper, the helpers' end for the caller): a futex wake-up costs tens of
 * microseconds on a VM, and a CPU step runs about a hundred short loops and products back to
 * back. The spin only reads; the mutex and condition variables still decide. */
static int waited_for(const act_pool *p, int helper, unsigned long seen) {
    if (!helper) return !__atomic_load_n(&p->pending, __ATOMIC_ACQUIRE);
    return __atomic_load_n(&p->gen, __ATOMIC_ACQUIRE) != seen || __atomic_load_n(&p->quit, __ATOMIC_ACQUIRE);
}

/* helper 1: a new run (gen != seen) or quit; helper 0, the caller: every helper done.
 * 1: it came within the spin; 0: sleep on the condition variable. */
static int spin_until(const act_pool *p, int helper, unsigned long seen) {
    long long spin = __atomic_load_n(&p->spin_ns, __ATOMIC_RELAXED), t0 = spin > 0 ? now_ns() : 0;
    for (unsigned i = 0; spin > 0; i++) {
        if (waited_for(p, helper, seen)) return 1;
        cpu_relax();
        if ((i & 63) == 63 && now_ns() - t0 > spin) break;
    }
    return 0;
}

static void *helper(void *a) {
    act_pool *p = ((helper_arg *)a)->p;
    int idx = ((helper_arg *)a)->idx;
    free(a);
    unsigned long seen = 0;
    for (;;) {
        spin_until(p, 1, seen);
        pthread_mutex_lock(&p->mu);
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
        if (__atomic_sub_fetch(&p->pending, 1, __ATOMIC_ACQ_REL) == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

act_pool *act_pool_create(int threads) {
    act_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    if (threads < 1) threads = 1;
    if (threads > ACT_POOL_MAX_THREADS) threads = ACT_POOL_MAX_THREADS;
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

/* Any time: each thread reads spin_ns as it starts to wait. */
void act_pool_set_spin_us(act_pool *p, long us) {
    if (!p) return;
    if (us < 0) us = 0;
    if (us > 10000) us = 10000;
    __atomic_store_n(&p->spin_ns, (long long)us * 1000, __ATOMIC_RELAXED);
}

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
    __atomic_store_n(&p->pending, p->n - 1, __ATOMIC_RELAXED);
    __atomic_store_n(&p->gen, p->gen + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    int lo, hi;
    range(items, p->n, 0, &lo, &hi);
    if (lo < hi) fn(arg, 0, lo, hi);
    if (spin_until(p, 0, 0)) return;
    pthread_mutex_lock(&p->mu);
    while (__atomic_load_n(&p->pending, __ATOMIC_ACQUIRE)) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void act_pool_destroy(act_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->quit, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->tid[i - 1], NULL);
    free(p->tid);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p);
}

static act_cores g_cores;
static pthread_once_t g_cores_once = PTHREAD_ONCE_INIT;
static void cores_init(void) { act_cores_read(&g_cores); }

int act_pool_cores(void) {
    pthread_once(&g_cores_once, cores_init);
    return g_cores.usable;
}

int act_pool_env_threads(const char *env, int dflt) {
    const char *e = getenv(env);
    char *end;
    long v = e && *e ? strtol(e, &end, 10) : 0;
    if (e && *e && !*end && v >= 1 && v <= ACT_POOL_MAX_THREADS) return (int)v;
    _Static_assert(ACT_POOL_MAX_THREADS == 64, "the message below names the limit");
    if (e && *e) act_env_ignored(env, e, "1..64 threads");   /* env: a string literal of the caller's */
    return dflt < 1 ? 1 : dflt > ACT_POOL_MAX_THREADS ? ACT_POOL_MAX_THREADS : dflt;
}
