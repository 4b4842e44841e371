"""ActClient.predict_many against a real act-serve (CPU backend, small model): N envs' requests
pipelined on one connection give each env the chunk predict() gives it alone, in input order,
over TCP and over the Unix socket with shared memory attached (frames then travel inline), and
the server runs them in one forward pass. The scripted-server cases (a connection dropped
mid-call, `overloaded`, an ERROR for one env, input checks) are in test_client.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "act_client"))

from act_client import ActClient, ActServerError, wire  # noqa: E402
from serve_util import BATCH_TOL, Server, recv_frame  # noqa: E402

IMAGE = 40
N = 5


@pytest.fixture(scope="module")
def model(make_model, tmp_path_factory):
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import conftest

    d = tmp_path_factory.mktemp("many")
    cfg = conftest.small_cfg(image_size=IMAGE, vision_backbone={"input_shape": [3, 48, 48]})
    path, _ = make_model(d, cfg, 31)
    return path, cfg


@pytest.fixture
def server(act_serve, model, tmp_path):
    started = []

    def start(*extra):
        s = Server(act_serve, model[0], tmp_path, *extra).wait_ready()
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


def _batch_obs(cfg, seed=3):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((N, cfg["obs_dim"])).astype(np.float32)
    imgs = {c: rng.integers(0, 256, (N, IMAGE, IMAGE, 3), dtype=np.uint8) for c in cfg["camera_names"]}
    return q, imgs


def test_predict_many_equals_sequential_predicts_over_tcp_and_unix_shm(server, model, tmp_path):
    """--max-batch 1: every request runs alone, so the chunks must be bit for bit those of N
    predict() calls (a batch > 1 rounds differently on the CPU engine)."""
    _, cfg = model
    sock = tmp_path / "act.sock"
    srv = server("--unix", sock, "--max-batch", 1)
    q, imgs = _batch_obs(cfg)
    ref = ActClient("127.0.0.1", srv.port, timeout=120)
    want = np.stack([ref.predict(q[i], {c: imgs[c][i] for c in imgs}) for i in range(N)])
    assert len({w.tobytes() for w in want}) == N, "the envs' observations should give distinct chunks"
    ref.close()

    tcp = ActClient("127.0.0.1", srv.port, timeout=120)
    got = tcp.predict_many(q, imgs)
    assert got.dtype == np.float32 and got.shape == (N, cfg["pred_horizon"], cfg["action_dim"])
    np.testing.assert_array_equal(got, want)
    assert tcp.last_result["batch"] == [1] * N and tcp.last_result["round_trip_ms"] > 0
    assert tcp.last_result["resent"] == 0 and tcp.reconnects == 0
    # a list of per-env dicts, a window smaller than N, and zstd frames: the same chunks
    per_env = [{c: imgs[c][i] for c in imgs} for i in range(N)]
    np.testing.assert_array_equal(tcp.predict_many(q.tolist(), per_env, window=2), want)
    z = ActClient("127.0.0.1", srv.port, timeout=120, compress=True)
    if z.info()["zstd"]:
        np.testing.assert_array_equal(z.predict_many(q, imgs, window=3), want)
    z.close()
    tcp.close()

    # the Unix socket with shared memory attached: the N frames go inline (the memfd holds one
    # frame per camera), on the connection that attached it, which the server accepts
    shm = ActClient(unix_path=str(sock), timeout=120)
    shm.info()
    assert shm.transport == "unix+shm", shm.shm_error
    np.testing.assert_array_equal(shm.predict_many(q, imgs), want)
    assert shm.transport == "unix+shm" and shm.reconnects == 0
    # and the shared frames still serve predict() afterwards
    np.testing.assert_array_equal(shm.predict(q[2], per_env[2]), want[2])
    np.testing.assert_array_equal(shm.predict_many(q[::-1], [per_env[i] for i in reversed(range(N))]), want[::-1])
    shm.close()
    assert srv.proc.poll() is None


def test_predict_many_requests_share_a_forward_pass(server, model):
    """--max-batch 5 with a long batching window, this client the server's only connection: the
    five requests run as one batch of 5. Every PREDICT but the last says more follow (PREDICT's
    MORE flag): without it the first request made the only connection "all busy" and ran alone.
    With window=2 the client waits for replies after each pair, so it never says more is coming
    then: the server does not wait out its 10 s window for requests that are not on their way."""
    _, cfg = model
    srv = server("--max-batch", N, "--max-wait-us", 10_000_000)
    q, imgs = _batch_obs(cfg, seed=4)
    ref = ActClient("127.0.0.1", srv.port, timeout=120)
    want = np.stack([ref.predict(q[i], {c: imgs[c][i] for c in imgs}) for i in range(N)])
    ref.close()
    c = ActClient("127.0.0.1", srv.port, timeout=120)
    assert c.info()["more"]
    got = c.predict_many(q, imgs)
    np.testing.assert_allclose(got, want, **BATCH_TOL)   # batched: the CPU engine's rounding differs
    assert c.last_result["batch"] == [N] * N, c.last_result
    got = c.predict_many(q, imgs, window=2)
    np.testing.assert_allclose(got, want, **BATCH_TOL)
    assert max(c.last_result["batch"]) <= 2 and c.last_result["round_trip_ms"] < 5000, c.last_result
    c.close()


def test_predict_many_names_the_env_the_server_refused(server, model):
    """A NaN qpos for env 3 (the server's bad_qpos, as predict() leaves it to the server):
    ActServerError naming index 3; the client then serves the next call."""
    _, cfg = model
    srv = server()
    q, imgs = _batch_obs(cfg, seed=5)
    q[3, 1] = np.nan
    c = ActClient("127.0.0.1", srv.port, timeout=120)
    with pytest.raises(ActServerError, match=r"env index 3 \(of 5\)") as e:
        c.predict_many(q, imgs)
    assert e.value.name == "bad_qpos" and e.value.index == 3
    q[3, 1] = 0.0
    assert c.predict_many(q, imgs).shape[0] == N
    c.close()


def test_the_server_waits_for_a_burst_its_client_says_is_coming(server, model):
    """PREDICT's MORE flag, on a raw socket (the only connection): a request that says more
    follow is held for the next (here sent 0.5 s later), which runs with it in one batch; a
    request without the flag runs as soon as it arrives, the connection being all there is."""
    import socket
    import time

    _, cfg = model
    srv = server("--max-batch", N, "--max-wait-us", 10_000_000)
    q, imgs = _batch_obs(cfg, seed=6)
    frames = [wire.encode_frames({c: imgs[c][i] for c in imgs}, cfg["camera_names"], (IMAGE, IMAGE)) for i in range(2)]
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    s.sendall(wire.hello())
    mtype, p = recv_frame(s)
    assert mtype == wire.INFO and wire.parse_info(p)["more"]
    for more, want in ((True, [2, 2]), (False, [1, 1])):
        s.sendall(wire.predict(1, q[0], frames[0], more=more))
        time.sleep(0.5)
        s.sendall(wire.predict(2, q[1], frames[1]))
        got = [wire.parse_result(recv_frame(s)[1])["batch"] for _ in range(2)]
        assert got == want, (more, got)
    bad = bytearray(wire.predict(3, q[0], frames[0]))   # a flag bit nobody defined: refused, kept
    bad[wire.HDR.size + 8:wire.HDR.size + 12] = (8).to_bytes(4, "little")
    s.sendall(bytes(bad))
    mtype, p = recv_frame(s)
    assert mtype == wire.ERROR and "unknown flags 0x8" in wire.parse_error(p)[2]
    s.close()


def test_a_burst_cut_short_neither_crashes_nor_stalls_the_server(server, model):
    """A client that announced more (MORE) and then is reset while its request waits in the
    batching window: the closed connection takes its request back, and the batcher, woken with
    nothing pending, waits for work again (it dereferenced the empty queue and crashed). A burst
    whose last request is refused (--max-inflight 1: overloaded) ends the wait too: the server
    does not sit out its window for a request it turned away."""
    import socket
    import struct
    import time

    _, cfg = model
    srv = server("--max-batch", N, "--max-wait-us", 3_000_000, "--max-inflight", 1)
    q, imgs = _batch_obs(cfg, seed=7)
    frames = wire.encode_frames({c: imgs[c][0] for c in imgs}, cfg["camera_names"], (IMAGE, IMAGE))
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        s.sendall(wire.hello())
        recv_frame(s)
        s.sendall(wire.predict(1, q[0], frames, more=True))
        time.sleep(0.3)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()   # a reset, with the request still waiting for its batch
        time.sleep(0.3)
    assert srv.proc.poll() is None, srv.log()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    s.sendall(wire.hello())
    recv_frame(s)
    t0 = time.monotonic()
    s.sendall(wire.predict(2, q[0], frames, more=True) + wire.predict(3, q[0], frames))   # 3: over --max-inflight
    replies = {}
    for _ in range(2):
        mtype, p = recv_frame(s)
        replies[int.from_bytes(p[:8], "little")] = (mtype, p)
    assert replies[3][0] == wire.ERROR and wire.parse_error(replies[3][1])[1] == 13   # overloaded
    assert replies[2][0] == wire.RESULT and time.monotonic() - t0 < 2.0, time.monotonic() - t0
    s.close()
    assert srv.proc.poll() is None, srv.log()
