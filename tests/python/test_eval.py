"""act-infer eval / eval-merge: the metrics against the PyTorch reference computing the same
numbers here, shard + merge equal to one run, failure handling (--keep-going) with broken files,
saved predictions, plots, episode order.

Metrics (issue "act-infer eval"), per episode, for t + k < T (k = chunk step):
  action_l1 / action_mse / per_joint_l1: prior chunk (z = 0) vs action[t + k], raw units;
  val_l1: posterior chunk (z = mu) vs normalized targets; val_kl: mean over t of the KL summed
  over latent dims; val_loss = val_l1 + kl_weight * val_kl (the seed's compute_loss with z = mu).
One small model and four tiny episodes are shared by the module (the CI machine has 2 cores)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

import act_reference
from conftest import episode_for

TOL = 1e-4  # relative, fp32 CPU engine vs the float32 PyTorch reference
BATCH = 4
# index -> (T, gzip, chunked); T = 3 is shorter than the horizon (6): every chunk is padded
EPISODES = {1: (7, True, True), 2: (3, False, False), 3: (5, True, True), 10: (9, False, True)}


def run(binary, *args, check_rc=None, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    p = subprocess.run([str(binary), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=900, env=env)
    if check_rc is not None:
        assert p.returncode == check_rc, f"rc {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def setup(tmp_path_factory, make_cfg, make_model, act_infer, hdf5):
    d = tmp_path_factory.mktemp("eval")
    cfg = make_cfg()
    actw, agent = make_model(d, cfg, 21)
    eps = d / "episodes"
    eps.mkdir()
    for i, (T, gz, chunked) in EPISODES.items():
        episode_for(cfg, eps / f"episode_{i}.hdf5", T, gz, chunked, seed=100 + i)
    single = d / "single.json"
    preds = d / "preds"
    p = run(act_infer, "eval", "--model", actw, "--episodes", eps, "--device", "cpu", "--batch", BATCH,
            "--json", single, "--save-predictions", preds, check_rc=0)
    return {"dir": d, "cfg": cfg, "agent": agent, "actw": actw, "eps": eps, "single": json.loads(single.read_text()),
            "single_path": single, "preds": preds, "stderr": p.stderr, "stdout": p.stdout}


def reference_sums(agent, cfg, path):
    """The reference's sums for one episode, in float64. Chunk step k at timestep t is
    action[t - (obs_horizon-1) + k] (the step the seed's select_action executes at t is
    chunk[obs_horizon-1]); steps outside the episode are masked."""
    cams = list(cfg["camera_names"])
    with h5py.File(path, "r") as f:
        action = f["action"][:].astype(np.float32)
        qpos = f["observations/qpos"][:].astype(np.float32)
        images = {c: f[f"observations/images/{c}"][:] for c in cams}
    T, H, back = len(action), cfg["pred_horizon"], cfg["obs_horizon"] - 1
    idx = np.arange(T)[:, None] - back + np.arange(H)[None, :]
    tg, pad = action[np.clip(idx, 0, T - 1)], (idx < 0) | (idx >= T)
    r = act_reference.posterior(agent, qpos, images, tg, pad)
    valid = ~pad
    d = (r["prior"].astype(np.float64) - tg)[valid]            # [n_valid, A]
    tn = agent.normalization.normalize_action(torch.from_numpy(tg)).numpy()
    dv = (r["actions_norm"].astype(np.float64) - tn)[valid]
    return {"l1": np.abs(d).sum(), "sq": (d * d).sum(), "count": d.size, "joint_l1": np.abs(d).sum(axis=0),
            "val_l1": np.abs(dv).sum(), "kl": r["kl"].astype(np.float64).sum(), "kl_count": T, "loss": r["loss"]}


def means(s, kl_weight):
    A = len(s["joint_l1"])
    m = {"action_l1": s["l1"] / s["count"], "action_mse": s["sq"] / s["count"], "val_l1": s["val_l1"] / s["count"],
         "val_kl": s["kl"] / s["kl_count"], "per_joint_l1": np.asarray(s["joint_l1"]) / (s["count"] / A)}
    m["val_loss"] = m["val_l1"] + kl_weight * m["val_kl"]
    return m


def close(a, b, tol=TOL):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.all(np.abs(a - b) <= tol * np.maximum(np.abs(b), 1e-6)), (a, b)


def test_metrics_match_the_pytorch_reference(setup):
    cfg, agent, s = setup["cfg"], setup["agent"], setup["single"]
    kw = float(cfg["head"]["kl_weight"])
    assert s["kl_weight"] == pytest.approx(kw)
    total = None
    for e in s["episodes"]:
        assert e["status"] == "ok"
        ref = reference_sums(agent, cfg, setup["eps"] / e["name"])
        assert e["steps"] == ref["kl_count"] and e["valid_elements"] == ref["count"]
        m = means(ref, kw)
        for key in ("action_l1", "action_mse", "val_l1", "val_kl", "val_loss", "per_joint_l1"):
            ok, detail = close(e[key], m[key])
            assert ok, (e["name"], key, detail)
        ok, detail = close(e["val_loss"], ref["loss"])  # the seed's loss formula, whole episode as a batch
        assert ok, (e["name"], "seed loss", detail)
        if total is None:
            total = {k: np.asarray(v, np.float64) for k, v in ref.items() if k != "loss"}
        else:
            for k in total:
                total[k] = total[k] + ref[k]
    m = means(total, kw)
    o = s["overall"]
    for key in ("action_l1", "action_mse", "val_l1", "val_kl", "val_loss", "per_joint_l1"):
        ok, detail = close(o[key], m[key])
        assert ok, ("overall", key, detail)
    assert o["episodes"] == len(EPISODES) and o["failed"] == 0
    assert o["timesteps"] == sum(T for T, _, _ in EPISODES.values())
    tp = o["throughput"]
    assert tp["timesteps_per_s"] > 0 and tp["images_per_s"] == pytest.approx(3 * tp["timesteps_per_s"])
    assert 0 < tp["reader_wait_s"] < tp["elapsed_s"]   # at least the first batch is waited for
    # steady: from the third step at each batch size on. Windows of 4 over T = 7, 3, 5, 9 (in
    # episode order): 4 3 | 3 | 4 1 | 4 4 1, so only the last two 4s count
    seen, steady = {}, 0
    for _, (T, _, _) in sorted(EPISODES.items()):
        for t in range(0, T, BATCH):
            n = min(BATCH, T - t)
            steady += n if seen.get(n, 0) >= 2 else 0
            seen[n] = seen.get(n, 0) + 1
    assert tp["steady_timesteps"] == steady == 8
    assert 0 < tp["steady_s"] < tp["elapsed_s"]
    assert tp["steady_timesteps_per_s"] == pytest.approx(tp["steady_timesteps"] / tp["steady_s"])
    assert s["device"] == "cpu" and s["precision"] == "fp32" and len(s["model_hash"]) == 16
    assert isinstance(s["device_name"], str) and s["device_name"]


def _eval_lines(act_infer, setup, out_dir, *extra):
    out, preds = out_dir / "s.json", out_dir / "preds"
    p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"], "--device", "cpu", *extra,
            "--json", out, "--save-predictions", preds, check_rc=0)
    return json.loads(out.read_text()), preds, [l for l in p.stdout.splitlines() if l.startswith("steps: ")]


@pytest.mark.parametrize("pad,batch", [("on", BATCH), ("few", 8)])
def test_padded_last_batches_give_the_same_metrics(setup, act_infer, tmp_path, pad, batch):
    """--pad-batches on: every step runs --batch rows, an episode's last, partial batch padded with
    stand-in rows that are computed and dropped; few (cuda's auto): a partial batch runs its own
    size while fewer than 4 sizes ran, then pads up to the smallest that ran. The metrics and
    predictions are the unpadded run's (rows are independent; the CPU's GEMMs round differently by
    batch size: ~1e-6 on AVX-512, 1.5e-5 on an AVX2 AMD EPYC, session 32), and the printout and
    summary count the padding."""
    cfg, agent = setup["cfg"], setup["agent"]
    s, preds, line = _eval_lines(act_infer, setup, tmp_path, "--batch", batch, "--pad-batches", pad)
    plain = setup["single"]
    kw = float(cfg["head"]["kl_weight"])
    for e, e0 in zip(s["episodes"], plain["episodes"]):
        m = means(reference_sums(agent, cfg, setup["eps"] / e["name"]), kw)
        for key in ("action_l1", "action_mse", "val_l1", "val_kl", "val_loss", "per_joint_l1"):
            ok, detail = close(e[key], m[key])
            assert ok, (e["name"], key, detail)
            ok, detail = close(e[key], e0[key], 1e-5)
            assert ok, (e["name"], key, "padded vs not", detail)
        np.testing.assert_allclose(np.load(preds / e["name"].replace(".hdf5", ".npy")),
                                   np.load(setup["preds"] / e["name"].replace(".hdf5", ".npy")), rtol=1e-4, atol=2e-5)
    # the steps' real timesteps: windows over T = 7, 3, 5, 9 in episode order
    steps = [min(batch, T - t) for _, (T, _, _) in sorted(EPISODES.items()) for t in range(0, T, batch)]
    tp = s["overall"]["throughput"]
    if pad == "on":   # 4 3 | 3 | 4 1 | 4 4 1, every one run at 4: all but the first two steady
        pad_rows, sizes = sum(batch - n for n in steps), "4"
        assert tp["steady_timesteps"] == sum(steps[2:]) == 17
    else:             # 7 | 3 | 5 | 8 1: 7, 3, 5 and 8 run as they are; then 1 is padded up to 3
        pad_rows, sizes = 2, "8, 7, 5, 3"
        assert steps == [7, 3, 5, 8, 1] and tp["steady_timesteps"] == 0
    assert tp["padded_rows"] == pad_rows and plain["overall"]["throughput"]["padded_rows"] == 0
    assert line == [f"steps: at batch size{'s' if ',' in sizes else ''} {sizes} ({pad_rows} rows computed and "
                    "dropped, episodes' last batches padded up to a size that ran: --pad-batches)"], line
    # the CPU's default is off: three sizes, and no advice to pad (a size costs nothing to set up
    # on the CPU, and every padded row its share; on CUDA the line says how to set up fewer)
    line = [l for l in setup["stdout"].splitlines() if l.startswith("steps: ")]
    assert line == ["steps: at batch sizes 4, 3, 1"], line


def test_predict_pads_as_asked_and_says_how_it_stepped(setup, act_infer, tmp_path):
    """T = 9 in steps of 4, 4, 1: on runs the last at 4; off and few (two sizes: under few's 4)
    at 1. Predictions alike either way."""
    for pad, says in (("on", "9 timesteps in 3 steps of 4 rows (the last padded: --pad-batches)"),
                      ("off", "9 timesteps in 3 steps of 4 rows, the last of 1"),
                      ("few", "9 timesteps in 3 steps of 4 rows, the last of 1")):
        p = run(act_infer, "predict", "--model", setup["actw"], "--episode", setup["eps"] / "episode_10.hdf5", "--out",
                tmp_path / "p.npy", "--device", "cpu", "--batch", BATCH, "--pad-batches", pad, check_rc=0)
        assert "act-infer predict: " + says in p.stderr, p.stderr
        np.testing.assert_allclose(np.load(tmp_path / "p.npy"), np.load(setup["preds"] / "episode_10.npy"),
                                   rtol=1e-5, atol=1e-6)
    bad = {"eval": ["--episodes", setup["eps"]],
           "predict": ["--episode", setup["eps"] / "episode_1.hdf5", "--out", tmp_path / "x.npy"]}
    for cmd, args in bad.items():
        p = run(act_infer, cmd, "--model", setup["actw"], *args, "--pad-batches", "maybe", check_rc=2)
        assert "--pad-batches must be auto, few, on or off, got 'maybe'" in p.stderr, p.stderr


def test_predict_refuses_an_out_that_is_a_posterior_file(setup, act_infer, tmp_path):
    """--out DIR/kl.npy beside --posterior-dir DIR (or ./kl.npy beside '.'): both outputs would go
    through one temporary file and leave a mixed, half-moved set. Refused before any work."""
    ep = setup["eps"] / "episode_1.hdf5"
    pd = tmp_path / "pd"
    (tmp_path / "sub").mkdir()
    for out, pdir, cwd in ((pd / "kl.npy", pd, None), ("mu.npy", ".", pd), (tmp_path / "sub" / ".." / "pd" /
                                                                            "post_actions.npy", pd, None)):
        pd.mkdir(exist_ok=True)
        p = subprocess.run([str(act_infer), "predict", "--model", str(setup["actw"]), "--episode", str(ep), "--out",
                            str(out), "--posterior-dir", str(pdir), "--device", "cpu"], capture_output=True, text=True,
                           timeout=300, cwd=cwd)
        assert p.returncode == 2 and "is the --posterior-dir's" in p.stderr, p.stderr
        assert list(pd.iterdir()) == [], list(pd.iterdir())
    # a run that fails leaves no --posterior-dir it made (one that was there stays, as above)
    for model, out in ((tmp_path / "absent.actw", tmp_path / "x.npy"), (setup["actw"], tmp_path / "new" / "kl.npy")):
        p = subprocess.run([str(act_infer), "predict", "--model", str(model), "--episode", str(ep), "--out", str(out),
                            "--posterior-dir", str(tmp_path / "new"), "--device", "cpu"], capture_output=True, text=True,
                           timeout=300)
        assert p.returncode in (1, 2) and not (tmp_path / "new").exists(), p.stderr
    run(act_infer, "predict", "--model", setup["actw"], "--episode", ep, "--out", pd / "prior.npy", "--posterior-dir",
        pd, "--device", "cpu", check_rc=0)
    assert sorted(f.name for f in pd.iterdir()) == ["kl.npy", "logvar.npy", "mu.npy", "post_actions.npy", "prior.npy"]
    assert np.load(pd / "kl.npy").shape == (EPISODES[1][0],)


def test_summary_names_how_frames_were_read(setup):
    """Each episode's summary says how its cameras' frames were read (cameras grouped when they
    share a way), and the printout names the most common way with the count of the others."""
    cams = ", ".join(setup["cfg"]["camera_names"])
    ways = set()
    for e in setup["single"]["episodes"]:
        T, gz, chunked = EPISODES[int(e["name"][len("episode_"):-len(".hdf5")])]
        want = "gzip chunks of 1 frames" if gz else "pread, chunks of 1 frames" if chunked else "pread, contiguous"
        assert e["reader"].startswith(cams + ": ") and want in e["reader"], (e["name"], e["reader"])
        ways.add(e["reader"])
    assert len(ways) == 3   # gzip, raw chunked, raw contiguous
    line = [l for l in setup["stdout"].splitlines() if l.startswith("frames read: ")]
    assert len(line) == 1 and "gzip chunks of 1 frames" in line[0] and "(2 of 4 episodes;" in line[0], line


def test_episodes_run_in_episode_number_order(setup):
    names = [e["name"] for e in setup["single"]["episodes"]]
    assert names == [f"episode_{i}.hdf5" for i in sorted(EPISODES)]
    assert [e["index"] for e in setup["single"]["episodes"]] == list(range(len(EPISODES)))


def test_progress_bar_stays_quiet_in_a_pipe(setup):
    assert "\r" not in setup["stderr"]
    assert "overall:" in setup["stdout"]


def test_saved_predictions_equal_predict(setup, act_infer, tmp_path):
    cfg = setup["cfg"]
    for i, (T, _, _) in EPISODES.items():
        saved = np.load(setup["preds"] / f"episode_{i}.npy")
        assert saved.shape == (T, cfg["pred_horizon"], cfg["action_dim"]) and saved.dtype == np.float32
    out = tmp_path / "p.npy"
    run(act_infer, "predict", "--model", setup["actw"], "--episode", setup["eps"] / "episode_10.hdf5", "--out", out,
        "--device", "cpu", "--batch", BATCH, check_rc=0)
    # eval decodes the prior beside the posterior in one act_run, so GEMM shapes differ: not bitwise
    np.testing.assert_allclose(np.load(setup["preds"] / "episode_10.npy"), np.load(out), rtol=1e-5, atol=1e-6)


def _strip(summary):
    """The parts of a summary that must not depend on sharding (timings and shard lists do)."""
    s = json.loads(json.dumps(summary))
    for k in ("shards",):
        s.pop(k)
    s["overall"].pop("throughput")
    return s


def test_shards_merged_equal_a_single_run(setup, act_infer, tmp_path):
    parts = []
    for i in range(3):
        out = tmp_path / f"s{i}.json"
        run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"], "--device", "cpu",
            "--batch", BATCH, "--shard", f"{i}/3", "--json", out, check_rc=0)
        parts.append(out)
    s0 = json.loads(parts[0].read_text())
    assert [e["name"] for e in s0["episodes"]] == ["episode_1.hdf5", "episode_10.hdf5"]  # every 3rd from 0
    merged = tmp_path / "all.json"
    run(act_infer, "eval-merge", parts[2], parts[0], parts[1], "--json", merged, check_rc=0)
    m = json.loads(merged.read_text())
    single = setup["single"]
    assert m["shards"] == [0, 1, 2] and m["shard_count"] == 3
    a, b = _strip(m), _strip(single)
    b["shard_count"] = 3
    assert a == b  # bit-identical metrics and sums, episodes in the single run's order
    assert m["overall"]["throughput"]["timesteps_per_s"] > 0
    waits = [json.loads(p.read_text())["overall"]["throughput"]["reader_wait_s"] for p in parts]
    assert m["overall"]["throughput"]["reader_wait_s"] == pytest.approx(sum(waits))
    for k in ("steady_s", "steady_timesteps", "padded_rows"):   # the shards' sums
        assert m["overall"]["throughput"][k] == pytest.approx(
            sum(json.loads(p.read_text())["overall"]["throughput"][k] for p in parts))
    assert m["overall"]["timesteps"] == single["overall"]["timesteps"]
    assert (m["batch"], m["pad_batches"]) == (single["batch"], single["pad_batches"]) == (BATCH, "off")


def test_a_merge_of_shards_run_differently_says_it_is_not_bit_exact(setup, act_infer, tmp_path):
    """A sum's last bits depend on the rows each step computed: shards at different --batch, or
    padded by --pad-batches few (by the sizes their own process ran before), match a single run
    only to rounding. The summaries record batch and pad_batches; the merge writes null / "mixed"
    where they differ and says why the figures may differ from a single run's."""
    parts = []
    for i, extra in enumerate((["--batch", 3], ["--batch", BATCH, "--pad-batches", "few"])):
        out = tmp_path / f"s{i}.json"
        run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"], "--device", "cpu",
            "--shard", f"{i}/2", "--json", out, *extra, check_rc=0)
        parts.append(out)
    assert [(json.loads(p.read_text())["batch"], json.loads(p.read_text())["pad_batches"]) for p in parts] == \
        [(3, "off"), (BATCH, "few")]
    merged = tmp_path / "all.json"
    p = run(act_infer, "eval-merge", *parts, "--json", merged, check_rc=0)
    m = json.loads(merged.read_text())
    assert m["batch"] is None and m["pad_batches"] == "mixed", (m["batch"], m["pad_batches"])
    assert "different --batch sizes" in p.stderr and "not bit for bit" in p.stderr, p.stderr
    for i in range(2):   # the same batch size, padded by few: said too
        run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"], "--device", "cpu",
            "--shard", f"{i}/2", "--json", parts[i], "--batch", BATCH, "--pad-batches", "few", check_rc=0)
    p = run(act_infer, "eval-merge", *parts, "--json", merged, check_rc=0)
    assert json.loads(merged.read_text())["pad_batches"] == "few" and "--pad-batches few" in p.stderr, p.stderr


