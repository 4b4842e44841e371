"""The checkpoint converter (tools/convert_checkpoint.py) against the PyTorch reference.

Checkpoints are written by the installed torch (1.13) from randomized reference agents
(tools/act_reference.py); the converter reads them without torch and its output is read back
with tools/actw.py, which checks every rule of weights/FORMAT.md. Numerical checks run the
converted trunk in torch and compare it with the reference module: BatchNorm folding must agree
to <= 1e-5 relative (norm of the difference over norm of the reference).
Agents are built once per module (a ResNet18 trunk is ~45 MB even in the small config).
"""

import contextlib
import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))
import act_reference as ar  # noqa: E402
import actw  # noqa: E402
import convert_checkpoint as cc  # noqa: E402
import torch_zip  # noqa: E402

FOLD_TOL = 1e-5


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def small_cfg(**vb):
    cfg = ar._merge(ar.SMALL_CFG, {"vision_backbone": vb})
    return ar.resolve_config(cfg)


def run(*args):
    """Run the converter in-process; returns (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cc.main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def convert_ok(ckpt, out_dir, *args, name="model", verify=False):
    out, rep = Path(out_dir) / f"{name}.actw", Path(out_dir) / f"{name}.json"
    rc, stdout, stderr = run(ckpt, "-o", out, "--report", rep, *args)
    assert rc == 0, stderr
    meta, tensors, header = actw.read_actw(out, verify_checksum=verify)
    return meta, tensors, json.loads(rep.read_text()), stdout + stderr


def convert_fails(ckpt, out_dir, *args):
    out = Path(out_dir) / "fail.actw"
    rc, _, stderr = run(ckpt, "-o", out, *args)
    assert rc == 1, f"converter accepted it: {stderr}"
    assert not out.exists()
    return stderr


class Setup:
    def __init__(self, tmp, cfg, seed):
        self.cfg = cfg
        self.agent = ar.randomize_(ar.build_agent(cfg), seed)
        self.sd = self.agent.state_dict()
        self.dir = tmp
        self.config = tmp / "agent.yaml"
        ar.save_config(cfg, str(self.config))
        self.ckpt = tmp / "ckpt.pt"
        ar.save_checkpoint(self.agent, str(self.ckpt), cfg)

    def save(self, name, cfg=None, **kw):
        path = self.dir / name
        ar.save_checkpoint(self.agent, str(path), cfg or self.cfg, **kw)
        return path

    def save_sd(self, name, sd):
        path = self.dir / name
        torch.save({"model_state_dict": sd}, str(path))
        return path


@pytest.fixture(scope="module")
def bn(tmp_path_factory):
    return Setup(tmp_path_factory.mktemp("bn"), small_cfg(), seed=11)


@pytest.fixture(scope="module")
def bn_out(bn):
    return convert_ok(bn.ckpt, bn.dir, "--config", bn.config, name="base", verify=True)


@pytest.fixture(scope="module")
def gn_sep(tmp_path_factory):
    cfg = small_cfg(use_group_norm=True, use_separate_rgb_encoder_per_camera=True)
    cfg["normalization_type"] = "mean_std"
    return Setup(tmp_path_factory.mktemp("gn"), cfg, seed=12)


def encoders(agent):
    enc = agent.vision_encoder.rgb_encoder
    return list(enc) if isinstance(enc, torch.nn.ModuleList) else [enc]


def trunk_tokens(tensors, t, x, groupnorm):
    """The converted trunk T run in torch: ResNet18 (folded BN or GN), SpatialSoftmax, Linear."""
    w = {k: torch.from_numpy(v) for k, v in tensors.items() if k.startswith(f"vision.{t}.")}
    p = f"vision.{t}."

    def conv(name, x, stride, pad):
        y = F.conv2d(x, w[p + name + ".w"], w[p + name + ".b"], stride, pad)
        if groupnorm:
            y = F.group_norm(y, y.shape[1] // 16, w[p + name + ".gn.w"], w[p + name + ".gn.b"], 1e-5)
        return y

    x = F.max_pool2d(F.relu(conv("conv1", x, 2, 3)), 3, 2, 1)
    for layer in range(1, 5):
        for i in range(2):
            stride = 2 if layer > 1 and i == 0 else 1
            name = f"layer{layer}.{i}."
            skip = conv(name + "down", x, stride, 0) if p + name + "down.w" in w else x
            y = conv(name + "conv2", F.relu(conv(name + "conv1", x, stride, 1)), 1, 1)
            x = F.relu(y + skip)
    maps = F.conv2d(x, w[p + "keypoints.w"], w[p + "keypoints.b"]).flatten(2)
    xy = torch.softmax(maps, -1) @ w[p + "pos_grid"]
    return F.relu(F.linear(xy.flatten(1), w[p + "out.w"], w[p + "out.b"]))


# ------------------------------------------------------------------------ happy paths --

def test_bn_checkpoint_maps_every_key_and_folds_batchnorm(bn, bn_out, rng):
    meta, tensors, report, text = bn_out
    assert meta["format"] == "actw" and meta["arch"] == "act_resnet"
    assert meta["source_sha256"] == hashlib.sha256(bn.ckpt.read_bytes()).hexdigest()
    assert meta["converter_version"] == cc.CONVERTER_VERSION
    want = {"obs_dim": "5", "action_dim": "4", "pred_horizon": "6", "num_action_steps": "3",
            "camera_names": "l_vis,r_vis,front", "image_height": "80", "vision.input_width": "64",
            "vision.crop_height": "0", "vision.imagenet_norm": "0", "vision.norm": "batchnorm",
            "vision.separate_trunks": "0", "vision.num_keypoints": "8", "vision.output_dim": "16",
            "vision.feature_height": "2", "vision.feature_width": "2", "head.hidden_dim": "32",
            "head.nheads": "4", "head.enc_layers": "2", "head.dec_layers": "2",
            "head.dim_feedforward": "64", "head.latent_dim": "8", "head.activation": "gelu",
            "head.kl_weight": "10", "head.layer_norm_eps": "1e-05", "norm.type": "min_max",
            "norm.eps": "1e-08"}
    assert {k: meta[k] for k in want} == want
    assert "model hash" in text and report["model_hash"] in text

    # every state-dict key is accounted for, exactly once
    accounted = set(report["mapped"]) | set(report["consumed"]) | set(report["ignored"])
    assert accounted == set(bn.sd)
    assert not set(report["mapped"]) & set(report["consumed"])
    assert any(k.endswith("num_batches_tracked") for k in report["consumed"])
    assert all(k.startswith("noise_pred_net.") or k.endswith("num_batches_tracked")
               or k.endswith(("_mean", "_std")) for k in report["consumed"])
    assert "not used" in report["consumed"]["normalization.qpos_mean"]

    # head tensors are copied bit for bit
    for src, dst in report["mapped"].items():
        if src.startswith("policy_head.") or src.startswith("normalization."):
            assert np.array_equal(tensors[dst].reshape(-1), bn.sd[src].numpy().reshape(-1)), src
    assert tensors["head.cls_embed"].shape == (32,)

    # folded convs equal conv + BatchNorm (eval) of the reference, one by one and end to end
    enc = encoders(bn.agent)[0]
    bb = enc.backbone
    pairs = [("conv1", bb[0], bb[1])]
    for layer in range(1, 5):
        for i in range(2):
            blk = bb[3 + layer][i]
            pairs += [(f"layer{layer}.{i}.conv1", blk.conv1, blk.bn1),
                      (f"layer{layer}.{i}.conv2", blk.conv2, blk.bn2)]
            if blk.downsample is not None:
                pairs.append((f"layer{layer}.{i}.down", blk.downsample[0], blk.downsample[1]))
    assert len(pairs) == 20
    with torch.no_grad():
        for name, conv, norm in pairs:
            x = torch.from_numpy(rng.standard_normal((2, conv.in_channels, 9, 9)).astype(np.float32))
            want_y = norm(conv(x)).numpy()
            got = F.conv2d(x, torch.from_numpy(tensors[f"vision.0.{name}.w"]),
                           torch.from_numpy(tensors[f"vision.0.{name}.b"]), conv.stride,
                           conv.padding).numpy()
            assert rel_err(got, want_y) <= FOLD_TOL, name
        x = torch.from_numpy(rng.random((2, 3, 64, 64), dtype=np.float32))
        err = rel_err(trunk_tokens(tensors, 0, x, False).numpy(), enc(x).numpy())
    assert err <= FOLD_TOL, f"trunk tokens rel err {err:.2e}"


def test_groupnorm_separate_trunks_mean_std(gn_sep, rng):
    meta, tensors, report, _ = convert_ok(gn_sep.ckpt, gn_sep.dir, "--config", gn_sep.config)
    assert meta["vision.norm"] == "groupnorm" and meta["vision.separate_trunks"] == "1"
    assert meta["norm.type"] == "mean_std"
    assert {"norm.qpos.mean", "norm.qpos.std", "norm.action.mean", "norm.action.std"} <= set(tensors)
    assert not any(k.endswith((".min", ".max")) for k in tensors)
    stats = gn_sep.agent.normalization.get_stats()
    assert np.array_equal(tensors["norm.action.std"], stats["action_std"])
    encs = encoders(gn_sep.agent)
    assert len(encs) == 3
    for t, enc in enumerate(encs):
        assert np.array_equal(tensors[f"vision.{t}.conv1.gn.w"], enc.backbone[1].weight.detach().numpy())
        assert np.array_equal(tensors[f"vision.{t}.layer2.0.down.gn.b"],
                              enc.backbone[5][0].downsample[1].bias.detach().numpy())
        assert not tensors[f"vision.{t}.layer3.1.conv2.b"].any()
        x = torch.from_numpy(rng.random((2, 3, 64, 64), dtype=np.float32))
        with torch.no_grad():
            err = rel_err(trunk_tokens(tensors, t, x, True).numpy(), enc(x).numpy())
        assert err <= 1e-5, f"trunk {t}: rel err {err:.2e}"
    assert not np.array_equal(tensors["vision.0.conv1.w"], tensors["vision.1.conv1.w"])
    assert "vision.3.conv1.w" not in tensors


@pytest.mark.parametrize("layout,prefix", [("state_dict", "module."), ("model", "_orig_mod."),
                                           ("agent", ""), ("bare", "module.")])
def test_layouts_and_prefixes(bn, bn_out, layout, prefix):
    ckpt = bn.save(f"{layout}{prefix}.pt", layout=layout, prefix=prefix)
    _, tensors, report, _ = convert_ok(ckpt, bn.dir, "--config", bn.config, name=layout)
    base = bn_out[1]
    assert list(tensors) == list(base)
    assert all(np.array_equal(tensors[k], base[k]) for k in base)
    assert report["state_dict"] == ("top level" if layout == "bare" else f"entry '{layout}'")


def test_stats_from_dataset_stats_entry_and_pkl(bn, bn_out):
    base = bn_out[1]
    entry = bn.save("entry.pt", stats_in="dataset_stats")
    _, tensors, report, _ = convert_ok(entry, bn.dir, "--config", bn.config, name="entry")
    assert report["stats_source"] == "checkpoint dataset_stats entry"
    assert np.array_equal(tensors["norm.qpos.max"], base["norm.qpos.max"])

    pkl_stats = bn.dir / "stats.pkl"
    only_pkl = bn.save("pkl.pt", stats_in="pkl", stats_path=str(pkl_stats))
    err = convert_fails(only_pkl, bn.dir, "--config", bn.config)
    assert "no min_max statistics" in err
    _, tensors, report, _ = convert_ok(only_pkl, bn.dir, "--config", bn.config, "--stats",
                                       pkl_stats, name="pkl")
    assert report["stats_source"] == str(pkl_stats)
    assert np.array_equal(tensors["norm.action.min"], base["norm.action.min"])
    # keys of another spelling (LeRobot's observation.state) are named as not read, not hidden
    other = bn.dir / "lerobot_stats.pkl"
    with open(other, "wb") as f:
        pickle.dump({"observation.state": {"min": np.zeros(5), "max": np.ones(5)},
                     "action": {"min": np.zeros(4), "max": np.ones(4)}}, f)
    err = convert_fails(only_pkl, bn.dir, "--config", bn.config, "--stats", other)
    assert "found ['action_max', 'action_min'] (not read: observation.state_max" in err, err


def test_stats_file_that_differs_from_set_buffers_is_refused_until_forced(bn, bn_out, rng):
    """A --stats file that differs from the state dict's buffers: a PyTorch rollout of the
    checkpoint (agent built with the file, then load_state_dict) normalizes with the buffers, so
    the file is likely another run's - refused, naming both and the way out; --stats-from file
    uses it with a warning."""
    stats = bn.agent.normalization.get_stats()
    stats["qpos_min"] = stats["qpos_min"] - rng.random(5, dtype=np.float32) - 0.1
    path = bn.dir / "other_stats.pkl"
    path.write_bytes(pickle.dumps(stats, protocol=5))
    err = convert_fails(bn.ckpt, bn.dir, "--config", bn.config, "--stats", path)
    assert "['qpos_min']" in err and str(path) in err and "normalization.* buffers" in err
    assert "--stats-from file" in err and "Drop --stats" in err
    _, tensors, rep, text = convert_ok(bn.ckpt, bn.dir, "--config", bn.config, "--stats", path,
                                       "--stats-from", "file", name="override")
    assert np.array_equal(tensors["norm.qpos.min"], stats["qpos_min"])
    assert rep["stats_source"] == str(path)
    assert "WARNING statistics ['qpos_min']" in text
    assert "--stats dataset_stats.pkl" in convert_fails(bn.ckpt, bn.dir, "--config", bn.config,
                                                        "--stats-from", "file")


def test_stats_file_over_never_set_buffers_is_taken_with_a_warning(bn, bn_out):
    """Buffers still at NormalizationModule's initial values were never set: the --stats file is
    the run's statistics, taken without --stats-from file (the warning says why)."""
    real = bn.agent.normalization.get_stats()
    ckpt = _with_stats(bn, "init_buffers.pt", buffers=_initial_stats(real))
    pkl = bn.dir / "real_stats.pkl"
    pkl.write_bytes(pickle.dumps(real, protocol=5))
    _, t, rep, text = convert_ok(ckpt, bn.dir, "--config", bn.config, "--stats", pkl, name="init_pkl")
    assert rep["stats_source"] == str(pkl)
    assert np.array_equal(t["norm.action.max"], real["action_max"])
    assert "never set" in text


