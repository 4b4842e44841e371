"""The programs on the CUDA path, run on the CUDA emulator (tests/cuda_emu, libact_cuda_emu.so):
act-serve --device cuda with clients on several connections (the session is made on the main
thread and runs on the inference thread, graphs captured there), act-infer eval --device cuda
and act-infer bench --device cuda. Each is compared with the CPU device on the same inputs.

The emulator runs the CUDA backend's own sources on the host, so this checks the programs'
CUDA code paths (device selection, threads, graphs, posterior requests, batching), not GPU
speed. Skipped when the emulator was not built. Tolerance: fp32 CUDA vs CPU, 1e-4 relative
(ARCHITECTURE section 6), 1e-5 absolute for values near zero.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import make_episodes

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "act_client"))
from act_client import ActClient, ActServerError  # noqa: E402
from serve_util import Server, replay_episode  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def emu_env(build_dir):
    lib = build_dir / "libact_cuda_emu.so"
    if not lib.is_file():
        pytest.skip(f"the CUDA emulator is not built at {lib}")
    env = dict(os.environ, ACT_CUDA_EMULATOR=str(lib), OPENBLAS_NUM_THREADS="1")
    return env


@pytest.fixture(scope="module")
def model(tmp_path_factory, make_cfg, make_model):
    d = tmp_path_factory.mktemp("emu")
    cfg = make_cfg()
    actw, _ = make_model(d, cfg, 31)
    return actw, cfg, d


def _run(cmd, env, timeout=900):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=timeout)
    assert p.returncode == 0, f"{cmd[0]} exited {p.returncode}:\n{p.stderr[-3000:]}"
    return p


def test_act_infer_bench_names_the_emulator_and_reports_every_field(act_infer, model, emu_env, tmp_path):
    actw, _, _ = model
    out = tmp_path / "bench.json"
    _run([act_infer, "bench", "--model", actw, "--device", "cuda", "--precision", "bf16", "--batch", "1,3",
          "--iters", 3, "--warmup", 2, "--json", out], emu_env)
    rep = json.loads(out.read_text())
    assert rep["device"] == "cuda" and "emulator" in rep["device_name"], rep["device_name"]
    assert rep["precision"] == "bf16" and [r["batch"] for r in rep["results"]] == [1, 3]
    for r in rep["results"]:
        assert r["latency_ms"]["p50"] > 0 and set(r["stages_ms"]) >= {"upload", "vision", "transformer"}
    mem = rep["memory"]
    # bf16 keeps its GEMM/conv weights only in bf16: about half the fp32 bytes, not 1.5x
    assert 0.4 * mem["weight_bytes"] < mem["device_weights_bytes"] < 0.75 * mem["weight_bytes"], mem
    assert mem["device_activations_bytes"] > 0 and mem["device_workspace_bytes"] > 0, mem
    assert mem["device_bytes"] == (mem["device_weights_bytes"] + mem["device_activations_bytes"]
                                   + mem["device_workspace_bytes"]), mem
    assert isinstance(mem["device_goal_met"], bool) and isinstance(mem["rss_goal_met"], bool), mem
    # the goal is judged on the driver's count, which sees all the session allocated (the
    # emulator's libraries allocate nothing of their own, so the two agree to the byte here)
    assert mem["device_judged_by"] == "driver" and mem["device_judged_bytes"] == mem["driver_held_bytes"], mem
    assert mem["driver_held_bytes"] == mem["device_bytes"], mem
    assert 0 <= mem["driver_before_bytes"] < mem["driver_total_bytes"], mem
    assert mem["device_goal_met"] == (mem["device_judged_bytes"] <= mem["device_goal_bytes"]), mem
    # a driver that cannot say (cudaMemGetInfo refused, as a sandbox's GPU proxy may) costs only
    # the figure: the run goes on and the goal is judged on the session's own count
    _run([act_infer, "bench", "--model", actw, "--device", "cuda", "--precision", "bf16", "--batch", "1",
          "--iters", 2, "--warmup", 1, "--json", out], dict(emu_env, ACT_EMU_MEMGETINFO="fail"))
    mem = json.loads(out.read_text())["memory"]
    assert mem["driver_held_bytes"] is None and mem["device_judged_by"] == "session", mem
    assert mem["device_judged_bytes"] == mem["device_bytes"], mem


def _graph_gemms(act_infer, actw, env):
    """cuBLASLt nodes in the captured bf16 batch-1 step (the emulator's ACT_EMU_TRACE listing)"""
    p = _run([act_infer, "bench", "--model", actw, "--device", "cuda", "--precision", "bf16", "--batch", 1,
              "--iters", 2, "--warmup", 1, "--profile-iters", 0], dict(env, ACT_EMU_TRACE="1"))
    counts = [line for line in p.stderr.splitlines() + p.stdout.splitlines() if "graph instantiated" in line]
    assert counts, p.stderr[-2000:]
    return int(counts[-1].split("cublasLtMatmul=")[1].split()[0])


def test_a_gpu_older_than_the_builds_kernels_is_refused_and_auto_falls_back(act_infer, model, emu_env):
    """The emulator as an sm_80 GPU under a build whose kernels start at sm_90: --device cuda
    refuses it up front, naming both and the rebuild flag (its first kernel launch would fail
    with 'no kernel image'); the default device falls back to the CPU and says why."""
    env = dict(emu_env, ACT_EMU_CC="80")
    base = [str(act_infer), "bench", "--model", str(model[0]), "--iters", "1", "--warmup", "0", "--batch", "1"]
    p = subprocess.run(base + ["--device", "cuda"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode != 0 and "sm_90" in p.stderr and "CMAKE_CUDA_ARCHITECTURES=80" in p.stderr, p.stderr
    p = subprocess.run(base, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert "device cpu" in p.stderr and "none of them sm_90 or newer" in p.stderr, p.stderr


def test_decoder_kv_of_every_layer_is_one_gemm(act_infer, model, emu_env):
    """ACT_CUDA_LINEAR_GROUP (default on): the decoder's cross-attention K/V of all layers is one
    GEMM in the step's graph, dec_layers - 1 fewer than one per layer (parity is the e2e tests')"""
    actw, cfg, _ = model
    layers = int(cfg["head"]["dec_layers"])
    assert layers >= 2, cfg["head"]
    per_layer = _graph_gemms(act_infer, actw, dict(emu_env, ACT_CUDA_LINEAR_GROUP="0"))
    grouped = _graph_gemms(act_infer, actw, emu_env)
    assert per_layer - grouped == layers - 1, (per_layer, grouped, layers)


def test_act_infer_eval_on_cuda_matches_cpu(act_infer, model, emu_env, tmp_path):
    actw, cfg, d = model
    eps = tmp_path / "episodes"
    eps.mkdir()
    h, w = cfg["vision_backbone"]["image_shape"]
    # batch 4: episode 0's batches alternate between the reader's two buffers, so a replayed
    # graph reads the other buffer than the one it was captured on
    for i, T in enumerate((13, 5)):
        make_episodes.make_episode(str(eps / f"episode_{i}.hdf5"), T, h, w, list(cfg["camera_names"]), False, True,
                                   seed=40 + i, obs_dim=cfg["obs_dim"], action_dim=cfg["action_dim"])
    sums, logs = {}, {}
    # on cuda the frames are read where the episode reader put them (its buffers registered with
    # the session: the graph gathers them), or copied into the input buffers with --copy-frames
    # (cuda-pad: every last batch padded up to 4 with stand-in rows, frames read in place)
    for run, dev, extra in (("cpu", "cpu", []), ("cuda", "cuda", []), ("cuda-copy", "cuda", ["--copy-frames"]),
                            ("cuda-pad", "cuda", ["--pad-batches", "on"])):
        out = tmp_path / f"{run}.json"
        # frames blocks of their own mappings (freed = unmapped): unregistering freed memory shows
        p = _run([act_infer, "eval", "--model", actw, "--episodes", eps, "--device", dev, "--batch", 4, "--json", out,
                  *extra], dict(emu_env, ACT_EMU_TRACE="2", MALLOC_MMAP_THRESHOLD_="4096"))
        sums[run], logs[run] = json.loads(out.read_text()), p.stderr
        # 13 = 4+4+4+1, 5 = 4+1: two sizes (cuda's auto sets up up to 4 before it pads); with
        # --pad-batches on one, the two last batches padded by 3 rows each
        steps = [l for l in p.stdout.splitlines() if l.startswith("steps: ")]
        assert len(steps) == 1 and steps[0].startswith(
            "steps: at batch size 4 (6 rows computed" if run == "cuda-pad" else "steps: at batch sizes 4, 1"), \
            (run, steps)
    # predict on cuda: one episode brings two sizes at most, under auto's 4: nothing padded
    for batch, says in ((4, "5 timesteps in 2 steps of 4 rows, the last of 1"), (8, "5 timesteps in 1 step of 5 rows\n")):
        p = _run([act_infer, "predict", "--model", actw, "--episode", eps / "episode_1.hdf5", "--out",
                  tmp_path / "p.npy", "--device", "cuda", "--batch", batch], emu_env)
        assert "act-infer predict: " + says in p.stderr, p.stderr
    assert "gather_kernel" in logs["cuda"] and "frames are copied" not in logs["cuda"], logs["cuda"][-3000:]
    assert "gather_kernel" not in logs["cuda-copy"]
    assert "unmapped while registered" not in logs["cuda"], logs["cuda"][-2000:]
    cpu_eps = {e["name"]: e for e in sums["cpu"]["episodes"]}
    metrics = ("action_l1", "action_mse", "val_l1", "val_kl", "val_loss")
    for run in ("cuda", "cuda-copy", "cuda-pad"):
        assert sums[run]["device"] == "cuda" and "emulator" in sums[run]["device_name"]
        assert sorted(cpu_eps) == sorted(e["name"] for e in sums[run]["episodes"])
        for e in sums[run]["episodes"] + [dict(sums[run]["overall"], name="overall")]:
            want = sums["cpu"]["overall"] if e["name"] == "overall" else cpu_eps[e["name"]]
            for k in metrics:
                np.testing.assert_allclose(e[k], want[k], **TOL, err_msg=f"{run} {e['name']} {k}")
            np.testing.assert_allclose(e["per_joint_l1"], want["per_joint_l1"], **TOL, err_msg=f"{run} {e['name']}")


def test_act_serve_on_cuda_matches_act_infer_predict_on_cpu(act_serve, act_infer, model, emu_env, tmp_path):
    actw, cfg, _ = model
    cams = list(cfg["camera_names"])
    h, w = cfg["vision_backbone"]["image_shape"]
    T, H = 6, cfg["pred_horizon"]
    ep = tmp_path / "episode_0.hdf5"
    make_episodes.make_episode(str(ep), T, h, w, cams, False, True, seed=77, obs_dim=cfg["obs_dim"],
                               action_dim=cfg["action_dim"])
    post_dir = tmp_path / "post"
    post_dir.mkdir()
    _run([act_infer, "predict", "--model", actw, "--episode", ep, "--out", tmp_path / "pred.npy", "--device", "cpu",
          "--posterior-dir", post_dir], emu_env)
    want_prior, want_post = np.load(tmp_path / "pred.npy"), np.load(post_dir / "post_actions.npy")
    with h5py.File(ep, "r") as f:
        qpos, actions = f["observations/qpos"][:], f["action"][:]
        images = {c: f[f"observations/images/{c}"][:] for c in cams}

    # sizes 1 and 4 only: the pairs of requests run padded up to 4 rows (copies of the first),
    # the frames of one read in place from shared memory, of the other from its receive buffer
    srv = Server(act_serve, actw, tmp_path, "--precision", "fp32", "--max-batch", 4, "--batch-sizes", "1,4",
                 "--max-wait-us", 500000, "--unix", tmp_path / "serve.sock", env=emu_env, device="cuda")
    try:
        srv.wait_ready(timeout=300)
        # one TCP client, one with its frames in shared memory: batched together on the device
        clients = [ActClient("127.0.0.1", srv.port, timeout=600),
                   ActClient(unix_path=str(tmp_path / "serve.sock"), timeout=600)]
        info = clients[0].info()
        assert "emulator" in json.dumps(info), info
        for c in clients[1:]:
            c.info()   # handshake first, so the server knows both may send
        assert clients[1].transport == "unix+shm", clients[1].shm_error
        got_prior, got_post, _, batches = replay_episode(clients, qpos, images, actions, H)
        for t in range(T):
            np.testing.assert_allclose(got_prior[t], want_prior[t], **TOL, err_msg=f"prior chunk, timestep {t}")
            np.testing.assert_allclose(got_post[t], want_post[t], **TOL, err_msg=f"posterior chunk, timestep {t}")
        assert max(batches) > 1, f"no request shared a forward pass: batches {batches}"
        assert "warm-up: batch sizes 1,4 (--batch-sizes)" in srv.log(), srv.log()
        assert "then captured as CUDA graphs" in srv.log(), srv.log()
        # each prior pass of 2 padded by 2 rows (batches: one entry per request); posteriors add more
        assert srv.metric("act_serve_padded_rows_total") >= sum(b == 2 for b in batches) > 0, batches
        for kind in ("weights", "activations", "workspace"):
            assert srv.metric(f'act_serve_device_memory_bytes{{kind="{kind}"}}') > 0, srv.http("/metrics")[1]
        own = sum(srv.metric(f'act_serve_device_memory_bytes{{kind="{k}"}}')
                  for k in ("weights", "activations", "workspace"))
        assert srv.metric('act_serve_device_memory_driver_bytes{kind="held"}') == own, srv.http("/metrics")[1]
        assert srv.metric('act_serve_device_memory_driver_bytes{kind="total"}') > own
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log()


def test_act_serve_says_when_its_steps_run_without_graphs(act_serve, model, emu_env, tmp_path):
    """ACT_CUDA_GRAPHS=0: the warm-up line says no graphs are captured (it said "captured as CUDA
    graphs" whatever the switch), and the emulator instantiates none."""
    actw, _, _ = model
    srv = Server(act_serve, actw, tmp_path, "--max-batch", 2, env=dict(emu_env, ACT_CUDA_GRAPHS="0",
                                                                       ACT_EMU_TRACE="1"), device="cuda")
    try:
        srv.wait_ready(timeout=300)
        log = srv.log()
        assert "no graphs (ACT_CUDA_GRAPHS=0)" in log and "captured as CUDA graphs" not in log, log
        assert "graph instantiated" not in log, log
    finally:
        srv.stop()


def test_act_serve_reports_a_device_fault_and_turns_unhealthy(act_serve, model, emu_env, tmp_path):
    # the emulator faults every operation once this file exists (ACT_EMU_FAULT_FILE), as a GPU
    # with a sticky error would: the batch in flight gets ERROR internal, /healthz turns 503
    actw, cfg, _ = model
    fault = tmp_path / "fault-now"
    env = dict(emu_env, ACT_EMU_FAULT_FILE=str(fault))
    srv = Server(act_serve, actw, tmp_path, "--max-batch", 2, env=env, device="cuda")
    try:
        srv.wait_ready(timeout=300)
        assert srv.http("/healthz") == (200, "ok\n")
        c = ActClient("127.0.0.1", srv.port, timeout=300)
        rng = np.random.default_rng(5)
        h, w = cfg["vision_backbone"]["image_shape"]
        q = rng.standard_normal(cfg["obs_dim"]).astype(np.float32)
        imgs = {cam: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for cam in cfg["camera_names"]}
        good = c.predict(q, imgs)
        assert np.isfinite(good).all() and srv.metric("act_serve_failing") == 0
        fault.touch()
        with pytest.raises(ActServerError) as e:
            c.predict(q, imgs)
        assert e.value.name == "internal" and "inference failed" in e.value.message, e.value
        status, body = srv.http("/healthz")
        # the CUDA error as a GPU would word it, from the call that found it
        assert status == 503 and body.startswith("failing: ") and "illegal memory access" in body, (status, body)
        assert srv.metric("act_serve_failing") == 1
        assert "injected fault" in srv.log() and "/healthz says failing" in srv.log()
        assert srv.proc.poll() is None, "act-serve exited on a device fault instead of reporting it"
    finally:
        srv.stop()


def test_act_serve_algo_cache_spares_a_restart_the_measurements(act_serve, model, emu_env, tmp_path):
    """--algo-cache FILE: the first server's warm-up measures every conv/GEMM shape of the batch
    sizes it runs (max-batch 5: auto's 1, 2, 4 and 5) and writes one line each; a restart with the
    same file loads them (ACT_CUDA_ALGO_LOG says so), measures nothing and adds no line. Both
    give the same chunk."""
    actw, cfg, _ = model
    cache = tmp_path / "algos.txt"
    env = dict(emu_env, ACT_CUDA_ALGO_LOG="1")
    rng = np.random.default_rng(9)
    h, w = cfg["vision_backbone"]["image_shape"]
    q = rng.standard_normal(cfg["obs_dim"]).astype(np.float32)
    imgs = {cam: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for cam in cfg["camera_names"]}
    chunks, logs = [], []
    for start in range(2):
        (tmp_path / f"s{start}").mkdir()
        srv = Server(act_serve, actw, tmp_path / f"s{start}", "--max-batch", 5, "--precision", "bf16",
                     "--algo-cache", cache, env=env, device="cuda")
        try:
            srv.wait_ready(timeout=300)
            chunks.append(ActClient("127.0.0.1", srv.port, timeout=300).predict(q, imgs))
            assert srv.metric("act_serve_warmup_seconds") > 0
        finally:
            assert srv.stop() == 0, srv.log()
        logs.append(srv.log())
        if start == 0:
            lines = cache.read_text().splitlines()
    assert all("warm-up: batch sizes 1,2,4,5 (--batch-sizes)" in log for log in logs), logs[0]
    measured = [l for l in logs[0].splitlines() if l.startswith("act-engine: algo: cu")]
    assert len(measured) >= 4 and len(lines) == len(measured), (measured, lines)
    assert all(l.startswith("act-algo 1 ") for l in lines), lines
    assert not [l for l in logs[1].splitlines() if l.startswith("act-engine: algo: cu")], logs[1]
    assert logs[1].count("choices loaded, 0 of other") == 2, logs[1]
    assert cache.read_text().splitlines() == lines
    np.testing.assert_array_equal(chunks[0], chunks[1])


def test_act_serve_comes_up_when_no_step_can_be_captured(act_serve, model, emu_env, tmp_path):
    """Every capture invalidated (ACT_EMU_CAPTURE=invalidate, as a library call a capture forbids
    would leave it): each batch size's step falls back to running eagerly, said once per step
    (its retry is 100 steps away, past the warm-up), so warm-up finishes and the server answers
    as the CPU does."""
    actw, cfg, _ = model
    rng = np.random.default_rng(11)
    h, w = cfg["vision_backbone"]["image_shape"]
    q = rng.standard_normal(cfg["obs_dim"]).astype(np.float32)
    imgs = {cam: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for cam in cfg["camera_names"]}
    chunks = {}
    for dev, env in (("cpu", emu_env), ("cuda", dict(emu_env, ACT_EMU_CAPTURE="invalidate"))):
        (tmp_path / dev).mkdir()
        srv = Server(act_serve, actw, tmp_path / dev, "--max-batch", 2, "--precision", "fp32", env=env, device=dev)
        try:
            srv.wait_ready(timeout=300)
            chunks[dev] = ActClient("127.0.0.1", srv.port, timeout=300).predict(q, imgs)
        finally:
            assert srv.stop() == 0, srv.log()
        if dev == "cuda":
            said = [l for l in srv.log().splitlines() if "graph capture failed" in l]
            assert said and all("previous error during capture" in l and "runs without a graph for its next "
                                "100 steps, then tries a capture again (retry 1 of 3)" in l
                                for l in said), srv.log()[-3000:]
            for b in (1, 2):   # once per step of each warmed batch size, never again
                assert 0 < sum(f"act-engine: batch {b} (" in l for l in said) <= 2, said
    np.testing.assert_allclose(chunks["cuda"], chunks["cpu"], **TOL)


def test_cuda_graphs_off_captures_nothing(act_infer, model, emu_env):
    """ACT_CUDA_GRAPHS=0: no step is captured (the emulator instantiates no graph), and bench
    reports graphs off as it does for --no-graph; =2 is refused"""
    actw, _, _ = model
    base = [act_infer, "bench", "--model", actw, "--device", "cuda", "--batch", 1, "--iters", 2, "--warmup", 1,
            "--profile-iters", 0]
    for graphs, made in (("1", True), ("0", False)):
        p = _run(base, dict(emu_env, ACT_EMU_TRACE="1", ACT_CUDA_GRAPHS=graphs))
        assert ("graph instantiated" in p.stderr) == made, (graphs, p.stderr[-2000:])
        device = next(line for line in p.stdout.splitlines() if line.startswith("device"))
        assert device.endswith(", CUDA graphs" if made else ", no graphs"), (graphs, device)
    p = subprocess.run([str(c) for c in base], capture_output=True, text=True, timeout=300,
                       env=dict(emu_env, ACT_CUDA_GRAPHS="2"))
    assert p.returncode != 0 and "ACT_CUDA_GRAPHS=2: expected 0 or 1" in p.stderr, p.stderr


def test_a_long_action_chunk_runs_on_cuda_as_on_cpu(act_infer, make_cfg, make_model, emu_env, tmp_path):
    """pred_horizon 100 at head size 64 (the ACT paper's chunk and head size): a head's K and V of
    the decoder's self-attention (100 keys) and of the posterior's (2 + 100) no longer fit the
    attention kernel's 48 KB of shared memory; the CUDA backend used to refuse the model at its
    first step (and serve only prior requests of a chunk of 89). Prior and posterior through eval
    (which runs both), CUDA fp32 against the CPU."""
    cfg = make_cfg(pred_horizon=100, num_action_steps=50, head={"hidden_dim": 128, "nheads": 2,
                                                                "dim_feedforward": 64})
    actw, _ = make_model(tmp_path, cfg, 77)
    eps = tmp_path / "episodes"
    eps.mkdir()
    h, w = cfg["vision_backbone"]["image_shape"]
    make_episodes.make_episode(str(eps / "episode_0.hdf5"), 6, h, w, list(cfg["camera_names"]), False, True,
                               seed=5, obs_dim=cfg["obs_dim"], action_dim=cfg["action_dim"])
    sums = {}
    for dev in ("cpu", "cuda"):
        out = tmp_path / f"{dev}.json"
        _run([act_infer, "eval", "--model", actw, "--episodes", eps, "--device", dev, "--batch", 3, "--json", out],
             emu_env)
        sums[dev] = json.loads(out.read_text())
    for metric in ("action_l1", "action_mse", "val_l1", "val_kl", "val_loss"):
        a, b = sums["cuda"]["episodes"][0][metric], sums["cpu"]["episodes"][0][metric]
        assert np.isclose(a, b, **TOL), (metric, a, b)
    for dev in ("cpu", "cuda"):
        _run([act_infer, "predict", "--model", actw, "--episode", eps / "episode_0.hdf5", "--out",
              tmp_path / f"{dev}.npy", "--device", dev, "--batch", 3], emu_env)
    np.testing.assert_allclose(np.load(tmp_path / "cuda.npy"), np.load(tmp_path / "cpu.npy"), **TOL)


def test_compare_torch_rehearses_on_the_emulator(act_infer, model, emu_env, tmp_path):
    """device_check.sh's bench and chunk100 rows without a GPU: act-infer on the emulated GPU, the
    torch peers on the CPU (--peer-device cpu). The output check is real (CUDA fp32 and bf16 vs
    torch eager fp32), the times are not, and the report says so."""
    actw, _, d = model
    out = tmp_path / "compare.json"
    p = _run([sys.executable, REPO / "bench" / "compare_torch.py", "--device", "cuda", "--peer-device", "cpu",
              "--ckpt", d / "m.pt", "--config", d / "m.yaml", "--model", actw, "--batch", 1,
              "--precision", "fp32,bf16", "--peers", "eager", "--iters", 2, "--warmup", 1, "--threads", 1,
              "--act-infer", act_infer, "--workdir", tmp_path / "work", "--json", out], emu_env)
    assert "REHEARSAL: the torch peers ran on the cpu" in p.stdout, p.stdout
    r = json.loads(out.read_text())
    assert r["device"] == "cuda" and r["peer_device"] == "cpu"
    assert "emulator" in r["ours"]["fp32"]["device_name"], r["ours"]["fp32"]["device_name"]
    ours = {c["precision"]: c for c in r["checks"] if c["ours"]}
    assert set(ours) == {"fp32", "bf16"} and all(c["ok"] for c in ours.values()), r["checks"]
    assert ours["fp32"]["rel_diff"] <= 1e-4 and ours["bf16"]["rel_diff"] <= 2e-2, ours
    # the bf16 peer is autocast on a GPU only; the GPU goals are still judged (the rows' logic)
    assert next(x for x in r["peers"] if x["precision"] == "bf16")["status"].startswith("n/a")
    assert any(g["goal"].startswith("H200 batch 1 fp32 >= 10x") for g in r["goals"]), r["goals"]
