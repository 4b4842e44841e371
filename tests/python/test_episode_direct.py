"""Raw frames read with pread on the pool's threads (engine/episode_direct.c) are exactly the
frames HDF5's own path gives (ACT_EPISODE_THREADS=1): contiguous datasets, chunks of one and of
three frames (windows of 4 cut them), files with a user block before HDF5's data, and chunks
never written (left to HDF5, which fills them). bench_episode_read names the path each camera
took, so a silent fallback to HDF5 fails these tests instead of passing them. A file cut short
is a clear error, never a crash or made-up frames: HDF5 refuses it at open (its stored end of
file says so), before any pread; a file cut after it was opened, where the pread path meets the
end of the file, is tests/test_episode_reader.c's case."""

from __future__ import annotations

import json
import subprocess

import h5py
import numpy as np
import pytest
from episode_util import make_episode_data, predict, readers, write_episode


@pytest.fixture
def episode_data(make_model, make_cfg, tmp_path, rng):
    return make_episode_data(make_model, make_cfg, tmp_path, rng)


LAYOUTS = {   # name: (write_episode arguments, the reader every camera must take)
    "contiguous": ({}, "pread, contiguous"),
    "chunks-1": ({"chunk": 1}, "pread, chunks of 1 frames"),
    "chunks-3": ({"chunk": 3}, "pread, chunks of 3 frames"),
    "contiguous-userblock": ({"userblock": 512}, "pread, contiguous"),
    "chunks-3-userblock": ({"chunk": 3, "userblock": 1024}, "pread, chunks of 3 frames"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_pread_gives_hdf5s_frames(act_infer, bench_read, episode_data, tmp_path, layout):
    model, qpos, action, images = episode_data
    kw, want_reader = LAYOUTS[layout]
    ep = tmp_path / "ep.hdf5"
    write_episode(ep, qpos, action, images, **kw)
    assert set(readers(bench_read, model, ep, 3).values()) == {want_reader}
    assert set(readers(bench_read, model, ep, 1).values()) == {"hdf5"}
    assert set(readers(bench_read, model, ep, 3, pread=False).values()) == {"hdf5"}   # ACT_EPISODE_PREAD=0
    p = predict(act_infer, model, ep, tmp_path / "want.npy", 1)
    assert p.returncode == 0, p.stderr
    p = predict(act_infer, model, ep, tmp_path / "got.npy", 3)
    assert p.returncode == 0, p.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "got.npy"), np.load(tmp_path / "want.npy"), err_msg=layout)


def test_unwritten_chunks_are_refused(act_infer, episode_data, tmp_path):
    """A camera whose chunk [4, 6) was never stored (a recorder stopped, or skipped a write):
    HDF5 would read those frames as zeros and the model would score them; the open refuses the
    file instead, naming the dataset, on the pool's readers and on HDF5's alike."""
    model, qpos, action, images = episode_data
    ep = tmp_path / "ep.hdf5"
    write_episode(ep, qpos, action, images, chunk=2, unwritten=(4, 5))
    for threads in (3, 1):
        out = tmp_path / f"x{threads}.npy"
        p = predict(act_infer, model, ep, out, threads)
        assert p.returncode != 0, f"{threads} threads: frames never written were read"
        assert "ep.hdf5" in p.stderr and "observations/images/" in p.stderr and "never written" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and not out.exists()
    # the same episode fully written is read
    full = tmp_path / "full.hdf5"
    write_episode(full, qpos, action, images, chunk=2)
    p = predict(act_infer, model, full, tmp_path / "full.npy", 3)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("layout", ["contiguous", "chunks-3"])
