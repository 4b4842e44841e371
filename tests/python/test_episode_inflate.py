"""gzip frame chunks inflated on the pool's threads (engine/episode_inflate.c) give exactly the
frames HDF5's own path gives: chunks of one and of three frames (windows that cut chunks), tiles
of frames (h5py's automatic chunks among them, edge tiles hanging over the frame), by each
inflater the build has (libdeflate, zlib), and a corrupt chunk is a clear error naming the
dataset and timestep (the tile's origin), never a crash or wrong frames."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib

import h5py

import numpy as np
import pytest
from episode_util import assert_same_predictions, dumped_frames, make_episode_data, predict, readers, write_episode


@pytest.fixture
def episode_data(make_model, make_cfg, tmp_path, rng):
    return make_episode_data(make_model, make_cfg, tmp_path, rng)


@pytest.fixture(params=["libdeflate", "zlib"])
def inflater(request, act_infer):
    """each inflater the pool can use, where the build found it (scripts/setup.sh installs both,
    so CI runs both)"""
    features = subprocess.run([str(act_infer), "--version"], capture_output=True, text=True).stdout
    if f" {request.param}" not in features:
        pytest.skip(f"built without {request.param} ({features.strip()})")
    return request.param


@pytest.mark.parametrize("pread", [True, False], ids=["pread", "h5dread_chunk"])
@pytest.mark.parametrize("chunk", [1, 3])
def test_threaded_inflate_gives_hdf5s_frames(act_infer, bench_read, episode_data, tmp_path, chunk, inflater, pread):
    """compressed chunks fetched by pread on the inflating threads, or through H5Dread_chunk"""
    model, qpos, action, images = episode_data
    raw, gz = tmp_path / "raw.hdf5", tmp_path / f"gz{chunk}.hdf5"
    write_episode(raw, qpos, action, images)
    write_episode(gz, qpos, action, images, chunk=chunk, gzip=True)
    # the path under test is taken (not HDF5's own, which would pass the comparison as well)
    want = f"{inflater}, gzip chunks of {chunk} frames" + (", pread" if pread else "")
    assert set(readers(bench_read, model, gz, 3, inflater, pread).values()) == {want}
    assert set(readers(bench_read, model, gz, 1, inflater, pread).values()) == {"hdf5"}
    # HDF5's own inflate, then the pool's
    assert_same_predictions(act_infer, model, raw, gz, tmp_path, (1, 3), inflater, pread,
                            what=f"chunks of {chunk} frames, {want}")


@pytest.mark.parametrize("tile", [True, (3, 8, 16, 1), (2, 7, 5, 2), (4, 16, 10, 3), (11, 5, 32, 1)],
                         ids=["h5py-auto", "3x8x16x1", "2x7x5x2", "4x16x10x3", "11x5x32x1"])
def test_gzip_tiles_give_hdf5s_frames(act_infer, bench_read, episode_data, tmp_path, tile, inflater):
    """chunks that are not whole frames (h5py picks (k, 32, 32, 1)-like tiles when a script asks
    for gzip without chunks=) are inflated on the pool too, each tile's part of a window copied to
    its place: every pixel equals HDF5's own read, edge tiles and windows that cut tiles included"""
    model, qpos, action, images = episode_data
    raw, gz = tmp_path / "raw.hdf5", tmp_path / "tiles.hdf5"
    write_episode(raw, qpos, action, images)
    write_episode(gz, qpos, action, images, chunk=tile, gzip=True)
    with h5py.File(gz, "r") as f:
        shape = f[f"observations/images/{next(iter(images))}"].chunks
    assert shape[1:] != images[next(iter(images))].shape[1:], "tiles expected, not whole frames"
    want = f"{inflater}, gzip chunks of ({', '.join(map(str, shape))})"
    # fetched by pread at the chunk table's places (episode_index.c), or through H5Dread_chunk
    assert set(readers(bench_read, model, gz, 3, inflater).values()) == {want + ", pread"}
    assert set(readers(bench_read, model, gz, 3, inflater, pread=False).values()) == {want}
    assert set(readers(bench_read, model, gz, 1, inflater).values()) == {"hdf5"}
    for batch, pread in ((4, True), (5, True), (5, False)):   # windows that cut tiles in time
        got = dumped_frames(bench_read, model, gz, tmp_path, 3, inflater, pread=pread, batch=batch)
        for cam, frames in images.items():   # every pixel as h5py reads it
            np.testing.assert_array_equal(got[cam], frames, err_msg=f"{cam}, tiles {shape}, windows of {batch}, "
                                          f"pread {pread}")
    # HDF5's own inflate, then the pool's (predict reads windows of 4 timesteps)
    assert_same_predictions(act_infer, model, raw, gz, tmp_path, (1, 3), inflater, what=f"tiles {shape}, {want}")


