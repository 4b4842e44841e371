"""End-to-end parity of the CPU engine with the PyTorch reference, through the real tools:
tools/act_reference.py makes a randomized roboimi checkpoint, tools/convert_checkpoint.py turns
it into .actw, `act-infer predict --device cpu --posterior-dir` runs the engine over a synthetic
episode, and the reference runs the same frames and qpos.

Compared, each as ||engine - reference|| / ||reference|| <= 1e-4 (fp32):
  the prior chunk (z = 0), and the CVAE posterior on the recorded targets action[t:t+H] (padded
  with the last action, is_pad past the episode end): mu, logvar, per-sample KL and the chunk
  decoded from z = mu.
for: BatchNorm shared trunk, GroupNorm shared trunk, separate trunks (BN and GN), mean_std
normalization, crop + ImageNet preprocessing, and the full act_resnet size. Batches are chosen so
the last one is partial (a second batch size, so a second step shape). Episodes run past the
horizon's end, so the key-padding mask is exercised."""

from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest

import act_reference
import make_episodes

TOL = 1e-4


def rel(a, b):
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def targets_of(action, H):
    T = len(action)
    idx = np.arange(T)[:, None] + np.arange(H)[None, :]
    return action[np.minimum(idx, T - 1)], idx >= T


def run_case(ck, act_infer, repo_root, tmp_path, T, batch, seed):
    cfg = ck.cfg
    actw = tmp_path / "model.actw"
    subprocess.run([sys.executable, str(repo_root / "tools" / "convert_checkpoint.py"), str(ck.ckpt), "-o",
                    str(actw), "--config", str(ck.config), "--stats", str(ck.stats)],
                   check=True, capture_output=True, timeout=600)
    h, w = cfg["vision_backbone"]["image_shape"]
    ep = tmp_path / "episode_0.hdf5"
    make_episodes.make_episode(str(ep), T, h, w, list(cfg["camera_names"]), False, True, seed=seed,
                               obs_dim=cfg["obs_dim"], action_dim=cfg["action_dim"])
    pdir = tmp_path / "post"
    pdir.mkdir()
    out = tmp_path / "prior.npy"
    p = subprocess.run([str(act_infer), "predict", "--model", str(actw), "--episode", str(ep), "--out", str(out),
                        "--device", "cpu", "--batch", str(batch), "--posterior-dir", str(pdir)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"act-infer predict failed ({p.returncode}):\n{p.stderr}"

    with h5py.File(ep, "r") as f:
        action = f["action"][:].astype(np.float32)
        qpos = f["observations/qpos"][:].astype(np.float32)
        images = {c: f[f"observations/images/{c}"][:] for c in cfg["camera_names"]}
    tgt, is_pad = targets_of(action, cfg["pred_horizon"])
    assert is_pad.any() and not is_pad.all()
    ref = act_reference.posterior(ck.agent, qpos, images, tgt, is_pad)

    got = {"prior": np.load(out), "mu": np.load(pdir / "mu.npy"), "logvar": np.load(pdir / "logvar.npy"),
           "kl": np.load(pdir / "kl.npy"), "actions": np.load(pdir / "post_actions.npy")}
    errors = {}
    for key, value in got.items():
        assert value.shape == ref[key].shape, f"{key}: shape {value.shape}, reference {ref[key].shape}"
        errors[key] = rel(value, ref[key])
    print("relative errors:", {k: f"{v:.2e}" for k, v in errors.items()})
    bad = {k: v for k, v in errors.items() if not v <= TOL}
    assert not bad, f"beyond {TOL}: {bad} (all: {errors})"
    # the two decodes differ (z = 0 vs z = mu): the posterior path is really taken
    assert rel(got["actions"], got["prior"]) > 1e-3


CASES = {
    "bn_shared": {},
    "gn_shared": {"norm": "gn"},
    "bn_separate": {"separate_trunks": True},
    "gn_separate": {"norm": "gn", "separate_trunks": True},
    "mean_std": {"normalization": "mean_std"},
    "crop_imagenet": {"crop_shape": [56, 48], "image_normalization": "imagenet"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_small_model_matches_reference(case, tmp_ckpt, act_infer, repo_root, tmp_path):
    ck = tmp_ckpt(seed=5 + sorted(CASES).index(case), **CASES[case])
    run_case(ck, act_infer, repo_root, tmp_path, T=9, batch=4, seed=21)


def test_full_act_resnet_matches_reference(tmp_ckpt, act_infer, repo_root, tmp_path):
    """The real size: 3 cameras of 256x256, ResNet18 at 224x224, hidden 256, 4 + 6 layers."""
    ck = tmp_ckpt(seed=2, base="full")
    assert ck.cfg["head"]["hidden_dim"] == 256 and ck.cfg["vision_backbone"]["image_shape"] == [256, 256]
    run_case(ck, act_infer, repo_root, tmp_path, T=3, batch=2, seed=4)
