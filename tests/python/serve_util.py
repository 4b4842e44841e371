"""Helpers shared by the act-serve tests: one act-serve process (Server), a raw-socket frame
reader (the tests speak the wire protocol directly to send what a well-behaved ActClient never
would) and the episode replay that several clients run at once against one server."""
import http.client
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import numpy as np
from act_client import wire
from conftest import default_signals

# A chunk served in a batch against the same request computed alone (or by act-infer at another
# batch size): the CPU engine is not batch-invariant. OpenBLAS's kernels round an element by
# where it falls in their blocking, which depends on the matrix sizes and on how the backend
# splits a product over its threads, and Winograd F(4x4)'s output transform (coefficients up to
# 8) carries that into the result: ~2e-5 absolute on values near 1 was seen. 1e-4 is the
# parity contract's own bound; a request mixed up with another differs by 0.1 or more.
BATCH_TOL = dict(rtol=1e-4, atol=1e-4)


class Server:
    """One act-serve process on a free port; ready once it writes its --port-file."""

    def __init__(self, exe, model, workdir: Path, *extra, port=0, metrics_port=0, env=None, device="cpu",
                 preexec_fn=None):
        self.pf = workdir / f"port-{uuid.uuid4().hex}.txt"
        self.logpath = workdir / f"serve-{uuid.uuid4().hex}.log"
        cmd = [str(exe), "--model", str(model), "--device", device, "--port", str(port), "--metrics-port", str(metrics_port),
               "--port-file", str(self.pf), "--verbose", *map(str, extra)]
        def preexec():
            default_signals()
            if preexec_fn:
                preexec_fn()

        with open(self.logpath, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec)
        self.port = self.mport = None

    def wait_ready(self, timeout=180):
        deadline = time.monotonic() + timeout
        while not self.pf.exists() or not self.pf.read_text().endswith("\n"):
            assert self.proc.poll() is None, f"act-serve exited {self.proc.returncode}:\n{self.log()}"
            assert time.monotonic() < deadline, f"act-serve not ready in {timeout} s:\n{self.log()}"
            time.sleep(0.05)
        self.port, self.mport = map(int, self.pf.read_text().split())
        return self

    def log(self) -> str:
        return self.logpath.read_text()

    def http(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.mport, timeout=10)
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()

    def metric(self, name) -> float:
        for line in self.http("/metrics")[1].splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self, sig=signal.SIGTERM, timeout=120) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


def recv_frame(s):
    """Read one whole frame from socket s: (message type, payload bytes)."""
    def exact(n):
        b = b""
        while len(b) < n:
            chunk = s.recv(n - len(b))
            if not chunk:
                raise ConnectionError("closed by server")
            b += chunk
        return b

    magic, version, mtype, length = wire.HDR.unpack(exact(wire.HDR.size))
    assert magic == wire.MAGIC and version == wire.VERSION
    return mtype, exact(length)


def replay_episode(clients, qpos, images, actions, horizon):
    """Client i of n predicts timesteps i, i + n, ... of one episode, all clients at once (after
    a barrier): a prior chunk, then the posterior chunk for the recorded actions of that window
    (padded past the end). Returns dicts by timestep (prior, posterior, kl) and the batch sizes
    the server reported; re-raises the first error of any client thread."""
    T, n = len(qpos), len(clients)
    prior, post, kl, batches, errors = {}, {}, {}, [], []
    barrier = threading.Barrier(n)

    def work(i):
        try:
            c = clients[i]
            barrier.wait()
            for t in range(i, T, n):
                imgs = {cam: images[cam][t] for cam in images}
                prior[t] = c.predict(qpos[t], imgs)
                batches.append(c.last_result["batch"])
                idx = np.minimum(np.arange(t, t + horizon), T - 1)
                pad = (np.arange(t, t + horizon) >= T).astype(np.uint8)
                post[t] = c.predict(qpos[t], imgs, actions=actions[idx], is_pad=pad)
                assert c.last_result["posterior"]
                kl[t] = c.last_result["kl"]
        except BaseException as e:   # surfaced by the caller's thread below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return prior, post, kl, batches
