"""The act-serve wire format (docs/PROTOCOL.md), as bytes in and out. No sockets here.

Every frame: 12-byte header (magic b"ACTS", u16 version, u16 type, u32 payload length), then a
little-endian payload. This module mirrors engine/protocol.c field for field.
"""

from __future__ import annotations

import struct
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

MAGIC = b"ACTS"
VERSION = 1
HDR = struct.Struct("<4sHHI")

HELLO, INFO, PREDICT, RESULT, ERROR, PING, PONG = 1, 2, 3, 4, 5, 6, 7
SHM_ATTACH, SHM_OK = 8, 9   # Unix-socket connections only

ERROR_NAMES = {
    1: "bad_magic", 2: "bad_version", 3: "too_large", 4: "malformed", 5: "bad_type", 6: "no_hello",
    7: "contract", 8: "bad_qpos", 9: "bad_camera", 10: "bad_frame", 11: "bad_zstd", 12: "bad_actions",
    13: "overloaded", 14: "shutting_down", 15: "internal", 16: "bad_shm",
}
E_CONTRACT = 7
E_SHUTTING_DOWN = 14
E_OVERLOADED = 13

HAS_ACTIONS, SAMPLE_LATENT, MORE = 1, 2, 4   # PREDICT flags
MAX_CAMS, CAMERA_NAME_MAX = 8, 31           # what HELLO may declare (a model's own limits)
ENC_RAW, ENC_ZSTD, ENC_SHM = 0, 1, 2


def frame(msg_type: int, payload: bytes, version: int = VERSION, magic: bytes = MAGIC) -> bytes:
    return HDR.pack(magic, version, msg_type, len(payload)) + payload


def check_name(s: str, what: str = "name", most: int = 255) -> bytes:
    """A protocol name: printable ASCII, at most `most` bytes (255; a camera name in HELLO 31:
    PROTOCOL.md). ValueError otherwise."""
    if not isinstance(s, str):
        raise ValueError(f"{what} must be a str, got {type(s).__name__}")
    b = s.encode("ascii", "replace")
    if not s.isascii() or not all(0x20 <= c <= 0x7E for c in b):
        raise ValueError(f"{what} {s!r} is not printable ASCII")
    if len(b) > most:
        raise ValueError(f"{what} {s[:40]!r}{'...' if len(s) > 40 else ''} is {len(b)} bytes, longer than {most}")
    return b


def _name(s: str) -> bytes:
    b = check_name(s)
    return bytes([len(b)]) + b


def hello(obs_dim: int = 0, action_dim: int = 0, image_hw: Tuple[int, int] = (0, 0),
          camera_names: Sequence[str] = (), client_name: str = "act_client") -> bytes:
    p = struct.pack("<5I", obs_dim, action_dim, image_hw[0], image_hw[1], len(camera_names))
    p += b"".join(_name(c) for c in camera_names) + _name(client_name)
    return frame(HELLO, p)


def predict_parts(request_id: int, qpos: np.ndarray, frames: Sequence[Tuple[str, int, int, int, bytes]],
                  actions: Optional[np.ndarray] = None, is_pad: Optional[np.ndarray] = None,
                  sample_latent: bool = False, seed: int = 0, more: bool = False) -> List:
    """A PREDICT frame as a list of buffers (for socket.sendmsg): the frame data go in as they
    are, not copied, since a full-size request is ~590 KB of pixels and each copy costs.
    frames: (camera, encoding, height, width, data) in model camera order; data: any buffer.
    more: another PREDICT follows at once on this connection (a server whose INFO says `more`
    then waits for it before running a batch, up to its --max-wait-us)."""
    flags = (HAS_ACTIONS if actions is not None else 0) | (SAMPLE_LATENT if sample_latent else 0) | \
        (MORE if more else 0)
    q = np.ascontiguousarray(qpos, dtype="<f4").reshape(-1)
    parts = [b"", struct.pack("<QII", request_id, flags, q.size), q.tobytes(), struct.pack("<I", len(frames))]
    for cam, enc, h, w, data in frames:
        parts += [_name(cam) + struct.pack("<BIII", enc, h, w, _nbytes(data)), data]
    if actions is not None:
        a = np.ascontiguousarray(actions, dtype="<f4")
        pad = np.zeros(a.shape[0], np.uint8) if is_pad is None else np.asarray(is_pad, np.uint8).reshape(-1)
        parts += [struct.pack("<II", a.shape[0], a.shape[1]), a.tobytes(), pad.tobytes(), struct.pack("<Q", seed)]
    parts[0] = HDR.pack(MAGIC, VERSION, PREDICT, sum(_nbytes(b) for b in parts))
    return parts


def _nbytes(b) -> int:
    return b.nbytes if isinstance(b, memoryview) else len(b)


def predict(request_id: int, qpos: np.ndarray, frames: Sequence[Tuple[str, int, int, int, bytes]],
            actions: Optional[np.ndarray] = None, is_pad: Optional[np.ndarray] = None,
            sample_latent: bool = False, seed: int = 0, more: bool = False) -> bytes:
    """frames: (camera, encoding, height, width, data) in model camera order."""
    return b"".join(predict_parts(request_id, qpos, frames, actions, is_pad, sample_latent, seed, more))


def ping(nonce: int) -> bytes:
    return frame(PING, struct.pack("<Q", nonce))


def shm_attach(size: int) -> bytes:
    """SHM_ATTACH: the memfd itself travels beside these bytes (SCM_RIGHTS)."""
    return frame(SHM_ATTACH, struct.pack("<Q", size))


def parse_shm_ok(p: bytes) -> int:
    if len(p) != 8:
        raise ValueError(f"SHM_OK of {len(p)} bytes, expected 8")
    return struct.unpack("<Q", p)[0]