@pytest.mark.parametrize("tile", ["appended", True, (3, 8, 16, 1), (2, 7, 5, 2), (4, 16, 10, 3), "userblock"],
                         ids=["appended", "h5py-auto", "3x8x16x1", "2x7x5x2", "4x16x10x3", "userblock"])
def test_uncompressed_tiles_give_hdf5s_frames(act_infer, bench_read, episode_data, tmp_path, tile):
    """tiles stored without gzip - what h5py makes of a resizable dataset, the way a recorder
    appends frames one at a time - are copied into place on the pool (HDF5 scatters them into
    interleaved pixels a byte at a time): every pixel equals HDF5's own read"""
    model, qpos, action, images = episode_data
    raw, tiled = tmp_path / "raw.hdf5", tmp_path / "tiles.hdf5"
    write_episode(raw, qpos, action, images)
    if tile == "appended":   # maxshape (None, ...): h5py picks the chunks
        with h5py.File(tiled, "w") as f:
            f["action"] = action
            f["observations/qpos"] = qpos
            for cam, frames in images.items():
                d = f.create_dataset(f"observations/images/{cam}", shape=(0,) + frames.shape[1:],
                                     maxshape=(None,) + frames.shape[1:], dtype=np.uint8)
                for t in range(len(frames)):
                    d.resize(t + 1, axis=0)
                    d[t] = frames[t]
    elif tile == "userblock":   # 1024 bytes before HDF5's: the chunk table's addresses count from its end
        write_episode(tiled, qpos, action, images, chunk=(3, 8, 16, 1), userblock=1024)
    else:
        write_episode(tiled, qpos, action, images, chunk=tile)
    with h5py.File(tiled, "r") as f:
        d = f[f"observations/images/{next(iter(images))}"]
        shape = d.chunks
        assert d.compression is None and shape[1:] != d.shape[1:], "uncompressed tiles expected"
    want = f"pool, raw chunks of ({', '.join(map(str, shape))})"
    # fetched by pread at the chunk table's places (episode_index.c), or through H5Dread_chunk
    assert set(readers(bench_read, model, tiled, 3).values()) == {want + ", pread"}
    assert set(readers(bench_read, model, tiled, 3, pread=False).values()) == {want}
    assert set(readers(bench_read, model, tiled, 1).values()) == {"hdf5"}
    for batch, pread in ((4, True), (5, True), (5, False)):   # windows that cut tiles in time
        got = dumped_frames(bench_read, model, tiled, tmp_path, 3, pread=pread, batch=batch)
        for cam, frames in images.items():   # every pixel as h5py reads it
            np.testing.assert_array_equal(got[cam], frames, err_msg=f"{cam}, tiles {shape}, windows of {batch}, "
                                          f"pread {pread}")
    # HDF5's own path, then the pool's
    assert_same_predictions(act_infer, model, raw, tiled, tmp_path, (1, 3), what=f"tiles {shape}")


