#!/usr/bin/env python3
"""convert_checkpoint.py - a roboimi ACT training checkpoint -> one .actw weight file, no torch.

  python3 tools/convert_checkpoint.py CKPT.pt -o MODEL.actw [--config AGENT.yaml] [--stats S.pkl]

Steps: read the torch.save archive with a restricted unpickler (torch_zip.py: nothing in the file
executes); find the state dict; strip `module.`/`_orig_mod.`; apply --key-map; check the
`noise_pred_net` alias; sort every key into a place (convert_keys.py) or refuse; infer every
size the shapes tell and cross-check it against the config (convert_config.py); fold BatchNorm
into the convs in float64; pick the normalization statistics; write weights/FORMAT.md (actw.py).
Anything that does not fit is an error naming the key, tensor or setting - never a guess.
"""

import argparse
import hashlib
import json
import math
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import actw  # noqa: E402
from convert_config import (DEFAULTS, Settings, load_config_file, settings_from_agent,  # noqa: E402,E501
                            split_agent)
from convert_keys import map_state_dict  # noqa: E402
from torch_zip import LazyTensor, load_pickle, load_torch_zip  # noqa: E402

CONVERTER_VERSION = "0.1.0"
BN_EPS = 1e-5
NORM_EPS = 1e-8
LN_EPS = 1e-5
MAX_CAMS, MAX_LAYERS, NAME_LEN = 8, 16, 32    # act.h limits
SD_ENTRIES = ("model_state_dict", "state_dict", "model", "agent")
PREFIXES = ("module.", "_orig_mod.")
STAT_KINDS = {"min_max": ("min", "max"), "mean_std": ("mean", "std")}
# ResNet18 stages: (layer, channels, input channels of block 0)
STAGES = ((1, 64, 64), (2, 128, 64), (3, 256, 128), (4, 512, 256))


class ConvertError(ValueError):
    """The checkpoint cannot be converted as asked; the message says why and where."""


def _list(items, limit=12):
    items = list(items)
    more = f" ... and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


# ------------------------------------------------------------------ state dict and its keys --

def find_state_dict(top, path):
    """Returns (state dict, where it was found)."""
    if not isinstance(top, dict):
        raise ConvertError(f"{path}: top object is {type(top).__name__}, expected a dict")
    for key in SD_ENTRIES:
        if isinstance(top.get(key), dict):
            return top[key], f"entry '{key}'"
    if top and all(isinstance(v, LazyTensor) for v in top.values()):
        return top, "top level"
    raise ConvertError(f"{path}: no state dict: expected an entry {', '.join(SD_ENTRIES)} or a "
                       f"bare state dict; top-level keys are {_list(map(str, top))}")


def strip_prefixes(key):
    changed = True
    while changed:
        changed = False
        for p in PREFIXES:
            if key.startswith(p):
                key, changed = key[len(p):], True
    return key


def load_key_map(path):
    """MAP.json: {"exact.source.key": "new.key" | null, "re:<regex>": "<template>" | null}."""
    with open(path, "r", encoding="utf-8") as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as e:
            raise ConvertError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict) or not all(v is None or isinstance(v, str) for v in raw.values()):
        raise ConvertError(f"{path}: expected an object of source key -> new key (or null)")
    exact, rules = {}, []
    for k, v in raw.items():
        if k.startswith("re:"):
            try:
                rules.append((re.compile(k[3:]), v))
            except re.error as e:
                raise ConvertError(f"{path}: bad regex {k[3:]!r} ({e})") from None
        else:
            exact[k] = v
    return exact, rules


def rename_keys(sd, key_map, ignore, report):
    """Strip prefixes, apply the key map and --ignore; returns {key: tensor}."""
    exact, rules = key_map or ({}, [])
    out = {}
    for src, value in sd.items():
        if not isinstance(src, str):
            raise ConvertError(f"state-dict key {src!r} is not a string")
        key = strip_prefixes(src)
        if key in exact:
            key = exact[key]
        else:
            for pattern, template in rules:
                m = pattern.fullmatch(key)
                if m:
                    key = None if template is None else m.expand(template)
                    break
        if key is None or any(p.fullmatch(key) for p in ignore):
            report["ignored"].append(src)
            continue
        if key != src:
            report["renamed"][src] = key
        if key in out:
            raise ConvertError(f"state-dict keys map twice onto '{key}' (after prefix stripping "
                               f"and the key map)")
        if not isinstance(value, LazyTensor):
            raise ConvertError(f"state-dict entry '{src}' is {type(value).__name__}, not a tensor")
        out[key] = value
    return out


