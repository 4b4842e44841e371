/* util.h - small helpers every engine file may use.
 * defines: act_errf, act_array_alloc, act_aligned_alloc, act_aligned_free, act_mul_ok,
 *          act_page_size, act_page_alloc, act_env_ignored, act_now, act_catch_signals,
 *          act_find_nonfinite, act_env_switch_on
 * The library never exits: helpers report failure by return value, and act_errf formats the
 * message the caller hands back to the user (and returns -1 so `return act_errf(...)` reads
 * as "fail with this message"). */
#ifndef ACT_UTIL_H
#define ACT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define ACT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ACT_PRINTF(a, b)
#endif

/* Writes the message into err (if err && errlen) and returns -1. */
int act_errf(char *err, size_t errlen, const char *fmt, ...) ACT_PRINTF(3, 4);

/* 1 if a*b fits in size_t (and stores it in *out), else 0. */
static inline int act_mul_ok(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* calloc(n, size) that refuses an overflowing product; NULL on failure. */
void *act_array_alloc(size_t n, size_t size);

/* 64-byte aligned, zero-filled block of at least `bytes` (0 allowed); NULL on failure.
 * Blocks of 1 MiB and more are anonymous mappings, their pages faulted in when first written.
 * Free with act_aligned_free only. */
void *act_aligned_alloc(size_t bytes);
void act_aligned_free(void *p);

/* The page size (4 KiB on x86, up to 64 KiB on aarch64 hosts); sysconf reads it from the
 * auxiliary vector, so any thread may ask at any time. */
size_t act_page_size(void);

/* A block of whole pages of its own: page-aligned, `bytes` rounded up to pages (*rounded, if not
 * NULL, gets that size), so that it can be registered with a session
 * (act_session_register_host: CUDA pins whole pages) without sharing a page with anything else.
 * Not cleared. Free with free(). NULL on failure. */
void *act_page_alloc(size_t bytes, size_t *rounded);

/* The folder a file of `path` goes into (its dirname: "." for a bare name, "/" for one in the
 * root) into dir[n]; returns dir. For "can this file be written" checks before long work. */
char *act_path_dir(const char *path, char *dir, size_t n);

/* Monotonic seconds (CLOCK_MONOTONIC): for intervals, never for dates. */
double act_now(void);

/* An engine switch (environment variable) set to a value its reader does not take: says so on
 * stderr, once per variable per process, naming what it expects and that the default runs, so
 * that a figure is never labelled with a setting that had no effect. Any thread. */
void act_env_ignored(const char *name, const char *value, const char *expect);

/* A path switch for A/B runs: on unless the environment variable `name` is "0"; any other value
 * than 0 or 1 is named on stderr (act_env_ignored) and the path stays on. */
int act_env_switch_on(const char *name);

/* The tools' signal handling: handler (with sigaction flags, nothing masked) for each of the n
 * signals in sigs, except one ignored at start (nohup's SIGHUP, a background job's SIGINT),
 * which stays ignored as whoever started the process asked. */
void act_catch_signals(const int *sigs, int n, void (*handler)(int), int flags);

/* The index of the first NaN or infinity in x[0..n), or n when every element is finite. */
size_t act_find_nonfinite(const float *x, size_t n);

#endif
