/* pool.h - helper threads for the engine's own loops (pool.c).
 * defines: act_pool, act_pool_task, act_pool_create, act_pool_threads, act_pool_set_spin_us,
 *          act_pool_run, act_pool_destroy, act_pool_cores, act_pool_env_threads
 *
 * act_pool_run(p, fn, arg, items) splits [0, items) into one contiguous range per thread, runs
 * fn(arg, thread, lo, hi) for each (thread 0 is the caller, 1.. the helpers: an index for
 * per-thread scratch) and returns when all are done. One caller at a time. */
#ifndef ACT_POOL_H
#define ACT_POOL_H

/* the most threads a pool has (the caller included): per-thread slots may be sized by it */
#define ACT_POOL_MAX_THREADS 64

typedef struct act_pool act_pool;
typedef void (*act_pool_task)(void *arg, int thread, int lo, int hi);

/* threads clamped to 1..ACT_POOL_MAX_THREADS; NULL: out of memory (act_pool_run then runs inline) */
act_pool *act_pool_create(int threads);
int act_pool_threads(const act_pool *p);  /* threads including the caller; 1 for NULL */
/* Helpers (and the caller, for the helpers' end) spin up to us microseconds (0..10000) before
 * they sleep; 0, the default, sleeps at once (pool.c says when spinning pays). */
void act_pool_set_spin_us(act_pool *p, long us);
void act_pool_run(act_pool *p, act_pool_task fn, void *arg, int items);
void act_pool_destroy(act_pool *p);

/* Thread counts for pools: the cores this process may use (cores.h: the online CPUs, fewer
 * under an affinity mask or a cgroup CPU quota; read once); the value of environment variable
 * `env` when it is a number in 1..ACT_POOL_MAX_THREADS, else dflt clamped to that range. */
int act_pool_cores(void);
int act_pool_env_threads(const char *env, int dflt);

#endif
