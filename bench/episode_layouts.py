#!/usr/bin/env python3
"""episode_layouts.py - one episode in one of the storage layouts the episode reader's benchmarks
compare (bench/episode_read_ab.sh), three 256x256 cameras, frames written the way that layout's
recorder writes them. Content: 8 random frames repeated (the reader's speed does not depend on it).

  episode_layouts.py OUT.hdf5 T LAYOUT
    frames   chunks (1, 256, 256, 3), written in blocks of 50 (ACT's recorder layout)
    append   resizable, chunks (1, 256, 256, 3), appended one frame at a time
    tiles    resizable, h5py's automatic chunks ((64, 32, 32, 1) tiles), appended one at a time
    latest   as append, in a libver="latest" file (layout version 4: an extensible array index,
             what a recorder writing with SWMR makes)
    tiny     raw tiles of (1, 8, 8, 1), written whole (a worst case for per-chunk costs)
    lzf      chunks (1, 256, 256, 3) with h5py's lzf, written in blocks of 50
    gzip     the same with gzip level 4 (lzf's peer)
    lzfcam   lzf again, on camera-like frames: flat colours and a gradient floor with sensor
             noise of -6..6 on every value (lzf finds short repeats only: ~80% stored)
  Any of frames, tiles, lzf and gzip followed by +f32 (e.g. gzip+f32) adds h5py's fletcher32
  checksum to the camera datasets.
For lzf and gzip the frames are flat 8x8 patches with a gradient and a grain in runs of 4 pixels
(lzf finds only exact repeats: random frames would be stored raw, the filter skipped): lzf
stores ~54% of the bytes, gzip ~27%.
"""
import sys

import h5py
import numpy as np


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    path, T, layout = argv[0], int(argv[1]), argv[2]
    f32 = layout.endswith("+f32")
    layout = layout[:-4] if f32 else layout
    if layout not in ("frames", "append", "tiles", "latest", "tiny", "lzf", "gzip", "lzfcam") or (
            f32 and layout not in ("frames", "tiles", "lzf", "gzip")):
        sys.exit(__doc__)
    check = {"fletcher32": True} if f32 else {}
    rng = np.random.default_rng(7)
    base = rng.integers(0, 256, (8, 256, 256, 3), dtype=np.uint8)
    if layout in ("lzf", "gzip"):
        patches = rng.integers(0, 200, (8, 32, 32, 3)).repeat(8, 1).repeat(8, 2)
        grain = rng.integers(0, 4, (8, 256, 64, 3)).repeat(4, 2)   # shading, in runs of 4 pixels
        base = (patches + grain + np.arange(256)[None, None, :, None] // 16).astype(np.uint8)
    if layout == "lzfcam":
        yy = np.arange(256)[:, None, None]
        scene = np.where(yy > 150, np.concatenate([90 + yy // 4, 80 + yy // 5, 70 + yy // 6], 2),
                         np.array([180, 190, 200])).repeat(256, 1)
        scene[60:120, 40:110] = (200, 40, 40)
        scene[100:180, 150:200] = (40, 160, 60)
        base = np.clip(scene[None] + rng.integers(-6, 7, (8, 256, 256, 3)), 0, 255).astype(np.uint8)
        layout = "lzf"
    kw = {"libver": "latest"} if layout == "latest" else {}
    with h5py.File(path, "w", **kw) as f:
        f["action"] = rng.standard_normal((T, 16)).astype(np.float32)
        f["observations/qpos"] = rng.standard_normal((T, 16)).astype(np.float32)
        for cam in ("l_vis", "r_vis", "front"):
            name = f"observations/images/{cam}"
            if layout in ("frames", "tiny", "lzf", "gzip"):
                chunks = (1, 8, 8, 1) if layout == "tiny" else (1, 256, 256, 3)
                comp = {"lzf": {"compression": "lzf"}, "gzip": {"compression": "gzip", "compression_opts": 4}}
                d = f.create_dataset(name, (T, 256, 256, 3), np.uint8, chunks=chunks, **comp.get(layout, {}), **check)
                for t in range(0, T, 50):
                    n = min(50, T - t)
                    d[t:t + n] = base[np.arange(t, t + n) % 8]
            else:
                chunks = {} if layout == "tiles" else {"chunks": (1, 256, 256, 3)}
                d = f.create_dataset(name, (0, 256, 256, 3), np.uint8, maxshape=(None, 256, 256, 3), **chunks,
                                     **check)
                for t in range(T):
                    d.resize(t + 1, axis=0)
                    d[t] = base[t % 8]
        stored = d.id.get_storage_size() / (d.size or 1)
    print(f"{path}: {T} steps, {layout}{'+f32' if f32 else ''}, chunks {d.chunks}, {stored:.0%} of the bytes stored")


if __name__ == "__main__":
    main(sys.argv[1:])