def _with_stats(bn, name, buffers=None, entry=None):
    """bn's checkpoint with the state dict's normalization.* buffers replaced by `buffers` (None:
    kept) and a `dataset_stats` entry `entry` (None: none)."""
    sd = {k: v.clone() for k, v in bn.sd.items()}
    for k, v in (buffers or {}).items():
        sd["normalization." + k] = torch.as_tensor(np.asarray(v, np.float32))
    obj = {"model_state_dict": sd}
    if entry is not None:
        obj["dataset_stats"] = entry
    path = bn.dir / name
    torch.save(obj, str(path))
    return path


def _initial_stats(stats):
    return {k: (np.ones_like(v) if k.endswith(("max", "std")) else np.zeros_like(v))
            for k, v in stats.items()}


def test_state_dict_and_entry_that_disagree_are_refused_until_one_is_chosen(bn, bn_out, rng):
    """The state dict's buffers (what the agent normalizes with after load_state_dict) and a
    dataset_stats entry that differ: no silent pick - the error names both sources and how to
    choose; --stats-from picks one, --stats overrides both."""
    real = bn.agent.normalization.get_stats()
    other = dict(real, action_max=real["action_max"] + rng.random(real["action_max"].shape, dtype=np.float32) + 0.5)
    ckpt = _with_stats(bn, "both.pt", entry=other)
    err = convert_fails(ckpt, bn.dir, "--config", bn.config)
    assert "state dict normalization.*" in err and "checkpoint dataset_stats entry" in err
    assert "action_max" in err and "--stats" in err and "--stats-from" in err

    _, t, rep, _ = convert_ok(ckpt, bn.dir, "--config", bn.config, "--stats-from", "state_dict",
                              name="from_sd")
    assert rep["stats_source"] == "state dict normalization.*"
    assert np.array_equal(t["norm.action.max"], real["action_max"])
    _, t, rep, _ = convert_ok(ckpt, bn.dir, "--config", bn.config, "--stats-from", "dataset_stats",
                              name="from_entry")
    assert rep["stats_source"] == "checkpoint dataset_stats entry"
    assert np.array_equal(t["norm.action.max"], other["action_max"])
    assert rep["consumed"]["normalization.action_max"].startswith("statistic not used")

    # --stats that agrees with the buffers settles it (the entry's difference is a warning);
    # one that agrees with the entry instead differs from the buffers, refused until forced
    pkl = bn.dir / "both_stats.pkl"
    pkl.write_bytes(pickle.dumps(real, protocol=5))
    _, t, rep, text = convert_ok(ckpt, bn.dir, "--config", bn.config, "--stats", pkl, name="pkl")
    assert rep["stats_source"] == str(pkl) and np.array_equal(t["norm.action.max"], real["action_max"])
    assert "WARNING" in text and "checkpoint dataset_stats entry" in text
    pkl.write_bytes(pickle.dumps(other, protocol=5))
    assert "--stats-from file" in convert_fails(ckpt, bn.dir, "--config", bn.config, "--stats", pkl)
    _, t, rep, text = convert_ok(ckpt, bn.dir, "--config", bn.config, "--stats", pkl,
                                 "--stats-from", "file", name="pkl_forced")
    assert rep["stats_source"] == str(pkl) and np.array_equal(t["norm.action.max"], other["action_max"])
    assert "WARNING" in text and "state dict normalization.*" in text

    assert "--stats-from" in convert_fails(ckpt, bn.dir, "--config", bn.config, "--stats", pkl,
                                           "--stats-from", "state_dict")
    no_entry = _with_stats(bn, "no_entry.pt")
    err = convert_fails(no_entry, bn.dir, "--config", bn.config, "--stats-from", "dataset_stats")
    assert "checkpoint dataset_stats entry" in err


def test_state_dict_and_entry_that_agree_convert_from_the_state_dict(bn, bn_out):
    ckpt = _with_stats(bn, "same.pt", entry=bn.agent.normalization.get_stats())
    _, t, rep, text = convert_ok(ckpt, bn.dir, "--config", bn.config, name="same")
    assert rep["stats_source"] == "state dict normalization.*" and "WARNING" not in text
    assert all(np.array_equal(t[k], bn_out[1][k]) for k in bn_out[1] if k.startswith("norm."))


