"""bench/serve_load.py on a small CPU model: it runs every setting it is asked for, counts every
request, and reports consistent figures (the figures themselves are recorded, never asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_serve_load_reports_every_setting(act_serve, make_model, make_cfg, tmp_path):
    model, _ = make_model(tmp_path, make_cfg(image_size=40, vision_backbone={"input_shape": [3, 48, 48]}), 31)
    out = tmp_path / "load.json"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "serve_load.py"), "--model", str(model), "--act-serve",
                        str(act_serve), "--device", "cpu", "--clients", "1,3", "--requests", "2", "--transports", "tcp,shm",
                        "--json", str(out), "--batch-sizes", "1,4"],   # on: 3 clients padded to 4; off: size 1
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    rows = {(r["batching"], r["clients"], r["transport"]): r for r in res["rows"]}
    assert sorted(rows) == [(m, c, t) for m in ("off", "on") for c in (1, 3) for t in ("shm", "tcp")]
    for (mode, clients, _), r in rows.items():
        assert r["requests"] == 2 * clients
        assert 0 < r["infer_p50_ms"] <= r["rtt_p50_ms"] <= r["rtt_p99_ms"]
        assert r["throughput_rps"] > 0 and 1 <= r["mean_batch"] <= clients
        if mode == "off":
            assert r["mean_batch"] == 1
        # the server's peak RSS (Linux VmHWM): at least the model file, and never below the peak
        # it had when it became ready
        assert r["server_peak_rss_mib"] >= r["server_ready_rss_mib"] > model.stat().st_size / 2**20
        # start to ready: one server per mode, the same figure on each of its rows
        assert r["server_startup_s"] == res["summary"][f"startup_s_batching_{mode}"] > 0
    assert set(res["summary"]) == {"speedup_batching_3_clients", "speedup_3_clients_vs_one_at_a_time",
                                   "overhead_p50_ms_batch1", "overhead_p50_ms_batch1_shm",
                                   "startup_s_batching_on", "startup_s_batching_off"}
    assert "batching  via clients" in p.stdout and p.stdout.count("\n") >= 9


def test_timing_model_steps_are_busy_waits_of_the_modeled_length(act_serve, act_infer, make_model, make_cfg,
                                                                 tmp_path):
    """ACT_CPU_TIMING_MODEL (serve_load --timing-model): each step is a busy wait of BASE + PER x
    batch us and its outputs are zeros; the device name says so; a malformed value is refused."""
    model, _ = make_model(tmp_path, make_cfg(image_size=40, vision_backbone={"input_shape": [3, 48, 48]}), 32)
    env = dict(os.environ, ACT_CPU_TIMING_MODEL="3000,1000")
    out = tmp_path / "b.json"
    p = subprocess.run([str(act_infer), "bench", "--model", str(model), "--device", "cpu", "--batch", "1,4",
                        "--iters", "5", "--warmup", "1", "--profile-iters", "0", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert "TIMING MODEL" in p.stdout + p.stderr
    res = {r["batch"]: r["latency_ms"] for r in json.loads(out.read_text())["results"]}
    assert 4.0 <= res[1]["min"] < 30.0, res    # 3 ms + 1 ms x 1
    assert 7.0 <= res[4]["min"] < 40.0, res    # 3 ms + 1 ms x 4
    out = tmp_path / "load.json"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "serve_load.py"), "--model", str(model), "--act-serve",
                        str(act_serve), "--timing-model", "2000,0", "--clients", "1", "--requests", "3",
                        "--modes", "on", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "TIMING MODEL" in p.stderr
    r = json.loads(out.read_text())["rows"][0]
    assert r["requests"] == 3 and 2.0 <= r["infer_p50_ms"] < 30.0, r
    env["ACT_CPU_TIMING_MODEL"] = "150,"
    p = subprocess.run([str(act_infer), "bench", "--model", str(model), "--device", "cpu", "--iters", "1"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode != 0 and "ACT_CPU_TIMING_MODEL='150,'" in p.stderr, p.stderr


def test_serve_mixed_runs_every_binary_and_counts_both_kinds_of_client(act_serve, make_model, make_cfg, tmp_path):
    """bench/serve_mixed.py: robots and an evaluator against each binary given (here the same
    one twice, as an A/B of a binary with itself); every figure present and consistent."""
    model, _ = make_model(tmp_path, make_cfg(image_size=40, vision_backbone={"input_shape": [3, 48, 48]}), 32)
    out = tmp_path / "mixed.json"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "serve_mixed.py"), "--model", str(model), "--act-serve",
                        f"{act_serve},{act_serve}", "--robots", "2", "--window", "6", "--max-batch", "4",
                        "--seconds", "1.5", "--timing-model", "2000,100", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["act_serve"] for r in rows] == [str(act_serve)] * 2
    for r in rows:
        assert r["robot_steps"] >= 2 and r["evaluator_rps"] > 0
        assert 2.0 <= r["robot_p50_ms"] <= r["robot_p99_ms"] <= r["robot_max_ms"]   # a step takes 2 ms at least
    assert "robot p50 x" in p.stdout and "evaluator x" in p.stdout
