/* fuzz_proxy.c - the PROXY protocol header reader of act-serve --proxy-protocol
 * (engine/server_proxy.c): the first bytes of a TCP connection, from a balancer or from anyone
 * who can reach the port.
 *
 * The input is the connection's first bytes. The server calls act_proxy_scan on every prefix the
 * socket happens to deliver, so the harness does too, and checks that the verdicts agree: a
 * prefix judged "not yet whole" (0) stays a prefix of whatever a longer one is judged, a header
 * found whole (L) is found at the same L in every longer prefix, and one refused stays refused;
 * L never passes ACT_PROXY_MAX (the server's buffer). A whole header then goes to act_proxy_peer,
 * whose peer must be a terminated string that fits its buffer, "addr:port" or empty. */
#include "fuzz.h"

#include <string.h>

#include "server_internal.h"

int act_fuzz_proxy(const uint8_t *data, size_t size)
{
    char msg[320];
    long first = 0;   /* the first prefix's verdict that was not "not yet whole" */
    size_t at = 0;
    for (size_t n = 0; n <= size; n++) {
        long v = act_proxy_scan(data, n, msg, sizeof msg);
        FUZZ_ASSERT(v >= -1 && v <= (long)n && v <= ACT_PROXY_MAX, "scan of %zu bytes said %ld", n, v);
        if (first == 0 && v != 0) {
            first = v;
            at = n;
            if (v > 0) FUZZ_ASSERT((size_t)v == n, "a header of %ld bytes seen whole only at %zu", v, n);
        } else if (first != 0) {
            FUZZ_ASSERT(v == first, "%zu bytes said %ld, %zu bytes said %ld", at, first, n, v);
        }
        if (first == 0) FUZZ_ASSERT(n < ACT_PROXY_MAX, "%zu bytes still not a whole header", n);
    }
    if (first > 0) {
        char peer[64];
        memset(peer, 'x', sizeof peer);
        int r = act_proxy_peer(data, (size_t)first, peer, sizeof peer, msg, sizeof msg);
        FUZZ_ASSERT(r == 0 || r == -1, "peer said %d", r);
        FUZZ_ASSERT(memchr(peer, 0, sizeof peer) != NULL, "peer not terminated");
        if (r == 0 && peer[0]) FUZZ_ASSERT(strchr(peer, ':') != NULL, "peer '%s' without a port", peer);
        if (r == -1) FUZZ_ASSERT(memchr(msg, 0, sizeof msg) && !strncmp(msg, "PROXY protocol: ", 16), "bad message");
    }
    return 0;
}
