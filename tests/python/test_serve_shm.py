"""act-serve's Unix socket and shared-memory frames (docs/PROTOCOL.md, SHM_ATTACH).

The same request must give the same chunk whichever way its frames travel (TCP, inline on the
Unix socket, or in a client's memfd), alone or batched with TCP clients; and every misuse - a
descriptor over TCP, none at all, an unsealed or short file, offsets outside the area, stray
descriptors on other frames, a client that vanishes with a request in flight - gets a clear
error or is ignored, leaks no descriptor or mapping, and leaves the server serving.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "act_client"))

from act_client import ActClient, ActError  # noqa: E402
from act_client import wire  # noqa: E402
from serve_util import BATCH_TOL, Server, recv_frame  # noqa: E402

IMAGE = 40
CAMS = ["l_vis", "r_vis", "front"]
FRAME = IMAGE * IMAGE * 3


@pytest.fixture(scope="module")
def srv(act_serve, make_model, tmp_path_factory):
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import conftest

    d = tmp_path_factory.mktemp("shm")
    cfg = conftest.small_cfg(image_size=IMAGE, vision_backbone={"input_shape": [3, 48, 48]})
    model, _ = make_model(d, cfg, 23)
    sock = d / "act.sock"
    s = Server(act_serve, model, d, "--unix", sock, "--max-batch", 4, "--max-wait-us", 20000).wait_ready()
    rng = np.random.default_rng(7)
    s.sock, s.model, s.dir = str(sock), model, d
    s.q = rng.standard_normal(5).astype(np.float32)
    s.imgs = {c: rng.integers(0, 256, (IMAGE, IMAGE, 3), dtype=np.uint8) for c in CAMS}
    s.want = ActClient("127.0.0.1", s.port, timeout=120).predict(s.q, s.imgs)
    yield s
    assert s.stop() == 0, s.log()
    assert not sock.exists(), "act-serve left its Unix socket file behind"


def _fds(pid) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _quiet_fds(pid) -> int:
    """The descriptor count once connections closed by earlier tests are gone on the server side."""
    last = -1
    while True:
        n = _fds(pid)
        if n == last:
            return n
        last = n
        time.sleep(0.2)


def _memfd_maps(pid) -> int:
    return sum("memfd:" in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines())


def _settle(pred, timeout=120.0):
    """pred() once it holds; a loaded machine may take long to finish a vanished client's queue."""
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.02)
    return pred()


def _raw_unix(srv) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(60)
    s.connect(srv.sock)
    s.sendall(wire.hello(client_name="shm-test"))
    assert recv_frame(s)[0] == wire.INFO
    return s