def test_never_set_statistics_are_refused(bn, bn_out, gn_sep):
    """NormalizationModule's initial buffers (min/mean 0, max/std 1) mean the statistics were
    never set: refused, with --stats dataset_stats.pkl as the way out and --allow-initial-stats
    for data that really has them."""
    real = bn.agent.normalization.get_stats()
    init = _initial_stats(real)
    ckpt = _with_stats(bn, "init.pt", buffers=init)
    err = convert_fails(ckpt, bn.dir, "--config", bn.config)
    assert "initial values" in err and "never set" in err
    assert "--stats dataset_stats.pkl" in err and "--allow-initial-stats" in err
    _, t, rep, _ = convert_ok(ckpt, bn.dir, "--config", bn.config, "--allow-initial-stats",
                              name="init_ok")
    assert not t["norm.qpos.min"].any() and (t["norm.action.max"] == 1).all()
    pkl = bn.dir / "real_stats.pkl"
    pkl.write_bytes(pickle.dumps(real, protocol=5))
    _, t, rep, _ = convert_ok(ckpt, bn.dir, "--config", bn.config, "--stats", pkl, name="init_pkl")
    assert np.array_equal(t["norm.qpos.max"], real["qpos_max"])
    # only one kind left at its initial values is refused as well
    half = _with_stats(bn, "half.pt", buffers={"action_min": init["action_min"],
                                                "action_max": init["action_max"]})
    assert "action" in convert_fails(half, bn.dir, "--config", bn.config)
    # the review's case: buffers never set, real statistics in the entry -> the two disagree
    both = _with_stats(bn, "init_entry.pt", buffers=init, entry=real)
    err = convert_fails(both, bn.dir, "--config", bn.config)
    assert "--stats-from" in err
    _, t, _, _ = convert_ok(both, bn.dir, "--config", bn.config, "--stats-from", "dataset_stats",
                            name="init_entry")
    assert np.array_equal(t["norm.action.min"], real["action_min"])
    # mean_std: mean 0 / std 1 are the initial values there
    g_init = _initial_stats(gn_sep.agent.normalization.get_stats())
    sd = {k: v.clone() for k, v in gn_sep.sd.items()}
    for k, v in g_init.items():
        sd["normalization." + k] = torch.from_numpy(v)
    err = convert_fails(gn_sep.save_sd("init_gn.pt", sd), gn_sep.dir, "--config", gn_sep.config)
    assert "initial values" in err and "qpos_mean" in err


def test_converter_and_reference_pick_the_same_statistics(bn, bn_out, rng):
    """tools/act_reference.py load_checkpoint (the parity reference) and the converter choose the
    same source, and refuse the same checkpoints."""
    real = bn.agent.normalization.get_stats()
    other = {k: v + rng.random(v.shape, dtype=np.float32) + 0.5 if k.endswith("max") else v
             for k, v in real.items()}
    init = _initial_stats(real)
    cases = [("sd_only.pt", None, None), ("entry_only.pt", None, other),
             ("both_same.pt", None, real), ("both_differ.pt", None, other),
             ("init_both.pt", init, real), ("init_only.pt", init, None)]
    cfg = ar.load_config(str(bn.config))
    pkl = bn.dir / "other_stats.pkl"
    pkl.write_bytes(pickle.dumps(other, protocol=5))
    for name, buffers, entry in cases:
        ckpt = _with_stats(bn, name, buffers=buffers, entry=entry)
        if name == "entry_only.pt":   # the entry alone: no buffers in the state dict
            obj = torch.load(str(ckpt), weights_only=False)
            obj["model_state_dict"] = {k: v for k, v in obj["model_state_dict"].items()
                                       if not k.startswith("normalization.")}
            torch.save(obj, str(ckpt))
        for flags, kw in (([], {}), (["--stats-from", "state_dict"], {"stats_from": "state_dict"}),
                          (["--stats-from", "dataset_stats"], {"stats_from": "dataset_stats"}),
                          (["--allow-initial-stats"], {"allow_initial_stats": True}),
                          (["--stats", pkl], {"stats_path": str(pkl)}),
                          (["--stats", pkl, "--stats-from", "file"],
                           {"stats_path": str(pkl), "stats_from": "file"})):
            rc, _, err = run(ckpt, "-o", bn.dir / "agree.actw", "--config", bn.config, *flags)
            try:
                agent = ar.load_checkpoint(str(ckpt), cfg, **kw)
            except ValueError as e:
                assert rc == 1, f"{name} {flags}: reference refused ({e}), converter accepted"
                continue
            assert rc == 0, f"{name} {flags}: converter refused ({err}), reference accepted"
            _, tensors, _ = actw.read_actw(bn.dir / "agree.actw")
            got = agent.normalization.get_stats()
            for k in ("qpos_min", "qpos_max", "action_min", "action_max"):
                assert np.array_equal(tensors["norm." + k.replace("_", ".")], got[k]), (name, flags, k)


def test_stats_flags_are_in_help():
    text = io.StringIO()
    with contextlib.redirect_stdout(text), pytest.raises(SystemExit):
        cc.parse_args(["--help"])
    assert "--stats-from" in text.getvalue() and "--allow-initial-stats" in text.getvalue()


def test_config_from_checkpoint_entry_and_zstd_round_trip(bn, bn_out):
    ckpt = bn.save("with_config.pt", include_config=True)
    meta, tensors, _, _ = convert_ok(ckpt, bn.dir, "--compress", "zstd", name="zstd", verify=True)
    base_meta, base = bn_out[0], bn_out[1]
    assert {k: v for k, v in meta.items() if k != "source_sha256"} == \
        {k: v for k, v in base_meta.items() if k != "source_sha256"}
    assert all(np.array_equal(tensors[k], base[k]) for k in base)
    header = actw.read_actw(bn.dir / "zstd.actw", verify_checksum=False)[2]
    assert header["compression"] == 1 and header["stored_size"] < header["data_size"]


def test_json_config_with_hydra_keys_and_flags(bn):
    agent = json.loads(json.dumps(bn.cfg))
    agent.update({"_target_": "roboimi.vla.agent_act.ACTAgent", "defaults": ["_self_"],
                  "camera_names": "${data.camera_names}", "unknown_key": 3})
    agent["head"]["_partial_"] = True
    root = {"data": {"camera_names": ["left", "right", "top"]}, "agent": agent}
    path = bn.dir / "config.json"
    path.write_text(json.dumps(root))
    meta, _, report, _ = convert_ok(bn.ckpt, bn.dir, "--config", path, "--image-size", "96x128",
                                    "--crop", "48x56", "--imagenet-norm", "--nheads", "8",
                                    name="json")
    assert meta["camera_names"] == "left,right,top"
    assert (meta["image_height"], meta["image_width"]) == ("96", "128")
    assert (meta["vision.crop_height"], meta["vision.crop_width"]) == ("48", "56")
    assert meta["vision.imagenet_norm"] == "1" and meta["head.nheads"] == "8"
    assert report["config_sources"]["hidden_dim"] == "shapes: head.query"


def test_the_datasets_resize_is_the_resize_target(bn, bn_out):
    """roboimi resizes frames in the dataset (data.image_resize_shape, or the backbone's
    dataset_image_resize_shape); input_shape only shapes the SpatialSoftmax grid. 60 and 64 both
    give the small model's 2x2 map, so only the config can tell which size training used."""
    path = bn.dir / "full_resize.json"

    def full(data=None, *flags, agent=None, **vb):
        agent = json.loads(json.dumps(agent or bn.cfg))
        agent["vision_backbone"].update(vb)
        path.write_text(json.dumps({"agent": agent, "data": data or {}}))
        meta, _, report, text = convert_ok(bn.ckpt, bn.dir, "--config", path, *flags, name="resize")
        return (int(meta["vision.input_height"]), int(meta["vision.input_width"])), text, report

    size, text, report = full({"image_resize_shape": [60, 60]})
    assert size == (60, 60)
    assert "full_resize.json: data.image_resize_shape = [60, 60] and vision_backbone.input_shape " \
        f"({path}) = [64, 64] differ" in text and "resizes to 60x60 as training did" in text
    assert report["config_sources"]["input_height"] == f"{path}: data.image_resize_shape"
    size, text, _ = full({"image_resize_shape": [60, 60]}, dataset_image_resize_shape=[56, 56])
    assert size == (56, 56) and "dataset_image_resize_shape = [56, 56]" in text
    # non-square: cv2 takes [W, H], torch [H, W]
    size, text, _ = full({"image_resize_shape": [48, 60]},
                         dataset_image_resize_shape="${data.image_resize_shape}")
    assert size == (64, 64) and "may be [W, H] (cv2) or [H, W]" in text and "--input-size" in text
    size, text, _ = full({"image_resize_shape": [60, 48]}, input_shape=[3, 48, 60])
    assert size == (48, 60) and "image_resize_shape" not in text   # cv2's [W, H] of input_shape
    agent = json.loads(json.dumps(bn.cfg))
    del agent["vision_backbone"]["input_shape"]
    size, text, _ = full({"image_resize_shape": [60, 52]}, agent=agent)
    assert size == (60, 52) and "taken as [H, W] = 60x52" in text and "--input-size 52x60" in text
    size, text, _ = full({"image_resize_shape": [64, 64]})
    assert size == (64, 64) and "image_resize_shape" not in text
    size, text, _ = full({"image_resize_shape": None})
    assert size == (64, 64) and "image_resize_shape" not in text
    size, text, _ = full({"image_resize_shape": "${train.size}"})
    assert size == (64, 64) and "data.image_resize_shape is ${train.size}" in text
    size, text, _ = full({"image_resize_shape": [60, 60]}, dataset_image_resize_shape="${train.size}")
    assert size == (60, 60) and "dataset_image_resize_shape is ${train.size}" in text
    # a flag still wins over every config key, and says what it overrides
    size, text, _ = full({"image_resize_shape": [60, 60]}, "--input-size", "62x62")
    assert size == (62, 62) and "--input-size 62x62 overrides" in text and "resizes to 60x60" not in text
    # the dataset's size in the checkpoint's own full config beats a bare agent section's
    # input_shape given by --config (which cannot know what the dataset did)
    ckpt = bn.save("with_full_config.pt", include_config=True,
                   cfg={"agent": bn.cfg, "data": {"image_resize_shape": [60, 60]}})
    meta, _, _, text = convert_ok(ckpt, bn.dir, "--config", bn.config, name="r3")
    assert meta["vision.input_height"] == "60" and "resizes to 60x60" in text
    # a resize that changes the feature map is refused as before, naming the key
    path.write_text(json.dumps({"agent": bn.cfg, "data": {"image_resize_shape": [96, 96]}}))
    err = convert_fails(bn.ckpt, bn.dir, "--config", path)
    assert "feature_height: pool.pos_grid says 2" in err and "gives 3" in err
    assert "data.image_resize_shape" in err


