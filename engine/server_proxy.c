/* server_proxy.c - the PROXY protocol header (HAProxy's, versions 1 and 2) that a TCP balancer
 * sends first on each connection it opens to a replica (`send-proxy` / `send-proxy-v2`), naming
 * the client it stands in for; act-serve --proxy-protocol reads it before the HELLO, so that the
 * logs and the audit log name the robot's address, not the balancer's.
 * defines: act_proxy_scan, act_proxy_peer, act_peer_format
 *
 * Version 1 is one text line of at most 107 bytes: "PROXY TCP4|TCP6 src dst sport dport\r\n" or
 * "PROXY UNKNOWN ...\r\n". Version 2 is a 12-byte signature, a version/command byte (0x20 LOCAL:
 * the balancer's own connection, e.g. a health check; 0x21 PROXY), a family byte, a 16-bit length
 * and that many bytes: the addresses (IPv4 12, IPv6 36), then optional TLVs, skipped here. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

static const uint8_t V2_SIG[12] = { 0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a };
#define V1_MAX 107

static int bad(char *msg, size_t msglen, const char *what)
{
    snprintf(msg, msglen, "PROXY protocol: %s", what);
    return -1;
}

long act_proxy_scan(const uint8_t *b, size_t n, char *msg, size_t msglen)
{
    static const char v1[] = "PROXY ";
    if (n && b[0] == 'P') {
        size_t k = n < 6 ? n : 6;
        if (memcmp(b, v1, k)) return bad(msg, msglen, "the connection does not start with a PROXY header");
        for (size_t i = 1; i < n && i < V1_MAX; i++)
            if (b[i] == '\n') {   /* a bare LF would have the search run on into the HELLO */
                if (b[i - 1] != '\r') return bad(msg, msglen, "a version 1 line ending in a bare LF, not CRLF");
                return (long)i + 1;
            }
        if (n >= V1_MAX) return bad(msg, msglen, "a version 1 line without its CRLF in 107 bytes");
        return 0;
    }
    size_t k = n < sizeof V2_SIG ? n : sizeof V2_SIG;
    if (memcmp(b, V2_SIG, k)) {
        return bad(msg, msglen, "the connection does not start with a PROXY header (version 1 or 2): is the "
                                "balancer set to send one (HAProxy: send-proxy or send-proxy-v2 on the server "
                                "line), or is this client connecting directly (connect to the balancer's address instead)?");
    }
    if (n < ACT_PROXY_V2_HDR) return 0;
    size_t len = ((size_t)b[14] << 8) | b[15];
    if (ACT_PROXY_V2_HDR + len > ACT_PROXY_MAX) {
        snprintf(msg, msglen, "PROXY protocol: a version 2 header of %zu bytes, more than the %d this server "
                              "reads (addresses and a few TLVs): drop the balancer's proxy-v2-options",
                 ACT_PROXY_V2_HDR + len, ACT_PROXY_MAX);
        return -1;
    }
    return n >= ACT_PROXY_V2_HDR + len ? (long)(ACT_PROXY_V2_HDR + len) : 0;
}

int act_peer_format(char *peer, size_t peerlen, int af, const void *addr, unsigned port)
{
    char a[INET6_ADDRSTRLEN];
    if (!inet_ntop(af, addr, a, sizeof a)) return -1;
    snprintf(peer, peerlen, "%s:%u", a, port);
    return 0;
}

/* a v1 port: decimal digits only, 0..65535; -1 when it is not one */
static long v1_port(const char *t)
{
    char *end;
    long p = strtol(t, &end, 10);
    return !t[0] || *end || t[0] == '+' || t[0] == '-' || p > 65535 ? -1 : p;
}

static int v1_peer(const uint8_t *b, size_t len, char *peer, size_t peerlen, char *msg, size_t msglen)
{
    char line[V1_MAX + 1];
    memcpy(line, b, len - 2);   /* without the CRLF */
    line[len - 2] = 0;
    char *save = NULL, *tok[7];
    int nt = 0;
    for (char *t = strtok_r(line, " ", &save); t && nt < 7; t = strtok_r(NULL, " ", &save)) tok[nt++] = t;
    if (nt >= 2 && !strcmp(tok[1], "UNKNOWN")) return 0;   /* the balancer's own, or unknown: no address */
    if (nt != 6 || (strcmp(tok[1], "TCP4") && strcmp(tok[1], "TCP6")))
        return bad(msg, msglen, "a version 1 line that is not 'PROXY TCP4|TCP6 src dst sport dport' or 'PROXY UNKNOWN'");
    int af = tok[1][3] == '4' ? AF_INET : AF_INET6;
    uint8_t src[16], dst[16];
    if (inet_pton(af, tok[2], src) != 1 || inet_pton(af, tok[3], dst) != 1)
        return bad(msg, msglen, "a version 1 line whose addresses are not of its family");
    long sport = v1_port(tok[4]);
    if (sport < 0) return bad(msg, msglen, "a version 1 line whose source port is not 0..65535");
    if (v1_port(tok[5]) < 0) return bad(msg, msglen, "a version 1 line whose destination port is not 0..65535");
    return act_peer_format(peer, peerlen, af, src, (unsigned)sport) ? bad(msg, msglen, "an unprintable address") : 0;
}

int act_proxy_peer(const uint8_t *b, size_t len, char *peer, size_t peerlen, char *msg, size_t msglen)
{
    peer[0] = 0;
    if (b[0] == 'P') return v1_peer(b, len, peer, peerlen, msg, msglen);
    int ver = b[12] >> 4, cmd = b[12] & 15, af = b[13] >> 4, transport = b[13] & 15;
    size_t alen = len - ACT_PROXY_V2_HDR;
    const uint8_t *a = b + ACT_PROXY_V2_HDR;
    if (ver != 2) return bad(msg, msglen, "a version 2 signature with another version number");
    if (cmd == 0) return 0;   /* LOCAL: the balancer's own connection (a health check) */
    if (cmd != 1) return bad(msg, msglen, "a version 2 header whose command is neither LOCAL nor PROXY");
    if (af > 3 || transport > 2) return bad(msg, msglen, "a version 2 header of an unknown address family or transport");
    if (af == 0) return 0;   /* UNSPEC: the connection's own endpoints stand */
    if (transport != 1) return bad(msg, msglen, "a version 2 header for a datagram (or no) transport on a TCP connection");
    if (af == 1) {   /* INET */
        if (alen < 12) return bad(msg, msglen, "a version 2 IPv4 header shorter than its addresses");
        return act_peer_format(peer, peerlen, AF_INET, a, ((unsigned)a[8] << 8) | a[9]) ? bad(msg, msglen, "an unprintable address") : 0;
    }
    if (af == 2) {   /* INET6 */
        if (alen < 36) return bad(msg, msglen, "a version 2 IPv6 header shorter than its addresses");
        return act_peer_format(peer, peerlen, AF_INET6, a, ((unsigned)a[32] << 8) | a[33]) ? bad(msg, msglen, "an unprintable address") : 0;
    }
    return 0;   /* UNIX: nothing to print as an address */
}
