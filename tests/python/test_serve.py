"""act-serve end to end on loopback with the CPU backend and a small model.

What must hold: the server's chunks equal `act-infer predict` on the same inputs (prior and
posterior), requests from different connections share a forward pass, the contract is checked
at the handshake, the runner has the seed's _RemotePolicyRunner semantics, /healthz and
/metrics tell the truth, SIGTERM drains without losing or duplicating a request, and a client
survives a server killed and restarted under it.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "act_client"))

from act_client import ActClient, ActContractError, ActPolicyRunner, ActServerError, ActTimeoutError  # noqa: E402
from act_client import wire  # noqa: E402
from serve_util import BATCH_TOL, Server, default_signals, recv_frame, replay_episode  # noqa: E402

IMAGE = 40          # frames the tiny model expects (HWC uint8), resized to 48x48 for the trunk
TOL = BATCH_TOL   # requests batched with others against act-infer predict (serve_util)


def _build_tiny(tmp_dir: Path, ref, seed=5, **over):
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import conftest

    cfg = conftest.small_cfg(image_size=IMAGE, vision_backbone={"input_shape": [3, 48, 48]}, **over)
    agent = ref.randomize_(ref.build_agent(cfg), seed)
    ck, yml, st, out = (tmp_dir / n for n in ("ck.pt", "ck.yaml", "stats.pkl", "tiny.actw"))
    ref.save_checkpoint(agent, str(ck), cfg, layout="model_state_dict", stats_in="state_dict", prefix="",
                        stats_path=str(st), config_path=str(yml), include_config=False)
    subprocess.run([sys.executable, str(REPO / "tools" / "convert_checkpoint.py"), str(ck), "-o", str(out),
                    "--config", str(yml), "--stats", str(st)], check=True, capture_output=True)
    return out, cfg


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, ref):
    path, cfg = _build_tiny(tmp_path_factory.mktemp("tiny"), ref)
    return path, cfg


@pytest.fixture
def server(act_serve, tiny, tmp_path):
    started = []

    def start(*extra, port=0, wait=True, model=None, env=None):
        s = Server(act_serve, model or tiny[0], tmp_path, *extra, port=port, env=env)
        started.append(s)
        return s.wait_ready() if wait else s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


def _obs(rng, cams, obs_dim=5):
    return (rng.standard_normal(obs_dim).astype(np.float32),
            {c: rng.integers(0, 256, (IMAGE, IMAGE, 3), dtype=np.uint8) for c in cams})


# a batch's frames copied inline / by 3 threads; the clients read by one I/O thread / one each;
# batches run at their size (auto on the CPU) or padded up to 5 (sizes 1, 5, 8) with copies of
# their first request, whose results must not leak into anyone's reply
@pytest.mark.parametrize("copy_threads,io_threads,batch_sizes", [(1, 1, "auto"), (3, 3, "auto"), (3, 3, "5")])
def test_predictions_equal_act_infer_predict_and_batch_across_connections(server, act_infer, tiny, tmp_path,
                                                                         episode_factory, rng, copy_threads,
                                                                         io_threads, batch_sizes):
    model, cfg = tiny
    cams = cfg["camera_names"]
    T, H = 6, cfg["pred_horizon"]
    ep = episode_factory(T=T, image_size=IMAGE, seed=int(rng.integers(1 << 30)))
    post_dir = tmp_path / "post"
    post_dir.mkdir()
    p = subprocess.run([str(act_infer), "predict", "--model", str(model), "--episode", str(ep), "--out",
                        str(tmp_path / "pred.npy"), "--device", "cpu", "--posterior-dir", str(post_dir)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    want_prior = np.load(tmp_path / "pred.npy")
    want_post, want_kl = np.load(post_dir / "post_actions.npy"), np.load(post_dir / "kl.npy")
    with h5py.File(ep, "r") as f:
        qpos, actions = f["observations/qpos"][:], f["action"][:]
        images = {c: f[f"observations/images/{c}"][:] for c in cams}

    # a long batching window: every request of the three clients should share one forward pass
    srv = server("--max-batch", 8, "--max-wait-us", 2_000_000, "--copy-threads", copy_threads,
                 "--io-threads", io_threads, "--batch-sizes", batch_sizes, "--audit-log", tmp_path / "audit.jsonl")
    assert "batch sizes " + ("1-8" if batch_sizes == "auto" else "1,5,8") in srv.log(), srv.log()
    clients = [ActClient("127.0.0.1", srv.port, timeout=120, compress=(i == 1)) for i in range(3)]
    for c in clients:
        c.info()   # handshake first, so the server knows three clients may send
    # each new connection goes to the I/O thread with the fewest: with three, one each, whose
    # requests must still share forward passes and get their own replies back
    threads = {line.rsplit("(I/O thread ", 1)[1].split(" ")[0]
               for line in srv.log().splitlines() if ": connected (I/O thread " in line}
    assert len(threads) == io_threads, srv.log()
    got_prior, got_post, got_kl, batches = replay_episode(clients, qpos, images, actions, H)
    for t in range(T):
        np.testing.assert_allclose(got_prior[t], want_prior[t], **TOL, err_msg=f"prior chunk, timestep {t}")
        np.testing.assert_allclose(got_post[t], want_post[t], **TOL, err_msg=f"posterior chunk, timestep {t}")
        np.testing.assert_allclose(got_kl[t], want_kl[t], rtol=1e-4, atol=1e-5, err_msg=f"kl, timestep {t}")
    assert max(batches) > 1, f"no request shared a forward pass: batches {batches}"
    assert srv.metric("act_serve_results_total") == 2 * T
    # every pass's rows: its requests, or (sizes 1, 5, 8) the next size up; the padding counted
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    pad = {1: 1, 2: 5, 3: 5, 4: 5, 5: 5} if batch_sizes == "5" else {b: b for b in range(1, 9)}
    assert len(audit) == 2 * T and all(a["rows"] == pad[a["batch"]] for a in audit), audit
    padded = sum((a["rows"] - a["batch"]) / a["batch"] for a in audit)   # each pass counted once
    assert srv.metric("act_serve_padded_rows_total") == pytest.approx(padded), audit
    assert (padded > 0) == (batch_sizes == "5"), audit


def test_contract_is_checked_at_the_handshake(server, tiny):
    _, cfg = tiny
    srv = server()
    cams = cfg["camera_names"]
    bad = [dict(camera_names=list(reversed(cams))), dict(camera_names=cams[:2]), dict(obs_dim=16),
           dict(action_dim=16), dict(image_hw=(256, 256))]
    for kw in bad:
        with pytest.raises(ActContractError, match="contract") as e:
            ActClient("127.0.0.1", srv.port, timeout=30, **kw).info()
        assert e.value.name == "contract"
    info = ActClient("127.0.0.1", srv.port, timeout=30, camera_names=cams, obs_dim=5, action_dim=4,
                     image_hw=(IMAGE, IMAGE)).info()
    assert info["camera_names"] == cams and info["pred_horizon"] == cfg["pred_horizon"]
    assert info["num_action_steps"] == cfg["num_action_steps"] and info["obs_horizon"] == 1
    assert len(info["model_hash"]) == 16 and (info["image_height"], info["image_width"]) == (IMAGE, IMAGE)


def test_runner_requests_only_when_its_queue_is_empty(server, tiny, rng):
    _, cfg = tiny
    srv = server()
    client = ActClient("127.0.0.1", srv.port, timeout=120)
    with pytest.warns(RuntimeWarning, match="differs from the model's 1"):   # the slice is the test
        runner = ActPolicyRunner(client, obs_horizon=2, num_action_steps=3)
    obs = [_obs(rng, cfg["camera_names"]) for _ in range(4)]
    acts, forwards = [], []
    for q, imgs in obs:
        acts.append(runner.select_action({"qpos": q, "images": imgs}))
        forwards.append(runner.last_forward)
    assert forwards == [True, False, False, True]
    chunk0 = client.predict(*obs[0])
    chunk3 = client.predict(*obs[3])
    np.testing.assert_allclose(np.stack(acts[:3]), chunk0[1:4], **TOL)   # [obs_horizon-1 : +num_action_steps]
    np.testing.assert_allclose(acts[3], chunk3[1], **TOL)
    runner.reset()
    runner.select_action({"qpos": obs[1][0], "images": obs[1][1]})
    assert runner.last_forward and runner.forward_count == 3
    with pytest.raises(ValueError, match="pred_horizon"), pytest.warns(RuntimeWarning):
        ActPolicyRunner(client, obs_horizon=4, num_action_steps=cfg["pred_horizon"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_healthz_is_503_while_loading_and_sigterm_while_loading_exits_0(act_serve, build_dir, tmp_path):
    # tests/hold_open.c, preloaded, holds the loader's open() of the model until a signal: the
    # server is "loading" for as long as we like (a FIFO no longer does that: it is refused)
    shim = build_dir / "libact_test_hold_open.so"
    if not shim.is_file():
        pytest.skip(f"{shim} is not built (cmake target act_test_hold_open)")
    model = tmp_path / "model.actw"
    model.write_bytes(b"never read")
    env = dict(os.environ, LD_PRELOAD=f"{shim} {os.environ.get('LD_PRELOAD', '')}".strip(),
               ACT_TEST_HOLD_OPEN=str(model),
               ASAN_OPTIONS=f"{os.environ.get('ASAN_OPTIONS', '')}:verify_asan_link_order=0".lstrip(":"))
    srv = Server(act_serve, model, tmp_path, metrics_port=_free_port(), env=env)
    srv.mport = int(srv.proc.args[srv.proc.args.index("--metrics-port") + 1])
    deadline = time.monotonic() + 60
    while True:
        try:
            status, body = srv.http("/healthz")
            break
        except OSError:
            assert srv.proc.poll() is None and time.monotonic() < deadline, srv.log()
            time.sleep(0.05)
    assert (status, body) == (503, "loading\n")
    assert srv.stop(signal.SIGTERM) == 0, srv.log()
    assert not srv.pf.exists()


def test_metrics_audit_log_and_healthz(server, tiny, tmp_path, rng):
    _, cfg = tiny
    audit = tmp_path / "audit.jsonl"
    srv = server("--audit-log", audit)
    assert srv.http("/healthz") == (200, "ok\n")
    assert srv.http("/nope")[0] == 404
    c = ActClient("127.0.0.1", srv.port, timeout=120)
    q, imgs = _obs(rng, cfg["camera_names"])
    c.predict(q, imgs)
    rid, code, msg = _raw_bad_qpos(c, imgs)
    assert (rid, wire.ERROR_NAMES[code]) == (99, "bad_qpos") and "obs_dim 5" in msg, msg
    text = srv.http("/metrics")[1]
    for name in ("act_serve_requests_total 2", "act_serve_results_total 1", 'act_serve_errors_total{code="bad_qpos"} 1',
                 "act_serve_connections 1", "act_serve_batch_size_bucket", "act_serve_queue_wait_seconds_count 1",
                 "act_serve_inference_seconds_count", "act_serve_ready 1"):
        assert name in text, text
    for kind in ("weights", "activations", "workspace"):   # the CPU's Winograd filters, buffers, conv scratch
        assert srv.metric(f'act_serve_device_memory_bytes{{kind="{kind}"}}') > 0, text
    assert "act_serve_device_memory_driver_bytes" not in text, text   # a GPU's driver count only
    # the warm-up's duration, as the ready line says it (one decimal there)
    warm = srv.metric("act_serve_warmup_seconds")
    assert "act_serve_warmup_seconds " in text and warm > 0, text
    said = re.search(r"warm-up ([0-9.]+) s\)", srv.log())
    assert said and abs(float(said.group(1)) - warm) <= 0.051, srv.log()
    # on the CPU, what a full batch may take here (clients' timeouts must cover it)
    said = re.search(r"CPU: a step at batch 1 takes ([0-9.]+) s here, so a full batch \(--max-batch 32\) "
                     r"about ([0-9.]+) s; a request waits .* up to 8 with --max-queue 256 full", srv.log())
    # printed to 4 and 2 decimals: 32 x 0.00005 + 0.005 of rounding at most
    assert said and abs(float(said.group(2)) - 32 * float(said.group(1))) <= 0.0075, srv.log()
    # --io-threads (its variable, or 0: one per 4 cores, at most 4)
    io = int(os.environ.get("ACT_SERVE_IO_THREADS") or 0) or max(1, min(4, os.cpu_count() // 4))
    assert srv.metric("act_serve_io_threads") == io, text
    lines = audit.read_text().splitlines()
    assert len(lines) == 2 and '"status":"ok"' in lines[0] and '"status":"bad_qpos"' in lines[1], lines


def test_audit_log_escapes_client_names(server, tiny, tmp_path, rng):
    """A client's name is its own text: it must not break an audit line or add fields to it."""
    _, cfg = tiny
    audit = tmp_path / "audit.jsonl"
    srv = server("--audit-log", audit)
    q, imgs = _obs(rng, cfg["camera_names"])
    names = ['x","status":"ok","forged":"1', 'back\\slash', "plain"]
    for name in names:
        c = ActClient("127.0.0.1", srv.port, timeout=120, client_name=name)
        c.predict(q, imgs)
        c.close()
    lines = [json.loads(line) for line in audit.read_text().splitlines()]   # each line is JSON
    assert [a["client"] for a in lines] == names, lines
    assert all("forged" not in a and a["status"] == "ok" for a in lines), lines


