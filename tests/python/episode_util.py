"""Helpers shared by the episode reader tests (test_episode_inflate.py, test_episode_direct.py):
a small model with camera-like frames, episodes written in a chosen storage layout, and
act-infer predict with a chosen reader configuration (ACT_EPISODE_THREADS=1 is HDF5's own path,
the reference every faster path must match byte for byte)."""
import json
import os
import subprocess
import tempfile
from pathlib import Path

import h5py
import numpy as np

T = 11

# make_episode_data's models, one per config for the whole pytest run (every episode test used to
# convert its own 45 MB checkpoint into its own 45 MB model: ~200 tests, ~17 GB of temporary files
# per run, which filled a CI disk). The tests only read the model.
_models = {}


def write_episode(path, qpos, action, images, chunk=None, gzip=False, userblock=0, unwritten=(), libver=None,
                  resizable=False, lzf=False, shuffle=False, fletcher32=False):
    """images: camera -> (T, H, W, 3) uint8. chunk None: contiguous; else chunks of `chunk` frames
    (an int), of that shape (a tuple: tiles), or h5py's automatic ones (True), gzip level 4 when
    asked. userblock: bytes of user block before HDF5's data. unwritten: the timesteps of chunks
    never written (HDF5 would read them as zeros; the engine refuses the file). libver: h5py's
    file format bounds ("latest": chunk indexes of layout version 4, as SWMR recorders write).
    resizable: maxshape (None, H, W, 3), as a recorder that appends frames makes (with "latest":
    an extensible array index; fixed datasets get a fixed array, one chunk a single-chunk index).
    lzf: h5py's own lzf filter instead of gzip; shuffle: the shuffle filter before either;
    fletcher32: h5py's checksum after them (chunked cameras only)."""
    fkw = {}
    if userblock:
        fkw["userblock_size"] = userblock
    if libver:
        fkw["libver"] = libver
    with h5py.File(path, "w", **fkw) as f:
        f["action"] = action
        f["observations/qpos"] = qpos
        for cam, frames in images.items():
            kw = {}
            if chunk is not None:   # k frames, a whole chunk shape (tiles), or True (h5py's own choice)
                kw = {"chunks": chunk if isinstance(chunk, (tuple, bool)) else (chunk,) + frames.shape[1:]}
                if gzip:
                    kw.update(compression="gzip", compression_opts=4)
                if lzf:
                    kw.update(compression="lzf")
                if shuffle:
                    kw.update(shuffle=True)
                if fletcher32:
                    kw.update(fletcher32=True)
            if resizable:
                kw["maxshape"] = (None,) + frames.shape[1:]
            if unwritten:
                d = f.create_dataset(f"observations/images/{cam}", shape=frames.shape, dtype=np.uint8, **kw)
                for t in range(frames.shape[0]):
                    if t not in unwritten:
                        d[t] = frames[t]
            else:
                f.create_dataset(f"observations/images/{cam}", data=frames, **kw)


def reader_env(threads, inflater=None, pread=True):
    """the environment of a run whose episode reader uses `threads` threads (1: HDF5's own path),
    the gzip inflater named (None: the build's default), pread or not (ACT_EPISODE_PREAD=0)"""
    env = dict(os.environ, ACT_EPISODE_THREADS=str(threads))
    env.pop("ACT_EPISODE_INFLATE", None)
    env.pop("ACT_EPISODE_PREAD", None)
    if inflater:
        env["ACT_EPISODE_INFLATE"] = inflater
    if not pread:
        env["ACT_EPISODE_PREAD"] = "0"
    return env


def predict(act_infer, model, ep, out, threads, inflater=None, pread=True):
    env = reader_env(threads, inflater, pread)
    return subprocess.run([str(act_infer), "predict", "--model", str(model), "--episode", str(ep), "--out", str(out),
                           "--device", "cpu", "--batch", "4"], capture_output=True, text=True, timeout=600, env=env)


