#!/usr/bin/env python3
"""convert_checkpoint.py - a roboimi ACT training checkpoint -> one .actw weight file, no torch.

  python3 tools/convert_checkpoint.py CKPT.pt -o MODEL.actw [--config AGENT.yaml] [--stats S.pkl]

Steps: read the torch.save archive with a restricted unpickler (torch_zip.py: nothing in the file
executes); find the state dict; strip `module.`/`_orig_mod.`; apply --key-map; check the
`noise_pred_net` alias; sort every key into a place (convert_keys.py) or refuse; infer every
size the shapes tell and cross-check it against the config (convert_model.py,
convert_config.py); fold BatchNorm into the convs in float64; pick the normalization
statistics (--stats, else the state dict's normalization.* buffers, else a dataset_stats entry;
buffers and entry that differ, a --stats file that differs from buffers which were set, or values
still at NormalizationModule's initial 0/1, are refused unless --stats-from /
--allow-initial-stats says otherwise); write weights/FORMAT.md (actw.py).
Anything that does not fit is an error naming the key, tensor or setting - never a guess.
"""

import argparse
import hashlib
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import actw  # noqa: E402
from convert_config import (DEFAULTS, FLAGS_LAYER, Settings, apply_dataset_resize,  # noqa: E402,E501
                            load_config_file, settings_from_agent, split_agent)
from convert_keys import map_state_dict  # noqa: E402
from convert_model import (BLIND, STAT_KINDS, ConvertError, Model, build_tensors, check_tensor,  # noqa: E402,E501
                           check_token_layout, infer, resolve, short_list, validate)
from torch_zip import LazyTensor, load_pickle, load_torch_zip  # noqa: E402

CONVERTER_VERSION = "0.1.0"
NORM_EPS = 1e-8
LN_EPS = 1e-5
SD_ENTRIES = ("model_state_dict", "state_dict", "model", "agent")
# the checkpoint entries read: an entry that needs code to load is left out only if it is none of these
READ_ENTRIES = SD_ENTRIES + ("config", "dataset_stats")
PREFIXES = ("module.", "_orig_mod.")


# ------------------------------------------------------------------ state dict and its keys --

def _tensor_dict(v):
    return isinstance(v, dict) and v and all(isinstance(x, LazyTensor) for x in v.values())


def _mostly_tensors(v):
    """A top-level dict that is a state dict with a few extras saved beside the tensors (a step
    count, an epoch): its tensors are at least 9 in 10 of its entries and its other values plain
    scalars or strings."""
    if not isinstance(v, dict) or not v:
        return False
    other = [x for x in v.values() if not isinstance(x, LazyTensor)]
    return len(other) * 10 <= len(v) and all(isinstance(x, (int, float, str, bool, type(None)))
                                             for x in other)


def find_state_dict(top, path, key=None, warnings=None):
    """Returns (state dict, where it was found). key: a dotted path to the entry to use
    (--state-dict-key); otherwise the first of SD_ENTRIES, and a warning names any other
    top-level dict of tensors (an EMA copy, say) that was passed over."""
    if not isinstance(top, dict):
        raise ConvertError(f"{path}: top object is {type(top).__name__}, expected a dict")
    if key:
        node = top
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ConvertError(f"{path}: --state-dict-key {key}: no entry '{part}'; top-level "
                                   f"keys are {short_list(map(str, top))}")
            node = node[part]
        if not _mostly_tensors(node):
            raise ConvertError(f"{path}: --state-dict-key {key} is not a dict of tensors")
        return _tensors_of(node, f"{path} entry '{key}'", warnings), f"entry '{key}'"
    # an SD_ENTRIES name holding something else (a Hydra 'agent' config dict) is passed over
    found = next(((k, top[k]) for k in SD_ENTRIES if _mostly_tensors(top.get(k))), None)
    if found is None and _mostly_tensors(top):
        return _tensors_of(top, f"{path}: a bare state dict", warnings), "top level"
    if found is None:
        weights = [str(k) for k, v in top.items() if _tensor_dict(v)]
        hint = f"; entries holding tensors: {short_list(weights)}" if weights else ""
        raise ConvertError(f"{path}: no state dict: expected an entry {', '.join(SD_ENTRIES)} "
                           f"holding tensors, or a bare state dict; name the entry with "
                           f"--state-dict-key KEY{hint}; top-level keys are "
                           f"{short_list(map(str, top))}")
    others = [k for k, v in top.items() if k != found[0] and _tensor_dict(v)]
    for k in others:
        if warnings is not None:
            warnings.append(f"WARNING {path}: converting entry '{found[0]}'; the entry '{k}' "
                            f"({len(top[k])} tensors, an EMA copy?) is not used: pass "
                            f"--state-dict-key {k} to convert it instead")
    return _tensors_of(found[1], f"{path} entry '{found[0]}'", warnings), f"entry '{found[0]}'"