def test_a_merge_with_an_older_summary_calls_its_batch_unknown_not_different(setup, act_infer, tmp_path):
    """A summary from before batch/pad_batches were recorded has neither: the merge's are then
    unknown (null), not "mixed", and no note claims the shards differ. A lone unsharded run
    with --pad-batches few is no sharded merge either: no note."""
    parts = []
    for i in range(2):
        out = tmp_path / f"s{i}.json"
        run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"], "--device", "cpu",
            "--shard", f"{i}/2", "--json", out, "--batch", BATCH, "--pad-batches", "off", check_rc=0)
        parts.append(out)
    old = json.loads(parts[1].read_text())
    del old["batch"], old["pad_batches"]
    parts[1].write_text(json.dumps(old))
    merged = tmp_path / "all.json"
    p = run(act_infer, "eval-merge", *parts, "--json", merged, check_rc=0)
    m = json.loads(merged.read_text())
    assert m["batch"] is None and m["pad_batches"] is None, (m["batch"], m["pad_batches"])
    assert "note:" not in p.stderr, p.stderr
    alone = tmp_path / "alone.json"
    run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"], "--device", "cpu",
        "--json", alone, "--batch", BATCH, "--pad-batches", "few", check_rc=0)
    p = run(act_infer, "eval-merge", alone, "--json", merged, check_rc=0)
    assert json.loads(merged.read_text())["pad_batches"] == "few" and "note:" not in p.stderr, p.stderr


