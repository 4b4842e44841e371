#!/usr/bin/env python3
"""eval_plots.py - one PNG per evaluated episode: what people look at instead of the numbers.

Run by `act-infer eval --plots DIR` (or by hand) on the predictions eval saved:
    eval_plots.py --predictions PRED_DIR --out PLOT_DIR [--summary SUMMARY.json]
                  [--obs-horizon O] EP.hdf5 ...
For each episode, PRED_DIR/<stem>.npy holds the prior chunks (T, H, A). The figure shows, per
joint, the recorded action against the action each chunk executes at its own timestep,
chunk[O-1] (O = obs_horizon: 1 by default, or the summary's), and below, the error over time:
|that action - recorded| averaged over joints, and the masked L1 of the whole chunk against
action[t-(O-1) : t-(O-1)+H] (docs/EVAL.md, "What is measured"). The title carries the episode's
metrics from the summary when one is given.
"""
import argparse
import json
import math
import os
import sys

import numpy as np


def chunk_error(pred, action, obs_horizon=1):
    """Mean |pred[t, k] - action[j]|, j = t - (obs_horizon-1) + k, over valid (k, joint) per
    timestep (0 <= j < T)."""
    T, H, _ = pred.shape
    err = np.zeros(T)
    for t in range(T):
        j0 = t - (obs_horizon - 1)
        lo, hi = max(0, -j0), min(H, T - j0)
        err[t] = np.abs(pred[t, lo:hi] - action[j0 + lo:j0 + hi]).mean() if hi > lo else np.nan
    return err


def plot_episode(path, pred, action, out_png, metrics, obs_horizon=1):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T, H, A = pred.shape
    cur = obs_horizon - 1   # the chunk step executed at its own timestep
    cols = min(4, A)
    rows = math.ceil(A / cols)
    fig = plt.figure(figsize=(4 * cols, 2.2 * rows + 2.6))
    gs = fig.add_gridspec(rows + 1, cols, height_ratios=[1] * rows + [1.2])
    t = np.arange(T)
    for j in range(A):
        ax = fig.add_subplot(gs[j // cols, j % cols])
        ax.plot(t, action[:, j], color="black", lw=1.2, label="recorded")
        ax.plot(t, pred[:, cur, j], color="tab:orange", lw=1.0, label=f"predicted (chunk[{cur}])")
        ax.set_title(f"joint {j}", fontsize=9)
        ax.tick_params(labelsize=7)
        if j == 0:
            ax.legend(fontsize=7, loc="best")
    ax = fig.add_subplot(gs[rows, :])
    ax.plot(t, np.abs(pred[:, cur] - action).mean(axis=1), color="tab:orange", lw=1.0,
            label=f"|chunk[{cur}] - recorded|, mean over joints")
    span = f"t:t+{H}" if cur == 0 else f"t-{cur}:t-{cur}+{H}"
    ax.plot(t, chunk_error(pred, action, obs_horizon), color="tab:blue", lw=1.0,
            label=f"chunk L1 vs action[{span}] (masked)")
    ax.set_xlabel("timestep")
    ax.set_ylabel("error")
    ax.legend(fontsize=8, loc="best")
    title = os.path.basename(path)
    if metrics:
        title += "   action_l1 {:.4g}   action_mse {:.4g}   val_loss {:.4g}".format(
            metrics.get("action_l1") or float("nan"), metrics.get("action_mse") or float("nan"),
            metrics.get("val_loss") or float("nan"))
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(out_png, dpi=80)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--predictions", required=True, help="directory of <episode stem>.npy (T, H, A)")
    ap.add_argument("--out", required=True, help="directory for the PNGs")
    ap.add_argument("--summary", help="eval SUMMARY.json, for the metrics in the titles")
    ap.add_argument("--obs-horizon", type=int, default=None,
                    help="the model's obs_horizon (default: the summary's, else 1)")
    ap.add_argument("episodes", nargs="+", help="the episode_*.hdf5 files")
    args = ap.parse_args(argv)

    import h5py

    metrics = {}
    obs_horizon = args.obs_horizon
    if args.summary:
        with open(args.summary) as f:
            summary = json.load(f)
        for e in summary.get("episodes", []):
            metrics[e["name"]] = e
        if obs_horizon is None:
            obs_horizon = int(summary.get("obs_horizon", 1))
    obs_horizon = 1 if obs_horizon is None else obs_horizon
    os.makedirs(args.out, exist_ok=True)
    for path in args.episodes:
        stem = os.path.splitext(os.path.basename(path))[0]
        pred_path = os.path.join(args.predictions, stem + ".npy")
        pred = np.load(pred_path)
        with h5py.File(path, "r") as f:
            action = np.asarray(f["action"], dtype=np.float32)
        if pred.ndim != 3 or pred.shape[0] != action.shape[0] or pred.shape[2] != action.shape[1]:
            sys.exit(f"eval_plots.py: {pred_path} has shape {pred.shape}, {path} has action {action.shape}")
        if not 1 <= obs_horizon <= pred.shape[1]:
            sys.exit(f"eval_plots.py: --obs-horizon {obs_horizon} is not 1..{pred.shape[1]} (the chunk's length)")
        out_png = os.path.join(args.out, stem + ".png")
        plot_episode(path, pred, action, out_png, metrics.get(os.path.basename(path)), obs_horizon)
        print(f"eval_plots.py: wrote {out_png}", file=sys.stderr)


if __name__ == "__main__":
    main()
