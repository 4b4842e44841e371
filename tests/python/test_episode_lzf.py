"""Episodes saved with h5py's own lzf filter (compression="lzf", HDF5 filter 32000, which
libhdf5 and h5repack do not have): read by the engine's decoder (engine/episode_lzf.c) on the
pool's threads and, registered as HDF5's filter 32000, on HDF5's own path. Every pixel equals
h5py's read; chunks lzf could not shrink (stored raw, the filter skipped in their mask) are read
too; a damaged lzf chunk (bad data, a stream decoding short of its chunk or past it, a raw one
of the wrong size) is an error naming the chunk, at open on HDF5's path (episode_check.c) and at
the read on the pool's; lzf with fletcher32 reads on the pool too, and lzf on qpos/action through
HDF5's path with the engine's filter, which is registered without loading HDF5's plugins."""

from __future__ import annotations

import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest
from episode_util import (assert_pool_reads, assert_same_predictions, dumped_frames, make_episode_data, predict,
                          reader_env, readers, write_episode)


@pytest.fixture
def episode_data(make_model, make_cfg, tmp_path, rng):
    """make_episode_data's frames with their noise in blocks of 4x4 pixels: lzf only finds
    repeats of 3 bytes or more, so per-pixel noise would leave every chunk stored raw"""
    model, qpos, action, images = make_episode_data(make_model, make_cfg, tmp_path, rng)
    for v in images.values():
        v[:] = v[:, ::4, ::4].repeat(4, 1).repeat(4, 2)[:, :v.shape[1], :v.shape[2]]
    return model, qpos, action, images


def chunk_shape(ep, cam):
    with h5py.File(ep, "r") as f:
        d = f[f"observations/images/{cam}"]
        assert d.compression == "lzf", d.compression
        return d.chunks


@pytest.mark.parametrize("chunk, shuffle", [(1, False), (3, True), (True, False), ((2, 7, 5, 2), True)],
                         ids=["frames", "3-frames-shuffle", "h5py-auto", "2x7x5x2-shuffle"])
def test_lzf_episodes_give_h5pys_frames(act_infer, bench_read, episode_data, tmp_path, chunk, shuffle):
    model, qpos, action, images = episode_data
    raw, lz = tmp_path / "raw.hdf5", tmp_path / "lzf.hdf5"
    write_episode(raw, qpos, action, images)
    write_episode(lz, qpos, action, images, chunk=chunk, lzf=True, shuffle=shuffle)
    cam = next(iter(images))
    shape = chunk_shape(lz, cam)
    whole = shape[1:] == images[cam].shape[1:]
    what = f"{shape[0]} frames" if whole else f"({', '.join(map(str, shape))})"
    # the pool's path is taken (HDF5's own would pass the comparison as well), by pread at the
    # chunk table's places or through H5Dread_chunk; one thread: HDF5's path with our filter
    assert_pool_reads(bench_read, model, lz, images, tmp_path, f"pool, lzf chunks of {what}", f"chunks {shape}")
    p = predict(act_infer, model, raw, tmp_path / "want.npy", 1)
    assert p.returncode == 0, p.stderr
    for threads in (1, 3):
        p = predict(act_infer, model, lz, tmp_path / f"got{threads}.npy", threads)
        assert p.returncode == 0, p.stderr
        np.testing.assert_array_equal(np.load(tmp_path / f"got{threads}.npy"), np.load(tmp_path / "want.npy"))