def test_summary_records_episode_numbers_and_the_list(setup):
    s = setup["single"]
    assert [(e["name"], e["index"], e["number"]) for e in s["episodes"]] == [
        ("episode_1.hdf5", 0, 1), ("episode_2.hdf5", 1, 2), ("episode_3.hdf5", 2, 3), ("episode_10.hdf5", 3, 10)]
    assert s["episode_list"]["count"] == 4 and len(s["episode_list"]["hash"]) == 16
    assert s["obs_horizon"] == 1


def test_merge_refuses_shards_of_different_episode_lists(setup, act_infer, tmp_path):
    """A directory that changed between array tasks: positions shift, so a merge would count
    one episode twice and drop another (and say nothing)."""
    d = tmp_path / "eps"
    d.mkdir()
    for n in (1, 2, 3, 10):
        shutil.copy(setup["eps"] / f"episode_{n}.hdf5", d / f"episode_{n}.hdf5")
    s0, s1 = tmp_path / "s0.json", tmp_path / "s1.json"
    run(act_infer, "eval", "--model", setup["actw"], "--episodes", d, "--device", "cpu", "--shard", "0/2",
        "--json", s0, check_rc=0)
    (d / "episode_2.hdf5").rename(tmp_path / "episode_2.hdf5")          # gone before task 1 ran
    shutil.copy(setup["eps"] / "episode_10.hdf5", d / "episode_11.hdf5")   # and one more came
    run(act_infer, "eval", "--model", setup["actw"], "--episodes", d, "--device", "cpu", "--shard", "1/2",
        "--json", s1, check_rc=0)
    p = run(act_infer, "eval-merge", s0, s1, "--json", tmp_path / "m.json", check_rc=1)
    assert "another episode list" in p.stderr and "same --episodes" in p.stderr, p.stderr
    assert not (tmp_path / "m.json").exists()
    # only the list's length changed (a file gone, none added): refused too
    (d / "episode_11.hdf5").unlink()
    run(act_infer, "eval", "--model", setup["actw"], "--episodes", d, "--device", "cpu", "--shard", "1/2",
        "--json", s1, check_rc=0)
    p = run(act_infer, "eval-merge", s0, s1, "--json", tmp_path / "m.json", check_rc=1)
    assert "another episode list" in p.stderr
    # the same names in another folder (other recordings: other sizes): another list
    other = tmp_path / "other"
    other.mkdir()
    for n, src in ((1, 3), (3, 10), (10, 1)):   # each name holds another episode than in d
        shutil.copy(setup["eps"] / f"episode_{src}.hdf5", other / f"episode_{n}.hdf5")
    run(act_infer, "eval", "--model", setup["actw"], "--episodes", other, "--device", "cpu", "--shard", "1/2",
        "--json", s1, check_rc=0)
    run(act_infer, "eval", "--model", setup["actw"], "--episodes", d, "--device", "cpu", "--shard", "0/2",
        "--json", s0, check_rc=0)   # d now: episode_1, 3, 10 (as other)
    p = run(act_infer, "eval-merge", s0, s1, "--json", tmp_path / "m.json", check_rc=1)
    assert "another episode list" in p.stderr and "names and sizes" in p.stderr, p.stderr
    # a hash that is not 16 hex digits is a damaged summary, not its first 16 characters
    bad = json.loads(s0.read_text())
    bad["episode_list"]["hash"] += "0"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    p = run(act_infer, "eval-merge", tmp_path / "bad.json", s1, "--json", tmp_path / "m.json", check_rc=1)
    assert '"episode_list" malformed' in p.stderr, p.stderr
    # a summary from before episode_list was kept still merges (nothing to check it against)
    old = json.loads(s1.read_text())
    old.pop("episode_list")
    (tmp_path / "old.json").write_text(json.dumps(old))
    s0b = json.loads(s0.read_text())
    s0b.pop("episode_list")
    (tmp_path / "old0.json").write_text(json.dumps(s0b))
    run(act_infer, "eval-merge", tmp_path / "old0.json", tmp_path / "old.json", "--json", tmp_path / "m.json",
        check_rc=0)
    assert "episode_list" not in json.loads((tmp_path / "m.json").read_text())


