#!/usr/bin/env python3
"""compare_torch.py - act-infer side by side with PyTorch: same weights, same inputs, one run.

What runs:
  * act-infer bench (a subprocess, --json), once per precision;
  * the PyTorch reference (tools/act_reference.py) loaded from the checkpoint the .actw was
    converted from, as the "peers": eager (NCHW input, as a dataset's stacked CHW tensors),
    eager channels_last (weights and input), torch.compile default /
    reduce-overhead / max-autotune (n/a where the torch version has no torch.compile), each in
    fp32, tf32 (allow_tf32), or autocast bf16/fp16.
Both sides do the whole policy step a user pays for: uint8 frames + qpos on the host in,
preprocessing (/255, bilinear resize) on the device, the model, the chunk back on the host.
Both sides read the same rotated pool of inputs (written once to --workdir as raw files that
act-infer bench reads with --inputs), and both are timed the same way: host clock around the
step after a device synchronize, warmup first, median of many steps. Both start from frames
already in DMA-able host memory: the torch peers' pool is pinned (on CUDA), and act-infer runs
with --staged-inputs (each step's window written into the session's pinned input buffers before
the timer starts). Without that act_run's own copy of the frames would be timed on our side only:
151 MB at batch 256, tens of ms on a host CPU.

Each peer runs in its own process with a timeout (--peer-timeout) inside a budget for the whole
run (--budget-s): torch.compile's autotuning can take minutes, and one peer that hangs or fails
must not take the comparison down with it. Peers run in the order of the goals (eager, compile
default, max-autotune at batch 1, then channels_last and reduce-overhead).

The goals against "torch eager" take the faster of the two eager layouts. Both sides get the same
untimed steps at every batch size: the peers' first call plus --warmup, act-infer --warmup + 1.

Correctness before speed: the chunk of the first input from act-infer and from every peer is
compared with the torch eager fp32 chunk (||x - ref|| / ||ref||) against ARCHITECTURE section 6's
tolerance for the precision. (ARCHITECTURE: the design document, shared/design/ARCHITECTURE.md beside
this repository; its tolerances are README's Numerics section, its goals bench/RESULTS.md's table.)

Here (CPU, Debian torch 1.13):  bench/compare_torch.py --device cpu
On the GPU machine (torch 2.x):  bench/compare_torch.py --device cuda --batch 1,256 --precision fp32,bf16 \
                                     --budget-s 240 --json $OUT/compare.json
A rehearsal on the CUDA emulator (tests/gpu/device_check.sh without a GPU): --device cuda
--peer-device cpu runs act-infer on the emulated GPU and the torch peers on the CPU, so that the
whole comparison (output check, rows, goals, JSON) runs end to end; its times mean nothing and
the report says so.
Exit status 0: act-infer ran in every precision and its chunk matches torch eager fp32.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))

PEERS = ("eager", "channels_last", "compile-default", "compile-reduce-overhead", "compile-max-autotune")
TOLERANCE = {"fp32": 1e-4, "tf32": 2e-3, "bf16": 2e-2, "fp16": 2e-2}
# A run is "quiet" when the 1-minute load average before it started was at most this per core:
# torch's thread pool loses 10x or more to a competing process on a small VM (31 ms alone, 540 ms
# beside a test suite on 2 vCPUs), far more than act-infer, so a busy run flatters the ratios.
QUIET_LOAD_PER_CORE = 0.25
ROTATIONS = 8   # the pool holds max batch + ROTATIONS - 1 inputs, as in act-infer bench


# ---------------------------------------------------------------------------------------------
# Inputs: camera-like frames (gradient, coloured discs and boxes, sensor noise) and joint angles.
# ---------------------------------------------------------------------------------------------

def make_frames(n: int, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    xn, yn = xx / w - 0.5, yy / h - 0.5
    out = np.empty((n, h, w, 3), np.uint8)
    for i in range(n):
        c0, c1 = rng.uniform(40, 210, 3), rng.uniform(40, 210, 3)
        dx, dy = rng.uniform(-0.5, 0.5, 2)
        t = np.clip(0.5 + 2 * (dx * xn + dy * yn), 0, 1)[..., None]
        img = c0 + (c1 - c0) * t
        for _ in range(rng.integers(3, 7)):
            cx, cy = rng.uniform(0, w), rng.uniform(0, h)
            r = rng.uniform(0.05, 0.2) * min(h, w)
            if rng.random() < 0.5:
                mask = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
            else:
                mask = (np.abs(xx - cx) <= r) & (np.abs(yy - cy) <= r)
            shade = 0.75 + 0.25 * np.clip(1 - (yy - cy) / (r + 1), 0, 2)
            img[mask] = (rng.uniform(0, 255, 3) * shade[mask][:, None])
        img += rng.integers(-7, 9, img.shape)
        out[i] = np.clip(img + 0.5, 0, 255).astype(np.uint8)
    return out


def write_inputs(cfg: dict, n: int, seed: int, out_dir: str) -> dict:
    """Writes out_dir/qpos.f32 and out_dir/<camera>.u8 (raw, act-infer bench --inputs)."""
    rng = np.random.default_rng(seed)
    h, w = cfg["vision_backbone"]["image_shape"]
    os.makedirs(out_dir, exist_ok=True)
    qpos = rng.uniform(-1.5, 1.5, (n, int(cfg["obs_dim"]))).astype(np.float32)
    qpos.tofile(os.path.join(out_dir, "qpos.f32"))
    for cam in cfg["camera_names"]:
        make_frames(n, h, w, rng).tofile(os.path.join(out_dir, cam + ".u8"))
    return {"n": n, "image_shape": [h, w]}


def read_inputs(cfg: dict, in_dir: str):
    h, w = cfg["vision_backbone"]["image_shape"]
    qpos = np.fromfile(os.path.join(in_dir, "qpos.f32"), np.float32).reshape(-1, int(cfg["obs_dim"]))
    frames = [np.fromfile(os.path.join(in_dir, c + ".u8"), np.uint8).reshape(-1, h, w, 3) for c in cfg["camera_names"]]
    return qpos, frames


# ---------------------------------------------------------------------------------------------
# Timing statistics, the same definitions as act-infer bench (nearest-rank percentiles).
# ---------------------------------------------------------------------------------------------

def stats(samples_ms, batch: int) -> dict:
    t = np.sort(np.asarray(samples_ms, np.float64))

    def pct(p):
        return float(t[min(len(t) - 1, max(0, int(np.ceil(p / 100 * len(t))) - 1))])

    mean = float(t.mean())
    return {"batch": batch, "latency_ms": {"min": float(t[0]), "p50": pct(50), "p90": pct(90), "p99": pct(99),
                                           "mean": mean}, "steps_per_s": batch * 1e3 / mean,
            "samples_ms": [float(v) for v in samples_ms]}


def merge_rounds(results: list) -> dict:
    """One result from the same measurement repeated in several rounds: the samples of the
    rounds that succeeded pooled, figures recomputed; 'rounds' says how many were pooled and
    'rounds_failed' what the others said. Only when no round succeeded is the result a failure
    (the first one's)."""
    good = [r for r in results if r.get("status") == "ok"]
    if not good:
        return results[0]
    failed = [r.get("status", "?") + (": " + r["reason"] if r.get("reason") else "")
              for r in results if r.get("status") != "ok"]
    if len(good) == 1 and not failed:
        return good[0]
    out = dict(good[0])
    out["rounds"] = len(good)
    if failed:
        out["rounds_failed"] = failed
    out["results"] = []
    for i, first in enumerate(good[0]["results"]):
        samples = [v for r in good for v in r["results"][i]["samples_ms"]]
        merged = dict(first)
        merged.update(stats(samples, first["batch"]))
        if "images_per_s" in first:   # act-infer's figure: images per step stays the same
            merged["images_per_s"] = first["images_per_s"] * merged["steps_per_s"] / first["steps_per_s"]
        out["results"].append(merged)
    return out


# ---------------------------------------------------------------------------------------------
# Worker: one PyTorch peer in one precision, in its own process.
# ---------------------------------------------------------------------------------------------

def run_peer(a) -> dict:
    import contextlib

    import torch
    import act_reference as ref

    dev = torch.device(a.device)
    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.benchmark = True   # what a user tuning PyTorch would set
    cfg = ref.resolve_config(ref.load_config(a.config))
    agent = ref.load_checkpoint(a.ckpt, cfg, a.stats).to(dev).eval()
    channels_last = a.peer == "channels_last"
    if channels_last:
        agent = agent.to(memory_format=torch.channels_last)
    vb, cams = agent.cfg["vision_backbone"], agent.camera_names
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)

    def step(q, imgs):
        ctx = torch.autocast(device_type=dev.type, dtype=amp) if amp else contextlib.nullcontext()
        with ctx:
            x = {c: ref.preprocess(im, vb) for c, im in zip(cams, imgs)}
            if a.peer == "eager":   # NCHW, as a dataset's stacked CHW tensors are (preprocess's
                x = {c: v.contiguous() for c, v in x.items()}   # permute leaves NHWC strides)
            if channels_last:
                x = {c: v.contiguous(memory_format=torch.channels_last) for c, v in x.items()}
            tokens = agent.vision_encoder(x)
            pred, _ = agent.policy_head(agent.normalization.normalize_qpos(q), tokens)
        return agent.normalization.denormalize_action(pred.float())

    if a.peer.startswith("compile-"):
        step = torch.compile(step, mode=a.peer[len("compile-"):], dynamic=False)

    qpos, frames = read_inputs(cfg, a.inputs)
    pin = a.device == "cuda"
    qpos_t = torch.from_numpy(qpos)
    frames_t = [torch.from_numpy(f) for f in frames]
    if pin:
        qpos_t, frames_t = qpos_t.pin_memory(), [f.pin_memory() for f in frames_t]
    mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

    def sync():
        if pin:
            torch.cuda.synchronize()

    def one(batch, start):
        if mark is not None and a.peer == "compile-reduce-overhead":
            mark()
        q = qpos_t[start:start + batch].to(dev, non_blocking=True)
        imgs = [f[start:start + batch].to(dev, non_blocking=True) for f in frames_t]
        return step(q, imgs).cpu()

    results, first = [], None
    with torch.inference_mode():
        for bi, batch in enumerate(a.batches):
            windows = min(ROTATIONS, qpos.shape[0] - batch + 1)
            t0 = time.perf_counter()
            out = one(batch, 0)   # first call at this size: compiles when compiled
            first_call_s = time.perf_counter() - t0
            if bi == 0:   # the first input's chunk (window 0 starts at input 0 at every size)
                first = out[:1].numpy().astype(np.float32).ravel().tolist()
            for i in range(a.warmup):
                one(batch, i % windows)
            samples = []
            for i in range(a.iters):
                sync()
                t0 = time.perf_counter()
                one(batch, i % windows)
                sync()
                samples.append((time.perf_counter() - t0) * 1e3)
            results.append(dict(stats(samples, batch), first_call_s=first_call_s))
            print(f"compare_torch: {a.peer} {a.precision} batch {batch}: p50 "
                  f"{results[-1]['latency_ms']['p50']:.3f} ms", file=sys.stderr)
    name = torch.cuda.get_device_name(dev) if pin else platform.processor() or platform.machine()
    return {"peer": a.peer, "precision": a.precision, "status": "ok", "torch": torch.__version__,
            "device_name": name, "results": results, "first_output": first}


