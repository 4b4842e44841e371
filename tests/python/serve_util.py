"""Helpers shared by the act-serve tests: a raw-socket frame reader (the tests speak the wire
protocol directly to send what a well-behaved ActClient never would) and the episode replay that
several clients run at once against one server."""
import threading

import numpy as np
from act_client import wire


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
