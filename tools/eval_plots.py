#!/usr/bin/env python3
"""eval_plots.py - one PNG per evaluated episode: what people look at instead of the numbers.

Run by `act-infer eval --plots DIR` (or by hand) on the predictions eval saved:
    eval_plots.py --predictions PRED_DIR --out PLOT_DIR [--summary SUMMARY.json] EP.hdf5 ...
For each episode, PRED_DIR/<stem>.npy holds the prior chunks (T, H, A). The figure shows, per
joint, the recorded action against the first action of each predicted chunk (what the robot
would execute first), and below, the error over time: |first action - recorded| averaged over
joints, and the masked L1 of the whole chunk against action[t:t+H]. The title carries the
episode's metrics from the summary when one is given.
"""
import argparse
import json
import math
import os
import sys

import numpy as np


def chunk_error(pred, action):
    """Mean |pred[t, k] - action[t + k]| over valid (k, joint) per timestep (t + k < T)."""
    T, H, _ = pred.shape
    err = np.zeros(T)
    for t in range(T):
        n = min(H, T - t)
        err[t] = np.abs(pred[t, :n] - action[t:t + n]).mean()
    return err


def plot_episode(path, pred, action, out_png, metrics):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T, H, A = pred.shape
    cols = min(4, A)
    rows = math.ceil(A / cols)
    fig = plt.figure(figsize=(4 * cols, 2.2 * rows + 2.6))
    gs = fig.add_gridspec(rows + 1, cols, height_ratios=[1] * rows + [1.2])
    t = np.arange(T)
    for j in range(A):
        ax = fig.add_subplot(gs[j // cols, j % cols])
        ax.plot(t, action[:, j], color="black", lw=1.2, label="recorded")
        ax.plot(t, pred[:, 0, j], color="tab:orange", lw=1.0, label="predicted (chunk[0])")
        ax.set_title(f"joint {j}", fontsize=9)
        ax.tick_params(labelsize=7)
        if j == 0:
            ax.legend(fontsize=7, loc="best")
    ax = fig.add_subplot(gs[rows, :])
    ax.plot(t, np.abs(pred[:, 0] - action).mean(axis=1), color="tab:orange", lw=1.0,
            label="|chunk[0] - recorded|, mean over joints")
    ax.plot(t, chunk_error(pred, action), color="tab:blue", lw=1.0,
            label=f"chunk L1 vs action[t:t+{H}] (masked)")
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
    ap.add_argument("episodes", nargs="+", help="the episode_*.hdf5 files")
    args = ap.parse_args(argv)

    import h5py

    metrics = {}
    if args.summary:
        with open(args.summary) as f:
            for e in json.load(f).get("episodes", []):
                metrics[e["name"]] = e
    os.makedirs(args.out, exist_ok=True)
    for path in args.episodes:
        stem = os.path.splitext(os.path.basename(path))[0]
        pred_path = os.path.join(args.predictions, stem + ".npy")
        pred = np.load(pred_path)
        with h5py.File(path, "r") as f:
            action = np.asarray(f["action"], dtype=np.float32)
        if pred.ndim != 3 or pred.shape[0] != action.shape[0] or pred.shape[2] != action.shape[1]:
            sys.exit(f"eval_plots.py: {pred_path} has shape {pred.shape}, {path} has action {action.shape}")
        out_png = os.path.join(args.out, stem + ".png")
        plot_episode(path, pred, action, out_png, metrics.get(os.path.basename(path)))
        print(f"eval_plots.py: wrote {out_png}", file=sys.stderr)


if __name__ == "__main__":
    main()
