"""convert_keys.py - map a roboimi ACTAgent state dict onto the canonical .actw tensor names.

defines: map_state_dict, Mapped, MappingError

The training names (ARCHITECTURE.md section 4) are parsed with one table of regular
expressions per part of the model. Vision keys are not mapped to output tensors directly:
a conv and its norm are collected into one group (weight, optional bias, norm params), because
BatchNorm is folded into the conv later. Every key ends up in exactly one place: a head tensor,
a conv group, a stats entry, `derived` (buffers the engine rebuilds itself), or `unknown`.
"""

import re

# policy_head.<rest>: (pattern, canonical template); {p} is w|b from weight|bias.
_HEAD = [
    (r"cls_embed", "head.cls_embed"),
    (r"encoder_qpos_proj\.(?P<p>weight|bias)", "head.enc_qpos.{p}"),
    (r"encoder_action_proj\.(?P<p>weight|bias)", "head.enc_action.{p}"),
    (r"posterior_encoder\.layers\.(?P<i>\d+)\.self_attn\.in_proj_(?P<p>weight|bias)",
     "head.enc.{i}.attn.in.{p}"),
    (r"posterior_encoder\.layers\.(?P<i>\d+)\.self_attn\.out_proj\.(?P<p>weight|bias)",
     "head.enc.{i}.attn.out.{p}"),
    (r"posterior_encoder\.layers\.(?P<i>\d+)\.norm(?P<n>[12])\.(?P<p>weight|bias)",
     "head.enc.{i}.ln{n}.{p}"),
    (r"posterior_encoder\.layers\.(?P<i>\d+)\.linear(?P<n>[12])\.(?P<p>weight|bias)",
     "head.enc.{i}.ff{n}.{p}"),
    (r"latent_proj\.(?P<p>weight|bias)", "head.latent_proj.{p}"),
    (r"latent_out_proj\.(?P<p>weight|bias)", "head.latent_out.{p}"),
    (r"decoder_qpos_proj\.(?P<p>weight|bias)", "head.dec_qpos.{p}"),
    (r"visual_proj\.(?P<p>weight|bias)", "head.visual_proj.{p}"),
    (r"memory_type_embed\.weight", "head.mem_type"),
    (r"query_embed\.weight", "head.query"),
    (r"decoder\.layers\.(?P<i>\d+)\.(?P<a>self_attn|multihead_attn)\.in_proj_(?P<p>weight|bias)",
     "head.dec.{i}.{a}.in.{p}"),
    (r"decoder\.layers\.(?P<i>\d+)\.(?P<a>self_attn|multihead_attn)\.out_proj\.(?P<p>weight|bias)",
     "head.dec.{i}.{a}.out.{p}"),
    (r"decoder\.layers\.(?P<i>\d+)\.norm(?P<n>[123])\.(?P<p>weight|bias)",
     "head.dec.{i}.ln{n}.{p}"),
    (r"decoder\.layers\.(?P<i>\d+)\.linear(?P<n>[12])\.(?P<p>weight|bias)",
     "head.dec.{i}.ff{n}.{p}"),
    (r"action_head\.(?P<p>weight|bias)", "head.action_head.{p}"),
]
_HEAD = [(re.compile(p), t) for p, t in _HEAD]
# Non-persistent in the seed (the engine rebuilds them); a checkpoint that kept them is fine.
_HEAD_DERIVED = re.compile(r"(posterior_pos_table|memory_pos_table)")