@pytest.mark.parametrize("gzip", [False, True], ids=["raw", "gzip"])
def test_pixels_of_fewer_bits_are_hdf5s_conversion(bench_read, episode_data, tmp_path, gzip):
    """a 1-byte unsigned type of 4 bits at offset 2 is stored as (v << 2) and read by HDF5 as v:
    the pool, which copies stored bytes, leaves such a camera to HDF5 (review, session 31)"""
    model, qpos, action, images = episode_data
    ep = tmp_path / "bits.hdf5"
    cam = next(iter(images))
    values = {c: (f >> 4).astype(np.uint8) for c, f in images.items()}   # 4-bit values
    with h5py.File(ep, "w") as f:
        f["action"] = action
        f["observations/qpos"] = qpos
        for c, v in values.items():
            tid = h5py.h5t.STD_U8LE.copy()
            tid.set_precision(4)
            tid.set_offset(2)
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_chunk((2, 8, 8, 1))
            if gzip:
                dcpl.set_deflate(4)
            space = h5py.h5s.create_simple(v.shape)
            d = h5py.h5d.create(f["observations"].require_group("images").id, c.encode(), tid, space, dcpl=dcpl)
            d.write(h5py.h5s.ALL, h5py.h5s.ALL, v)
    with h5py.File(ep, "r") as f:
        d = f[f"observations/images/{cam}"]
        np.testing.assert_array_equal(d[()], values[cam])
        raw = d.id.read_direct_chunk((0, 0, 0, 0))[1]
        stored = np.frombuffer(zlib.decompress(raw) if gzip else raw, np.uint8)
        assert (stored == (values[cam][:2, :8, :8, 0].ravel() << 2)).all(), "the type's bits should sit at offset 2"
    assert set(readers(bench_read, model, ep, 3).values()) == {"hdf5"}
    got = dumped_frames(bench_read, model, ep, tmp_path, 3)
    for c, v in values.items():
        np.testing.assert_array_equal(got[c], v, err_msg=c)


def test_a_corrupt_gzip_tile_is_named_by_its_origin(act_infer, episode_data, tmp_path, inflater):
    model, qpos, action, images = episode_data
    gz = tmp_path / "tiles.hdf5"
    write_episode(gz, qpos, action, images, chunk=(3, 8, 16, 1), gzip=True)
    cam = next(iter(images))
    with h5py.File(gz, "r") as f:
        info = f[f"observations/images/{cam}"].id.read_direct_chunk((6, 8, 16, 2))
        ds = f[f"observations/images/{cam}"]
        loc = next(ds.id.get_chunk_info(i) for i in range(ds.id.get_num_chunks())
                   if ds.id.get_chunk_info(i).chunk_offset == (6, 8, 16, 2))
    assert info[1]
    data = bytearray(gz.read_bytes())
    mid = loc.byte_offset + loc.size // 2
    data[mid:mid + 16] = bytes(255 - b for b in data[mid:mid + 16])
    gz.write_bytes(bytes(data))
    p = predict(act_infer, model, gz, tmp_path / "x.npy", 3, inflater)
    assert p.returncode != 0
    assert f"observations/images/{cam}" in p.stderr and "the gzip chunk at (6, 8, 16, 2)" in p.stderr, p.stderr
    assert "corrupt" in p.stderr and f"({inflater}: " in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "x.npy").exists()


def test_a_corrupt_gzip_chunk_is_a_clear_error(act_infer, episode_data, tmp_path, inflater):
    model, qpos, action, images = episode_data
    gz = tmp_path / "gz.hdf5"
    write_episode(gz, qpos, action, images, chunk=1, gzip=True)
    cam = next(iter(images))
    with h5py.File(gz, "r") as f:
        info = f[f"observations/images/{cam}"].id.get_chunk_info(6)   # the chunk of timestep 6
    data = bytearray(gz.read_bytes())
    mid = info.byte_offset + info.size // 2
    data[mid:mid + 16] = bytes(255 - b for b in data[mid:mid + 16])
    gz.write_bytes(bytes(data))
    p = predict(act_infer, model, gz, tmp_path / "x.npy", 3, inflater)
    assert p.returncode != 0
    assert f"observations/images/{cam}" in p.stderr and "timestep 6" in p.stderr and "corrupt" in p.stderr, p.stderr
    assert f"({inflater}: " in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "x.npy").exists()
    p = predict(act_infer, model, gz, tmp_path / "y.npy", 1)   # HDF5's own path: refused at open (episode_check.c)
    assert p.returncode != 0 and "the chunk at (6, 0, 0, 0) is not a valid gzip stream" in p.stderr, p.stderr