# ------------------------------------------------------------------ tensors as stored --

def test_noncontiguous_offset_and_low_precision_tensors(bn, bn_out):
    sd = {k: v.clone() for k, v in bn.sd.items() if not k.startswith("noise_pred_net.")}
    w = sd["policy_head.action_head.weight"]
    sd["policy_head.action_head.weight"] = w.t().contiguous().t()          # transposed strides
    big = torch.cat([torch.randn(3), sd["policy_head.action_head.bias"]])
    sd["policy_head.action_head.bias"] = big[3:]                            # storage offset
    sd["policy_head.query_embed.weight"] = sd["policy_head.query_embed.weight"].half()
    sd["policy_head.latent_proj.weight"] = sd["policy_head.latent_proj.weight"].bfloat16()
    sd["policy_head.visual_proj.weight"] = sd["policy_head.visual_proj.weight"].double()
    assert not sd["policy_head.action_head.weight"].is_contiguous()
    assert sd["policy_head.action_head.bias"].storage_offset() == 3
    ckpt = bn.save_sd("mixed.pt", sd)
    _, tensors, _, _ = convert_ok(ckpt, bn.dir, "--config", bn.config, name="mixed")
    assert np.array_equal(tensors["head.action_head.w"], w.numpy())
    assert np.array_equal(tensors["head.action_head.b"], bn.sd["policy_head.action_head.bias"].numpy())
    assert np.array_equal(tensors["head.query"], sd["policy_head.query_embed.weight"].float().numpy())
    assert np.array_equal(tensors["head.latent_proj.w"],
                          sd["policy_head.latent_proj.weight"].float().numpy())
    assert np.array_equal(tensors["head.visual_proj.w"], bn_out[1]["head.visual_proj.w"])


def _rewrite_zip(src, dst, rename_top, extra, transform=None):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        old_top = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            data = zin.read(info.filename)
            rest = info.filename.split("/", 1)[1]
            if transform:
                data = transform(rest, data)
            zout.writestr(f"{rename_top}/{rest}", data)
        for rest, data in extra.items():
            zout.writestr(f"{rename_top}/{rest}", data)
    return old_top


def test_torch2_style_archive_and_big_endian_storages(bn, bn_out):
    v2 = bn.dir / "torch2.pt"
    old_top = _rewrite_zip(bn.ckpt, v2, "archive", {"byteorder": b"little",
                                                    ".data/serialization_id": b"1234567890"})
    assert old_top != "archive"
    _, tensors, _, _ = convert_ok(v2, bn.dir, "--config", bn.config, name="torch2")
    assert all(np.array_equal(tensors[k], bn_out[1][k]) for k in bn_out[1])

    # the same storages written big-endian (float32 only: every record is 4-byte items)
    def swap(rest, data):
        if rest.startswith("data/"):
            return np.frombuffer(data, "<u4").byteswap().tobytes()
        return data

    int_free = {k: v for k, v in bn.sd.items() if v.dtype == torch.float32}
    plain = bn.save_sd("float_only.pt", int_free)   # num_batches_tracked (int64) left out
    big = bn.dir / "big.pt"
    _rewrite_zip(plain, big, "archive", {"byteorder": b"big"}, swap)
    _, tensors, _, _ = convert_ok(big, bn.dir, "--config", bn.config, name="big")
    assert all(np.array_equal(tensors[k], bn_out[1][k]) for k in bn_out[1])


# ----------------------------------------------------------------------------- refusals --

def test_noise_pred_net_mismatch_is_refused(bn):
    sd = {k: v.clone() for k, v in bn.sd.items()}
    sd["noise_pred_net.action_head.bias"] += 1e-3
    err = convert_fails(bn.save_sd("alias.pt", sd), bn.dir, "--config", bn.config)
    assert "'noise_pred_net.action_head.bias' differs from 'policy_head.action_head.bias'" in err


def test_unknown_keys_are_reported_and_can_be_ignored(bn, bn_out):
    sd = dict(bn.sd)
    sd["ema.decay"] = torch.rand(1)
    sd["vision_encoder.rgb_encoder.backbone.9.weight"] = torch.rand(3)
    ckpt = bn.save_sd("unknown.pt", sd)
    err = convert_fails(ckpt, bn.dir, "--config", bn.config)
    assert "2 state-dict keys are not part of the ACT model" in err
    assert "ema.decay" in err and "vision_encoder.rgb_encoder.backbone.9.weight" in err
    _, tensors, report, _ = convert_ok(ckpt, bn.dir, "--config", bn.config, "--ignore",
                                       r"ema\..*", "--ignore", r".*backbone\.9\..*", name="ign")
    assert sorted(report["ignored"]) == ["ema.decay", "vision_encoder.rgb_encoder.backbone.9.weight"]
    assert all(np.array_equal(tensors[k], bn_out[1][k]) for k in bn_out[1])


def test_key_map_renames_foreign_names(bn, bn_out):
    sd = {}
    for k, v in bn.sd.items():
        if k.startswith("noise_pred_net."):
            continue
        k = k.replace("policy_head.", "actor.").replace("vision_encoder.rgb_encoder.", "cam_enc.")
        sd[k] = v
    sd["extra_counter"] = torch.tensor(5)
    ckpt = bn.save_sd("foreign.pt", sd)
    err = convert_fails(ckpt, bn.dir, "--config", bn.config)
    assert "state-dict keys are not part of the ACT model: cam_enc.backbone.0.weight" in err
    key_map = bn.dir / "map.json"
    key_map.write_text(json.dumps({"re:actor\\.(.*)": "policy_head.\\1",
                                   "re:cam_enc\\.(.*)": "vision_encoder.rgb_encoder.\\1",
                                   "extra_counter": None}))
    _, tensors, report, _ = convert_ok(ckpt, bn.dir, "--config", bn.config, "--key-map", key_map,
                                       name="mapped")
    assert all(np.array_equal(tensors[k], bn_out[1][k]) for k in bn_out[1])
    assert report["renamed"]["actor.query_embed.weight"] == "policy_head.query_embed.weight"
    assert report["ignored"] == ["extra_counter"]
    # the JSON itself where its file belongs: the error names the flag and what it takes
    err = convert_fails(ckpt, bn.dir, "--config", bn.config, "--key-map", '{"extra_counter": null}')
    assert "--key-map {\"extra_counter\": null}: cannot open" in err and "path of a JSON file" in err, err
    (bn.dir / "bad_map.json").write_text("{'a': 1}")
    err = convert_fails(ckpt, bn.dir, "--config", bn.config, "--key-map", bn.dir / "bad_map.json")
    assert "bad_map.json: not valid JSON" in err and "--key-map" in err, err


def test_config_that_disagrees_with_shapes_is_refused(bn):
    cfg = json.loads(json.dumps(bn.cfg))
    cfg["head"]["hidden_dim"] = 64
    cfg["vision_backbone"]["spatial_softmax_num_keypoints"] = 16
    path = bn.dir / "wrong.yaml"
    ar.save_config(cfg, str(path))
    err = convert_fails(bn.ckpt, bn.dir, "--config", path)
    assert "hidden_dim: head.query says 32" in err and "says 64" in err
    assert "num_keypoints: pool.nets.weight says 8" in err
    rc, _, err = run(bn.ckpt, "-o", bn.dir / "trusted.actw", "--config", path, "--trust-shapes")
    assert rc == 0 and "WARNING --trust-shapes" in err
    meta = actw.read_actw(bn.dir / "trusted.actw", verify_checksum=False)[0]
    assert meta["head.hidden_dim"] == "32"

    cfg = json.loads(json.dumps(bn.cfg))
    cfg["vision_backbone"]["input_shape"] = [3, 224, 224]
    ar.save_config(cfg, str(path))
    err = convert_fails(bn.ckpt, bn.dir, "--config", path)
    assert "feature_height: pool.pos_grid says 2" in err and "gives 7" in err
    # the grid gives only the size after resize and crop: the error names both ways to get
    # there (a crop the config left out used to be "fixed" by the --input-size it suggested,
    # a wrong model), and --trust-shapes has no shape to trust (it wrote a file act-infer refused)
    assert "crop_shape (or --crop HxW)" in err and "--input-size HxW" in err and "33..64" in err, err
    err = convert_fails(bn.ckpt, bn.dir, "--config", path, "--trust-shapes")
    assert "feature_height: pool.pos_grid says 2" in err and "--trust-shapes cannot decide" in err, err
    cfg["vision_backbone"]["input_shape"] = [224, 224, 3]   # channels last: named, with the fix
    ar.save_config(cfg, str(path))
    err = convert_fails(bn.ckpt, bn.dir, "--config", path)
    assert "[224, 224, 3], which reads as channels last" in err and "write [3, 224, 224]" in err
    # without a config the small model cannot pass as act_resnet under --strict-shapes
    err = convert_fails(bn.ckpt, bn.dir, "--strict-shapes", "--input-size", "64x64")
    assert "hidden_dim: head.query says 32, act_resnet.yaml defaults says 256" in err