# ---------------------------------------------------------------------------------------------
# Orchestration.
# ---------------------------------------------------------------------------------------------

def prepare_model(a, work: str):
    """The checkpoint + config + stats (made fresh unless given) and the .actw converted from it."""
    import act_reference as ref

    if a.ckpt:
        if not (a.model and a.config):
            sys.exit("compare_torch: --ckpt needs --model (the .actw converted from it) and --config")
        return a.ckpt, a.config, a.stats, a.model
    ckpt, cfg_path = os.path.join(work, "ckpt.pt"), os.path.join(work, "agent.yaml")
    stats_path, model = os.path.join(work, "dataset_stats.pkl"), os.path.join(work, "model.actw")
    cfg = ref._config_arg(a.config or "full")
    print(f"compare_torch: making a {a.config or 'full'} checkpoint (seed {a.seed}) in {work}", file=sys.stderr)
    agent = ref.randomize_(ref.build_agent(cfg), a.seed)
    ref.save_checkpoint(agent, ckpt, cfg, stats_path=stats_path, config_path=cfg_path)
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "convert_checkpoint.py"), ckpt, "-o", model,
                    "--config", cfg_path, "--stats", stats_path], check=True, stdout=subprocess.DEVNULL)
    return ckpt, cfg_path, stats_path, model