@pytest.mark.parametrize("chunk, short, empty", [(1, (0, 0, 0, 0), (2, 0, 0, 0)),
                                                  ((3, 8, 16, 1), (0, 0, 0, 0), (0, 8, 16, 2))],
                         ids=["frames", "tiles"])
def test_a_gzip_chunk_indexed_at_0_bytes_is_refused_at_open(act_infer, episode_data, tmp_path, chunk, short, empty, chunk_lookup):
    """a damaged chunk index that gives a gzip chunk 0 stored bytes: the pool takes it for a chunk
    never written and leaves its whole read window to HDF5, so the open's check, which left the
    pool's chunks out, must check them all: else a chunk in that window that inflates to a quarter
    of a chunk went to HDF5 1.10 unchecked, which copied a whole chunk out of the shorter buffer
    (ASan: heap-buffer-overflow in H5Dread; without it, a read of heap bytes)"""
    model, qpos, action, images = episode_data
    gz = tmp_path / "gz.hdf5"
    write_episode(gz, qpos, action, images, chunk=chunk, gzip=True)
    cam = next(iter(images))
    with h5py.File(gz, "r+") as f:
        ds = f[f"observations/images/{cam}"]
        ds.id.write_direct_chunk(short, zlib.compress(bytes(int(np.prod(ds.chunks)) // 4)), filter_mask=0)
        info = ds.id.get_chunk_info_by_coord(empty)
    # the chunk's v1 B-tree key: its stored size, filter mask, and origin (one more 0 for the type);
    # a tree of more than one level holds it in a parent node too: each copy is zeroed
    key = struct.pack("<II", info.size, info.filter_mask) + struct.pack("<5Q", *empty, 0)
    data = bytearray(gz.read_bytes())
    at, found = data.find(key), 0
    while at >= 0:
        data[at:at + 4] = bytes(4)
        found += 1
        at = data.find(key, at + 1)
    assert 1 <= found <= 3, f"the chunk's index entry was found {found} times"
    gz.write_bytes(bytes(data))
    with h5py.File(gz, "r") as f:
        assert f[f"observations/images/{cam}"].id.get_chunk_info_by_coord(empty).size == 0
    for threads in (3, 1):   # the pool's path (predict's windows of 4 hold both chunks), HDF5's own
        p = predict(act_infer, model, gz, tmp_path / "x.npy", threads)
        assert p.returncode != 0 and f"observations/images/{cam}" in p.stderr, p.stderr
        assert "the chunk at (0, 0, 0, 0) inflates to " in p.stderr and "(damaged file)" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and not (tmp_path / "x.npy").exists()


def test_an_unknown_inflater_is_named(act_infer, episode_data, tmp_path):
    model, qpos, action, images = episode_data
    gz = tmp_path / "gz.hdf5"
    write_episode(gz, qpos, action, images, chunk=1, gzip=True)
    for threads in (3, 1):   # refused at open, whichever path the frames would take
        p = predict(act_infer, model, gz, tmp_path / "x.npy", threads, "gunzip")
        assert p.returncode != 0 and "ACT_EPISODE_INFLATE='gunzip' names no inflater" in p.stderr, p.stderr
        assert not (tmp_path / "x.npy").exists()


@pytest.mark.parametrize("layout", [{"chunk": (3, 8, 16, 1)}, {"chunk": (3, 8, 16, 1), "gzip": True},
                                    {"chunk": 3}, {"chunk": 3, "gzip": True}, {"chunk": (3, 8, 16, 1), "userblock": 512}],
                         ids=["raw-tiles", "gzip-tiles", "raw-frames", "gzip-frames", "raw-tiles-userblock"])
def test_a_chunk_table_off_by_a_byte_is_caught_at_open(bench_read, episode_data, tmp_path, monkeypatch, layout):
    """The chunk table read from the file (episode_index.c) is only used for pread where the
    first and last frames read at its places equal HDF5's. ACT_EPISODE_INDEX_SKEW=1 moves every
    place it names by a byte while HDF5 still agrees with its addresses: the open must then fall
    back (no pread in the reader's name) and every frame must still be right. Chunks of 3 frames
    over T = 11: the last frame's chunk is cut short, and a row of tiles HDF5's check read is
    still cached when the table's read comes (review of session 32: the check compared HDF5's
    bytes with themselves)."""
    model, qpos, action, images = episode_data
    ep = tmp_path / "ep.hdf5"
    write_episode(ep, qpos, action, images, **layout)
    good = readers(bench_read, model, ep, 3)
    assert all("pread" in r for r in good.values()), good
    monkeypatch.setenv("ACT_EPISODE_INDEX_SKEW", "1")
    skewed = readers(bench_read, model, ep, 3)
    assert all("pread" not in r for r in skewed.values()), skewed
    for batch in (4, 5):
        got = dumped_frames(bench_read, model, ep, tmp_path, 3, batch=batch)
        for cam, frames in images.items():
            np.testing.assert_array_equal(got[cam], frames, err_msg=f"{cam}, {layout}, windows of {batch}")


@pytest.mark.parametrize("layout", ["gzip", "raw-tiles", "raw"])
def test_a_one_core_host_reads_on_the_pool(act_infer, bench_read, episode_data, tmp_path, layout):
    """a host (or container) of one usable core: the pool runs its one thread inline, still
    inflating each gzip chunk once with libdeflate (HDF5's path inflates it at open and again at
    the read, with zlib) and copying raw tiles whole; ACT_EPISODE_THREADS=1 keeps HDF5's path"""
    if not shutil.which("taskset"):
        pytest.skip("no taskset")
    model, qpos, action, images = episode_data
    raw, ep = tmp_path / "raw.hdf5", tmp_path / f"{layout}.hdf5"
    write_episode(raw, qpos, action, images)
    write_episode(ep, qpos, action, images, **{"gzip": {"chunk": 1, "gzip": True},
                                              "raw-tiles": {"chunk": (3, 8, 16, 1)}, "raw": {"chunk": 1}}[layout])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACT_EPISODE_")}
    one = ["taskset", "-c", "0"]
    p = subprocess.run(one + [str(bench_read), "--model", str(model), "--episodes", str(ep), "--rounds", "1"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    how = {line.split(":", 1)[1].strip() for line in p.stdout.splitlines() if line.startswith("reader")}
    want = {"gzip": "gzip chunks of 1 frames, pread", "raw-tiles": "pool, raw chunks of (3, 8, 16, 1), pread",
            "raw": "pread, chunks of 1 frames"}[layout]
    assert len(how) == 1 and how.pop().endswith(want), p.stdout
    p = subprocess.run(one + [str(act_infer), "predict", "--model", str(model), "--episode", str(raw), "--out",
                              str(tmp_path / "want.npy"), "--device", "cpu"], capture_output=True, text=True,
                       timeout=600, env=env)
    assert p.returncode == 0, p.stderr
    p = subprocess.run(one + [str(act_infer), "predict", "--model", str(model), "--episode", str(ep), "--out",
                              str(tmp_path / "got.npy"), "--device", "cpu"], capture_output=True, text=True,
                       timeout=600, env=env)
    assert p.returncode == 0, p.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "got.npy"), np.load(tmp_path / "want.npy"))
    assert set(readers(bench_read, model, ep, 1).values()) == {"hdf5"}
