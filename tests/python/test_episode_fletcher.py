"""Episodes saved with h5py's fletcher32=True (HDF5's checksum filter, applied after shuffle and
gzip or lzf): the pool checks each chunk's checksum on its threads (engine/episode_fletcher.c)
and then reads the chunk as it would without it, so every layout the pool reads (gzip or lzf
frames and tiles, raw tiles) keeps the pool with a checksum too, and so do raw whole frames
(pread cannot check a checksum: the pool fetches and checks those). Every pixel equals h5py's read;
a chunk whose stored bytes or checksum were changed is an error naming it on the pool's path and
on HDF5's; the checksum HDF5 before 1.6.3 wrote (each half's bytes swapped) is accepted, as HDF5
accepts it; a fletcher32 the writer applied before compression leaves the dataset to HDF5."""

from __future__ import annotations

import struct
import subprocess
import zlib

import h5py
import numpy as np
import pytest
from episode_util import (assert_pool_reads, assert_same_predictions, dumped_frames, make_episode_data, predict,
                          reader_env, readers, write_episode)


@pytest.fixture
def episode_data(make_model, make_cfg, tmp_path, rng):
    """make_episode_data's frames with their noise in blocks of 4x4 pixels (lzf finds repeats in
    those; with per-pixel noise it would store every chunk raw, its filter skipped)"""
    model, qpos, action, images = make_episode_data(make_model, make_cfg, tmp_path, rng)
    for v in images.values():
        v[:] = v[:, ::4, ::4].repeat(4, 1).repeat(4, 2)[:, :v.shape[1], :v.shape[2]]
    return model, qpos, action, images


LAYOUTS = {   # name -> write_episode's keywords
    "gzip-frames": dict(chunk=1, gzip=True),
    "gzip-tiles-shuffle": dict(chunk=(2, 7, 5, 2), gzip=True, shuffle=True),
    "lzf-3-frames": dict(chunk=3, lzf=True),
    "raw-tiles": dict(chunk=(3, 8, 16, 1)),
    "raw-frames": dict(chunk=2),
    "shuffle-frames": dict(chunk=1, shuffle=True),   # shuffle moves no 1-byte pixel: raw to the pool
}


def describe(images, kw):
    """the reader's name for a camera stored with write_episode's keywords kw"""
    frame = next(iter(images.values())).shape[1:]
    chunk = kw["chunk"]
    codec = "libdeflate, gzip" if kw.get("gzip") else "pool, lzf" if kw.get("lzf") else "pool, raw"
    if isinstance(chunk, tuple):
        shape = f"({', '.join(map(str, chunk))})"
    elif codec == "pool, raw":
        shape = f"({chunk}, {', '.join(map(str, frame))})"
    else:
        shape = f"{chunk} frames"
    return f"{codec} chunks of {shape}, fletcher32"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fletcher32_episodes_give_h5pys_frames_on_the_pool(act_infer, bench_read, episode_data, tmp_path, layout):
    model, qpos, action, images = episode_data
    kw = LAYOUTS[layout]
    raw, ep = tmp_path / "raw.hdf5", tmp_path / "f32.hdf5"
    write_episode(raw, qpos, action, images)
    write_episode(ep, qpos, action, images, fletcher32=True, **kw)
    assert_pool_reads(bench_read, model, ep, images, tmp_path, describe(images, kw), layout)
    assert_same_predictions(act_infer, model, raw, ep, tmp_path)


def stored_chunk(ep, cam, origin):
    """(byte offset in the file, stored size, filter mask) of camera cam's chunk at origin"""
    with h5py.File(ep, "r") as f:
        ds = f[f"observations/images/{cam}"]
        info = next(ds.id.get_chunk_info(i) for i in range(ds.id.get_num_chunks())
                    if ds.id.get_chunk_info(i).chunk_offset == origin)
    return info.byte_offset, info.size, info.filter_mask


def origin_of(o):
    return f"({', '.join(map(str, o))})"


def read_frames(bench_read, model, ep, threads, pread=True):
    return subprocess.run([str(bench_read), "--model", str(model), "--episodes", str(ep), "--rounds", "1"],
                          capture_output=True, text=True, timeout=300, env=reader_env(threads, pread=pread))


