#!/usr/bin/env python3
"""serve_mixed.py - robots beside an evaluation on one act-serve: what the robots' latency is.

A GPU server is shared: rollout robots ask one step at a time (closed loop, a think time between
steps), while an evaluation or a vectorized env pushes windows of many requests on one
connection (act_client's predict_many). With first-come batches, a robot's request that arrives
behind a window of 32 waits for every batch of it; act-serve's batches take places round-robin
between connections, so it waits for about one. This runs R robot processes and one evaluator
process against each act-serve binary given (A/B in the same run: --act-serve OLD,NEW) and
prints the robots' round-trip p50/p99/max and the evaluator's requests/s, then the ratios.

    python3 bench/serve_mixed.py --model build/testdata/small.actw --timing-model 3000,100 \\
        --act-serve /tmp/old/act-serve,build/act-serve

--timing-model BASE_US[,PER_SAMPLE_US] replaces every step by a busy wait (the CPU backend's
ACT_CPU_TIMING_MODEL): GPU-like step times on a CPU host (the figures are then about
act-serve's batching, not about a GPU; the busy wait takes a core). Without it the CPU backend
computes, and step times are the CPU's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "act_client"))
sys.path.insert(0, str(REPO / "bench"))

from act_client import wire  # noqa: E402
from serve_load import _recv  # noqa: E402


def _connect(port, name):
    s = socket.create_connection(("127.0.0.1", port), timeout=600)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(wire.hello(client_name=name))
    mtype, p = _recv(s)
    if mtype != wire.INFO:
        raise RuntimeError(f"{name}: handshake failed")
    info = wire.parse_info(p)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    hw = (info["image_height"], info["image_width"])
    imgs = {c: rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for c in info["camera_names"]}
    q = rng.standard_normal(info["obs_dim"]).astype(np.float32)
    return s, bytearray(wire.predict(0, q, wire.encode_frames(imgs, info["camera_names"], hw)))


def _robot(idx, port, seconds, think_ms, start, out_q):
    s, msg = _connect(port, f"robot-{idx}")
    rtt = []
    start.wait()
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        i += 1
        struct.pack_into("<Q", msg, wire.HDR.size, i)
        t0 = time.perf_counter()
        s.sendall(msg)
        mtype, p = _recv(s)
        rtt.append((time.perf_counter() - t0) * 1e3)
        if mtype != wire.RESULT:
            out_q.put(("robot", idx, f"error {wire.parse_error(p)}", rtt))
            return
        time.sleep(think_ms / 1e3)
    s.close()
    out_q.put(("robot", idx, None, rtt))


def _evaluator(port, seconds, window, start, out_q):
    """windows of `window` requests pipelined on one connection, the next window once all of the
    last are answered (predict_many's pattern), for the whole run"""
    s, msg = _connect(port, "evaluator")
    start.wait()
    end = time.monotonic() + seconds
    done, rid = 0, 0
    while time.monotonic() < end:
        burst = bytearray()
        for _ in range(window):
            rid += 1
            struct.pack_into("<Q", msg, wire.HDR.size, rid)
            burst += msg
        s.sendall(burst)
        for _ in range(window):
            mtype, p = _recv(s)
            if mtype != wire.RESULT:
                out_q.put(("evaluator", 0, f"error {wire.parse_error(p)}", done))
                return
            done += 1
    s.close()
    out_q.put(("evaluator", 0, None, done))


def run_one(exe, args, workdir):
    pf = Path(workdir) / f"port-{zlib.crc32(exe.encode()):08x}.txt"
    env = dict(os.environ)
    if args.timing_model:
        env["ACT_CPU_TIMING_MODEL"] = args.timing_model
    cmd = [exe, "--model", args.model, "--device", "cpu", "--port", "0", "--port-file", str(pf),
           "--max-batch", str(args.max_batch), "--max-wait-us", str(args.max_wait_us),
           "--max-inflight", str(max(32, args.window)), "--max-queue", str(args.window + args.robots + 8)]
    with open(Path(workdir) / "serve.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 300
        while not pf.exists() or not pf.read_text().endswith("\n"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve_mixed: {exe} did not start:\n{(Path(workdir) / 'serve.log').read_text()}")
            time.sleep(0.05)
        port = int(pf.read_text().split()[0])
        ctx = mp.get_context("fork")
        start, out_q = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_robot, args=(i, port, args.seconds, args.think_ms, start, out_q))
                 for i in range(args.robots)]
        if args.window:
            procs.append(ctx.Process(target=_evaluator, args=(port, args.seconds, args.window, start, out_q)))
        for p in procs:
            p.start()
        time.sleep(0.5)   # every connection made
        start.set()
        results = [out_q.get(timeout=args.seconds + 300) for _ in procs]
        for p in procs:
            p.join()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        pf.unlink(missing_ok=True)
    errs = [e for _, _, e, _ in results if e]
    if errs:
        raise SystemExit(f"serve_mixed: {exe}: {errs[0]}")
    rtt = np.array([x for kind, _, _, r in results if kind == "robot" for x in r])
    ev = sum(r for kind, _, _, r in results if kind == "evaluator")
    return {"act_serve": exe, "robot_steps": int(rtt.size), "robot_p50_ms": float(np.percentile(rtt, 50)),
            "robot_p99_ms": float(np.percentile(rtt, 99)), "robot_max_ms": float(rtt.max()),
            "evaluator_rps": ev / args.seconds}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", default=str(REPO / "weights" / "demo.actw"))
    ap.add_argument("--act-serve", default=str(Path(os.environ.get("ACT_BUILD_DIR", REPO / "build")) / "act-serve"),
                    help="one binary, or several comma-separated (A/B, run in turn)")
    ap.add_argument("--robots", type=int, default=4, help="closed-loop robot processes")
    ap.add_argument("--think-ms", type=float, default=20.0, help="a robot's pause between steps")
    ap.add_argument("--window", type=int, default=32, help="the evaluator's requests out at once (0: no evaluator)")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-wait-us", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=10.0, help="per binary")
    ap.add_argument("--timing-model", metavar="BASE_US[,PER_SAMPLE_US]",
                    help="steps as busy waits (ACT_CPU_TIMING_MODEL): GPU-like times on a CPU host")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="serve_mixed.") as work:
        for exe in args.act_serve.split(","):
            print(f"serve_mixed: {exe}: {args.robots} robots (think {args.think_ms:g} ms) + an evaluator "
                  f"(window {args.window}), max-batch {args.max_batch}, {args.seconds:g} s ...", file=sys.stderr)
            rows.append(run_one(exe, args, work))
    print(f"{'act-serve':<40} {'robot steps':>11} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'eval req/s':>10}")
    for r in rows:
        print(f"{r['act_serve'][-40:]:<40} {r['robot_steps']:>11} {r['robot_p50_ms']:>8.2f} {r['robot_p99_ms']:>8.2f} "
              f"{r['robot_max_ms']:>8.2f} {r['evaluator_rps']:>10.1f}")
    for r in rows[1:]:
        a = rows[0]
        print(f"{r['act_serve'][-40:]} vs {a['act_serve'][-40:]}: robot p50 x{r['robot_p50_ms'] / a['robot_p50_ms']:.2f}, "
              f"p99 x{r['robot_p99_ms'] / a['robot_p99_ms']:.2f}, evaluator x{r['evaluator_rps'] / a['evaluator_rps']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