def test_merge_refuses_a_list_the_shards_do_not_cover(setup, act_infer, tmp_path):
    parts = []
    for i in range(2):
        out = tmp_path / f"s{i}.json"
        run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"], "--device", "cpu",
            "--shard", f"{i}/2", "--json", out, check_rc=0)
        parts.append(out)
    forged = json.loads(parts[1].read_text())
    forged["episodes"] = forged["episodes"][:1]      # a shard summary cut short by hand
    (tmp_path / "cut.json").write_text(json.dumps(forged))
    p = run(act_infer, "eval-merge", parts[0], tmp_path / "cut.json", "--json", tmp_path / "m.json", check_rc=1)
    assert "hold 3 episodes between them, but their list had 4" in p.stderr, p.stderr
    run(act_infer, "eval-merge", parts[0], parts[1], "--json", tmp_path / "m.json", check_rc=0)
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["episode_list"] == json.loads(parts[0].read_text())["episode_list"]


def test_obs_horizon_aligns_the_chunk_with_the_step_it_executes(make_cfg, make_model, act_infer, setup, tmp_path):
    """obs_horizon 2: chunk step k at t is action[t - 1 + k] (the seed's select_action executes
    chunk[1] at t); step 0 at t = 0 lies before the episode and is masked."""
    cfg = make_cfg(obs_horizon=2, num_action_steps=4)
    actw, agent = make_model(tmp_path, cfg, 21)
    out = tmp_path / "s.json"
    run(act_infer, "eval", "--model", actw, "--episodes", setup["eps"] / "episode_1.hdf5",
        setup["eps"] / "episode_2.hdf5", "--device", "cpu", "--batch", BATCH, "--json", out, check_rc=0)
    s = json.loads(out.read_text())
    assert s["obs_horizon"] == 2
    kw = float(cfg["head"]["kl_weight"])
    for e in s["episodes"]:
        ref = reference_sums(agent, cfg, setup["eps"] / e["name"])
        T, H = e["steps"], cfg["pred_horizon"]
        assert e["valid_elements"] == ref["count"] == cfg["action_dim"] * sum(
            1 for t in range(T) for k in range(H) if 0 <= t - 1 + k < T)
        m = means(ref, kw)
        for key in ("action_l1", "action_mse", "val_l1", "val_kl", "val_loss", "per_joint_l1"):
            ok, detail = close(e[key], m[key])
            assert ok, (e["name"], key, detail)
    # shards scored with another alignment (a summary from before it was kept reads as 1) do not merge
    parts = []
    for i in range(2):
        parts.append(tmp_path / f"o{i}.json")
        run(act_infer, "eval", "--model", actw, "--episodes", setup["eps"] / "episode_1.hdf5",
            setup["eps"] / "episode_2.hdf5", "--device", "cpu", "--shard", f"{i}/2", "--json", parts[-1], check_rc=0)
    old = json.loads(parts[1].read_text())
    for k in ("obs_horizon", "episode_list"):
        old.pop(k)
    parts[1].write_text(json.dumps(old))
    p = run(act_infer, "eval-merge", *parts, "--json", tmp_path / "m.json", check_rc=1)
    assert "summary 1 scored chunks with obs_horizon 1, summary 0 with 2" in p.stderr, p.stderr
    # the same weights at obs_horizon 1 score other numbers (the alignment is not ignored)
    one = setup["single"]["episodes"][0]
    assert one["name"] == "episode_1.hdf5" and one["action_l1"] != s["episodes"][0]["action_l1"]


