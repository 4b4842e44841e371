/* http.c - the metrics side port: just enough HTTP/1.0 for /healthz and /metrics, served by the
 * first I/O thread.
 * Each connection sends one GET, gets one response and is closed. Requests are capped at
 * ACT_HTTP_BUF bytes and a 2 s deadline; a full table refuses new connections at once. The
 * response is small (a few KiB), so one non-blocking send delivers it on any sane socket;
 * a peer whose buffer cannot take it loses the response rather than stalling the I/O thread. */
#define _GNU_SOURCE
#include "server_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define HTTP_DEADLINE_S 2.0

static void http_close(act_server *s, act_http_conn *h)
{
    epoll_ctl(s->io[0].epfd, EPOLL_CTL_DEL, h->fd, NULL);
    close(h->fd);
    h->fd = -1;
    h->got = 0;
}

static void http_reply(act_http_conn *h, int status, const char *ctype, const char *body, size_t blen)
{
    char head[256];
    const char *reason = status == 200 ? "OK" : status == 404 ? "Not Found" : status == 405 ? "Method Not Allowed"
                       : status == 503 ? "Service Unavailable" : "Bad Request";
    int n = snprintf(head, sizeof head,
                     "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                     status, reason, ctype, blen);
    if (send(h->fd, head, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) == n && blen)
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
    if (q) *q = 0;
    if (strcmp(method, "GET") != 0) {
        http_reply(h, 405, "text/plain", "only GET\n", 9);
        return;
    }
    if (strcmp(path, "/healthz") == 0) {
        int draining = atomic_load(&s->draining), ready = atomic_load(&s->ready) && !draining;
        char why[256], body[300];
        int failing = act_metrics_failing(&s->metrics, why, sizeof why);
        if (failing) snprintf(body, sizeof body, "failing: %s\n", why);
        else snprintf(body, sizeof body, "%s", ready ? "ok\n" : draining ? "draining\n" : "loading\n");
        http_reply(h, ready && !failing ? 200 : 503, "text/plain", body, strlen(body));
    } else if (strcmp(path, "/metrics") == 0) {
        size_t len = 0;
        char *body = act_metrics_render(&s->metrics, atomic_load(&s->ready), atomic_load(&s->draining), &len);
        if (body) http_reply(h, 200, "text/plain; version=0.0.4", body, len);
        else http_reply(h, 503, "text/plain", "out of memory\n", 14);
        free(body);
    } else {
        http_reply(h, 404, "text/plain", "try /healthz or /metrics\n", 25);
    }
}

void act_http_accept(act_server *s)
{
    for (;;) {
        int fd = accept4(s->mfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        int slot = -1;
        for (int i = 0; i < ACT_HTTP_SLOTS && slot < 0; i++)
            if (s->http[i].fd < 0) slot = i;
        if (slot < 0) {
            close(fd);
            continue;
        }
        act_http_conn *h = &s->http[slot];
        h->fd = fd;
        h->got = 0;
        h->deadline = act_now() + HTTP_DEADLINE_S;
        struct epoll_event ev = { .events = EPOLLIN, .data.u64 = ACT_TAG(TAG_HTTP, slot) };
        if (epoll_ctl(s->io[0].epfd, EPOLL_CTL_ADD, fd, &ev)) http_close(s, h);
    }
}

void act_http_read(act_server *s, int slot)
{
    if (slot < 0 || slot >= ACT_HTTP_SLOTS || s->http[slot].fd < 0) return;
    act_http_conn *h = &s->http[slot];
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
    } else if (h->got >= ACT_HTTP_BUF - 1) {
        http_reply(h, 400, "text/plain", "request too large\n", 18);
        http_close(s, h);
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