def _tensors_of(sd, where, warnings):
    """The tensors of a state dict saved with a few scalar extras (a step count), which are named
    in a warning and left out."""
    extras = [k for k, v in sd.items() if not isinstance(v, LazyTensor)]
    if extras and warnings is not None:
        warnings.append(f"WARNING {where}: {len(extras)} entries that are not tensors, left out: "
                        f"{short_list(map(str, extras))}")
    return {k: v for k, v in sd.items() if isinstance(v, LazyTensor)} if extras else sd


def strip_prefixes(key):
    """`module.` (DataParallel, DDP) and `_orig_mod.` (torch.compile) wherever they stand as
    whole path components: a wrapped submodule (agent.vision_encoder = torch.compile(...))
    puts them inside the key, e.g. vision_encoder._orig_mod.rgb_encoder... No part of the ACT
    model is named either way."""
    parts = key.split(".")
    kept = [p for p in parts[:-1] if p + "." not in PREFIXES] + parts[-1:]
    return ".".join(kept)


def load_key_map(path):
    """MAP.json: {"exact.source.key": "new.key" | null, "re:<regex>": "<template>" | null}."""
    try:
        f = open(path, "r", encoding="utf-8")
    except OSError as e:
        raise ConvertError(f"--key-map {path}: cannot open: {e.strerror} (it takes the path of a JSON "
                           f"file, not the JSON itself)") from None
    with f:
        try:
            raw = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConvertError(f"--key-map {path}: not valid JSON ({e})") from None
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
        # NaN where the head has NaN is the same copy (a diverged run): the head's own check
        # then names it, rather than this one calling the alias different
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
            raise ConvertError(f"'{key}' differs from '{twin}': the noise_pred_net alias must "
                               f"equal the policy head")
        report["consumed"][key] = f"alias of {twin}"
    return out


# ------------------------------------------------------------------------------ stats --

class _Stats(dict):
    """{qpos_min: array, ...}; .ignored: the source's keys that are not such statistics (named
    when the statistics needed are missing: 'observation.state_min' is LeRobot's spelling);
    .precision: "f2" or "bf16" when the source held its values in 16 bits (an fp16 checkpoint's
    buffers), else None."""
    ignored = ()
    precision = None


def _precision_of(values):
    """"f2"/"bf16" if any of values that is a tensor or numpy value holds 16-bit floats, else
    None (lists and Python floats are float64)."""
    kinds = {v.dtype if isinstance(v, LazyTensor) else v.dtype if isinstance(v, (np.ndarray, np.generic)) else None
             for v in values}
    if "bf16" in kinds:
        return "bf16"
    return "f2" if {"f2", np.dtype(np.float16)} & kinds else None