_NORM_PARAMS = ("weight", "bias", "running_mean", "running_var")
_LAYERS = {"4": "layer1", "5": "layer2", "6": "layer3", "7": "layer4"}
# rgb_encoder[.T].<rest> -> (conv name within the trunk, role) or a plain tensor.
_VISION = [
    (re.compile(r"backbone\.0\.(?P<p>weight|bias)"), "conv1", "conv"),
    (re.compile(r"backbone\.1\.(?P<p>\w+)"), "conv1", "norm"),
    (re.compile(r"backbone\.(?P<L>[4-7])\.(?P<i>\d+)\.conv(?P<c>[12])\.(?P<p>weight|bias)"),
     "{L}.{i}.conv{c}", "conv"),
    (re.compile(r"backbone\.(?P<L>[4-7])\.(?P<i>\d+)\.bn(?P<c>[12])\.(?P<p>\w+)"),
     "{L}.{i}.conv{c}", "norm"),
    (re.compile(r"backbone\.(?P<L>[4-7])\.(?P<i>\d+)\.downsample\.0\.(?P<p>weight|bias)"),
     "{L}.{i}.down", "conv"),
    (re.compile(r"backbone\.(?P<L>[4-7])\.(?P<i>\d+)\.downsample\.1\.(?P<p>\w+)"),
     "{L}.{i}.down", "norm"),
    (re.compile(r"pool\.nets\.(?P<p>weight|bias)"), "keypoints", "tensor"),
    (re.compile(r"pool\.pos_grid"), "pos_grid", "tensor"),
    (re.compile(r"out\.(?P<p>weight|bias)"), "out", "tensor"),
]
_VISION_PREFIX = re.compile(r"vision_encoder\.rgb_encoder\.(?:(?P<t>\d+)\.)?(?P<rest>.*)")
_STATS = re.compile(r"normalization\.(?P<k>(qpos|action)_(min|max|mean|std))")
_WB = {"weight": "w", "bias": "b"}


class MappingError(ValueError):
    """State-dict keys that cannot be placed."""


class Mapped:
    """The state dict sorted into the parts the converter assembles."""

    def __init__(self):
        self.head = {}        # canonical name -> source key
        self.convs = {}       # (trunk, conv) -> {"weight": key, "bias": key, "norm": {param: key}}
        self.tensors = {}     # (trunk, name) -> source key  (keypoints.w, pos_grid, out.b ...)
        self.stats = {}       # qpos_min ... -> source key
        self.derived = []     # source keys the engine recomputes
        self.counters = []    # num_batches_tracked keys
        self.unknown = []
        self.trunk_style = set()   # "shared" and/or "separate"
        self.sources = {}     # canonical/group key -> source key, to catch two sources for one

    def claim(self, what, key):
        other = self.sources.get(what)
        if other is not None:
            raise MappingError(f"state-dict keys '{other}' and '{key}' both map to {what}")
        self.sources[what] = key


def _vision(m, key, rest, trunk):
    for pattern, target, role in _VISION:
        g = pattern.fullmatch(rest)
        if not g:
            continue
        d = g.groupdict()
        conv = target.format(**d) if "{" in target else target
        if "L" in d:
            conv = _LAYERS[d["L"]] + conv[1:]
        if role == "tensor":
            name = conv + ("." + _WB[d["p"]] if "p" in d else "")
            m.claim(f"vision.{trunk}.{name}", key)
            m.tensors[(trunk, name)] = key
            return True
        group = m.convs.setdefault((trunk, conv), {"norm": {}})
        if role == "conv":
            m.claim(f"vision.{trunk}.{conv}.{d['p']}", key)
            group[d["p"]] = key
            return True
        if d["p"] == "num_batches_tracked":
            m.counters.append(key)
            return True
        if d["p"] in _NORM_PARAMS:
            m.claim(f"vision.{trunk}.{conv}.norm.{d['p']}", key)
            group["norm"][d["p"]] = key
            return True
        return False
    return False


def map_state_dict(keys):
    """Sort state-dict keys (prefixes already stripped, key map applied) into a Mapped."""
    m = Mapped()
    for key in keys:
        if key.startswith("policy_head."):
            rest = key[len("policy_head."):]
            if _HEAD_DERIVED.fullmatch(rest):
                m.derived.append(key)
                continue
            for pattern, template in _HEAD:
                g = pattern.fullmatch(rest)
                if g:
                    d = g.groupdict()
                    if "p" in d:
                        d["p"] = _WB[d["p"]]
                    if d.get("a") == "multihead_attn":
                        d["a"] = "cross_attn"
                    name = template.format(**d)
                    m.claim(name, key)
                    m.head[name] = key
                    break
            else:
                m.unknown.append(key)
            continue
        v = _VISION_PREFIX.fullmatch(key)
        if v:
            trunk = int(v.group("t")) if v.group("t") is not None else 0
            m.trunk_style.add("separate" if v.group("t") is not None else "shared")
            if not _vision(m, key, v.group("rest"), trunk):
                m.unknown.append(key)
            continue
        s = _STATS.fullmatch(key)
        if s:
            m.stats[s.group("k")] = key
            continue
        m.unknown.append(key)
    return m