def test_plots_chunk_error_uses_the_same_alignment(repo_root):
    sys.path.insert(0, str(repo_root / "tools"))
    import eval_plots
    rng = np.random.default_rng(5)
    T, H, A = 7, 4, 3
    pred, action = rng.normal(size=(T, H, A)), rng.normal(size=(T, A))
    for o in (1, 2, 4):
        want = [np.mean([abs(pred[t, k, j] - action[t - o + 1 + k, j]) for k in range(H) for j in range(A)
                         if 0 <= t - o + 1 + k < T]) for t in range(T)]
        assert np.allclose(eval_plots.chunk_error(pred, action, o), want), o


def test_shards_saving_into_one_folder_refuse_names_that_clash(setup, act_infer, tmp_path):
    """The clash check covers the whole list, not one shard's part: shard 0 and shard 1 would
    each write episode_1.npy into the same folder."""
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(setup["eps"] / "episode_2.hdf5", other / "episode_1.hdf5")
    for i in range(2):
        p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"] / "episode_1.hdf5",
                other / "episode_1.hdf5", "--device", "cpu", "--shard", f"{i}/2", "--save-predictions",
                tmp_path / "preds", check_rc=1)
        assert "would both save their predictions as episode_1.npy" in p.stderr, p.stderr


def test_merge_refuses_incomplete_or_foreign_sets(setup, act_infer, tmp_path):
    parts = []
    for i in range(2):
        out = tmp_path / f"s{i}.json"
        run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"] / "episode_2.hdf5",
            setup["eps"] / "episode_3.hdf5", "--device", "cpu", "--shard", f"{i}/2", "--json", out, check_rc=0)
        parts.append(out)
    p = run(act_infer, "eval-merge", parts[0], "--json", tmp_path / "x.json", check_rc=1)
    assert "shard 1/2 is missing" in p.stderr
    p = run(act_infer, "eval-merge", parts[0], parts[0], parts[1], "--json", tmp_path / "x.json", check_rc=1)
    assert "shard 0/2 appears in 2 summaries" in p.stderr
    other = json.loads(parts[1].read_text())
    other["model_hash"] = "0123456789abcdef"
    (tmp_path / "other.json").write_text(json.dumps(other))
    p = run(act_infer, "eval-merge", parts[0], tmp_path / "other.json", "--json", tmp_path / "x.json", check_rc=1)
    assert "only evals of one model merge" in p.stderr
    (tmp_path / "junk.json").write_text('{"format": "something-else"}')
    p = run(act_infer, "eval-merge", tmp_path / "junk.json", "--json", tmp_path / "x.json", check_rc=1)
    assert "junk.json" in p.stderr and "not an act-infer eval summary" in p.stderr
    (tmp_path / "cut.json").write_text(parts[0].read_text()[:200])
    p = run(act_infer, "eval-merge", tmp_path / "cut.json", "--json", tmp_path / "x.json", check_rc=1)
    assert "cut.json" in p.stderr and "invalid JSON" in p.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.fixture