def _rounded(a, precision):
    """a (float64) as the nearest value of `precision` (None: unchanged)."""
    if precision == "f2":
        return a.astype(np.float16).astype(np.float64)
    if precision == "bf16":   # round to nearest even on the top 16 bits of the float32
        x = a.astype(np.float32).view(np.uint32).astype(np.uint64)
        x = ((x + 0x7FFF + ((x >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        return x.view(np.float32).astype(np.float64)
    return a


def _same_stats(a, b, pa, pb):
    """Do two statistics agree at the coarser of their precisions? An fp16 checkpoint's buffers
    hold the run's dataset_stats.pkl rounded to fp16, and are the same statistics."""
    if a.shape != b.shape:
        return False
    p = "bf16" if "bf16" in (pa, pb) else ("f2" if "f2" in (pa, pb) else None)
    return np.allclose(_rounded(a, p), _rounded(b, p), rtol=1e-6)


def _found(st):
    """What a statistics source holds, for an error: its keys, and the keys it ignored."""
    text = str(sorted(st) or "none")
    ign = getattr(st, "ignored", ())
    if ign:
        text += (f" (not read: {short_list(sorted(ign))}; the converter reads qpos_/action_ + "
                 f"min/max/mean/std, flat or nested as {{'qpos': {{'min': ...}}}})")
    return text


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
    out, ignored, read = _Stats(), [], []
    for k, v in flat.items():
        k = k[len("normalization."):] if k.startswith("normalization.") else k
        if not re.fullmatch(r"(qpos|action)_(min|max|mean|std)", k):
            ignored.append(k)
        else:
            read.append(v)
            v = v.numpy() if isinstance(v, LazyTensor) else v
            try:
                out[k] = np.asarray(v, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                raise ConvertError(f"{where}: '{k}' is not numeric") from None
    out.ignored = tuple(ignored)
    out.precision = _precision_of(read)
    return out


SD_STATS = "state dict normalization.*"
ENTRY_STATS = "checkpoint dataset_stats entry"
STATS_FROM = {"state_dict": SD_STATS, "dataset_stats": ENTRY_STATS, "file": None}   # file: --stats
INITIAL = {"min": 0.0, "mean": 0.0, "max": 1.0, "std": 1.0}   # NormalizationModule's buffers


def at_initial(st, keys):
    """Do the statistics st[k] for keys (e.g. qpos_min) all hold NormalizationModule's initial
    values, i.e. were they never set?"""
    return all((st[k] == INITIAL[k.rsplit("_", 1)[1]]).all() for k in keys if k in st)


def pick_stats(cfg, sources, report, warnings, chosen_label=None, allow_initial=False,
               forced=False):
    """sources: [(label, {qpos_min: array, ...})] in priority order: --stats, then the state
    dict's normalization.* buffers (what the seed's agent normalizes with once load_state_dict
    has run), then a dataset_stats entry. chosen_label: the source the user named (--stats or
    --stats-from); other sources that differ from it are a warning, except set buffers that
    differ from a --stats file: a PyTorch rollout of the checkpoint loads the buffers over the
    file's values, so the file is refused unless forced (--stats-from file). Without a chosen
    source, sources that differ are an error: which of them training used is not in the file."""
    lo, hi = STAT_KINDS[cfg["norm_type"]]
    need = [f"{kind}_{s}" for kind in ("qpos", "action") for s in (lo, hi)]
    if chosen_label is not None:
        st = next((st for label, st in sources if label == chosen_label), {})
        if not all(k in st for k in need):
            raise ConvertError(f"{chosen_label}: no {cfg['norm_type']} statistics there: need "
                               f"{need}; found {_found(st)}")
        chosen = (chosen_label, st)
    else:
        chosen = next(((label, st) for label, st in sources if all(k in st for k in need)), None)
    if chosen is None:
        have = "; ".join(f"{label}: {_found(st)}" for label, st in sources)
        raise ConvertError(f"no {cfg['norm_type']} statistics: need {need}; found {have or 'none'}"
                           f" (state dict normalization.*, a dataset_stats entry, or --stats)")
    label, st = chosen
    for other, ost in sources:
        diff = [k for k in need if other != label and k in ost and
                not _same_stats(ost[k], st[k], getattr(ost, "precision", None), getattr(st, "precision", None))]
        if diff and chosen_label is None:
            raise ConvertError(
                f"normalization statistics {diff} from the {label} differ from the {other}, and "
                f"nothing says which one training used: pass --stats dataset_stats.pkl (the "
                f"run's statistics), or --stats-from state_dict / --stats-from dataset_stats to "
                f"use one of the checkpoint's")
        unset_buffers = other == SD_STATS and at_initial(ost, need)
        if diff and other == SD_STATS and label not in (SD_STATS, ENTRY_STATS) and not forced \
                and not unset_buffers:
            raise ConvertError(
                f"normalization statistics {diff} in {label} differ from the checkpoint's state "
                f"dict normalization.* buffers, which the agent normalizes with once "
                f"load_state_dict has run (a PyTorch rollout of this checkpoint uses the buffers): "
                f"is {label} from this run? Drop --stats to use the buffers, or add --stats-from "
                f"file to use {label} anyway")
        if diff:
            warnings.append(f"WARNING statistics {diff} from {other} differ from {label}; "
                            f"using {label}" + (" (the buffers are NormalizationModule's initial "
                                                "values: never set)" if unset_buffers else ""))
    out = {}
    for kind, dim in (("qpos", cfg["obs_dim"]), ("action", cfg["action_dim"])):
        for s in (lo, hi):
            name = f"norm.{kind}.{s}"
            out[name] = check_tensor(f"{label} {kind}_{s}", st[f"{kind}_{s}"], (dim,))
        if cfg["norm_type"] == "min_max" and (out[f"norm.{kind}.max"] < out[f"norm.{kind}.min"]).any():
            raise ConvertError(f"{label}: {kind}_max is below {kind}_min for some dimension")
        if not allow_initial and at_initial(st, (f"{kind}_{lo}", f"{kind}_{hi}")):
            raise ConvertError(
                f"{label}: the {kind} normalization statistics are NormalizationModule's initial "
                f"values ({kind}_{lo} all {INITIAL[lo]:g}, {kind}_{hi} all {INITIAL[hi]:g}): never "
                f"set? pass --stats dataset_stats.pkl (the statistics the run trained with), or "
                f"--allow-initial-stats if these really are the data's statistics")
    report["stats_source"] = label
    return out


# ------------------------------------------------------------------------------- main --

def metadata(cfg, sha, norm_eps=NORM_EPS):
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
        "head.layer_norm_eps": f(LN_EPS), "norm.type": cfg["norm_type"], "norm.eps": f(norm_eps),
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
    for key in ("nheads", "activation", "kl_weight", "num_action_steps", "obs_horizon"):
        if getattr(args, key) is not None:
            s[key] = getattr(args, key)
    return s


def _config_disagreements(settings, given, path, warnings):
    """--config wins over the checkpoint's own config entry; where the two disagree on a
    setting the weights cannot check (camera order, heads, activation, preprocessing,
    normalization, steps executed), say so: the entry was saved by the run itself, so a
    disagreement usually means the wrong --config file."""
    entry = dict(settings.layers).get("checkpoint config entry", {})
    for name in BLIND + ("num_action_steps", "obs_horizon", "kl_weight"):
        if name in entry and name in given and entry[name] != given[name]:
            warnings.append(f"WARNING {path} sets {name} = {given[name]!r}, but the checkpoint's "
                            f"own config entry says {entry[name]!r}: using {path}'s. The entry "
                            f"was saved by the training run; if it is right, leave --config out "
                            f"(or fix the file)")


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:   # one of them does not exist (yet): the same path is the same file
        return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(args):
    """Before any work: -o and --report may not name an input (a checkpoint overwritten by its
    own conversion is lost) or each other, their folders must take a file, and --compress zstd
    needs its module."""
    inputs = [(args.checkpoint, "the checkpoint"), (args.stats, "--stats"), (args.config, "--config"),
              (args.key_map, "--key-map")]
    outputs = [(args.output, "-o")] + ([(args.report, "--report")] if args.report else [])
    for out, flag in outputs:
        for path, what in inputs:
            if path and _same_file(out, path):
                raise ConvertError(f"{flag} {out} is {what}: writing there would destroy it; name "
                                   f"another file")
        if os.path.isdir(out):
            raise ConvertError(f"{flag} {out} is a directory: name a file in it")
        folder = os.path.dirname(os.path.abspath(os.path.realpath(out)))
        if not os.access(folder, os.W_OK | os.X_OK) and not (os.path.exists(out) and os.access(out, os.W_OK)):
            raise ConvertError(f"{flag} {out}: cannot write into {folder}")
    if args.report and _same_file(args.report, args.output):
        raise ConvertError(f"--report {args.report} is the -o file: name another file for the report")
    if args.compress == "zstd":
        try:
            import zstandard  # noqa: F401
        except ImportError:
            raise ConvertError("--compress zstd needs the 'zstandard' module (apt-get install "
                               "python3-zstandard, or pip install zstandard)") from None


def convert(args):
    """Run one conversion; returns the report dict. Raises on any problem."""
    check_outputs(args)
    report = {"source": args.checkpoint, "output": args.output, "renamed": {}, "ignored": [],
              "consumed": {}, "mapped": {}, "warnings": []}
    with open(args.checkpoint, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    skipped = []
    root = args.state_dict_key.split(".")[0] if args.state_dict_key else None
    top = load_torch_zip(args.checkpoint, skipped, lambda k: k == root or k in READ_ENTRIES or "state_dict" in str(k))
    for entry, name in skipped:
        report["warnings"].append(f"WARNING {args.checkpoint}: entry {entry!r} ({name}) is not read by the "
                                  f"converter and would need code run to load: left out")
    try:
        sd, where = find_state_dict(top, args.checkpoint, args.state_dict_key, report["warnings"])
    except ConvertError as e:
        if not skipped:
            raise
        raise ConvertError(f"{e} (left out, needing code run to load: " + ", ".join(
            f"{k!r} ({name})" for k, name in skipped) + "; if the weights are in one of them, name it with "
            "--state-dict-key to see why it cannot be read)") from None
    report["state_dict"] = where
    settings = Settings()
    if isinstance(top.get("config") if isinstance(top, dict) else None, dict):
        agent, root = split_agent(top["config"])
        unresolved = {}
        settings.add("checkpoint config entry",
                     settings_from_agent(agent, root, f"{args.checkpoint} config entry",
                                         unresolved, report["warnings"]), unresolved)
    if args.config:
        agent, root = load_config_file(args.config)
        unresolved = {}
        given = settings_from_agent(agent, root, args.config, unresolved, report["warnings"])
        settings.add(args.config, given, unresolved)
        _config_disagreements(settings, given, args.config, report["warnings"])
    settings.add(FLAGS_LAYER, flag_settings(args))
    apply_dataset_resize(settings, report["warnings"])
    ignore = []
    for p in args.ignore:
        try:
            ignore.append(re.compile(p))
        except re.error as e:
            raise ConvertError(f"--ignore {p!r}: bad regex ({e})") from None
    key_map = load_key_map(args.key_map) if args.key_map else None
    sd = drop_alias(rename_keys(sd, key_map, ignore, report), report)
    mapped = map_state_dict(sd)
    bottleneck = [k for k in mapped.unknown if re.search(r"backbone\.[4-7]\.\d+\.(conv3|bn3)\.", k)]
    if bottleneck:
        raise ConvertError(f"{len(bottleneck)} state-dict keys are a bottleneck ResNet's third conv "
                           f"(e.g. {bottleneck[0]}): a resnet50/101/152 trunk; the engine runs "
                           f"resnet18 only")
    if mapped.unknown:
        raise ConvertError(f"{len(mapped.unknown)} state-dict keys are not part of the ACT "
                           f"model: {short_list(mapped.unknown)} (map them with --key-map or skip "
                           f"them with --ignore REGEX)")
    for key in mapped.counters:
        report["consumed"][key] = "BatchNorm step counter"
    for key in mapped.derived:
        report["consumed"][key] = "sinusoidal table, rebuilt by the engine"
    model = Model(sd, mapped)
    found = infer(model)
    check_token_layout(model, found, settings)
    cfg = resolve(settings, found, args.trust_shapes, args.strict_shapes, report["warnings"])
    validate(cfg)
    if args.stats_from == "file" and not args.stats:
        raise ConvertError("--stats-from file needs --stats dataset_stats.pkl (the file to use)")
    if args.stats and args.stats_from not in (None, "file"):
        raise ConvertError(f"--stats and --stats-from {args.stats_from} both choose the statistics: "
                           f"pass one (--stats-from file keeps --stats where the buffers differ)")
    sources = []
    if args.stats:
        skipped = []
        stat_key = lambda k: re.fullmatch(r"(normalization\.)?(qpos|action)(_(min|max|mean|std))?", str(k))  # noqa: E731
        sources.append((args.stats, _stats_dict(load_pickle(args.stats, skipped, stat_key), args.stats)))
        for entry, name in skipped:
            report["warnings"].append(f"WARNING {args.stats}: entry {entry!r} ({name}) is not "
                                      f"statistics and would need code run to load: left out")
    buffers = _Stats({k: sd[v].numpy().astype(np.float64).reshape(-1) for k, v in mapped.stats.items()})
    buffers.precision = _precision_of(sd[v] for v in mapped.stats.values())
    sources.append((SD_STATS, buffers))
    if isinstance(top.get("dataset_stats"), dict):
        sources.append((ENTRY_STATS, _stats_dict(top["dataset_stats"], "dataset_stats entry")))
    # a source with nothing usable stays (empty) when it had other keys, so a refusal names them
    sources = [(label, st) for label, st in sources if st or getattr(st, "ignored", ())]
    chosen = args.stats or STATS_FROM.get(args.stats_from)
    stats = pick_stats(cfg, sources, report, report["warnings"], chosen, args.allow_initial_stats,
                       forced=args.stats_from is not None)
    for k, key in mapped.stats.items():
        name = "norm." + k.replace("_", ".")
        if name in stats and report["stats_source"] == SD_STATS:
            report["mapped"][key] = name
        else:
            report["consumed"][key] = f"statistic not used ({cfg['norm_type']} from " \
                                      f"{report['stats_source']})"
    tensors = build_tensors(model, cfg, stats, report)
    unused = [k for k in sd if k not in report["mapped"] and k not in report["consumed"]]
    if unused:   # every key is placed or refused above; this is the net under that promise
        raise ConvertError(f"{len(unused)} state-dict keys were read but not converted: "
                           f"{short_list(unused)}")
    header = actw.write_actw(args.output, metadata(cfg, sha, args.norm_eps), tensors,
                             compress=args.compress)
    if args.compress and not header["compression"]:
        report["warnings"].append(f"WARNING --compress {args.compress}: the data is mostly zeros (it would inflate "
                                  f"more than 64:1, which readers refuse): written uncompressed")
    report.update(model_hash=f"{header['checksum']:016x}", file_size=header["file_size"],
                  norm_eps=args.norm_eps,
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
        f"  norm        {c['norm_type']} (eps {r['norm_eps']:g}) from {r['stats_source']}",
        f"  file        {r['file_size']:,} bytes",
        f"  model hash  {r['model_hash']}",
    ])


def _positive(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (0 < v < 1):
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 < eps < 1")
    return v


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Convert a roboimi ACT training checkpoint (torch.save zip) into an .actw "
                    "weight file without importing torch or executing pickle code.")
    ap.add_argument("checkpoint", help="vla_model_best.pt or similar")
    ap.add_argument("-o", "--output", required=True, help="the .actw file to write")
    ap.add_argument("--config", help="the run's config, YAML or JSON: best the resolved "
                                      "outputs/<run>/.hydra/config.yaml (agent, data and backbone "
                                      "sections), or the agent section alone")
    ap.add_argument("--stats", help="dataset_stats.pkl, the run's statistics (wins over a "
                                     "dataset_stats entry; refused where it differs from the "
                                     "state dict's set normalization.* buffers, see --stats-from)")
    ap.add_argument("--stats-from", choices=tuple(STATS_FROM),
                    help="state_dict or dataset_stats (without --stats): take the statistics "
                         "from the state dict's normalization.* buffers or from the checkpoint's "
                         "dataset_stats entry, needed when the checkpoint has both and they "
                         "differ (default: the buffers, the values the agent normalizes with "
                         "after load_state_dict, when the two agree or only one exists); file "
                         "(with --stats): use the --stats file even where the buffers differ")
    ap.add_argument("--allow-initial-stats", action="store_true",
                    help="accept statistics that equal NormalizationModule's initial values "
                         "(min/mean all 0, max/std all 1), refused by default as never set")
    ap.add_argument("--state-dict-key", metavar="KEY",
                    help="the checkpoint entry holding the weights, e.g. ema_state_dict (dotted "
                         "for nested: ema.module); default: the first of " + ", ".join(SD_ENTRIES))
    ap.add_argument("--key-map", metavar="MAP.json",
                    help="a JSON file renaming state-dict keys: {\"source.key\" or \"re:REGEX\": "
                         "\"new.key\" (a template with \\\\1 for a regex) or null (drop)}")
    ap.add_argument("--ignore", action="append", default=[], metavar="REGEX",
                    help="skip state-dict keys matching REGEX (listed in the report)")
    ap.add_argument("--image-size", help="uint8 frame size served, HxW (default: the config's "
                    "vision_backbone.image_shape, else 256x256, the socket-peg cameras')")
    ap.add_argument("--input-size", help="bilinear resize target, HxW (default: the config's "
                    "vision_backbone.dataset_image_resize_shape, else data.image_resize_shape, else "
                    "vision_backbone.input_shape, else 224x224)")
    ap.add_argument("--crop", help="center crop after resize, HxW or 'none'")
    ap.add_argument("--imagenet-norm", action="store_true", help="ImageNet mean/std after crop")
    ap.add_argument("--normalization", choices=tuple(STAT_KINDS),
                    help="how qpos and actions were normalized (the agent's normalization_type; "
                         "default min_max)")
    ap.add_argument("--norm-eps", type=_positive, default=NORM_EPS, metavar="EPS",
                    help="clamp of (max - min) or std in the qpos/action normalization, as in "
                         "training (default %(default)g, the seed's); decides constant dims")
    ap.add_argument("--camera-names", help="comma-separated, in token order")
    ap.add_argument("--nheads", type=int, help="attention heads (head.nheads; default 8): the "
                                                 "weights cannot tell it")
    ap.add_argument("--activation", choices=("gelu", "relu"),
                    help="the transformer's feed-forward activation (head.activation; default gelu)")
    ap.add_argument("--kl-weight", type=float, help="head.kl_weight, kept as metadata (default 10)")
    ap.add_argument("--num-action-steps", type=int,
                    help="actions executed per chunk (the agent's num_action_steps; default 8): "
                         "served to clients, whose runner executes that many; at most pred_horizon "
                         "- obs_horizon + 1 (the agent's slice ends with the chunk: more is cut to that)")
    ap.add_argument("--obs-horizon", type=int,
                    help="observations per step (the agent's obs_horizon; default 1): the first "
                         "executed action is chunk[obs_horizon - 1]")
    ap.add_argument("--compress", choices=("zstd",), help="zstd-compress the data section")
    ap.add_argument("--trust-shapes", action="store_true",
                    help="when shapes and config disagree, warn and use the shapes (not for the "
                         "feature map: whether training resized or cropped is not in the shapes)")
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
        try:
            actw.write_file_atomic(args.report, [json.dumps(report, indent=2, sort_keys=True).encode()])
        except OSError as e:
            print(f"convert_checkpoint: error: --report: {e} (the model {args.output} was written)",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
