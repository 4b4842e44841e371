"""gzip frame chunks inflated on the pool's threads (engine/episode_inflate.c) give exactly the
frames HDF5's own path gives: chunks of one and of three frames (windows that cut chunks), by
each inflater the build has (libdeflate, zlib), and a corrupt chunk is a clear error naming the
dataset and timestep, never a crash or wrong frames."""

from __future__ import annotations

import os
import subprocess

import h5py
import numpy as np
import pytest

T = 11


def _write(path, qpos, action, images, chunk=None):
    with h5py.File(path, "w") as f:
        f["action"] = action
        f["observations/qpos"] = qpos
        for cam, frames in images.items():
            kw = {} if chunk is None else {"chunks": (chunk,) + frames.shape[1:], "compression": "gzip",
                                          "compression_opts": 4}
            f.create_dataset(f"observations/images/{cam}", data=frames, **kw)


def _predict(act_infer, model, ep, out, threads, inflater=None):
    env = dict(os.environ, ACT_EPISODE_THREADS=str(threads))
    env.pop("ACT_EPISODE_INFLATE", None)
    if inflater:
        env["ACT_EPISODE_INFLATE"] = inflater
    return subprocess.run([str(act_infer), "predict", "--model", str(model), "--episode", str(ep), "--out", str(out),
                           "--device", "cpu", "--batch", "4"], capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture
def episode_data(make_model, make_cfg, tmp_path, rng):
    cfg = make_cfg()
    model, _ = make_model(tmp_path, cfg, 5)
    size = cfg["vision_backbone"]["image_shape"][0]
    # camera-like frames (smooth gradients plus noise) so gzip has something to compress
    yy, xx = np.mgrid[0:size, 0:size]
    images = {}
    for c in cfg["camera_names"]:
        base = (yy[None, :, :, None] * 2 + xx[None, :, :, None] + np.arange(T)[:, None, None, None] * 7) % 256
        noise = rng.integers(0, 24, (T, size, size, 3))
        images[c] = ((base + noise) % 256).astype(np.uint8)
    qpos = rng.standard_normal((T, cfg["obs_dim"])).astype(np.float32)
    action = rng.standard_normal((T, cfg["action_dim"])).astype(np.float32)
    return model, qpos, action, images


@pytest.fixture(params=["libdeflate", "zlib"])
def inflater(request, act_infer):
    """each inflater the pool can use; libdeflate only where the build found it (scripts/setup.sh
    installs it, so CI runs both)"""
    features = subprocess.run([str(act_infer), "--version"], capture_output=True, text=True).stdout
    if request.param == "libdeflate" and " libdeflate" not in features:
        pytest.skip(f"built without libdeflate ({features.strip()})")
    return request.param


@pytest.mark.parametrize("chunk", [1, 3])
def test_threaded_inflate_gives_hdf5s_frames(act_infer, episode_data, tmp_path, chunk, inflater):
    model, qpos, action, images = episode_data
    raw, gz = tmp_path / "raw.hdf5", tmp_path / f"gz{chunk}.hdf5"
    _write(raw, qpos, action, images)
    _write(gz, qpos, action, images, chunk=chunk)
    p = _predict(act_infer, model, raw, tmp_path / "want.npy", 1)
    assert p.returncode == 0, p.stderr
    for threads in (1, 3):   # HDF5's own inflate, then the pool's
        p = _predict(act_infer, model, gz, tmp_path / f"got{threads}.npy", threads, inflater)
        assert p.returncode == 0, p.stderr
        np.testing.assert_array_equal(np.load(tmp_path / f"got{threads}.npy"), np.load(tmp_path / "want.npy"),
                                      err_msg=f"chunks of {chunk} frames, {threads} threads, {inflater}")


def test_a_corrupt_gzip_chunk_is_a_clear_error(act_infer, episode_data, tmp_path, inflater):
    model, qpos, action, images = episode_data
    gz = tmp_path / "gz.hdf5"
    _write(gz, qpos, action, images, chunk=1)
    cam = next(iter(images))
    with h5py.File(gz, "r") as f:
        info = f[f"observations/images/{cam}"].id.get_chunk_info(6)   # the chunk of timestep 6
    data = bytearray(gz.read_bytes())
    mid = info.byte_offset + info.size // 2
    data[mid:mid + 16] = bytes(255 - b for b in data[mid:mid + 16])
    gz.write_bytes(bytes(data))
    p = _predict(act_infer, model, gz, tmp_path / "x.npy", 3, inflater)
    assert p.returncode != 0
    assert f"observations/images/{cam}" in p.stderr and "timestep 6" in p.stderr and "corrupt" in p.stderr, p.stderr
    assert f"({inflater}: " in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "x.npy").exists()
    p = _predict(act_infer, model, gz, tmp_path / "y.npy", 1)   # HDF5's own path refuses it too
    assert p.returncode != 0 and "cannot be read" in p.stderr, p.stderr


def test_an_unknown_inflater_is_named(act_infer, episode_data, tmp_path):
    model, qpos, action, images = episode_data
    gz = tmp_path / "gz.hdf5"
    _write(gz, qpos, action, images, chunk=1)
    p = _predict(act_infer, model, gz, tmp_path / "x.npy", 3, "gunzip")
    assert p.returncode != 0 and "ACT_EPISODE_INFLATE='gunzip'" in p.stderr and "zlib" in p.stderr, p.stderr
    assert not (tmp_path / "x.npy").exists()
