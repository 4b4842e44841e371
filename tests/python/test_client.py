"""ActClient against a scripted fake server (no act-serve binary): the timeout is one budget per
call, and the reconnect counters mean what their names say. The fake speaks just enough of the
wire protocol (HELLO -> INFO, then reads requests) to put the client where a real server's
slowness or restart would."""
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "act_client"))
from act_client import ActClient, ActContractError, ActError, ActServerError, ActTimeoutError, wire  # noqa: E402
from serve_util import recv_frame  # noqa: E402

CAMS = ["front"]
H = W = 8


def info_payload() -> bytes:
    p = struct.pack("<9I", 4, 4, 16, 16, 1, H, W, 8, 0)
    p += struct.pack("<I", len(CAMS)) + b"".join(bytes([len(c)]) + c.encode() for c in CAMS)
    p += b"0123456789abcdef" + bytes([4]) + b"fake" + bytes([3]) + b"cpu"
    return wire.frame(wire.INFO, p)


class FakeServer:
    """Each connection: read HELLO, wait `info_delay` s, send INFO, then per request either
    answer PONG (pings) or `on_request(conn, payload)`."""

    def __init__(self, info_delay=0.0, on_request=None):
        self.info_delay, self.on_request = info_delay, on_request
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.conns = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        self.lsock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn):
        try:
            mtype, _ = recv_frame(conn)
            assert mtype == wire.HELLO
            time.sleep(self.info_delay)
            conn.sendall(info_payload())
            while True:
                mtype, p = recv_frame(conn)
                if mtype == wire.PING:
                    conn.sendall(wire.frame(wire.PONG, p))
                elif self.on_request is not None:
                    self.on_request(conn, p)
        except (ConnectionError, OSError, AssertionError):
            pass

    def close(self):
        self.stop.set()
        self.lsock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


def frames():
    return {"front": np.random.default_rng(0).integers(0, 256, (H, W, 3), dtype=np.uint8)}


def test_predict_timeout_covers_the_handshake_too():
    # the handshake takes 60% of the timeout and the reply never comes: the call must give up at
    # the timeout, not after the handshake's time plus a whole fresh timeout
    srv = FakeServer(info_delay=0.6, on_request=lambda conn, p: None)
    try:
        c = ActClient("127.0.0.1", srv.port, timeout=1.0)
        t0 = time.monotonic()
        with pytest.raises(ActTimeoutError):
            c.predict(np.ones(4, np.float32), frames())
        took = time.monotonic() - t0
        assert took < 1.35, f"predict() with timeout=1.0 gave up after {took:.2f} s"
        assert took > 0.9
        c.close()
    finally:
        srv.close()


def test_reconnects_counts_connections_remade_not_attempts():
    srv = FakeServer()
    port = srv.port
    c = ActClient("127.0.0.1", port, timeout=5.0)
    try:
        c.ping()
        assert (c.reconnects, c.connect_failures) == (0, 0), "a first connection is not a reconnection"
        srv.close()   # the server goes away; its port is refused for a while
        time.sleep(0.05)
        comeback = {}

        def restart():
            time.sleep(0.5)   # ~10 failed attempts at the client's 50 ms retry pace
            s = FakeServer.__new__(FakeServer)
            s.info_delay, s.on_request = 0.0, None
            s.lsock = socket.create_server(("127.0.0.1", port))
            s.port, s.accepted, s.stop, s.conns = port, 0, threading.Event(), []
            threading.Thread(target=s._serve, daemon=True).start()
            comeback["srv"] = s

        t = threading.Thread(target=restart)
        t.start()
        c.ping()
        t.join()
        assert c.reconnects == 1, f"one reconnection, counted {c.reconnects}"
        assert c.connect_failures >= 3, "the refused attempts while the server was away are counted apart"
        c.ping()
        assert c.reconnects == 1
    finally:
        c.close()
        if "comeback" in locals() and "srv" in comeback:
            comeback["srv"].close()