def drop_alias(sd, report):
    """The agent registers its head twice; the noise_pred_net copy must be identical."""
    out = {}
    for key, t in sd.items():
        if not key.startswith("noise_pred_net."):
            out[key] = t
            continue
        twin = "policy_head." + key[len("noise_pred_net."):]
        if twin not in sd:
            raise ConvertError(f"'{key}' has no '{twin}' counterpart")
        a, b = t.numpy(), sd[twin].numpy()
        if a.shape != b.shape or not np.array_equal(a, b):
            raise ConvertError(f"'{key}' differs from '{twin}': the noise_pred_net alias must "
                               f"equal the policy head")
        report["consumed"][key] = f"alias of {twin}"
    return out


# ---------------------------------------------------------------------------- inference --

class Model:
    """The mapped checkpoint: source shapes and values by canonical name."""

    def __init__(self, sd, mapped):
        self.sd, self.m = sd, mapped

    def head(self, name):
        key = self.m.head.get(name)
        return None if key is None else self.sd[key]

    def shape(self, name, axis):
        t = self.head(name)
        return None if t is None or len(t.shape) <= axis else t.shape[axis]

    def vision(self, trunk, name):
        key = self.m.tensors.get((trunk, name))
        return None if key is None else self.sd[key]


def _count_layers(names, prefix):
    idx = sorted({int(n.split(".")[2]) for n in names if n.startswith(prefix)})
    if idx != list(range(len(idx))):
        raise ConvertError(f"layers {prefix}N are numbered {idx}, expected 0..{len(idx) - 1}")
    return len(idx)


def _grid_size(grid):
    """(h, w) of a SpatialSoftmax pos_grid: x varies along columns, y along rows."""
    a = grid.numpy()
    if a.ndim != 2 or a.shape[1] != 2:
        return None
    w, h = len(np.unique(a[:, 0])), len(np.unique(a[:, 1]))
    return (h, w) if h * w == a.shape[0] else None


def infer(model):
    """Every setting the tensor shapes fix, with the tensor that fixed it."""
    m = model.m
    found = {}

    def first(name, *candidates):
        for label, value in candidates:
            if value is not None:
                found[name] = (int(value), label)
                return

    first("hidden_dim", ("head.query", model.shape("head.query", 1)),
          ("head.mem_type", model.shape("head.mem_type", 1)))
    first("pred_horizon", ("head.query", model.shape("head.query", 0)))
    first("obs_dim", ("head.enc_qpos.w", model.shape("head.enc_qpos.w", 1)),
          ("head.dec_qpos.w", model.shape("head.dec_qpos.w", 1)))
    first("action_dim", ("head.action_head.w", model.shape("head.action_head.w", 0)),
          ("head.enc_action.w", model.shape("head.enc_action.w", 1)))
    first("latent_dim", ("head.latent_out.w", model.shape("head.latent_out.w", 1)))
    first("dim_feedforward", ("head.dec.0.ff1.w", model.shape("head.dec.0.ff1.w", 0)),
          ("head.enc.0.ff1.w", model.shape("head.enc.0.ff1.w", 0)))
    found["enc_layers"] = (_count_layers(m.head, "head.enc."), "head.enc.N")
    found["dec_layers"] = (_count_layers(m.head, "head.dec."), "head.dec.N")
    first("output_dim", ("head.visual_proj.w", model.shape("head.visual_proj.w", 1)))
    if len(m.trunk_style) > 1:
        raise ConvertError("the state dict mixes a shared trunk (vision_encoder.rgb_encoder.*) "
                           "with per-camera trunks (vision_encoder.rgb_encoder.N.*)")
    trunks = sorted({t for t, _ in m.convs} | {t for t, _ in m.tensors})
    if trunks != list(range(len(trunks))):
        raise ConvertError(f"vision trunks are numbered {trunks}, expected 0..{len(trunks) - 1}")
    if "separate" in m.trunk_style:
        found["separate_trunks"] = (1, "vision_encoder.rgb_encoder.N")
        found["num_cams"] = (len(trunks), "vision_encoder.rgb_encoder.N")
    elif trunks:
        found["separate_trunks"] = (0, "vision_encoder.rgb_encoder")
    kp = model.vision(0, "keypoints.w")
    if kp is not None:
        found["num_keypoints"] = (kp.shape[0], "pool.nets.weight")
    norms = {"batchnorm" if "running_mean" in g["norm"] else "groupnorm"
             for g in m.convs.values() if g["norm"]}
    if len(norms) > 1:
        raise ConvertError("the trunk mixes BatchNorm (running statistics) and GroupNorm layers")
    if norms:
        found["vision_norm"] = (norms.pop(), "backbone norm layers")
    grid = model.vision(0, "pos_grid")
    if grid is not None:
        hw = _grid_size(grid)
        if hw is None:
            raise ConvertError(f"pool.pos_grid has shape {list(grid.shape)} and is not a "
                               f"SpatialSoftmax grid of h*w (x, y) rows")
        found["feature_height"] = (hw[0], "pool.pos_grid")
        found["feature_width"] = (hw[1], "pool.pos_grid")
    return found


