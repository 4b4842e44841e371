/* selftest_child.h (CUDA emulator selftests) - run a fault case in a forked child: a fault is
 * sticky, as on a GPU, so each case that must fault gets a process of its own.
 * defines: in_child. Needs CHECK from ../test_common.h. */
#ifndef EMU_SELFTEST_CHILD_H
#define EMU_SELFTEST_CHILD_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <initializer_list>

/* fn in a child that must exit 1 (it saw the fault) after printing each of `says` to stderr,
 * which is copied through */
static inline void in_child(const char *what, int (*fn)(void),
                            std::initializer_list<const char *> says = {}) {
    char path[] = "/tmp/emu_selftest_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        CHECK(0, "mkstemp for %s", what);
        return;
    }
    unlink(path);
    fflush(stdout);
    fflush(stderr);
    pid_t p = fork();
    if (p == 0) {
        dup2(fd, 2);
        _exit(fn());
    }
    int st = 0;
    waitpid(p, &st, 0);
    static char log[8192];
    ssize_t n = pread(fd, log, sizeof log - 1, 0);
    close(fd);
    log[n > 0 ? n : 0] = 0;
    fputs(log, stderr);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s: the emulator did not report it (child status %d)",
          what, st);
    for (const char *m : says)
        CHECK(strstr(log, m) != NULL, "%s: no \"%s\" in the child's stderr", what, m);
}

#endif