def broken_set(setup, tmp_path):
    """episode_0 ok, episode_1 truncated, episode_2 ok, episode_3 with a corrupt image chunk."""
    d = tmp_path / "mixed"
    d.mkdir()
    src = setup["eps"]
    shutil.copy(src / "episode_1.hdf5", d / "episode_0.hdf5")
    data = (src / "episode_3.hdf5").read_bytes()
    (d / "episode_1.hdf5").write_bytes(data[: len(data) // 2])
    shutil.copy(src / "episode_10.hdf5", d / "episode_2.hdf5")
    shutil.copy(src / "episode_3.hdf5", d / "episode_3.hdf5")
    cam = setup["cfg"]["camera_names"][0]
    with h5py.File(d / "episode_3.hdf5", "r") as f:
        info = f[f"observations/images/{cam}"].id.get_chunk_info(2)
    with open(d / "episode_3.hdf5", "r+b") as f:
        f.seek(info.byte_offset + info.size // 2)
        f.write(b"\x00\xff" * 40)
    return d


def test_a_broken_episode_stops_eval_without_keep_going(setup, act_infer, broken_set, tmp_path):
    out = tmp_path / "s.json"
    p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", broken_set, "--device", "cpu",
            "--json", out, check_rc=1)
    assert "episode_1.hdf5" in p.stderr and "truncated" in p.stderr and "--keep-going" in p.stderr
    assert not out.exists()


def test_a_stop_names_the_episodes_left_with_older_predictions(setup, act_infer, broken_set, tmp_path):
    """Without --keep-going, episodes after the broken one are never evaluated: an earlier run's
    file for one of them is left as it was, and the stop says so instead of passing it off."""
    preds = tmp_path / "preds"
    preds.mkdir()
    old = np.full((1, 2, 3), 7, np.float32)
    np.save(preds / "episode_2.npy", old)
    p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", broken_set, "--device", "cpu",
            "--batch", BATCH, "--save-predictions", preds, check_rc=1)
    assert "2 episodes not evaluated; 1 of them still has an earlier run's predictions" in p.stderr, p.stderr
    assert "episode_2.npy" in p.stderr
    assert np.array_equal(np.load(preds / "episode_2.npy"), old)
    assert sorted(f.name for f in preds.iterdir()) == ["episode_0.npy", "episode_2.npy"]
    p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", broken_set, "--device", "cpu",
            "--batch", BATCH, check_rc=1)
    assert "2 episodes not evaluated\n" in p.stderr, p.stderr


