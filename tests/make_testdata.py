#!/usr/bin/env python3
"""make_testdata.py - the weight files the C loader tests (and anyone else) read.

  python3 tests/make_testdata.py [OUT_DIR]        (default: $ACT_TEST_DATA, else build/testdata)

Each model is a randomized PyTorch reference agent (tools/act_reference.py) saved as a real
training checkpoint and converted by the real converter (tools/convert_checkpoint.py, run as a
user would run it), so the loader tests corrupt genuine converter output:

  small.actw         SMALL_CFG: shared BatchNorm trunk, min_max, gelu, no crop (raw data)
  small_zstd.actw    the same checkpoint, zstd-compressed data section (needs `zstandard`)
  small_sep_gn.actw  two cameras with separate GroupNorm trunks, mean_std, relu, center crop +
                     ImageNet norm

The ResNet18 trunk has the same 11M parameters at any config, so each file is tens of MB; the
files are rebuilt only when missing or older than the scripts that make them.

Beside each model, NAME.expect holds what the tests compare against, computed here in Python
and independent of the C code: `cfg <field> <value>` from the agent config and the reference
trunk's real output map; `tensor <name> <numel> <sum> <first> <last>` from the converter's own
reader (tools/actw.py); `norm <which> <rows> <cols>` followed by input and reference output rows
of the PyTorch NormalizationModule on fresh random inputs.
"""

import copy
import importlib.util
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
NORM_ROWS = 7

# numpy, torch and the reference are imported only when files must be made: the up-to-date
# check runs on every ctest and should not pay for importing torch.
np = torch = ref = actw = None


def _import_heavy():
    global np, torch, ref, actw
    import numpy as np  # noqa: F811
    import torch  # noqa: F811
    import act_reference as ref  # noqa: F811
    import actw  # noqa: F811


# zstd output needs the zstandard module; a machine without it (a bare GPU box) skips that file
# and test_weights says so, rather than the whole fixture failing
HAVE_ZSTD = importlib.util.find_spec("zstandard") is not None
OUTPUTS = ("small", "small_zstd", "small_sep_gn") if HAVE_ZSTD else ("small", "small_sep_gn")


def variants():
    small = copy.deepcopy(ref.SMALL_CFG)
    sep = copy.deepcopy(ref.SMALL_CFG)
    sep["normalization_type"] = "mean_std"
    sep["camera_names"], sep["num_cams"] = ["top", "wrist"], 2
    sep["head"]["activation"] = "relu"
    sep["vision_backbone"].update(use_group_norm=True, use_separate_rgb_encoder_per_camera=True,
                                  crop_shape=[56, 48], image_normalization="imagenet")
    # (checkpoint config, seed, [(output name, converter flags)]): one checkpoint per config, so
    # the raw and zstd files hold the very same bytes
    plain = [("small", []), ("small_zstd", ["--compress", "zstd"])]
    return [(small, 11, [f for f in plain if f[0] in OUTPUTS]), (sep, 12, [("small_sep_gn", [])])]


def feature_hw(agent):
    """The trunk's real output map, measured by running the reference trunk."""
    vb = agent.cfg["vision_backbone"]
    h, w = ref.backbone_image_hw(vb)
    enc = ref._encoders(agent)[0]
    with torch.no_grad():
        y = enc.backbone(torch.rand(1, 3, h, w))
    return int(y.shape[2]), int(y.shape[3])