def test_chunks_lzf_could_not_shrink_are_read_raw(bench_read, episode_data, tmp_path, rng):
    """h5py's lzf is optional: a chunk of noise, which lzf cannot shrink, is stored as it is with
    the filter's bit set in its mask; the pool leaves its window to HDF5's path, which copies it"""
    model, qpos, action, images = episode_data
    noisy = {c: v.copy() for c, v in images.items()}
    for v in noisy.values():
        v[2:4] = rng.integers(0, 256, v[2:4].shape, dtype=np.uint8)
    lz = tmp_path / "noise.hdf5"
    write_episode(lz, qpos, action, noisy, chunk=1, lzf=True)
    cam = next(iter(images))
    with h5py.File(lz, "r") as f:
        d = f[f"observations/images/{cam}"]
        masks = [d.id.read_direct_chunk((t, 0, 0, 0))[0] for t in range(d.shape[0])]
    assert masks[2] == masks[3] == 1 and masks[0] == 0, masks
    for threads in (3, 1):
        got = dumped_frames(bench_read, model, lz, tmp_path, threads, batch=3)
        for c, frames in noisy.items():
            np.testing.assert_array_equal(got[c], frames, err_msg=f"{c}, {threads} threads")


@pytest.mark.parametrize("chunk", [1, (3, 8, 16, 1)], ids=["frames", "tiles"])
def test_a_damaged_lzf_chunk_is_named(act_infer, episode_data, tmp_path, chunk):
    model, qpos, action, images = episode_data
    lz = tmp_path / "lzf.hdf5"
    write_episode(lz, qpos, action, images, chunk=chunk, lzf=True)
    cam = next(iter(images))
    origin = (3, 0, 0, 0) if chunk == 1 else (3, 8, 16, 2)
    with h5py.File(lz, "r") as f:
        ds = f[f"observations/images/{cam}"]
        loc = next(ds.id.get_chunk_info(i) for i in range(ds.id.get_num_chunks())
                   if ds.id.get_chunk_info(i).chunk_offset == origin)
    data = bytearray(lz.read_bytes())
    # a back reference to before the chunk's start: the stream's first control byte made one
    assert loc.filter_mask == 0 and data[loc.byte_offset] < 32
    data[loc.byte_offset] = 0xE0 | 31
    lz.write_bytes(bytes(data))
    where = "timestep 3" if chunk == 1 else "(3, 8, 16, 2)"
    p = predict(act_infer, model, lz, tmp_path / "x.npy", 3)
    assert p.returncode != 0 and f"observations/images/{cam}" in p.stderr, p.stderr
    assert "lzf chunk" in p.stderr and where in p.stderr and "corrupt (lzf" in p.stderr, p.stderr
    assert not (tmp_path / "x.npy").exists()
    p = predict(act_infer, model, lz, tmp_path / "y.npy", 1)   # HDF5's path: refused at open
    at = "(3, 0, 0, 0)" if chunk == 1 else "(3, 8, 16, 2)"
    assert p.returncode != 0 and f"the chunk at {at} is not a valid LZF stream" in p.stderr, p.stderr
    assert not (tmp_path / "y.npy").exists()



def lzf_zeros(n):
    """a valid lzf stream of n zero bytes: one literal, then references 1 byte back"""
    out, left = bytearray([0, 0]), n - 1
    while left > 0:
        k = min(264, left)
        if k < 3:
            out += bytes([k - 1]) + b"\0" * k
        elif k - 2 < 7:
            out += bytes([(k - 2) << 5, 0])
        else:
            out += bytes([0xE0, k - 9, 0])
        left -= k
    return bytes(out)