def _memfd(size, seal=True, fill=None) -> int:
    fd = os.memfd_create("shm-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if fill is not None:
        os.pwrite(fd, fill, 0)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def _attach(s, fd, size):
    socket.send_fds(s, [wire.shm_attach(size)], [fd] if fd is not None else [])
    return recv_frame(s)


def _expect_error(reply, name):
    mtype, p = reply
    assert mtype == wire.ERROR, f"expected ERROR {name}, got type {mtype}"
    _, code, msg = wire.parse_error(p)
    assert wire.ERROR_NAMES[code] == name, msg
    return msg


def _frames_bytes(imgs) -> bytes:
    return b"".join(imgs[c].tobytes() for c in CAMS)


def _shm_predict(rid, q, offsets, nbytes=8):
    frames = [(c, wire.ENC_SHM, IMAGE, IMAGE, struct.pack("<Q", o)[:nbytes]) for c, o in zip(CAMS, offsets)]
    return wire.predict(rid, q, frames)


def _result(reply):
    mtype, p = reply
    assert mtype == wire.RESULT, wire.parse_error(p) if mtype == wire.ERROR else mtype
    return wire.parse_result(p)["chunk"]


def _predict_together(clients, obs):
    """Client i predicts obs[i] = (images, qpos), all released at once so the server can batch
    them; returns the chunks and the batch each request ran in."""
    got, batches = [None] * len(clients), [0] * len(clients)
    barrier = threading.Barrier(len(clients))

    def work(i):
        barrier.wait()
        got[i] = clients[i].predict(obs[i][1], obs[i][0])
        batches[i] = clients[i].last_result["batch"]

    th = [threading.Thread(target=work, args=(i,)) for i in range(len(clients))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return got, batches


def test_same_chunk_every_transport(srv):
    shm = ActClient(unix_path=srv.sock, timeout=120)
    inline = ActClient(unix_path=srv.sock, shm=False, timeout=120)
    assert shm.info()["camera_names"] == CAMS
    assert (shm.transport, inline.transport) == ("unix+shm", "unix") and shm.shm_error is None
    np.testing.assert_array_equal(shm.predict(srv.q, srv.imgs), srv.want)
    np.testing.assert_array_equal(inline.predict(srv.q, srv.imgs), srv.want)
    # rendering straight into the shared frames: the same chunk, and the caller's arrays are those
    bufs = shm.frame_buffers()
    for c in CAMS:
        bufs[c][...] = srv.imgs[c]
    np.testing.assert_array_equal(shm.predict(srv.q, bufs), srv.want)
    # a second observation through the same shared memory is not served stale pixels
    other = {c: np.ascontiguousarray(srv.imgs[c][::-1]) for c in CAMS}
    want2 = ActClient("127.0.0.1", srv.port, timeout=120).predict(srv.q, other)
    np.testing.assert_array_equal(shm.predict(srv.q, other), want2)
    assert not np.array_equal(want2, srv.want)
    shm.close()
    inline.close()


def test_frames_rendered_into_other_cameras_slots_are_read_as_given(srv):
    """A caller rendering into frame_buffers() in its env's camera order (front, l_vis, r_vis)
    while the slots are in the model's (l_vis, r_vis, front) hands predict() arrays that lie in
    other cameras' slots: copying the cameras into their own slots one after another used to
    overwrite such an image before it was copied (the server read l_vis's pixels as 'front')."""
    shm = ActClient(unix_path=srv.sock, timeout=120)
    slots = list(shm.frame_buffers().values())
    env_order = ["front", "l_vis", "r_vis"]
    imgs = {}
    for cam, buf in zip(env_order, slots):
        buf[...] = srv.imgs[cam]
        imgs[cam] = buf
    assert shm.transport == "unix+shm"
    np.testing.assert_array_equal(shm.predict(srv.q, imgs), srv.want)
    # a camera's own slot seen through a flipped view (BGR <-> RGB in place) stays a plain copy
    bufs = shm.frame_buffers()
    for c in CAMS:
        bufs[c][...] = srv.imgs[c][:, :, ::-1]
    flipped = {c: bufs[c][:, :, ::-1] for c in CAMS}
    np.testing.assert_array_equal(shm.predict(srv.q, flipped), srv.want)
    shm.close()


def _observations(rng, n=4):
    return [({c: rng.integers(0, 256, (IMAGE, IMAGE, 3), dtype=np.uint8) for c in CAMS},
             rng.standard_normal(5).astype(np.float32)) for _ in range(n)]


def _copied_reference(srv, obs):
    """Each observation alone through a zstd client: its frames are inflated into the request and
    copied into the input buffers, so nothing of the reference is read in place."""
    return [ActClient("127.0.0.1", srv.port, timeout=120, compress=True).predict(q, im) for im, q in obs]


def _check_batched(clients, obs, want):
    """want: each observation alone. A batch's GEMMs round in another order than one sample's
    (serve_util.BATCH_TOL). The clients close even when a check fails, so a failure here leaves
    no mapping behind for the next test to find."""
    try:
        for c in clients:
            c.info()
        got, batches = _predict_together(clients, obs)
        for i in range(len(obs)):
            np.testing.assert_allclose(got[i], want[i], **BATCH_TOL)
        assert max(batches) > 1, f"the server never batched: {batches}"
    finally:
        for c in clients:
            c.close()


def test_batched_with_tcp_clients(srv):
    """Shared-memory and TCP requests in one forward pass answer as they do alone."""
    obs = _observations(np.random.default_rng(3))
    _check_batched([ActClient(unix_path=srv.sock, timeout=120) if i % 2 == 0 else
                    ActClient("127.0.0.1", srv.port, timeout=120) for i in range(4)], obs, _copied_reference(srv, obs))


def test_batched_shared_memory_read_in_place(srv):
    """A batch of shared-memory requests only: the step reads every frame in its client's memfd
    (registered with the session), with no copy into the input buffers, and answers as each
    request does alone with copied frames. Clients that leave retire their mappings; later ones
    are served."""
    rng = np.random.default_rng(5)
    for _ in range(2):
        obs = _observations(rng)
        clients = [ActClient(unix_path=srv.sock, timeout=120) for _ in range(4)]
        for c in clients:
            c.info()
            assert c.transport == "unix+shm", c.shm_error
        _check_batched(clients, obs, _copied_reference(srv, obs))


def test_tcp_frames_read_in_place(srv):
    """Raw TCP frames stay in the receive buffer they arrived in, which the server registers with
    the session: alone and batched, the chunk is the one of the same frames copied."""
    obs = _observations(np.random.default_rng(11))
    ref = _copied_reference(srv, obs)
    for (im, q), want in zip(obs, ref):
        np.testing.assert_allclose(ActClient("127.0.0.1", srv.port, timeout=120).predict(q, im), want,
                                   rtol=1e-5, atol=1e-6)
    _check_batched([ActClient("127.0.0.1", srv.port, timeout=120) for _ in range(4)], obs, ref)


def test_large_shared_memory_is_copied_not_locked(act_serve, srv, tmp_path):
    """Registering a memfd locks its pages in RAM (faulting in a sparse one): an area over 64 MiB
    is not registered, so its frames are copied as over TCP - same chunk, and the log says why."""
    s2 = Server(act_serve, srv.model, tmp_path, "--unix", tmp_path / "v.sock", "--verbose", 1).wait_ready()
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60)
        s.connect(str(tmp_path / "v.sock"))
        s.sendall(wire.hello(client_name="big-shm"))
        assert recv_frame(s)[0] == wire.INFO
        size = (64 << 20) + 4096
        fd = _memfd(size, fill=_frames_bytes(srv.imgs))
        assert _attach(s, fd, size)[0] == wire.SHM_OK
        os.close(fd)
        s.sendall(_shm_predict(1, srv.q, [0, FRAME, 2 * FRAME]))
        np.testing.assert_array_equal(_result(recv_frame(s)), srv.want)
        s.close()
        assert "cannot be read in place (over the 64 MiB per block" in s2.log(), s2.log()
        c = ActClient(unix_path=str(tmp_path / "v.sock"), timeout=60)   # a small area still is
        np.testing.assert_array_equal(c.predict(srv.q, srv.imgs), srv.want)
        c.close()
        assert s2.log().count("cannot be read in place") == 1, s2.log()
    finally:
        assert s2.stop() == 0, s2.log()


def test_refusals_keep_the_connection(srv):
    pid = srv.proc.pid
    fds0 = _quiet_fds(pid)
    s = _raw_unix(srv)
    q = srv.q
    # frames in shared memory before any is attached
    s.sendall(_shm_predict(1, q, [0, FRAME, 2 * FRAME]))
    assert "none attached" in _expect_error(recv_frame(s), "bad_shm")
    # SHM_ATTACH without a descriptor, with an unsealed memfd, with a size beyond the file, size 0
    assert "no file descriptor" in _expect_error(_attach(s, None, 3 * FRAME), "bad_shm")
    fd = _memfd(3 * FRAME, seal=False)
    assert "not sealed" in _expect_error(_attach(s, fd, 3 * FRAME), "bad_shm")
    os.close(fd)
    fd = _memfd(3 * FRAME)
    assert "holds" in _expect_error(_attach(s, fd, 3 * FRAME + 1), "bad_shm")
    _expect_error(_attach(s, fd, 0), "bad_shm")
    # a pipe is not a file
    r, w = os.pipe()
    assert "not a memfd" in _expect_error(_attach(s, r, 16), "bad_shm")
    os.close(r)
    os.close(w)
    # a proper attachment, then offsets outside it and a malformed offset field
    os.pwrite(fd, _frames_bytes(srv.imgs), 0)
    mtype, p = _attach(s, fd, 3 * FRAME)
    assert mtype == wire.SHM_OK and wire.parse_shm_ok(p) == 3 * FRAME
    s.sendall(_shm_predict(2, q, [0, FRAME, 2 * FRAME + 1]))
    assert "outside" in _expect_error(recv_frame(s), "bad_shm")
    s.sendall(_shm_predict(3, q, [0, FRAME, 2**64 - 1]))
    _expect_error(recv_frame(s), "bad_shm")
    s.sendall(_shm_predict(4, q, [0, FRAME, 2 * FRAME], nbytes=4))
    _expect_error(recv_frame(s), "bad_frame")
    # after all that the same connection is served, from its shared memory
    s.sendall(_shm_predict(5, q, [0, FRAME, 2 * FRAME]))
    np.testing.assert_array_equal(_result(recv_frame(s)), srv.want)
    # the client's later writes are what the server reads (no copy taken at attach)
    other = {c: np.ascontiguousarray(srv.imgs[c][:, ::-1]) for c in CAMS}
    os.pwrite(fd, _frames_bytes(other), 0)
    s.sendall(_shm_predict(6, q, [0, FRAME, 2 * FRAME]))
    np.testing.assert_array_equal(_result(recv_frame(s)), ActClient("127.0.0.1", srv.port, timeout=60).predict(q, other))
    os.close(fd)
    s.close()
    assert _settle(lambda: _fds(pid) == fds0), f"descriptors leaked: {fds0} -> {_fds(pid)}"
    assert _settle(lambda: _memfd_maps(pid) == 0), "a mapping outlived its connection"
    # every refusal above is counted under its own code, not lost
    assert srv.metric('act_serve_errors_total{code="bad_shm"}') >= 8, srv.http("/metrics")[1]


def test_over_tcp_is_refused(srv):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    s.sendall(wire.hello(client_name="shm-over-tcp"))
    assert recv_frame(s)[0] == wire.INFO
    s.sendall(wire.shm_attach(3 * FRAME))
    assert "TCP" in _expect_error(recv_frame(s), "bad_shm")
    s.sendall(_shm_predict(1, srv.q, [0, FRAME, 2 * FRAME]))
    _expect_error(recv_frame(s), "bad_shm")
    s.sendall(wire.ping(5))
    assert recv_frame(s)[0] == wire.PONG
    s.close()


def test_attach_before_hello_closes(srv):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(srv.sock)
    fd = _memfd(3 * FRAME)
    _expect_error(_attach(s, fd, 3 * FRAME), "no_hello")
    os.close(fd)
    assert s.recv(1) == b""   # closed after the reply
    s.close()


def test_stray_descriptors_are_closed(srv):
    """Descriptors sent with other frames, or several at once, are not kept."""
    pid = srv.proc.pid
    fds0 = _quiet_fds(pid)
    s = _raw_unix(srv)
    r, w = os.pipe()
    for i in range(20):   # more than the server's control buffer takes: the kernel drops the rest
        socket.send_fds(s, [wire.ping(i)], [r, w, r] if i % 2 else [r, w] * 8)
        assert recv_frame(s)[0] == wire.PONG
    fd = _memfd(3 * FRAME, fill=_frames_bytes(srv.imgs))
    socket.send_fds(s, [wire.shm_attach(3 * FRAME)], [fd, r, w])   # the first is the area
    assert recv_frame(s)[0] == wire.SHM_OK
    s.sendall(_shm_predict(1, srv.q, [0, FRAME, 2 * FRAME]))
    np.testing.assert_array_equal(_result(recv_frame(s)), srv.want)
    for x in (r, w, fd):
        os.close(x)
    s.close()
    assert _settle(lambda: _fds(pid) == fds0), f"descriptors leaked: {fds0} -> {_fds(pid)}"


def test_client_vanishes_with_requests_in_flight(srv):
    """The mapping outlives the connection while its requests run, then goes."""
    pid = srv.proc.pid
    for _ in range(3):
        s = _raw_unix(srv)
        fd = _memfd(3 * FRAME, fill=_frames_bytes(srv.imgs))
        assert _attach(s, fd, 3 * FRAME)[0] == wire.SHM_OK
        os.close(fd)
        s.sendall(b"".join(_shm_predict(i, srv.q, [0, FRAME, 2 * FRAME]) for i in range(8)))
        s.close()
    assert _settle(lambda: _memfd_maps(pid) == 0), "a mapping outlived its requests"
    c = ActClient(unix_path=srv.sock, timeout=120)
    np.testing.assert_array_equal(c.predict(srv.q, srv.imgs), srv.want)
    c.close()


def test_socket_path_rules(act_serve, srv, tmp_path):
    """A live server's socket is not taken over, a non-socket is not removed, a stale socket
    file is replaced."""
    def start(path):
        return subprocess.run([str(act_serve), "--model", str(srv.model), "--device", "cpu", "--port", "0",
                               "--unix", str(path)], capture_output=True, text=True, timeout=120)

    p = start(srv.sock)
    assert p.returncode != 0 and "another server is listening" in p.stderr, p.stderr
    plain = tmp_path / "not-a-socket"
    plain.write_text("keep me")
    p = start(plain)
    assert p.returncode != 0 and "not a socket" in p.stderr and plain.read_text() == "keep me", p.stderr
    stale = tmp_path / "stale.sock"
    old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old.bind(str(stale))
    old.close()   # the file stays, nobody listens
    s = Server(act_serve, srv.model, tmp_path, "--unix", stale).wait_ready()
    c = ActClient(unix_path=str(stale), timeout=120)
    np.testing.assert_array_equal(c.predict(srv.q, srv.imgs), srv.want)
    c.close()
    assert s.stop() == 0 and not stale.exists()


def test_client_reattaches_after_restart(act_serve, srv, tmp_path):
    path = tmp_path / "restart.sock"
    s = Server(act_serve, srv.model, tmp_path, "--unix", path).wait_ready()
    c = ActClient(unix_path=str(path), timeout=120)
    np.testing.assert_array_equal(c.predict(srv.q, srv.imgs), srv.want)
    assert s.stop() == 0
    s = Server(act_serve, srv.model, tmp_path, "--unix", path).wait_ready()
    np.testing.assert_array_equal(c.predict(srv.q, srv.imgs), srv.want)
    assert c.reconnects >= 1 and c.transport == "unix+shm"
    c.close()
    assert s.stop() == 0


def test_a_forked_child_gets_frame_memory_of_its_own(srv):
    """After fork() the child's frames must not land in its parent's shared memory (the server
    would read the parent's frames for the child, or the other way round): the child attaches a
    memfd of its own on its own connection, and both get the right chunk."""
    c = ActClient(unix_path=srv.sock, timeout=120)
    np.testing.assert_array_equal(c.predict(srv.q, srv.imgs), srv.want)
    assert c.transport == "unix+shm"
    parent_fd = c._shm_fd
    parent_bufs = c.frame_buffers()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            # the parent's arrays are refused: forked siblings writing there overwrite each
            # other's frames (and the parent's) between the write and the request
            try:
                c.predict(srv.q, parent_bufs)
                refused = False
            except ActError as e:
                refused = "before fork()" in str(e)
            cam = next(iter(parent_bufs))
            try:   # a view into them is refused too; a copy of them is the caller's own memory
                c.predict(srv.q, dict(srv.imgs, **{cam: parent_bufs[cam][:, ::-1][:, ::-1]}))
                refused = False
            except ActError:
                pass
            c.predict(srv.q, dict(srv.imgs, **{cam: parent_bufs[cam].copy()}))
            copy_ok = True
            bufs = c.frame_buffers()
            for cam, img in srv.imgs.items():
                bufs[cam][...] = img
            ok = np.array_equal(c.predict(srv.q, bufs), srv.want)
            mine = not np.shares_memory(bufs[next(iter(bufs))], parent_bufs[next(iter(parent_bufs))])
            code = 0 if ok and mine and refused and copy_ok and c.transport == "unix+shm" else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    assert c._shm_fd == parent_fd
    np.testing.assert_array_equal(c.predict(srv.q, srv.imgs), srv.want)
    c.close()


def test_a_forked_child_s_own_frame_buffers_are_never_refused(srv):
    """A parent that never took frame_buffers(): its mapping is gone in the child, whose own new
    mapping may land at the same addresses; the child's frame_buffers() must then be accepted
    (a check by address alone refused them)."""
    c = ActClient(unix_path=srv.sock, timeout=120)
    assert c.info() and c.transport == "unix+shm"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            bufs = c.frame_buffers()
            for cam, img in srv.imgs.items():
                bufs[cam][...] = img
            code = 0 if np.array_equal(c.predict(srv.q, bufs), srv.want) else 2
        except ActError:
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status} (3: refused)"
    c.close()


def test_clients_dropped_unclosed_leak_no_descriptor(srv):
    import gc

    gc.collect()   # sockets an earlier test left to the collector must not close mid-count
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        c = ActClient(unix_path=srv.sock, timeout=60)
        assert c.info() and c.transport == "unix+shm"
        del c
    gc.collect()
    c = ActClient(unix_path=srv.sock, timeout=60)
    c.frame_buffers()
    c.close()
    c.close()   # twice is harmless
    assert len(os.listdir("/proc/self/fd")) == before
