"""ActClient: one connection to act-serve (TCP, or a Unix socket on the same host), with
handshake, timeouts and reconnection.

A predict is a pure function of its inputs, so when the connection breaks (server restarted,
replica drained) the client reconnects and sends the same request again, until `timeout`
seconds have passed since the call began; then it raises ActTimeoutError. After the first
handshake the client declares the contract it got (cameras, dims, frame size) on every
reconnect, so a restarted server that now serves a different model contract is refused with
ActContractError instead of silently answering for the wrong robot. A reconnect that finds the
same contract but other weights (another model hash: a new checkpoint, other statistics) is
refused the same way, unless the client was made with allow_model_change=True.

On a Unix socket (act-serve --unix PATH) the client also attaches shared memory: a sealed memfd
holding one frame per camera, passed to the server once per connection. A PREDICT then carries
offsets instead of ~590 KB of pixels, and a caller that renders into frame_buffers() copies
nothing at all.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import select
import socket
import threading
import time
import weakref
from collections import deque
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import wire
from .shm import frame_memory

# a peer gone mid-send is EPIPE, an exception to reconnect on, never a SIGPIPE that kills a
# process (an embedding host or CLI wrapper) which left the signal at its default
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)


def _readable(sock: socket.socket, timeout: float) -> bool:
    """Whether sock has something to read (bytes or its end) within timeout seconds. poll()
    where there is one: select() refuses descriptors from 1024 on, which a worker process with
    many files, sockets or shared buffers open reaches."""
    if hasattr(select, "poll"):
        p = select.poll()
        p.register(sock, select.POLLIN)
        return bool(p.poll(math.ceil(max(0.0, timeout) * 1000)))
    return bool(select.select([sock], [], [], max(0.0, timeout))[0])


# clients alive in this process: a fork()ed child (multiprocessing's default start method on
# Linux, as rollout workers are often made) lets go of their parent's connections, see
# ActClient._forget_after_fork
_LIVE: "weakref.WeakSet[ActClient]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for c in list(_LIVE):
        c._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _qpos_rows(qpos, obs_dim: int) -> np.ndarray:
    """predict_many's qpos as float32 (N, obs_dim), or ValueError naming what is wrong (a finite
    value beyond float32 included, as predict() does; NaN and Inf are the server's to refuse)."""
    try:
        q64 = np.asarray(qpos, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"qpos: expected an (N, obs_dim={obs_dim}) array of numbers, one row per env: {e}") from None
    if q64.ndim != 2 or q64.shape[1] != obs_dim:
        raise ValueError(f"qpos: expected shape (N, {obs_dim}) (one row of obs_dim values per env), got {q64.shape}")
    return _float32_qpos(q64)


def _float32_qpos(q64: np.ndarray) -> np.ndarray:
    """q64 as float32, or ValueError naming a finite value beyond float32's range (else the
    server would say "NaN or Inf" of a finite value; NaN and Inf are the server's to refuse)."""
    with np.errstate(over="ignore"):
        q = q64.astype(np.float32)
    big = np.argwhere(np.isfinite(q64) & ~np.isfinite(q))
    if big.size:
        at = tuple(big[0])
        raise ValueError(f"qpos[{', '.join(map(str, at))}] = {q64[at]:g} does not fit float32 (the wire's type)")
    return q


def _images_per_env(images, n: int, cams: List[str], hw: Tuple[int, int]) -> List[Dict[str, np.ndarray]]:
    """predict_many's images as one {camera: (H, W, 3)} dict per env, checked: either
    {camera: uint8 (N, H, W, 3)} or a list of N dicts {camera: uint8 (H, W, 3)}."""
    if isinstance(images, Mapping):
        missing = [c for c in cams if c not in images]
        extra = [c for c in images if c not in cams]
        if missing or extra:
            raise ValueError(f"images: model cameras are {cams}; missing {missing}, unexpected {extra}")
        stacked = {}
        for c in cams:
            a = np.asarray(images[c])
            if a.dtype != np.uint8 or a.shape != (n, hw[0], hw[1], 3):
                raise ValueError(f"images['{c}']: expected uint8 {(n, hw[0], hw[1], 3)} (N, H, W, 3: one frame "
                                 f"per env, N = qpos rows), got {a.dtype} {a.shape}")
            stacked[c] = a
        return [{c: stacked[c][i] for c in cams} for i in range(n)]
    if isinstance(images, (str, bytes, np.ndarray)) or not isinstance(images, Sequence):
        raise TypeError(f"images: expected a dict {{camera name: uint8 (N, H, W, 3) array}} or a list of N "
                        f"dicts {{camera name: uint8 (H, W, 3)}}, got {type(images).__name__}")
    if len(images) != n:
        raise ValueError(f"images: a list of {len(images)} per-env dicts, but qpos has {n} rows")
    out = []
    for i, d in enumerate(images):
        try:
            out.append(dict(wire._checked(d, cams, hw)))
        except (TypeError, ValueError) as e:
            raise type(e)(f"images[{i}] (env {i}): {e}") from None
    return out