@pytest.mark.parametrize("what", ["short", "long", "zeros", "raw-short"])
def test_crafted_lzf_chunks(bench_read, episode_data, tmp_path, what):
    """chunks written as stored bytes (h5py's write_direct_chunk): a valid stream of a whole chunk
    of zeros is read as zeros; one that decodes short of the chunk or past it, and a chunk stored
    raw (filter skipped) of the wrong size, are named on the pool's path and at open"""
    model, qpos, action, images = episode_data
    ep = tmp_path / "crafted.hdf5"
    write_episode(ep, qpos, action, images, chunk=1, lzf=True)
    cam = next(iter(images))
    n = images[cam][0].nbytes
    stored = {"short": (lzf_zeros(n // 2), 0), "long": (lzf_zeros(n + 300), 0), "zeros": (lzf_zeros(n), 0),
              "raw-short": (b"\0" * (n - 10), 1)}[what]
    with h5py.File(ep, "r+") as f:
        f[f"observations/images/{cam}"].id.write_direct_chunk((3, 0, 0, 0), stored[0], stored[1])
    want = {"short": ("it is corrupt (lzf: wrong size)", f"decodes to {n // 2} bytes, but a chunk holds {n}"),
            "long": ("it is corrupt (lzf: longer than the chunk)", f"decodes to more than the {n} bytes"),
            "raw-short": (f"stores {n - 10} bytes unfiltered", f"stores {n - 10} bytes unfiltered")}
    for threads in (3, 1):
        if what == "zeros":
            expect = images[cam].copy()
            expect[3] = 0
            got = dumped_frames(bench_read, model, ep, tmp_path, threads)
            np.testing.assert_array_equal(got[cam], expect, err_msg=f"{threads} threads")
            continue
        p = read_frames(bench_read, model, ep, reader_env(threads))
        assert p.returncode != 0 and f"observations/images/{cam}" in p.stderr, p.stderr
        assert want[what][threads == 1] in p.stderr, (threads, p.stderr)


def read_frames(bench_read, model, ep, env):
    return subprocess.run([str(bench_read), "--model", str(model), "--episodes", str(ep), "--rounds", "1"],
                          capture_output=True, text=True, timeout=300, env=env)


def test_lzf_with_fletcher32_and_on_qpos_and_action(act_infer, bench_read, episode_data, tmp_path):
    """fletcher32 after lzf (h5py's order: shuffle, compression, fletcher32): the pool checks the
    checksum and decodes; HDF5's path (1 thread) decodes with the engine's filter; qpos and
    action stored with lzf too"""
    model, qpos, action, images = episode_data
    raw, ep = tmp_path / "raw.hdf5", tmp_path / "f32.hdf5"
    write_episode(raw, qpos, action, images)
    with h5py.File(ep, "w") as f:
        for name, v in (("action", action), ("observations/qpos", qpos)):
            f.create_dataset(name, data=v, chunks=(3, v.shape[1]), compression="lzf", shuffle=True)
        for cam, frames in images.items():
            f.create_dataset(f"observations/images/{cam}", data=frames, chunks=(1,) + frames.shape[1:],
                             compression="lzf", shuffle=True, fletcher32=True)
    assert set(readers(bench_read, model, ep, 3).values()) == {"pool, lzf chunks of 1 frames, fletcher32, pread"}
    assert set(readers(bench_read, model, ep, 1).values()) == {"hdf5"}
    for threads in (3, 1):
        got = dumped_frames(bench_read, model, ep, tmp_path, threads)
        for c, frames in images.items():
            np.testing.assert_array_equal(got[c], frames, err_msg=f"{c}, {threads} threads")
    assert_same_predictions(act_infer, model, raw, ep, tmp_path)


def test_no_hdf5_plugin_is_loaded(bench_read, episode_data, tmp_path):
    """the filter is registered only for a dataset that uses it, and without asking HDF5 whether
    it has one (H5Zfilter_avail would dlopen every library in HDF5_PLUGIN_PATH)"""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a marker plugin")
    model, qpos, action, images = episode_data
    plugins, marker = tmp_path / "plugins", tmp_path / "loaded"
    plugins.mkdir()
    src = tmp_path / "marker.c"
    src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void hit(void) {\n'
                   f'    FILE *f = fopen("{marker}", "w"); if (f) fclose(f);\n}}\n')
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(plugins / "libmarker.so"), str(src)], check=True)
    for name, kw in (("raw.hdf5", {}), ("lzf.hdf5", {"chunk": 1, "lzf": True})):
        ep = tmp_path / name
        write_episode(ep, qpos, action, images, **kw)
        p = read_frames(bench_read, model, ep, dict(reader_env(1), HDF5_PLUGIN_PATH=str(plugins)))
        assert p.returncode == 0, p.stderr
        assert not os.path.exists(marker), f"{name}: a plugin of HDF5_PLUGIN_PATH was loaded"
