"""convert_model.py - what a mapped checkpoint's shapes say, and its canonical tensors.

defines: ConvertError, short_list, check_tensor, Model, infer, resolve, validate, build_tensors

infer() reads every size the tensors fix (dims, layers, horizon, keypoints, GN vs BN, trunks,
feature map from pos_grid); resolve() merges that with the layered settings and refuses any
disagreement with what a config stated (--trust-shapes: warn and use the shapes); validate()
checks what the engine needs. build_tensors() emits the FORMAT.md tensors in file order, folding
BatchNorm into each conv in float64: w' = w*g/sqrt(v+eps), b' = beta + (bias - m)*g/sqrt(v+eps).
"""

import math
import re

import numpy as np

from convert_config import DEFAULTS

BN_EPS = 1e-5
MAX_CAMS, MAX_LAYERS, NAME_LEN = 8, 16, 32    # act.h limits
STAT_KINDS = {"min_max": ("min", "max"), "mean_std": ("mean", "std")}
# ResNet18 stages: (layer, channels, input channels of block 0)
STAGES = ((1, 64, 64), (2, 128, 64), (3, 256, 128), (4, 512, 256))


class ConvertError(ValueError):
    """The checkpoint cannot be converted as asked; the message says why and where."""


def short_list(items, limit=12):
    items = list(items)
    more = f" ... and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


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


# Settings that change the computed actions but no tensor shape can confirm, in the order the
# defaults warning lists them.
BLIND = ("camera_names", "image_height", "image_width", "input_height", "input_width",
         "crop_height", "crop_width", "imagenet_norm", "nheads", "activation", "norm_type")
# Settings that change which of the chunk's actions a rollout executes (the seed's select_action
# runs chunk[obs_horizon-1 : obs_horizon-1+num_action_steps]), named with the defaults too.
EXECUTION = ("obs_horizon", "num_action_steps")


def _blind_defaults(settings, found, warnings):
    """camera_names left to the defaults although a config named it (as `${data.camera_names}`,
    which only the run's full Hydra config resolves) is an error: a wrong order silently feeds
    each camera's token to the wrong memory slot. Other settings: one warning, naming each."""
    names = settings.unresolved("camera_names")
    if names and not settings.explicit("camera_names"):
        layer, where, text = names[0]
        example = DEFAULTS["camera_names"]
        if text.startswith("null"):   # the agent sorts: token order is the sorted one
            example = sorted(example)
        raise ConvertError(f"{layer}: {where} is {text}, which that file cannot resolve, and the "
                           f"weights cannot tell the camera order: pass the run's full Hydra "
                           f"config (.hydra/config.yaml, which holds data.camera_names) as "
                           f"--config, or --camera-names in token order (e.g. "
                           f"--camera-names {','.join(example)})")
    for name in BLIND:
        for layer, where, text in settings.unresolved(name):
            if not settings.explicit(name):
                warnings.append(f"WARNING {layer}: {where} is {text}, which that file cannot "
                                f"resolve; using the default {name} = {settings.get(name)!r}")
    left = [n for n in BLIND + EXECUTION if not settings.explicit(n) and n not in found]
    frame = [n for n in left if n in ("image_height", "image_width")]
    left = [n for n in left if n not in frame]
    if frame:
        # no roboimi config key holds the cameras' frame size (the episodes' attrs do); act-infer
        # eval and act-serve refuse frames of another size, so this is a note, not a warning
        warnings.append(f"note: the model takes {settings.get('image_height')}x"
                        f"{settings.get('image_width')} uint8 frames (the socket-peg cameras'; no "
                        f"roboimi config holds it, vision_backbone.image_shape would): pass "
                        f"--image-size HxW if your cameras give another size")
    if left:
        warnings.append("WARNING no config set " + ", ".join(
            f"{n}={settings.get(n)!r}" for n in left) + ": these are act_resnet.yaml's defaults "
            "and the weights cannot confirm them; if the run used others, pass --config (the "
            "run's .hydra/config.yaml) or the flags")


