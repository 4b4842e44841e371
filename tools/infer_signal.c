/* infer_signal.c - what act-infer does on SIGTERM, SIGINT and SIGHUP, and at its exit.
 * eval polls (infer_stop_requested before each batch): the first signal finishes the step in
 * flight, then eval removes its unfinished output, says which episodes were not evaluated and
 * which files are an earlier run's, and exits 128 + the signal. Every other command, a second
 * signal to eval, and SIGPIPE (the reader of our output is gone) stop at once: the temporary
 * files of unfinished outputs are removed (act_outfile_remove_pending) and the process dies of
 * the signal as it would have without a handler. A signal ignored at start (nohup, a
 * background job) stays ignored. SIGXFSZ (a file size limit, ulimit -f) is ignored, so that the
 * write fails with EFBIG and the output's own error path says so, instead of a kill that leaves
 * a temporary file. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "infer_common.h"
#include "outfile.h"
#include "util.h"

static volatile sig_atomic_t g_stop, g_polled;

static void on_signal(int sig) {
    if (g_polled && !g_stop && sig != SIGPIPE) {
        static const char msg[] =
            "\nact-infer: signal received: stopping after the step in flight (a second one stops at once)\n";
        g_stop = sig;
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        return;
    }
    act_outfile_remove_pending();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(sig, &sa, NULL);
    raise(sig);   /* delivered when this handler returns: the process dies of it */
}

void infer_signals(int polled) {
    g_polled = polled;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &sa, NULL);
    static const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGPIPE};
    /* SA_RESTART: a read or wait the signal lands in goes on */
    act_catch_signals(sigs, (int)(sizeof sigs / sizeof *sigs), on_signal, SA_RESTART);
}

int infer_stop_requested(void) { return g_stop; }

const char *infer_signal_name(int sig) {
    return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

int infer_wait_child(int pid, int *status) {
    int passed = 0;   /* the stop request handed on to the child */
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid) return 0;
        if (r < 0 && errno != EINTR) return -1;
        int sig = infer_stop_requested();
        if (sig && !passed) {
            kill(pid, sig);
            passed = 1;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int infer_finish(int rc) {
    int e = fflush(stdout) != 0 ? errno : 0;
    if ((e || ferror(stdout)) && rc == 0) {
        fprintf(stderr, "act-infer: writing the standard output failed: %s\n",
                e ? strerror(e) : "an earlier write was cut short");
        rc = INFER_EXIT_FAIL;
    }
    if (rc != 0) {
        fflush(stderr);
        _exit(rc);
    }
    return rc;
}
