"""act-serve --proxy-protocol: a TCP balancer (HAProxy's send-proxy / send-proxy-v2) opens each
connection with a PROXY header naming the client it carries; the server reads it before the
HELLO, without taking a byte of the HELLO, and logs and audits that client instead of the
balancer. A connection without a well-formed header is refused with a message that says what
to fix; the Unix socket never carries one. (Through a real HAProxy: test_serve_scaleout.py.)
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "act_client"))
sys.path.insert(0, str(REPO / "tests" / "python"))

from act_client import ActClient, ActServerError, wire  # noqa: E402
from serve_util import Server, recv_frame  # noqa: E402
from test_serve import IMAGE, _build_tiny, _obs  # noqa: E402

V2_SIG = b"\r\n\r\n\x00\r\nQUIT\n"


def v2(cmd: int, fam: int, body: bytes) -> bytes:
    return V2_SIG + bytes([0x20 | cmd, fam]) + struct.pack(">H", len(body)) + body


def v2_tcp4(src: str, sport: int, dst="127.0.0.1", dport=7070, tlv=b"") -> bytes:
    return v2(1, 0x11, socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack(">HH", sport, dport) + tlv)


def v2_tcp6(src: str, sport: int, dst="::1", dport=7070) -> bytes:
    return v2(1, 0x21, socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst)
              + struct.pack(">HH", sport, dport))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, ref):
    return _build_tiny(tmp_path_factory.mktemp("tiny"), ref)


@pytest.fixture
def srv(act_serve, tiny, tmp_path):
    s = Server(act_serve, tiny[0], tmp_path, "--proxy-protocol", "--audit-log", tmp_path / "audit.jsonl",
               "--unix", tmp_path / "serve.sock").wait_ready()
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


def _predict_after(srv, cfg, rng, pieces, rid):
    """Sends pieces (the PROXY header, maybe split) with a pause between them, then HELLO and one
    PREDICT in a single send right behind the header's end; returns the connection's local
    address and the RESULT."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    for i, p in enumerate(pieces):
        if i:
            time.sleep(0.05)   # the server sees an incomplete header and must wait, not fail
        s.sendall(p if i < len(pieces) - 1 else p + wire.hello())
    mtype, p = recv_frame(s)
    assert mtype == wire.INFO, wire.parse_error(p) if mtype == wire.ERROR else mtype
    q, imgs = _obs(rng, cfg["camera_names"])
    s.sendall(wire.predict(rid, q, wire.encode_frames(imgs, cfg["camera_names"], (IMAGE, IMAGE))))
    mtype, p = recv_frame(s)
    assert mtype == wire.RESULT, wire.parse_error(p) if mtype == wire.ERROR else mtype
    local = "%s:%d" % s.getsockname()[:2]
    s.close()
    return local, wire.parse_result(p)


def _audit_peers(tmp_path):
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    return {a["id"]: a["peer"] for a in lines}