def test_a_call_interrupted_mid_send_leaves_no_half_frame_for_the_next():
    """KeyboardInterrupt (or a step-timeout alarm's exception) between two sends of a request:
    the next call must start on a fresh connection, not append its frame to the half sent."""
    srv = FakeServer()
    c = ActClient("127.0.0.1", srv.port, timeout=2.0)
    try:
        c.ping()
        real = c._send_parts

        def half_then_interrupt(parts, deadline):
            data = b"".join(bytes(memoryview(b).cast("B")) for b in parts)
            c._sock.sendall(data[:len(data) // 2])
            raise KeyboardInterrupt

        c._send_parts = half_then_interrupt
        with pytest.raises(KeyboardInterrupt):
            c.ping()
        c._send_parts = real
        c.ping()   # a stream with half a PING in it would never answer: ActTimeoutError
        assert c.reconnects == 1
    finally:
        c.close()
        srv.close()


def test_a_handshake_error_is_a_contract_error_only_when_it_says_contract():
    """HELLO answered with ERROR: `contract` is ActContractError, anything else (here
    `malformed`) the plain ActServerError it is, so a caller is not told to fix its contract."""
    from act_client import ActContractError, ActServerError
    for code, want in ((wire.E_CONTRACT, ActContractError), (4, ActServerError)):
        ls = socket.create_server(("127.0.0.1", 0))

        def answer():
            conn, _ = ls.accept()
            recv_frame(conn)
            msg = b"refused"
            conn.sendall(wire.frame(wire.ERROR, struct.pack("<QII", 0, code, len(msg)) + msg))
            conn.close()

        t = threading.Thread(target=answer, daemon=True)
        t.start()
        c = ActClient("127.0.0.1", ls.getsockname()[1], timeout=5.0)
        with pytest.raises(ActServerError) as e:
            c.info()
        assert type(e.value) is want and e.value.code == code
        c.close()
        t.join()
        ls.close()


def test_names_are_checked_when_the_client_is_made():
    for bad, why in (("wörker", "not printable ASCII"), ("a\tb", "not printable ASCII"),
                     ("w" * 256, "longer than 255")):
        with pytest.raises(ValueError, match=why):
            ActClient("127.0.0.1", 1, client_name=bad)
    with pytest.raises(ValueError, match="camera name"):
        ActClient("127.0.0.1", 1, camera_names=["front", "l vis\n"])
    ActClient("127.0.0.1", 1, client_name="w" * 255).close()   # nothing connects before a call
    # a camera name as long as a model's may be (31 bytes), and at most 8 of them: longer or more
    # would get the server's `malformed`, not the `contract` error a mismatch is
    with pytest.raises(ValueError, match="is 32 bytes, longer than 31"):
        ActClient("127.0.0.1", 1, camera_names=["front", "c" * 32])
    with pytest.raises(ValueError, match="9 cameras, a model has at most 8"):
        ActClient("127.0.0.1", 1, camera_names=[f"cam{i}" for i in range(9)])
    ActClient("127.0.0.1", 1, camera_names=["c" * 31] + [f"cam{i}" for i in range(7)]).close()


def test_constructor_arguments_are_checked_when_the_client_is_made():
    with pytest.raises(TypeError, match=r"split it: \['l_vis', 'r_vis', 'front'\]"):
        ActClient("127.0.0.1", 1, camera_names="l_vis,r_vis,front")   # not 17 one-letter cameras
    for t in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout must be seconds"):
            ActClient("127.0.0.1", 1, timeout=t)
    for h in ("abc", "0123456789abcdeg", "0123456789abcdef0"):
        with pytest.raises(ValueError, match="model_hash must be 16 hex digits"):
            ActClient("127.0.0.1", 1, model_hash=h)
    with pytest.raises(ValueError, match="allow_model_change"):
        ActClient("127.0.0.1", 1, model_hash="0123456789abcdef", allow_model_change=True)


def test_a_pinned_model_hash_is_checked_at_the_first_handshake():
    srv = FakeServer()   # serves model 0123456789abcdef
    try:
        with pytest.raises(ActContractError, match="serves model 0123456789abcdef, not fedcba9876543210"):
            ActClient("127.0.0.1", srv.port, timeout=5, model_hash="fedcba9876543210").ping()
        c = ActClient("127.0.0.1", srv.port, timeout=5, model_hash="0123456789ABCDEF")
        c.ping()
        c.close()
    finally:
        srv.close()


def test_errors_cross_a_process_boundary_whole():
    """A rollout worker's ActServerError (bad_qpos from a sim gone wrong) must reach its
    multiprocessing parent: unpickling used to fail, which kills Pool's result thread (pool.map
    then waits forever) and breaks a ProcessPoolExecutor."""
    import pickle

    for cls in (ActServerError, ActContractError):
        e = pickle.loads(pickle.dumps(cls(8, "qpos holds NaN", 7)))
        assert type(e) is cls and (e.code, e.message, e.request_id, e.name) == (8, "qpos holds NaN",
                                                                               7, "bad_qpos")
        assert str(e) == str(cls(8, "qpos holds NaN", 7))
    for cls in (ActError, ActTimeoutError):
        assert str(pickle.loads(pickle.dumps(cls("why")))) == "why"


def test_a_qpos_beyond_float32_is_named_not_sent_as_inf():
    srv = FakeServer(on_request=lambda conn, p: None)
    try:
        c = ActClient("127.0.0.1", srv.port, timeout=5)
        with pytest.raises(ValueError, match=r"qpos\[2\] = 1e\+39 does not fit float32"):
            c.predict(np.array([0, 1, 1e39, 3], np.float64), frames())
        c.close()
    finally:
        srv.close()


SIGPIPE_CHILD = r"""
import signal, socket, sys, threading
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])
from act_client import ActClient, ActTimeoutError
from test_client import info_payload
from serve_util import recv_frame
signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # as an embedding host or CLI wrapper may leave it
path = sys.argv[3]
ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
ls.bind(path)
ls.listen(8)

def serve():   # answers the handshake, then hangs up: the client's next send meets EPIPE
    while True:
        conn, _ = ls.accept()
        recv_frame(conn)
        conn.sendall(info_payload())
        conn.close()

threading.Thread(target=serve, daemon=True).start()
c = ActClient(unix_path=path, shm=False, timeout=1.0)
try:
    c.ping()
except ActTimeoutError as e:
    print("timeout after", c.connect_failures, "failures:", e)
    sys.exit(0)
sys.exit(3)
"""


def test_a_peer_gone_mid_send_is_not_a_sigpipe(tmp_path):
    """With SIGPIPE at its default, a send to a closed Unix socket must be an error the client
    retries (MSG_NOSIGNAL), not a signal that kills the process (exit -13)."""
    import subprocess
    here = Path(__file__).resolve().parent
    p = subprocess.run([sys.executable, "-c", SIGPIPE_CHILD, str(here.parents[1] / "tools" / "act_client"),
                        str(here), str(tmp_path / "fake.sock")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"rc {p.returncode} (-13: killed by SIGPIPE)\n{p.stdout}{p.stderr}"


def _answer(kinds):
    """on_request answering each PREDICT with the next of kinds: 'overloaded' (ERROR, queue full)
    or 'result' (a chunk of 16 x 4 values 0..63)."""
    def on_request(conn, p):
        rid = struct.unpack_from("<Q", p, 0)[0]
        if (kinds.pop(0) if kinds else "overloaded") == "overloaded":
            msg = b"queue full: 2 requests waiting or running (limit 2)"
            conn.sendall(wire.frame(wire.ERROR, struct.pack("<QII", rid, wire.E_OVERLOADED, len(msg)) + msg))
        else:
            conn.sendall(wire.frame(wire.RESULT, struct.pack("<QIIIIfII", rid, 0, 1, 0, 0, 0.0, 16, 4)
                                    + np.arange(64, dtype="<f4").tobytes()))
    return on_request


def test_an_overloaded_server_is_asked_again_within_the_timeout():
    """`overloaded` (the server's --max-queue full) is a passing state: the same request goes
    again after a short pause, on the same connection, until the call's timeout; only then
    ActTimeoutError, naming the overload."""
    srv = FakeServer(on_request=_answer(["overloaded"] * 3 + ["result"]))
    c = ActClient("127.0.0.1", srv.port, timeout=5.0)
    try:
        chunk = c.predict(np.ones(4, np.float32), frames())
        assert chunk.shape == (16, 4) and chunk[15, 3] == 63
        assert c.overloaded_retries == 3 and c.reconnects == 0 and srv.accepted == 1
    finally:
        c.close()
        srv.close()
    srv = FakeServer(on_request=_answer([]))   # overloaded for good
    c = ActClient("127.0.0.1", srv.port, timeout=0.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(ActTimeoutError, match="overloaded"):
            c.predict(np.ones(4, np.float32), frames())
        assert 0.45 < time.monotonic() - t0 < 1.0 and c.overloaded_retries >= 5
    finally:
        c.close()
        srv.close()


def test_a_forked_child_connects_on_its_own():
    """A client made before fork() (multiprocessing's default on Linux): the child must not share
    its parent's stream - two processes reading one socket take each other's replies - but make
    its own connection, while the parent's stays as it was."""
    import os
    srv = FakeServer()
    c = ActClient("127.0.0.1", srv.port, timeout=5.0)
    try:
        c.ping()
        parent_end = c._sock.getsockname()
        pid = os.fork()
        if pid == 0:   # the child: report through the exit status only
            code = 1
            try:
                c.ping()
                code = 0 if c._sock.getsockname() != parent_end and c.reconnects == 0 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, \
            f"child status {status} (2: it used the parent's connection)"
        c.ping()
        assert c._sock.getsockname() == parent_end and c.reconnects == 0
        assert srv.accepted == 2
    finally:
        c.close()
        srv.close()


class FakeClient:
    """What ActPolicyRunner needs of an ActClient: info() and predict(); chunk row t of call k
    is 1000 k + t in every joint."""

    def __init__(self, horizon=6, action_dim=2, cams=("l_vis", "front")):
        self.info_ = {"camera_names": list(cams), "obs_horizon": 1, "num_action_steps": 3,
                      "pred_horizon": horizon, "action_dim": action_dim}
        self.calls = []

    def info(self):
        return dict(self.info_)

    def predict(self, qpos, images):
        assert list(images) == self.info_["camera_names"], list(images)   # model cameras, model order
        self.calls.append(images)
        k = len(self.calls)
        h, a = self.info_["pred_horizon"], self.info_["action_dim"]
        return np.repeat((1000.0 * k + np.arange(h, dtype=np.float32))[:, None], a, axis=1)


def test_runner_ignores_cameras_the_model_does_not_read_and_names_a_missing_one():
    from act_client import ActPolicyRunner
    c = FakeClient()
    with pytest.warns(RuntimeWarning, match="obs_horizon 2 differs from the model's 1"):
        r = ActPolicyRunner(c, obs_horizon=2, num_action_steps=3)
    img = np.zeros((4, 4, 3), np.uint8) + 7
    obs = {"qpos": np.ones(3), "images": {"top": img, "front": img, "l_vis": img}}
    got = [float(r.select_action(obs)[0]) for _ in range(4)]
    assert got == [1001.0, 1002.0, 1003.0, 2001.0]   # the seed's slice [obs_horizon-1 : +num_action_steps]
    assert len(c.calls) == 2
    r.reset()
    with pytest.raises(ValueError, match=r"lacks the model's camera\(s\) \['l_vis'\]"):
        r.select_action({"qpos": np.ones(3), "images": {"front": img}})


def test_runner_takes_the_models_obs_horizon_and_client_refuses_a_list_of_images():
    import warnings
    from act_client import ActPolicyRunner
    from act_client import wire
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # the model's own value: no warning
        r = ActPolicyRunner(FakeClient())
    assert r.obs_horizon == 1 and r.num_action_steps == 3
    img = np.zeros((4, 4, 3), np.uint8)
    # a list (numpy 2 used to say "truth value of an array is ambiguous")
    with pytest.raises(TypeError, match=r"images: expected a dict \{camera name"):
        list(wire._checked([img, img], ["l_vis", "front"], (4, 4)))


def test_runner_reset_clears_last_forward():
    from act_client import ActPolicyRunner
    r = ActPolicyRunner(FakeClient())
    img = np.zeros((4, 4, 3), np.uint8)
    r.select_action({"qpos": np.ones(3), "images": {"l_vis": img, "front": img}})
    assert r.last_forward
    r.reset()
    assert not r.last_forward, "a new episode has asked for nothing yet"


# ---- predict_many: N envs' requests pipelined on one connection ----
def _env_request(p):
    """(request id, env index) of a PREDICT payload: the tests put the env's index in qpos[0]."""
    rid, _, obs = struct.unpack_from("<QII", p, 0)
    return rid, int(np.frombuffer(p, "<f4", obs, 16)[0])


def _env_result(rid, env, batch=3):
    """RESULT whose 16 x 4 chunk is 100 env + 0..63, with `batch` as the server's batch size."""
    chunk = (100.0 * env + np.arange(64)).astype("<f4")
    return wire.frame(wire.RESULT, struct.pack("<QIIIIfII", rid, 0, batch, 0, 0, 0.0, 16, 4) + chunk.tobytes())


def _env_error(rid, code, msg=b"refused"):
    return wire.frame(wire.ERROR, struct.pack("<QII", rid, code, len(msg)) + msg)


def _many_inputs(n=5):
    q = np.zeros((n, 4), np.float32)
    q[:, 0] = np.arange(n)   # env i's qpos[0] = i: the fake server knows whose request it reads
    imgs = {"front": np.random.default_rng(1).integers(0, 256, (n, H, W, 3), dtype=np.uint8)}
    return q, imgs


def _want(n=5):
    return np.stack([(100.0 * i + np.arange(64, dtype=np.float32)).reshape(16, 4) for i in range(n)])


def test_predict_many_resends_only_the_unanswered_after_a_dropped_connection():
    """The first connection answers envs 0 and 1, then hangs up when env 2's request arrives
    (shutdown for writing, so the two results precede its end of stream): the call reconnects
    and sends envs 2, 3 and 4 on the new one - only those - and returns all five in input order."""
    seen = {}

    def on_request(conn, p):
        rid, env = _env_request(p)
        got = seen.setdefault(id(conn), [])
        got.append(env)
        if conn is srv.conns[0] and len(got) >= 3:
            if len(got) == 3:
                conn.shutdown(socket.SHUT_WR)
            return   # reads on (no reset), answers nothing more
        conn.sendall(_env_result(rid, env))

    srv = FakeServer(on_request=on_request)
    c = ActClient("127.0.0.1", srv.port, timeout=30.0)
    try:
        q, imgs = _many_inputs()
        out = c.predict_many(q, imgs)
        np.testing.assert_array_equal(out, _want())
        assert srv.accepted == 2 and c.reconnects == 1
        first, second = (seen[id(k)] for k in srv.conns)
        assert first[:3] == [0, 1, 2]   # envs 3 and 4 too, if the client sent them before it saw the end
        assert second == [2, 3, 4], f"answered requests were sent again: {second}"
        # env 2 was out, and 3 and 4 as far as they were sent before the hang-up was read
        assert 1 <= c.last_result["resent"] <= 3 and c.last_result["batch"] == [3] * 5
        assert c.last_result["round_trip_ms"] > 0
    finally:
        c.close()
        srv.close()


def test_predict_many_sends_an_overloaded_request_again():
    """`overloaded` for envs 1 and 3, twice each: those two go again after predict()'s pause on
    the same connection; the others once. A server overloaded for good: ActTimeoutError at the
    call's timeout, naming the overload."""
    seen = []

    def on_request(conn, p):
        rid, env = _env_request(p)
        seen.append(env)
        if env in (1, 3) and seen.count(env) <= 2:
            conn.sendall(_env_error(rid, wire.E_OVERLOADED, b"server busy"))
        else:
            conn.sendall(_env_result(rid, env))

    srv = FakeServer(on_request=on_request)
    c = ActClient("127.0.0.1", srv.port, timeout=30.0)
    try:
        q, imgs = _many_inputs()
        np.testing.assert_array_equal(c.predict_many(q, imgs), _want())
        assert sorted(seen) == [0, 1, 1, 1, 2, 3, 3, 3, 4], seen
        assert c.overloaded_retries == 4 and c.last_result["overloaded_retries"] == 4
        assert srv.accepted == 1 and c.reconnects == 0 and c.last_result["resent"] == 0
    finally:
        c.close()
        srv.close()
    srv = FakeServer(on_request=lambda conn, p: conn.sendall(
        _env_error(_env_request(p)[0], wire.E_OVERLOADED, b"server busy")))
    c = ActClient("127.0.0.1", srv.port, timeout=1.0)
    try:
        c.ping()
        t0 = time.monotonic()
        with pytest.raises(ActTimeoutError, match=r"5 of 5 PREDICT replies not received within 1 s "
                                                  r"\(the server stayed overloaded \(server busy\)\)"):
            c.predict_many(*_many_inputs())
        assert 0.95 < time.monotonic() - t0 < 5.0 and c.overloaded_retries >= 5
    finally:
        c.close()
        srv.close()


def test_predict_many_names_the_env_index_of_an_error():
    """bad_qpos for env 3 while env 4's request is still out: ActServerError naming index 3
    (.index 3, pickled too), and the connection, which would bring env 4's reply to the next
    call, is closed: the next call starts on a fresh one."""
    import pickle
    held = {}

    def on_request(conn, p):
        rid, env = _env_request(p)
        if env == 3:
            held[3] = rid   # answered once env 4's request is in: env 4 is then surely outstanding
        elif env == 4 and 3 in held:
            conn.sendall(_env_error(held.pop(3), 8, b"PREDICT: qpos holds NaN or Inf"))
        elif env != 4:
            conn.sendall(_env_result(rid, env))

    srv = FakeServer(on_request=on_request)
    c = ActClient("127.0.0.1", srv.port, timeout=30.0)
    try:
        with pytest.raises(ActServerError, match=r"bad_qpos \(8\): predict_many env index 3 \(of 5\): "
                                                 r"PREDICT: qpos holds NaN") as e:
            c.predict_many(*_many_inputs())
        assert (e.value.index, e.value.name) == (3, "bad_qpos") and e.value.request_id > 0
        back = pickle.loads(pickle.dumps(e.value))
        assert (back.index, back.code, back.message, str(back)) == (3, 8, e.value.message, str(e.value))
        assert c._sock is None, "env 4's reply is still due on that connection"
        c.ping()
        assert c.reconnects == 1
        # a call whose requests are all answered (env 4 is, on a fresh connection) keeps it
        out = c.predict_many(*_many_inputs(3))
        np.testing.assert_array_equal(out, _want(3))
        assert c.reconnects == 1 and srv.accepted == 2
    finally:
        c.close()
        srv.close()


def test_predict_many_interrupted_mid_call_leaves_nothing_for_the_next():
    """A caller's exception (KeyboardInterrupt, an alarm) between two sends: the requests out
    would answer the next call, so the connection closes and the next call starts clean."""
    srv = FakeServer(on_request=lambda conn, p: conn.sendall(_env_result(*_env_request(p))))
    c = ActClient("127.0.0.1", srv.port, timeout=30.0)
    try:
        c.ping()
        real, calls = c._send_parts, []

        def interrupt_third(parts, deadline):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            real(parts, deadline)

        c._send_parts = interrupt_third
        with pytest.raises(KeyboardInterrupt):
            c.predict_many(*_many_inputs())
        c._send_parts = real
        assert c._sock is None
        np.testing.assert_array_equal(c.predict_many(*_many_inputs()), _want())
        assert c.reconnects == 1
    finally:
        c.close()
        srv.close()


def test_predict_many_checks_its_inputs_before_sending_anything():
    seen = []
    srv = FakeServer(on_request=lambda conn, p: (seen.append(p), conn.sendall(_env_result(*_env_request(p)))))
    c = ActClient("127.0.0.1", srv.port, timeout=30.0)
    try:
        q, imgs = _many_inputs()
        per_env = [{"front": imgs["front"][i]} for i in range(5)]
        bad = [
            (ValueError, r"qpos: expected shape \(N, 4\) \(one row of obs_dim values per env\), got \(4,\)",
             np.zeros(4), imgs),
            (ValueError, r"qpos: expected shape \(N, 4\).*got \(5, 3\)", np.zeros((5, 3)), imgs),
            (ValueError, r"qpos: expected an \(N, obs_dim=4\) array", [[0, 1, 2, 3], [0, 1]], imgs),
            (ValueError, r"qpos\[2, 1\] = 1e\+39 does not fit float32", np.where(np.arange(20).reshape(5, 4) == 9,
                                                                              1e39, 0.0), imgs),
            (ValueError, r"images: model cameras are \['front'\]; missing \['front'\], unexpected \[\]", q, {}),
            (ValueError, r"unexpected \['top'\]", q, {**imgs, "top": imgs["front"]}),
            (ValueError, r"images\['front'\]: expected uint8 \(5, 8, 8, 3\) \(N, H, W, 3.*got float32 \(5, 8, 8, 3\)",
             q, {"front": imgs["front"].astype(np.float32)}),
            (ValueError, r"images\['front'\]: expected uint8 \(5, 8, 8, 3\).*got uint8 \(4, 8, 8, 3\)",
             q, {"front": imgs["front"][:4]}),
            (ValueError, r"images: a list of 4 per-env dicts, but qpos has 5 rows", q, per_env[:4]),
            (ValueError, r"images\[2\] \(env 2\): images\['front'\]: expected uint8 \(8, 8, 3\).*int64",
             q, per_env[:2] + [{"front": per_env[2]["front"].astype(np.int64)}] + per_env[3:]),
            (TypeError, r"images\[1\] \(env 1\): images: expected a dict", q,
             [per_env[0], imgs["front"][1]] + per_env[2:]),
            (TypeError, r"images: expected a dict \{camera name: uint8 \(N, H, W, 3\) array\} or a list",
             q, imgs["front"]),
        ]
        for exc, msg, qq, ii in bad:
            with pytest.raises(exc, match=msg):
                c.predict_many(qq, ii)
        for w in (0, -1, 1.5, True, None):
            with pytest.raises(ValueError, match="window must be an int >= 1"):
                c.predict_many(q, imgs, window=w)
        assert seen == [], "a refused call sent requests"
        assert c.predict_many(np.zeros((0, 4)), {"front": np.zeros((0, H, W, 3), np.uint8)}).shape == (0, 16, 4)
        # good inputs in both forms, after all those: the same connection, the right chunks
        np.testing.assert_array_equal(c.predict_many(q, per_env, window=1), _want())
        assert len(seen) == 5 and c.reconnects == 0
    finally:
        c.close()
        srv.close()


class FakeVecClient(FakeClient):
    """FakeClient with predict_many: in call k, the row for the env whose qpos[0] is e is
    1000 k + 10 e + t in every joint (t the chunk row)."""

    def predict_many(self, qpos, images, window=32):
        qpos = np.asarray(qpos)
        n = qpos.shape[0]
        if isinstance(images, dict):
            assert list(images) == self.info_["camera_names"] and all(len(a) == n for a in images.values())
        else:
            assert len(images) == n and all(list(d) == self.info_["camera_names"] for d in images)
        self.calls.append(qpos[:, 0].astype(int).tolist())
        k = len(self.calls)
        h, a = self.info_["pred_horizon"], self.info_["action_dim"]
        rows = 1000.0 * k + 10.0 * qpos[:, 0][:, None] + np.arange(h)[None, :]
        return np.repeat(rows[:, :, None], a, axis=2).astype(np.float32)


def test_vector_runner_asks_for_the_dry_envs_in_one_predict_many():
    from act_client import ActVectorPolicyRunner
    c = FakeVecClient()
    r = ActVectorPolicyRunner(c, num_envs=3)   # obs_horizon 1, 3 actions per chunk (the model's)
    img = np.zeros((3, 4, 4, 3), np.uint8)
    obs = {"qpos": np.array([[0.0, 1, 1], [1, 1, 1], [2, 1, 1]]), "images": {"top": img, "front": img, "l_vis": img}}
    a = r.select_actions(obs)
    assert a.shape == (3, 2) and a.dtype == np.float32 and a[:, 0].tolist() == [1000, 1010, 1020]
    assert r.last_forward.tolist() == [True] * 3 and c.calls == [[0, 1, 2]]
    r.reset(np.array([False, True, False]))   # env 1's episode ended (a vector env's autoreset)
    a = r.select_actions(obs)
    assert a[:, 0].tolist() == [1001, 2010, 1021] and r.last_forward.tolist() == [False, True, False]
    assert c.calls[-1] == [1], "only the env whose queue ran dry asks"
    a = r.select_actions({"qpos": obs["qpos"], "images": [{"front": img[i], "l_vis": img[i]} for i in range(3)]})
    assert a[:, 0].tolist() == [1002, 2011, 1022] and not r.last_forward.any() and len(c.calls) == 2
    a = r.select_actions(obs)
    assert a[:, 0].tolist() == [3000, 2012, 3020] and c.calls[-1] == [0, 2] and r.forward_count == 6
    r.reset()
    with pytest.raises(ValueError, match=r"obs\['images'\] lacks the model's camera\(s\) \['l_vis'\]"):
        r.select_actions({"qpos": obs["qpos"], "images": {"front": img}})
    with pytest.raises(ValueError, match=r"obs\['qpos'\]: expected shape \(3, obs_dim\)"):
        r.select_actions({"qpos": obs["qpos"][:2], "images": obs["images"]})
    with pytest.raises(ValueError, match="num_envs must be an int >= 1"):
        ActVectorPolicyRunner(c, num_envs=0)
    with pytest.warns(RuntimeWarning, match="ActVectorPolicyRunner: obs_horizon 2 differs"):
        ActVectorPolicyRunner(c, num_envs=1, obs_horizon=2)


def test_predict_many_gives_up_at_its_timeout_when_the_server_stays_away():
    """The connection ends at the first request and the server is gone for good: the call keeps
    reconnecting until its one timeout, then ActTimeoutError (not one timeout per request)."""
    def on_request(conn, p):
        conn.shutdown(socket.SHUT_WR)
        srv.lsock.close()   # nothing listens any more: reconnects are refused

    srv = FakeServer(on_request=on_request)
    c = ActClient("127.0.0.1", srv.port, timeout=1.0)
    try:
        c.ping()
        t0 = time.monotonic()
        with pytest.raises(ActTimeoutError, match="could not complete"):
            c.predict_many(*_many_inputs())
        assert 0.95 < time.monotonic() - t0 < 5.0 and c.connect_failures >= 3
    finally:
        c.close()
        srv.close()
