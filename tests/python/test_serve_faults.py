"""act-serve under bad input: every fault gets a clear ERROR or a closed connection, and never
harms the other clients or the process.

One server (small CPU model) serves the whole module; after every fault a well-behaved client
that stayed connected throughout must still get correct chunks, and the server must still run.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "act_client"))

from act_client import ActClient  # noqa: E402
from act_client import wire  # noqa: E402
from serve_util import BATCH_TOL, Server, recv_frame  # noqa: E402

IMAGE = 40
CAMS = ["l_vis", "r_vis", "front"]


def _start(exe, model, workdir: Path, *extra):
    s = Server(exe, model, workdir, *extra).wait_ready()
    return s.proc, s.port, s.mport, s.logpath


def _metrics(mport) -> str:
    c = http.client.HTTPConnection("127.0.0.1", mport, timeout=10)
    c.request("GET", "/metrics")
    return c.getresponse().read().decode()


def _metric(mport, name) -> float:
    for line in _metrics(mport).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


@pytest.fixture(scope="module")
def srv(act_serve, ref, tmp_path_factory):
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import conftest

    d = tmp_path_factory.mktemp("faults")
    cfg = conftest.small_cfg(image_size=IMAGE, vision_backbone={"input_shape": [3, 48, 48]})
    agent = ref.randomize_(ref.build_agent(cfg), 11)
    ref.save_checkpoint(agent, str(d / "ck.pt"), cfg, layout="model_state_dict", stats_in="state_dict", prefix="",
                        stats_path=str(d / "st.pkl"), config_path=str(d / "ck.yaml"), include_config=False)
    model = d / "tiny.actw"
    subprocess.run([sys.executable, str(REPO / "tools" / "convert_checkpoint.py"), str(d / "ck.pt"), "-o", str(model),
                    "--config", str(d / "ck.yaml"), "--stats", str(d / "st.pkl")], check=True, capture_output=True)
    # small output queue so a client that never reads is found quickly
    proc, port, mport, log = _start(act_serve, model, d, "--max-out-bytes", 65536, "--max-clients", 256,
                                    "--frame-timeout-ms", 1500)
    rng = np.random.default_rng(2024)
    q = rng.standard_normal(5).astype(np.float32)
    imgs = {c: rng.integers(0, 256, (IMAGE, IMAGE, 3), dtype=np.uint8) for c in CAMS}
    good = ActClient("127.0.0.1", port, timeout=120)
    want = good.predict(q, imgs)
    ns = type("Srv", (), dict(proc=proc, port=port, mport=mport, log=log, good=good, q=q, imgs=imgs, want=want,
                              model=model, exe=act_serve, dir=d))
    yield ns
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, log.read_text()


@pytest.fixture(autouse=True)
def still_serving(srv):
    """After each fault: the process lives and the client connected all along is served."""
    yield
    assert srv.proc.poll() is None, srv.log.read_text()
    reconnects = srv.good.reconnects
    np.testing.assert_allclose(srv.good.predict(srv.q, srv.imgs), srv.want, **BATCH_TOL)
    assert srv.good.reconnects == reconnects, "the well-behaved client lost its connection"


def _conn(srv, hello=True):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    if hello:
        s.sendall(wire.hello(client_name="faulty"))
        assert recv_frame(s)[0] == wire.INFO
    return s




def _expect_error(s, name, fragment, rid=None, closed=False):
    mtype, p = recv_frame(s)
    assert mtype == wire.ERROR, f"expected ERROR {name}, got type {mtype}"
    erid, code, msg = wire.parse_error(p)
    assert wire.ERROR_NAMES[code] == name and fragment in msg, (wire.ERROR_NAMES[code], msg)
    if rid is not None:
        assert erid == rid
    if closed:
        assert s.recv(1) == b"", "connection should be closed after a framing error"
    return msg


def _frames(srv, **over):
    imgs = dict(srv.imgs, **over)
    return [(c, wire.ENC_RAW, IMAGE, IMAGE, np.ascontiguousarray(imgs[c]).tobytes()) for c in CAMS]


# ---- framing errors: ERROR, then the connection closes ----
def test_wrong_magic(srv):
    s = _conn(srv, hello=False)
    s.sendall(wire.frame(wire.HELLO, b"", magic=b"HTTP"))
    _expect_error(s, "bad_magic", "expected \"ACTS\"", closed=True)


def test_wrong_version(srv):
    s = _conn(srv, hello=False)
    s.sendall(wire.frame(wire.HELLO, b"\0" * 21, version=7))
    _expect_error(s, "bad_version", "version 7", closed=True)


def test_oversized_frame_is_refused_before_allocation(srv):
    s = _conn(srv)
    s.sendall(wire.HDR.pack(wire.MAGIC, wire.VERSION, wire.PREDICT, 0xFFFFFFF0))
    _expect_error(s, "too_large", "exceeds the limit", closed=True)
    s = _conn(srv, hello=False)
    s.sendall(wire.HDR.pack(wire.MAGIC, wire.VERSION, wire.HELLO, 1 << 20))
    _expect_error(s, "too_large", "exceeds the limit", closed=True)


def test_unknown_type_and_predict_before_hello(srv):
    s = _conn(srv)
    s.sendall(wire.frame(wire.RESULT, b"\0" * 8))
    _expect_error(s, "bad_type", "type 4", closed=True)
    s = _conn(srv, hello=False)
    s.sendall(wire.predict(1, srv.q, _frames(srv)))
    _expect_error(s, "no_hello", "HELLO first", closed=True)


def test_garbage_bytes(srv):
    rng = np.random.default_rng(7)
    for _ in range(20):
        s = _conn(srv, hello=bool(rng.integers(2)))
        s.sendall(rng.integers(0, 256, int(rng.integers(1, 4096)), dtype=np.uint8).tobytes())
        s.shutdown(socket.SHUT_WR)   # a short header must not leave the server waiting forever
        s.settimeout(10)
        try:
            while s.recv(4096):   # whatever it answers, it must end the conversation
                pass
        except ConnectionResetError:
            pass
        s.close()


def test_disconnect_mid_frame(srv):
    full = wire.predict(5, srv.q, _frames(srv))
    for cut in (3, 12, 40, len(full) // 2, len(full) - 1):
        s = _conn(srv)
        s.sendall(full[:cut])
        s.close()
    s = _conn(srv, hello=False)
    s.sendall(wire.hello()[:10])
    s.close()


# ---- content errors: ERROR with the request id, and the connection stays usable ----
def _predict_error(srv, payload_frame, name, fragment, rid):
    s = _conn(srv)
    s.sendall(payload_frame)
    _expect_error(s, name, fragment, rid=rid)
    s.sendall(wire.predict(rid + 1, srv.q, _frames(srv)))   # same connection, a good request
    mtype, p = recv_frame(s)
    assert mtype == wire.RESULT
    r = wire.parse_result(p)
    assert r["request_id"] == rid + 1
    np.testing.assert_allclose(r["chunk"], srv.want, **BATCH_TOL)
    s.close()


def test_wrong_qpos_width(srv):
    _predict_error(srv, wire.predict(10, np.zeros(6, np.float32), _frames(srv)), "bad_qpos", "obs_dim 5", 10)
    nan_q = srv.q.copy()
    nan_q[2] = np.nan
    _predict_error(srv, wire.predict(12, nan_q, _frames(srv)), "bad_qpos", "NaN", 12)


def test_missing_extra_unknown_and_misordered_cameras(srv):
    f = _frames(srv)
    _predict_error(srv, wire.predict(20, srv.q, f[:2]), "bad_camera", "2 cameras sent, model expects 3", 20)
    extra = f + [("top", wire.ENC_RAW, IMAGE, IMAGE, b"x")]   # small: a full 4th frame would be too_large
    _predict_error(srv, wire.predict(22, srv.q, extra), "bad_camera", "4 cameras sent", 22)
    unknown = [("wrist",) + f[0][1:]] + f[1:]
    _predict_error(srv, wire.predict(24, srv.q, unknown), "bad_camera", "unknown camera 'wrist'", 24)
    _predict_error(srv, wire.predict(26, srv.q, [f[1], f[0], f[2]]), "bad_camera", "model order", 26)


def test_wrong_frame_size(srv):
    f = _frames(srv)
    small = [(c, wire.ENC_RAW, 32, 32, b"\0" * (32 * 32 * 3)) for c in CAMS]
    _predict_error(srv, wire.predict(30, srv.q, small), "bad_frame", "is 32x32, model expects 40x40", 30)
    short = [f[0][:4] + (f[0][4][:-3],)] + f[1:]
    _predict_error(srv, wire.predict(32, srv.q, short), "bad_frame", "raw frame has 4797 bytes", 32)
    bad_enc = [(f[0][0], 9) + f[0][2:]] + f[1:]
    _predict_error(srv, wire.predict(34, srv.q, bad_enc), "bad_frame", "encoding 9", 34)


def test_corrupt_and_wrong_size_zstd(srv):
    zstandard = pytest.importorskip("zstandard", reason="zstandard is not installed")
    info = srv.good.info()
    if not info["zstd"]:
        pytest.skip("this act-serve was built without zstd")
    f = _frames(srv)
    good = zstandard.ZstdCompressor(write_checksum=True).compress(f[0][4])
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0xFF   # caught by the frame checksum the client writes
    for i, corrupt in enumerate((bytes(flipped), good[:-10])):
        bad = [(f[0][0], wire.ENC_ZSTD, IMAGE, IMAGE, corrupt)] + f[1:]
        _predict_error(srv, wire.predict(40 + i, srv.q, bad), "bad_zstd", "corrupt", 40 + i)
    junk = [(f[0][0], wire.ENC_ZSTD, IMAGE, IMAGE, b"not zstd at all")] + f[1:]
    _predict_error(srv, wire.predict(46, srv.q, junk), "bad_zstd", "not a zstd frame", 46)
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (IMAGE * IMAGE * 3 * 50))
    big = [(f[0][0], wire.ENC_ZSTD, IMAGE, IMAGE, bomb)] + f[1:]
    _predict_error(srv, wire.predict(44, srv.q, big), "bad_frame", "inflates to 240000 bytes", 44)
    # one frame per camera: a second one after it (or a skippable frame) is named as such; a frame
    # whose header leaves out the content size is fine
    flat = zstandard.ZstdCompressor().compress(bytes(len(f[0][4])))   # small: two fit the limit
    two = [(f[0][0], wire.ENC_ZSTD, IMAGE, IMAGE, flat + flat)] + f[1:]
    _predict_error(srv, wire.predict(47, srv.q, two), "bad_zstd",
                   f"carries {len(flat)} bytes after its zstd frame of {len(flat)}", 47)
    skippable = flat + struct.pack("<II", 0x184D2A50, 4) + b"pad!"
    after = [(f[0][0], wire.ENC_ZSTD, IMAGE, IMAGE, skippable)] + f[1:]
    _predict_error(srv, wire.predict(48, srv.q, after), "bad_zstd", "carries 12 bytes after its zstd frame", 48)
    streamed = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    nosize = streamed.compress(f[0][4]) + streamed.flush()
    assert zstandard.frame_content_size(nosize) == -1   # no content size in its header
    ok = [(f[0][0], wire.ENC_ZSTD, IMAGE, IMAGE, nosize)] + f[1:]
    c = _conn(srv)
    c.sendall(wire.predict(49, srv.q, ok))
    t, p = recv_frame(c)
    assert t == wire.RESULT, (t, p)
    r = wire.parse_result(p)
    assert r["request_id"] == 49
    np.testing.assert_allclose(r["chunk"], srv.want, **BATCH_TOL)
    c.close()


def test_truncated_payload_and_trailing_bytes(srv):
    full = wire.predict(50, srv.q, _frames(srv))
    body = full[12:]
    cut = wire.frame(wire.PREDICT, body[:-100])
    _predict_error(srv, cut, "malformed", "remain", 50)
    _predict_error(srv, wire.frame(wire.PREDICT, body + b"xx"), "malformed", "2 trailing bytes", 50)


def test_bad_action_chunk(srv):
    info = srv.good.info()
    H, A = info["pred_horizon"], info["action_dim"]
    f = _frames(srv)
    wrong = wire.predict(60, srv.q, f, actions=np.zeros((H, A + 1), np.float32))
    _predict_error(srv, wrong, "bad_actions", f"model expects [{H},{A}]", 60)
    nan = np.zeros((H, A), np.float32)
    nan[0, 0] = np.inf
    _predict_error(srv, wire.predict(62, srv.q, f, actions=nan), "bad_actions", "NaN or Inf", 62)


# ---- resource abuse ----
def test_client_that_never_reads_is_dropped(srv):
    s = socket.socket()
    # a small receive window, set before connecting (shrinking it later makes loopback TCP drop
    # segments and back off for minutes, which would test the kernel, not the server)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(60)
    s.connect(("127.0.0.1", srv.port))
    s.sendall(wire.hello(client_name="never-reads"))
    assert recv_frame(s)[0] == wire.INFO
    pings = b"".join(wire.ping(i) for i in range(2000))
    dropped = _metric(srv.mport, "act_serve_connections_dropped_total")
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            s.sendall(pings)   # never reads a PONG: the server's queue for it must overflow
    except (BrokenPipeError, ConnectionResetError):
        pass
    except socket.timeout:
        pytest.fail("the server stopped reading a client that floods it:\n" + srv.log.read_text()[-3000:])
    assert _metric(srv.mport, "act_serve_connections_dropped_total") > dropped
    assert "does not read its replies" in srv.log.read_text()


def test_thousands_of_connections_opened_and_dropped(srv):
    rng = np.random.default_rng(3)
    hello = wire.hello()
    graceful = 0

    def handled():   # connections the server took: served, or refused with an ERROR (max clients)
        return (_metric(srv.mport, "act_serve_connections_total")
                + sum(_metric(srv.mport, f'act_serve_connections_refused_total{{reason="{r}"}}')
                      for r in ("max_clients", "draining", "no_fds")))

    handled0 = handled()
    for _ in range(10):
        socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=60) for _ in range(200)]
        for s in socks:
            mode = rng.integers(3)
            if mode == 1:
                s.sendall(hello)
            elif mode == 2:
                s.sendall(hello[: int(rng.integers(1, len(hello)))])
            if rng.integers(2):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # RST
            else:
                graceful += 1
            s.close()
    # every connection the kernel handed over is taken and released again: accepted, or refused
    # when a slow server finds more queued than --max-clients before it has seen the earlier ones
    # hang up (a reset one may die in the accept queue, so only the graceful ones are sure to count)
    deadline = time.monotonic() + 60
    while _metric(srv.mport, "act_serve_connections") > 1 or handled() - handled0 < graceful:
        assert time.monotonic() < deadline, _metrics(srv.mport) + srv.log.read_text()[-3000:]
        time.sleep(0.05)


def test_stalled_frames_and_silent_connections_time_out(srv):
    dropped = _metric(srv.mport, "act_serve_connections_dropped_total")
    silent = _conn(srv, hello=False)                    # never says HELLO
    header = _conn(srv)
    header.sendall(wire.predict(90, srv.q, _frames(srv))[:5])      # stalls inside a header
    payload = _conn(srv)
    payload.sendall(wire.predict(91, srv.q, _frames(srv))[:3000])  # stalls inside a payload
    t0 = time.monotonic()
    for s in (silent, header, payload):
        s.settimeout(30)
        assert s.recv(1) == b"", "a stalled connection must be closed"
    assert time.monotonic() - t0 < 20
    assert _metric(srv.mport, "act_serve_connections_dropped_total") >= dropped + 3
    log = srv.log.read_text()
    assert "no HELLO within --frame-timeout-ms" in log and "frame not completed within --frame-timeout-ms" in log


def test_max_clients_refuses_the_extra_connection(act_serve, srv):
    proc, port, mport, log = _start(act_serve, srv.model, srv.dir, "--max-clients", 2)
    try:
        a = ActClient("127.0.0.1", port, timeout=30)
        b = ActClient("127.0.0.1", port, timeout=30)
        a.info(), b.info()
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        try:   # the refusal says why, unless the reset of the close overtakes it
            _expect_error(s, "overloaded", "max clients (2) reached", closed=True)
        except ConnectionError:
            pass
        assert "max clients (2) reached" in log.read_text()
        assert _metric(mport, 'act_serve_connections_refused_total{reason="max_clients"}') == 1
        assert a.ping() > 0 and b.ping() > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()


def test_backlog_beyond_max_clients_after_a_stall_is_refused_and_counted(act_serve, srv):
    # a server that stalls (here: SIGSTOP) while clients connect and leave finds more queued than
    # --max-clients at once; it refuses the excess with a counted refusal and then serves again
    # one I/O thread: with more, the others close the hung-up connections while the first still
    # accepts, and all 40 may find a slot
    proc, port, mport, log = _start(act_serve, srv.model, srv.dir, "--max-clients", 8, "--io-threads", 1)
    try:
        proc.send_signal(signal.SIGSTOP)
        # a group stop reaches each thread when it next runs: on a loaded machine a thread (the
        # I/O thread itself) can go on accepting for a while, so wait until every one is stopped
        deadline = time.monotonic() + 30
        while any(open(f"/proc/{proc.pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0] != "T"
                  for t in os.listdir(f"/proc/{proc.pid}/task")):
            assert time.monotonic() < deadline, "act-serve did not stop within 30 s of SIGSTOP"
            time.sleep(0.01)
        for _ in range(40):
            socket.create_connection(("127.0.0.1", port), timeout=30).close()
        proc.send_signal(signal.SIGCONT)
        refused = 'act_serve_connections_refused_total{reason="max_clients"}'
        deadline = time.monotonic() + 60
        while (_metric(mport, "act_serve_connections") > 0
               or _metric(mport, "act_serve_connections_total") + _metric(mport, refused) < 40):
            assert time.monotonic() < deadline, _metrics(mport) + log.read_text()[-3000:]
            time.sleep(0.05)
        # every connection accounted for, once; how many a slot freed in time took varies
        assert _metric(mport, "act_serve_connections_total") + _metric(mport, refused) == 40
        assert _metric(mport, refused) > 0
        c = ActClient("127.0.0.1", port, timeout=30)
        np.testing.assert_allclose(c.predict(srv.q, srv.imgs), srv.want, rtol=1e-5, atol=1e-6)
        c.close()
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()


def test_overload_is_an_error_not_a_stall(act_serve, srv):
    proc, port, mport, log = _start(act_serve, srv.model, srv.dir, "--max-queue", 2, "--max-batch", 1)
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=120)
        s.sendall(wire.hello())
        assert recv_frame(s)[0] == wire.INFO
        s.sendall(b"".join(wire.predict(70 + i, srv.q, _frames(srv)) for i in range(6)))
        kinds = {}
        for _ in range(6):
            mtype, p = recv_frame(s)
            if mtype == wire.RESULT:
                kinds[wire.parse_result(p)["request_id"]] = "ok"
            else:
                rid, code, msg = wire.parse_error(p)
                assert wire.ERROR_NAMES[code] == "overloaded" and "limit 2" in msg, msg
                kinds[rid] = "overloaded"
        assert sorted(kinds) == list(range(70, 76))
        assert kinds[70] == "ok" and kinds[71] == "ok" and "overloaded" in kinds.values()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()


def test_half_closed_client_still_gets_its_replies(srv):
    s = _conn(srv)
    s.sendall(b"".join(wire.predict(80 + i, srv.q, _frames(srv)) for i in range(3)))
    s.shutdown(socket.SHUT_WR)   # "that is all I will send": the answers are still owed
    ids = []
    for _ in range(3):
        mtype, p = recv_frame(s)
        assert mtype == wire.RESULT
        r = wire.parse_result(p)
        np.testing.assert_allclose(r["chunk"], srv.want, **BATCH_TOL)
        ids.append(r["request_id"])
    assert sorted(ids) == [80, 81, 82]
    assert s.recv(1) == b"", "the server closes once it has answered everything"


# ---- connections that hold on: dead peers, abandoned queues, the health port ----
def _server_sockets(port):
    """(remote port, timer kind) of act-serve's established sockets on port, from /proc/net/tcp
    (timer kind 2: keepalive; 0: none)."""
    out = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(path):
            continue
        for line in open(path).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port:
                out.append((int(f[2].rsplit(":", 1)[1], 16), int(f[5].split(":")[0], 16)))
    return out


def test_idle_tcp_peers_are_probed_by_keepalive(act_serve, srv):
    """A robot that loses power between requests leaves no FIN: keepalive (--keepalive-s) is
    how the server finds out; without it the slot and the batcher's wait stay forever."""
    s = _conn(srv)
    mine = s.getsockname()[1]
    assert (mine, 2) in _server_sockets(srv.port), _server_sockets(srv.port)
    s.close()
    proc, port, mport, log = _start(act_serve, srv.model, srv.dir, "--keepalive-s", 0)
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=30)
        c.sendall(wire.hello())
        assert recv_frame(c)[0] == wire.INFO
        assert (c.getsockname()[1], 0) in _server_sockets(port)   # 0: the kernel's (off)
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()