def test_missing_and_nonfinite_tensors_are_named(bn):
    sd = {k: v for k, v in bn.sd.items() if "decoder.layers.1.linear2.weight" not in k}
    err = convert_fails(bn.save_sd("missing.pt", sd), bn.dir, "--config", bn.config)
    assert "missing tensors (policy_head): head.dec.1.ff2.w" in err
    sd = {k: v for k, v in bn.sd.items() if k != "vision_encoder.rgb_encoder.backbone.5.0.bn2.running_var"}
    err = convert_fails(bn.save_sd("missing_bn.pt", sd), bn.dir, "--config", bn.config)
    assert "vision.0.layer2.0.conv2" in err and "running_var" in err
    sd = {k: v.clone() for k, v in bn.sd.items()}
    sd["vision_encoder.rgb_encoder.out.weight"][1, 2] = float("nan")
    err = convert_fails(bn.save_sd("nan.pt", sd), bn.dir, "--config", bn.config)
    assert "tensor 'vision_encoder.rgb_encoder.out.weight' holds NaN or Inf" in err


# ------------------------------------------------ what a real run's files look like --

def test_deeper_trunk_is_refused_not_truncated(bn):
    """ResNet34's first two blocks per stage have ResNet18's shapes: the extra blocks must be
    refused by name, not dropped (the engine would run a different network)."""
    sd = dict(bn.sd)
    for key, v in bn.sd.items():
        if ".backbone.4.1." in key:   # layer1 block 1 -> a third block, as resnet34 has
            sd[key.replace(".backbone.4.1.", ".backbone.4.2.")] = v.clone()
    err = convert_fails(bn.save_sd("deeper.pt", sd), bn.dir, "--config", bn.config)
    assert "2 vision layers are not part of 1 ResNet18 trunk(s)" in err
    assert "vision.0.layer1.2.conv1" in err and "resnet18 only" in err
    cfg = json.loads(json.dumps(bn.cfg))
    cfg["vision_backbone"]["vision_backbone"] = "resnet34"
    path = bn.dir / "r34.yaml"
    ar.save_config(cfg, str(path))
    err = convert_fails(bn.ckpt, bn.dir, "--config", path)
    assert "vision_backbone.vision_backbone is 'resnet34'" in err


def test_unresolvable_camera_names_are_refused_not_defaulted(bn, bn_out):
    """The seed's act_resnet.yaml says camera_names: ${data.camera_names}; alone it cannot tell
    the order, and a wrong order feeds each token to the wrong memory slot."""
    agent = json.loads(json.dumps(bn.cfg))
    agent["camera_names"] = "${data.camera_names}"
    agent["vision_backbone"]["camera_names"] = "${agent.camera_names}"
    agent["vision_backbone"]["num_cameras"] = "${agent.num_cams}"
    path = bn.dir / "seed_style_agent.json"
    path.write_text(json.dumps(agent))
    err = convert_fails(bn.ckpt, bn.dir, "--config", path)
    assert "camera_names is ${data.camera_names}" in err and ".hydra/config.yaml" in err
    assert "--camera-names" in err
    meta, tensors, _, text = convert_ok(bn.ckpt, bn.dir, "--config", path, "--camera-names",
                                        "l_vis,r_vis,front", name="seed_style")
    assert meta["camera_names"] == "l_vis,r_vis,front" and "no config set" not in text
    assert all(np.array_equal(tensors[k], bn_out[1][k]) for k in bn_out[1])
    # an unresolvable setting the weights do not need to confirm is a warning, not a guess
    agent["camera_names"] = ["l_vis", "r_vis", "front"]
    agent["head"]["activation"] = "${train.activation}"
    path.write_text(json.dumps(agent))
    _, _, _, text = convert_ok(bn.ckpt, bn.dir, "--config", path, name="seed_style2")
    assert "head.activation is ${train.activation}" in text and "activation='gelu'" in text


def test_null_camera_names_take_the_agents_sorted_order(bn):
    """camera_names: null on the agent (and none on the backbone) makes seed 000's
    ACTAgent._order_images feed the cameras in sorted(observation keys) order; the converter used
    to fall back to the defaults' l_vis,r_vis,front, a silent 5% error."""
    agent = json.loads(json.dumps(bn.cfg))
    agent["camera_names"] = None
    agent["vision_backbone"]["camera_names"] = "${agent.camera_names}"
    path = bn.dir / "null_cams_agent.json"
    path.write_text(json.dumps({"agent": agent, "data": {"camera_names": ["r_vis", "top", "front"]}}))
    meta, _, _, text = convert_ok(bn.ckpt, bn.dir, "--config", path, name="null_cams")
    assert meta["camera_names"] == "front,r_vis,top", meta["camera_names"]
    assert "camera_names is null, so the agent fed the cameras in sorted order" in text, text
    # without the dataset's names the order is unknown: refused, with a sorted example
    path.write_text(json.dumps(agent))
    err = convert_fails(bn.ckpt, bn.dir, "--config", path)
    assert "camera_names is null (the agent then feeds the cameras in sorted order" in err, err
    assert "--camera-names front,l_vis,r_vis" in err, err
    meta, _, _, _ = convert_ok(bn.ckpt, bn.dir, "--config", path, "--camera-names", "front,l_vis,r_vis",
                               name="null_cams_flag")
    assert meta["camera_names"] == "front,l_vis,r_vis"
    # a backbone that names them still wins over the agent's null (the seed's rule)
    agent["vision_backbone"]["camera_names"] = ["l_vis", "r_vis", "front"]
    path.write_text(json.dumps(agent))
    meta, _, _, _ = convert_ok(bn.ckpt, bn.dir, "--config", path, name="null_cams_vb")
    assert meta["camera_names"] == "l_vis,r_vis,front"


def test_config_that_contradicts_the_checkpoints_own_entry_is_named(bn):
    """--config wins, but a camera order (or heads, activation...) other than the one the run
    saved in its checkpoint is said, not taken silently."""
    ckpt = bn.save("own_config.pt", include_config=True, cfg={"agent": bn.cfg})
    other = json.loads(json.dumps(bn.cfg))
    other["camera_names"] = ["front", "r_vis", "l_vis"]
    other["vision_backbone"].pop("camera_names", None)
    path = bn.dir / "other_order_agent.json"
    path.write_text(json.dumps(other))
    meta, _, _, text = convert_ok(ckpt, bn.dir, "--config", path, name="other_order")
    assert meta["camera_names"] == "front,r_vis,l_vis"
    assert (f"WARNING {path} sets camera_names = ['front', 'r_vis', 'l_vis'], but the checkpoint's own "
            "config entry says ['l_vis', 'r_vis', 'front']") in text, text
    _, _, _, text = convert_ok(ckpt, bn.dir, "--config", bn.config, name="same_order")
    assert "own config entry says" not in text, text


def test_defaults_the_weights_cannot_confirm_are_named(bn, bn_out):
    _, _, _, text = convert_ok(bn.ckpt, bn.dir, "--image-size", "80x80", "--input-size", "64x64",
                               "--num-action-steps", "3", "--nheads", "4", name="nocfg")
    assert "WARNING no config set camera_names=['l_vis', 'r_vis', 'front']" in text
    assert "activation='gelu'" in text and "nheads" not in text.split("no config set")[1]
    assert "no config set" not in bn_out[3]   # a full config sets every one of them


def test_ema_entry_is_named_and_selectable(bn, bn_out):
    live = {k: v for k, v in bn.sd.items()}
    ema = {k: (v * 0.5 if v.is_floating_point() else v) for k, v in bn.sd.items()}
    path = bn.dir / "ema.pt"
    torch.save({"model_state_dict": live, "ema_state_dict": ema, "epoch": 3}, str(path))
    _, tensors, _, text = convert_ok(path, bn.dir, "--config", bn.config, name="live")
    assert "the entry 'ema_state_dict' (" in text and "--state-dict-key ema_state_dict" in text
    assert np.array_equal(tensors["head.query"], bn_out[1]["head.query"])
    _, tensors, report, _ = convert_ok(path, bn.dir, "--config", bn.config, "--state-dict-key",
                                       "ema_state_dict", name="ema")
    assert report["state_dict"] == "entry 'ema_state_dict'"
    assert np.allclose(tensors["head.query"], 0.5 * bn_out[1]["head.query"])
    nested = bn.dir / "nested.pt"
    torch.save({"ema": {"module": ema}}, str(nested))
    err = convert_fails(nested, bn.dir, "--config", bn.config)
    assert "--state-dict-key" in err and "top-level keys are ema" in err
    _, tensors, _, _ = convert_ok(nested, bn.dir, "--config", bn.config, "--state-dict-key",
                                  "ema.module", name="nested")
    assert np.allclose(tensors["head.query"], 0.5 * bn_out[1]["head.query"])
    err = convert_fails(nested, bn.dir, "--state-dict-key", "ema.missing")
    assert "--state-dict-key ema.missing: no entry 'missing'" in err


def test_stats_saved_by_torch_and_whole_modules(bn, bn_out, tmp_path):
    stats = {k: torch.from_numpy(np.asarray(v)) for k, v in
             bn.agent.normalization.get_stats().items()}
    saved = tmp_path / "torch_stats.pkl"
    torch.save(stats, str(saved))
    _, tensors, report, _ = convert_ok(bn.ckpt, tmp_path, "--config", bn.config, "--stats", saved,
                                       name="torch_stats")
    assert report["stats_source"] == str(saved)
    assert np.array_equal(tensors["norm.qpos.min"], bn_out[1]["norm.qpos.min"])
    dumped = tmp_path / "dumped_stats.pkl"
    dumped.write_bytes(pickle.dumps(stats))
    err = convert_fails(bn.ckpt, tmp_path, "--config", bn.config, "--stats", dumped)
    assert "torch tensors pickled with pickle.dump" in err and ".numpy()" in err
    whole = tmp_path / "whole.pt"
    torch.save(bn.agent, str(whole))
    assert "save agent.state_dict() instead" in convert_fails(whole, tmp_path)