def test_audit_log_keeps_whole_lines_when_writes_fail_and_follows_a_rotation(act_serve, tiny, tmp_path, rng):
    """A full disk (here a file size limit just past the log's start) used to leave half a line
    that the next write ran on from (two records on one line, not JSON) and said nothing; a log
    that logrotate moved away was written on, under its new name, for ever. Now: whole lines only,
    the lost ones counted and said, writing again once it can; a moved log is made again."""
    import resource
    model, cfg = tiny
    audit = tmp_path / "audit.jsonl"
    filler = "".join(json.dumps({"earlier": i}) + "\n" for i in range(3000))
    audit.write_text(filler)
    limit = len(filler) + 150   # the first line written crosses it part way

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))   # soft: raised later

    srv = Server(act_serve, model, tmp_path, "--audit-log", audit, preexec_fn=small_files).wait_ready()
    try:
        c = ActClient("127.0.0.1", srv.port, timeout=60)
        q, imgs = _obs(rng, cfg["camera_names"])
        for _ in range(3):
            c.predict(q, imgs)   # answered: the log's trouble is not the client's
        assert audit.read_text() == filler, "a partial line stayed in the log"
        assert srv.metric("act_serve_audit_lines_lost_total") == 3
        assert "audit log: cannot write to" in srv.log() and "File too large" in srv.log(), srv.log()
        resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        c.predict(q, imgs)
        lines = audit.read_text()[len(filler):].splitlines()
        assert len(lines) == 1 and json.loads(lines[0])["status"] == "ok", lines
        assert "writing again after 3 lost line(s)" in srv.log(), srv.log()
        # logrotate without copytruncate: the log is moved away, then the next line (a second
        # later at most) goes to a new file at the path
        audit.rename(tmp_path / "audit.jsonl.1")
        time.sleep(1.1)
        c.predict(q, imgs)
        assert len(audit.read_text().splitlines()) == 1 and "reopened" in srv.log(), srv.log()
        assert len((tmp_path / "audit.jsonl.1").read_text()[len(filler):].splitlines()) == 1
        assert srv.log().count("writing again after") == 1, srv.log()   # said once, not per line
        # logrotate's default `create`: a new, empty file is at the path at once (same folder, so
        # the same device: only the inode tells it apart); three such rotations leave one
        # descriptor open for the log, not four
        fds = len(os.listdir(f"/proc/{srv.proc.pid}/fd"))
        for k in range(2, 5):
            audit.rename(tmp_path / f"audit.jsonl.{k}")
            audit.touch()
            time.sleep(1.1)
            c.predict(q, imgs)
            assert len(audit.read_text().splitlines()) == 1, k
            assert len((tmp_path / f"audit.jsonl.{k}").read_text().splitlines()) == 1, k
        assert len(os.listdir(f"/proc/{srv.proc.pid}/fd")) == fds
        c.close()
    finally:
        assert srv.stop() == 0, srv.log()


