"""Scale-out: two act-serve replicas behind HAProxy (TCP mode) on loopback, the setup that
docs/SERVING.md documents. Clients talk to the balancer only; both replicas must serve, every
chunk must be right, and draining one replica (SIGTERM) must not fail a single client call:
the replica answers what it holds, the client reconnects, HAProxy's /healthz check and
redispatch send it to the other replica.
"""

from __future__ import annotations

import http.client
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "act_client"))

from act_client import ActClient  # noqa: E402
from serve_util import BATCH_TOL, Server  # noqa: E402

IMAGE = 40
CAMS = ["l_vis", "r_vis", "front"]

HAPROXY_CFG = """\
global
    maxconn 4096
defaults
    mode tcp
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    retries 3
    option redispatch
frontend act_serve
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance roundrobin
    option httpchk
    http-check send meth GET uri /healthz
    default-server inter 200ms fall 1 rise 2
{servers}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]





def _results_total(mport) -> float:
    c = http.client.HTTPConnection("127.0.0.1", mport, timeout=10)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith("act_serve_results_total "):
            return float(line.split()[1])
    return 0.0


def _haproxy() -> str:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.skip("haproxy is not installed (apt-get install -y haproxy); CI installs it")
    return haproxy


def _tiny_model(ref, tmp_path) -> Path:
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import conftest

    cfg = conftest.small_cfg(image_size=IMAGE, vision_backbone={"input_shape": [3, 48, 48]})
    agent = ref.randomize_(ref.build_agent(cfg), 21)
    ref.save_checkpoint(agent, str(tmp_path / "ck.pt"), cfg, layout="model_state_dict", stats_in="state_dict",
                        prefix="", stats_path=str(tmp_path / "st.pkl"), config_path=str(tmp_path / "ck.yaml"),
                        include_config=False)
    model = tmp_path / "tiny.actw"
    subprocess.run([sys.executable, str(REPO / "tools" / "convert_checkpoint.py"), str(tmp_path / "ck.pt"), "-o",
                    str(model), "--config", str(tmp_path / "ck.yaml"), "--stats", str(tmp_path / "st.pkl")],
                   check=True, capture_output=True)
    return model


def _start_haproxy(haproxy, tmp_path, ports, server_opts=""):
    """HAProxy in TCP mode on a free port before the replicas (port, metrics port); health
    checks on /healthz. Returns (process, its port) once its first checks had time to run."""
    lb_port = _free_port()
    servers = "\n".join(f"    server r{i} 127.0.0.1:{p} check port {m} {server_opts}" for i, (p, m) in enumerate(ports))
    (tmp_path / "haproxy.cfg").write_text(HAPROXY_CFG.format(port=lb_port, servers=servers))
    with open(tmp_path / "haproxy.log", "w") as lb_log:
        lb = subprocess.Popen([haproxy, "-db", "-f", str(tmp_path / "haproxy.cfg")], stdout=lb_log,
                              stderr=subprocess.STDOUT)
    time.sleep(1.0)   # first health checks (inter 200ms, rise 2)
    assert lb.poll() is None, (tmp_path / "haproxy.log").read_text()
    return lb, lb_port



@pytest.fixture
def procs():
    """The processes a test starts (replicas, HAProxy): killed at its end, passed or not."""
    started = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def _obs(seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(5).astype(np.float32),
            {c: rng.integers(0, 256, (IMAGE, IMAGE, 3), dtype=np.uint8) for c in CAMS})


class _Loops:
    """Each client predicting q, imgs in a loop on its own thread (a pause between calls) until
    stop(): .got the chunks, .errors what any call raised."""

    def __init__(self, clients, q, imgs, pause=0.0):
        self.got, self.errors, self._stop = [], [], threading.Event()

        def loop(c):
            try:
                while not self._stop.is_set():
                    self.got.append(c.predict(q, imgs))
                    time.sleep(pause)
            except BaseException as e:
                self.errors.append(e)

        self._threads = [threading.Thread(target=loop, args=(c,)) for c in clients]
        for t in self._threads:
            t.start()

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(timeout=180)


def test_two_replicas_behind_haproxy(act_serve, ref, tmp_path, procs):
    haproxy = _haproxy()
    model = _tiny_model(ref, tmp_path)
    replicas = [Server(act_serve, model, tmp_path) for _ in range(2)]
    procs += [r.proc for r in replicas]
    ports = [(r.port, r.mport) for r in [s.wait_ready() for s in replicas]]
    lb, lb_port = _start_haproxy(haproxy, tmp_path, ports)
    procs.append(lb)

    q, imgs = _obs(5)
    want = ActClient("127.0.0.1", ports[0][0], timeout=120).predict(q, imgs)

    # four clients through the balancer, each its own connection: round robin spreads them
    clients = [ActClient("127.0.0.1", lb_port, timeout=120) for _ in range(4)]
    for c in clients:
        np.testing.assert_allclose(c.predict(q, imgs), want, **BATCH_TOL)
    assert all(_results_total(m) >= 1 for _, m in ports), "a replica received no traffic"

    loops = _Loops(clients, q, imgs)
    time.sleep(0.5)
    procs[0].send_signal(signal.SIGTERM)   # drain replica 0 under load
    assert procs[0].wait(timeout=120) == 0
    n = len(loops.got)
    deadline = time.monotonic() + 120
    while len(loops.got) < n + 8 and not loops.errors and time.monotonic() < deadline:
        time.sleep(0.05)
    loops.stop()
    assert not loops.errors, loops.errors
    assert len(loops.got) >= n + 8, "clients made no progress after one replica drained"
    for g in loops.got:
        np.testing.assert_allclose(g, want, **BATCH_TOL)


def test_max_connection_age_spreads_clients_after_a_rolling_restart(act_serve, ref, tmp_path, procs):
    """The rolling-restart case: while replica 1 was down every client connected to replica 0,
    and connections last, so without --max-connection-age replica 1 would get nothing when it
    is back. With it (1 s), replica 0 lets each client's connection go between two of its calls,
    the client reconnects through HAProxy, and round robin puts some on replica 1 - while every
    call succeeds."""
    haproxy = _haproxy()
    model = _tiny_model(ref, tmp_path)
    ports = [(0, 0), (_free_port(), _free_port())]
    r0 = Server(act_serve, model, tmp_path, "--max-connection-age", 1).wait_ready()
    procs.append(r0.proc)
    ports[0] = (r0.port, r0.mport)
    lb, lb_port = _start_haproxy(haproxy, tmp_path, ports)   # replica 1 down (not started)
    procs.append(lb)
    q, imgs = _obs(7)
    clients = [ActClient("127.0.0.1", lb_port, timeout=60) for _ in range(4)]
    want = clients[0].predict(q, imgs)
    for c in clients[1:]:
        np.testing.assert_allclose(c.predict(q, imgs), want, **BATCH_TOL)
    r1 = Server(act_serve, model, tmp_path, "--max-connection-age", 1, port=ports[1][0], metrics_port=ports[1][1])
    procs.append(r1.proc)
    r1.wait_ready()

    loops = _Loops(clients, q, imgs, pause=0.01)
    deadline = time.monotonic() + 20
    while (_results_total(ports[1][1]) < 8 or _results_total(ports[0][1]) < 8 + 4) and not loops.errors \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    loops.stop()
    assert not loops.errors, loops.errors
    assert _results_total(ports[1][1]) >= 8, f"replica 1 got no clients back:\n{r0.log()}"
    assert r0.metric("act_serve_connections_aged_total") >= 1
    assert sum(c.reconnects for c in clients) >= 1 and not any(c.connect_failures for c in clients)
    for g in loops.got:
        np.testing.assert_allclose(g, want, **BATCH_TOL)


@pytest.mark.parametrize("send", ["send-proxy", "send-proxy-v2"])
def test_proxy_protocol_names_the_client_behind_haproxy(act_serve, ref, tmp_path, procs, send):
    """Without it, every audit line behind a balancer names the balancer; with act-serve
    --proxy-protocol and HAProxy's send-proxy(-v2), each names the client's own address."""
    haproxy = _haproxy()
    model = _tiny_model(ref, tmp_path)
    r = Server(act_serve, model, tmp_path, "--proxy-protocol", "--audit-log", tmp_path / "audit.jsonl").wait_ready()
    procs.append(r.proc)
    lb, lb_port = _start_haproxy(haproxy, tmp_path, [(r.port, r.mport)], send)
    procs.append(lb)
    q, imgs = _obs(9)
    clients = [ActClient("127.0.0.1", lb_port, timeout=60, client_name=f"w{i}") for i in range(3)]
    for c in clients:
        c.predict(q, imgs)
    want = {f"w{i}": "%s:%d" % c._sock.getsockname()[:2] for i, c in enumerate(clients)}
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert {a["client"]: a["peer"] for a in lines} == want, (lines, r.log())
    assert r.metric("act_serve_connections_dropped_total") == 0