class ActError(Exception):
    """Base class of every act_client error."""


class ActServerError(ActError):
    """The server answered ERROR: .code (int), .name (e.g. 'bad_qpos'), .message, .request_id;
    .index: which env's request it answered, for predict_many() (else None)."""

    def __init__(self, code: int, message: str, request_id: int = 0, index: Optional[int] = None):
        self.code, self.message, self.request_id, self.index = code, message, request_id, index
        self.name = wire.ERROR_NAMES.get(code, f"code_{code}")
        super().__init__(f"act-serve error {self.name} ({code}): {message}")

    def __reduce__(self):
        # picklable as made: a worker process's error reaches its multiprocessing parent whole
        # (the default would call __init__ with the formatted text alone, which fails there and
        # takes down the pool's result thread)
        return type(self), (self.code, self.message, self.request_id, self.index)


class ActContractError(ActServerError):
    """The server refused the declared contract (cameras, dims, frame size)."""


class ActTimeoutError(ActError, TimeoutError):
    """No answer within the client's timeout (server down, overloaded or unreachable)."""


class _Overloaded(Exception):
    """The server's queue (--max-queue) was full for this request: sent again after a pause."""


class ActClient:
    """ActClient(host, port, timeout=10.0) -> .info(), .predict(qpos, images), .predict_many(qpos_n,
    images_n) (N envs at once, pipelined), .ping().

    camera_names / obs_dim / action_dim / image_hw: the contract this client expects; a server
    with another contract is refused at the handshake (camera names: at most 8, each printable
    ASCII of at most 31 bytes, as a model's). compress=True sends zstd frames (needs
    the optional `zstandard` package and a server built with zstd).
    unix_path: connect to act-serve's Unix socket instead of host:port (same machine only);
    there, shm=True (the default) passes frames in shared memory. .transport says which is in
    use ("tcp", "unix" or "unix+shm"); .shm_error why shared memory was refused, if it was.
    allow_model_change: accept a reconnect to a server whose model hash differs from the first
    one's (a rolling deploy); by default that raises ActContractError, so one client never mixes
    two checkpoints. model_hash: the model (16 hex digits: info()["model_hash"], act-infer info)
    every connection must serve, the first one included: give every worker of one evaluation the
    hash its parent read, and no worker can start on another checkpoint than the others.
    timeout: seconds per call, in (0, 1e7]. client_name: printable ASCII, at most 255 bytes
    (logs, audit log).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 7070, timeout: float = 10.0,
                 camera_names: Optional[Sequence[str]] = None, obs_dim: int = 0, action_dim: int = 0,
                 image_hw: Sequence[int] = (0, 0), compress: bool = False, client_name: str = "act_client",
                 unix_path: Optional[str] = None, shm: bool = True, allow_model_change: bool = False,
                 model_hash: Optional[str] = None):
        wire.check_name(client_name, "client_name")
        if isinstance(camera_names, (str, bytes)):
            raise TypeError(f"camera_names: expected a list of camera names, got the string {camera_names!r} "
                            f"(split it: {str(camera_names).split(',')!r})")
        if len(camera_names or []) > wire.MAX_CAMS:
            raise ValueError(f"camera_names: {len(camera_names)} cameras, a model has at most {wire.MAX_CAMS}")
        for c in camera_names or []:
            wire.check_name(c, "camera name", wire.CAMERA_NAME_MAX)
        timeout = float(timeout)
        if not 0 < timeout <= 1e7:   # socket timeouts and deadlines need a finite, positive time
            raise ValueError(f"timeout must be seconds in (0, 1e7], got {timeout:g}")
        if model_hash is not None:
            model_hash = str(model_hash).lower()
            if len(model_hash) != 16 or any(ch not in "0123456789abcdef" for ch in model_hash):
                raise ValueError(f"model_hash must be 16 hex digits (info()['model_hash'], act-infer info), "
                                 f"got {model_hash!r}")
            if allow_model_change:
                raise ValueError("model_hash pins one model; allow_model_change=True accepts any: pass one of them")
        self.model_hash = model_hash
        self.host, self.port, self.timeout = host, int(port), timeout
        self.allow_model_change = bool(allow_model_change)
        self.unix_path = unix_path
        self._where = f"unix:{unix_path}" if unix_path else f"{host}:{self.port}"
        self._want_shm = bool(unix_path) and shm and not compress and hasattr(os, "memfd_create")
        self._shm_fd, self._shm_map, self._shm_slots, self._shm_closer = -1, None, {}, None
        self._shm_live = False   # attached on the current connection
        self.shm_error: Optional[str] = None
        if unix_path and shm and not self._want_shm:
            self.shm_error = "compress=True sends zstd frames inline" if compress else "no memfd_create on this OS"
        self.client_name = client_name
        self._declared = {"camera_names": list(camera_names or []), "obs_dim": int(obs_dim),
                          "action_dim": int(action_dim), "image_hw": tuple(int(v) for v in image_hw)}
        self._sock: Optional[socket.socket] = None
        self._rbuf, self._rpos, self._rend = bytearray(65536), 0, 0   # received, not yet parsed
        self._info: Optional[Dict] = None
        self._ids = itertools.count(1)
        self._compressor = None
        if compress:
            try:
                import zstandard
            except ImportError as e:
                raise ActError("compress=True needs the 'zstandard' package (pip install zstandard)") from e
            self._compressor = zstandard.ZstdCompressor(level=1, write_checksum=True)
        self.last_result: Dict = {}
        self.reconnects = 0          # connections made after an earlier one broke (not attempts)
        self.connect_failures = 0    # attempts to (re)connect that failed and were retried
        self.overloaded_retries = 0  # requests sent again because the server's queue was full
        self._was_connected = False
        # one call at a time: threads sharing a client would read each other's replies and, with
        # shared memory, overwrite each other's frames before the server read them
        self._lock = threading.RLock()
        # byte ranges of frame_buffers() arrays still held after a fork(): the parent's shared
        # memory, which predict() refuses to read from here (see _forget_after_fork), with the
        # mapping they lie in (kept, so that no new mapping can take those addresses)
        self._stale_frames: List[Tuple[int, int]] = []
        self._stale_maps: list = []
        _LIVE.add(self)

    def _forget_after_fork(self) -> None:
        """In a child made by fork(): the connection and the shared frames copied from the parent
        stay the parent's (two processes on one stream would read each other's replies, and the
        child's frames would land in the parent's memory). The child drops its copies - closing a
        copied descriptor leaves the parent's open - and connects anew at its first call, with
        frame memory of its own; the contract and model hash it insists on are kept. Arrays got
        from frame_buffers() before the fork are the parent's: call it again in the child.
        predict() refuses them (ActError): every forked worker writing there would overwrite the
        others' frames between its write and its request, and get chunks for their images."""
        self._lock = threading.RLock()   # another thread of the parent may have held it
        ranges = [wire.byte_range(v) for v, _ in self._shm_slots.values()]
        old_map = self._shm_map
        self.close()   # the child's copies only: the parent's descriptors and mapping stay open
        if old_map is not None and not old_map.closed:
            # unmapping failed: the caller holds arrays of it (frame_buffers()), which stay the
            # parent's memory; once unmapped, nothing can point there and nothing is refused
            self._stale_frames += ranges
            self._stale_maps.append(old_map)
        self.reconnects = self.connect_failures = 0
        self._was_connected = False

    # ---- connection ----
    def _close(self) -> None:
        self._rpos = self._rend = 0   # what a dead connection left unread belongs to no reply
        self._shm_live = False
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def _drop_if_closed(self) -> None:
        """Between calls: a connection the server has ended (act-serve --max-connection-age
        closes an idle one so that a balancer can place the client again; a replica stopped)
        is let go before the next request is sent on it, so that request goes once, on a new
        connection, rather than into a closed stream to be sent again after the failure."""
        if self._sock is None or self._rend > self._rpos or not _readable(self._sock, 0):
            return
        try:   # readable: this returns at once
            ended = self._sock.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, socket.timeout):
            ended = False
        except OSError:   # reset
            ended = True
        if ended:
            self._close()

    def close(self) -> None:
        with self._lock:
            self._close()
            self._shm_slots = {}
            if self._shm_map is not None:
                try:
                    self._shm_map.close()
                except BufferError:
                    pass   # the caller still holds frame_buffers() arrays: the mapping goes with them
                self._shm_map = None
            if self._shm_closer is not None:
                self._shm_closer()
                self._shm_closer, self._shm_fd = None, -1

    @property
    def transport(self) -> str:
        if not self.unix_path:
            return "tcp"
        return "unix+shm" if self._shm_live else "unix"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _recv_exact(self, n: int) -> bytes:
        # buffered: one recv_into usually brings a whole reply (header and payload), so a
        # RESULT costs one system call instead of two, and nothing is appended piecewise
        while self._rend - self._rpos < n:
            if self._rpos:
                left = self._rend - self._rpos
                self._rbuf[:left] = self._rbuf[self._rpos:self._rend]
                self._rpos, self._rend = 0, left
            if len(self._rbuf) < n:
                self._rbuf.extend(bytes(n - len(self._rbuf)))
            got = self._sock.recv_into(memoryview(self._rbuf)[self._rend:])
            if not got:
                raise ConnectionError("server closed the connection")
            self._rend += got
        out = bytes(self._rbuf[self._rpos:self._rpos + n])
        self._rpos += n
        return out

    def _send_parts(self, parts, deadline: float) -> None:
        """sendall of a list of buffers with scatter-gather: the frames are sent from the
        caller's arrays rather than joined into one fresh ~590 KB bytes first."""
        views = [memoryview(b).cast("B") for b in parts]
        while views:
            self._set_deadline(deadline)   # the whole send, not each partial one, has the timeout
            sent = self._sock.sendmsg(views, [], _NOSIGNAL)
            while views and sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            if sent:
                views[0] = views[0][sent:]

    def _recv_frame(self):
        magic, version, mtype, length = wire.HDR.unpack(self._recv_exact(wire.HDR.size))
        if magic != wire.MAGIC or version != wire.VERSION:
            raise ActError(f"{self._where} does not speak act-serve protocol v{wire.VERSION} "
                           f"(magic {magic!r}, version {version})")
        return mtype, self._recv_exact(length)

    def _set_deadline(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        self._sock.settimeout(left)

    def _connect(self, deadline: float) -> None:
        d = self._declared
        if self.unix_path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(max(1e-3, deadline - time.monotonic()))
            try:
                sock.connect(self.unix_path)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((self.host, self.port), timeout=max(1e-3, deadline - time.monotonic()))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        try:
            self._set_deadline(deadline)
            self._send_parts([wire.hello(d["obs_dim"], d["action_dim"], d["image_hw"], d["camera_names"],
                                         self.client_name)], deadline)
            mtype, p = self._recv_frame()
        except BaseException:
            self._close()
            raise
        if mtype == wire.ERROR:
            self._close()
            rid, code, msg = wire.parse_error(p)
            if code in (wire.E_SHUTTING_DOWN, wire.E_OVERLOADED):
                raise ConnectionError(msg)   # draining or full: retry until the timeout
            raise (ActContractError if code == wire.E_CONTRACT else ActServerError)(code, msg, rid)
        if mtype != wire.INFO:
            self._close()
            raise ActError(f"handshake: expected INFO, got message type {mtype}")
        info = wire.parse_info(p)
        if self._info is None and self.model_hash is not None and info["model_hash"] != self.model_hash:
            self._close()
            raise ActContractError(wire.E_CONTRACT, f"{self._where} serves model {info['model_hash']}, not "
                                      f"{self.model_hash} as this client was made to insist (model_hash=)")
        if self._info is not None and info["model_hash"] != self._info["model_hash"] and not self.allow_model_change:
            self._close()
            # the declared contract held (cameras, dims, frame size); say what else changed
            changed = [f"{k} {self._info[k]} -> {info[k]}" for k in ("pred_horizon", "num_action_steps", "obs_horizon")
                       if self._info.get(k) != info.get(k)]
            what = ("same cameras and dims, but " + ", ".join(changed)) if changed else \
                "same contract, other weights or statistics"
            raise ActContractError(wire.E_CONTRACT, f"{self._where} now serves model {info['model_hash']}, not "
                                      f"{self._info['model_hash']} as before the reconnect ({what}); make a new "
                                      f"client, or pass allow_model_change=True to accept it")
        if self._info is None:
            # from now on, insist on this contract: a restarted server must serve the same one
            self._declared = {"camera_names": info["camera_names"], "obs_dim": info["obs_dim"],
                              "action_dim": info["action_dim"],
                              "image_hw": (info["image_height"], info["image_width"])}
        self._info = info
        if self._want_shm:
            try:
                self._attach_shm(deadline)
            except BaseException:   # a connection left mid-attach would answer the next call wrongly
                self._close()
                raise

    def _attach_shm(self, deadline: float) -> None:
        """Creates the shared frames once (one per camera, model order), passes them to this
        connection's server. A refusal is not fatal: frames then travel inline."""
        info = self._info
        h, w, cams = info["image_height"], info["image_width"], info["camera_names"]
        if self._shm_fd < 0:
            self._shm_fd, self._shm_map, self._shm_slots = frame_memory(cams, h, w)
            self._shm_closer = weakref.finalize(self, os.close, self._shm_fd)   # a client dropped unclosed leaks no fd
        self._set_deadline(deadline)
        socket.send_fds(self._sock, [wire.shm_attach(len(self._shm_map))], [self._shm_fd], _NOSIGNAL)
        mtype, p = self._recv_frame()
        if mtype == wire.SHM_OK:
            self._shm_live = True
        elif mtype == wire.ERROR:
            self.shm_error = wire.parse_error(p)[2]
            self._want_shm = False
        else:
            raise ActError(f"SHM_ATTACH: expected SHM_OK, got message type {mtype}")

    def frame_buffers(self) -> Dict[str, np.ndarray]:
        """camera -> a writable uint8 (H, W, 3) array inside the shared memory (Unix socket with
        shm only; else {}). Render or copy the next observation there and pass these very arrays
        to predict(): nothing is copied on the way to the server. Do not write them while a
        predict() is running."""
        with self._lock:
            self.info()
            return {c: v for c, (v, _) in self._shm_slots.items()}

    def _call(self, make_frame, want: int, what: str, deadline: Optional[float] = None):
        """Sends a frame and waits for its reply, reconnecting on broken connections, all
        within one deadline (the caller's, so a public call never takes more than `timeout`)."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        last_err: Optional[BaseException] = None
        pause = 0.002   # after an `overloaded` answer, doubling to 50 ms
        while True:
            pending = False   # a frame (partly) sent whose reply is not read: the stream is mid-call
            try:
                if make_frame is not None:
                    self._drop_if_closed()
                if self._sock is None:
                    try:
                        self._connect(deadline)
                    except (ConnectionError, OSError):
                        self.connect_failures += 1
                        raise
                    if self._was_connected:
                        self.reconnects += 1
                    self._was_connected = True
                if make_frame is None:
                    return None
                rid, parts = make_frame()
                pending = True
                self._send_parts(parts, deadline)
                while True:
                    self._set_deadline(deadline)   # each frame, stale replies skipped included
                    mtype, p = self._recv_frame()
                    if mtype == wire.ERROR:
                        erid, code, msg = wire.parse_error(p)
                        if code == wire.E_SHUTTING_DOWN:
                            raise ConnectionError(msg)
                        if erid not in (0, rid):
                            continue   # a reply to an earlier, abandoned request
                        if erid == 0:
                            self._close()
                        pending = False
                        if code == wire.E_OVERLOADED and erid == rid:
                            raise _Overloaded(msg)
                        raise ActServerError(code, msg, erid)
                    if mtype == want and (want != wire.RESULT or int.from_bytes(p[:8], "little") == rid):
                        pending = False
                        return rid, p
            except _Overloaded as e:   # the connection is in order: the same request, a little later
                self.overloaded_retries += 1
                last_err = ActServerError(wire.E_OVERLOADED, str(e))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ActTimeoutError(f"act-serve {self._where}: {what} not served within {self.timeout:g} s: "
                                          f"the server stayed overloaded ({e})") from None
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.05)
            except socket.timeout:
                self._close()
                raise ActTimeoutError(f"act-serve {self._where}: no {what} reply within {self.timeout:g} s"
                                      + (f" (last error: {last_err})" if last_err else "")) from None
            except (ConnectionError, OSError) as e:
                self._close()
                last_err = e
                self._pause_or_give_up(e, deadline, what)
            except BaseException:
                # anything else mid-call (KeyboardInterrupt, a step-timeout alarm's exception,
                # MemoryError) may leave half a request on the socket or its reply unread: the
                # next call must not be appended to that, so it starts on a fresh connection
                if pending:
                    self._close()
                raise

    def _pause_or_give_up(self, e: BaseException, deadline: float, what: str) -> None:
        """After a broken connection: ActTimeoutError once the call's deadline has passed, else a
        short pause before the next attempt to connect."""
        if time.monotonic() >= deadline:
            raise ActTimeoutError(f"act-serve {self._where}: could not complete {what} within "
                                  f"{self.timeout:g} s: {e}") from e
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    # ---- API ----
    def info(self) -> Dict:
        """The model contract: obs_dim, action_dim, pred_horizon, num_action_steps, obs_horizon,
        camera_names, image_height, image_width, model_hash, max_batch, device, ..."""
        with self._lock:
            info = dict(self._info_by(time.monotonic() + self.timeout))
            info["camera_names"] = list(info["camera_names"])   # the caller's copy, not the contract
            return info

    def _info_by(self, deadline: float) -> Dict:
        if self._info is None or self._sock is None:
            self._call(None, wire.INFO, "HELLO", deadline)
        return self._info

    def predict(self, qpos, images: Mapping[str, np.ndarray], actions=None, is_pad=None,
                sample_latent: bool = False, seed: int = 0) -> np.ndarray:
        """qpos: (obs_dim,) floats; images: camera name -> uint8 (H, W, 3). Returns the
        denormalized chunk (pred_horizon, action_dim). With `actions` (pred_horizon,
        action_dim) the chunk is decoded from the CVAE posterior instead of the prior; the KL is
        in .last_result['kl']. Timing of the last call is in .last_result."""
        with self._lock:
            deadline = time.monotonic() + self.timeout   # one budget for handshake and reply
            info = self._info_by(deadline)
            q64 = np.asarray(qpos, dtype=np.float64).reshape(-1)
            if q64.size != info["obs_dim"]:
                raise ValueError(f"qpos has {q64.size} values, the model expects obs_dim {info['obs_dim']}")
            q = _float32_qpos(q64)
            hw = (info["image_height"], info["image_width"])
            if actions is not None:
                actions = np.asarray(actions, dtype=np.float32)
                if actions.shape != (info["pred_horizon"], info["action_dim"]):
                    raise ValueError(f"actions: expected {(info['pred_horizon'], info['action_dim'])}, got {actions.shape}")
                if is_pad is not None and np.asarray(is_pad).size != info["pred_horizon"]:
                    raise ValueError(f"is_pad: expected {info['pred_horizon']} flags (one per action row), "
                                     f"got {np.asarray(is_pad).size}")
            if not 0 <= int(seed) < 1 << 64:
                raise ValueError(f"seed must be in [0, 2**64), got {seed}")
            if self._stale_frames:
                self._refuse_stale_frames(images)

            def make():   # per attempt: a reconnect may have gained or lost the shared memory
                if self._shm_live:
                    frames = wire.shm_frames(images, info["camera_names"], hw, self._shm_slots)
                else:
                    frames = wire.encode_frames(images, info["camera_names"], hw, self._compressor)
                rid = next(self._ids)
                return rid, wire.predict_parts(rid, q, frames, actions, is_pad, sample_latent, seed)

            t0 = time.perf_counter()
            _, p = self._call(make, wire.RESULT, "PREDICT", deadline)
            res = wire.parse_result(p)
            res["round_trip_ms"] = (time.perf_counter() - t0) * 1e3
            chunk = res.pop("chunk")
            self.last_result = res
            return chunk

    def predict_many(self, qpos, images, window: int = 32) -> np.ndarray:
        """One observation per env of a vectorized environment (gym.vector style: N envs stepped
        together in this process). qpos: (N, obs_dim) floats; images: {camera: uint8 (N, H, W, 3)}
        or a list of N dicts {camera: uint8 (H, W, 3)}. Returns float32 (N, pred_horizon,
        action_dim), row i the chunk for env i: each the same chunk predict() would give for env
        i's observation alone (up to the CPU engine's batch rounding, BATCH_TOL in the tests).

        The N PREDICTs go pipelined on this one connection, at most `window` unanswered at a
        time (keep it <= the server's --max-inflight, 32 by default), so the server's batcher can
        run them in one or a few forward passes. Frames travel inline (raw, or zstd with
        compress=True) even on a unix+shm connection: its shared memory holds one frame per
        camera, not N in flight. One `timeout` covers the whole call. A connection that breaks
        mid-call is remade and only the requests not yet answered are sent again; an `overloaded`
        answer sends that request again after predict()'s pause (2 ms doubling to 50 ms); any
        other ERROR raises ActServerError with .index = the env's index (its message names it).
        .last_result: `batch`, `queue_ms`, `infer_ms` (lists, one per env, what the server
        reported for the request that was answered), `round_trip_ms` (the whole call),
        `resent` (requests sent again after a broken connection), `overloaded_retries` (this
        call's). No posterior (actions=) here: use predict() for that."""
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
            raise ValueError(f"window must be an int >= 1 (requests outstanding at a time), got {window!r}")
        window = int(window)
        with self._lock:
            deadline = time.monotonic() + self.timeout   # one budget for handshake and all replies
            info = self._info_by(deadline)
            cams, hw = info["camera_names"], (info["image_height"], info["image_width"])
            q = _qpos_rows(qpos, info["obs_dim"])
            n = q.shape[0]
            per_env = _images_per_env(images, n, cams, hw)
            if self._stale_frames:
                for i, imgs in enumerate(per_env):
                    try:
                        self._refuse_stale_frames(imgs)
                    except ActError as e:
                        raise ActError(f"env {i}: {e}") from None
            # encoded once: a resend sends the same bytes (raw frames are views of the caller's
            # arrays, unchanged while this call runs; zstd frames are compressed once)
            frames = [wire.encode_frames(imgs, cams, hw, self._compressor) for imgs in per_env]
            out = np.empty((n, info["pred_horizon"], info["action_dim"]), np.float32)
            res: List[Optional[Dict]] = [None] * n
            t0 = time.perf_counter()
            resent, overloaded = self._many(q, frames, out, res, window, deadline)
            self.last_result = {
                "batch": [r["batch"] for r in res], "queue_ms": [r["queue_ms"] for r in res],
                "infer_ms": [r["infer_ms"] for r in res], "round_trip_ms": (time.perf_counter() - t0) * 1e3,
                "resent": resent, "overloaded_retries": overloaded}
            return out

    def _many(self, q, frames, out, res, window: int, deadline: float) -> Tuple[int, int]:
        """predict_many's exchange: fills out[i] and res[i] for every env i, or raises. Returns
        (requests sent again after a broken connection, `overloaded` answers)."""
        n = len(frames)
        todo = deque(range(n))      # env indices to send now (first sends and resends), in order
        later: List[Tuple[float, int]] = []   # (when, env): `overloaded`, sent again after a pause
        pause = [0.002] * n         # per env, doubling to 50 ms as predict()'s
        inflight: Dict[int, int] = {}   # request id -> env, on the current connection
        done = resent = overloaded = 0
        last_err: Optional[BaseException] = None

        def take(mtype, p) -> None:
            nonlocal done, last_err, overloaded
            if mtype == wire.ERROR:
                erid, code, msg = wire.parse_error(p)
                if code == wire.E_SHUTTING_DOWN:
                    raise ConnectionError(msg)   # draining: every unanswered request goes elsewhere
                if erid == 0:
                    self._close()   # about the stream, not a request: it cannot be trusted
                    inflight.clear()
                    raise ActServerError(code, msg, erid)
                i = inflight.pop(erid, None)
                if i is None:
                    return   # a reply to an abandoned request (an earlier call's)
                if code == wire.E_OVERLOADED:
                    self.overloaded_retries += 1
                    overloaded += 1
                    last_err = ActServerError(code, msg, erid)
                    heapq.heappush(later, (time.monotonic() + pause[i], i))
                    pause[i] = min(pause[i] * 2, 0.05)
                    return
                # with other requests out, their replies would meet the next call: the ActError
                # handler below closes the connection then, so that the next call starts anew
                raise ActServerError(code, f"predict_many env index {i} (of {n}): {msg}", erid, index=i)
            if mtype == wire.RESULT:
                i = inflight.pop(int.from_bytes(p[:8], "little"), None)
                if i is None:
                    return
                r = wire.parse_result(p)
                out[i] = r.pop("chunk")
                res[i] = r
                done += 1
            # anything else (a late PONG of an abandoned ping) is skipped, as _call does

        def readable() -> bool:
            return self._rend > self._rpos or _readable(self._sock, 0)

        while done < n:
            try:
                if not inflight:
                    self._drop_if_closed()
                if self._sock is None:
                    self._call(None, wire.INFO, "PREDICT", deadline)   # connects, retrying within the deadline
                now = time.monotonic()
                while later and later[0][0] <= now:
                    todo.append(heapq.heappop(later)[1])
                while todo and len(inflight) < window:
                    i = todo.popleft()
                    rid = next(self._ids)
                    inflight[rid] = i   # before the send: half a frame sent is a request outstanding
                    # the next one goes at once: the server's batcher may wait for it (never set
                    # when this loop then waits for replies: the server would wait out its window)
                    more = bool(todo) and len(inflight) < window and self._info.get("more", False)
                    self._send_parts(wire.predict_parts(rid, q[i], frames[i], more=more), deadline)
                    while readable():   # replies read as they come: none piles up at the server
                        self._set_deadline(deadline)
                        take(*self._recv_frame())
                if done == n:
                    break
                if not inflight:   # only requests waiting out an `overloaded` pause
                    if not later:
                        continue
                    now = time.monotonic()
                    if now >= deadline:
                        raise socket.timeout()
                    time.sleep(max(0.0, min(later[0][0], deadline) - now))
                    continue
                if later and self._rend == self._rpos:
                    # wait for a reply, but no longer than the next resend is due
                    wait = min(later[0][0], deadline) - time.monotonic()
                    if wait > 0 and not _readable(self._sock, wait):
                        continue
                self._set_deadline(deadline)
                take(*self._recv_frame())
            except ActError:   # take()'s, or the (re)connection's own (ActTimeoutError is a TimeoutError)
                if inflight:   # replies still due on this stream: the next call must not read them
                    self._close()
                raise
            except socket.timeout:
                self._close()
                inflight.clear()
                why = (f"the server stayed overloaded ({last_err.message})"
                       if isinstance(last_err, ActServerError) else f"last error: {last_err}" if last_err else "")
                raise ActTimeoutError(f"act-serve {self._where}: {n - done} of {n} PREDICT replies not received "
                                      f"within {self.timeout:g} s" + (f" ({why})" if why else "")) from None
            except (ConnectionError, OSError) as e:
                self._close()
                last_err = e
                # a pure function: every request sent and not answered goes again, on a new connection
                resent += len(inflight)
                todo = deque(sorted(list(inflight.values()) + list(todo)))
                inflight.clear()
                self._pause_or_give_up(e, deadline, f"{n - done} of {n} PREDICTs")
            except BaseException:
                # as _call: a caller's exception (KeyboardInterrupt, an alarm) with requests out
                # leaves their replies (or half a frame) on the stream: the next call starts anew
                if inflight:
                    self._close()
                raise
        return resent, overloaded

    def _refuse_stale_frames(self, images) -> None:
        for cam, img in images.items() if isinstance(images, Mapping) else ():
            if not isinstance(img, np.ndarray) or img.size == 0:
                continue
            lo, hi = wire.byte_range(img)
            if any(lo < s_hi and s_lo < hi for s_lo, s_hi in self._stale_frames):
                raise ActError(
                    f"images['{cam}'] lies in the frame buffers this client's parent process got from "
                    f"frame_buffers() before fork(): that memory is shared by every forked worker, which "
                    f"overwrite each other's frames there. Call frame_buffers() again in this process and "
                    f"write the observation into those arrays (or pass arrays of your own)")

    def ping(self) -> float:
        """Round trip of a PING in seconds."""
        with self._lock:
            nonce = next(self._ids)
            t0 = time.perf_counter()
            self._call(lambda: (nonce, [wire.ping(nonce)]), wire.PONG, "PING")
            return time.perf_counter() - t0
