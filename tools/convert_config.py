"""convert_config.py - the model settings the converter cannot read off tensor shapes.

defines: DEFAULTS, Settings, load_config_file, settings_from_agent, dataset_resize,
         pick_input_size, apply_dataset_resize, ConfigError

Settings come in layers, lowest first: act_resnet.yaml defaults, the checkpoint's `config`
entry, the --config file, command-line flags. Each layer is a flat dict of canonical setting
names (the keys of DEFAULTS); Settings remembers which layer set each value, so a conflict with
the tensor shapes can say where the wrong value came from. The agent section is read the way
Hydra would see it: `_target_`, `_partial_`, `defaults` and unknown keys are ignored, and a
`${...}` interpolation that cannot be resolved inside the given file counts as unset - but it is
remembered (Settings.unresolved), so the converter can refuse to fall back to a default for a
setting the weights cannot confirm (camera_names: the seed's act_resnet.yaml says
`${data.camera_names}`, which only the run's full .hydra/config.yaml resolves).
"""

import json
import re

# act_resnet.yaml (seed 000) resolved; camera names are the socket-peg data's.
DEFAULTS = {
    "obs_dim": 16, "action_dim": 16, "pred_horizon": 16, "obs_horizon": 1, "num_action_steps": 8,
    "camera_names": ["l_vis", "r_vis", "front"], "num_cams": 3,
    "image_height": 256, "image_width": 256, "input_height": 224, "input_width": 224,
    "crop_height": 0, "crop_width": 0, "imagenet_norm": 0,
    "vision_norm": "batchnorm", "separate_trunks": 0, "num_keypoints": 32, "output_dim": 64,
    "hidden_dim": 256, "nheads": 8, "enc_layers": 4, "dec_layers": 6, "dim_feedforward": 2048,
    "latent_dim": 32, "activation": "gelu", "kl_weight": 10.0, "norm_type": "min_max",
    "tokens_per_camera": 1,
}
# The layer command-line flags add (convert_checkpoint.py).
FLAGS_LAYER = "command-line flags"
# The trunk the engine runs (ResNetDiffusionBackbone's torchvision name).
TRUNK = "resnet18"

_INTERP = re.compile(r"^\$\{([^}]*)\}$")


class ConfigError(ValueError):
    """A config file or flag that cannot be understood."""


def load_config_file(path):
    """Read a YAML or JSON file; returns (agent section, root used to resolve ${...})."""
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        try:
            root = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
    else:
        import yaml
        try:
            root = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(root, dict):
        raise ConfigError(f"{path}: expected a mapping (the Hydra agent section)")
    return split_agent(root)


def split_agent(root):
    """A full Hydra config holds the agent under `agent`; a bare agent section is its own."""
    if isinstance(root.get("agent"), dict):
        return root["agent"], root
    return root, {"agent": root}


class Unresolved(str):
    """An interpolation (its last `${...}` text) that the file itself cannot resolve."""


def _resolve(value, root):
    """Resolve `${a.b}` against root; anything unresolvable (or still interpolated) comes back
    as Unresolved(text)."""
    for _ in range(8):
        if not isinstance(value, str):
            return value
        m = _INTERP.match(value.strip())
        if not m:
            return Unresolved(value) if "${" in value else value
        node = root
        for part in m.group(1).split("."):
            if not isinstance(node, dict) or part not in node:
                return Unresolved(value)
            node = node[part]
        value = node
    return Unresolved(str(value))


def _pair(value, what, source):
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) not in (2, 3) \
            or not all(isinstance(v, int) and v >= 0 for v in value):
        raise ConfigError(f"{source}: {what} is {value!r}, expected [H, W] (or [C, H, W])")
    if len(value) == 3 and value[0] not in (1, 3) and value[2] in (1, 3):
        raise ConfigError(f"{source}: {what} is {value!r}, which reads as channels last [H, W, C]; "
                          f"the config takes [C, H, W] or [H, W]: write [{value[2]}, {value[0]}, {value[1]}]")
    return tuple(value[-2:])


def dataset_resize(agent, root, source, warnings):
    """The size roboimi's dataset resized the frames to, as this file says it: the backbone's
    `dataset_image_resize_shape` (which wins) or `data.image_resize_shape`. Returns
    ((h, w), config key), or None (not set, null, or `${...}` the file cannot resolve, which is
    warned about)."""
    found = []
    vbn = agent.get("vision_backbone")
    if isinstance(vbn, dict) and vbn.get("dataset_image_resize_shape") is not None:
        found.append(("vision_backbone.dataset_image_resize_shape",
                      vbn["dataset_image_resize_shape"]))
    data = root.get("data") if isinstance(root, dict) else None
    if isinstance(data, dict) and data.get("image_resize_shape") is not None:
        found.append(("data.image_resize_shape", data["image_resize_shape"]))
    for key, value in found:
        value = _resolve(value, root)
        if isinstance(value, Unresolved):
            warnings.append(f"WARNING {source}: {key} is {value}, which that file cannot "
                            f"resolve; the frames' resize target is left to the other keys, "
                            f"vision_backbone.input_shape or --input-size")
            continue
        size = _pair(value, key, source)
        if size is not None:
            return size, key
    return None