_RUNNING = set()   # process groups of the peers and act-infer runs in flight


def _kill_running(signum, frame):
    """SIGTERM (an outer `timeout`, device_check.sh's row limits): the peers run in process groups
    of their own, which that signal never reaches; end them too rather than leave one on the GPU."""
    for pgid in list(_RUNNING):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    sys.exit(128 + signum)


def run_limited(cmd, timeout, env=None):
    """Runs cmd in its own process group; returns (returncode, stderr) or None after `timeout`
    seconds, having killed the whole group (torch.compile leaves compile workers behind)."""
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    _RUNNING.add(p.pid)
    try:
        _, err = p.communicate(timeout=max(timeout, 1))
        return p.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return None
    finally:
        _RUNNING.discard(p.pid)


def last_line(text: str, code: int) -> str:
    return ((text or "").strip().splitlines() or [f"exit {code}"])[-1][:300]


def run_ours(a, model, inputs, precision, work, timeout):
    out = os.path.join(work, f"ours_{precision}.json")
    cmd = [a.act_infer, "bench", "--model", model, "--device", a.device, "--precision", precision,
           "--batch", ",".join(map(str, a.batches)), "--iters", str(a.iters),
           # + 1: each torch peer makes one untimed first call at every size before its warmup
           "--warmup", str(a.warmup + 1),
           "--inputs", inputs, "--check-output", "--staged-inputs", "--json", out]
    if a.no_graph:
        cmd.append("--no-graph")
    env = dict(os.environ)
    if a.device == "cpu":   # the same thread budget as the torch peers, whatever the caller's env says
        for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "ACT_CPU_THREADS"):
            env[k] = str(a.threads)
    print("compare_torch: " + " ".join(cmd), file=sys.stderr)
    r = run_limited(cmd, timeout, env)
    if r is None:
        return {"status": "timeout", "reason": f"act-infer bench ran past {timeout:.0f} s"}
    if r[0] != 0:
        return {"status": "error", "reason": last_line(r[1], r[0])}
    with open(out) as f:
        res = json.load(f)
    res["status"] = "ok"
    res["first_output"] = res.get("first_output", {}).get("actions")
    return res