def check_token_layout(model, found, settings):
    """visual_proj taking num_cams x the trunk's output features is the agent's one-token-for-
    all-cameras branch (vision_backbone.output_tokens_per_camera: false: vision_dim = output_dim
    * num_cams), whatever the config says: name it, rather than call output_dim a conflict."""
    out = model.vision(0, "out.w")
    if out is None or "output_dim" not in found or len(out.shape) != 2:
        return
    rows, wide = out.shape[0], found["output_dim"][0]
    cams = found["num_cams"][0] if "num_cams" in found else len(settings.get("camera_names"))
    if cams > 1 and wide == rows * cams:
        raise ConvertError(f"head.visual_proj takes {wide} features, {cams} cameras x the trunk's "
                           f"{rows} (rgb_encoder out): the model was trained with vision_backbone."
                           f"output_tokens_per_camera false (one token for all cameras); the engine "
                           f"takes one token per camera, as act_resnet.yaml sets")


def resolve(settings, found, trust, strict, warnings):
    """Final config: settings, overridden by what the shapes say; conflicts are errors."""
    cams = found["num_cams"][0] if "num_cams" in found else settings.get("num_cams")
    if not settings.get("tokens_per_camera") and cams > 1:
        raise ConvertError(f"{settings.source('tokens_per_camera')}: vision_backbone."
                           f"output_tokens_per_camera is false (one token for all {cams} "
                           f"cameras): the engine takes one token per camera, as act_resnet.yaml "
                           f"sets")
    _blind_defaults(settings, found, warnings)
    cfg = {k: settings.get(k) for k in DEFAULTS}
    if not settings.explicit("num_cams") and settings.explicit("camera_names"):
        cfg["num_cams"] = len(cfg["camera_names"])
    eff_h = cfg["crop_height"] or cfg["input_height"]
    eff_w = cfg["crop_width"] or cfg["input_width"]
    feat = {"feature_height": math.ceil(eff_h / 32), "feature_width": math.ceil(eff_w / 32)}
    cfg.update(feat)
    conflicts, map_conflicts = [], []
    for name, (value, label) in found.items():
        if name in feat:
            src = f"vision_backbone.crop_shape ({settings.source('crop_height')})" \
                if cfg["crop_height"] else \
                f"vision_backbone.input_shape ({settings.source('input_height')})"
            if value != feat[name]:
                map_conflicts.append(f"{name}: {label} says {value}, {src} gives {feat[name]}")
        elif (settings.explicit(name) or strict) and cfg[name] != value:
            conflicts.append(f"{name}: {label} says {value}, {settings.source(name)} says "
                             f"{cfg[name]}")
        if name == "num_cams" and not settings.explicit("camera_names") \
                and len(cfg["camera_names"]) != value:
            conflicts.append(f"num_cams: {label} has {value} trunks, the default camera names "
                             f"are {cfg['camera_names']}: set camera_names")
        cfg[name] = value
    if map_conflicts:
        # no shape to trust here: the grid says only the image's size after resize and crop,
        # and a resize where training cropped (or the reverse) runs but gives wrong actions
        grid = [found.get(n, (feat[n],))[0] for n in ("feature_height", "feature_width")]
        lo, hi = [32 * (v - 1) + 1 for v in grid], [32 * v for v in grid]
        raise ConvertError(
            "the weights' feature map disagrees with the image size the config gives:\n  "
            + "\n  ".join(map_conflicts)
            + f"\nResNet18 maps the image after resize and crop (here {eff_h}x{eff_w}"
            + (f", the crop of a {cfg['input_height']}x{cfg['input_width']} resize" if cfg["crop_height"] else
               ", no crop")
            + f") to ceil(size/32); the weights were trained on images of {lo[0]}..{hi[0]} x "
            f"{lo[1]}..{hi[1]} pixels. Say how training got there: if it center-cropped, set "
            f"vision_backbone.crop_shape (or --crop HxW) and keep the resize size; if it resized "
            f"to that size, set data.image_resize_shape (or --input-size HxW). Both load, but "
            f"one of them gives wrong actions: pass the run's full Hydra config "
            f"(.hydra/config.yaml) to be sure. (--trust-shapes cannot decide this.)")
    if conflicts:
        text = "shapes disagree with the config:\n  " + "\n  ".join(conflicts)
        if not trust:
            raise ConvertError(text + "\n(fix the config, or pass --trust-shapes to use the "
                                      "shapes)")
        warnings.append("WARNING --trust-shapes: " + text)
    _executed_steps(cfg, settings, warnings)
    return cfg