def pick_input_size(dataset, inp, warnings):
    """The frames' resize target. roboimi's dataset resizes the frames and the backbone's
    input_shape only shapes its SpatialSoftmax grid, so a run whose two sizes differ but give the
    same feature map (any of 193..224 gives 7x7) trained on the dataset's size: that wins.
    dataset: ((h, w), where) from dataset_resize, or None; inp: ((h, w), where) of the
    input_shape in effect, or None. Returns ((h, w), where) or inp."""
    if dataset is None:
        return inp
    (size, where), shape = dataset, inp[0] if inp else None
    if size == shape:
        return dataset
    h, w = size
    if h != w and shape == (w, h):
        return inp   # the same size, if the dataset resized with cv2 (dsize is [W, H])
    if h != w and shape is not None:
        warnings.append(f"WARNING {where} is {list(size)} but {inp[1]} says {list(shape)}; a "
                        f"non-square resize may be [W, H] (cv2) or [H, W], so the engine keeps "
                        f"{shape[0]}x{shape[1]}: pass --input-size HxW if training resized to "
                        f"another size")
        return inp
    if h != w:
        warnings.append(f"WARNING {where} is {list(size)}, taken as [H, W] = {h}x{w}; if the "
                        f"dataset resized with cv2 (dsize [W, H]), pass --input-size {w}x{h}")
    elif shape is not None:
        warnings.append(f"WARNING {where} = {list(size)} and {inp[1]} = {list(shape)} differ; "
                        f"the dataset resized the frames, so the engine resizes to {h}x{w} as "
                        f"training did")
    return dataset


def settings_from_agent(agent, root, source, unresolved=None, warnings=None):
    """Map an agent section onto canonical setting names (only what it actually sets).
    unresolved, when given, receives {setting: (config key, `${...}` text)} for settings the
    file names but cannot resolve; warnings, when given, receives what the caller should print."""
    unresolved = {} if unresolved is None else unresolved
    warnings = [] if warnings is None else warnings

    def get(section, key, name=None):
        node = agent if section is None else agent.get(section)
        if not isinstance(node, dict):
            return None
        value = _resolve(node.get(key), root)
        if isinstance(value, Unresolved):
            where = key if section is None else f"{section}.{key}"
            unresolved.setdefault(name or key, (where, str(value)))
            return None
        return value

    out, seen = {}, {}

    def put(name, value, origin):
        if value is None:
            return
        if name in out and out[name] != value:
            raise ConfigError(f"{source}: {seen[name]} = {out[name]!r} but {origin} = {value!r}")
        out[name], seen[name] = value, origin

    for key in ("obs_dim", "action_dim", "pred_horizon", "obs_horizon", "num_action_steps",
                "num_cams"):
        put(key, get(None, key), key)
    put("num_cams", get("vision_backbone", "num_cameras", "num_cams"), "vision_backbone.num_cameras")
    for origin, section in (("camera_names", None), ("vision_backbone.camera_names",
                                                     "vision_backbone")):
        names = get(section, "camera_names")
        if names is not None:
            if isinstance(names, str):
                names = [n.strip() for n in names.split(",")]
            put("camera_names", [str(n) for n in names], origin)
    if "camera_names" in agent and get(None, "camera_names") is None \
            and get("vision_backbone", "camera_names") is None \
            and "camera_names" not in unresolved and "camera_names" not in out:
        # null on the agent (and none on the backbone): seed 000's ACTAgent._order_images then
        # feeds the cameras in sorted(observation keys) order, not the dataset's
        keys = _resolve("${data.camera_names}", root)
        if isinstance(keys, str) and not isinstance(keys, Unresolved):
            keys = [n.strip() for n in keys.split(",")]
        if isinstance(keys, (list, tuple)) and keys:
            order = sorted(str(n) for n in keys)
            put("camera_names", order,
                "camera_names (null: the agent sorts the cameras, sorted(data.camera_names))")
            warnings.append(f"note {source}: camera_names is null, so the agent fed the cameras "
                            f"in sorted order: {','.join(order)} (data.camera_names sorted)")
        else:
            unresolved.setdefault("camera_names", (
                "camera_names", "null (the agent then feeds the cameras in sorted order of the "
                "observation's image keys, which this file does not name)"))
    put("norm_type", get(None, "normalization_type", "norm_type"), "normalization_type")
    vb = "vision_backbone"
    for key in ("vision_backbone", "backbone", "backbone_name"):
        trunk = get(vb, key, "trunk")
        if isinstance(trunk, str) and trunk.strip().lower() != TRUNK:
            raise ConfigError(f"{source}: {vb}.{key} is {trunk!r}: the engine runs {TRUNK} trunks "
                              f"only (ResNetDiffusionBackbone's default)")
    tokens = get(vb, "output_tokens_per_camera", "tokens_per_camera")
    if tokens is not None:
        put("tokens_per_camera", int(bool(tokens)), "vision_backbone.output_tokens_per_camera")
    inp = _pair(get(vb, "input_shape", "input_height"), "vision_backbone.input_shape", source)
    if inp:
        put("input_height", inp[0], "vision_backbone.input_shape")
        put("input_width", inp[1], "vision_backbone.input_shape")
    resize = dataset_resize(agent, root, source, warnings)
    img = _pair(get(vb, "image_shape", "image_height"), "vision_backbone.image_shape", source)
    if img:
        put("image_height", img[0], "vision_backbone.image_shape")
        put("image_width", img[1], "vision_backbone.image_shape")
    crop = get(vb, "crop_shape", "crop_height")
    if crop is not None or (vb in agent and "crop_shape" in (agent.get(vb) or {})
                            and "crop_height" not in unresolved):
        c = _pair(crop, "vision_backbone.crop_shape", source) or (0, 0)
        put("crop_height", c[0], "vision_backbone.crop_shape")
        put("crop_width", c[1], "vision_backbone.crop_shape")
    norm = get(vb, "image_normalization", "imagenet_norm")
    if norm is None and vb in agent and "image_normalization" in (agent.get(vb) or {}) \
            and "imagenet_norm" not in unresolved:
        norm = "none"   # null: no normalization after the crop
    if norm is not None:
        if norm not in ("imagenet", "none"):
            raise ConfigError(f"{source}: vision_backbone.image_normalization is {norm!r}, "
                              f"expected imagenet or none")
        put("imagenet_norm", int(norm == "imagenet"), "vision_backbone.image_normalization")
    gn = get(vb, "use_group_norm", "vision_norm")
    if gn is not None:
        put("vision_norm", "groupnorm" if gn else "batchnorm", "vision_backbone.use_group_norm")
    sep = get(vb, "use_separate_rgb_encoder_per_camera", "separate_trunks")
    if sep is not None:
        put("separate_trunks", int(bool(sep)), "vision_backbone.use_separate_rgb_encoder_per_camera")
    put("num_keypoints", get(vb, "spatial_softmax_num_keypoints", "num_keypoints"),
        "vision_backbone.spatial_softmax_num_keypoints")
    put("output_dim", get(vb, "output_dim", "output_dim"), "vision_backbone.output_dim")
    for key in ("hidden_dim", "nheads", "enc_layers", "dec_layers", "dim_feedforward",
                "latent_dim", "activation", "kl_weight"):
        put(key, get("head", key), "head." + key)
    for key, value in out.items():
        want = type(DEFAULTS[key])
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            out[key] = float(value)
        elif want is int and isinstance(value, bool):
            out[key] = int(value)
        elif not isinstance(out[key], want):
            raise ConfigError(f"{source}: {seen[key]} is {value!r}, expected {want.__name__}")
    if resize:   # not a setting of DEFAULTS: apply_dataset_resize weighs it against the others
        out["dataset_resize"] = resize
    return out