def test_norm_eps_flag_and_expanded_tensors(bn, bn_out):
    sd = dict(bn.sd)
    bias = sd["policy_head.action_head.bias"]
    for head in ("policy_head", "noise_pred_net"):   # the alias must stay equal
        sd[f"{head}.action_head.bias"] = torch.tensor([0.25]).expand(bias.shape[0])   # stride 0
    meta, tensors, report, text = convert_ok(bn.save_sd("expanded.pt", sd), bn.dir, "--config",
                                             bn.config, "--norm-eps", "1e-3", name="eps")
    assert np.array_equal(tensors["head.action_head.b"], np.full(bias.shape[0], 0.25, np.float32))
    assert meta["norm.eps"] == "0.001" and "(eps 0.001)" in text and report["norm_eps"] == 1e-3
    assert bn_out[0]["norm.eps"] == "1e-08"
    with pytest.raises(SystemExit) as e:
        run(bn.ckpt, "-o", bn.dir / "x.actw", "--norm-eps", "0")
    assert e.value.code == 2


def test_one_token_for_all_cameras_is_refused(bn):
    cfg = json.loads(json.dumps(bn.cfg))
    cfg["vision_backbone"]["output_tokens_per_camera"] = False
    path = bn.dir / "one_token.yaml"
    ar.save_config(cfg, str(path))
    err = convert_fails(bn.ckpt, bn.dir, "--config", path, "--trust-shapes")
    assert "output_tokens_per_camera is false (one token for all 3 cameras)" in err


class _Evil:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _evil_zip(path, payload):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"model_state_dict": {"x": payload}},
                                                    protocol=2))
        z.writestr("archive/version", b"3\n")


@pytest.mark.parametrize("kind", ["os.system", "builtins.eval", "subprocess.call"])
def test_malicious_pickles_are_refused_without_side_effects(bn, tmp_path, kind):
    import builtins
    import subprocess as sp
    marker = tmp_path / "pwned"
    cmd = f"touch {marker}"
    payload = {"os.system": _Evil(os.system, cmd),
               "builtins.eval": _Evil(builtins.eval, f"__import__('os').system({cmd!r})"),
               "subprocess.call": _Evil(sp.call, ["touch", str(marker)])}[kind]
    global_name = {"os.system": f"{os.system.__module__}.system", "builtins.eval": "builtins.eval",
                   "subprocess.call": "subprocess.call"}[kind]
    ckpt = tmp_path / "evil.pt"
    _evil_zip(ckpt, payload)
    err = convert_fails(ckpt, tmp_path)
    assert f"refusing to load global '{global_name}' from {ckpt}" in err
    stats = tmp_path / "evil_stats.pkl"
    stats.write_bytes(pickle.dumps({"qpos_min": payload}))
    err = convert_fails(bn.ckpt, tmp_path, "--config", bn.config, "--stats", stats)
    assert "refusing to load global" in err
    assert not marker.exists()


class _SubTensor(torch.Tensor):
    pass


def test_unread_entries_that_need_code_are_left_out_and_named(bn, bn_out, tmp_path):
    """A checkpoint with harmless extras the converter never reads (a date, the run's argparse
    Namespace, even a payload that would run a command) converts: those entries are loaded as
    inert stand-ins by the probe pass (nothing in them runs) and left out, each named in a
    warning; torch.Size and dtypes are plain values. Inside an entry the converter reads, such a
    global is refused and named with where it sits."""
    import argparse
    import datetime
    marker = tmp_path / "pwned"
    sd = {k: v for k, v in bn.sd.items()}
    ckpt = tmp_path / "extras.pt"
    torch.save({"model_state_dict": sd, "saved_at": datetime.datetime(2026, 1, 2),
                "args": argparse.Namespace(lr=1e-4), "evil": _Evil(os.system, f"touch {marker}"),
                "input_shape": torch.Size([3, 224, 224]), "dtype": torch.float32}, str(ckpt))
    meta, tensors, _, text = convert_ok(ckpt, tmp_path, "--config", bn.config, name="extras")
    for entry, name in (("saved_at", "datetime.datetime"), ("args", "argparse.Namespace"),
                        ("evil", f"{os.system.__module__}.system")):
        assert f"entry {entry!r} ({name}) is not read by the converter" in text, text
    assert "input_shape" not in text and "'dtype'" not in text, text
    assert all(np.array_equal(tensors[k], bn_out[1][k]) for k in bn_out[1])
    assert not marker.exists()
    # the PyTorch tutorial's general checkpoint keeps a tensor ('loss') beside the state dict, and
    # a long history list: neither makes it a bare state dict or a walk too long to tell
    ckpt = tmp_path / "tutorial.pt"
    torch.save({"epoch": 3, "model_state_dict": sd, "loss": torch.tensor(0.25), "args": argparse.Namespace(lr=1e-4),
                "loss_history": [0.5] * 4_500_000}, str(ckpt))
    _, tensors, _, text = convert_ok(ckpt, tmp_path, "--config", bn.config, name="tutorial")
    assert "entry 'args' (argparse.Namespace) is not read by the converter" in text, text
    assert all(np.array_equal(tensors[k], bn_out[1][k]) for k in bn_out[1])
    # inside the state dict: named, and refused
    ckpt = tmp_path / "inside.pt"
    torch.save({"model_state_dict": dict(sd, extra=argparse.Namespace(a=1))}, str(ckpt))
    err = convert_fails(ckpt, tmp_path, "--config", bn.config)
    assert "refusing to load global 'argparse.Namespace'" in err, err
    assert "sits at ['model_state_dict']['extra'] (argparse.Namespace)" in err, err
    # a stand-in hidden where a depth-limited walk of values missed it (a dict key, 20 levels
    # down) inside an entry the converter reads: refused, although a date beside it is droppable
    deep = {"leaf": 1, _Evil(os.system, f"touch {marker}"): 1}
    for _ in range(20):
        deep = {"d": deep}
    cfg = json.loads(json.dumps(bn.cfg))
    cfg["deep"] = deep
    ckpt = tmp_path / "hidden.pt"
    torch.save({"model_state_dict": sd, "saved_at": datetime.datetime(2026, 1, 2), "config": cfg}, str(ckpt))
    err = convert_fails(ckpt, tmp_path, "--config", bn.config)
    assert f"refusing to load global" in err and f"['d']['<a key>'] ({os.system.__module__}.system)" in err, err
    # a bare state dict: its entries are the tensors, none is left out (the model would miss it)
    ckpt = tmp_path / "bare_sub.pt"
    torch.save(dict(sd, **{"normalization.qpos_min": sd["normalization.qpos_min"].as_subclass(_SubTensor)}),
               str(ckpt))
    err = convert_fails(ckpt, tmp_path, "--config", bn.config)
    assert "refusing to load global" in err and "['normalization.qpos_min']" in err, err
    # the entry --state-dict-key names is read: refused with its class named, not left out
    ckpt = tmp_path / "ema_obj.pt"
    torch.save({"model_state_dict": sd, "ema": argparse.Namespace(ema_model=sd), "epoch": 5}, str(ckpt))
    err = convert_fails(ckpt, tmp_path, "--config", bn.config, "--state-dict-key", "ema.ema_model")
    assert "refusing to load global 'argparse.Namespace'" in err and "['ema']" in err, err
    ckpt = tmp_path / "ema_only.pt"
    torch.save({"ema": argparse.Namespace(ema_model=sd), "epoch": 5}, str(ckpt))
    err = convert_fails(ckpt, tmp_path, "--config", bn.config)
    assert "no state dict" in err and "left out, needing code run to load: 'ema' (argparse.Namespace)" in err, err
    assert not marker.exists()


def test_legacy_and_foreign_files_are_refused(bn, tmp_path):
    legacy = tmp_path / "legacy.pt"
    torch.save({"model_state_dict": {"w": torch.rand(2)}}, str(legacy),
               _use_new_zipfile_serialization=False)
    assert "legacy (pre-1.6, non-zip) torch.save file" in convert_fails(legacy, tmp_path)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(np.random.default_rng(5).bytes(300))
    assert "not a torch.save zip archive" in convert_fails(junk, tmp_path)
    assert "No such file" in convert_fails(tmp_path / "absent.pt", tmp_path)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(bn.ckpt.read_bytes()[:3_000_000])
    assert "damaged or truncated zip archive" in convert_fails(cut, tmp_path)
    holed = tmp_path / "holed.pt"
    with zipfile.ZipFile(bn.ckpt) as zin, zipfile.ZipFile(holed, "w") as zout:
        for name in zin.namelist():
            if not name.endswith("/data/0"):
                zout.writestr(name, zin.read(name))
    err = convert_fails(holed, tmp_path, "--config", bn.config)
    assert "storage record 'ckpt/data/0' is missing" in err


