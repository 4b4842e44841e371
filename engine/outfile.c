/* outfile.c - output files written whole or not at all (see outfile.h). */
#include "outfile.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The temporary files being written, for act_outfile_remove_pending. A slot is 0 free, 1 being
 * filled in, 2 naming a temporary file, 3 taken by act_outfile_remove_pending (a signal handler
 * about to end the process): it never returns to 0 then, so its name is never rewritten while
 * the handler reads it. */
#define PENDING_MAX 64
static char g_pending[PENDING_MAX][1100];
static int g_pending_state[PENDING_MAX];

static void pending_add(act_outfile *o) {
    o->pending = 0;
    for (int i = 0; i < PENDING_MAX; i++) {
        int free_slot = 0;
        if (__atomic_compare_exchange_n(&g_pending_state[i], &free_slot, 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            memcpy(g_pending[i], o->tmp, sizeof o->tmp);
            __atomic_store_n(&g_pending_state[i], 2, __ATOMIC_RELEASE);
            o->pending = i + 1;
            return;
        }
    }
}

static void pending_drop(act_outfile *o) {
    if (o->pending > 0) {
        /* 2 -> 0; a slot at 3 stays taken: act_outfile_remove_pending has it (the process is
         * ending, or a test called it) and may still be reading its name */
        int live = 2;
        __atomic_compare_exchange_n(&g_pending_state[o->pending - 1], &live, 0, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
    }
    o->pending = 0;
}

/* the temporary file is done with: removed first if `remove_it`, then forgotten */
static void tmp_done(act_outfile *o, int remove_it) {
    if (remove_it && o->tmp[0]) remove(o->tmp);
    o->tmp[0] = '\0';
    pending_drop(o);
}

void act_outfile_remove_pending(void) {
    for (int i = 0; i < PENDING_MAX; i++) {
        int live = 2;
        if (__atomic_compare_exchange_n(&g_pending_state[i], &live, 3, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            unlink(g_pending[i]);
    }
}

int act_outfile_open(act_outfile *o, const char *path, const char *mode, char *err, size_t errlen) {
    memset(o, 0, sizeof *o);
    if (strlen(path) >= sizeof o->path) {
        snprintf(err, errlen, "%.64s...: path longer than %zu bytes", path, sizeof o->path - 1);
        return -1;
    }
    snprintf(o->path, sizeof o->path, "%s", path);
    struct stat st;
    int direct = stat(path, &st) == 0 && !S_ISREG(st.st_mode);
    if (!direct) snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", path, (long)getpid());
    if (o->tmp[0]) pending_add(o);   /* before it exists: a signal after fopen finds it */
    o->fp = fopen(direct ? path : o->tmp, mode);
    if (!o->fp) {
        snprintf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        tmp_done(o, 0);
        return -1;
    }
    return 0;
}

int act_outfile_finish(act_outfile *o, char *err, size_t errlen) {
    if (!o->fp) {
        if (o->finished) return 0;
        snprintf(err, errlen, "%s: not open", o->path);
        return -1;
    }
    int failed = fflush(o->fp) != 0 || ferror(o->fp);
    int e = errno;
    if (fclose(o->fp) != 0 && !failed) { failed = 1; e = errno; }
    o->fp = NULL;
    if (failed) {
        snprintf(err, errlen, "%s: write failed: %s", o->path, strerror(e));
        tmp_done(o, 1);
        return -1;
    }
    o->finished = 1;
    return 0;
}

int act_outfile_commit(act_outfile *o, char *err, size_t errlen) {
    if (act_outfile_finish(o, err, errlen) != 0) return -1;
    o->finished = 0;
    if (o->tmp[0] && rename(o->tmp, o->path) != 0) {
        snprintf(err, errlen, "%s: cannot move %s into place: %s", o->path, o->tmp, strerror(errno));
        tmp_done(o, 1);
        return -1;
    }
    tmp_done(o, 0);
    return 0;
}

void act_outfile_abandon(act_outfile *o) {
    if (o->fp) fclose(o->fp);
    o->fp = NULL;
    o->finished = 0;
    tmp_done(o, 1);
}
