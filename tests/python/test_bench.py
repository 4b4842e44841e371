"""act-infer bench and bench/compare_torch.py on the CPU with small models.

No timed assertions: these check that the figures are there, consistent with each other
(min <= p50 <= p90 <= p99, throughput = batch / mean latency, ...) and computed on the right
answer - the chunk act-infer bench returns for the first input matches the PyTorch reference on
the same frames to 1e-4 relative.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

STAGES = ("upload", "preprocess", "vision", "transformer", "download")


def _bench_module(repo_root):
    sys.path.insert(0, str(repo_root / "bench"))
    import compare_torch

    return compare_torch


@pytest.fixture(scope="module")
def small_model(make_cfg, ref, repo_root, tmp_path_factory):
    """A small randomized checkpoint and the .actw the real converter makes of it (once per module:
    the conversion is the slow part)."""
    d = tmp_path_factory.mktemp("bench_model")
    cfg = make_cfg()
    agent = ref.randomize_(ref.build_agent(cfg), 3)
    ck = SimpleNamespace(ckpt=d / "small.pt", config=d / "small.yaml", stats=d / "stats.pkl",
                         model=d / "small.actw", cfg=cfg, agent=agent)
    ref.save_checkpoint(agent, str(ck.ckpt), cfg, stats_path=str(ck.stats), config_path=str(ck.config))
    subprocess.run([sys.executable, str(repo_root / "tools" / "convert_checkpoint.py"), str(ck.ckpt), "-o",
                    str(ck.model), "--config", str(ck.config), "--stats", str(ck.stats)],
                   check=True, capture_output=True)
    return ck


def _run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)


def test_bench_json_has_every_figure_and_the_right_answer(act_infer, small_model, repo_root, ref, tmp_path):
    ct = _bench_module(repo_root)
    cfg = small_model.cfg
    inputs = tmp_path / "inputs"
    ct.write_inputs(cfg, 8, seed=11, out_dir=str(inputs))
    out = tmp_path / "bench.json"
    p = _run([act_infer, "bench", "--model", small_model.model, "--device", "cpu", "--batch", "2,1",
              "--iters", 3, "--warmup", 1, "--profile-iters", 1, "--inputs", inputs, "--check-output",
              "--json", out])
    assert p.returncode == 0, p.stderr
    assert "p50 ms" in p.stdout and "transformer" in p.stdout, p.stdout
    r = json.loads(out.read_text())
    # 8 samples: batch 1 has its 8 windows, batch 2 only 7, and says so
    assert [b["input_windows"] for b in r["results"]] == [7, 8]
    assert "batch 2 rotates over 7 input windows, not 8: --inputs holds 8 samples (9 would give 8)" in p.stderr
    assert "batch 1 rotates" not in p.stderr

    assert r["device"] == "cpu" and r["precision"] == "fp32" and r["graphs"] is False
    assert r["cameras"] == cfg["camera_names"]
    assert r["image_size"] == cfg["vision_backbone"]["image_shape"]
    assert r["iters"] == 3 and r["warmup"] == 1 and r["profile_iters"] == 1
    assert isinstance(r["device_name"], str) and r["device_name"]
    assert len(r["model_hash"]) == 16 and r["n_params"] > 0
    mem = r["memory"]
    assert mem["weight_file_bytes"] == os.path.getsize(small_model.model)
    assert mem["peak_rss_bytes"] > mem["weight_file_bytes"]
    assert mem["input_pool_bytes"] == os.path.getsize(inputs / "qpos.f32") + sum(
        os.path.getsize(inputs / f"{c}.u8") for c in cfg["camera_names"])
    # the CPU backend's buffers in parts: the weights it made (Winograd filters, packed linears),
    # the step's activations and its scratch (conv workspaces), which the parts must cover
    assert mem["device_activations_bytes"] > 0 and mem["device_workspace_bytes"] > 0, mem
    assert mem["device_bytes"] == (mem["device_weights_bytes"] + mem["device_activations_bytes"]
                                   + mem["device_workspace_bytes"]), mem
    # on the CPU the backend's buffers are host memory, held to the device goal: the RSS goal
    # counts the rest
    assert mem["rss_counted_bytes"] == max(
        0, mem["peak_rss_bytes"] - mem["input_pool_bytes"] - mem["device_bytes"])
    assert mem["rss_goal_met"] == (mem["rss_counted_bytes"] <= mem["rss_goal_bytes"])
    # no driver's count on the CPU: the device goal is judged on the backend's own buffers
    assert mem["driver_held_bytes"] is None and mem["driver_total_bytes"] is None, mem
    assert mem["device_judged_by"] == "session" and mem["device_judged_bytes"] == mem["device_bytes"], mem
    assert mem["device_goal_met"] == (mem["device_bytes"] <= mem["device_goal_bytes"]), mem

    assert [b["batch"] for b in r["results"]] == [2, 1]
    for b in r["results"]:
        lat = b["latency_ms"]
        assert all(math.isfinite(v) and v > 0 for v in lat.values()), lat
        assert lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"], lat
        assert lat["min"] <= lat["mean"] <= lat["p99"] * (1 + 1e-6), lat
        assert b["steps_per_s"] == pytest.approx(b["batch"] * 1e3 / lat["mean"], rel=1e-3)
        assert b["images_per_s"] == pytest.approx(b["steps_per_s"] * cfg["num_cams"], rel=1e-6)
        st = b["stages_ms"]
        sec = b["sections_ms"]
        assert list(sec)[:3] == ["upload", "preprocess", "stem"] and len(sec) == 13, sec
        assert sum(sec.values()) == pytest.approx(sum(st.values()), rel=1e-4, abs=1e-5)
        assert sum(sec[k] for k in ("stem", "layer1", "layer2", "layer3", "layer4", "keypoints")) == \
            pytest.approx(st["vision"], rel=1e-4, abs=1e-5)
        assert st is not None and set(st) == set(STAGES), st
        assert all(math.isfinite(v) and v >= 0 for v in st.values()), st
        assert st["vision"] > 0 and st["transformer"] > 0, st
        # --warmup 1: the one warmup step's time, also on the table's "first" line
        assert len(b["first_steps_ms"]) == 1 and b["first_steps_ms"][0] > 0, b["first_steps_ms"]
        said = re.search(rf"^first .* batch {b['batch']}: ([0-9.]+) ms;", p.stdout, re.M)
        assert said and abs(float(said.group(1)) - b["first_steps_ms"][0]) <= 0.051, p.stdout

    # The first input of the first batch size (window 0, batch 2) against the reference.
    fo = r["first_output"]
    H, A = cfg["pred_horizon"], cfg["action_dim"]
    assert fo["batch"] == 2 and fo["shape"] == [2, H, A]
    qpos, frames = ct.read_inputs(cfg, str(inputs))
    want = ref.predict(small_model.agent, qpos[:2], {c: f[:2] for c, f in zip(cfg["camera_names"], frames)})
    got = np.asarray(fo["actions"], np.float32).reshape(2, H, A)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 1e-4


def test_bench_generated_inputs_and_defaults(act_infer, small_model, tmp_path):
    """Without --inputs the frames are generated: never constant, different per seed, and the
    CPU defaults (batch 1, a few steps) apply."""
    outs = []
    for seed in (1, 2):
        out = tmp_path / f"gen{seed}.json"
        p = _run([act_infer, "bench", "--model", small_model.model, "--device", "cpu", "--iters", 1,
                  "--warmup", 0, "--profile-iters", 0, "--seed", seed, "--check-output", "--json", out])
        assert p.returncode == 0, p.stderr
        outs.append(json.loads(out.read_text()))
    assert [b["batch"] for b in outs[0]["results"]] == [1]
    assert outs[0]["inputs"] == "generated, seed 1"
    assert outs[0]["results"][0]["stages_ms"] is None   # --profile-iters 0: no profiled pass
    assert outs[0]["results"][0]["sections_ms"] is None
    assert outs[0]["results"][0]["first_steps_ms"] == []  # --warmup 0: no first steps apart
    assert outs[0]["results"][0]["input_windows"] == 8
    a, b = (np.asarray(o["first_output"]["actions"]) for o in outs)
    assert np.all(np.isfinite(a)) and np.std(a) > 0
    assert not np.allclose(a, b), "two seeds gave the same chunk: the inputs did not change"


def test_bench_names_the_switches_it_ran_with(act_infer, small_model, tmp_path):
    """The engine switches set in the environment (ACT_CUDA_*, ACT_CPU_*, ...) change what a step
    runs: the table's env line and the JSON's "switches" name them, and say so when none is set."""
    prefixes = ("ACT_CUDA_", "ACT_CPU_", "ACT_POOL_", "ACT_EMU_", "ACT_COPY_", "OPENBLAS_", "OMP_NUM_THREADS",
                "GOTO_NUM_THREADS")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    for extra, want in (({}, {}), ({"ACT_CPU_PACKED_GEMM": "1", "ACT_NOT_A_SWITCH": "x"},
                                   {"ACT_CPU_PACKED_GEMM": "1"}),
                        # act_run's frame copy threads run inside the timed step: named too
                        ({"ACT_COPY_THREADS": "1"}, {"ACT_COPY_THREADS": "1"})):
        out = tmp_path / "sw.json"
        p = _run([act_infer, "bench", "--model", small_model.model, "--device", "cpu", "--iters", 1,
                  "--warmup", 0, "--profile-iters", 0, "--json", out], env=dict(clean, **extra))
        assert p.returncode == 0, p.stderr
        assert json.loads(out.read_text())["switches"] == want
        line = next(ln for ln in p.stdout.splitlines() if ln.startswith("env "))
        assert line.split()[1:] == ([f"{k}={v}" for k, v in want.items()] if want else
                                    ["no", "engine", "switches", "set", "(the", "defaults)"]), line


def test_bench_says_which_switch_values_it_ignored(act_infer, small_model, tmp_path):
    """A switch set to a value the engine does not take runs the default: stderr says so, once
    per variable, so the env line is never read as a setting that had an effect."""
    bad = {"ACT_CPU_WINO_TILE": "3", "ACT_CPU_THREADS": "abc", "ACT_CPU_STEM": "off", "ACT_POOL_SPIN_US": "-5",
           "ACT_CPU_WINO_GROUP": "99", "ACT_CPU_STEM_BLOCK": "4x"}
    p = _run([act_infer, "bench", "--model", small_model.model, "--device", "cpu", "--batch", "1,2", "--iters", 2,
              "--warmup", 1, "--profile-iters", 1], env=dict(os.environ, **bad))
    assert p.returncode == 0, p.stderr
    for k, v in bad.items():
        assert p.stderr.count(f"ignoring {k}='{v}'") == 1, (k, p.stderr)
    good = {"ACT_CPU_WINO_TILE": "auto", "ACT_CPU_THREADS": "1", "ACT_CPU_STEM": "0", "ACT_POOL_SPIN_US": "0",
            "ACT_CPU_WINO_GROUP": "auto", "ACT_CPU_PACKED_GEMM": ""}
    p = _run([act_infer, "bench", "--model", small_model.model, "--device", "cpu", "--iters", 1, "--warmup", 0,
              "--profile-iters", 0], env=dict(os.environ, **good))
    assert p.returncode == 0 and "ignoring" not in p.stderr, p.stderr


def test_bench_names_the_thread_variables_openblas_reads(act_infer, small_model, tmp_path):
    """Without ACT_CPU_THREADS the CPU backend takes OpenBLAS's thread count at start, and OpenBLAS
    reads it from OMP_NUM_THREADS or GOTO_NUM_THREADS as well as OPENBLAS_NUM_THREADS: either one
    changes what a step runs (OMP_NUM_THREADS=1, common in containers, halves a 2-core step), so
    the env line and "switches" name it beside the thread count the device line reports."""
    prefixes = ("ACT_CUDA_", "ACT_CPU_", "ACT_POOL_", "ACT_EMU_", "OPENBLAS_", "OMP_NUM_THREADS",
                "GOTO_NUM_THREADS")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    for var in ("OMP_NUM_THREADS", "GOTO_NUM_THREADS"):
        out = tmp_path / "thr.json"
        p = _run([act_infer, "bench", "--model", small_model.model, "--device", "cpu", "--iters", 1,
                  "--warmup", 0, "--profile-iters", 0, "--json", out], env=dict(clean, **{var: "1"}))
        assert p.returncode == 0, p.stderr
        r = json.loads(out.read_text())
        assert "1 thread," in r["device_name"], r["device_name"]
        assert r["switches"] == {var: "1"}, r["switches"]
        line = next(ln for ln in p.stdout.splitlines() if ln.startswith("env "))
        assert line.split()[1:] == [f"{var}=1"], line


@pytest.mark.skipif(not shutil.which("taskset") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and two CPUs to pin to one")
def test_bench_counts_the_usable_cores(act_infer, small_model, tmp_path):
    """The default thread counts follow the cores the process may use (engine/cores.c): pinned to
    one CPU, bench's cores line and JSON say 1 usable of the online CPUs, and the backend runs one
    thread; unpinned, usable is the affinity mask's count (no CPU quota on a CI runner is assumed
    only where none is read)."""
    prefixes = ("ACT_CPU_THREADS", "OPENBLAS_", "OMP_NUM_THREADS", "GOTO_NUM_THREADS")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    cpu = sorted(os.sched_getaffinity(0))[0]
    for pin in (None, cpu):
        out = tmp_path / "cores.json"
        cmd = [act_infer, "bench", "--model", small_model.model, "--device", "cpu", "--iters", 1,
               "--warmup", 0, "--profile-iters", 0, "--json", out]
        p = _run((["taskset", "-c", cpu] if pin is not None else []) + cmd, env=clean)
        assert p.returncode == 0, p.stderr
        r = json.loads(out.read_text())
        c = r["cores"]
        assert c["online"] == os.cpu_count() and 1 <= c["usable"] <= c["online"], c
        assert c["affinity"] == len(os.sched_getaffinity(0)) if pin is None else c["affinity"] == 1, c
        if pin is not None:
            assert c["affinity"] == 1 and c["usable"] == 1, c
            assert "1 thread," in r["device_name"], r["device_name"]
        else:
            assert c["usable"] == (c["affinity"] if c["quota"] is None
                                   else min(c["affinity"], math.ceil(c["quota"] - 1e-9))), c
        line = next(ln for ln in p.stdout.splitlines() if ln.startswith("cores "))
        assert f"{c['usable']} usable" in line, line


def test_bench_staged_inputs_give_the_same_chunk(act_infer, small_model, tmp_path):
    """--staged-inputs writes each window into the session's own input buffers before the step,
    --in-place-inputs registers the pool and passes a pointer per frame: the chunk is the one
    act_run computes from the bench's pool, and the JSON says which mode ran."""
    outs = {}
    flags = {"copy": [], "staged": ["--staged-inputs"], "in_place": ["--in-place-inputs"]}
    said = {"staged": "staged in the session's input buffers", "in_place": "read in place from the registered pool"}
    for mode, extra in flags.items():
        out = tmp_path / f"{mode}.json"
        p = _run([act_infer, "bench", "--model", small_model.model, "--device", "cpu", "--batch", "3,1",
                  "--iters", 2, "--warmup", 1, "--profile-iters", 1, "--check-output", "--json", out] + extra)
        assert p.returncode == 0, p.stderr
        for m, text in said.items():
            assert (text in p.stdout) == (mode == m), p.stdout
        outs[mode] = json.loads(out.read_text())
        assert outs[mode]["staged_inputs"] is (mode == "staged")
        assert outs[mode]["inputs_in_place"] is (mode == "in_place")
    a = np.asarray(outs["copy"]["first_output"]["actions"], np.float64)
    assert np.std(a) > 0
    for m in ("staged", "in_place"):
        b = np.asarray(outs[m]["first_output"]["actions"], np.float64)
        assert a.shape == b.shape
        assert np.linalg.norm(a - b) / np.linalg.norm(a) <= 1e-6, m


