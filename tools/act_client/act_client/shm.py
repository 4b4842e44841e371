"""The shared frame memory a client on act-serve's Unix socket attaches (docs/PROTOCOL.md,
SHM_ATTACH): one sealed memfd holding a uint8 (H, W, 3) frame per camera, in model order."""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import Dict, Sequence, Tuple

import numpy as np


def frame_memory(camera_names: Sequence[str], h: int, w: int) -> Tuple[int, mmap.mmap, Dict[str, Tuple[np.ndarray, int]]]:
    """(fd, mapping, slots): slots maps each camera to its writable array in the mapping and that
    array's byte offset. The file is sealed against shrinking (the server maps it, and a file
    shrunk under a mapping would crash its reader), growing and further sealing; the caller owns
    fd (it travels with SHM_ATTACH) and closes it."""
    frame, size = h * w * 3, h * w * 3 * len(camera_names)
    fd = os.memfd_create("act-client-frames", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        mm = mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise
    slots = {c: (np.frombuffer(mm, np.uint8, frame, i * frame).reshape(h, w, 3), i * frame)
             for i, c in enumerate(camera_names)}
    return fd, mm, slots
