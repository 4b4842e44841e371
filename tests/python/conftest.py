"""Shared pytest fixtures: paths, built binaries, the PyTorch reference, small checkpoints and
synthetic episodes. Tests import nothing from each other; everything shared lives here.

  repo_root, build_dir        paths (build_dir: env ACT_BUILD_DIR, else <repo>/build)
  act_infer, act_serve        built binaries (skip with a reason when not built)
  ref                         tools/act_reference.py, imported
  rng                         numpy Generator seeded per test (seed printed on failure)
  make_cfg(...)               a small agent config with overrides (see small_cfg)
  make_model(dir, cfg, seed)  a randomized agent converted to dir/m.actw (session-scoped)
  tmp_ckpt(...)               small randomized checkpoint + agent.yaml + dataset_stats.pkl
  episode_factory(...)        a synthetic episode_<i>.hdf5 in tmp_path
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tools"))

import torch  # noqa: E402  (after sys.path so tools/ modules import the same torch)

torch.set_num_threads(2)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

import act_reference  # noqa: E402
import make_episodes  # noqa: E402


def pytest_configure(config):
    # torch 1.13's encoder fast path announces nested tensors on every padded batch.
    config.addinivalue_line("filterwarnings", "ignore:The PyTorch API of nested tensors")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def build_dir(repo_root) -> Path:
    return Path(os.environ.get("ACT_BUILD_DIR", str(repo_root / "build"))).resolve()


def _binary(build_dir: Path, name: str) -> Path:
    path = build_dir / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(f"{name} is not built at {path} (build with cmake, or set ACT_BUILD_DIR)")
    return path


@pytest.fixture(scope="session")
def act_infer(build_dir) -> Path:
    return _binary(build_dir, "act-infer")


@pytest.fixture(scope="session")
def act_serve(build_dir) -> Path:
    return _binary(build_dir, "act-serve")


@pytest.fixture(scope="session")
def bench_read(build_dir) -> Path:
    """bench/episode_read.c (built with HDF5): it names the path each camera's frames take"""
    return _binary(build_dir, "bench_episode_read")


@pytest.fixture(scope="session")
def ref():
    return act_reference


@pytest.fixture
def rng(request) -> np.random.Generator:
    """Random but reproducible per test: the seed is the CRC of the test id."""
    seed = zlib.crc32(request.node.nodeid.encode())
    request.node.user_properties.append(("rng_seed", seed))
    return np.random.default_rng(seed)


def default_signals():
    """For a child's preexec_fn: SIGHUP, SIGINT and SIGTERM at their default actions. A test run
    under nohup, or as a background job of a script, hands its children those signals ignored,
    and the programs keep an ignored signal ignored (as they should): a test that sends one
    must not depend on how the test run was started."""
    for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


@pytest.fixture(scope="session")
def hdf5(act_infer):
    """Episodes need a build with HDF5 (the GPU machine may build without it): skips otherwise."""
    v = subprocess.run([str(act_infer), "--version"], stdout=subprocess.PIPE, text=True).stdout
    if "hdf5" not in v:
        pytest.skip(f"act-infer was built without HDF5 ({v.strip()})")


def small_cfg(base: str = "small", **over) -> dict:
    """SMALL_CFG (or FULL_CFG with base='full') with shortcuts: norm='bn'|'gn', separate_trunks,
    normalization, image_size, crop_shape, image_normalization, cameras (list); any other keyword
    is a top-level key, and `head` / `vision_backbone` dicts are merged."""
    cfg = copy.deepcopy(act_reference.FULL_CFG if base == "full" else act_reference.SMALL_CFG)
    vb = cfg["vision_backbone"]
    if "norm" in over:
        vb["use_group_norm"] = over.pop("norm") == "gn"
    if "separate_trunks" in over:
        vb["use_separate_rgb_encoder_per_camera"] = bool(over.pop("separate_trunks"))
    if "normalization" in over:
        cfg["normalization_type"] = over.pop("normalization")
    if "image_size" in over:
        s = over.pop("image_size")
        vb["image_shape"] = [s, s]
    for key in ("crop_shape", "image_normalization"):
        if key in over:
            vb[key] = over.pop(key)
    if "cameras" in over:
        cfg["camera_names"] = list(over.pop("cameras"))
        cfg["num_cams"] = len(cfg["camera_names"])
    return act_reference.resolve_config(act_reference._merge(cfg, over))