@pytest.mark.parametrize("pread", [True, False], ids=["pread", "H5Dread_chunk"])
@pytest.mark.parametrize("where", ["data", "checksum"])
@pytest.mark.parametrize("layout", ["gzip-frames", "raw-tiles", "raw-frames"])
def test_a_changed_byte_fails_the_checksum(act_infer, bench_read, episode_data, tmp_path, layout, where, pread):
    """one byte of a stored chunk changed (in the bytes the checksum covers, or in the checksum):
    the pool names the chunk and the checksum; on HDF5's path the open's check names them for a
    compressed chunk (it decodes those before HDF5 may), and for a raw one, whose read HDF5
    fails, the check of every chunk's checksum that follows"""
    model, qpos, action, images = episode_data
    kw = LAYOUTS[layout]
    ep = tmp_path / "f32.hdf5"
    write_episode(ep, qpos, action, images, fletcher32=True, **kw)
    cam = next(iter(images))
    origin = (3, 8, 16, 2) if layout == "raw-tiles" else (2, 0, 0, 0)
    off, size, mask = stored_chunk(ep, cam, origin)
    assert mask == 0
    data = bytearray(ep.read_bytes())
    data[off + (size // 2 if where == "data" else size - 2)] ^= 0x10
    ep.write_bytes(bytes(data))
    at = "(3, 8, 16, 2)" if layout == "raw-tiles" else "timestep 2"
    p = read_frames(bench_read, model, ep, 3, pread)
    assert p.returncode != 0 and f"observations/images/{cam}" in p.stderr, p.stderr
    assert f"{at} cannot be read: its fletcher32 checksum does not match its bytes (corrupt file)" in p.stderr, \
        p.stderr
    p = read_frames(bench_read, model, ep, 1)
    assert p.returncode != 0 and f"observations/images/{cam}" in p.stderr, p.stderr
    # named by the open's check (a compressed chunk), or after HDF5's read failed (raw: HDF5 1.14
    # itself says only "filter returned failure during read")
    assert f"the chunk at {origin_of(origin)} does not match its fletcher32 checksum" in p.stderr, p.stderr
    for threads in (3, 1):
        p = predict(act_infer, model, ep, tmp_path / f"x{threads}.npy", threads)
        assert p.returncode != 0 and "Segmentation" not in p.stderr, p.stderr
        assert not (tmp_path / f"x{threads}.npy").exists()


def fletcher32(b: bytes) -> int:
    """HDF5's fletcher32 (H5_checksum_fletcher32), word by word, for crafting stored chunks"""
    a = s = 0
    words = len(b) // 2
    i = 0
    while words:
        k = min(360, words)
        words -= k
        for _ in range(k):
            a += b[i] << 8 | b[i + 1]
            s += a
            i += 2
        a = (a & 0xFFFF) + (a >> 16)
        s = (s & 0xFFFF) + (s >> 16)
    if len(b) % 2:
        a += b[i] << 8
        s += a
        a = (a & 0xFFFF) + (a >> 16)
        s = (s & 0xFFFF) + (s >> 16)
    a = (a & 0xFFFF) + (a >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return (s << 16 | a) & 0xFFFFFFFF


def test_the_checksum_of_hdf5_before_1_6_3_is_accepted(bench_read, episode_data, tmp_path):
    """HDF5 1.6.2 and before stored each 16-bit half of the checksum byte-swapped, and HDF5's
    reader still accepts that: so does the pool. Chunks written with it (and one of zeros with
    the plain checksum) read as written; the crafting function is first held to HDF5's checksum of
    a chunk h5py stored."""
    model, qpos, action, images = episode_data
    ep = tmp_path / "f32.hdf5"
    write_episode(ep, qpos, action, images, chunk=1, fletcher32=True)
    cam = next(iter(images))
    name = f"observations/images/{cam}"
    n = images[cam][0].nbytes
    with h5py.File(ep, "r+") as f:
        mask, stored = f[name].id.read_direct_chunk((1, 0, 0, 0))
        assert mask == 0 and struct.unpack("<I", stored[-4:])[0] == fletcher32(stored[:-4])
        ramp = (np.arange(n) * 7 % 251).astype(np.uint8)
        f32 = fletcher32(ramp.tobytes())
        swapped = ((f32 & 0x00FF00FF) << 8) | ((f32 >> 8) & 0x00FF00FF)
        assert swapped != f32
        zeros = b"\0" * n
        f[name].id.write_direct_chunk((3, 0, 0, 0), ramp.tobytes() + struct.pack("<I", swapped), 0)
        f[name].id.write_direct_chunk((4, 0, 0, 0), zeros + struct.pack("<I", fletcher32(zeros)), 0)
    expect = images[cam].copy()
    expect[3] = ramp.reshape(expect[3].shape)
    expect[4] = 0
    for threads in (3, 1):
        got = dumped_frames(bench_read, model, ep, tmp_path, threads)
        np.testing.assert_array_equal(got[cam], expect, err_msg=f"{threads} threads")


def test_a_fletcher32_applied_before_gzip_is_hdf5s(bench_read, episode_data, tmp_path):
    """a writer may put fletcher32 before gzip (the checksum inside the compressed stream): the
    pool checks only a checksum applied last, so that dataset reads on HDF5's path, correctly"""
    model, qpos, action, images = episode_data
    ep = tmp_path / "inner.hdf5"
    with h5py.File(ep, "w") as f:
        f["action"] = action
        f["observations/qpos"] = qpos
        for cam, frames in images.items():
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_chunk((1,) + frames.shape[1:])
            dcpl.set_fletcher32()
            dcpl.set_deflate(4)
            space = h5py.h5s.create_simple(frames.shape)
            f.require_group("observations/images")
            dsid = h5py.h5d.create(f["observations/images"].id, cam.encode(), h5py.h5t.NATIVE_UINT8, space,
                                   dcpl=dcpl)
            dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(frames))
        ds = f[f"observations/images/{next(iter(images))}"]
        assert [ds.id.get_create_plist().get_filter(i)[0] for i in range(2)] == \
            [h5py.h5z.FILTER_FLETCHER32, h5py.h5z.FILTER_DEFLATE]
    assert set(readers(bench_read, model, ep, 3).values()) == {"hdf5"}
    got = dumped_frames(bench_read, model, ep, tmp_path, 3)
    for c, frames in images.items():
        np.testing.assert_array_equal(got[c], frames, err_msg=c)


@pytest.mark.parametrize("name", ["action", "observations/qpos"])
def test_a_changed_byte_in_qpos_or_action_names_its_chunk(bench_read, episode_data, tmp_path, name):
    """qpos and action are HDF5's to read: a chunk failing its checksum there is named too"""
    model, qpos, action, images = episode_data
    ep = tmp_path / "f32.hdf5"
    with h5py.File(ep, "w") as f:
        for n, v in (("action", action), ("observations/qpos", qpos)):
            f.create_dataset(n, data=v, chunks=(4, v.shape[1]), fletcher32=True)
        for cam, frames in images.items():
            f[f"observations/images/{cam}"] = frames
        info = next(f[name].id.get_chunk_info(i) for i in range(f[name].id.get_num_chunks())
                    if f[name].id.get_chunk_info(i).chunk_offset == (4, 0))
    data = bytearray(ep.read_bytes())
    data[info.byte_offset + 9] ^= 0x01
    ep.write_bytes(bytes(data))
    for threads in (3, 1):
        p = read_frames(bench_read, model, ep, threads)
        assert p.returncode != 0, p.stderr
        assert f"dataset '{name}': the chunk at (4, 0) does not match its fletcher32 checksum" in p.stderr, p.stderr


@pytest.mark.parametrize("layout, origin, after", [("gzip-frames", (2, 0, 0, 0), (3, 0, 0, 0)),
                                                   ("raw-frames", (2, 0, 0, 0), (0, 0, 0, 0)),
                                                   ("raw-tiles", (3, 0, 0, 0), (3, 0, 0, 1))])
def test_a_chunk_stored_with_its_checksum_skipped_is_read(bench_read, episode_data, tmp_path, layout, origin, after):
    """a writer may store a chunk with fletcher32 skipped (its bit set in the chunk's filter mask,
    no checksum: H5Dwrite_chunk); the pool leaves that window to HDF5, which reads it, whether
    the chunk's place came from the chunk table (pread) or not (H5Dread_chunk, where the mask is
    known only once the chunk is read); then a changed byte in another chunk of the same window
    is named after HDF5's read fails"""
    model, qpos, action, images = episode_data
    kw = LAYOUTS[layout]
    ep = tmp_path / "f32.hdf5"
    write_episode(ep, qpos, action, images, fletcher32=True, **kw)
    cam = next(iter(images))
    name = f"observations/images/{cam}"
    expect = images[cam].copy()
    with h5py.File(ep, "r+") as f:
        ds = f[name]
        c = ds.chunks
        part = tuple(slice(o, o + n) for o, n in zip(origin, c))
        block = np.ascontiguousarray(255 - expect[part])
        expect[part] = block
        data = zlib.compress(block.tobytes()) if kw.get("gzip") else block.tobytes()
        skip = 1 << (ds.id.get_create_plist().get_nfilters() - 1)   # fletcher32: the last filter
        ds.id.write_direct_chunk(origin, data, skip)
    for threads, pread in ((3, True), (3, False), (1, True)):
        got = dumped_frames(bench_read, model, ep, tmp_path, threads, pread=pread)
        np.testing.assert_array_equal(got[cam], expect, err_msg=f"{layout}, {threads} threads, pread {pread}")
    # a changed byte in another chunk read in the same window of 4 (HDF5's read then)
    off, size, mask = stored_chunk(ep, cam, after)
    assert mask == 0
    b = bytearray(ep.read_bytes())
    b[off + size // 2] ^= 0x40
    ep.write_bytes(bytes(b))
    for pread in (True, False):
        p = read_frames(bench_read, model, ep, 3, pread)
        assert p.returncode != 0, p.stderr
        assert f"the chunk at {origin_of(after)} does not match its fletcher32 checksum" in p.stderr, p.stderr


def test_shuffled_raw_tiles_without_checksums_read_on_the_pool(bench_read, episode_data, tmp_path):
    """shuffle moves no 1-byte pixel: raw tiles with shuffle alone are the pool's, as raw tiles are"""
    model, qpos, action, images = episode_data
    ep = tmp_path / "shuffle.hdf5"
    write_episode(ep, qpos, action, images, chunk=(3, 8, 16, 1), shuffle=True)
    assert set(readers(bench_read, model, ep, 3).values()) == {"pool, raw chunks of (3, 8, 16, 1), pread"}
    got = dumped_frames(bench_read, model, ep, tmp_path, 3, batch=5)
    for c, frames in images.items():
        np.testing.assert_array_equal(got[c], frames, err_msg=c)


@pytest.mark.parametrize("pread", [True, False], ids=["pread", "H5Dread_chunk"])
def test_a_raw_chunk_missing_its_checksum_is_named_by_its_size(bench_read, episode_data, tmp_path, pread):
    """a raw chunk stored one chunk long with fletcher32 not skipped in its mask has no room for
    its checksum: named by its size, whether its place and mask came from the chunk table or only
    from reading it (H5Dread_chunk)"""
    model, qpos, action, images = episode_data
    ep = tmp_path / "f32.hdf5"
    write_episode(ep, qpos, action, images, chunk=1, fletcher32=True)
    cam = next(iter(images))
    n = images[cam][0].nbytes
    with h5py.File(ep, "r+") as f:
        f[f"observations/images/{cam}"].id.write_direct_chunk((2, 0, 0, 0), images[cam][2].tobytes(), 0)
    p = read_frames(bench_read, model, ep, 3, pread)
    assert p.returncode != 0, p.stderr
    assert f"the chunk at timestep 2 stores {n} bytes, but a chunk holds {n + 4} (damaged file)" in p.stderr, p.stderr