def readers(bench_read, model, ep, threads, inflater=None, pread=True):
    """camera -> how bench_episode_read (the engine's episode reader) reads its frames:
    'pread, contiguous', 'libdeflate, gzip chunks of 1 frames, pread', 'hdf5', ..."""
    env = reader_env(threads, inflater, pread)
    p = subprocess.run([str(bench_read), "--model", str(model), "--episodes", str(ep), "--rounds", "1"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    return {line.split()[1].rstrip(":"): line.split(":", 1)[1].strip()
            for line in p.stdout.splitlines() if line.startswith("reader")}


def dumped_frames(bench_read, model, ep, tmp_path, threads, inflater=None, pread=True, batch=4):
    """camera -> the (T, H, W, 3) frames the engine's reader delivers for episode ep, read in
    windows of `batch` timesteps (bench_episode_read --dump)"""
    env = reader_env(threads, inflater, pread)
    prefix = tmp_path / f"dump{threads}"
    p = subprocess.run([str(bench_read), "--model", str(model), "--episodes", str(ep), "--rounds", "1",
                        "--batch", str(batch), "--dump", str(prefix)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    with h5py.File(ep, "r") as f:
        cams = list(f["observations/images"])
        shapes = {c: f[f"observations/images/{c}"].shape for c in cams}
    return {c: np.fromfile(f"{prefix}.{c}.u8", dtype=np.uint8).reshape(shapes[c]) for c in cams}


def assert_pool_reads(bench_read, model, ep, images, tmp_path, name, what):
    """episode ep's cameras are read on the pool as `name` (', pread' added where the chunk table
    gives the places) and on HDF5's path with one thread; every pixel equals images in windows of
    4 and 5, with and without pread, on both paths. what: the layout, for failure messages."""
    assert set(readers(bench_read, model, ep, 3).values()) == {f"{name}, pread"}
    assert set(readers(bench_read, model, ep, 3, pread=False).values()) == {name}
    assert set(readers(bench_read, model, ep, 1).values()) == {"hdf5"}
    for threads, batch, pread in ((3, 4, True), (3, 5, True), (3, 5, False), (1, 4, True)):
        got = dumped_frames(bench_read, model, ep, tmp_path, threads, pread=pread, batch=batch)
        for c, frames in images.items():
            np.testing.assert_array_equal(got[c], frames, err_msg=f"{c}, {what}, {threads} threads, "
                                          f"windows of {batch}, pread {pread}")


def assert_same_predictions(act_infer, model, raw, ep, tmp_path, threads=3, inflater=None, pread=True, what=""):
    """act-infer predict gives episode ep exactly the chunks it gives raw, the same episode stored
    uncompressed (read on HDF5's path), with each reader thread count in `threads` (an int or a
    sequence: 1 is HDF5's own path), the gzip inflater and pread setting given"""
    p = predict(act_infer, model, raw, tmp_path / "want.npy", 1)
    assert p.returncode == 0, p.stderr
    want = np.load(tmp_path / "want.npy")
    for n in (threads,) if isinstance(threads, int) else threads:
        p = predict(act_infer, model, ep, tmp_path / f"got{n}.npy", n, inflater, pread)
        assert p.returncode == 0, p.stderr
        np.testing.assert_array_equal(np.load(tmp_path / f"got{n}.npy"), want, err_msg=f"{what}, {n} threads")


def make_episode_data(make_model, make_cfg, tmp_path, rng):
    """(model path, qpos, action, images) for a small model: frames are smooth gradients plus
    noise, so gzip has something to compress and no two frames are alike."""
    cfg = make_cfg()
    key = json.dumps(cfg, sort_keys=True)
    if key not in _models:   # beside the tests' own folders, under the run's base temporary folder
        _models[key], _ = make_model(Path(tempfile.mkdtemp(prefix="episode_model", dir=tmp_path.parent)), cfg, 5)
    model = _models[key]
    size = cfg["vision_backbone"]["image_shape"][0]
    yy, xx = np.mgrid[0:size, 0:size]
    images = {}
    for c in cfg["camera_names"]:
        base = (yy[None, :, :, None] * 2 + xx[None, :, :, None] + np.arange(T)[:, None, None, None] * 7) % 256
        noise = rng.integers(0, 24, (T, size, size, 3))
        images[c] = ((base + noise) % 256).astype(np.uint8)
    qpos = rng.standard_normal((T, cfg["obs_dim"])).astype(np.float32)
    action = rng.standard_normal((T, cfg["action_dim"])).astype(np.float32)
    return model, qpos, action, images