def test_headers_name_the_client_in_the_audit_log(srv, tiny, tmp_path, rng):
    _, cfg = tiny
    v1 = b"PROXY TCP4 203.0.113.7 127.0.0.1 4242 7070\r\n"
    cases = {
        1: ([v1], "203.0.113.7:4242"),
        2: ([v1[:9], v1[9:30], v1[30:]], "203.0.113.7:4242"),   # v1 in three segments
        3: ([v2_tcp4("198.51.100.9", 5151)], "198.51.100.9:5151"),
        4: ([v2_tcp6("2001:db8::17", 6161)[:10], v2_tcp6("2001:db8::17", 6161)[10:20],
             v2_tcp6("2001:db8::17", 6161)[20:]], "2001:db8::17:6161"),   # the signature split
        5: ([v2_tcp4("192.0.2.1", 80, tlv=bytes([0x04, 0, 3]) + b"abc")], "192.0.2.1:80"),   # a TLV skipped
        6: ([b"PROXY TCP6 2001:db8::5 ::1 7 7070\r\n"], "2001:db8::5:7"),
    }
    for rid, (pieces, _) in cases.items():
        _predict_after(srv, cfg, rng, pieces, rid)
    # the balancer's own connections (health checks): LOCAL, UNKNOWN - the socket's peer stays
    local = {rid: _predict_after(srv, cfg, rng, pieces, rid)[0]
             for rid, pieces in ((7, [v2(0, 0x00, b"")]), (8, [b"PROXY UNKNOWN\r\n"]),
                                 (9, [b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n"]))}
    peers = _audit_peers(tmp_path)
    assert {rid: peers[rid] for rid in cases} == {rid: want for rid, (_, want) in cases.items()}, peers
    assert {rid: peers[rid] for rid in local} == local, peers
    assert "PROXY header: the client is 203.0.113.7:4242" in srv.log()
    assert srv.metric("act_serve_connections_dropped_total") == 0


@pytest.mark.parametrize("first,says", [
    (wire.hello(), "does not start with a PROXY header"),                       # a client connecting directly
    (b"PROXY TCP4 203.0.113.7 127.0.0.1 99999 7070\r\n", "source port is not 0..65535"),
    (b"PROXY TCP4 2001:db8::1 127.0.0.1 1 2\r\n", "addresses are not of its family"),
    (b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", "not 'PROXY TCP4|TCP6"),
    (b"PROXY " + b"x" * 120, "without its CRLF in 107 bytes"),
    (v2(1, 0x11, b"\0" * 1000), "more than the 256 this server reads"),
    (v2(1, 0x11, b"\0" * 8), "shorter than its addresses"),
    (V2_SIG + bytes([0x31, 0x11, 0, 12]) + b"\0" * 12, "another version number"),
    (V2_SIG + bytes([0x2f, 0x11, 0, 12]) + b"\0" * 12, "neither LOCAL nor PROXY"),
    (V2_SIG + bytes([0x21, 0x41, 0, 12]) + b"\0" * 12, "unknown address family"),
    (V2_SIG + bytes([0x21, 0x12, 0, 12]) + b"\0" * 12, "datagram"),
    (b"PROXY TCP4 203.0.113.7 127.0.0.1 4242 7070\n" + wire.hello(), "bare LF"),
])
def test_a_missing_or_malformed_header_is_refused_saying_why(srv, first, says):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    s.sendall(first)
    mtype, p = recv_frame(s)
    assert mtype == wire.ERROR
    rid, code, msg = wire.parse_error(p)
    assert (rid, wire.ERROR_NAMES[code]) == (0, "malformed") and says in msg, msg
    s.shutdown(socket.SHUT_WR)
    assert s.recv(1) == b"", "the connection stays open after a bad PROXY header"
    assert srv.metric("act_serve_connections_dropped_total") >= 1
    assert srv.proc.poll() is None


def test_a_direct_client_gets_the_reason_and_the_unix_socket_needs_no_header(srv, tiny, tmp_path, rng):
    _, cfg = tiny
    q, imgs = _obs(rng, cfg["camera_names"])
    with pytest.raises(ActServerError, match="send-proxy") as e:
        ActClient("127.0.0.1", srv.port, timeout=10).predict(q, imgs)
    assert e.value.name == "malformed"
    c = ActClient(unix_path=str(tmp_path / "serve.sock"), timeout=60)
    assert np.isfinite(c.predict(q, imgs)).all()
    peers = list(_audit_peers(tmp_path).values())
    assert len(peers) == 1 and peers[0].startswith("unix:pid "), peers


def test_a_client_that_vanishes_inside_the_header_is_closed_quietly(srv):
    """A balancer's plain TCP health check (connect, close) leaves no line; a header cut off
    leaves one; neither counts as a misbehaving client."""
    for first in (b"", b"PROXY TCP4 1.2"):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        s.sendall(first)
        time.sleep(0.1)
        s.close()
        deadline = time.monotonic() + 10
        while srv.metric("act_serve_connections") > 0:
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.02)
        assert srv.log().count("closed before its PROXY header was complete") == (1 if first else 0), srv.log()
    assert srv.metric("act_serve_connections_dropped_total") == 0


def test_a_header_that_stalls_is_cut_at_the_frame_timeout(act_serve, tiny, tmp_path):
    s = Server(act_serve, tiny[0], tmp_path, "--proxy-protocol", "--frame-timeout-ms", 300).wait_ready()
    try:
        c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        c.sendall(V2_SIG[:7])
        assert c.recv(1) == b""   # closed by the server within the timeout
        assert "no whole PROXY header within --frame-timeout-ms" in s.log(), s.log()
    finally:
        s.proc.kill()
        s.proc.wait()