def test_queued_requests_of_a_closed_connection_are_dropped_unrun(act_serve, srv, tmp_path):
    """A worker that pipelines requests and dies must not leave its queue to be computed ahead
    of live clients: every request is either run (one batch each at --max-batch 1) or dropped.
    Every request is accounted for, in /metrics and in the audit log: answered (ok), dropped
    unrun, or run after its connection closed (undelivered) - the last two used to have no audit
    line, and the last was counted nowhere. A connection that takes the closed one's slot while
    its requests still run does not take their audit lines' peer and client name."""
    n = 200
    audit = tmp_path / "audit.jsonl"
    proc, port, mport, log = _start(act_serve, srv.model, srv.dir, "--max-batch", 1, "--max-queue", n,
                                    "--max-inflight", n, "--audit-log", audit)
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.sendall(wire.hello(client_name="dying-worker"))
        assert recv_frame(s)[0] == wire.INFO
        peer = "%s:%d" % s.getsockname()
        batches0 = _metric(mport, "act_serve_batches_total")
        requests0 = _metric(mport, "act_serve_requests_total")
        s.sendall(b"".join(wire.predict(i, srv.q, _frames(srv)) for i in range(n)))
        deadline = time.monotonic() + 60
        while _metric(mport, "act_serve_inflight") < n // 2:
            assert time.monotonic() < deadline, _metrics(mport)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()   # a reset: the worker is gone
        successor = socket.create_connection(("127.0.0.1", port), timeout=60)   # takes its slot
        successor.sendall(wire.hello(client_name="successor"))
        assert recv_frame(successor)[0] == wire.INFO
        deadline = time.monotonic() + 120
        while _metric(mport, "act_serve_inflight") > 0:
            assert time.monotonic() < deadline, _metrics(mport)
            time.sleep(0.05)
        dropped = _metric(mport, "act_serve_abandoned_requests_total")
        ran = _metric(mport, "act_serve_batches_total") - batches0
        got = _metric(mport, "act_serve_requests_total") - requests0   # the reset loses the unread rest
        assert dropped > 0 and ran + dropped == got >= n // 2, (ran, dropped, got)
        assert "queued requests of the closed connection dropped" in log.read_text()
        results = _metric(mport, "act_serve_results_total")
        undelivered = _metric(mport, "act_serve_undelivered_results_total")
        assert results + undelivered == ran, (results, undelivered, ran)
        lines = [json.loads(line) for line in audit.read_text().splitlines()]
        status = [a["status"] for a in lines]
        assert len(lines) == got and set(status) <= {"ok", "abandoned"}, (len(lines), got, set(status))
        assert status.count("ok") == results and status.count("abandoned") == dropped + undelivered, status
        assert all(a["peer"] == peer and a["client"] == "dying-worker" for a in lines), \
            [a for a in lines if a["peer"] != peer or a["client"] != "dying-worker"][:3]
        successor.close()
        c = ActClient("127.0.0.1", port, timeout=30)
        np.testing.assert_allclose(c.predict(srv.q, srv.imgs), srv.want, **BATCH_TOL)
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()