def test_audit_log_whose_folder_went_away_writes_on_and_says_so_once(server, tiny, tmp_path, rng):
    """A log whose path cannot be made again (its folder moved away by a rotation script) goes
    on into the file still open - no line lost - says so once, not every second, and is made
    at its path again once the folder is back."""
    _, cfg = tiny
    logs = tmp_path / "logs"
    logs.mkdir()
    audit = logs / "audit.jsonl"
    srv = server("--audit-log", audit)
    c = ActClient("127.0.0.1", srv.port, timeout=60)
    q, imgs = _obs(rng, cfg["camera_names"])
    c.predict(q, imgs)
    logs.rename(tmp_path / "logs.old")
    for _ in range(2):   # two checks of the path (a second apart), each finding it unmakeable
        time.sleep(1.1)
        c.predict(q, imgs)
    said = "was moved or removed and cannot be made again"
    assert srv.log().count(said) == 1 and "No such file or directory" in srv.log(), srv.log()
    moved = (tmp_path / "logs.old" / "audit.jsonl").read_text().splitlines()
    assert len(moved) == 3 and all(json.loads(line)["status"] == "ok" for line in moved), moved
    assert srv.metric("act_serve_audit_lines_lost_total") == 0
    logs.mkdir()
    time.sleep(1.1)
    c.predict(q, imgs)
    assert len(audit.read_text().splitlines()) == 1 and "reopened" in srv.log(), srv.log()
    assert srv.log().count(said) == 1


def test_sigterm_ignored_at_start_still_drains(act_serve, tiny, tmp_path):
    """A wrapper's `trap '' TERM` (or a parent that ignores it) used to leave act-serve deaf to
    the signal every supervisor drains servers with: it is caught all the same, and said."""
    model, _ = tiny

    def ignore_term():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    srv = Server(act_serve, model, tmp_path, preexec_fn=ignore_term).wait_ready()
    assert "SIGTERM was ignored when act-serve started" in srv.log(), srv.log()
    assert srv.stop(signal.SIGTERM, timeout=60) == 0, srv.log()
    assert "drained" in srv.log(), srv.log()