def resolve(settings, found, trust, strict, warnings):
    """Final config: settings, overridden by what the shapes say; conflicts are errors."""
    cfg = {k: settings.get(k) for k in DEFAULTS}
    if not settings.explicit("num_cams") and settings.explicit("camera_names"):
        cfg["num_cams"] = len(cfg["camera_names"])
    eff_h = cfg["crop_height"] or cfg["input_height"]
    eff_w = cfg["crop_width"] or cfg["input_width"]
    feat = {"feature_height": math.ceil(eff_h / 32), "feature_width": math.ceil(eff_w / 32)}
    cfg.update(feat)
    conflicts = []
    for name, (value, label) in found.items():
        if name in feat:
            src = "vision_backbone.crop_shape" if cfg["crop_height"] else \
                f"vision_backbone.input_shape ({settings.source('input_height')})"
            if value != feat[name]:
                conflicts.append(f"{name}: {label} says {value}, {src} gives {feat[name]} "
                                 f"(ResNet18 maps {eff_h}x{eff_w} to ceil(/32); set the input "
                                 f"size in the config or with --input-size)")
        elif (settings.explicit(name) or strict) and cfg[name] != value:
            conflicts.append(f"{name}: {label} says {value}, {settings.source(name)} says "
                             f"{cfg[name]}")
        if name == "num_cams" and not settings.explicit("camera_names") \
                and len(cfg["camera_names"]) != value:
            conflicts.append(f"num_cams: {label} has {value} trunks, the default camera names "
                             f"are {cfg['camera_names']}: set camera_names")
        cfg[name] = value
    if conflicts:
        text = "shapes disagree with the config:\n  " + "\n  ".join(conflicts)
        if not trust:
            raise ConvertError(text + "\n(fix the config, or pass --trust-shapes to use the "
                                      "shapes)")
        warnings.append("WARNING --trust-shapes: " + text)
    return cfg


