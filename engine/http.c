/* http.c - the metrics side port: just enough HTTP/1.0 for /healthz and /metrics, served by the
 * first I/O thread.
 * Each connection sends one GET (or HEAD), gets one response and is closed. Requests are capped at
 * ACT_HTTP_BUF bytes and a 2 s deadline. A full table makes room by closing the connection that
 * has waited longest without sending a byte (else the oldest): connections that say nothing
 * cannot keep a load balancer's probe from its answer. Out of descriptors, a connection is taken
 * with the spare descriptor and closed, so the listener does not stay readable and spin the
 * thread. The response is small (a few KiB), so one non-blocking send delivers it on any sane
 * socket; a peer whose buffer cannot take it loses the response rather than stalling the I/O
 * thread. */
#define _GNU_SOURCE
#include "server_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define HTTP_DEADLINE_S 2.0
#define HTTP_QUIET_S 0.25   /* accepted this long ago with nothing read: a slot given up first */

static void http_close(act_server *s, act_http_conn *h)
{
    epoll_ctl(s->io[0].epfd, EPOLL_CTL_DEL, h->fd, NULL);
    close(h->fd);
    h->fd = -1;
    h->got = 0;
    h->answered = 0;
    h->head = 0;
}

static void http_reply(act_http_conn *h, int status, const char *ctype, const char *body, size_t blen)
{
    char head[256];
    const char *reason = status == 200 ? "OK" : status == 404 ? "Not Found" : status == 405 ? "Method Not Allowed"
                       : status == 503 ? "Service Unavailable" : "Bad Request";
    int n = snprintf(head, sizeof head,
                     "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n",
                     status, reason, ctype, blen, status == 405 ? "Allow: GET, HEAD\r\n" : "");
    if (send(h->fd, head, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) == n && blen && !h->head)
        send(h->fd, body, blen, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void http_respond(act_server *s, act_http_conn *h)
{
    char method[8], path[128];
    if (sscanf(h->buf, "%7s %127s", method, path) != 2) {
        http_reply(h, 400, "text/plain", "bad request\n", 12);
        return;
    }
    char *q = strchr(path, '?');
    const char *p = path;
    if (q) *q = 0;
    /* the absolute form a proxy may send (RFC 7230 5.3.2): GET http://host:port/metrics */
    if (!strncasecmp(p, "http://", 7) || !strncasecmp(p, "https://", 8)) {
        p = strchr(p + (p[4] == ':' ? 7 : 8), '/');
        if (!p) p = "/";
    }
    /* HEAD (some load balancers' health check): GET's status and headers, no body */
    h->head = strcmp(method, "HEAD") == 0;
    if (strcmp(method, "GET") != 0 && !h->head) {
        http_reply(h, 405, "text/plain", "only GET and HEAD\n", 18);
        return;
    }
    if (strcmp(p, "/healthz") == 0) {
        int draining = atomic_load(&s->draining), ready = atomic_load(&s->ready) && !draining;
        char why[256], body[300];
        int failing = act_metrics_failing(&s->metrics, why, sizeof why);
        if (failing) snprintf(body, sizeof body, "failing: %s\n", why);
        else snprintf(body, sizeof body, "%s", ready ? "ok\n" : draining ? "draining\n" : "loading\n");
        http_reply(h, ready && !failing ? 200 : 503, "text/plain", body, strlen(body));
    } else if (strcmp(p, "/metrics") == 0) {
        size_t len = 0;
        char *body = act_metrics_render(&s->metrics, atomic_load(&s->ready), atomic_load(&s->draining), &len);
        if (body) http_reply(h, 200, "text/plain; version=0.0.4", body, len);
        else http_reply(h, 503, "text/plain", "out of memory\n", 14);
        free(body);
    } else {
        http_reply(h, 404, "text/plain", "try /healthz or /metrics\n", 25);
    }
}

/* A free slot, else the one to give up: silent longest, else oldest. Silent means nothing read
 * for HTTP_QUIET_S since its accept: a probe accepted a moment ago whose request is still on its
 * way (or was accepted in the same round as the newcomer, unread) is not silent, so two probes
 * arriving together no longer cost the first its answer. */
static int http_slot(act_server *s)
{
    int best = -1, silent = 0;
    double quiet_since = act_now() + HTTP_DEADLINE_S - HTTP_QUIET_S;   /* deadline = accept + HTTP_DEADLINE_S */
    for (int i = 0; i < ACT_HTTP_SLOTS; i++) {
        act_http_conn *h = &s->http[i];
        if (h->fd < 0) return i;
        int quiet = h->got == 0 && !h->answered && h->deadline <= quiet_since;
        if (best < 0 || quiet > silent || (quiet == silent && h->deadline < s->http[best].deadline)) {
            best = i;
            silent = quiet;
        }
    }
    http_close(s, &s->http[best]);
    return best;
}

void act_http_accept(act_server *s)
{
    for (;;) {
        int fd = accept4(s->mfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EMFILE && errno != ENFILE) return;
            /* the client listener's way (act_conn_accept; the same thread): take it, close it */
            if (s->spare_fd >= 0) close(s->spare_fd);
            fd = accept(s->mfd, NULL, NULL);
            if (fd >= 0) close(fd);
            s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
            if (fd < 0) return;
            act_serve_log(s, "out of file descriptors: closed a /healthz or /metrics connection unanswered");
            continue;
        }
        int slot = http_slot(s);
        act_http_conn *h = &s->http[slot];
        h->fd = fd;
        h->got = 0;
        h->answered = 0;
        h->head = 0;
        h->deadline = act_now() + HTTP_DEADLINE_S;
        struct epoll_event ev = { .events = EPOLLIN, .data.u64 = ACT_TAG(TAG_HTTP, slot) };
        if (epoll_ctl(s->io[0].epfd, EPOLL_CTL_ADD, fd, &ev)) {
            http_close(s, h);
            continue;
        }
        act_http_read(s, slot);   /* a request that came with the connection is answered now */
    }
}

void act_http_read(act_server *s, int slot)
{
    if (slot < 0 || slot >= ACT_HTTP_SLOTS || s->http[slot].fd < 0) return;
    act_http_conn *h = &s->http[slot];
    if (h->answered) {   /* drop what is left of an oversized request until the peer closes */
        char sink[4096];
        ssize_t n = recv(h->fd, sink, sizeof sink, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        if (n <= 0) http_close(s, h);
        return;
    }
    ssize_t n = recv(h->fd, h->buf + h->got, ACT_HTTP_BUF - 1 - h->got, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
        http_close(s, h);
        return;
    }
    h->got += (size_t)n;
    h->buf[h->got] = 0;
    if (strstr(h->buf, "\r\n\r\n") || strstr(h->buf, "\n\n")) {
        http_respond(s, h);
        http_close(s, h);
    } else if (h->got >= ACT_HTTP_BUF - 1 || strlen(h->buf) < h->got) {
        /* too long, or a NUL byte: no request line will come. Answer, shut the write side and
         * read the rest away (until the peer closes or the deadline) so the 400 is not reset */
        const char *why = "request too large or not text\n";
        http_reply(h, 400, "text/plain", why, strlen(why));
        shutdown(h->fd, SHUT_WR);
        h->answered = 1;
    }
}

void act_http_expire(act_server *s, double now)
{
    for (int i = 0; i < ACT_HTTP_SLOTS; i++)
        if (s->http[i].fd >= 0 && now > s->http[i].deadline) http_close(s, &s->http[i]);
}

void act_http_close_all(act_server *s)
{
    for (int i = 0; i < ACT_HTTP_SLOTS; i++)
        if (s->http[i].fd >= 0) http_close(s, &s->http[i]);
}
