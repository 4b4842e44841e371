/* hold_open.c - an LD_PRELOAD shim for tests (libact_test_hold_open.so in the build directory).
 *
 * open()/open64() of exactly the path in ACT_TEST_HOLD_OPEN sleeps until a signal handler runs,
 * then fails with EINTR; every other open goes through untouched. tests/python/test_serve.py
 * uses it to keep act-serve in its "loading" state for as long as the test needs (the weight
 * loader refuses a FIFO as --model, so a FIFO without a writer no longer does this).
 *
 * open()/open64() of exactly the path in ACT_TEST_FAIL_OPEN fails at once with EIO (a disk's read
 * error): tests/python/test_eval.py makes HDF5's own file check fail that way.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*open_fn)(const char *, int, ...);

static int held(const char *path) {
    const char *hold = getenv("ACT_TEST_HOLD_OPEN");
    if (!hold || !path || strcmp(hold, path) != 0) return 0;
    for (;;) {   /* nanosleep is never restarted after a handler: EINTR means a signal came */
        struct timespec ts = { 1, 0 };
        if (nanosleep(&ts, NULL) != 0 && errno == EINTR) return 1;
    }
}

static int forward(const char *name, const char *path, int flags, va_list ap) {
    int mode = (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, int) : 0;
    open_fn next = (open_fn)dlsym(RTLD_NEXT, name);
    if (!next) {
        errno = ENOSYS;
        return -1;
    }
    return next(path, flags, mode);
}

static int failed(const char *path) {
    const char *fail = getenv("ACT_TEST_FAIL_OPEN");
    return fail && path && strcmp(fail, path) == 0;
}

/* open and open64: the held path fails with EINTR once a signal came, the failed one with EIO,
 * every other one goes on */
#define HOLD_OPEN(fn)                                        \
    int fn(const char *path, int flags, ...) {               \
        if (held(path)) {                                    \
            errno = EINTR;                                   \
            return -1;                                       \
        }                                                    \
        if (failed(path)) {                                  \
            errno = EIO;                                     \
            return -1;                                       \
        }                                                    \
        va_list ap;                                          \
        va_start(ap, flags);                                 \
        int fd = forward(#fn, path, flags, ap);              \
        va_end(ap);                                          \
        return fd;                                           \
    }
HOLD_OPEN(open)
HOLD_OPEN(open64)