def test_one_client_shared_by_threads_answers_each_its_own(server, tiny, rng):
    """Calls on one ActClient from several threads take turns: each gets the chunk of its own
    observation (unlocked, threads read each other's replies and timed out)."""
    import threading
    _, cfg = tiny
    srv = server()
    c = ActClient("127.0.0.1", srv.port, timeout=60)
    obs = [_obs(rng, cfg["camera_names"]) for _ in range(2)]
    want = [c.predict(q, imgs) for q, imgs in obs]
    errors = []

    def worker(k):
        try:
            for _ in range(15):
                np.testing.assert_allclose(c.predict(*obs[k]), want[k], **BATCH_TOL)
        except BaseException as e:   # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(k % 2,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.close()
    assert not errors, errors


def test_a_request_whose_chunk_is_not_finite_gets_an_error_and_its_batch_mates_their_chunks(server, tiny, rng):
    """A qpos of 3e38 is finite (it passes the request checks) but normalizes to infinity, and
    the model's chunk is NaN: act-serve used to send that chunk, for a robot to execute. That
    request gets ERROR internal naming the cause; the request batched with it gets the chunk it
    gets alone, the connection stays up, and the server stays healthy."""
    _, cfg = tiny
    cams = cfg["camera_names"]
    q, imgs = _obs(rng, cams)
    srv = server("--max-batch", 4, "--max-wait-us", 1_000_000)
    alone = ActClient("127.0.0.1", srv.port, timeout=60).predict(q, imgs)
    huge = q.copy()
    huge[0] = 3e38
    clients = [ActClient("127.0.0.1", srv.port, timeout=60) for _ in range(2)]
    for c in clients:
        c.info()
    got = [None, None]

    def ask(i, qp):
        try:
            got[i] = clients[i].predict(qp, imgs)
        except ActServerError as e:
            got[i] = e

    ts = [threading.Thread(target=ask, args=(0, huge)), threading.Thread(target=ask, args=(1, q))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert isinstance(got[0], ActServerError) and got[0].name == "internal", got[0]
    assert "is not finite" in got[0].message and "dataset statistics" in got[0].message, got[0].message
    np.testing.assert_allclose(got[1], alone, **BATCH_TOL)
    assert srv.metric("act_serve_batches_total") == 2, "the two requests did not share a forward pass"
    np.testing.assert_allclose(clients[0].predict(q, imgs), alone, **BATCH_TOL)   # same connection, next request
    assert srv.http("/healthz") == (200, "ok\n") and srv.metric("act_serve_failing") == 0


def _raw_bad_qpos(client, imgs):
    """A PREDICT whose qpos has the wrong width, sent by hand (the client itself refuses it)."""
    info = client.info()
    frames = wire.encode_frames(imgs, info["camera_names"], (IMAGE, IMAGE))
    client._sock.sendall(wire.predict(99, np.zeros(7, np.float32), frames))
    mtype, p = client._recv_frame()
    assert mtype == wire.ERROR
    return wire.parse_error(p)


def test_sigterm_drains_in_flight_requests(server, tiny, rng):
    _, cfg = tiny
    srv = server("--max-batch", 2)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=120)
    s.sendall(wire.hello())
    recv_frame(s)
    n = 6
    q, imgs = _obs(rng, cfg["camera_names"])
    frames = wire.encode_frames(imgs, cfg["camera_names"], (IMAGE, IMAGE))
    s.sendall(b"".join(wire.predict(100 + i, q + i, frames) for i in range(n)))
    deadline = time.monotonic() + 60
    while srv.metric("act_serve_requests_total") < n:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert srv.metric("act_serve_results_total") < n, "requests finished before SIGTERM: nothing was in flight"
    srv.proc.send_signal(signal.SIGTERM)
    got = {}
    for _ in range(n):
        mtype, p = recv_frame(s)
        assert mtype == wire.RESULT, wire.parse_error(p) if mtype == wire.ERROR else mtype
        r = wire.parse_result(p)
        assert r["request_id"] not in got, f"request {r['request_id']} answered twice"
        got[r["request_id"]] = r["chunk"]
    assert sorted(got) == [100 + i for i in range(n)]
    assert srv.proc.wait(timeout=120) == 0, srv.log()
    assert s.recv(1) == b"", "connection left open after the drain"
    assert "drained" in srv.log()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=5)




def test_batches_share_places_between_connections(server, tiny, rng, tmp_path):
    """A client with a long window out (an evaluation's predict_many) must not run ahead of a
    robot asking one step at a time: when more wait than a batch holds, each batch takes every
    connection's first pending request, then every one's second, ... (arrival order within a
    round), and each connection's own requests still run in the order it sent them.
    Steps of 0.3 s make it deterministic: all of A's 16 and C's 6 are queued while the first
    batch runs, and B's single request a moment after."""
    _, cfg = tiny
    slow = dict(os.environ, ACT_CPU_TIMING_MODEL="300000")
    audit = tmp_path / "audit.jsonl"
    srv = server("--max-batch", 4, "--max-wait-us", 2_000_000, "--audit-log", audit, env=slow)
    q, imgs = _obs(rng, cfg["camera_names"])
    frames = wire.encode_frames(imgs, cfg["camera_names"], (IMAGE, IMAGE))
    socks = {}
    for name in "ACB":
        socks[name] = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        socks[name].sendall(wire.hello(client_name=name))
        recv_frame(socks[name])

    def queue(name, ids, total):
        socks[name].sendall(b"".join(wire.predict(i, q, frames) for i in ids))
        deadline = time.monotonic() + 30
        while srv.metric("act_serve_requests_total") < total:
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.002)

    queue("A", range(100, 116), 16)
    queue("C", range(200, 206), 22)
    queue("B", [300], 23)
    assert srv.metric("act_serve_results_total") == 0, "the first batch ended before all were queued (a loaded host?)"
    for name, n in (("A", 16), ("C", 6), ("B", 1)):
        for _ in range(n):
            mtype, p = recv_frame(socks[name])
            assert mtype == wire.RESULT, wire.parse_error(p) if mtype == wire.ERROR else mtype
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert len(lines) == 23 and all(a["status"] == "ok" for a in lines), lines
    order = [(a["client"], a["id"]) for a in lines]
    for name in "ACB":   # each connection's own requests in the order sent
        ids = [i for c, i in order if c == name]
        assert ids == sorted(ids), (name, order)
    # batch 1: A's first 4 (alone when it was taken); then each batch one place per connection:
    # batch 2 A, C, B + A's next (round two, A first); C's and A's alternate until C runs out
    by_batch = [order[i:i + 4] for i in range(0, 23, 4)]
    assert [c for c, _ in by_batch[0]] == ["A"] * 4, by_batch
    assert sorted(c for c, _ in by_batch[1]) == ["A", "A", "B", "C"], by_batch
    assert sorted(c for c, _ in by_batch[2]) == ["A", "A", "C", "C"], by_batch
    assert [c for c, _ in order].index("B") < 8, order


