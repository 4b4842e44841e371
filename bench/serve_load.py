#!/usr/bin/env python3
"""serve_load.py - a bounded load test of act-serve on loopback.

For batching on (--max-batch B) and off (--max-batch 1) it starts one act-serve, then for each
client count (default 1, 8, 32) runs that many client processes in closed loop (send, wait for
the chunk, send again), each with its own connection and pre-encoded random frames, for a fixed
number of requests per client (bounded by --max-seconds). It reports per setting: round-trip
p50/p99, throughput, the mean batch the server formed, and the server's own p50 inference and
queue wait (from RESULT), so `round trip - inference` is the serving overhead, and each
server's startup (start to ready: load, warm-up; on CUDA every batch size's algorithms measured
unless ACT_CUDA_ALGO_CACHE names a file that has them).

--transports tcp,shm also runs each setting with clients on act-serve's Unix socket that pass
their frames in shared memory (a sealed memfd written once; each request carries offsets), the
same-host path of act_client, beside the TCP clients that send ~590 KB of pixels per request.

Goals (ARCHITECTURE section 9): p50 round trip <= inference + 0.3 ms at batch 1; with 32
clients, batching on >= 8x the throughput of batching off. Figures go to bench/RESULTS.md.

    python3 bench/serve_load.py --model weights/demo.actw --device cuda --json serve.json

Without a GPU, --timing-model 150,2 serves with every step replaced by a busy wait of 150 us + 2 us
per sample (the CPU backend's ACT_CPU_TIMING_MODEL; replies carry zeros): the server's overhead
and batching at GPU-like step times, with the CPU otherwise idle as on a GPU host. Those figures
are about act-serve, not about any GPU.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "act_client"))

from act_client import wire  # noqa: E402
from act_client.shm import frame_memory  # noqa: E402


def _recv_exact(s, n):
    b = bytearray()
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            raise ConnectionError("server closed the connection")
        b += chunk
    return bytes(b)


def _recv(s):
    magic, version, mtype, length = wire.HDR.unpack(_recv_exact(s, wire.HDR.size))
    return mtype, _recv_exact(s, length)


def _shm_frames(s, imgs, cams, hw):
    """Attaches a sealed memfd holding the frames (written once) to the connection; returns the
    frame descriptors (offsets) a PREDICT carries instead of the pixels, and the mapping."""
    fd, mm, slots = frame_memory(cams, *hw)
    frames = wire.shm_frames(imgs, cams, hw, slots)
    socket.send_fds(s, [wire.shm_attach(len(mm))], [fd])
    os.close(fd)   # the mapping (and the server's) keep the memory
    mtype, p = _recv(s)
    if mtype != wire.SHM_OK:
        raise RuntimeError(f"SHM_ATTACH refused: {wire.parse_error(p) if mtype == wire.ERROR else mtype}")
    return frames, mm


def _client(idx, addr, n_req, max_seconds, barrier, out_q):
    """One closed-loop client: the request bytes are built once; only the id changes.
    addr: a TCP port, or the path of the Unix socket (frames in shared memory)."""
    if isinstance(addr, str):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(600)
        s.connect(addr)
    else:
        s = socket.create_connection(("127.0.0.1", addr), timeout=600)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(wire.hello(client_name=f"load-{idx}"))
    mtype, p = _recv(s)
    if mtype != wire.INFO:
        out_q.put((idx, "handshake failed", [], []))
        return
    info = wire.parse_info(p)
    rng = np.random.default_rng(idx)
    q = rng.standard_normal(info["obs_dim"]).astype(np.float32)
    hw = (info["image_height"], info["image_width"])
    cams = info["camera_names"]
    imgs = {c: rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for c in cams}
    if isinstance(addr, str):
        frames, _mm = _shm_frames(s, imgs, cams, hw)
    else:
        frames = wire.encode_frames(imgs, cams, hw)
    msg = bytearray(wire.predict(0, q, frames))
    rtt, server = [], []
    barrier.wait()
    deadline = time.monotonic() + max_seconds
    for i in range(n_req):
        struct.pack_into("<Q", msg, wire.HDR.size, i + 1)
        t0 = time.perf_counter()
        s.sendall(msg)
        mtype, p = _recv(s)
        t1 = time.perf_counter()
        if mtype != wire.RESULT:
            out_q.put((idx, f"error: {wire.parse_error(p)}", rtt, server))
            return
        r = wire.parse_result(p)
        rtt.append((t1 - t0) * 1e3)
        server.append((r["infer_ms"], r["queue_ms"], r["batch"]))
        if time.monotonic() > deadline:
            break
    s.close()
    out_q.put((idx, None, rtt, server))


# what the run is doing, and where the servers' logs are: said if a time limit stops it
_STATE = {"phase": "starting", "work": None}


def _stopped(signum, frame):
    """SIGTERM (a caller's time limit, such as timeout(1)): say where the run stood and what the
    servers logged, so a stopped run leaves a diagnosis, then exit 124 like timeout (which signals
    this process and then its whole group: the second one is ignored)"""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"serve_load: stopped by signal {signum} while {_STATE['phase']}", file=sys.stderr)
    work = _STATE["work"]
    for log in sorted(Path(work).glob("serve-*.log")) if work else []:
        lines = log.read_text(errors="replace").splitlines()
        print(f"serve_load: last lines of {log.name} ({len(lines)} in all):", file=sys.stderr)
        for line in lines[-15:]:
            print(f"  {line}", file=sys.stderr)
    raise SystemExit(124)


def _start_server(args, max_batch, workdir):
    pf = Path(workdir) / f"port-{max_batch}.txt"
    log = open(Path(workdir) / f"serve-{max_batch}.log", "w")
    cmd = [args.act_serve, "--model", args.model, "--port", "0", "--port-file", str(pf), "--max-batch", str(max_batch),
           "--unix", str(Path(workdir) / f"serve-{max_batch}.sock"),
           "--max-wait-us", str(args.max_wait_us), "--precision", args.precision]
    if args.device != "auto":
        cmd += ["--device", args.device]
    if args.batch_sizes and max_batch > 1:   # a list above max-batch 1 (batching off) is refused
        cmd += ["--batch-sizes", args.batch_sizes]
    env = dict(os.environ)
    if args.timing_model:
        env["ACT_CPU_TIMING_MODEL"] = args.timing_model
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = t0 + 600
    while not pf.exists() or not pf.read_text().endswith("\n"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"serve_load: act-serve did not start:\n{Path(log.name).read_text()}")
        time.sleep(0.05)
    # start to ready: model load, session, warm-up (on CUDA every batch size planned, measured
    # and captured, unless ACT_CUDA_ALGO_CACHE has the choices)
    startup_s = time.monotonic() - t0
    return proc, int(pf.read_text().split()[0]), str(Path(workdir) / f"serve-{max_batch}.sock"), startup_s


def _peak_rss_mib(pid):
    """act-serve's peak resident memory so far (Linux VmHWM), or None where /proc lacks it"""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return None


def _run_level(addr, clients, n_req, max_seconds):
    ctx = mp.get_context("fork")
    barrier, out_q = ctx.Barrier(clients + 1), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(i, addr, n_req, max_seconds, barrier, out_q)) for i in range(clients)]
    for p in procs:
        p.start()
    barrier.wait(timeout=600)
    t0 = time.perf_counter()
    results = [out_q.get(timeout=max_seconds + 600) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    errs = [e for _, e, _, _ in results if e]
    if errs:
        raise SystemExit(f"serve_load: {len(errs)} clients failed, first: {errs[0]}")
    rtt = np.array([x for _, _, r, _ in results for x in r])
    srv = np.array([x for _, _, _, s in results for x in s])
    return {
        "clients": clients, "requests": int(rtt.size), "wall_s": wall,
        "throughput_rps": rtt.size / wall,
        "rtt_p50_ms": float(np.percentile(rtt, 50)), "rtt_p99_ms": float(np.percentile(rtt, 99)),
        "infer_p50_ms": float(np.percentile(srv[:, 0], 50)), "queue_p50_ms": float(np.percentile(srv[:, 1], 50)),
        # per request: round trip minus the forward pass that served it (transfer, copies, wake-ups, queueing)
        "overhead_p50_ms": float(np.percentile(rtt - srv[:, 0], 50)),
        "mean_batch": float(srv[:, 2].mean()),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "weights" / "demo.actw"))
    ap.add_argument("--act-serve", default=str(Path(os.environ.get("ACT_BUILD_DIR", REPO / "build")) / "act-serve"))
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--requests", type=int, default=50, help="requests per client per setting")
    ap.add_argument("--max-seconds", type=float, default=60, help="cap per setting and client")
    ap.add_argument("--max-batch", type=int, default=32, help="batching on: this max batch")
    ap.add_argument("--max-wait-us", type=int, default=200)
    ap.add_argument("--batch-sizes", help="batching on: act-serve's --batch-sizes (auto, all or a list; "
                    "default: act-serve's own, auto)")
    ap.add_argument("--modes", default="on,off", help="on = --max-batch N, off = --max-batch 1")
    ap.add_argument("--transports", default="tcp",
                    help="tcp (frames in each request) and/or shm (Unix socket, frames in shared memory)")
    ap.add_argument("--timing-model", metavar="BASE_US[,PER_SAMPLE_US]",
                    help="act-serve on the CPU backend with each step replaced by a busy wait of that "
                         "length (ACT_CPU_TIMING_MODEL; outputs are zeros): the server's own overhead "
                         "and batching at a GPU's step times, on a machine without one")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if args.timing_model:
        if args.device == "cuda":
            raise SystemExit("serve_load: --timing-model replaces the CPU backend's steps; drop --device cuda")
        args.device = "cpu"
        print(f"serve_load: TIMING MODEL {args.timing_model} us: no step computes anything; the figures "
              "are act-serve's own costs around modeled steps", file=sys.stderr)
    if not Path(args.model).is_file():
        raise SystemExit(f"serve_load: {args.model} is missing: make it with scripts/demo.sh, or pass --model")
    if not os.access(args.act_serve, os.X_OK):
        raise SystemExit(f"serve_load: {args.act_serve} is not built (cmake --build build, or --act-serve)")
    levels = [int(c) for c in args.clients.split(",")]
    transports = args.transports.split(",")
    if set(transports) - {"tcp", "shm"}:
        raise SystemExit(f"serve_load: --transports '{args.transports}': expected tcp and/or shm")
    rows = []
    startup = {}
    signal.signal(signal.SIGTERM, _stopped)
    with tempfile.TemporaryDirectory() as work:
        _STATE["work"] = work
        for mode in args.modes.split(","):
            mb = args.max_batch if mode == "on" else 1
            _STATE["phase"] = f"act-serve (batching {mode}, max-batch {mb}) started and warming up"
            print(f"  batching {mode:3s}: starting act-serve (max-batch {mb})", file=sys.stderr)
            proc, port, path, startup_s = _start_server(args, mb, work)
            ready_rss = _peak_rss_mib(proc.pid)
            startup[mode] = startup_s
            print(f"  batching {mode:3s}: act-serve ready in {startup_s:.2f} s"
                  + ("" if ready_rss is None else f", peak RSS {ready_rss:.1f} MiB"), file=sys.stderr)
            try:
                for c in levels:
                    for t in transports:
                        _STATE["phase"] = f"batching {mode}: {c} {t} client(s) running"
                        r = _run_level(path if t == "shm" else port, c, args.requests, args.max_seconds)
                        r["batching"], r["transport"], r["server_startup_s"] = mode, t, startup_s
                        # the server's peak so far: VmHWM never goes down, so a row shows the most any
                        # setting up to it needed
                        r["server_ready_rss_mib"], r["server_peak_rss_mib"] = ready_rss, _peak_rss_mib(proc.pid)
                        rows.append(r)
                        print(f"  batching {mode:3s} {t:3s} clients {c:3d}: {r['throughput_rps']:9.1f} req/s  "
                              f"p50 {r['rtt_p50_ms']:8.3f} ms  p99 {r['rtt_p99_ms']:8.3f} ms", file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(timeout=120)
    print(f"{'batching':>8} {'via':>4} {'clients':>7} {'requests':>8} {'p50 ms':>9} {'p99 ms':>9} {'req/s':>9} "
          f"{'batch':>6} {'infer p50':>9} {'queue p50':>9} {'overhead':>9} {'RSS MiB':>8}")
    for r in rows:
        rss = r["server_peak_rss_mib"]
        print(f"{r['batching']:>8} {r['transport']:>4} {r['clients']:7d} {r['requests']:8d} {r['rtt_p50_ms']:9.3f} {r['rtt_p99_ms']:9.3f} "
              f"{r['throughput_rps']:9.1f} {r['mean_batch']:6.2f} {r['infer_p50_ms']:9.3f} {r['queue_p50_ms']:9.3f} "
              f"{r['overhead_p50_ms']:9.3f} {'-' if rss is None else f'{rss:.1f}':>8}")
    by = {(r["batching"], r["clients"]): r for r in rows if r["transport"] == transports[0]}
    summary = {}
    top = max(levels)
    if ("on", top) in by and ("off", top) in by:
        summary[f"speedup_batching_{top}_clients"] = by[("on", top)]["throughput_rps"] / by[("off", top)]["throughput_rps"]
    if ("on", top) in by and ("off", 1) in by:
        summary[f"speedup_{top}_clients_vs_one_at_a_time"] = (by[("on", top)]["throughput_rps"]
                                                             / by[("off", 1)]["throughput_rps"])
    for r in rows:
        if r["batching"] == "on" and r["clients"] == 1:
            summary["overhead_p50_ms_batch1" + ("_shm" if r["transport"] == "shm" else "")] = r["overhead_p50_ms"]
    for mode, s in startup.items():
        summary[f"startup_s_batching_{mode}"] = s
    for k, v in summary.items():
        print(f"{k}: {v:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "device": args.device, "precision": args.precision,
                                               "timing_model_us": args.timing_model,
                                               "max_batch": args.max_batch, "max_wait_us": args.max_wait_us,
                                               "rows": rows, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