def test_keep_going_reports_failures_and_evaluates_the_rest(setup, act_infer, broken_set, tmp_path):
    out = tmp_path / "s.json"
    p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", broken_set, "--device", "cpu",
            "--batch", BATCH, "--json", out, "--keep-going")
    assert p.returncode == 1, p.stderr
    s = json.loads(out.read_text())
    status = [(e["name"], e["status"]) for e in s["episodes"]]
    assert status == [("episode_0.hdf5", "ok"), ("episode_1.hdf5", "failed"), ("episode_2.hdf5", "ok"),
                      ("episode_3.hdf5", "failed")]
    cam = setup["cfg"]["camera_names"][0]
    assert "episode_1.hdf5" in s["episodes"][1]["error"] and "truncated" in s["episodes"][1]["error"]
    assert f"observations/images/{cam}" in s["episodes"][3]["error"]
    assert s["overall"]["failed"] == 2 and s["overall"]["episodes"] == 4
    # the good episodes score exactly what they scored in the clean run
    single = {e["name"]: e for e in setup["single"]["episodes"]}
    for name, orig in (("episode_0.hdf5", "episode_1.hdf5"), ("episode_2.hdf5", "episode_10.hdf5")):
        got = next(e for e in s["episodes"] if e["name"] == name)
        assert got["sums"] == single[orig]["sums"]
    assert s["overall"]["timesteps"] == single["episode_1.hdf5"]["steps"] + single["episode_10.hdf5"]["steps"]
    assert s["overall"]["sums"]["count"] == (single["episode_1.hdf5"]["sums"]["count"]
                                             + single["episode_10.hdf5"]["sums"]["count"])