def _healthz(mport, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", mport, timeout=timeout)
    c.request("GET", "/healthz")
    r = c.getresponse()
    return r.status, r.read().decode()


def test_silent_connections_cannot_starve_healthz(srv):
    silent = [socket.create_connection(("127.0.0.1", srv.mport), timeout=10) for _ in range(40)]
    try:
        for _ in range(5):   # each probe takes the slot of the connection silent longest
            assert _healthz(srv.mport) == (200, "ok\n")
    finally:
        for s in silent:
            s.close()


def _read_to_eof(sock):
    """Everything the server sends until it closes; the socket is closed after."""
    got = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    sock.close()
    return got


def test_two_probes_arriving_together_are_both_answered_when_the_slots_are_full(srv):
    """32 connections that sent a byte and hold (a slow scraper, a slowloris) fill the metrics
    port's slots; a load balancer's check and a Prometheus scrape then arrive together. The
    first used to be given up for the second, unread and unanswered (accepted in the same round,
    it counted as the connection silent longest): a lost health check marks a replica down."""
    for _ in range(10):
        held = []
        try:
            for _ in range(32):
                h = socket.create_connection(("127.0.0.1", srv.mport), timeout=10)
                h.sendall(b"G")
                held.append(h)
            time.sleep(0.05)
            probes = [socket.create_connection(("127.0.0.1", srv.mport), timeout=10) for _ in range(2)]
            for p in probes:
                p.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            for i, p in enumerate(probes):
                got = _read_to_eof(p)
                assert got.startswith(b"HTTP/1.0 200"), (i, got)
        finally:
            for h in held:
                h.close()
        time.sleep(0.05)


def _http_raw(mport, request):
    s = socket.create_connection(("127.0.0.1", mport), timeout=10)
    s.sendall(request)
    return _read_to_eof(s)


def test_http_absolute_form_and_other_methods(srv):
    """A proxy's absolute-form request line (RFC 7230 5.3.2) is served like the path alone; HEAD
    (a load balancer's health check may use it) gets GET's status and headers without the body;
    another method gets 405 with the Allow header RFC 7231 asks for."""
    got = _http_raw(srv.mport, f"GET http://127.0.0.1:{srv.mport}/healthz HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert got.startswith(b"HTTP/1.0 200") and got.endswith(b"ok\n"), got
    got = _http_raw(srv.mport, f"GET HTTPS://127.0.0.1:{srv.mport}/healthz?full=1 HTTP/1.1\r\n\r\n".encode())
    assert got.startswith(b"HTTP/1.0 200") and got.endswith(b"ok\n"), got
    got = _http_raw(srv.mport, b"GET /metrics?name[]=act_serve_ready HTTP/1.0\r\n\r\n")   # the query is not the path
    assert got.startswith(b"HTTP/1.0 200") and b"\nact_serve_ready 1\n" in got, got
    got = _http_raw(srv.mport, f"GET http://127.0.0.1:{srv.mport} HTTP/1.0\r\n\r\n".encode())   # no path: "/"
    assert got.startswith(b"HTTP/1.0 404") and got.endswith(b"try /healthz or /metrics\n"), got
    got = _http_raw(srv.mport, b"HEAD /healthz HTTP/1.0\r\n\r\n")
    assert got.startswith(b"HTTP/1.0 200") and got.endswith(b"\r\n\r\n"), got
    assert b"\r\nContent-Length: 3\r\n" in got, got   # the length GET's "ok\n" would have
    got = _http_raw(srv.mport, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert got.startswith(b"HTTP/1.0 200") and got.endswith(b"\r\n\r\n"), got
    got = _http_raw(srv.mport, b"HEAD /nothing HTTP/1.0\r\n\r\n")
    assert got.startswith(b"HTTP/1.0 404") and got.endswith(b"\r\n\r\n"), got
    got = _http_raw(srv.mport, b"POST /healthz HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
    assert got.startswith(b"HTTP/1.0 405") and b"\r\nAllow: GET, HEAD\r\n" in got, got
    # the next GET on that slot gets its body again
    got = _http_raw(srv.mport, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert got.startswith(b"HTTP/1.0 200") and got.endswith(b"ok\n"), got


def test_oversized_http_request_gets_its_400(srv):
    s = socket.create_connection(("127.0.0.1", srv.mport), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.0\r\nX-Pad: " + b"a" * 8000)   # no end of headers, > 4 KiB
    got = _read_to_eof(s)   # a reset here (unread bytes at close) would lose the answer
    assert got.startswith(b"HTTP/1.0 400"), got
    assert _healthz(srv.mport)[0] == 200


def _server_out_of_descriptors(act_serve, srv, limit):
    """An act-serve (--max-clients 100, one I/O thread) under an open-file limit of `limit`, with
    client connections holding every descriptor it has: (the Server, the client sockets)."""
    import resource

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    s = Server(act_serve, srv.model, srv.dir, "--max-clients", 100, "--io-threads", 1,
               preexec_fn=low_limit).wait_ready()
    clients = []
    try:
        while len(os.listdir(f"/proc/{s.proc.pid}/fd")) < limit:
            c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            c.sendall(wire.hello())
            assert recv_frame(c)[0] == wire.INFO
            clients.append(c)
    except BaseException:
        for c in clients:
            c.close()
        s.stop()
        raise
    return s, clients


def test_client_port_out_of_descriptors_refuses_with_a_reason(act_serve, srv):
    """Under an open-file limit too low for --max-clients: a warning at start; a connection past
    the limit gets an ERROR frame saying the server is out of descriptors (the client's error
    names it, instead of a bare reset), and the refusals are said on stderr without --verbose
    (the first at once, the rest at the server's exit when no 10 s passed)."""
    s, clients = _server_out_of_descriptors(act_serve, srv, 40)
    try:
        assert "the open-file limit is 40 (hard limit 40), below the --max-clients 100" in s.log(), s.log()
        for _ in range(2):   # the first refusal is said at once, the second at the server's exit
            extra = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            try:
                _expect_error(extra, "overloaded", "out of file descriptors (open-file limit 40", closed=True)
            except ConnectionError:
                pass   # the reset of the close overtook the frame
        deadline = time.monotonic() + 10
        while "refused a connection (server out of file descriptors" not in s.log():
            assert time.monotonic() < deadline, s.log()[-3000:]
            time.sleep(0.05)
        clients.pop().close()
        time.sleep(0.2)
        assert _metric(s.mport, 'act_serve_connections_refused_total{reason="no_fds"}') >= 1
        c = ActClient("127.0.0.1", s.port, timeout=30)
        np.testing.assert_allclose(c.predict(srv.q, srv.imgs), srv.want, **BATCH_TOL)
        c.close()
    finally:
        for c in clients:
            c.close()
        assert s.stop() == 0, s.log()
    assert "refused 1 more connection since the last note on refusals" in s.log(), s.log()[-2000:]


def test_health_port_out_of_descriptors_does_not_spin(act_serve, srv):
    """At the descriptor limit a pending /healthz connection is taken and closed (the spare
    descriptor), not left in the backlog where it keeps epoll busy and the I/O thread spinning."""
    s, clients = _server_out_of_descriptors(act_serve, srv, 48)
    try:
        probe = socket.create_connection(("127.0.0.1", s.mport), timeout=10)
        probe.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        try:
            assert probe.recv(100) == b""   # closed unanswered, at once
        except ConnectionResetError:
            pass
        assert "out of file descriptors: closed a /healthz or /metrics connection" in s.log()
        clients.pop().close()
        time.sleep(0.2)
        for _ in range(50):
            try:
                assert _healthz(s.mport)[0] == 200
                break
            except (ConnectionError, http.client.HTTPException, AssertionError):
                time.sleep(0.1)
        else:
            pytest.fail("/healthz never answered once a descriptor was free:\n" + s.log()[-3000:])
    finally:
        for c in clients:
            c.close()
        assert s.stop() == 0, s.log()


def test_unread_replies_are_bounded_by_what_they_cost(act_serve, srv):
    """--max-out-bytes counts a queued reply's node and allocator overhead too: 20-byte PONGs
    a client never reads once held four times the limit before it was dropped."""
    limit, n = 8 << 20, 2
    if b"__asan_init" in Path(act_serve).read_bytes():
        pytest.skip("AddressSanitizer pads and quarantines every block: RSS says nothing here")
    s = Server(act_serve, srv.model, srv.dir, "--max-out-bytes", limit).wait_ready()

    def rss(field):
        for line in open(f"/proc/{s.proc.pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

    try:
        base = rss("VmRSS")
        pings = b"".join(wire.ping(i) for i in range(5000))
        for k in range(n):
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.settimeout(60)
            c.connect(("127.0.0.1", s.port))
            c.sendall(wire.hello(client_name=f"never-reads-{k}"))
            assert recv_frame(c)[0] == wire.INFO
            try:
                while True:
                    c.sendall(pings)
            except (BrokenPipeError, ConnectionResetError):
                pass
            c.close()
        assert s.log().count("does not read its replies") == n
        # one after the other: the peak is one client's queue (7.6 MiB here; 32 MiB before)
        grown = rss("VmHWM") - base
        assert grown < 1.5 * limit, f"held {grown / 2**20:.1f} MiB for {limit >> 20} MiB allowed"
    finally:
        assert s.stop() == 0, s.log()
