/* outfile.h - output files written whole or not at all.
 * defines: act_outfile, act_outfile_open, act_outfile_finish, act_outfile_commit, act_outfile_abandon,
 *          act_outfile_remove_pending
 * A summary, a benchmark record or a predictions array is written to a temporary sibling
 * ("PATH.tmp.PID") and renamed over PATH only once every byte reached the disk's cache, so a run
 * that fails or is killed half way leaves PATH as it was (the previous run's file, or none)
 * rather than a truncated file that looks complete. A PATH that exists and is not a regular file
 * (/dev/stdout, a FIFO) is written directly. Files that belong together (predict's prior chunks
 * and its posterior files) are first all finished, then all committed: a write failure in any of
 * them leaves every PATH as it was. */
#ifndef ACT_OUTFILE_H
#define ACT_OUTFILE_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
    FILE *fp;
    char path[1024];
    char tmp[1100];   /* "" when writing PATH directly */
    int finished;     /* closed and complete, not yet renamed (act_outfile_finish) */
    int pending;      /* 1 + its slot among the files act_outfile_remove_pending knows; 0 none */
} act_outfile;

/* Opens for writing ("w" or "wb"); -1 with a message naming PATH on failure. */
int act_outfile_open(act_outfile *o, const char *path, const char *mode, char *err, size_t errlen);
/* Flushes and closes, keeping the temporary file for a later commit; -1 (the temporary file
 * removed, PATH untouched) if any write failed. A second call does nothing. */
int act_outfile_finish(act_outfile *o, char *err, size_t errlen);
/* Finishes (if not yet) and renames into place; -1 (and nothing renamed) if any write failed. */
int act_outfile_commit(act_outfile *o, char *err, size_t errlen);
/* Closes and removes the temporary file; PATH is untouched. Safe on a never-opened (zeroed) one. */
void act_outfile_abandon(act_outfile *o);
/* Removes every temporary file of an output not yet committed or abandoned, in any thread (up to
 * 64 at once; more are not tracked). Async-signal-safe (unlink only), for a program's signal
 * handler: a killed run then leaves no "PATH.tmp.PID" behind. */
void act_outfile_remove_pending(void);

#endif
