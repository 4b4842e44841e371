"""act-infer info / predict and the command line: usage errors, the predict outputs against the
PyTorch reference (prior, and the posterior with --posterior-dir), and broken episode files -
each must give a clear error naming the file and the dataset, never a crash.

One small model (SMALL_CFG, converted with tools/convert_checkpoint.py) is shared by the module;
episodes are tiny (a few timesteps) to keep the 2-core CI machine fast."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

import act_reference
import make_episodes

TOL = 1e-4  # ||engine - reference|| / ||reference||, fp32 on CPU


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def run(binary, *args, check_rc=None):
    p = subprocess.run([str(binary), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=600)
    if check_rc is not None:
        assert p.returncode == check_rc, f"rc {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def model(tmp_path_factory, make_cfg, make_model):
    """A converted small model: namespace-like dict with actw path, agent, cfg."""
    d = tmp_path_factory.mktemp("cli_model")
    cfg = make_cfg()
    actw, agent = make_model(d, cfg, 11)
    return {"actw": actw, "agent": agent, "cfg": cfg, "dir": d}


def make_ep(path, cfg, T, seed, gzip=True, chunked=True):
    make_episodes.make_episode(str(path), T, cfg["vision_backbone"]["image_shape"][0],
                               cfg["vision_backbone"]["image_shape"][1], list(cfg["camera_names"]), gzip, chunked,
                               seed=seed, obs_dim=cfg["obs_dim"], action_dim=cfg["action_dim"])
    return path


def load_episode(path, cams):
    with h5py.File(path, "r") as f:
        action = f["action"][:].astype(np.float32)
        qpos = f["observations/qpos"][:].astype(np.float32)
        images = {c: f[f"observations/images/{c}"][:] for c in cams}
    return action, qpos, images


def targets_of(action, H):
    """action[t:t+H] padded with the last action, and is_pad (t + k >= T) - the eval contract."""
    T = len(action)
    idx = np.arange(T)[:, None] + np.arange(H)[None, :]
    return action[np.minimum(idx, T - 1)], idx >= T


# ---- the command line ----

def test_help_lists_every_command(act_infer):
    p = run(act_infer, "--help", check_rc=0)
    for cmd in ("info", "predict", "eval", "eval-merge", "bench"):
        assert cmd in p.stdout
    for cmd in ("info", "predict", "eval", "eval-merge"):
        q = run(act_infer, cmd, "--help", check_rc=0)
        assert "usage: act-infer" in q.stdout


def test_no_command_and_unknown_command_are_usage_errors(act_infer):
    p = run(act_infer, check_rc=2)
    assert "usage: act-infer" in p.stderr
    p = run(act_infer, "frobnicate", check_rc=2)
    assert "unknown command 'frobnicate'" in p.stderr


@pytest.mark.parametrize("args, words", [
    (["info"], "--model is required"),
    (["info", "--model"], "--model needs a value"),
    (["info", "--model", "x.actw", "--colour"], "unknown argument '--colour'"),
    (["predict", "--episode", "e.hdf5", "--out", "p.npy"], "--model is required"),
    (["predict", "--model", "m.actw", "--out", "p.npy"], "--episode is required"),
    (["predict", "--model", "m.actw", "--episode", "e.hdf5"], "--out is required"),
    (["predict", "--model", "m.actw", "--episode", "e.hdf5", "--out", "p.npy", "--batch", "0"], "--batch must be"),
    (["predict", "--model", "m.actw", "--episode", "e.hdf5", "--out", "p.npy", "--batch=many"], "--batch must be"),
    (["predict", "--model", "m.actw", "--episode", "e.hdf5", "--out", "p.npy", "--device", "tpu"], "--device must be cpu or cuda"),
    (["predict", "--model", "m.actw", "--episode", "e.hdf5", "--out", "p.npy", "--precision", "fp8"], "--precision must be"),
    (["eval", "--model", "m.actw"], "--episodes is required"),
    (["eval", "--model", "m.actw", "--episodes"], "--episodes needs at least one"),
    (["eval", "--model", "m.actw", "--episodes", "a", "--episodes", "b"], "--episodes given twice"),
    (["eval", "--model", "m.actw", "--episodes", "d", "--shard", "2/2"], "--shard must be i/n"),
    (["eval", "--model", "m.actw", "--episodes", "d", "--shard", "1of2"], "--shard must be i/n"),
    (["eval", "--model", "m.actw", "--episodes", "d", "--shard", "0/4294967297"], "--shard must be i/n"),
    (["eval", "--model", "m.actw", "--episodes", "d", "--shard", "4294967297/3"], "--shard must be i/n"),
    (["eval-merge", "a.json"], "--json ALL.json is required"),
    (["eval-merge", "--json", "all.json"], "give the shard summaries"),
])
def test_bad_arguments_are_usage_errors(act_infer, args, words):
    p = run(act_infer, *args, check_rc=2)
    assert words in p.stderr
    assert "usage: act-infer" in p.stderr


# ---- info ----

def test_info_reports_the_contract(act_infer, model):
    cfg = model["cfg"]
    p = run(act_infer, "info", "--model", model["actw"], "--json", check_rc=0)
    info = json.loads(p.stdout)
    assert info["obs_dim"] == cfg["obs_dim"] and info["action_dim"] == cfg["action_dim"]
    assert info["pred_horizon"] == cfg["pred_horizon"]
    assert info["num_action_steps"] == cfg["num_action_steps"] and info["obs_horizon"] == cfg["obs_horizon"]
    assert info["camera_names"] == list(cfg["camera_names"])
    assert [info["image_height"], info["image_width"]] == list(cfg["vision_backbone"]["image_shape"])
    assert info["file_size"] == os.path.getsize(model["actw"])
    assert len(info["model_hash"]) == 16 and int(info["model_hash"], 16) >= 0
    n_head = sum(v.numel() for k, v in model["agent"].state_dict().items() if k.startswith("policy_head."))
    assert info["n_params"] > n_head
    assert info["norm"]["type"] == cfg["normalization_type"]
    assert len(info["norm"]["action_min"]) == cfg["action_dim"]
    t = run(act_infer, "info", "--model", model["actw"], check_rc=0).stdout
    assert info["model_hash"] in t and ", ".join(cfg["camera_names"]) in t


def test_info_on_a_broken_weight_file_fails_cleanly(act_infer, model, tmp_path):
    bad = tmp_path / "cut.actw"
    bad.write_bytes(model["actw"].read_bytes()[:1000])
    p = run(act_infer, "info", "--model", bad, check_rc=1)
    assert "cut.actw" in p.stderr


def test_a_fifo_as_the_model_is_refused_not_waited_on(act_infer, tmp_path):
    """open() of a FIFO without a writer blocks: the loader must refuse it before that."""
    fifo = tmp_path / "fifo.actw"
    os.mkfifo(fifo)
    try:
        p = subprocess.run([str(act_infer), "info", "--model", str(fifo)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("act-infer info --model FIFO hung (opened the FIFO before checking it)")
    assert p.returncode == 1 and "fifo.actw: not a regular file" in p.stderr, p.stderr


# ---- predict ----

def test_predict_prior_and_posterior_match_the_reference(act_infer, hdf5, model, tmp_path):
    cfg, agent = model["cfg"], model["agent"]
    H = cfg["pred_horizon"]
    ep = make_ep(tmp_path / "episode_3.hdf5", cfg, T=H + 2, seed=5)  # the last H-1 rows are padded
    out, post = tmp_path / "pred.npy", tmp_path / "post"
    p = run(act_infer, "predict", "--model", model["actw"], "--episode", ep, "--out", out, "--device", "cpu",
            "--batch", 3, "--posterior-dir", post, check_rc=0)
    assert "using device" not in p.stderr or "cpu" in p.stderr
    action, qpos, images = load_episode(ep, cfg["camera_names"])
    T = len(action)
    tg, pad = targets_of(action, H)
    r = act_reference.posterior(agent, qpos, images, tg, pad)
    pred = np.load(out)
    assert pred.dtype == np.float32 and pred.shape == (T, H, cfg["action_dim"])
    assert rel(pred, act_reference.predict(agent, qpos, images)) <= TOL
    L = cfg["head"]["latent_dim"]
    assert np.load(post / "mu.npy").shape == (T, L) and np.load(post / "kl.npy").shape == (T,)
    for name, key in (("mu", "mu"), ("logvar", "logvar"), ("kl", "kl"), ("post_actions", "actions")):
        assert rel(np.load(post / f"{name}.npy"), r[key]) <= TOL, name


def test_predict_refuses_a_chunk_that_is_not_finite_and_writes_nothing(act_infer, hdf5, model, tmp_path):
    """A qpos of 3e38 normalizes to infinity and the chunk is NaN: predict fails naming the
    timestep, and writes no .npy a robot-side script could load as an answer."""
    cfg = model["cfg"]
    out = tmp_path / "pred.npy"
    ep = make_ep(tmp_path / "episode_1.hdf5", cfg, T=4, seed=13, gzip=False, chunked=False)
    with h5py.File(ep, "r+") as f:
        f["observations/qpos"][3, 0] = 3e38
    p = run(act_infer, "predict", "--model", model["actw"], "--episode", ep, "--out", out, "--device", "cpu",
            "--batch", 2, check_rc=1)
    assert "timestep 3" in p.stderr and "not finite" in p.stderr, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["episode_1.hdf5"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device that refuses writes)")
def test_predict_replaces_its_files_as_a_set_or_not_at_all(act_infer, hdf5, model, tmp_path):
    """The prior chunks and the four posterior files belong together: when one of them cannot be
    written (here kl.npy leads to /dev/full), none of the previous run's files is replaced."""
    cfg = model["cfg"]
    out, post = tmp_path / "pred.npy", tmp_path / "post"
    ep1 = make_ep(tmp_path / "episode_1.hdf5", cfg, T=4, seed=11, gzip=False, chunked=False)
    ep2 = make_ep(tmp_path / "episode_2.hdf5", cfg, T=4, seed=12, gzip=False, chunked=False)
    run(act_infer, "predict", "--model", model["actw"], "--episode", ep1, "--out", out, "--device", "cpu",
        "--posterior-dir", post, check_rc=0)
    names = ["mu.npy", "logvar.npy", "post_actions.npy"]
    before = {n: (post / n).read_bytes() for n in names}
    before["pred"] = out.read_bytes()
    (post / "kl.npy").unlink()
    (post / "kl.npy").symlink_to("/dev/full")
    p = run(act_infer, "predict", "--model", model["actw"], "--episode", ep2, "--out", out, "--device", "cpu",
            "--posterior-dir", post, check_rc=1)
    assert "kl.npy" in p.stderr and "write failed" in p.stderr, p.stderr
    assert out.read_bytes() == before["pred"]
    for n in names:
        assert (post / n).read_bytes() == before[n], n
    assert (post / "kl.npy").is_symlink()
    assert sorted(x.name for x in tmp_path.iterdir() if ".tmp." in x.name) == []
    assert sorted(x.name for x in post.iterdir()) == sorted(names + ["kl.npy"])
    # and with the way clear, the second episode's files replace all five
    (post / "kl.npy").unlink()
    run(act_infer, "predict", "--model", model["actw"], "--episode", ep2, "--out", out, "--device", "cpu",
        "--posterior-dir", post, check_rc=0)
    assert out.read_bytes() != before["pred"] and (post / "mu.npy").read_bytes() != before["mu.npy"]