def spawn_peer(a, peer, precision, batches, ckpt, cfg_path, stats_path, inputs, work, timeout) -> dict:
    out = os.path.join(work, f"peer_{peer}_{precision}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", peer, "--worker-out", out,
           "--device", a.peer_device, "--precision", precision, "--batch", ",".join(map(str, batches)),
           "--iters", str(a.iters), "--warmup", str(a.warmup), "--threads", str(a.threads),
           "--ckpt", ckpt, "--config", cfg_path, "--inputs", inputs]
    if stats_path:
        cmd += ["--stats", stats_path]
    t0 = time.time()
    r = run_limited(cmd, timeout)
    if r is None:
        return {"peer": peer, "precision": precision, "status": "timeout", "reason": f"ran past {timeout:.0f} s"}
    if r[0] != 0 or not os.path.exists(out):
        return {"peer": peer, "precision": precision, "status": "error", "reason": last_line(r[1], r[0])}
    with open(out) as f:
        res = json.load(f)
    res["wall_s"] = time.time() - t0
    return res


def rel_diff(x, ref, n: int):
    """||x - ref|| / ||ref|| over the first input's chunk (n values); None when either side
    holds fewer values or a non-finite one."""
    x, ref = np.asarray(x, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    if x.size < n or ref.size < n:
        return None
    x, ref = x[:n], ref[:n]
    if not (np.isfinite(x).all() and np.isfinite(ref).all()):
        return None
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


def json_safe(v):
    """NaN and infinities as null: the report must parse with any strict JSON reader."""
    if isinstance(v, float):
        return v if np.isfinite(v) else None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


def goals(device, ours, peers, batches) -> list:
    """The goals (latency: ARCHITECTURE section 9; memory: issue 4, bench/RESULTS.md's goal
    table), evaluated on this run's figures (a figure not measured is absent)."""
    def at(res, batch):   # the result at this batch size, or None
        return next((r for r in (res or {}).get("results", []) if r["batch"] == batch), None)

    def p50(res, batch):
        r = at(res, batch)
        return r["latency_ms"]["p50"] if r else None

    def steps(res, batch):
        r = at(res, batch)
        return r["steps_per_s"] if r else None

    def find(name, prec):
        return next((p for p in peers if p["peer"] == name and p["precision"] == prec and p["status"] == "ok"), None)

    def peer(name, prec):
        if name == "eager":   # the faster of the two eager layouts: no goal is met against the slower
            got = [g for g in (find("eager", prec), find("channels_last", prec)) if g and p50(g, 1) is not None]
            return min(got, key=lambda g: p50(g, 1)) if got else None
        return find(name, prec)

    def eager_label(prec):
        """what the eager goal was judged against: the faster of both layouts only when both ran"""
        ran = [n for n in ("eager", "channels_last") if find(n, prec) and p50(find(n, prec), 1) is not None]
        if len(ran) == 2:
            return "eager (the faster of NCHW and channels_last)"
        return "eager (channels_last; NCHW did not run)" if ran == ["channels_last"] else \
            "eager (NCHW; channels_last did not run)"

    out = []
    if device == "cpu" and 1 in batches:
        o, e = p50(ours.get("fp32"), 1), p50(peer("eager", "fp32"), 1)
        if o and e:
            out.append({"goal": f"CPU batch 1 p50 <= 1.5x torch {eager_label('fp32')}",
                        "ours_ms": o, "peer_ms": e,
                        "ratio": o / e, "met": o <= 1.5 * e})
    if device == "cuda" and 1 in batches:
        for prec, limit in (("bf16", 0.15), ("fp32", 0.6)):
            o = p50(ours.get(prec), 1)
            if o is None:
                continue
            out.append({"goal": f"H200 batch 1 {prec} p50 <= {limit} ms", "ours_ms": o, "met": o <= limit})
            for name, factor in (("eager", 10.0), ("compile-max-autotune", 2.0)):
                e = p50(peer(name, prec), 1)
                if e:
                    label = eager_label(prec) if name == "eager" else name
                    out.append({"goal": f"H200 batch 1 {prec} >= {factor:g}x torch {label}", "ours_ms": o,
                                "peer_ms": e, "speedup": e / o, "met": e / o >= factor})
    if device == "cuda" and 256 in batches:
        # a throughput goal: steps/s (from the mean step), not the p50 latency
        o = steps(ours.get("bf16"), 256)
        for name in ("compile-default", "compile-reduce-overhead", "compile-max-autotune"):
            e = steps(peer(name, "bf16"), 256)
            if o and e:
                out.append({"goal": f"H200 batch 256 bf16 >= 1.3x torch {name} throughput", "ours_steps_per_s": o,
                            "peer_steps_per_s": e, "speedup": o / e, "met": o / e >= 1.3})
    for prec, res in ours.items():
        mem = (res or {}).get("memory")
        if mem:
            # act-infer bench judges both memory goals itself; this reports its verdicts
            # (on the CPU the backend's buffers are host memory: bench leaves them out of this
            # goal and holds them to the device goal below, as on the GPU)
            less = "the input pool" + (" and the CPU backend's buffers" if device == "cpu" else "")
            out.append({"goal": f"host peak RSS ({prec}, less {less}) <= weight file + 200 MB (2e8 bytes)",
                        "ours_bytes": mem["rss_counted_bytes"],
                        "limit_bytes": mem["rss_goal_bytes"], "met": mem["rss_goal_met"]})
            # on CUDA the driver's count (the libraries' buffers and graphs included), the
            # session's own allocations where there is none
            by = ", the driver's count" if mem.get("device_judged_by") == "driver" else ""
            out.append({"goal": f"{device} backend memory ({prec}{by}) <= 1.5x fp32 weights + activations of the "
                                "largest batch",
                        "ours_bytes": mem.get("device_judged_bytes", mem["device_bytes"]),
                        "limit_bytes": mem["device_goal_bytes"],
                        "met": mem["device_goal_met"]})
    return out


def print_report(rep: dict) -> None:
    print(f"\ncompare_torch {rep['date']}  device {rep['device']} ({rep['device_name']})  torch {rep['torch']}")
    verdict = ("quiet" if rep["quiet_at_start"] else
               f"BUSY: other work held over {QUIET_LOAD_PER_CORE:g} of each core, so these figures are not clean")
    print(f"host {rep['host']}: {rep['host_cpu']}, {rep['cores']} cores, load average {rep['load_average'][0]:.2f} at the "
          f"start ({verdict}), {rep['load_average'][1]:.2f} at the end (this comparison's own work included)")
    if rep.get("peer_device", rep["device"]) != rep["device"]:
        print(f"REHEARSAL: the torch peers ran on the {rep['peer_device']}, act-infer on {rep['device']}: "
              "no time, ratio or goal verdict below means anything; the output check does")
    if rep.get("rounds_asked", 1) > 1:
        print(f"rounds: {rep['rounds']} of {rep['rounds_asked']} asked, alternating act-infer and the peers")
    print(f"model {rep['model']} ({rep['config']}), inputs {rep['inputs']}, {rep['iters']} timed steps "
          f"after {rep['warmup']} warmup, median = p50")
    print("both sides start each step from frames in DMA-able host memory: torch's pool is pinned on CUDA, "
          "act-infer runs with --staged-inputs")
    hdr = (f"{'who':<30} {'prec':<5} {'batch':>5} {'p50 ms':>9} {'min ms':>9} {'steps/s':>10} {'ours x':>8} "
           f"{'first s':>8}")
    print(hdr)
    print("-" * len(hdr))
    for row in rep["rows"]:
        if row.get("p50") is None:
            print(f"{row['who']:<30} {row['precision']:<5} {'':>5} {row['status']}")
            continue
        ratio = f"{row['speedup']:.2f}x" if row.get("speedup") else ""
        first = f"{row['first_s']:.3f}" if row.get("first_s") is not None else ""
        print(f"{row['who']:<30} {row['precision']:<5} {row['batch']:>5} {row['p50']:>9.3f} {row['min']:>9.3f} "
              f"{row['steps_per_s']:>10.1f} {ratio:>8} {first:>8}")
    for res in list(rep["ours"].values()) + rep["peers"]:
        if res.get("rounds_failed"):
            who = f"torch {res['peer']}" if res.get("peer") else "act-infer"
            print(f"  ({who} {res.get('precision', '')}: {res['rounds']} rounds pooled; the others: "
                  f"{'; '.join(res['rounds_failed'])})")
    print("\n'ours x' = the peer's p50 / act-infer's p50 at the same batch and precision (> 1: act-infer is faster)")
    print("'first s' = the first call at that batch size: torch's includes compiling (torch.compile), "
          "act-infer's its plans and algorithm measurements")
    print("\noutput check: chunk of the first input vs torch eager fp32, ||x - ref|| / ||ref||")
    for c in rep["checks"]:
        verdict = "ok" if c["ok"] else "FAIL"
        d = "n/a" if c["rel_diff"] is None else f"{c['rel_diff']:.3e}"
        print(f"  {c['who']:<30} {c['precision']:<5} {d:>9}  (tolerance {c['tolerance']:g}) {verdict}")
    if rep["goals"]:
        print("\ngoals (latency: ARCHITECTURE section 9; memory: bench/RESULTS.md's goal table)")
        for g in rep["goals"]:
            fig = ", ".join(f"{k} {v:.4g}" for k, v in g.items() if k not in ("goal", "met"))
            print(f"  {'met ' if g['met'] else 'NOT met'} {g['goal']}: {fig}")


def main(argv=None) -> int:
    t_start = time.time()   # --budget-s counts from here: the model's preparation is inside it
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--batch", default=None, help="comma-separated batch sizes (default: cpu 1, cuda 1,256)")
    ap.add_argument("--precision", default=None, help="comma-separated of fp32,tf32,bf16,fp16 (default: cpu fp32, "
                                                      "cuda fp32,bf16)")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"torch peers to run, of {','.join(PEERS)}")
    ap.add_argument("--iters", type=int, default=None, help="timed steps per batch size (default: cpu 10, cuda 100)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default: cpu 2, cuda 10)")
    ap.add_argument("--peer-device", choices=("same", "cpu"), default="same",
                    help="where the torch peers run: same as --device (default), or cpu (a rehearsal on the "
                         "CUDA emulator: the comparison's logic end to end, its times meaningless)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for torch and act-infer (default 2)")
    ap.add_argument("--config", default=None, help="full | small | agent.yaml (default full)")
    ap.add_argument("--seed", type=int, default=0, help="weights seed of a freshly made checkpoint")
    ap.add_argument("--ckpt", help="an existing checkpoint (then also --model and --config)")
    ap.add_argument("--stats", help="dataset_stats.pkl of --ckpt")
    ap.add_argument("--model", help="the .actw converted from --ckpt")
    ap.add_argument("--act-infer", default=None, help="act-infer binary (default $ACT_BUILD_DIR/act-infer, "
                                                      "else build/act-infer)")
    ap.add_argument("--no-graph", action="store_true", help="act-infer without CUDA graphs")
    ap.add_argument("--peer-timeout", type=float, default=300, help="seconds per peer (and per act-infer run)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat act-infer and every peer, alternating, and pool "
                                                           "the samples (fairer on a shared machine)")
    ap.add_argument("--budget-s", type=float, default=900, help="seconds for the whole comparison (from the start, model preparation included); peers "
                                                                 "not reached are reported as skipped")
    ap.add_argument("--autotune-batches", default="1", help="batch sizes torch.compile max-autotune runs at "
                                                            "(its goal is batch 1; each size autotunes anew); "
                                                            "'' = all of --batch")
    ap.add_argument("--workdir", help="where checkpoint, model and inputs go (default: a temporary folder, removed at the end)")
    ap.add_argument("--json", help="write the whole comparison here")
    ap.add_argument("--worker", choices=PEERS, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    cuda = a.device == "cuda"
    a.peer_device = a.device if a.peer_device == "same" else a.peer_device
    peer_cuda = a.peer_device == "cuda"

    def once(flag, items):
        twice = sorted({x for x in items if items.count(x) > 1})
        if twice:
            ap.error(f"{flag} lists {','.join(map(str, twice))} more than once (--rounds repeats the runs)")

    def sizes(flag, text, allow_empty=False):
        parts = text.split(",") if text else []
        if (not parts and not allow_empty) or not all(p.isdigit() and 1 <= int(p) <= 65536 for p in parts):
            ap.error(f"{flag} must be comma-separated batch sizes in 1..65536, got '{text}'")
        once(flag, [int(p) for p in parts])   # a size twice: two runs compared with one (the first) of ours
        return [int(p) for p in parts]

    a.batches = sizes("--batch", a.batch or ("1,256" if cuda else "1"))
    a.autotune_batches = sizes("--autotune-batches", a.autotune_batches, allow_empty=True)
    a.precisions = (a.precision or ("fp32,bf16" if cuda else "fp32")).split(",")
    a.iters = a.iters if a.iters is not None else (100 if cuda else 10)
    a.warmup = a.warmup if a.warmup is not None else (10 if cuda else 2)
    once("--precision", a.precisions)   # a precision twice: pooled as rounds of one, every row printed twice
    bad = [p for p in a.precisions if p not in TOLERANCE] + [p for p in a.peers.split(",") if p not in PEERS]
    if bad:
        ap.error(f"unknown --precision/--peers entries: {','.join(bad)} (precisions {','.join(TOLERANCE)}; "
                 f"peers {','.join(PEERS)})")
    if not cuda and any(p != "fp32" for p in a.precisions):
        ap.error(f"--device cpu runs fp32 only (act-infer's CPU backend computes in fp32; on the CPU torch's "
                 f"tf32 would be fp32 under another name), got --precision {','.join(a.precisions)}")
    if (a.model or a.stats) and not a.ckpt and not a.worker:
        ap.error("--model/--stats belong to --ckpt (the checkpoint the .actw was converted from, with its "
                 "--config); without --ckpt a fresh checkpoint and model are made")
    if a.json and not a.worker:
        d = os.path.dirname(os.path.abspath(a.json))
        if not os.path.isdir(d) or not os.access(d, os.W_OK):
            ap.error(f"--json {a.json}: cannot write into {d}")
    for flag, v, lo in (("--iters", a.iters, 1), ("--warmup", a.warmup, 0), ("--threads", a.threads, 1),
                        ("--rounds", a.rounds, 1), ("--peer-timeout", a.peer_timeout, 5), ("--budget-s", a.budget_s, 5)):
        if v < lo:
            ap.error(f"{flag} must be at least {lo}, got {v:g}")

    if a.worker:
        a.peer = a.worker
        res = run_peer(a)
        with open(a.worker_out, "w") as f:
            json.dump(res, f)
        return 0

    load0 = os.getloadavg()[0]
    signal.signal(signal.SIGTERM, _kill_running)
    import torch

    a.act_infer = a.act_infer or os.path.join(os.environ.get("ACT_BUILD_DIR", os.path.join(REPO, "build")), "act-infer")
    if peer_cuda and not torch.cuda.is_available():
        sys.exit("compare_torch: --device cuda, but torch sees no CUDA device (a rehearsal on the CUDA emulator: "
                 "--peer-device cpu)")
    work = a.workdir
    if not work:   # ~90 MB (checkpoint, model, inputs): removed however the run ends, sys.exit included
        work = tempfile.mkdtemp(prefix="act_compare_")
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    ckpt, cfg_path, stats_path, model = prepare_model(a, work)
    import act_reference as ref
    cfg = ref.resolve_config(ref.load_config(cfg_path))
    chunk_values = cfg["pred_horizon"] * cfg["action_dim"]   # the output check compares the first input's chunk
    inputs = os.path.join(work, "inputs")
    n_in = max(a.batches) + ROTATIONS - 1
    write_inputs(cfg, n_in, a.seed + 1, inputs)
    has_compile = hasattr(torch, "compile")

    started = time.time()
    # from the process's start, not from here: a caller's outer time limit (device_check.sh's
    # rows) then ends after this deadline, never between it and the JSON written at the end
    deadline = t_start + a.budget_s

    def left():
        return min(a.peer_timeout, deadline - time.time())

    # The order serves the goals under a tight budget: the reference and eager peers first, then
    # compile default (the batch-256 goal; it compiles in a fraction of max-autotune's time), then
    # max-autotune (the batch-1 goal), then the rest; what the budget does not reach is "skipped".
    order = {"eager": 0, "compile-default": 1, "compile-max-autotune": 2, "channels_last": 3,
             "compile-reduce-overhead": 4}
    wanted = sorted(set(a.peers.split(",")), key=order.get)
    runs = [("eager", "fp32")] + [(p, q) for p in wanted for q in a.precisions if (p, q) != ("eager", "fp32")]

    def one_peer(peer, prec):
        batches = a.batches
        if peer == "compile-max-autotune" and a.autotune_batches:
            batches = [b for b in a.batches if b in a.autotune_batches]
        if peer.startswith("compile-") and not has_compile:
            res = {"status": f"n/a (torch {torch.__version__} has no torch.compile)"}
        elif prec in ("bf16", "fp16") and not peer_cuda:
            res = {"status": "n/a (autocast peers run on the GPU)"}
        elif not batches:
            res = {"status": "n/a (--autotune-batches excludes every --batch)"}
        elif deadline - time.time() < 5:
            res = {"status": f"skipped (--budget-s {a.budget_s:.0f} spent)"}
        else:
            print(f"compare_torch: torch {peer} {prec} batch {','.join(map(str, batches))} ...", file=sys.stderr)
            res = spawn_peer(a, peer, prec, batches, ckpt, cfg_path, stats_path, inputs, work, left())
        res.setdefault("peer", peer)
        res.setdefault("precision", prec)
        if res["status"] in ("error", "timeout"):
            print(f"compare_torch: {peer} {prec}: {res['status']}: {res.get('reason')}", file=sys.stderr)
        return res

    # Rounds alternate act-infer and the peers, so load from other work on a shared machine falls
    # on both sides alike; the samples of all rounds are pooled.
    ours_rounds = {prec: [] for prec in a.precisions}
    peer_rounds = [[] for _ in runs]
    rounds_run = 0
    for rnd in range(a.rounds):
        if rnd and deadline - time.time() < 1.2 * (time.time() - started) / rnd:
            # another round would not fit: stop for both sides, so neither keeps extra samples
            print(f"compare_torch: {rnd} of {a.rounds} rounds fit in --budget-s {a.budget_s:.0f}", file=sys.stderr)
            break
        rounds_run += 1
        for prec in a.precisions:
            if not os.path.exists(a.act_infer):
                res = {"status": "error", "reason": f"{a.act_infer} not found (build it, or pass --act-infer)"}
            else:
                res = run_ours(a, model, inputs, prec, work, left())
            ours_rounds[prec].append(res)
        for i, (peer, prec) in enumerate(runs):
            peer_rounds[i].append(one_peer(peer, prec))
    ours = {prec: merge_rounds(r) for prec, r in ours_rounds.items()}
    peers = [merge_rounds(r) for r in peer_rounds]

    reference = next((p for p in peers if p["peer"] == "eager" and p["precision"] == "fp32" and p["status"] == "ok"), None)
    rows, checks = [], []

    def add_rows(who, prec, res, ours_res):
        if res.get("status") != "ok":
            rows.append({"who": who, "precision": prec, "status": res.get("status", "?") +
                         (": " + res["reason"] if res.get("reason") else "")})
            return
        for r in res["results"]:
            row = {"who": who, "precision": prec, "batch": r["batch"], "p50": r["latency_ms"]["p50"],
                   "min": r["latency_ms"]["min"], "mean": r["latency_ms"]["mean"], "steps_per_s": r["steps_per_s"]}
            # the first call at this batch size (s): torch's includes compiling, act-infer's its plans
            # and algorithm measurements (its first warmup step)
            if r.get("first_call_s") is not None:
                row["first_s"] = r["first_call_s"]
            elif r.get("first_steps_ms"):
                row["first_s"] = r["first_steps_ms"][0] / 1e3
            mine = next((x for x in (ours_res or {}).get("results", []) if x["batch"] == r["batch"]), None)
            if mine and ours_res is not res:
                row["speedup"] = r["latency_ms"]["p50"] / mine["latency_ms"]["p50"]
                row["throughput_ratio"] = mine["steps_per_s"] / r["steps_per_s"]
            rows.append(row)
        if reference and res is not reference and res.get("first_output") is not None:
            d = rel_diff(res["first_output"], reference["first_output"], chunk_values)
            checks.append({"who": who, "precision": prec, "rel_diff": d, "tolerance": TOLERANCE[prec],
                           "ok": d is not None and d <= TOLERANCE[prec], "ours": res is ours_res})

    graphs = " (graphs)" if cuda and not a.no_graph else ""
    for prec in a.precisions:
        add_rows("act-infer" + graphs, prec, ours[prec], ours[prec])
        for p in peers:
            if p["precision"] == prec:
                add_rows("torch " + p["peer"], prec, p, ours[prec])
    if "fp32" not in a.precisions and reference:
        add_rows("torch eager (reference)", "fp32", reference, None)

    dev_name = next((r.get("device_name") for r in list(ours.values()) + peers if r.get("device_name")), "?")
    host_cpu = next((r["host_cpu"] for r in ours.values() if r.get("host_cpu")), platform.processor() or "?")
    rep = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "device": a.device, "peer_device": a.peer_device, "device_name": dev_name, "torch": torch.__version__, "host": platform.node(),
           "host_cpu": host_cpu, "cores": os.cpu_count(),
           "load_average": [load0, os.getloadavg()[0]],
           "quiet_at_start": load0 <= QUIET_LOAD_PER_CORE * (os.cpu_count() or 1),
           "model": model, "config": a.config or "full", "inputs": f"{n_in} frames/camera, rotated over {ROTATIONS}",
           "iters": a.iters, "warmup": a.warmup, "threads": a.threads if not cuda else None,
           "rounds": rounds_run, "rounds_asked": a.rounds,
           "batches": a.batches, "precisions": a.precisions, "rows": rows, "checks": checks,
           "goals": goals(a.device, ours, peers, a.batches), "ours": ours, "peers": peers}
    if not reference:
        rep["checks"].append({"who": "torch eager fp32 (the reference) did not run", "precision": "fp32",
                              "rel_diff": None, "tolerance": 0, "ok": False, "ours": True})
    print_report(rep)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(json_safe(rep), f, indent=1, allow_nan=False)
        print(f"\ncompare_torch: wrote {a.json}", file=sys.stderr)
    # Exit status: act-infer ran and its answers match; a slow or failing torch peer is a figure, not an error.
    ok = all(c["ok"] for c in rep["checks"] if c["ours"]) and all(r.get("status") == "ok" for r in ours.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