class _Reader:
    def __init__(self, b: bytes):
        self.b, self.o = b, 0

    def take(self, n: int) -> bytes:
        if self.o + n > len(self.b):
            raise ValueError("truncated payload")
        v = self.b[self.o:self.o + n]
        self.o += n
        return v

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def name(self) -> str:
        return self.take(self.take(1)[0]).decode("ascii")


def parse_info(p: bytes) -> Dict:
    r = _Reader(p)
    keys = ("obs_dim", "action_dim", "pred_horizon", "num_action_steps", "obs_horizon", "image_height",
            "image_width", "max_batch", "flags")
    info = {k: r.u32() for k in keys}
    info["camera_names"] = [r.name() for _ in range(r.u32())]
    info["model_hash"] = r.take(16).decode("ascii")
    info["server_version"] = r.name()
    info["device"] = r.name()
    flags = info.pop("flags")
    info["zstd"] = bool(flags & 1)
    info["more"] = bool(flags & 2)   # PREDICT's MORE flag understood (pipelined bursts batched whole)
    return info


def parse_result(p: bytes) -> Dict:
    rid, flags, batch, queue_us, infer_us, kl, h, a = struct.unpack_from("<QIIIIfII", p, 0)
    off = struct.calcsize("<QIIIIfII")
    if len(p) != off + 4 * h * a:
        raise ValueError(f"RESULT of {len(p)} bytes does not hold a [{h},{a}] chunk")
    chunk = np.frombuffer(p, dtype="<f4", count=h * a, offset=off).reshape(h, a).astype(np.float32)
    return {"request_id": rid, "posterior": bool(flags & 1), "batch": batch, "queue_ms": queue_us / 1e3,
            "infer_ms": infer_us / 1e3, "kl": kl, "chunk": chunk}


def parse_error(p: bytes) -> Tuple[int, int, str]:
    rid, code, n = struct.unpack_from("<QII", p, 0)
    return rid, code, p[16:16 + n].decode("utf-8", "replace")


def byte_range(a: np.ndarray) -> Tuple[int, int]:
    """[lo, hi) of the bytes array a spans in memory (numpy's byte_bounds, which moved in 2.0)"""
    ai = a.__array_interface__
    lo = hi = ai["data"][0]
    strides = ai["strides"] or tuple(int(a.itemsize * np.prod(a.shape[i + 1:])) for i in range(a.ndim))
    for n, st in zip(a.shape, strides):
        if st < 0:
            lo += st * (n - 1)
        else:
            hi += st * (n - 1)
    return lo, hi + a.itemsize


def _checked(images: Dict[str, np.ndarray], camera_names: List[str], hw: Tuple[int, int]):
    """(camera, uint8 HWC array) in model order, or ValueError naming what is wrong."""
    if not isinstance(images, Mapping):
        raise TypeError(f"images: expected a dict {{camera name: uint8 (H, W, 3) array}} with the "
                        f"model's cameras {camera_names}, got {type(images).__name__}")
    missing = [c for c in camera_names if c not in images]
    extra = [c for c in images if c not in camera_names]
    if missing or extra:
        raise ValueError(f"images: model cameras are {camera_names}; missing {missing}, unexpected {extra}")
    for cam in camera_names:
        img = np.asarray(images[cam])
        if img.dtype != np.uint8 or img.shape != (hw[0], hw[1], 3):
            raise ValueError(f"images['{cam}']: expected uint8 {(hw[0], hw[1], 3)} (HWC), got {img.dtype} {img.shape}")
        yield cam, img


def shm_frames(images: Dict[str, np.ndarray], camera_names: List[str], hw: Tuple[int, int],
               slots: Dict[str, Tuple[np.ndarray, int]]) -> List[Tuple[str, int, int, int, bytes]]:
    """Frames for a connection with shared memory attached. slots: camera -> (its array inside
    the shared memory, byte offset). Each image is copied there unless it already is that array
    (a caller that renders into ActClient.frame_buffers() pays no copy at all); an image lying in
    another camera's slot is copied aside first."""
    checked = list(_checked(images, camera_names, hw))
    ranges = {cam: byte_range(view) for cam, (view, _) in slots.items()}
    out = []
    for i, (cam, img) in enumerate(checked):
        # an image lying in another camera's slot (a caller rendering into frame_buffers() in
        # another camera order) would be overwritten by that camera's copy before the server
        # read it: such images are taken aside first, so the answer never depends on the order
        lo, hi = byte_range(img)
        if any(c != cam and lo < r_hi and r_lo < hi for c, (r_lo, r_hi) in ranges.items()):
            checked[i] = (cam, np.array(img))
    for cam, img in checked:
        view, off = slots[cam]
        if img is not view:
            np.copyto(view, img)
        out.append((cam, ENC_SHM, hw[0], hw[1], struct.pack("<Q", off)))
    return out


def encode_frames(images: Dict[str, np.ndarray], camera_names: List[str], hw: Tuple[int, int],
                  compressor=None) -> List[Tuple[str, int, int, int, memoryview]]:
    """Checks and orders the camera frames; compressor: a zstandard.ZstdCompressor or None.
    Raw frames are byte views of the caller's arrays (valid while those arrays are unchanged)."""
    out = []
    for cam, img in _checked(images, camera_names, hw):
        # a flat byte view of the pixels: no copy unless the array is not C-contiguous
        raw = memoryview(np.ascontiguousarray(img)).cast("B")
        if compressor is not None:
            out.append((cam, ENC_ZSTD, hw[0], hw[1], compressor.compress(raw)))
        else:
            out.append((cam, ENC_RAW, hw[0], hw[1], raw))
    return out