def apply_dataset_resize(settings, warnings):
    """Once every layer is in: the dataset's resize size (any layer's, the highest one) over any
    layer's input_shape (pick_input_size), as one more layer; --input-size still wins."""
    found = settings.find("dataset_resize")
    if found is None:
        return
    (size, key), layer = found
    where = f"{layer}: {key}"
    flag = settings.source("input_height") == FLAGS_LAYER
    shape = (settings.get("input_height"), settings.get("input_width"))
    if flag:
        if shape != size:
            warnings.append(f"WARNING --input-size {shape[0]}x{shape[1]} overrides {where} = "
                            f"{list(size)}, the size the dataset resized the frames to")
        return
    inp = (shape, f"vision_backbone.input_shape ({settings.source('input_height')})") \
        if settings.explicit("input_height") else None
    picked = pick_input_size((size, where), inp, warnings)
    if picked[1] == where:   # the dataset's size won
        settings.add(where, {"input_height": size[0], "input_width": size[1]})


class Settings:
    """Layered settings: get(name) -> value, source(name) -> which layer set it;
    unresolved(name) -> [(layer, config key, `${...}`)] for layers that named it unresolvably."""

    def __init__(self):
        self.layers = [("act_resnet.yaml defaults", dict(DEFAULTS))]
        self._unresolved = {}

    def add(self, source, values, unresolved=None):
        if values:
            self.layers.append((source, dict(values)))
        for name, (where, text) in (unresolved or {}).items():
            self._unresolved.setdefault(name, []).append((source, where, text))

    def unresolved(self, name):
        return self._unresolved.get(name, [])

    def get(self, name):
        return self.lookup(name)[0]

    def find(self, name):
        """(value, layer) of the highest layer that sets name, or None."""
        try:
            return self.lookup(name)
        except KeyError:
            return None

    def source(self, name):
        return self.lookup(name)[1]

    def explicit(self, name):
        """True when something other than the defaults set the value."""
        return self.source(name) != self.layers[0][0]

    def lookup(self, name):
        for source, values in reversed(self.layers):
            if name in values:
                return values[name], source
        raise KeyError(name)