def test_predict_is_the_same_for_every_batch_size(act_infer, hdf5, model, tmp_path):
    ep = make_ep(tmp_path / "episode_0.hdf5", model["cfg"], T=5, seed=6, gzip=False, chunked=False)
    outs = []
    for b in (1, 5):
        out = tmp_path / f"p{b}.npy"
        run(act_infer, "predict", "--model", model["actw"], "--episode", ep, "--out", out, "--device", "cpu",
            "--batch", b, check_rc=0)
        outs.append(np.load(out))
    assert rel(outs[0], outs[1]) <= 1e-5


# ---- broken episodes ----

def rewrite(src, dst, edit):
    """Copies episode src to dst through h5py, letting edit(name, array) return a replacement
    array, or None to drop the dataset."""
    with h5py.File(src, "r") as f, h5py.File(dst, "w") as g:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                a = edit(name, obj[()])
                if a is not None:
                    g.create_dataset(name, data=a)
        f.visititems(visit)
    return dst


@pytest.fixture(scope="module")
def good_episode(model, hdf5):
    return make_ep(model["dir"] / "episode_good.hdf5", model["cfg"], T=4, seed=9)


def _broken(kind, good, d, cfg):
    cam = cfg["camera_names"][1]
    img = f"observations/images/{cam}"
    if kind == "missing_camera":
        return rewrite(good, d / "ep.hdf5", lambda n, a: None if n == img else a), [img, "missing dataset"]
    if kind == "missing_action":
        return rewrite(good, d / "ep.hdf5", lambda n, a: None if n == "action" else a), ["'action'", "missing dataset"]
    if kind == "image_dtype":
        return (rewrite(good, d / "ep.hdf5", lambda n, a: a.astype(np.float32) if n == img else a),
                [img, "float32", "expected uint8"])
    if kind == "image_shape":
        return (rewrite(good, d / "ep.hdf5", lambda n, a: a[:, :-2] if n == img else a),
                [img, "has shape", "expected (T, "])
    if kind == "qpos_width":
        return (rewrite(good, d / "ep.hdf5", lambda n, a: a[:, :-1] if n == "observations/qpos" else a),
                ["observations/qpos", "has shape"])
    if kind == "qpos_dtype":
        return (rewrite(good, d / "ep.hdf5", lambda n, a: (a * 100).astype(np.int32) if n == "observations/qpos" else a),
                ["observations/qpos", "int32", "expected float"])
    if kind == "length_mismatch":
        return (rewrite(good, d / "ep.hdf5", lambda n, a: a[:-1] if n == img else a),
                [img, "timesteps"])
    if kind == "truncated":
        data = good.read_bytes()
        (d / "ep.hdf5").write_bytes(data[: len(data) * 2 // 3])
        return d / "ep.hdf5", ["truncated"]
    if kind == "not_hdf5":
        (d / "ep.hdf5").write_text("this is not an HDF5 file\n" * 50)
        return d / "ep.hdf5", ["not an HDF5 file"]
    if kind == "missing_file":
        return d / "nope.hdf5", ["nope.hdf5", "No such file"]
    if kind == "corrupt_chunk":
        path = shutil.copy(good, d / "ep.hdf5")
        with h5py.File(path, "r") as f:
            info = f[img].id.get_chunk_info(1)
        with open(path, "r+b") as f:
            f.seek(info.byte_offset + info.size // 3)
            f.write(b"\xff" * 64)
        return d / "ep.hdf5", [img, "cannot be read"]
    if kind == "zero_tail":   # sized for 4 timesteps, 2 recorded: the rest reads as zeros
        def zero(n, a):
            a = a.copy()
            a[2:] = 0
            return a
        return rewrite(good, d / "ep.hdf5", zero), ["timesteps 2-3 of 4", "qpos and action all exactly 0",
                                                    "black in every camera"]
    raise AssertionError(kind)


BROKEN = ["missing_camera", "missing_action", "image_dtype", "image_shape", "qpos_width", "qpos_dtype",
          "length_mismatch", "truncated", "not_hdf5", "missing_file", "corrupt_chunk", "zero_tail"]


@pytest.mark.parametrize("kind", BROKEN)
def test_predict_on_a_broken_episode_names_file_and_dataset(act_infer, model, good_episode, tmp_path, kind):
    path, words = _broken(kind, good_episode, tmp_path, model["cfg"])
    out = tmp_path / "pred.npy"
    p = run(act_infer, "predict", "--model", model["actw"], "--episode", path, "--out", out, "--device", "cpu",
            "--batch", 1)
    assert p.returncode == 1, p.stderr
    assert str(path) in p.stderr
    for w in words:
        assert w in p.stderr, (w, p.stderr)
    assert "HDF5-DIAG" not in p.stderr  # HDF5's own error stack stays silent
    assert not out.exists()  # no half-written prediction file is left behind


def test_an_episode_ending_at_rest_with_zero_qpos_and_action_is_read(act_infer, model, good_episode, tmp_path):
    """qpos and action exactly 0 at the end, but the cameras still see the scene: a real recording"""
    def rest(n, a):
        if n in ("action", "observations/qpos"):
            a = a.copy()
            a[2:] = 0
        return a
    path = rewrite(good_episode, tmp_path / "ep.hdf5", rest)
    run(act_infer, "predict", "--model", model["actw"], "--episode", path, "--out", tmp_path / "p.npy",
        "--device", "cpu", check_rc=0)


def test_a_failed_predict_leaves_the_existing_output_as_it_was(act_infer, model, good_episode, tmp_path):
    """The chunk breaks after the first batch was written: the rows go to a temporary sibling,
    so the earlier PRED.npy is neither truncated nor removed, and no temporary file is left."""
    path, _ = _broken("corrupt_chunk", good_episode, tmp_path, model["cfg"])
    out = tmp_path / "out" / "pred.npy"
    out.parent.mkdir()
    np.save(out, np.arange(12, dtype=np.float32).reshape(1, 3, 4))
    before = out.read_bytes()
    p = run(act_infer, "predict", "--model", model["actw"], "--episode", path, "--out", out, "--device", "cpu",
            "--batch", 1)
    assert p.returncode == 1 and "cannot be read" in p.stderr, p.stderr
    assert out.read_bytes() == before
    assert sorted(f.name for f in out.parent.iterdir()) == ["pred.npy"]
    run(act_infer, "predict", "--model", model["actw"], "--episode", good_episode, "--out", out, "--device", "cpu")
    assert np.load(out).shape[1:] == (model["cfg"]["pred_horizon"], model["cfg"]["action_dim"])
    assert sorted(f.name for f in out.parent.iterdir()) == ["pred.npy"]