def test_max_connection_age_closes_idle_connections_only(server, tiny, rng, tmp_path):
    """--max-connection-age: a connection past its age (0.9-1.1 of it) is closed the next time
    it owes nothing - never with a request out, however long it stays busy - and the client
    sees the end before its next call, which goes once, on a new connection."""
    _, cfg = tiny
    slow = dict(os.environ, ACT_CPU_TIMING_MODEL="250000")   # 0.25 s steps
    srv = server("--max-connection-age", 1, "--max-batch", 2, env=slow)
    assert "--max-connection-age" in subprocess.run([str(srv.proc.args[0]), "--help"], capture_output=True,
                                                     text=True).stdout
    q, imgs = _obs(rng, cfg["camera_names"])
    c = ActClient("127.0.0.1", srv.port, timeout=60)
    # busy past the age: 12 requests in 6 batches of 2 (1.5 s), all out at once on one connection
    n = 12
    qs = np.stack([q + i for i in range(n)])
    t0 = time.monotonic()
    c.predict_many(qs, {k: np.stack([v] * n) for k, v in imgs.items()})
    assert time.monotonic() - t0 > 1.4
    assert (c.reconnects, c.last_result["resent"]) == (0, 0), c.last_result
    # then idle: it goes within 1.1 s of connecting (at the last reply, or the 0.1 s scan)
    deadline = time.monotonic() + 10
    while srv.metric("act_serve_connections_aged_total") < 1:
        assert time.monotonic() < deadline, srv.log()
        time.sleep(0.05)
    assert "older than --max-connection-age 1 s" in srv.log()
    while c._sock is not None:   # what every call does first: the ended stream is let go unused
        assert time.monotonic() < deadline, "the client does not see the stream's end"
        c._drop_if_closed()
        time.sleep(0.01)
    while srv.metric("act_serve_connections") > 0:   # the server's side closes at the client's
        assert time.monotonic() < deadline, srv.log()
        time.sleep(0.01)
    np.testing.assert_allclose(c.predict(q, imgs), c.predict(q, imgs))
    assert c.reconnects == 1 and c.connect_failures == 0
    assert srv.metric("act_serve_requests_total") == srv.metric("act_serve_results_total") == n + 2
    assert srv.metric("act_serve_connections_dropped_total") == 0

    # a robot's loop of single steps: aged between two of its calls, and not one call fails
    fast = server("--max-connection-age", 1)
    c = ActClient("127.0.0.1", fast.port, timeout=60)
    sends = []   # the PREDICTs put on a connection: one per call, none sent again
    send_parts = c._send_parts
    c._send_parts = lambda parts, deadline: (sends.append(wire.HDR.unpack_from(bytes(parts[0]))[2]),
                                             send_parts(parts, deadline))
    t0 = time.monotonic()
    calls = 0
    while time.monotonic() - t0 < 2.6:
        c.predict(q, imgs)
        calls += 1
        time.sleep(0.02)
    assert 2 <= c.reconnects <= 3 and c.connect_failures == 0, (c.reconnects, fast.log())
    # each reconnect followed an aging; the last connection may have aged since the loop ended
    assert fast.metric("act_serve_connections_aged_total") in (c.reconnects, c.reconnects + 1)
    assert fast.metric("act_serve_results_total") == calls
    assert sends.count(wire.PREDICT) == calls, sends

    # the Unix socket has no balancer to place it again: its connections (and their shared
    # memory, registered with the session) are never aged
    sock = tmp_path / "age.sock"
    local = server("--max-connection-age", 1, "--unix", sock)
    c = ActClient(unix_path=str(sock), timeout=60)
    c.predict(q, imgs)
    time.sleep(1.5)
    c.predict(q, imgs)
    assert c.reconnects == 0 and local.metric("act_serve_connections_aged_total") == 0


def test_idle_connections_age_spread_out_and_on_time(server):
    """Clients that connected together (a restart's) must not all reconnect together: eight idle
    connections opened at once end at their own times within 0.9-1.1 of the age - not all in the
    same instant, and none at the I/O loop's next one-second wake-up past the window."""
    srv = server("--max-connection-age", 2)
    socks = []
    for _ in range(8):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(wire.hello())
        recv_frame(s)
        socks.append(s)
    t0 = time.monotonic()
    ends = []
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    while len(ends) < len(socks) and time.monotonic() - t0 < 10:
        for key, _ in sel.select(timeout=1):   # each end timed as it comes
            assert key.fileobj.recv(1) == b""
            sel.unregister(key.fileobj)
            ends.append(time.monotonic() - t0)
    assert 1.75 <= min(ends) and max(ends) <= 2.2 + 0.2, ends
    assert max(ends) - min(ends) >= 0.15, f"all ended together: {ends}"
    assert srv.metric("act_serve_connections_aged_total") == 8