def validate(cfg):
    names = cfg["camera_names"]
    problems = []
    if len(names) != cfg["num_cams"]:
        problems.append(f"{len(names)} camera names {names} for num_cams {cfg['num_cams']}")
    if not 1 <= cfg["num_cams"] <= MAX_CAMS:
        problems.append(f"num_cams {cfg['num_cams']}: the engine takes 1..{MAX_CAMS}")
    if len(set(names)) != len(names) or not all(
            re.fullmatch(r"[A-Za-z0-9_.\-]{1,%d}" % (NAME_LEN - 1), n) for n in names):
        problems.append(f"camera names {names} must be unique, 1..{NAME_LEN - 1} characters "
                        f"of [A-Za-z0-9_.-]")
    if cfg["hidden_dim"] % cfg["nheads"]:
        problems.append(f"hidden_dim {cfg['hidden_dim']} is not divisible by nheads "
                        f"{cfg['nheads']}")
    for k in ("enc_layers", "dec_layers"):
        if not 1 <= cfg[k] <= MAX_LAYERS:
            problems.append(f"{k} {cfg[k]}: the engine takes 1..{MAX_LAYERS}")
    if cfg["activation"] not in ("gelu", "relu"):
        problems.append(f"activation {cfg['activation']!r}: expected gelu or relu")
    if cfg["norm_type"] not in STAT_KINDS:
        problems.append(f"normalization {cfg['norm_type']!r}: expected min_max or mean_std")
    if cfg["obs_horizon"] < 1 or not \
            1 <= cfg["num_action_steps"] <= cfg["pred_horizon"] - cfg["obs_horizon"] + 1:
        problems.append(f"num_action_steps {cfg['num_action_steps']} with obs_horizon "
                        f"{cfg['obs_horizon']}: needs 1 <= steps <= pred_horizon "
                        f"({cfg['pred_horizon']}) - obs_horizon + 1")
    for k in ("image_height", "image_width", "input_height", "input_width"):
        if cfg[k] < 1:
            problems.append(f"{k} {cfg[k]} must be >= 1")
    if cfg["crop_height"] > cfg["input_height"] or cfg["crop_width"] > cfg["input_width"] or \
            (cfg["crop_height"] == 0) != (cfg["crop_width"] == 0):
        problems.append(f"crop {cfg['crop_height']}x{cfg['crop_width']} must be both 0 or fit in "
                        f"the input {cfg['input_height']}x{cfg['input_width']}")
    if problems:
        raise ConvertError("invalid model config:\n  " + "\n  ".join(problems))


# ----------------------------------------------------------------------------- tensors --

def trunk_convs():
    """(name, cout, cin, k) of every conv of a ResNet18 trunk, in file order."""
    convs = [("conv1", 64, 3, 7)]
    for layer, c, cin0 in STAGES:
        for i in (0, 1):
            cin = cin0 if i == 0 else c
            convs += [(f"layer{layer}.{i}.conv1", c, cin, 3), (f"layer{layer}.{i}.conv2", c, c, 3)]
            if i == 0 and layer > 1:
                convs.append((f"layer{layer}.{i}.down", c, cin0, 1))
    return convs


def _check(name, array, shape):
    if tuple(array.shape) != tuple(shape):
        raise ConvertError(f"tensor '{name}' has shape {list(array.shape)}, expected "
                           f"{list(shape)}")
    if not np.isfinite(array).all():
        raise ConvertError(f"tensor '{name}' holds NaN or Inf")
    return array


def conv_tensors(model, trunk, cfg, out, report):
    m, sd = model.m, model.sd
    for conv, cout, cin, k in trunk_convs():
        name = f"vision.{trunk}.{conv}"
        group = m.convs.get((trunk, conv))
        if group is None or "weight" not in group:
            raise ConvertError(f"missing tensor: the weight of {name} (ResNet18 {conv})")
        w = _check(group["weight"], sd[group["weight"]].numpy().astype(np.float64),
                   (cout, cin, k, k))
        b = np.zeros(cout) if "bias" not in group else \
            _check(group["bias"], sd[group["bias"]].numpy().astype(np.float64), (cout,))
        norm = {p: _check(key, sd[key].numpy().astype(np.float64), (cout,))
                for p, key in group["norm"].items()}
        want = ("weight", "bias", "running_mean", "running_var") \
            if cfg["vision_norm"] == "batchnorm" else ("weight", "bias")
        missing = [p for p in want if p not in norm]
        extra = [p for p in norm if p not in want]
        if missing or extra:
            raise ConvertError(f"{name}: the {cfg['vision_norm']} after it has "
                               f"{sorted(norm)}, expected {list(want)}")
        if cfg["vision_norm"] == "batchnorm":
            if (norm["running_var"] < 0).any():
                raise ConvertError(f"{group['norm']['running_var']} has negative variances")
            scale = norm["weight"] / np.sqrt(norm["running_var"] + BN_EPS)
            out[name + ".w"] = w * scale[:, None, None, None]
            out[name + ".b"] = norm["bias"] + (b - norm["running_mean"]) * scale
        else:
            out[name + ".w"], out[name + ".b"] = w, b
            out[name + ".gn.w"], out[name + ".gn.b"] = norm["weight"], norm["bias"]
        for key in [group["weight"], group.get("bias")] + list(group["norm"].values()):
            if key:
                report["mapped"][key] = name