def _materialize(obj):
    if isinstance(obj, torch_zip.LazyTensor):
        obj.numpy()
    elif isinstance(obj, dict):
        for v in obj.values():
            _materialize(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _materialize(v)


def test_mutated_archives_fail_cleanly(tmp_path, rng):
    """Random byte edits of data.pkl (zip CRCs kept valid): the reader returns or raises
    CheckpointError - never another exception, never a huge allocation."""
    src = tmp_path / "tiny.pt"
    torch.save({"model_state_dict": {"a": torch.randn(3, 4), "b": torch.randn(5).half(),
                                     "c": torch.arange(6.0).view(2, 3).t(),
                                     "d": torch.randn(8)[2:]},
                "dataset_stats": {"qpos_min": np.arange(4, dtype=np.float32)}}, str(src))
    with zipfile.ZipFile(src) as z:
        records = {n: z.read(n) for n in z.namelist()}
    pkl_name = next(n for n in records if n.endswith("/data.pkl"))
    outcomes = {"ok": 0, "refused": 0}
    for i in range(300):
        pkl = bytearray(records[pkl_name])
        for _ in range(int(rng.integers(1, 5))):
            pkl[int(rng.integers(0, len(pkl)))] = int(rng.integers(0, 256))
        path = tmp_path / "mut.pt"
        with zipfile.ZipFile(path, "w") as z:
            for n, data in records.items():
                z.writestr(n, bytes(pkl) if n == pkl_name else data)
        try:
            _materialize(torch_zip.load_torch_zip(str(path)))
            outcomes["ok"] += 1
        except torch_zip.CheckpointError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 30 and outcomes["ok"] + outcomes["refused"] == 300


def test_converter_never_imports_torch(bn, tmp_path):
    """Run the CLI in a fresh interpreter where importing torch raises."""
    code = (
        "import sys, runpy\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"sys.argv = ['convert_checkpoint.py', {str(bn.ckpt)!r}, '-o', "
        f"{str(tmp_path / 'no_torch.actw')!r}, '--config', {str(bn.config)!r}]\n"
        f"runpy.run_path({str(TOOLS / 'convert_checkpoint.py')!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "model hash" in proc.stdout


# ------------------------------------------------------------------ through the engine --

def _engine_vs_reference(act_infer, agent, model, episode, out_dir):
    import h5py
    pred = Path(out_dir) / "pred.npy"
    proc = subprocess.run([str(act_infer), "predict", "--model", str(model), "--episode",
                           str(episode), "--out", str(pred), "--device", "cpu"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with h5py.File(episode, "r") as f:
        qpos = f["observations/qpos"][()]
        images = {c: f["observations/images/" + c][()] for c in agent.camera_names}
    return rel_err(np.load(pred), ar.predict(agent, qpos, images))


def test_engine_matches_reference_on_gn_separate_mean_std(act_infer, episode_factory, gn_sep):
    """The converter's GroupNorm / per-camera-trunk / mean_std output, read by the engine."""
    convert_ok(gn_sep.ckpt, gn_sep.dir, "--config", gn_sep.config, name="engine_gn")
    ep = episode_factory(T=3, image_size=80, obs_dim=5, action_dim=4, seed=21)
    err = _engine_vs_reference(act_infer, gn_sep.agent, gn_sep.dir / "engine_gn.actw", ep,
                               gn_sep.dir)
    assert err <= 1e-4, f"engine vs reference rel err {err:.2e}"


def test_engine_matches_reference_with_crop_and_imagenet_flags(act_infer, episode_factory, bn):
    """Preprocessing options set only by converter flags reach the engine; the reference agent
    gets the same options in its config (48x48 crop keeps the 2x2 feature map)."""
    cfg = json.loads(json.dumps(bn.cfg))
    cfg["vision_backbone"].update(crop_shape=[48, 48], image_normalization="imagenet")
    agent = ar.build_agent(cfg)
    agent.load_state_dict(bn.agent.state_dict())
    convert_ok(bn.ckpt, bn.dir, "--config", bn.config, "--crop", "48x48", "--imagenet-norm",
               name="engine_crop")
    ep = episode_factory(T=3, image_size=80, obs_dim=5, action_dim=4, seed=22)
    err = _engine_vs_reference(act_infer, agent.eval(), bn.dir / "engine_crop.actw", ep, bn.dir)
    assert err <= 1e-4, f"engine vs reference rel err {err:.2e}"


def test_engine_matches_reference_at_the_datasets_resize(act_infer, episode_factory, bn):
    """A run that resized its frames to 60x60 in the dataset (input_shape left at 64): the
    engine must resize to 60 as the training data was, i.e. match a reference built at 60."""
    cfg = json.loads(json.dumps(bn.cfg))
    cfg["vision_backbone"]["input_shape"] = [3, 60, 60]
    agent = ar.build_agent(cfg)
    agent.load_state_dict(bn.agent.state_dict())
    path = bn.dir / "engine_resize_agent.json"
    path.write_text(json.dumps({"agent": bn.cfg, "data": {"image_resize_shape": [60, 60]}}))
    convert_ok(bn.ckpt, bn.dir, "--config", path, name="engine_resize")
    ep = episode_factory(T=3, image_size=80, obs_dim=5, action_dim=4, seed=23)
    err = _engine_vs_reference(act_infer, agent.eval(), bn.dir / "engine_resize.actw", ep, bn.dir)
    assert err <= 1e-4, f"engine vs reference rel err {err:.2e}"
    convert_ok(bn.ckpt, bn.dir, "--config", bn.config, name="engine_noresize")
    err = _engine_vs_reference(act_infer, agent.eval(), bn.dir / "engine_noresize.actw", ep,
                               bn.dir)
    assert err > 1e-3, "a 64x64 resize gave the 60x60 run's actions: the test cannot tell"


def test_reference_loads_a_full_config_at_the_datasets_resize(bn, tmp_path):
    """tools/act_reference.py (eval_compare, compare_torch) reads the same key the converter
    does, so both sides of a parity check resize alike."""
    path = tmp_path / "config.yaml"
    import yaml
    path.write_text(yaml.safe_dump({"agent": bn.cfg, "data": {"image_resize_shape": [60, 60]}}))
    with pytest.warns(UserWarning, match="data.image_resize_shape"):
        cfg = ar.load_config(str(path))
    assert cfg["vision_backbone"]["input_shape"] == [3, 60, 60]
    path.write_text(yaml.safe_dump({"agent": bn.cfg, "data": {"image_resize_shape": None}}))
    assert ar.load_config(str(path))["vision_backbone"]["input_shape"] == [3, 64, 64]


def test_output_never_destroys_an_input_or_the_model_it_replaces(bn, bn_out, tmp_path):
    """-o (or --report) naming the checkpoint, the statistics, the config or each other is
    refused before any work; a write that fails (here the file-size limit) leaves the model it
    would have replaced whole and no temporary file, and the error names the path."""
    import shutil
    ckpt = tmp_path / "run.pt"
    shutil.copy(bn.ckpt, ckpt)
    before = ckpt.read_bytes()
    for args, words in ((["-o", ckpt], "-o " + str(ckpt) + " is the checkpoint"),
                        (["-o", tmp_path / "m.actw", "--report", bn.config, "--config", bn.config],
                         "is --config"),
                        (["-o", tmp_path / "m.actw", "--report", tmp_path / "m.actw"], "is the -o file"),
                        (["-o", tmp_path], "is a directory")):
        rc, _, err = run(ckpt, *args)
        assert rc == 1 and words in err, err
    assert ckpt.read_bytes() == before and not (tmp_path / "m.actw").exists()
    model = tmp_path / "m.actw"
    shutil.copy(bn_out_path(bn), model)
    good = model.read_bytes()
    script = ("import resource, signal, sys; sys.path.insert(0, sys.argv[1]); import convert_checkpoint as cc; "
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20)); sys.exit(cc.main(sys.argv[2:]))")
    p = subprocess.run([sys.executable, "-c", script, str(TOOLS), str(ckpt), "-o", str(model), "--config",
                        str(bn.config)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 1 and f"cannot write {model}: File too large" in p.stderr, p.stderr
    assert model.read_bytes() == good
    assert sorted(f.name for f in tmp_path.iterdir()) == ["m.actw", "run.pt"]


def bn_out_path(bn):
    return bn.dir / "base.actw"   # what the bn_out fixture wrote


def test_report_folder_and_zstd_module_are_checked_before_the_work(bn, tmp_path, monkeypatch):
    out = tmp_path / "m.actw"
    rc, _, err = run(bn.ckpt, "-o", out, "--config", bn.config, "--report", tmp_path / "no" / "r.json")
    assert rc == 1 and "--report" in err and "cannot write into" in err and not out.exists(), err
    monkeypatch.setitem(sys.modules, "zstandard", None)   # import zstandard raises ImportError
    rc, _, err = run(bn.ckpt, "-o", out, "--config", bn.config, "--compress", "zstd")
    assert rc == 1 and "--compress zstd needs the 'zstandard' module" in err and not out.exists(), err


def _rezip(src, dst, record_suffix, write):
    """dst: src's archive with the record ending in record_suffix rewritten by write(zip, name, data)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            if name.endswith(record_suffix):
                write(zout, name, data)
            else:
                zout.writestr(name, data)


def test_storage_records_are_checked_before_they_are_read(bn, tmp_path):
    """A storage record inflating far past what its storage declares (a zip bomb: a 1 MB file
    asking for a GiB) or holding more bytes than its elements is refused before it is read."""
    stats = tmp_path / "stats.pt"
    torch.save({k: torch.from_numpy(v) for k, v in bn.agent.normalization.get_stats().items()}, str(stats))

    def deflated(z, name, data):
        info = zipfile.ZipInfo(name)
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, data + bytes(1 << 22))

    def longer(z, name, data):
        z.writestr(name, data + bytes(8))

    def bomb_pickle(z, name, data):   # a deflated pickle: KB that unpickle into GB of lists
        info = zipfile.ZipInfo(name)
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, b"(" + b"]" * (1 << 20) + b"1" + data)

    for how, suffix, words in ((deflated, "/data/0", "is compressed"), (longer, "/data/0", "is stored, "),
                               (bomb_pickle, "/data.pkl", "is compressed")):
        bad = tmp_path / f"{how.__name__}.pkl"
        _rezip(stats, bad, suffix, how)
        err = convert_fails(bn.ckpt, tmp_path, "--config", bn.config, "--stats", bad, "--stats-from", "file")
        assert "record '" in err and suffix in err and words in err and "uncompressed" in err, err


def test_a_nan_in_an_aliased_head_weight_is_called_nan(bn, tmp_path):
    """noise_pred_net.* is the same module as policy_head.*: a NaN from a diverged run is in
    both, and the error is the NaN, not 'the alias differs'."""
    sd = {k: v.clone() for k, v in bn.sd.items()}
    for k in ("policy_head.action_head.weight", "noise_pred_net.action_head.weight"):
        sd[k][0, 0] = float("nan")
    err = convert_fails(bn.save_sd("nan_head.pt", sd), tmp_path, "--config", bn.config)
    assert "NaN" in err and "differs" not in err, err


def test_wrapper_prefixes_inside_keys_are_stripped(bn, bn_out, tmp_path):
    """agent.vision_encoder = torch.compile(...) (or DataParallel on a submodule) puts
    _orig_mod. / module. inside the keys: converted as the plain keys are."""
    for wrap in ("_orig_mod.", "module."):
        sd = {(k.replace("vision_encoder.", "vision_encoder." + wrap, 1) if k.startswith("vision_encoder.")
               else k): v for k, v in bn.sd.items()}
        _, tensors, _, _ = convert_ok(bn.save_sd(f"wrapped_{wrap[:-1]}.pt", sd), tmp_path, "--config", bn.config,
                                      name=f"wrapped_{wrap[:-1]}")
        assert all(np.array_equal(tensors[k], bn_out[1][k]) for k in bn_out[1])


def test_the_state_dict_is_found_past_config_entries_and_scalar_extras(bn, bn_out, tmp_path):
    # an 'agent' entry holding the Hydra agent config, the weights elsewhere: pointed at
    ckpt = tmp_path / "agent_cfg.pt"
    torch.save({"agent": {"_target_": "roboimi.vla.agent_act.ACTAgent", "hidden_dim": 32},
                "weights": dict(bn.sd)}, str(ckpt))
    err = convert_fails(ckpt, tmp_path, "--config", bn.config)
    assert "--state-dict-key KEY; entries holding tensors: weights" in err, err
    _, tensors, _, _ = convert_ok(ckpt, tmp_path, "--config", bn.config, "--state-dict-key", "weights", name="w")
    assert all(np.array_equal(tensors[k], bn_out[1][k]) for k in bn_out[1])
    # a bare state dict saved with a step count beside the tensors, and a wrapped one
    for name, obj, where in (("bare_step", dict(bn.sd, step=1234, epoch=7), "a bare state dict"),
                             ("entry_step", {"model_state_dict": dict(bn.sd, step=1234, epoch=7)},
                              "entry 'model_state_dict'")):
        ckpt = tmp_path / f"{name}.pt"
        torch.save(obj, str(ckpt))
        _, tensors, _, text = convert_ok(ckpt, tmp_path, "--config", bn.config, name=name)
        assert f"{where}: 2 entries that are not tensors, left out: step, epoch" in text, text
        assert all(np.array_equal(tensors[k], bn_out[1][k]) for k in bn_out[1])


def test_an_fp16_checkpoint_agrees_with_its_runs_stats_file(bn, tmp_path):
    """Every float tensor saved .half(), the normalization buffers too: the run's own
    dataset_stats.pkl differs from them only by that rounding and is the same statistics."""
    stats = tmp_path / "dataset_stats.pkl"
    src = bn.save("fp16_src.pt", stats_path=str(stats))
    ck = torch.load(str(src))
    ck["model_state_dict"] = {k: (v.half() if v.is_floating_point() else v) for k, v in ck["model_state_dict"].items()}
    half = tmp_path / "fp16.pt"
    torch.save(ck, str(half))
    meta, tensors, rep, _ = convert_ok(half, tmp_path, "--config", bn.config, "--stats", stats, name="fp16")
    assert rep["stats_source"] == str(stats)
    want = bn.agent.normalization.get_stats()["qpos_min"]
    assert np.array_equal(tensors["norm.qpos.min"], want.astype(np.float32))   # the file's, unrounded
    # an unrelated fp16 or ragged entry beside float32 statistics changes nothing: the stats are
    # compared at their own precision, and entries the converter does not read are not parsed
    st32 = {k: (v * (1 + 1e-5)).astype(np.float32) for k, v in bn.agent.normalization.get_stats().items()}
    with open(tmp_path / "extras.pkl", "wb") as f:
        pickle.dump(dict(st32, image_mean=np.ones(3, np.float16), episode_lengths=[[100, 120], [90]]), f)
    err = convert_fails(src, tmp_path, "--config", bn.config, "--stats", tmp_path / "extras.pkl")
    assert "from this run?" in err, err   # 1e-5 apart at float32: not the buffers' statistics
    # statistics that differ by more than the rounding are still refused
    other = {k: v * 1.01 for k, v in bn.agent.normalization.get_stats().items()}
    with open(tmp_path / "other.pkl", "wb") as f:
        pickle.dump(other, f)
    err = convert_fails(half, tmp_path, "--config", bn.config, "--stats", tmp_path / "other.pkl")
    assert "is " + str(tmp_path / "other.pkl") + " from this run?" in err, err


def test_executed_steps_are_named_set_by_flag_and_cut_to_the_chunk(bn, tmp_path):
    """obs_horizon and num_action_steps decide which actions a rollout executes
    (chunk[obs_horizon-1 : obs_horizon-1+num_action_steps]) and no weight can confirm them:
    left to the defaults they are named; --obs-horizon sets one; a num_action_steps past the
    chunk's end is what the seed's slice cuts short, so the file serves what runs."""
    _, _, _, text = convert_ok(bn.ckpt, tmp_path, "--image-size", "80x80", "--input-size", "64x64",
                               "--nheads", "4", name="nocfg")
    left = text.split("WARNING no config set")[1].split("\n")[0]
    assert "obs_horizon=1" in left and "num_action_steps=8" in left, text
    assert "WARNING num_action_steps 8 (act_resnet.yaml defaults) runs past the chunk" in text and \
        "the model serves num_action_steps = 6" in text, text
    meta, _, _, text = convert_ok(bn.ckpt, tmp_path, "--config", bn.config, "--obs-horizon", "2",
                                  "--num-action-steps", "6", name="oh2")
    assert (meta["obs_horizon"], meta["num_action_steps"]) == ("2", "5"), meta
    assert "executes chunk[1:6], 5 actions a chunk" in text, text
    err = convert_fails(bn.ckpt, tmp_path, "--config", bn.config, "--obs-horizon", "7")
    assert "obs_horizon 7: needs 1 <= obs_horizon <= pred_horizon (6)" in err, err


def test_unsupported_trunks_and_token_layouts_are_named(bn, tmp_path):
    # one token for all cameras: visual_proj reads num_cams x the trunk's features
    sd = {k: v.clone() for k, v in bn.sd.items()}
    for head in ("policy_head", "noise_pred_net"):
        w = sd[f"{head}.visual_proj.weight"]
        sd[f"{head}.visual_proj.weight"] = w.repeat(1, 3)
    sd["noise_pred_net.visual_proj.weight"] = sd["policy_head.visual_proj.weight"]
    for cfg in (["--config", bn.config], ["--image-size", "80x80", "--input-size", "64x64"]):
        err = convert_fails(bn.save_sd("one_token.pt", sd), tmp_path, *cfg)
        assert "3 cameras x the trunk's" in err and "output_tokens_per_camera false" in err, err
    # a bottleneck ResNet (resnet50): its conv3/bn3 say so, not "map them with --key-map"
    sd = dict(bn.sd)
    sd["vision_encoder.rgb_encoder.backbone.4.0.conv3.weight"] = torch.zeros(256, 64, 1, 1)
    sd["vision_encoder.rgb_encoder.backbone.4.0.bn3.weight"] = torch.ones(256)
    err = convert_fails(bn.save_sd("r50.pt", sd), tmp_path, "--config", bn.config)
    assert "bottleneck ResNet's third conv" in err and "resnet18 only" in err and "--key-map" not in err, err


def test_outputs_through_links_devices_and_long_names(bn, tmp_path):
    """-o through a symbolic link replaces the link's target (the link stays, as a plain open
    wrote through it); --report /dev/stdout goes to the process's stdout, not over /dev/stdout;
    a 250-character name (the temporary file's name is longer) is written."""
    (tmp_path / "models").mkdir()
    target = tmp_path / "models" / "v3.actw"
    target.write_bytes(b"old")
    link = tmp_path / "current.actw"
    link.symlink_to("models/v3.actw")
    long_name = tmp_path / ("m" * 250)
    script = "import sys; sys.path.insert(0, sys.argv[1]); import convert_checkpoint as cc; sys.exit(cc.main(sys.argv[2:]))"
    for out in (link, long_name):
        p = subprocess.run([sys.executable, "-c", script, str(TOOLS), str(bn.ckpt), "-o", str(out), "--config",
                            str(bn.config), "--report", "/dev/stdout"], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout[p.stdout.index("{"):])["output"] == str(out)   # the report, on stdout
    assert link.is_symlink() and target.read_bytes()[:4] == b"ACTW"
    assert actw.read_actw(long_name)[0]["camera_names"] == "l_vis,r_vis,front"
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(["models", "current.actw", "m" * 250])


def test_compressing_mostly_zeros_is_declined_and_said(bn, tmp_path):
    """zstd data inflating more than 64:1 is refused by readers (a few KB could claim
    gigabytes): the converter writes such a model uncompressed and says so."""
    sd = {k: (torch.zeros_like(v) if v.is_floating_point() and not k.startswith("normalization.") and "pos_grid" not in k else v)
          for k, v in bn.sd.items()}
    meta, tensors, header, text = convert_ok(bn.save_sd("zeros.pt", sd), tmp_path, "--config", bn.config,
                                             "--compress", "zstd", name="zeros", verify=True)
    assert "WARNING --compress zstd: the data is mostly zeros" in text and "written uncompressed" in text, text
    assert actw.read_actw(tmp_path / "zeros.actw")[2]["compression"] == 0