def test_every_flag_has_its_row_in_serving_md(act_serve):
    """docs/SERVING.md's option table and `act-serve --help` name the same flags with the same
    environment variables: a flag added without its row (or a row left for a removed flag) fails."""
    p = subprocess.run([str(act_serve), "--help"], capture_output=True, text=True, timeout=60)
    helped = dict(re.findall(r"^  (--[a-z0-9-]+) +(ACT_[A-Z0-9_]+)", p.stdout, re.M))
    doc = (REPO / "docs" / "SERVING.md").read_text()
    rows = dict(re.findall(r"^\| `(--[a-z0-9-]+)` \| `(ACT_[A-Z0-9_]+)` \|", doc, re.M))
    assert len(helped) >= 25 and helped == rows, (sorted(set(helped.items()) ^ set(rows.items())))


def test_drain_timeout_bounds_the_shutdown_and_a_second_signal_exits_at_once(server, tiny, rng, tmp_path):
    """--drain-timeout-ms is the longest drain: requests still queued at its end are dropped
    (their connection closes, the client retries elsewhere), not computed one by one with no one
    to answer; the batch computing then finishes. A second SIGTERM exits at once (128 + 15),
    removing the Unix socket."""
    _, cfg = tiny
    slow = dict(os.environ, ACT_CPU_TIMING_MODEL="1000000")   # 1 s steps
    q, imgs = _obs(rng, cfg["camera_names"])
    frames = wire.encode_frames(imgs, cfg["camera_names"], (IMAGE, IMAGE))

    def queue_eight(srv):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        s.sendall(wire.hello())
        recv_frame(s)
        s.sendall(b"".join(wire.predict(300 + i, q, frames) for i in range(8)))
        deadline = time.monotonic() + 60
        while srv.metric("act_serve_requests_total") < 8:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return s

    srv = server("--max-batch", 1, "--drain-timeout-ms", 500, env=slow)
    s = queue_eight(srv)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=60) == 0, srv.log()
    took = time.monotonic() - t0
    assert took < 4.0, f"exited {took:.1f} s after SIGTERM with --drain-timeout-ms 500 and 1 s steps:\n{srv.log()}"
    assert "queued requests dropped past the drain deadline" in srv.log(), srv.log()
    answered = 0
    s.settimeout(10)
    while True:   # at most what ran before the deadline, then the connection closes
        try:
            mtype, p = recv_frame(s)
        except ConnectionError:
            break
        assert mtype == wire.RESULT
        answered += 1
    assert answered < 8

    sock_path = tmp_path / "serve.sock"
    srv = server("--max-batch", 1, "--drain-timeout-ms", 60000, "--unix", sock_path, env=slow)
    assert sock_path.exists()
    s = queue_eight(srv)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert srv.proc.poll() is None, "the first signal drains (7 s of queued steps, 60 s allowed)"
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=60) == 128 + signal.SIGTERM, srv.log()
    assert time.monotonic() - t0 < 2.0
    assert "a second signal: exiting now" in srv.log()
    assert not sock_path.exists(), "the Unix socket was left behind"


def test_sighup_drains_like_sigterm_and_the_port_file_goes_with_the_server(server, tiny, rng):
    """A server started from a terminal or an ssh session that closes gets SIGHUP: it drains and
    exits 0, saying so, instead of dying silently; its --port-file (a dead server's port) goes."""
    _, cfg = tiny
    srv = server()
    c = ActClient("127.0.0.1", srv.port, timeout=60)
    q, imgs = _obs(rng, cfg["camera_names"])
    c.predict(q, imgs)
    assert srv.pf.exists()
    assert srv.stop(signal.SIGHUP) == 0, srv.log()
    assert "signal received: draining" in srv.log() and "drained, exiting" in srv.log(), srv.log()
    assert not srv.pf.exists(), "the port file outlived the server"


def test_a_replaced_server_leaves_its_successor_s_port_file(act_serve, tiny, tmp_path):
    """Rolling restart with one --port-file: B starts (rewriting the file), then A is stopped. A
    removes the file only while it still holds A's port, so B stays findable."""
    pf = tmp_path / "serve.port"

    def start():
        log = open(tmp_path / f"log-{time.monotonic_ns()}", "w")
        return subprocess.Popen([str(act_serve), "--model", str(tiny[0]), "--device", "cpu", "--port", "0",
                                 "--port-file", str(pf)], stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=default_signals)

    def wait_port(proc, not_port=None):
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            if pf.exists() and pf.read_text().endswith("\n") and pf.read_text() != not_port:
                return pf.read_text()
            time.sleep(0.05)

    pa = start()
    port_a = wait_port(pa)
    pb = start()
    port_b = wait_port(pb, not_port=port_a)
    pa.send_signal(signal.SIGTERM)
    assert pa.wait(timeout=60) == 0
    assert pf.exists() and pf.read_text() == port_b, "A removed B's port file"
    pb.send_signal(signal.SIGTERM)
    assert pb.wait(timeout=60) == 0
    assert not pf.exists(), "B left its own port file behind"


def test_sighup_ignored_at_start_stays_ignored(act_serve, tiny, tmp_path, rng):
    """nohup act-serve ...: SIGHUP stays ignored; SIGTERM still drains."""
    _, cfg = tiny
    s2 = Server(act_serve, tiny[0], tmp_path,
                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)).wait_ready()
    try:
        s2.proc.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        assert s2.proc.poll() is None, s2.log()
        q, imgs = _obs(rng, cfg["camera_names"])
        assert ActClient("127.0.0.1", s2.port, timeout=60).predict(q, imgs).shape == (cfg["pred_horizon"], cfg["action_dim"])
    finally:
        assert s2.stop(signal.SIGTERM) == 0, s2.log()