def expected_head(cfg):
    E, F, L = cfg["hidden_dim"], cfg["dim_feedforward"], cfg["latent_dim"]
    O, A, H, D = cfg["obs_dim"], cfg["action_dim"], cfg["pred_horizon"], cfg["output_dim"]
    shapes = [("head.cls_embed", (E,)), ("head.enc_qpos.w", (E, O)), ("head.enc_qpos.b", (E,)),
              ("head.enc_action.w", (E, A)), ("head.enc_action.b", (E,))]

    def attn(p):
        return [(p + ".in.w", (3 * E, E)), (p + ".in.b", (3 * E,)), (p + ".out.w", (E, E)),
                (p + ".out.b", (E,))]

    def ffn(p):
        return [(p + ".ff1.w", (F, E)), (p + ".ff1.b", (F,)), (p + ".ff2.w", (E, F)),
                (p + ".ff2.b", (E,))]

    def lns(p, n):
        return [(f"{p}.ln{j}.{x}", (E,)) for j in range(1, n + 1) for x in "wb"]

    for i in range(cfg["enc_layers"]):
        p = f"head.enc.{i}"
        shapes += attn(p + ".attn") + lns(p, 2) + ffn(p)
    shapes += [("head.latent_proj.w", (2 * L, E)), ("head.latent_proj.b", (2 * L,)),
               ("head.latent_out.w", (E, L)), ("head.latent_out.b", (E,)),
               ("head.dec_qpos.w", (E, O)), ("head.dec_qpos.b", (E,)),
               ("head.visual_proj.w", (E, D)), ("head.visual_proj.b", (E,)),
               ("head.mem_type", (3, E)), ("head.query", (H, E))]
    for i in range(cfg["dec_layers"]):
        p = f"head.dec.{i}"
        shapes += attn(p + ".self_attn") + attn(p + ".cross_attn") + lns(p, 3) + ffn(p)
    return shapes + [("head.action_head.w", (A, E)), ("head.action_head.b", (A,))]


def build_tensors(model, cfg, stats, report):
    out = {}
    n_trunks = cfg["num_cams"] if cfg["separate_trunks"] else 1
    K, D = cfg["num_keypoints"], cfg["output_dim"]
    for t in range(n_trunks):
        conv_tensors(model, t, cfg, out, report)
        for name, shape in (("keypoints.w", (K, 512, 1, 1)), ("keypoints.b", (K,)),
                            ("pos_grid", (cfg["feature_height"] * cfg["feature_width"], 2)),
                            ("out.w", (D, 2 * K)), ("out.b", (D,))):
            src = model.m.tensors.get((t, name))
            if src is None:
                raise ConvertError(f"missing tensor: vision.{t}.{name} (rgb_encoder "
                                   f"{'pool/out' if 'pos' not in name else 'pool.pos_grid'})")
            out[f"vision.{t}.{name}"] = _check(src, model.sd[src].numpy(), shape)
            report["mapped"][src] = f"vision.{t}.{name}"
    missing = [n for n, _ in expected_head(cfg) if n not in model.m.head]
    if missing:
        raise ConvertError(f"missing tensors (policy_head): {_list(missing)}")
    for name, shape in expected_head(cfg):
        src = model.m.head[name]
        a = model.sd[src].numpy()
        if name == "head.cls_embed" and a.size == shape[0]:
            a = a.reshape(shape)
        out[name] = _check(src, a, shape)
        report["mapped"][src] = name
    extra = sorted(set(model.m.head) - {n for n, _ in expected_head(cfg)})
    if extra:
        raise ConvertError(f"tensors beyond the config's layers: {_list(extra)}")
    out.update(stats)
    return out


