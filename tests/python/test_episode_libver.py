"""Episodes written with h5py's libver="latest" (what a recorder writing with SWMR makes): their
chunk indexes are layout version 4's (an extensible array for a dataset appended in time, a fixed
array for a fixed one, a single-chunk index for one chunk), not the version 1 B-tree of a default
file. Every reader path must deliver h5py's frames byte for byte, and refuse chunks never written.

Which path a camera takes depends on how the build lists chunks (engine/episode_index.h), which
bench_episode_read prints on its "library" line:
  - "H5Dchunk_iter" (HDF5 1.10.10+, 1.14+): HDF5 lists every chunk once, the table is kept, and
    frames are fetched by pread as in a default file;
  - "walked" (HDF5 1.10.5-1.10.9): the walk reads no version 4 index, so there is no table, and
    the reader must not ask HDF5 each chunk's place by coordinates (1.10 walks the whole index per
    lookup: a 2500-frame episode read at ~650 timesteps/s that way): whole raw frames are read by
    HDF5 itself, gzip chunks and tiles fetched through H5Dread_chunk (no ", pread").
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
from episode_util import dumped_frames, make_episode_data, predict, reader_env, readers, write_episode


@pytest.fixture
def episode_data(make_model, make_cfg, tmp_path, rng):
    return make_episode_data(make_model, make_cfg, tmp_path, rng)


def chunk_table(bench_read, model, ep):
    """how this build lists chunks: 'H5Dchunk_iter', 'walked' or 'none'"""
    p = subprocess.run([str(bench_read), "--model", str(model), "--episodes", str(ep), "--rounds", "1"],
                       capture_output=True, text=True, timeout=300, env=reader_env(3))
    assert p.returncode == 0, p.stderr
    m = re.search(r"^library HDF5 [0-9.]+ \(built against [0-9.]+\), chunk table: (\S+)$", p.stdout, re.M)
    assert m, p.stdout
    return m.group(1)


# name: (write_episode arguments, the reader with a table, without one); {inf} is the inflater
LAYOUTS = {
    "appended frames (extensible array)": ({"chunk": 1, "resizable": True},
                                           "pread, chunks of 1 frames", "hdf5"),
    "fixed, 3 frames a chunk (fixed array)": ({"chunk": 3}, "pread, chunks of 3 frames", "hdf5"),
    "appended gzip frames": ({"chunk": 1, "gzip": True, "resizable": True},
                             "{inf}, gzip chunks of 1 frames, pread", "{inf}, gzip chunks of 1 frames"),
    "appended raw tiles": ({"chunk": (2, 8, 8, 1), "resizable": True},
                           "pool, raw chunks of (2, 8, 8, 1), pread", "pool, raw chunks of (2, 8, 8, 1)"),
    "appended, user block": ({"chunk": 1, "resizable": True, "userblock": 1024},
                             "pread, chunks of 1 frames", "hdf5"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_libver_latest_frames_are_hdf5s(bench_read, episode_data, tmp_path, layout):
    model, qpos, action, images = episode_data
    kw, with_table, without = LAYOUTS[layout]
    ep = tmp_path / "ep.hdf5"
    write_episode(ep, qpos, action, images, libver="latest", **kw)
    how = chunk_table(bench_read, model, ep)
    got = set(readers(bench_read, model, ep, 3).values())
    assert len(got) == 1, got
    name = got.pop()
    inf = name.split(",")[0]
    want = (with_table if how == "H5Dchunk_iter" else without).format(inf=inf)
    assert name == want, f"{layout}: {how} build: read by '{name}', want '{want}'"
    if "{inf}" in with_table:
        assert inf in ("libdeflate", "zlib"), name
    for threads in (3, 1):   # the pool's paths, and HDF5's own
        frames = dumped_frames(bench_read, model, ep, tmp_path, threads)
        for cam, want_frames in images.items():
            np.testing.assert_array_equal(frames[cam], want_frames, err_msg=f"{layout}, {threads} threads, {cam}")


@pytest.mark.parametrize("gzip", [False, True])
def test_libver_latest_unwritten_chunks_are_refused(act_infer, episode_data, tmp_path, gzip):
    """An extensible array with chunk [4, 6) never stored: the open refuses the file on every
    path, though without a table no chunk is looked up by coordinates."""
    model, qpos, action, images = episode_data
    ep = tmp_path / "ep.hdf5"
    write_episode(ep, qpos, action, images, chunk=2, gzip=gzip, resizable=True, unwritten=(4, 5), libver="latest")
    for threads in (3, 1):
        out = tmp_path / f"x{threads}.npy"
        p = predict(act_infer, model, ep, out, threads)
        assert p.returncode != 0, f"{threads} threads: frames never written were read"
        assert "never written" in p.stderr and "observations/images/" in p.stderr, p.stderr
        assert not out.exists()
