#!/usr/bin/env python3
"""eval_compare.py - `act-infer eval` against the PyTorch reference doing the same evaluation,
in one run, on the same episodes: throughput (timesteps/s) of each, and whether the numbers agree.

The peer is what the team runs today: for each episode, batches of timesteps read with h5py, the
reference agent (tools/act_reference.py, the seed's head) computing the prior chunk and the
z = mu posterior, and the metrics in numpy. Both sides include reading and decompressing frames;
neither includes loading the model.

    python3 bench/eval_compare.py --model M.actw --ckpt CKPT.pt --config agent.yaml \
        --episodes DIR [--device cpu|cuda] [--batch N] [--act-infer build/act-infer] [--json OUT]
Without --ckpt: the demo model is made in a temp dir (full act_resnet size, randomized weights).
"""
import argparse
import atexit
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))


def episode_paths(d):
    files = glob.glob(os.path.join(d, "episode_*.hdf5"))
    num = lambda p: int(re.findall(r"episode_(\d+)\.hdf5$", p)[0]) if re.search(r"episode_\d+\.hdf5$", p) else 1 << 60
    return sorted(files, key=lambda p: (num(p), p))


def torch_eval(agent, paths, batch, device):
    """The reference evaluation: returns (overall metrics, timesteps, seconds)."""
    import h5py
    import torch

    agent = agent.to(device).eval()
    H, A, kw = agent.pred_horizon, agent.action_dim, float(agent.policy_head.kl_weight)
    cams = list(agent.camera_names)
    l1 = sq = vl1 = kl = 0.0
    count = steps = 0
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        for path in paths:
            with h5py.File(path, "r") as f:
                action = f["action"][:].astype(np.float32)
                qpos = f["observations/qpos"][:].astype(np.float32)
                T = len(action)
                for s in range(0, T, batch):
                    n = min(batch, T - s)
                    idx = np.arange(s, s + n)[:, None] + np.arange(H)[None, :]
                    tg = torch.from_numpy(action[np.minimum(idx, T - 1)]).to(device)
                    pad = torch.from_numpy(idx >= T).to(device)
                    imgs = {c: torch.from_numpy(f[f"observations/images/{c}"][s:s + n]).to(device) for c in cams}
                    q = agent.normalization.normalize_qpos(torch.from_numpy(qpos[s:s + n]).to(device))
                    tokens = agent.visual_tokens(imgs)
                    an = agent.normalization.normalize_action(tg)
                    post, info = agent.policy_head(q, tokens, an, pad, sample=False)
                    prior, _ = agent.policy_head(q, tokens)
                    prior = agent.normalization.denormalize_action(prior)
                    m = (~pad).unsqueeze(-1).to(prior.dtype)
                    d = (prior - tg) * m
                    l1 += float(d.abs().sum())
                    sq += float((d * d).sum())
                    vl1 += float(((post - an).abs() * m).sum())
                    mu, lv = info["mu"], info["logvar"]
                    kl += float((-0.5 * (1 + lv - mu.pow(2) - lv.exp())).sum())
                    count += int(m.sum()) * A
                    steps += n
    sync()
    el = time.perf_counter() - t0
    ov = {"action_l1": l1 / count, "action_mse": sq / count, "val_l1": vl1 / count, "val_kl": kl / steps}
    ov["val_loss"] = ov["val_l1"] + kw * ov["val_kl"]
    return ov, steps, el


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help=".actw converted from --ckpt")
    ap.add_argument("--ckpt", help="the training checkpoint the .actw came from")
    ap.add_argument("--config", help="its agent config YAML")
    ap.add_argument("--episodes", help="episode directory (default: synthetic full-size episodes in a temp dir)")
    ap.add_argument("--n-episodes", type=int, default=2, help="synthetic episodes to make (default 2)")
    ap.add_argument("--T", type=int, default=16, help="timesteps per synthetic episode (default 16)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--act-infer", default=os.path.join(REPO, "build", "act-infer"))
    ap.add_argument("--json", help="write the comparison here")
    args = ap.parse_args(argv)

    import torch
    import act_reference

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.device == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)
    tmp = tempfile.mkdtemp(prefix="act-eval-compare-")
    # the made model, episodes and summary: nothing here is needed afterwards, however the run ends
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    if not args.ckpt:
        cfg = act_reference.resolve_config(act_reference.FULL_CFG)
        agent = act_reference.randomize_(act_reference.build_agent(cfg), 0)
        args.ckpt, args.config = os.path.join(tmp, "m.pt"), os.path.join(tmp, "m.yaml")
        act_reference.save_checkpoint(agent, args.ckpt, cfg, config_path=args.config)
        args.model = None
    if not args.model:
        args.model = os.path.join(tmp, "m.actw")
        subprocess.run([sys.executable, os.path.join(REPO, "tools", "convert_checkpoint.py"), args.ckpt, "-o",
                        args.model, "--config", args.config], check=True, stdout=subprocess.DEVNULL)
    agent = act_reference.load_checkpoint(args.ckpt, act_reference.load_config(args.config) if args.config else None)
    if not args.episodes:
        import make_episodes
        args.episodes = os.path.join(tmp, "episodes")
        os.makedirs(args.episodes)
        h, w = agent.cfg["vision_backbone"]["image_shape"]
        for i in range(args.n_episodes):
            make_episodes.make_episode(os.path.join(args.episodes, f"episode_{i}.hdf5"), args.T, h, w,
                                       list(agent.camera_names), True, True, seed=i, obs_dim=agent.obs_dim,
                                       action_dim=agent.action_dim)
    paths = episode_paths(args.episodes)

    summary = os.path.join(tmp, "summary.json")
    subprocess.run([args.act_infer, "eval", "--model", args.model, "--episodes", args.episodes, "--device",
                    args.device, "--precision", args.precision, "--batch", str(args.batch), "--json", summary],
                   check=True, stdout=subprocess.DEVNULL)
    ours = json.load(open(summary))["overall"]
    ref, steps, el = torch_eval(agent, paths, args.batch, args.device)

    ours_tps = ours["throughput"]["timesteps_per_s"]
    ref_tps = steps / el
    print(f"episodes {len(paths)}, timesteps {steps}, device {args.device}, batch {args.batch}, "
          f"precision {args.precision} (torch fp32), torch {torch.__version__}")
    print(f"{'':24s}{'timesteps/s':>14s}")
    print(f"{'act-infer eval':24s}{ours_tps:14.2f}")
    print(f"{'PyTorch reference':24s}{ref_tps:14.2f}")
    print(f"speedup {ours_tps / ref_tps:.2f}x")
    diffs = {k: abs(ours[k] - ref[k]) / max(abs(ref[k]), 1e-12) for k in ref}
    for k in ref:
        print(f"  {k:12s} act-infer {ours[k]:.7g}  torch {ref[k]:.7g}  rel diff {diffs[k]:.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "batch": args.batch, "precision": args.precision, "episodes": len(paths),
                       "timesteps": steps, "act_infer_timesteps_per_s": ours_tps, "torch_timesteps_per_s": ref_tps,
                       "torch_version": torch.__version__, "metrics_rel_diff": diffs}, f, indent=2)


if __name__ == "__main__":
    main()