def test_a_truncated_file_is_refused_at_open(act_infer, episode_data, tmp_path, layout):
    model, qpos, action, images = episode_data
    ep = tmp_path / "ep.hdf5"
    write_episode(ep, qpos, action, images, **LAYOUTS[layout][0])
    data = ep.read_bytes()
    ep.write_bytes(data[:len(data) * 2 // 3])   # HDF5's metadata sits at the start: frames go missing
    assert_refused(act_infer, model, ep, tmp_path, "truncated", f"{layout}: a truncated file")


def assert_refused(act_infer, model, ep, tmp_path, words, what):
    """act-infer predict refuses episode ep on the pool's readers and on HDF5's own, naming the
    file and saying `words`, with no traceback and no output written"""
    for threads in (3, 1):
        out = tmp_path / f"x{threads}.npy"
        p = predict(act_infer, model, ep, out, threads)
        assert p.returncode != 0, f"{what} was read ({threads} threads)"
        assert ep.name in p.stderr and words in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and not out.exists()


def lower_inner_keys(path, by=10):
    """Lowers the time offset of key 1 in every inner node (level 1, two entries or more) of the
    file's version 1 chunk B-trees (8-byte addresses): the leaves still list every chunk, but
    HDF5's search for a chunk just below the lowered key now goes down the wrong child and finds
    nothing. Returns the nodes changed."""
    b = bytearray(path.read_bytes())
    i = n = 0
    while (i := b.find(b"TREE", i)) >= 0:
        if b[i + 4] == 1 and b[i + 5] == 1 and int.from_bytes(b[i + 6:i + 8], "little") >= 2:
            # header 24 bytes (signature, type, level, entries, two siblings), key 0 (size, mask,
            # 5 offsets: 48 bytes), child 0 (8): key 1's time offset 8 bytes into key 1
            at = i + 24 + 48 + 8 + 8
            t = int.from_bytes(b[at:at + 8], "little")
            b[at:at + 8] = (t - by).to_bytes(8, "little")
            n += 1
        i += 4
    path.write_bytes(bytes(b))
    return n


def test_a_damaged_inner_btree_key_is_refused_at_open(act_infer, episode_data, tmp_path):
    """A chunk index whose leaves list every chunk but whose inner key is wrong: the listing (the
    chunk table, H5Dget_chunk_info_by_coord, H5Dget_num_chunks) sees every frame, HDF5's own read
    finds some of them missing and returns zeros. Before, the pool's readers read the stored
    frames and HDF5's path zeros, so predictions differed with the thread count; now the open
    refuses the file on both, naming the chunk."""
    model, qpos, action, images = episode_data
    T = 150   # 150 chunks of one frame: three leaves of 64 entries under one inner node
    rng = np.random.default_rng(5)
    big = {c: rng.integers(1, 255, (T,) + f.shape[1:], dtype=np.uint8) for c, f in images.items()}
    q = np.resize(qpos, (T, qpos.shape[1]))
    a = np.resize(action, (T, action.shape[1]))
    ep = tmp_path / "ep.hdf5"
    write_episode(ep, q, a, big, chunk=1, resizable=True)
    assert lower_inner_keys(ep) == len(big)
    assert_refused(act_infer, model, ep, tmp_path, "damaged index", "an index HDF5 cannot search")


def test_eval_names_each_cameras_reader(act_infer, episode_data, tmp_path):
    """An episode whose cameras are stored differently: eval's summary groups the cameras by how
    their frames were read (config order), so a slow camera is named, not averaged away."""
    model, qpos, action, images = episode_data
    cams = list(images)
    assert len(cams) >= 2
    ep = tmp_path / "episode_0.hdf5"
    write_episode(ep, qpos, action, images)   # contiguous, then the second camera gzip'd instead
    with h5py.File(ep, "a") as f:
        name = f"observations/images/{cams[1]}"
        del f[name]
        f.create_dataset(name, data=images[cams[1]], chunks=(1,) + images[cams[1]].shape[1:], compression="gzip")
    out = tmp_path / "eval.json"
    p = subprocess.run([str(act_infer), "eval", "--model", str(model), "--episodes", str(ep), "--device", "cpu",
                        "--batch", "4", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    reader = json.loads(out.read_text())["episodes"][0]["reader"]
    raw = ", ".join(c for i, c in enumerate(cams) if i != 1)
    assert reader.startswith(f"{raw}: pread, contiguous; {cams[1]}: "), reader
    assert reader.endswith("gzip chunks of 1 frames, pread"), reader
    assert f"frames read: {reader}\n" in p.stdout, p.stdout