def cfg_lines(agent):
    c, vb, hd = agent.cfg, agent.cfg["vision_backbone"], agent.cfg["head"]
    fh, fw = feature_hw(agent)
    crop = vb.get("crop_shape") or [0, 0]
    vals = {
        "obs_dim": c["obs_dim"], "action_dim": c["action_dim"], "pred_horizon": c["pred_horizon"],
        "obs_horizon": c["obs_horizon"], "num_action_steps": c["num_action_steps"],
        "num_cams": c["num_cams"], "camera_names": ",".join(c["camera_names"]),
        "image_h": vb["image_shape"][0], "image_w": vb["image_shape"][1],
        "input_h": vb["input_shape"][1], "input_w": vb["input_shape"][2],
        "crop_h": crop[0], "crop_w": crop[1],
        "imagenet_norm": int(vb.get("image_normalization") == "imagenet"),
        "vision_norm": int(bool(vb["use_group_norm"])),
        "separate_trunks": int(bool(vb["use_separate_rgb_encoder_per_camera"])),
        "num_keypoints": vb["spatial_softmax_num_keypoints"], "vision_dim": vb["output_dim"],
        "feat_h": fh, "feat_w": fw,
        "hidden_dim": hd["hidden_dim"], "nheads": hd["nheads"], "enc_layers": hd["enc_layers"],
        "dec_layers": hd["dec_layers"], "ff_dim": hd["dim_feedforward"], "latent_dim": hd["latent_dim"],
        "activation": int(hd["activation"] == "gelu"), "kl_weight": hd["kl_weight"],
        "norm_type": int(c["normalization_type"] == "mean_std"),
    }
    return [f"cfg {k} {v}\n" for k, v in vals.items()]


def norm_lines(agent, rng):
    n, out = agent.normalization, []
    cases = (("qpos", agent.obs_dim, n.normalize_qpos), ("action", agent.action_dim, n.normalize_action),
             ("denorm_action", agent.action_dim, n.denormalize_action))
    for which, dim, fn in cases:
        x = rng.uniform(-3.0, 3.0, size=(NORM_ROWS, dim)).astype(np.float32)
        with torch.no_grad():
            y = fn(torch.from_numpy(x)).numpy()
        out.append(f"norm {which} {NORM_ROWS} {dim}\n")
        out += [" ".join(format(float(v), ".9g") for v in row) + "\n" for row in np.concatenate([x, y])]
    return out


def tensor_lines(path):
    _, tensors, _ = actw.read_actw(path)
    out = []
    for name, a in tensors.items():
        flat = a.reshape(-1).astype(np.float64)
        out.append(f"tensor {name} {flat.size} {flat.sum():.17g} {flat[0]:.9g} {flat[-1]:.9g}\n")
    return out


def up_to_date(out_dir):
    sources = [os.path.abspath(__file__)] + [os.path.join(ROOT, "tools", f) for f in
                                             ("act_reference.py", "actw.py", "convert_checkpoint.py",
                                              "convert_config.py", "convert_keys.py", "torch_zip.py")]
    newest = max(os.path.getmtime(s) for s in sources if os.path.exists(s))
    outs = [os.path.join(out_dir, n + ext) for n in OUTPUTS for ext in (".actw", ".expect")]
    return all(os.path.exists(o) and os.path.getmtime(o) > newest for o in outs)


def main(argv):
    out_dir = argv[1] if len(argv) > 1 else os.environ.get("ACT_TEST_DATA", os.path.join(ROOT, "build", "testdata"))
    os.makedirs(out_dir, exist_ok=True)
    if up_to_date(out_dir):
        print(f"make_testdata: {out_dir} is up to date")
        return 0
    _import_heavy()
    rng = np.random.default_rng()
    with tempfile.TemporaryDirectory() as tmp:
        for cfg, seed, files in variants():
            agent = ref.randomize_(ref.build_agent(cfg), seed)
            ckpt, conf = os.path.join(tmp, f"agent{seed}.pt"), os.path.join(tmp, f"agent{seed}.yaml")
            ref.save_checkpoint(agent, ckpt, cfg=agent.cfg, config_path=conf)
            for name, flags in files:
                dst = os.path.join(out_dir, name + ".actw")
                cmd = [sys.executable, os.path.join(ROOT, "tools", "convert_checkpoint.py"), ckpt, "-o", dst,
                       "--config", conf] + flags
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    sys.stderr.write(f"make_testdata: converting {name} failed:\n{r.stdout}{r.stderr}")
                    return 1
                with open(os.path.join(out_dir, name + ".expect"), "w") as f:
                    f.writelines(cfg_lines(agent) + tensor_lines(dst) + norm_lines(agent, rng))
                print(f"make_testdata: wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