@pytest.fixture(scope="session")
def make_cfg():
    """small_cfg as a fixture: make_cfg(norm='gn', ...) -> a resolved agent config dict."""
    return small_cfg


@pytest.fixture(scope="session")
def make_model(repo_root):
    """Factory: make_model(dir, cfg, seed) -> (m.actw path, agent): the randomized reference agent
    saved as a training checkpoint (dir/m.pt, dir/m.yaml) and converted by the real converter.
    Session-scoped, so module-scoped fixtures can build their model with it."""

    def make(d: Path, cfg: dict, seed: int):
        agent = act_reference.randomize_(act_reference.build_agent(cfg), seed)
        ckpt, yml, actw = d / "m.pt", d / "m.yaml", d / "m.actw"
        act_reference.save_checkpoint(agent, str(ckpt), cfg, config_path=str(yml))
        subprocess.run([sys.executable, str(repo_root / "tools" / "convert_checkpoint.py"), str(ckpt), "-o",
                        str(actw), "--config", str(yml)], check=True, stdout=subprocess.DEVNULL)
        return actw, agent

    return make


@pytest.fixture
def tmp_ckpt(tmp_path):
    """Factory: tmp_ckpt(seed=0, layout=..., stats_in=..., prefix=..., include_config=False,
    name='ckpt', base='small'|'full', **small_cfg shortcuts) -> namespace(ckpt, config, stats,
    agent, cfg). The agent is the randomized reference whose weights the files hold."""

    def make(seed=0, layout="model_state_dict", stats_in="state_dict", prefix="", include_config=False,
             name="ckpt", base="small", **over):
        cfg = small_cfg(base, **over)
        agent = act_reference.randomize_(act_reference.build_agent(cfg), seed)
        out = SimpleNamespace(ckpt=tmp_path / f"{name}.pt", config=tmp_path / f"{name}.yaml",
                              stats=tmp_path / f"{name}_dataset_stats.pkl", agent=agent, cfg=cfg)
        act_reference.save_checkpoint(agent, str(out.ckpt), cfg, layout=layout, stats_in=stats_in, prefix=prefix,
                                      stats_path=str(out.stats), config_path=str(out.config),
                                      include_config=include_config)
        return out

    return make


def episode_for(cfg: dict, path, T: int, gzip=False, chunked=True, seed=0):
    """A socket-peg-style HDF5 episode at path that fits model config cfg (its cameras, frame
    size, qpos and action widths): make_episodes.make_episode with cfg's shapes."""
    h, w = cfg["vision_backbone"]["image_shape"]
    make_episodes.make_episode(str(path), T, h, w, list(cfg["camera_names"]), gzip, chunked, seed=seed,
                               obs_dim=cfg["obs_dim"], action_dim=cfg["action_dim"])
    return Path(path)


@pytest.fixture
def episode_factory(tmp_path):
    """Factory: episode_factory(T=8, image_size=80, cams=SMALL_CFG cameras, gzip=False,
    chunked=True, seed=0, obs_dim=5, action_dim=4, index=0, dir=tmp_path/'episodes') -> path.
    Defaults fit SMALL_CFG; pass obs_dim=16, action_dim=16, image_size=256 for full size."""

    def make(T=8, image_size=80, cams=None, gzip=False, chunked=True, seed=0, obs_dim=5, action_dim=4,
             index=0, dir=None):
        d = Path(dir) if dir is not None else tmp_path / "episodes"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"episode_{index}.hdf5"
        cams = list(cams) if cams is not None else list(act_reference.SMALL_CFG["camera_names"])
        make_episodes.make_episode(str(path), T, image_size, image_size, cams, gzip, chunked, seed=seed,
                                   obs_dim=obs_dim, action_dim=action_dim)
        return path

    return make


@pytest.fixture(params=["by-coord", "by-size"])
def chunk_lookup(request, monkeypatch):
    """How the open's chunk check finds each chunk (engine/episode_check.c, locate): by its
    coordinates in HDF5's index, or by its stored size and raw bytes (what filtered datasets of
    4096 chunks or more take, since each lookup by coordinates walks the whole index in HDF5
    1.10); forced here for every filtered dataset (unfiltered ones always go by coordinates), so
    that both refuse the same damage and pass the same valid files"""
    monkeypatch.setenv("ACT_EPISODE_CHECK_LOOKUP", request.param)
    return request.param
