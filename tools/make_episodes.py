#!/usr/bin/env python3
"""make_episodes.py - synthetic socket-peg-shaped HDF5 episodes (roboimi layout).

Each episode_<i>.hdf5 holds `action` (T, A) float32, `observations/qpos` (T, D) float32 and
`observations/images/<cam>` (T, H, W, 3) uint8, like the recorded sim_transfer data. The
content is made to exercise an engine the way real data would, not to be learnable:
joint trajectories are smooth sums of sines, actions lead qpos by a step (a position-control
target) plus small noise, and each camera sees a smooth two-colour gradient background, a
"socket" and a "peg" whose positions and sizes follow the qpos trajectory, a moving light
spot, and pixel noise - never a constant image. Deterministic per seed and episode index.

  make_episodes.py --out DIR --episodes N --T 40 --image-size 256 --seed S
                   [--cameras l_vis,r_vis,front] [--gzip] [--chunked|--contiguous] [--start-index 0]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import h5py
import numpy as np

DEFAULT_CAMERAS = ("l_vis", "r_vis", "front")


def _trajectory(rng: np.random.Generator, T: int, dim: int) -> np.ndarray:
    """Smooth joint trajectories: 3 sines per joint with random amplitude, frequency and phase."""
    t = np.arange(T + 1, dtype=np.float64)[:, None]
    out = rng.uniform(-0.5, 0.5, size=(1, dim))
    for _ in range(3):
        amp = rng.uniform(0.05, 0.6, size=(1, dim))
        freq = rng.uniform(0.02, 0.25, size=(1, dim))
        phase = rng.uniform(0, 2 * np.pi, size=(1, dim))
        out = out + amp * np.sin(freq * t + phase)
    return out


def _render(rng: np.random.Generator, q: np.ndarray, cam: int, H: int, W: int, base: np.ndarray) -> np.ndarray:
    """One frame for camera `cam` at joint state q (values roughly in [-2, 2])."""
    yy, xx = np.meshgrid(np.linspace(0, 1, H, dtype=np.float32), np.linspace(0, 1, W, dtype=np.float32), indexing="ij")
    c0, c1 = base[0], base[1]
    mix = (0.6 * xx + 0.4 * yy)[..., None]
    img = c0 * (1 - mix) + c1 * mix                                        # background gradient
    d = len(q)

    def coord(i, lo=0.15, hi=0.85):
        return lo + (hi - lo) * (0.5 + 0.25 * np.tanh(q[(i + 3 * cam) % d]))

    sx, sy = coord(0), coord(1)                                           # socket: ring
    r = np.sqrt((xx - sx) ** 2 + (yy - sy) ** 2)
    ring = ((r > 0.06) & (r < 0.11)).astype(np.float32)[..., None]
    img = img * (1 - ring) + ring * np.array([0.2, 0.25, 0.8], np.float32)
    px, py = coord(2), coord(3)                                           # peg: rotated-ish bar
    half_w, half_h = 0.03 + 0.02 * (0.5 + 0.5 * np.tanh(q[4 % d])), 0.09
    bar = ((np.abs(xx - px) < half_w) & (np.abs(yy - py) < half_h)).astype(np.float32)[..., None]
    img = img * (1 - bar) + bar * np.array([0.9, 0.35, 0.1], np.float32)
    lx, ly = coord(5, 0.0, 1.0), coord(6, 0.0, 1.0)                       # light spot
    img = img + 0.25 * np.exp(-((xx - lx) ** 2 + (yy - ly) ** 2) / 0.02)[..., None]
    img = img + rng.normal(0, 0.02, size=img.shape).astype(np.float32)  # sensor noise
    return np.clip(img * 255.0 + 0.5, 0, 255).astype(np.uint8)


def make_episode(path: str, T: int, H: int, W: int, cams: Sequence[str] = DEFAULT_CAMERAS, gzip: bool = False,
                 chunked: bool = True, seed: int = 0, obs_dim: int = 16, action_dim: int = 16) -> None:
    """Write one episode file; identical bytes of data for identical arguments."""
    if gzip and not chunked:
        raise ValueError("gzip needs chunked datasets (HDF5 filters only apply to chunked storage)")
    if T < 1 or H < 1 or W < 1:
        raise ValueError(f"T, H, W must be positive, got {T}, {H}, {W}")
    rng = np.random.default_rng(seed)
    traj = _trajectory(rng, T, max(obs_dim, action_dim))
    qpos = traj[:T, :obs_dim].astype(np.float32)
    action = (traj[1:T + 1, :action_dim] + rng.normal(0, 0.01, size=(T, action_dim))).astype(np.float32)
    kw = {}
    if chunked:
        kw["chunks"] = (1, H, W, 3)
    if gzip:
        kw.update(compression="gzip", compression_opts=4)
    with h5py.File(path, "w") as f:
        f.attrs["sim"] = True
        f.create_dataset("action", data=action)
        obs = f.create_group("observations")
        obs.create_dataset("qpos", data=qpos)
        grp = obs.create_group("images")
        for ci, cam in enumerate(cams):
            base = rng.uniform(0.1, 0.9, size=(2, 3)).astype(np.float32)
            ds = grp.create_dataset(cam, shape=(T, H, W, 3), dtype=np.uint8, **kw)
            for t in range(T):
                ds[t] = _render(rng, qpos[t], ci, H, W, base)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write synthetic socket-peg-shaped HDF5 episodes.")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--episodes", type=int, default=1)
    ap.add_argument("--T", type=int, default=40, help="timesteps per episode")
    ap.add_argument("--image-size", type=int, default=256)
    ap.add_argument("--cameras", default=",".join(DEFAULT_CAMERAS))
    ap.add_argument("--obs-dim", type=int, default=16)
    ap.add_argument("--action-dim", type=int, default=16)
    ap.add_argument("--gzip", action="store_true")
    layout = ap.add_mutually_exclusive_group()
    layout.add_argument("--chunked", dest="chunked", action="store_true", default=True)
    layout.add_argument("--contiguous", dest="chunked", action="store_false")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start-index", type=int, default=0)
    args = ap.parse_args(argv)
    if args.gzip and not args.chunked:
        ap.error("--gzip needs --chunked")
    os.makedirs(args.out, exist_ok=True)
    cams = [c for c in args.cameras.split(",") if c]
    for i in range(args.start_index, args.start_index + args.episodes):
        path = os.path.join(args.out, f"episode_{i}.hdf5")
        make_episode(path, args.T, args.image_size, args.image_size, cams, args.gzip, args.chunked,
                     seed=args.seed * 100003 + i, obs_dim=args.obs_dim, action_dim=args.action_dim)
        print(f"make_episodes: wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