def _executed_steps(cfg, settings, warnings):
    """The seed's select_action executes chunk[obs_horizon-1 : obs_horizon-1+num_action_steps]:
    a slice past the chunk's end is cut short, so a larger num_action_steps runs the chunk's
    remaining pred_horizon - obs_horizon + 1 actions. The file holds what is executed."""
    most = cfg["pred_horizon"] - cfg["obs_horizon"] + 1
    if cfg["obs_horizon"] >= 1 and most >= 1 and cfg["num_action_steps"] > most:
        warnings.append(f"WARNING num_action_steps {cfg['num_action_steps']} "
                        f"({settings.source('num_action_steps')}) runs past the chunk: with "
                        f"pred_horizon {cfg['pred_horizon']} and obs_horizon {cfg['obs_horizon']} the "
                        f"agent executes chunk[{cfg['obs_horizon'] - 1}:{cfg['pred_horizon']}], {most} "
                        f"actions a chunk; the model serves num_action_steps = {most}")
        cfg["num_action_steps"] = most


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
    if not 1 <= cfg["obs_horizon"] <= cfg["pred_horizon"]:
        problems.append(f"obs_horizon {cfg['obs_horizon']}: needs 1 <= obs_horizon <= pred_horizon "
                        f"({cfg['pred_horizon']}): the agent executes chunk[obs_horizon - 1:]")
    elif not 1 <= cfg["num_action_steps"] <= cfg["pred_horizon"] - cfg["obs_horizon"] + 1:
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


def check_tensor(name, array, shape):
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
        w = check_tensor(group["weight"], sd[group["weight"]].numpy().astype(np.float64),
                   (cout, cin, k, k))
        b = np.zeros(cout) if "bias" not in group else \
            check_tensor(group["bias"], sd[group["bias"]].numpy().astype(np.float64), (cout,))
        norm = {p: check_tensor(key, sd[key].numpy().astype(np.float64), (cout,))
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
            out[f"vision.{t}.{name}"] = check_tensor(src, model.sd[src].numpy(), shape)
            report["mapped"][src] = f"vision.{t}.{name}"
    used = {(t, conv) for t in range(n_trunks) for conv, *_ in trunk_convs()}
    extra = sorted(k for k in model.m.convs if k not in used) + \
        sorted(k for k in model.m.tensors if k[0] >= n_trunks)
    if extra:
        raise ConvertError(f"{len(extra)} vision layers are not part of {n_trunks} ResNet18 "
                           f"trunk(s): " + short_list(f"vision.{t}.{c}" for t, c in extra) +
                           " (a deeper backbone such as resnet34? the engine runs resnet18 only)")
    missing = [n for n, _ in expected_head(cfg) if n not in model.m.head]
    if missing:
        raise ConvertError(f"missing tensors (policy_head): {short_list(missing)}")
    for name, shape in expected_head(cfg):
        src = model.m.head[name]
        a = model.sd[src].numpy()
        if name == "head.cls_embed" and a.size == shape[0]:
            a = a.reshape(shape)
        out[name] = check_tensor(src, a, shape)
        report["mapped"][src] = name
    extra = sorted(set(model.m.head) - {n for n, _ in expected_head(cfg)})
    if extra:
        raise ConvertError(f"tensors beyond the config's layers: {short_list(extra)}")
    out.update(stats)
    return out