# ------------------------------------------------------------------------------ stats --

def _stats_dict(obj, where):
    """Flat {qpos_min: array, ...} from a flat or nested ({'qpos': {'min': ..}}) mapping."""
    if not isinstance(obj, dict):
        raise ConvertError(f"{where}: expected a dict of statistics, got {type(obj).__name__}")
    flat = {}
    for k, v in obj.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                flat[f"{k}_{k2}"] = v2
        else:
            flat[str(k)] = v
    out = {}
    for k, v in flat.items():
        k = k[len("normalization."):] if k.startswith("normalization.") else k
        if re.fullmatch(r"(qpos|action)_(min|max|mean|std)", k):
            v = v.numpy() if isinstance(v, LazyTensor) else v
            try:
                out[k] = np.asarray(v, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                raise ConvertError(f"{where}: '{k}' is not numeric") from None
    return out


def pick_stats(cfg, sources, report, warnings):
    """sources: [(label, {qpos_min: array, ...})] in priority order."""
    lo, hi = STAT_KINDS[cfg["norm_type"]]
    need = [f"{kind}_{s}" for kind in ("qpos", "action") for s in (lo, hi)]
    chosen = next(((label, st) for label, st in sources if all(k in st for k in need)), None)
    if chosen is None:
        have = {label: sorted(st) for label, st in sources}
        raise ConvertError(f"no {cfg['norm_type']} statistics: need {need}; found {have or 'none'}"
                           f" (state dict normalization.*, a dataset_stats entry, or --stats)")
    label, st = chosen
    for other, ost in sources:
        diff = [k for k in need if other != label and k in ost and
                (ost[k].shape != st[k].shape or not np.allclose(ost[k], st[k], rtol=1e-6))]
        if diff:
            warnings.append(f"WARNING statistics {diff} from {other} differ from {label}; "
                            f"using {label}")
    out = {}
    for kind, dim in (("qpos", cfg["obs_dim"]), ("action", cfg["action_dim"])):
        for s in (lo, hi):
            name = f"norm.{kind}.{s}"
            out[name] = _check(f"{label} {kind}_{s}", st[f"{kind}_{s}"], (dim,))
        if cfg["norm_type"] == "min_max" and (out[f"norm.{kind}.max"] < out[f"norm.{kind}.min"]).any():
            raise ConvertError(f"{label}: {kind}_max is below {kind}_min for some dimension")
    report["stats_source"] = label
    return out


# ------------------------------------------------------------------------------- main --

def metadata(cfg, sha):
    f = lambda x: format(float(x), ".9g")  # noqa: E731
    return {
        "format": "actw", "arch": "act_resnet", "converter_version": CONVERTER_VERSION,
        "source_sha256": sha,
        "obs_dim": cfg["obs_dim"], "action_dim": cfg["action_dim"],
        "pred_horizon": cfg["pred_horizon"], "obs_horizon": cfg["obs_horizon"],
        "num_action_steps": cfg["num_action_steps"],
        "camera_names": ",".join(cfg["camera_names"]),
        "image_height": cfg["image_height"], "image_width": cfg["image_width"],
        "vision.input_height": cfg["input_height"], "vision.input_width": cfg["input_width"],
        "vision.crop_height": cfg["crop_height"], "vision.crop_width": cfg["crop_width"],
        "vision.imagenet_norm": cfg["imagenet_norm"], "vision.norm": cfg["vision_norm"],
        "vision.separate_trunks": cfg["separate_trunks"],
        "vision.num_keypoints": cfg["num_keypoints"], "vision.output_dim": cfg["output_dim"],
        "vision.feature_height": cfg["feature_height"],
        "vision.feature_width": cfg["feature_width"],
        "head.hidden_dim": cfg["hidden_dim"], "head.nheads": cfg["nheads"],
        "head.enc_layers": cfg["enc_layers"], "head.dec_layers": cfg["dec_layers"],
        "head.dim_feedforward": cfg["dim_feedforward"], "head.latent_dim": cfg["latent_dim"],
        "head.activation": cfg["activation"], "head.kl_weight": f(cfg["kl_weight"]),
        "head.layer_norm_eps": f(LN_EPS), "norm.type": cfg["norm_type"], "norm.eps": f(NORM_EPS),
    }


def _hw(text, flag):
    m = re.fullmatch(r"(\d+)[xX](\d+)", text or "")
    if not m:
        raise ConvertError(f"{flag} {text!r}: expected HxW, e.g. 256x256")
    return int(m.group(1)), int(m.group(2))


def flag_settings(args):
    s = {}
    if args.image_size:
        s["image_height"], s["image_width"] = _hw(args.image_size, "--image-size")
    if args.input_size:
        s["input_height"], s["input_width"] = _hw(args.input_size, "--input-size")
    if args.crop:
        s["crop_height"], s["crop_width"] = (0, 0) if args.crop == "none" else \
            _hw(args.crop, "--crop")
    if args.imagenet_norm:
        s["imagenet_norm"] = 1
    if args.normalization:
        s["norm_type"] = args.normalization
    if args.camera_names:
        s["camera_names"] = [c.strip() for c in args.camera_names.split(",")]
    for key in ("nheads", "activation", "kl_weight", "num_action_steps"):
        if getattr(args, key) is not None:
            s[key] = getattr(args, key)
    return s


def convert(args):
    """Run one conversion; returns the report dict. Raises on any problem."""
    report = {"source": args.checkpoint, "output": args.output, "renamed": {}, "ignored": [],
              "consumed": {}, "mapped": {}, "warnings": []}
    with open(args.checkpoint, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    top = load_torch_zip(args.checkpoint)
    sd, where = find_state_dict(top, args.checkpoint)
    report["state_dict"] = where
    settings = Settings()
    if isinstance(top.get("config") if isinstance(top, dict) else None, dict):
        agent, root = split_agent(top["config"])
        settings.add("checkpoint config entry",
                     settings_from_agent(agent, root, f"{args.checkpoint} config entry"))
    if args.config:
        agent, root = load_config_file(args.config)
        settings.add(args.config, settings_from_agent(agent, root, args.config))
    settings.add("command-line flags", flag_settings(args))
    ignore = []
    for p in args.ignore:
        try:
            ignore.append(re.compile(p))
        except re.error as e:
            raise ConvertError(f"--ignore {p!r}: bad regex ({e})") from None
    key_map = load_key_map(args.key_map) if args.key_map else None
    sd = drop_alias(rename_keys(sd, key_map, ignore, report), report)
    mapped = map_state_dict(sd)
    if mapped.unknown:
        raise ConvertError(f"{len(mapped.unknown)} state-dict keys are not part of the ACT "
                           f"model: {_list(mapped.unknown)} (map them with --key-map or skip "
                           f"them with --ignore REGEX)")
    for key in mapped.counters:
        report["consumed"][key] = "BatchNorm step counter"
    for key in mapped.derived:
        report["consumed"][key] = "sinusoidal table, rebuilt by the engine"
    model = Model(sd, mapped)
    found = infer(model)
    cfg = resolve(settings, found, args.trust_shapes, args.strict_shapes, report["warnings"])
    validate(cfg)
    sources = []
    if args.stats:
        sources.append((args.stats, _stats_dict(load_pickle(args.stats), args.stats)))
    sources.append(("state dict normalization.*",
                    {k: sd[v].numpy().astype(np.float64).reshape(-1)
                     for k, v in mapped.stats.items()}))
    if isinstance(top.get("dataset_stats"), dict):
        sources.append(("checkpoint dataset_stats entry",
                        _stats_dict(top["dataset_stats"], "dataset_stats entry")))
    sources = [(label, st) for label, st in sources if st]
    stats = pick_stats(cfg, sources, report, report["warnings"])
    for k, key in mapped.stats.items():
        name = "norm." + k.replace("_", ".")
        if name in stats and report["stats_source"] == "state dict normalization.*":
            report["mapped"][key] = name
        else:
            report["consumed"][key] = f"statistic not used ({cfg['norm_type']} from " \
                                      f"{report['stats_source']})"
    tensors = build_tensors(model, cfg, stats, report)
    header = actw.write_actw(args.output, metadata(cfg, sha), tensors, compress=args.compress)
    report.update(model_hash=f"{header['checksum']:016x}", file_size=header["file_size"],
                  n_tensors=len(tensors), n_params=int(sum(a.size for a in tensors.values())),
                  source_sha256=sha, config=cfg,
                  config_sources={k: ("shapes: " + found[k][1]) if k in found
                                  else settings.source(k) for k in DEFAULTS})
    return report


def summary(r):
    c = r["config"]
    trunk = f"{c['num_cams']} separate trunks" if c["separate_trunks"] else "shared trunk"
    norm = "BatchNorm folded" if c["vision_norm"] == "batchnorm" else "GroupNorm"
    return "\n".join([
        f"converted {r['source']} -> {r['output']}",
        f"  params      {r['n_params']:,} in {r['n_tensors']} tensors",
        f"  cameras     {','.join(c['camera_names'])} ({c['image_height']}x{c['image_width']} "
        f"uint8 -> {c['input_height']}x{c['input_width']}; {trunk}, {norm})",
        f"  head        E={c['hidden_dim']} heads={c['nheads']} enc={c['enc_layers']} "
        f"dec={c['dec_layers']} ff={c['dim_feedforward']} latent={c['latent_dim']} "
        f"horizon={c['pred_horizon']}",
        f"  norm        {c['norm_type']} (eps {NORM_EPS:g}) from {r['stats_source']}",
        f"  file        {r['file_size']:,} bytes",
        f"  model hash  {r['model_hash']}",
    ])


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Convert a roboimi ACT training checkpoint (torch.save zip) into an .actw "
                    "weight file without importing torch or executing pickle code.")
    ap.add_argument("checkpoint", help="vla_model_best.pt or similar")
    ap.add_argument("-o", "--output", required=True, help="the .actw file to write")
    ap.add_argument("--config", help="agent config (Hydra agent section, YAML or JSON)")
    ap.add_argument("--stats", help="dataset_stats.pkl (wins over stats in the checkpoint)")
    ap.add_argument("--key-map", help="JSON {source key or 're:REGEX': new key or null}")
    ap.add_argument("--ignore", action="append", default=[], metavar="REGEX",
                    help="skip state-dict keys matching REGEX (listed in the report)")
    ap.add_argument("--image-size", help="uint8 frame size served, HxW (default 256x256)")
    ap.add_argument("--input-size", help="bilinear resize target, HxW (default 224x224)")
    ap.add_argument("--crop", help="center crop after resize, HxW or 'none'")
    ap.add_argument("--imagenet-norm", action="store_true", help="ImageNet mean/std after crop")
    ap.add_argument("--normalization", choices=tuple(STAT_KINDS))
    ap.add_argument("--camera-names", help="comma-separated, in token order")
    ap.add_argument("--nheads", type=int)
    ap.add_argument("--activation", choices=("gelu", "relu"))
    ap.add_argument("--kl-weight", type=float)
    ap.add_argument("--num-action-steps", type=int)
    ap.add_argument("--compress", choices=("zstd",), help="zstd-compress the data section")
    ap.add_argument("--trust-shapes", action="store_true",
                    help="when shapes and config disagree, warn and use the shapes")
    ap.add_argument("--strict-shapes", action="store_true",
                    help="also require the shapes to match act_resnet.yaml wherever the config "
                         "is silent")
    ap.add_argument("--report", help="write a JSON report (mapped/ignored keys, config)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        report = convert(args)
    except (ValueError, OSError) as e:   # every converter error is a ValueError subclass
        print(f"convert_checkpoint: error: {e}", file=sys.stderr)
        return 1
    for w in report["warnings"]:
        print(w, file=sys.stderr)
    print(summary(report))
    if args.report:
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
