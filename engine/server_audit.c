/* server_audit.c - act-serve's --audit-log: one JSON line per PREDICT.
 * defines: act_audit_open, act_audit_close, act_audit_line
 *
 * Every I/O thread writes here. A line is formatted whole and written with one write(2) under
 * a lock, so lines never interleave, and a write that fails part way (a full disk, a file size
 * limit) is cut back off: the file holds whole lines only, the line is lost, counted
 * (act_serve_audit_lines_lost_total) and said on stderr (verbose or not) once per run of failures. A log that
 * was moved or removed (logrotate without copytruncate) is reopened at its path, checked at most
 * once a second, so rotation needs no restart. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "server_internal.h"

#define AUDIT_RECHECK_S 1.0

int act_audit_open(act_server *s, const char *path, char *err, size_t errlen)
{
    act_audit *a = &s->audit;
    snprintf(a->path, sizeof a->path, "%s", path);
    a->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (a->fd < 0) return act_errf(err, errlen, "act-serve: cannot open audit log '%s': %s", path, strerror(errno));
    pthread_mutex_init(&a->mu, NULL);   /* made when the log opens: `on` says both */
    a->checked = act_now();
    a->on = 1;
    return 0;
}

void act_audit_close(act_server *s)
{
    act_audit *a = &s->audit;
    if (!a->on) return;
    close(a->fd);
    a->fd = -1;
    a->on = 0;
    pthread_mutex_destroy(&a->mu);
}

/* the path names another file than the one open, or none: a rotation moved it away */
static void reopen_if_moved(act_audit *a)
{
    double now = act_now();
    if (now - a->checked < AUDIT_RECHECK_S) return;
    a->checked = now;
    struct stat at_path, open_one;
    if (stat(a->path, &at_path) == 0 && fstat(a->fd, &open_one) == 0 && at_path.st_dev == open_one.st_dev &&
        at_path.st_ino == open_one.st_ino)
        return;
    int fd = open(a->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {   /* said once, not every second */
        if (!a->reopen_failed)
            act_serve_say("audit log: '%s' was moved or removed and cannot be made again (%s): writing on to "
                          "the file still open", a->path, strerror(errno));
        a->reopen_failed = 1;
        return;
    }
    a->reopen_failed = 0;
    close(a->fd);
    a->fd = fd;
    act_serve_say("audit log: '%s' was moved or removed: reopened", a->path);
}

void act_audit_line(act_server *s, const char *peer, const char *client, uint64_t id, const char *status,
                    const act_req *r)
{
    act_audit *a = &s->audit;
    if (!a->on) return;   /* not fd: a rotation replaces that under the lock, from another thread */
    char line[2048];   /* a client name is at most 255 bytes, each escaped into at most 6 */
    FILE *m = fmemopen(line, sizeof line, "w");
    if (!m) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* the client name is the client's own text (HELLO allows any printable byte): escaped, so a
     * name cannot break a line or add fields to it */
    fprintf(m, "{\"ts\":%lld.%06ld,\"peer\":", (long long)ts.tv_sec, ts.tv_nsec / 1000);
    act_json_write_string(m, peer);
    fputs(",\"client\":", m);
    act_json_write_string(m, client);
    fprintf(m, ",\"id\":%llu,\"status\":\"%s\"", (unsigned long long)id, status);
    if (r)
        fprintf(m, ",\"batch\":%d,\"rows\":%d,\"queue_ms\":%.3f,\"infer_ms\":%.3f,\"total_ms\":%.3f",
                r->batch, r->rows, 1e3 * (r->t_start - r->t_arrive), 1e3 * (r->t_end - r->t_start),
                1e3 * (act_now() - r->t_arrive));
    fputs("}\n", m);
    long len = ftell(m);
    fclose(m);
    if (len <= 0 || (size_t)len >= sizeof line || line[len - 1] != '\n') return;   /* cannot happen: bounded */

    pthread_mutex_lock(&a->mu);
    reopen_if_moved(a);
    off_t before = lseek(a->fd, 0, SEEK_END);
    ssize_t w = write(a->fd, line, (size_t)len);
    int e = errno;
    if (w >= 0 && w < (ssize_t)len) {   /* the rest, to learn why (a full disk, a size limit) */
        ssize_t w2 = write(a->fd, line + w, (size_t)len - (size_t)w);
        e = w2 < 0 ? errno : 0;
        w += w2 > 0 ? w2 : 0;
    }
    if (w == (ssize_t)len) {
        if (a->failing) act_serve_say("audit log: writing again after %llu lost line(s)", (unsigned long long)a->failing);
        a->failing = 0;
    } else {
        if (w > 0 && before >= 0 && ftruncate(a->fd, before) != 0)   /* no half line stays */
            act_serve_say("audit log: cannot cut off a partial line: %s", strerror(errno));
        if (!a->failing)
            act_serve_say("audit log: cannot write to '%s' (%s): lines are lost until it can "
                          "(act_serve_audit_lines_lost_total)", a->path, e ? strerror(e) : "a short write");
        a->failing++;
        act_metrics_audit_lost(&s->metrics);
    }
    pthread_mutex_unlock(&a->mu);
}