def test_a_port_file_that_cannot_be_written_stops_before_the_model_loads(act_serve, tmp_path):
    """With --port 0 the port file is how anyone finds the server: a folder that cannot take it
    is an error at once, before a load and warm-up that can take a minute."""
    p = subprocess.run([str(act_serve), "--model", str(tmp_path / "absent.actw"), "--port", "0",
                        "--port-file", str(tmp_path / "no" / "such" / "port.txt")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--port-file" in p.stderr and "cannot take it" in p.stderr, p.stderr
    assert "absent" not in p.stderr, "the model was opened first"


def test_a_load_that_runs_out_of_address_space_exits(act_serve, tiny, tmp_path):
    """Under ulimit -v too small for the model, act-serve says why and exits 1: it used to hang in
    OpenBLAS's exit handler (a worker retrying its failed allocation forever), deaf to SIGTERM."""
    import resource

    def tight():
        resource.setrlimit(resource.RLIMIT_AS, (150_000 * 1024, 150_000 * 1024))

    p = subprocess.run([str(act_serve), "--model", str(tiny[0]), "--device", "cpu", "--port", "0"],
                       capture_output=True, text=True, timeout=60, preexec_fn=tight)
    assert p.returncode == 1 and "out of memory" in p.stderr, (p.returncode, p.stderr)


def test_client_refuses_a_restarted_server_with_other_weights(server, tiny, ref, tmp_path, rng):
    """The same contract (cameras, dims, frame size) but another model hash after a reconnect:
    one evaluation must not mix two checkpoints, so the client refuses unless it was made with
    allow_model_change=True. A 200-byte client name (a long pod name) is accepted on the way."""
    model, cfg = tiny
    other, _ = _build_tiny(tmp_path, ref, seed=6)
    srv = server()
    port = srv.port
    strict = ActClient("127.0.0.1", port, timeout=60, client_name="pod-" + "x" * 196)
    lenient = ActClient("127.0.0.1", port, timeout=60, allow_model_change=True)
    q, imgs = _obs(rng, cfg["camera_names"])
    first = strict.predict(q, imgs)
    lenient.predict(q, imgs)
    h0 = strict.info()["model_hash"]
    assert srv.stop() == 0
    server(port=port, model=other)
    with pytest.raises(ActContractError, match="same contract, other weights or statistics.*allow_model_change"):
        strict.predict(q, imgs)
    second = lenient.predict(q, imgs)
    assert lenient.info()["model_hash"] != h0 and lenient.reconnects == 1
    assert np.abs(second - first).max() > 1e-3, "the two models answer alike: the test proves nothing"
    strict.close()
    lenient.close()


def test_a_client_pinned_to_a_model_hash_refuses_another_at_its_first_call(server, tiny, ref, tmp_path, rng):
    """One evaluation's workers each make their own client: a worker whose first connection
    meets a replica restarted on another checkpoint had nothing to compare with, so the eval
    mixed two models silently. model_hash= (the hash the parent read once) pins them all."""
    model, cfg = tiny
    other, _ = _build_tiny(tmp_path, ref, seed=6)
    srv = server()
    port = srv.port
    q, imgs = _obs(rng, cfg["camera_names"])
    h0 = ActClient("127.0.0.1", port, timeout=60).info()["model_hash"]
    pinned = ActClient("127.0.0.1", port, timeout=60, model_hash=h0.upper())   # case does not matter
    first = pinned.predict(q, imgs)
    assert srv.stop() == 0
    server(port=port, model=other)
    late = ActClient("127.0.0.1", port, timeout=60, model_hash=h0)   # a worker starting only now
    with pytest.raises(ActContractError, match=f"serves model [0-9a-f]{{16}}, not {h0} as this client was made"):
        late.predict(q, imgs)
    with pytest.raises(ActContractError, match="other weights or statistics"):
        pinned.predict(q, imgs)
    unpinned = ActClient("127.0.0.1", port, timeout=60)
    assert np.abs(unpinned.predict(q, imgs) - first).max() > 1e-3   # the models differ: a real test
    for c in (pinned, late, unpinned):
        c.close()


def test_healthz_says_draining_while_another_io_thread_drains(server, tiny, rng):
    # the first I/O thread serves /healthz; its own client is idle, the other thread's has
    # requests in flight (0.3 s steps): during the drain the probe must still be answered
    _, cfg = tiny
    srv = server("--io-threads", 2, "--max-batch", 1, env=dict(os.environ, ACT_CPU_TIMING_MODEL="300000"))
    idle = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    idle.sendall(wire.hello())
    recv_frame(idle)
    busy = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    busy.sendall(wire.hello())
    recv_frame(busy)
    assert "connected (I/O thread 2 of 2)" in srv.log(), srv.log()
    q, imgs = _obs(rng, cfg["camera_names"])
    frames = wire.encode_frames(imgs, cfg["camera_names"], (IMAGE, IMAGE))
    busy.sendall(b"".join(wire.predict(200 + i, q, frames) for i in range(4)))
    deadline = time.monotonic() + 60
    while srv.metric("act_serve_requests_total") < 4:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)   # the first thread has nothing in flight: it would have left by now
    status, body = srv.http("/healthz")
    assert (status, body) == (503, "draining\n")
    got = sorted(wire.parse_result(recv_frame(busy)[1])["request_id"] for _ in range(4))
    assert got == [200, 201, 202, 203]
    assert srv.proc.wait(timeout=60) == 0, srv.log()


def test_client_survives_server_killed_and_restarted(server, tiny, rng):
    _, cfg = tiny
    srv = server()
    port = srv.port
    client = ActClient("127.0.0.1", port, timeout=180)
    q, imgs = _obs(rng, cfg["camera_names"])
    want = client.predict(q, imgs)
    results, errors, stop = [], [], threading.Event()

    def loop():
        try:
            while not stop.is_set():
                results.append(client.predict(q, imgs))
        except BaseException as e:
            errors.append(e)

    th = threading.Thread(target=loop)
    th.start()
    time.sleep(0.3)
    srv.stop(signal.SIGKILL)
    n_before = len(results)
    time.sleep(0.5)
    server(port=port)   # a new process on the same port
    deadline = time.monotonic() + 120
    while len(results) < n_before + 2 and not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    th.join(timeout=180)
    assert not errors, errors
    assert len(results) >= n_before + 2 and client.reconnects >= 1
    for r in results:
        np.testing.assert_allclose(r, want, **TOL)


def test_timeouts_raise_a_clear_exception(tiny):
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(4)   # accepts (in the kernel) and never answers
    t0 = time.monotonic()
    with pytest.raises(ActTimeoutError, match=r"no HELLO reply within 0.5 s"):
        ActClient("127.0.0.1", mute.getsockname()[1], timeout=0.5).info()
    assert time.monotonic() - t0 < 10
    port = mute.getsockname()[1]
    mute.close()
    with pytest.raises(ActTimeoutError, match="could not complete"):
        ActClient("127.0.0.1", port, timeout=0.5).info()


def test_client_installs_with_pip_and_needs_only_numpy(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO / "tools" / "act_client", src, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                        "--target", str(target), str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    probe = ("import sys, act_client; from act_client import ActClient, ActPolicyRunner, ActTimeoutError; "
             "assert act_client.__file__.startswith(sys.argv[1]), act_client.__file__; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'zstandard', 'h5py')))")
    p = subprocess.run([sys.executable, "-c", probe, str(target)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": os.environ.get("PATH", "")})
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_every_flag_has_an_environment_twin_and_the_flag_wins(server, act_serve, tiny, tmp_path):
    env = dict(os.environ, ACT_SERVE_MAX_BATCH="3", ACT_SERVE_AUDIT_LOG=str(tmp_path / "env_audit.jsonl"))
    srv = server(env=env)
    assert ActClient("127.0.0.1", srv.port, timeout=60).info()["max_batch"] == 3
    assert (tmp_path / "env_audit.jsonl").exists()
    srv = server("--max-batch", 5, env=env)
    assert ActClient("127.0.0.1", srv.port, timeout=60).info()["max_batch"] == 5
    p = subprocess.run([str(act_serve), "--model", str(tiny[0])], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, ACT_SERVE_PORT="seventy"))
    assert p.returncode == 2 and "ACT_SERVE_PORT" in p.stderr and "seventy" in p.stderr, p.stderr
    # the flag wins even over a variable that would not parse (a stale one in a unit file)
    srv = server("--max-batch", 4, env=dict(os.environ, ACT_SERVE_MAX_BATCH="abc"))
    assert ActClient("127.0.0.1", srv.port, timeout=60).info()["max_batch"] == 4
    p = subprocess.run([str(act_serve), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr   # --help | less shows it
    for flag in ("--model", "--port", "--device", "--precision", "--max-batch", "--max-wait-us", "--copy-threads", "--max-clients",
                 "--io-threads", "--metrics-port", "--audit-log", "--batch-sizes"):
        assert flag in p.stdout and "ACT_SERVE_" + flag[2:].upper().replace("-", "_") in p.stdout, flag
    assert "--algo-cache" in p.stdout and "ACT_CUDA_ALGO_CACHE" in p.stdout
    p = subprocess.run([str(act_serve), "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("act-serve "), p.stdout + p.stderr
    # a value out of its flag's range is refused before anything is loaded, naming the flag and
    # the range (a port past 65535 used to be taken modulo 65536 by getaddrinfo)
    for flag, bad, rng in (("--io-threads", "-1", "0 to 16"), ("--io-threads", "17", "0 to 16"),
                           ("--port", "70000", "0 to 65535"), ("--port", "-1", "0 to 65535"),
                           ("--metrics-port", "65536", "-1 to 65535"), ("--max-queue", "0", "1 to"),
                           ("--max-batch", "0", "1 to 65536"), ("--keepalive-s", "90000", "0 to 86400"),
                           ("--max-out-bytes", "100", "4096 to"), ("--copy-threads", "65", "0 to 64"),
                           ("--port", "99999999999999999999", "0 to 65535")):
        p = subprocess.run([str(act_serve), "--model", str(tmp_path / "absent.actw"), flag, bad],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and f"{flag} (" in p.stderr and f"{bad} is out of range: {rng}" in p.stderr, p.stderr
    # switches: 1/0, true/false, yes/no, on/off; anything else is refused (off used to mean on)
    p = subprocess.run([str(act_serve), "--model", str(tmp_path / "absent.actw")], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, ACT_SERVE_VERBOSE="maybe"))
    assert p.returncode == 2 and "ACT_SERVE_VERBOSE" in p.stderr and "'maybe' is not a switch" in p.stderr, p.stderr
    srv = server("--metrics-port", -1)   # metrics off: the port file says -1, as the flag does
    assert srv.mport == -1 and srv.port > 0
    for word, logged in (("off", False), ("no", False), ("on", True)):   # the later --verbose wins
        srv = server("--verbose", word)
        ActClient("127.0.0.1", srv.port, timeout=60).info()
        assert srv.stop() == 0
        assert ("connected" in srv.log()) == logged, (word, srv.log())
    # batch sizes that are not sizes, or above max-batch: refused before the model loads
    for bad, says in (("64", "64 is above --max-batch 32"), ("4,,8", "expected 'auto', 'all' or sizes"),
                      ("4,", "missing after the last comma")):
        p = subprocess.run([str(act_serve), "--model", str(tmp_path / "absent.actw"), "--port", "0", "--batch-sizes", bad],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and says in p.stderr and "absent" not in p.stderr, p.stderr
    # out of descriptors while making the third I/O thread's epoll set: an error, not a crash
    import resource

    def few_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (8, 8))

    p = subprocess.run([str(act_serve), "--model", str(tiny[0]), "--port", "0", "--io-threads", "4"],
                       capture_output=True, text=True, timeout=60, preexec_fn=few_fds)
    assert p.returncode == 1 and "epoll/eventfd: Too many open files" in p.stderr, (p.returncode, p.stderr)


def test_sampled_posterior_is_seeded_and_runs_alone(server, tiny, rng):
    _, cfg = tiny
    srv = server("--max-wait-us", 200_000)
    c = ActClient("127.0.0.1", srv.port, timeout=120)
    q, imgs = _obs(rng, cfg["camera_names"])
    acts = rng.standard_normal((cfg["pred_horizon"], cfg["action_dim"])).astype(np.float32)
    mean = c.predict(q, imgs, actions=acts)
    a = c.predict(q, imgs, actions=acts, sample_latent=True, seed=7)
    assert c.last_result["batch"] == 1 and c.last_result["posterior"]
    b = c.predict(q, imgs, actions=acts, sample_latent=True, seed=7)
    other = c.predict(q, imgs, actions=acts, sample_latent=True, seed=8)
    np.testing.assert_array_equal(a, b)                  # the seed alone decides the noise
    assert not np.allclose(a, mean, rtol=1e-4, atol=1e-4), "sampling z changed nothing"
    assert not np.allclose(a, other, rtol=1e-4, atol=1e-4), "another seed gave the same sample"