@pytest.mark.parametrize("args, message", [
    (["--batch", "0"], "--batch '0'"),
    (["--batch", "1,,2"], "--batch"),
    (["--batch", "1,"], "--batch"),
    (["--precision", "fp64"], "--precision 'fp64'"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--iters", "0"], "--iters '0'"),
    (["--iters", "10000001"], "--iters '10000001': expected an integer in 1..10000000"),
    (["--seed", " -3"], "--seed ' -3': expected a non-negative integer"),
    (["--iters"], "--iters needs a value"),
    (["--frobnicate", "1"], "unknown option '--frobnicate'"),
    (["--staged-inputs", "--in-place-inputs"], "pick one"),
])
def test_bench_usage_errors(act_infer, small_model, args, message):
    p = _run([act_infer, "bench", "--model", small_model.model] + args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert message in p.stderr


def test_bench_refuses_an_unwritable_json_before_it_runs(act_infer, small_model, tmp_path):
    """A bench runs for minutes (CUDA: 4 sizes x 220 steps; CPU: large batches); a --json it
    cannot write must fail before the first step, not after the last one, as eval checks its
    --json up front. A directory given as the file is refused too."""
    for path, words in ((tmp_path / "missing" / "b.json", "cannot write into"),
                        (tmp_path, "is a directory")):
        p = _run([act_infer, "bench", "--model", small_model.model, "--device", "cpu", "--iters", 1,
                  "--warmup", 0, "--profile-iters", 0, "--json", path])
        assert p.returncode == 1, (p.stdout, p.stderr)
        assert words in p.stderr and str(path) in p.stderr, p.stderr
        assert "batch 1 ..." not in p.stderr and "p50 ms" not in p.stdout, (p.stdout, p.stderr)
    assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())


def test_bench_bad_inputs_and_model_are_named(act_infer, small_model, repo_root, tmp_path):
    ct = _bench_module(repo_root)
    inputs = tmp_path / "few"
    ct.write_inputs(small_model.cfg, 2, seed=5, out_dir=str(inputs))
    p = _run([act_infer, "bench", "--model", small_model.model, "--device", "cpu", "--batch", "4",
              "--inputs", inputs])
    assert p.returncode == 1 and "holds 2 inputs, but --batch asks for 4" in p.stderr, p.stderr

    cam = small_model.cfg["camera_names"][1]
    with open(inputs / f"{cam}.u8", "r+b") as f:
        f.truncate(os.path.getsize(inputs / f"{cam}.u8") - 7)
    p = _run([act_infer, "bench", "--model", small_model.model, "--device", "cpu", "--inputs", inputs])
    assert p.returncode == 1 and f"{cam}.u8" in p.stderr and "multiple" in p.stderr, p.stderr

    p = _run([act_infer, "bench", "--model", tmp_path / "missing.actw", "--device", "cpu"])
    assert p.returncode == 1 and "missing.actw" in p.stderr, p.stderr


def test_bench_without_demo_model_says_how_to_make_it(act_infer, tmp_path):
    # A copy of the binary away from the repository: no weights/demo.actw beside it or in cwd.
    exe = tmp_path / "bin" / "act-infer"
    exe.parent.mkdir()
    shutil.copy(act_infer, exe)
    p = _run([exe, "bench", "--device", "cpu"], cwd=tmp_path)
    assert p.returncode == 1
    assert "weights/demo.actw is missing" in p.stderr and "scripts/demo.sh" in p.stderr, p.stderr
    assert "scripts/make_full_model.sh /tmp/act_demo weights/demo.actw" in p.stderr, p.stderr


def test_compare_torch_runs_and_checks_outputs(act_infer, small_model, repo_root, tmp_path):
    out = tmp_path / "compare.json"
    p = _run([sys.executable, repo_root / "bench" / "compare_torch.py", "--device", "cpu",
              "--ckpt", small_model.ckpt, "--config", small_model.config, "--stats", small_model.stats,
              "--model", small_model.model, "--batch", "2,1", "--iters", 2, "--warmup", 1,
              "--peers", "eager,channels_last,compile-default", "--threads", 1,
              "--act-infer", act_infer, "--workdir", tmp_path / "work", "--json", out],
             env=dict(os.environ, OPENBLAS_NUM_THREADS="2", ACT_CPU_THREADS="2"))
    assert p.returncode == 0, p.stdout + p.stderr
    # strict JSON (no NaN), and the thread budget holds for act-infer whatever the caller's env says
    r = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the report"))
    assert r["threads"] == 1 and "1 thread," in r["ours"]["fp32"]["device_name"], r["ours"]["fp32"]["device_name"]
    assert isinstance(r["quiet_at_start"], bool) and ("quiet" in p.stdout or "BUSY" in p.stdout)
    whos = {(row["who"], row.get("batch")) for row in r["rows"]}
    for who in ("act-infer", "torch eager", "torch channels_last"):
        assert (who, 1) in whos and (who, 2) in whos, whos
    ours = [c for c in r["checks"] if c["ours"]]
    assert len(ours) == 1 and ours[0]["ok"] and ours[0]["rel_diff"] <= 1e-4, r["checks"]
    cl = next(c for c in r["checks"] if c["who"] == "torch channels_last")
    assert cl["rel_diff"] <= 1e-4
    compiled = next(p for p in r["peers"] if p["peer"] == "compile-default")
    import torch

    if not hasattr(torch, "compile"):
        assert compiled["status"].startswith("n/a")
    # every side's first call at each batch size (torch: first_call_s; act-infer: its first warmup step)
    assert all(row["first_s"] > 0 for row in r["rows"] if row.get("p50")), r["rows"]
    assert "first s" in p.stdout, p.stdout
    for row in r["rows"]:
        if row["who"] != "act-infer" and row.get("p50"):
            assert row["speedup"] == pytest.approx(
                row["p50"] / next(x["p50"] for x in r["rows"]
                                  if x["who"] == "act-infer" and x.get("batch") == row["batch"]), rel=1e-9)
    assert any(g["goal"].startswith("CPU batch 1") for g in r["goals"])


def test_compare_rounds_pool_samples_and_keep_failures(repo_root, rng):
    ct = _bench_module(repo_root)
    a, b = rng.uniform(1, 2, 7).tolist(), rng.uniform(3, 4, 5).tolist()
    r1 = {"status": "ok", "results": [ct.stats(a, 4)]}
    r2 = {"status": "ok", "results": [ct.stats(b, 4)]}
    m = ct.merge_rounds([r1, r2])
    assert m["rounds"] == 2 and m["results"][0]["samples_ms"] == a + b
    lat = m["results"][0]["latency_ms"]
    pooled = np.sort(a + b)
    assert lat["min"] == pooled[0] and lat["p50"] == pooled[5]   # nearest rank: ceil(0.5 * 12) - 1
    assert lat["mean"] == pytest.approx(pooled.mean()) and lat["p99"] == pooled[-1]
    assert m["results"][0]["steps_per_s"] == pytest.approx(4e3 / pooled.mean())
    # a failed round is named, not allowed to throw away the rounds that measured
    failed = {"status": "timeout", "reason": "ran past 5 s"}
    m = ct.merge_rounds([r1, failed, r2])
    assert m["status"] == "ok" and m["rounds"] == 2 and m["results"][0]["samples_ms"] == a + b
    assert m["rounds_failed"] == ["timeout: ran past 5 s"]
    assert ct.merge_rounds([failed, failed]) is failed


def test_compare_checks_the_first_inputs_chunk_and_writes_no_nan(repo_root, rng):
    ct = _bench_module(repo_root)
    chunk = rng.normal(size=12).tolist()
    # the peer's first batch held 1 input, ours 2 (window 0 starts at input 0 either way)
    ours = chunk + rng.normal(size=12).tolist()
    assert ct.rel_diff(ours, chunk, 12) == 0.0
    assert ct.rel_diff(chunk[:6], chunk, 12) is None
    assert ct.rel_diff([float("nan")] * 12, chunk, 12) is None
    assert ct.json_safe({"a": [1.0, float("nan")], "b": float("inf"), "c": "x"}) == {"a": [1.0, None], "b": None, "c": "x"}


def test_compare_throughput_goal_is_judged_on_steps_per_s(repo_root):
    ct = _bench_module(repo_root)

    def res(p50, steps_per_s):
        return {"status": "ok", "results": [{"batch": 256, "latency_ms": {"p50": p50}, "steps_per_s": steps_per_s}]}

    # a faster median but a slower mean: throughput is the mean's
    ours = {"bf16": res(10.0, 18686.0)}
    peers = [dict(res(13.16, 20480.0), peer="compile-default", precision="bf16")]
    g = next(g for g in ct.goals("cuda", ours, peers, [256]) if "256" in g["goal"])
    assert g["speedup"] == pytest.approx(18686.0 / 20480.0) and not g["met"]


def test_compare_eager_goals_take_the_faster_eager_layout(repo_root):
    """eager is NCHW, channels_last the other layout: a goal against "torch eager" is judged
    against whichever was faster, so a slow layout never flatters us."""
    ct = _bench_module(repo_root)

    def res(p50):
        return {"status": "ok", "results": [{"batch": 1, "latency_ms": {"p50": p50}, "steps_per_s": 1e3 / p50}]}

    ours = {"fp32": res(130.0), "bf16": res(1.0)}
    for dev, prec in (("cpu", "fp32"), ("cuda", "bf16")):
        peers = [dict(res(200.0), peer="eager", precision=prec), dict(res(90.0), peer="channels_last", precision=prec)]
        g = next(g for g in ct.goals(dev, ours, peers, [1]) if "eager" in g["goal"])
        assert g["peer_ms"] == 90.0 and "faster of NCHW and channels_last" in g["goal"], g
        assert g["met"]   # 130 <= 1.5 x 90; 90 / 1 >= 10 (against eager's 200 both would be met too)
        peers = [dict(res(200.0), peer="eager", precision=prec)]   # channels_last not run
        assert next(g for g in ct.goals(dev, ours, peers, [1]) if "eager" in g["goal"])["peer_ms"] == 200.0


@pytest.mark.parametrize("args, words", [
    (["--batch", "1,,8"], "--batch must be comma-separated"),
    (["--batch", "x"], "--batch must be comma-separated"),
    (["--batch", "1,8,1"], "--batch lists 1 more than once"),
    (["--precision", "fp32,fp32"], "--precision lists fp32 more than once"),
    (["--autotune-batches", "1,x"], "--autotune-batches must be"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--warmup", "-1"], "--warmup must be at least 0"),
    (["--peer-timeout", "4"], "--peer-timeout must be at least 5"),
    (["--precision", "fp8"], "unknown --precision/--peers entries: fp8"),
    (["--precision", "fp32,bf16"], "--device cpu runs fp32 only"),
    (["--model", "m.actw"], "--model/--stats belong to --ckpt"),
    (["--stats", "s.pkl"], "--model/--stats belong to --ckpt"),
    (["--json", "/nonexistent-dir/c.json"], "cannot write into /nonexistent-dir"),
])
def test_compare_refuses_bad_arguments(repo_root, args, words):
    p = _run([sys.executable, repo_root / "bench" / "compare_torch.py", *args])
    assert p.returncode == 2 and words in p.stderr, p.stderr


def test_compare_torch_stopped_leaves_no_run_behind(act_infer, repo_root, tmp_path):
    """An outer time limit SIGTERMs compare_torch: the run in flight (act-infer or a peer, each in
    a process group of its own, which the signal does not reach) must end with it, and the
    temporary folder it made for its model and inputs (no --workdir; ~90 MB) must go too."""
    import signal
    import time
    env = dict(os.environ, ACT_BUILD_DIR=str(act_infer.parent), TMPDIR=str(tmp_path))
    p = subprocess.Popen([sys.executable, str(repo_root / "bench" / "compare_torch.py"), "--device", "cpu",
                          "--config", "small", "--peers", "eager", "--iters", "100000", "--warmup", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)

    def children():
        out = subprocess.run(["pgrep", "-f", "--", f"--inputs {tmp_path}/act_compare_"], stdout=subprocess.PIPE,
                             text=True).stdout
        return [int(x) for x in out.split()]

    deadline = time.monotonic() + 120
    while not children():
        assert p.poll() is None, p.communicate()[1]
        assert time.monotonic() < deadline, "act-infer bench never started"
        time.sleep(0.1)
    time.sleep(2)   # past its start, into the timed steps
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    time.sleep(1.5)
    left = children()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the act-infer run outlived compare_torch"
    assert not list(tmp_path.glob("act_compare_*")), "its temporary folder was left behind"


def test_compare_torch_removes_its_temporary_folder(act_infer, repo_root, tmp_path):
    """Without --workdir the checkpoint, model and inputs go to a temporary folder that a finished
    run removes (every run used to leave ~90 MB in /tmp)."""
    env = dict(os.environ, ACT_BUILD_DIR=str(act_infer.parent), TMPDIR=str(tmp_path))
    p = subprocess.run([sys.executable, str(repo_root / "bench" / "compare_torch.py"), "--device", "cpu",
                        "--config", "small", "--peers", "eager", "--precision", "fp32", "--batch", "1",
                        "--iters", "2", "--warmup", "1", "--json", str(tmp_path / "out.json")],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads((tmp_path / "out.json").read_text())
    assert r["rows"], "no result written"
    assert not list(tmp_path.glob("act_compare_*")), "its temporary folder was left behind"
    # the goal line names what it was judged against: NCHW eager alone (channels_last not asked for)
    goal = next(g["goal"] for g in r["goals"] if g["goal"].startswith("CPU batch 1"))
    assert goal.endswith("torch eager (NCHW; channels_last did not run)"), goal


def test_compare_budget_counts_the_models_preparation(act_infer, small_model, repo_root, tmp_path, monkeypatch):
    """--budget-s runs from compare_torch's start, model preparation included (device_check's
    outer time limit sits just past it): a preparation that spends the budget leaves every peer
    'skipped', and the JSON is still written, rather than the peers running past the limit."""
    import time as _time

    ct = _bench_module(repo_root)
    real = ct.prepare_model

    def slow(a, work):
        _time.sleep(10)
        return real(a, work)

    monkeypatch.setattr(ct, "prepare_model", slow)
    import signal as _signal
    old_term = _signal.getsignal(_signal.SIGTERM)   # main() installs its SIGTERM handler: not for pytest
    monkeypatch.setattr(_signal, "signal", lambda *a: old_term)
    out = tmp_path / "c.json"
    rc = ct.main(["--device", "cpu", "--ckpt", str(small_model.ckpt), "--config", str(small_model.config),
                  "--stats", str(small_model.stats), "--model", str(small_model.model), "--iters", "1",
                  "--warmup", "0", "--peers", "eager,channels_last", "--budget-s", "12",
                  "--act-infer", str(act_infer), "--workdir", str(tmp_path / "w"), "--json", str(out)])
    r = json.loads(out.read_text())
    assert [p["status"] for p in r["peers"]] == ["skipped (--budget-s 12 spent)"] * 2, r["peers"]
    assert rc == 1   # act-infer found no time left either: not a pass


def test_the_device_line_says_openblas_threads_the_gemms_under_split_gemm_0(act_infer, small_model):
    """ACT_CPU_SPLIT_GEMM=0 hands the GEMMs to OpenBLAS's own threads: the device line says how
    many (it said 'threading its GEMMs' with one thread, and its pool's count read as the GEMMs')."""
    p = _run([act_infer, "bench", "--model", small_model.model, "--device", "cpu", "--iters", 1, "--warmup", 0,
              "--profile-iters", 0], env=dict(os.environ, ACT_CPU_SPLIT_GEMM="0", OPENBLAS_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("device"))
    if "OpenBLAS" not in line:
        pytest.skip(f"not linked against OpenBLAS: {line}")
    assert "OpenBLAS" in line and "on 1 thread for its GEMMs" in line, line