def test_an_episode_whose_chunks_are_not_finite_fails_by_name(setup, act_infer, tmp_path):
    """A qpos of 3e38 is finite (act_run takes it) but normalizes to infinity: the model's chunk
    is NaN. That episode used to be 'ok', its NaN nulling every overall metric, with exit 0 (and
    its shard refused by the merge). It fails instead, naming the episode, the timestep and the
    likely cause; under --keep-going the rest are scored as in the clean run."""
    d = tmp_path / "eps"
    d.mkdir()
    shutil.copy(setup["eps"] / "episode_1.hdf5", d / "episode_0.hdf5")
    shutil.copy(setup["eps"] / "episode_10.hdf5", d / "episode_1.hdf5")
    with h5py.File(d / "episode_1.hdf5", "r+") as f:
        f["observations/qpos"][4, 0] = 3e38
    out = tmp_path / "s.json"
    p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", d, "--device", "cpu", "--batch", BATCH,
            "--json", out, check_rc=1)
    assert "episode_1.hdf5: timestep 4: the model's" in p.stderr and "is not finite" in p.stderr, p.stderr
    assert "dataset statistics" in p.stderr and not out.exists(), p.stderr
    p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", d, "--device", "cpu", "--batch", BATCH,
            "--json", out, "--keep-going", check_rc=1)
    s = json.loads(out.read_text())
    assert [(e["name"], e["status"]) for e in s["episodes"]] == [("episode_0.hdf5", "ok"), ("episode_1.hdf5", "failed")]
    assert "timestep 4" in s["episodes"][1]["error"] and "not finite" in s["episodes"][1]["error"]
    single = {e["name"]: e for e in setup["single"]["episodes"]}
    assert s["episodes"][0]["sums"] == single["episode_1.hdf5"]["sums"]
    assert all(s["overall"][k] is not None and np.isfinite(s["overall"][k]) for k in ("action_l1", "val_loss")), s
    # the last row of a batch is checked too (timestep BATCH - 1: the first batch's last row)
    with h5py.File(d / "episode_1.hdf5", "r+") as f:
        f["observations/qpos"][4, 0] = f["observations/qpos"][5, 0]
        f["observations/qpos"][BATCH - 1, 0] = 3e38
    p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", d, "--device", "cpu", "--batch", BATCH,
            "--json", out, check_rc=1)
    assert f"episode_1.hdf5: timestep {BATCH - 1}: the model's" in p.stderr, p.stderr


def test_a_failed_episode_leaves_no_predictions_file(setup, act_infer, broken_set, tmp_path):
    """An earlier run's episode_3.npy is not this run's answer for the now-broken episode_3:
    removed. The good episodes' files are complete and no temporary file is left."""
    preds = tmp_path / "preds"
    preds.mkdir()
    np.save(preds / "episode_3.npy", np.zeros((1, 2, 3), np.float32))
    p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", broken_set, "--device", "cpu",
            "--batch", BATCH, "--keep-going", "--save-predictions", preds)
    assert p.returncode == 1, p.stderr
    assert sorted(f.name for f in preds.iterdir()) == ["episode_0.npy", "episode_2.npy"]
    with h5py.File(broken_set / "episode_2.hdf5", "r") as f:
        assert np.load(preds / "episode_2.npy").shape[0] == f["action"].shape[0]


def test_an_episode_hdf5_cannot_check_says_hdf5s_reason(setup, act_infer, build_dir, tmp_path):
    """HDF5's own file check failing (here a disk's read error: tests/hold_open.c fails the open
    with EIO) is not "not an HDF5 file": the stop says the check failed and HDF5's reason."""
    shim = build_dir / "libact_test_hold_open.so"
    if not shim.is_file():
        pytest.skip(f"{shim} is not built (cmake target act_test_hold_open)")
    ep = setup["eps"] / "episode_1.hdf5"
    p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", ep, "--device", "cpu", check_rc=1,
            env_extra={"LD_PRELOAD": str(shim), "ACT_TEST_FAIL_OPEN": str(ep)})
    assert "episode_1.hdf5: cannot be checked as an HDF5 file (HDF5: " in p.stderr, p.stderr
    assert "Input/output error" in p.stderr and "not an HDF5 file" not in p.stderr, p.stderr


def test_an_unwritable_summary_path_fails_before_evaluating(setup, act_infer, tmp_path):
    p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"], "--device", "cpu",
            "--json", tmp_path / "no" / "such" / "dir" / "s.json", check_rc=1)
    assert "cannot write into" in p.stderr and "s.json" in p.stderr
    assert "overall:" not in p.stdout


def test_two_episodes_of_one_name_are_refused_when_saving(setup, act_infer, tmp_path):
    """--episodes a b with episode_1.hdf5 in both: one .npy would overwrite the other."""
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(setup["eps"] / "episode_2.hdf5", other / "episode_1.hdf5")
    p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"], other, "--device", "cpu",
            "--save-predictions", tmp_path / "preds", check_rc=1)
    assert "would both save their predictions as episode_1.npy" in p.stderr, p.stderr
    assert "overall:" not in p.stdout
    run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"], other, "--device", "cpu",
        check_rc=0)   # nothing saved: nothing to clash


def test_plots_are_written_per_episode(setup, act_infer, repo_root, tmp_path):
    pytest.importorskip("matplotlib")
    plots = tmp_path / "plots"
    env = {"ACT_PYTHON": sys.executable, "ACT_EVAL_PLOTS": str(repo_root / "tools" / "eval_plots.py")}
    run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"] / "episode_3.hdf5",
        setup["eps"] / "episode_2.hdf5", "--device", "cpu", "--plots", plots, "--json", tmp_path / "s.json",
        check_rc=0, env_extra=env)
    for stem in ("episode_3", "episode_2"):
        png = plots / f"{stem}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (plots / "predictions" / f"{stem}.npy").exists()


def test_reader_switches_name_a_value_they_do_not_take(setup, act_infer, tmp_path):
    """ACT_EPISODE_PREAD / ACT_EPISODE_INDEX take 0 or 1 like the engine's other switches: 'off'
    used to run the default unsaid, so an A/B comparison compared the default with itself."""
    for var in ("ACT_EPISODE_PREAD", "ACT_EPISODE_INDEX"):
        p = run(act_infer, "eval", "--model", setup["actw"], "--episodes", setup["eps"] / "episode_1.hdf5",
                "--device", "cpu", env_extra={var: "off"}, check_rc=0)
        assert f"ignoring {var}='off' (expected 0 or 1)" in p.stderr, p.stderr
