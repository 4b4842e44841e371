#!/usr/bin/env python3
"""act_reference.py - the PyTorch reference of roboimi's ACT policy (fixtures only).

The engine is checked against this module, so it is written to the spec, not to the engine:
ACTPolicyHead follows seed 000 line for line (only the posterior gains a deterministic z = mu
switch), the vision encoder is the LeRobot-diffusion-style RGB encoder of ARCHITECTURE 3.2
(resnet18 children[:-2] as `backbone`, SpatialSoftmax `pool`, Linear `out`, ReLU), and the
agent's state_dict() has exactly the training-checkpoint layout of ARCHITECTURE section 4,
including the `noise_pred_net` alias of the head. Everything runs in float32 without TF32.

Importable (build_agent, randomize_, save_checkpoint, load_checkpoint, predict, posterior)
and a CLI:
  act_reference.py make-checkpoint --out CKPT.pt [--config full|small|X.yaml] ...
  act_reference.py predict --ckpt CKPT.pt --config agent.yaml --episode EP.hdf5 --out PRED.npy
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import pickle
import sys
import warnings
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
# torch 1.13's encoder fast path converts padded batches to nested tensors and says so each time.
warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")

# --------------------------------------------------------------------------------------------
# Configurations: the Hydra `agent` section of act_resnet.yaml, resolved.
# `image_shape` is the uint8 frame size the model is served (the socket-peg cameras: 256x256);
# it is not a property of the weights, so it lives beside input_shape in vision_backbone.
# --------------------------------------------------------------------------------------------

FULL_CFG = {
    "action_dim": 16,
    "obs_dim": 16,
    "normalization_type": "min_max",
    "pred_horizon": 16,
    "obs_horizon": 1,
    "num_action_steps": 8,
    "camera_names": ["l_vis", "r_vis", "front"],
    "num_cams": 3,
    "vision_backbone": {
        "input_shape": [3, 224, 224],
        "image_shape": [256, 256],
        "output_tokens_per_camera": True,
        "use_group_norm": False,
        "use_separate_rgb_encoder_per_camera": False,
        "spatial_softmax_num_keypoints": 32,
        "output_dim": 64,
        "crop_shape": None,
        "image_normalization": None,
    },
    "head": {
        "hidden_dim": 256,
        "nheads": 8,
        "enc_layers": 4,
        "dec_layers": 6,
        "dim_feedforward": 2048,
        "latent_dim": 32,
        "dropout": 0.1,
        "kl_weight": 10.0,
        "activation": "gelu",
    },
}

SMALL_CFG = {
    "action_dim": 4,
    "obs_dim": 5,
    "normalization_type": "min_max",
    "pred_horizon": 6,
    "obs_horizon": 1,
    "num_action_steps": 3,
    "camera_names": ["l_vis", "r_vis", "front"],
    "num_cams": 3,
    "vision_backbone": {
        "input_shape": [3, 64, 64],
        "image_shape": [80, 80],
        "output_tokens_per_camera": True,
        "use_group_norm": False,
        "use_separate_rgb_encoder_per_camera": False,
        "spatial_softmax_num_keypoints": 8,
        "output_dim": 16,
        "crop_shape": None,
        "image_normalization": None,
    },
    "head": {
        "hidden_dim": 32,
        "nheads": 4,
        "enc_layers": 2,
        "dec_layers": 2,
        "dim_feedforward": 64,
        "latent_dim": 8,
        "dropout": 0.1,
        "kl_weight": 10.0,
        "activation": "gelu",
    },
}

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
NORM_EPS = 1e-8
CHECKPOINT_LAYOUTS = ("model_state_dict", "state_dict", "model", "agent", "bare")


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def resolve_config(cfg: Optional[dict]) -> dict:
    """Fill a (possibly partial) agent section with act_resnet.yaml defaults."""
    out = _merge(FULL_CFG, cfg or {})
    if out.get("camera_names") is not None and "num_cams" not in (cfg or {}):
        out["num_cams"] = len(out["camera_names"])
    if len(out["camera_names"]) != out["num_cams"]:
        raise ValueError(f"camera_names has {len(out['camera_names'])} entries, num_cams is {out['num_cams']}")
    # The seed's ACTAgent refuses a backbone that disagrees with the agent on cameras.
    vb = out["vision_backbone"]
    if vb.get("num_cameras") is not None and int(vb["num_cameras"]) != int(out["num_cams"]):
        raise ValueError(f"num_cams ({out['num_cams']}) differs from vision_backbone.num_cameras ({vb['num_cameras']})")
    if vb.get("camera_names") is not None and list(vb["camera_names"]) != list(out["camera_names"]):
        raise ValueError(f"camera_names {out['camera_names']} differ from vision_backbone.camera_names {vb['camera_names']}")
    return out


# --------------------------------------------------------------------------------------------
# ACT head: seed 000 roboimi/vla/models/heads/act.py. The only change: _posterior takes
# `sample`; sample=False gives z = mu (the deterministic latent the engine reports),
# sample=True draws eps with torch.randn_like exactly as the seed does.
# --------------------------------------------------------------------------------------------


def kl_divergence(mu: torch.Tensor, logvar: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL divergence between diagonal posterior N(mu, exp(logvar)) and N(0, I)."""
    if mu.ndim > 2:
        mu = mu.view(mu.size(0), -1)
    if logvar.ndim > 2:
        logvar = logvar.view(logvar.size(0), -1)
    klds = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp())
    total_kld = klds.sum(1).mean(0, keepdim=True)
    dimension_wise_kld = klds.mean(0)
    mean_kld = klds.mean(1).mean(0, keepdim=True)
    return total_kld, dimension_wise_kld, mean_kld


def kl_per_sample(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """Per-sample KL: the seed's klds summed over latent dims, before the batch mean."""
    return (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp())).sum(1)


def _build_sinusoidal_table(length: int, dim: int) -> torch.Tensor:
    if length <= 0:
        raise ValueError(f"length must be positive, got {length}")
    if dim <= 0:
        raise ValueError(f"dim must be positive, got {dim}")
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(
        torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / max(dim, 1))
    )
    table = torch.zeros(length, dim, dtype=torch.float32)
    table[:, 0::2] = torch.sin(position * div_term)
    if dim > 1:
        table[:, 1::2] = torch.cos(position * div_term[: table[:, 1::2].shape[1]])
    return table.unsqueeze(0)


class ACTPolicyHead(nn.Module):
    def __init__(
        self,
        action_dim: int,
        obs_dim: int,
        vision_dim: int,
        num_cams: int,
        pred_horizon: int,
        obs_horizon: int = 1,
        hidden_dim: int = 256,
        nheads: int = 8,
        enc_layers: int = 4,
        dec_layers: int = 6,
        dim_feedforward: int = 2048,
        latent_dim: int = 32,
        dropout: float = 0.1,
        kl_weight: float = 10.0,
        activation: str = "gelu",
        **_: object,
    ) -> None:
        super().__init__()
        self.action_dim = int(action_dim)
        self.obs_dim = int(obs_dim)
        self.vision_dim = int(vision_dim)
        self.num_cams = int(num_cams)
        self.pred_horizon = int(pred_horizon)
        self.obs_horizon = int(obs_horizon)
        self.hidden_dim = int(hidden_dim)
        self.nheads = int(nheads)
        self.latent_dim = int(latent_dim)
        self.kl_weight = float(kl_weight)

        if self.pred_horizon <= 0:
            raise ValueError(f"pred_horizon must be positive, got {self.pred_horizon}")
        if self.hidden_dim % self.nheads != 0:
            raise ValueError(f"hidden_dim({self.hidden_dim}) must be divisible by nheads({self.nheads})")

        self.cls_embed = nn.Parameter(torch.zeros(1, 1, self.hidden_dim))
        self.encoder_qpos_proj = nn.Linear(self.obs_dim, self.hidden_dim)
        self.encoder_action_proj = nn.Linear(self.action_dim, self.hidden_dim)
        encoder_layer = nn.TransformerEncoderLayer(
            d_model=self.hidden_dim,
            nhead=self.nheads,
            dim_feedforward=int(dim_feedforward),
            dropout=float(dropout),
            activation=activation,
            batch_first=True,
            norm_first=False,
        )
        self.posterior_encoder = nn.TransformerEncoder(encoder_layer, num_layers=int(enc_layers))
        self.latent_proj = nn.Linear(self.hidden_dim, self.latent_dim * 2)

        self.latent_out_proj = nn.Linear(self.latent_dim, self.hidden_dim)
        self.decoder_qpos_proj = nn.Linear(self.obs_dim, self.hidden_dim)
        self.visual_proj = nn.Linear(self.vision_dim, self.hidden_dim)
        self.memory_type_embed = nn.Embedding(3, self.hidden_dim)  # latent, qpos, visual
        self.query_embed = nn.Embedding(self.pred_horizon, self.hidden_dim)
        decoder_layer = nn.TransformerDecoderLayer(
            d_model=self.hidden_dim,
            nhead=self.nheads,
            dim_feedforward=int(dim_feedforward),
            dropout=float(dropout),
            activation=activation,
            batch_first=True,
            norm_first=False,
        )
        self.decoder = nn.TransformerDecoder(decoder_layer, num_layers=int(dec_layers))
        self.action_head = nn.Linear(self.hidden_dim, self.action_dim)

        self.register_buffer(
            "posterior_pos_table",
            _build_sinusoidal_table(self.pred_horizon + 2, self.hidden_dim),
            persistent=False,
        )
        self.register_buffer("memory_pos_table", _build_sinusoidal_table(1024, self.hidden_dim), persistent=False)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        nn.init.normal_(self.cls_embed, mean=0.0, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def _validate_inputs(self, qpos, visual_tokens, actions, action_is_pad) -> None:
        if qpos.ndim != 2 or qpos.shape[-1] != self.obs_dim:
            raise ValueError(f"qpos must have shape (B,{self.obs_dim}), got {tuple(qpos.shape)}")
        if visual_tokens.ndim != 3 or visual_tokens.shape[-1] != self.vision_dim:
            raise ValueError(
                f"visual_tokens must have shape (B,N,{self.vision_dim}), got {tuple(visual_tokens.shape)}"
            )
        if visual_tokens.shape[0] != qpos.shape[0]:
            raise ValueError("qpos and visual_tokens batch dimensions must match")
        if actions is not None:
            expected = (qpos.shape[0], self.pred_horizon, self.action_dim)
            if tuple(actions.shape) != expected:
                raise ValueError(f"actions must have shape {expected}, got {tuple(actions.shape)}")
            if action_is_pad is not None and tuple(action_is_pad.shape) != expected[:2]:
                raise ValueError(f"action_is_pad must have shape {expected[:2]}, got {tuple(action_is_pad.shape)}")

    def _posterior(self, qpos, actions, action_is_pad, sample: bool):
        batch_size = qpos.shape[0]
        if actions is None:
            latent = torch.zeros(batch_size, self.latent_dim, device=qpos.device, dtype=qpos.dtype)
            return latent, None, None, None

        cls = self.cls_embed.to(dtype=qpos.dtype).expand(batch_size, -1, -1)
        qpos_token = self.encoder_qpos_proj(qpos).unsqueeze(1)
        action_tokens = self.encoder_action_proj(actions)
        tokens = torch.cat([cls, qpos_token, action_tokens], dim=1)
        pos = self.posterior_pos_table[:, : tokens.shape[1]].to(device=tokens.device, dtype=tokens.dtype)
        tokens = tokens + pos

        padding_mask = None
        if action_is_pad is not None:
            prefix = torch.zeros(batch_size, 2, dtype=torch.bool, device=action_is_pad.device)
            padding_mask = torch.cat([prefix, action_is_pad.to(torch.bool)], dim=1)

        encoded = self.posterior_encoder(tokens, src_key_padding_mask=padding_mask)
        latent_info = self.latent_proj(encoded[:, 0])
        mu, logvar = torch.chunk(latent_info, 2, dim=-1)
        if sample:
            std = torch.exp(0.5 * logvar)
            eps = torch.randn_like(std)
            latent = mu + eps * std
        else:
            latent = mu
        kl, _, _ = kl_divergence(mu, logvar)
        return latent, mu, logvar, kl

    def _memory(self, qpos, visual_tokens, latent) -> torch.Tensor:
        batch_size = qpos.shape[0]
        latent_token = self.latent_out_proj(latent).unsqueeze(1)
        qpos_token = self.decoder_qpos_proj(qpos).unsqueeze(1)
        visual = self.visual_proj(visual_tokens)
        memory = torch.cat([latent_token, qpos_token, visual], dim=1)

        if memory.shape[1] > self.memory_pos_table.shape[1]:
            pos = _build_sinusoidal_table(memory.shape[1], self.hidden_dim).to(device=memory.device, dtype=memory.dtype)
        else:
            pos = self.memory_pos_table[:, : memory.shape[1]].to(device=memory.device, dtype=memory.dtype)
        memory = memory + pos
        type_ids = torch.cat(
            [
                torch.zeros(1, dtype=torch.long, device=memory.device),
                torch.ones(1, dtype=torch.long, device=memory.device),
                torch.full((memory.shape[1] - 2,), 2, dtype=torch.long, device=memory.device),
            ]
        )
        memory = memory + self.memory_type_embed(type_ids).to(dtype=memory.dtype).unsqueeze(0)
        if memory.shape[0] != batch_size:
            raise RuntimeError("internal memory batch shape mismatch")
        return memory

    def forward(self, qpos, visual_tokens, actions=None, action_is_pad=None, sample: bool = True):
        self._validate_inputs(qpos, visual_tokens, actions, action_is_pad)
        latent, mu, logvar, kl = self._posterior(qpos, actions, action_is_pad, sample)
        memory = self._memory(qpos, visual_tokens, latent)
        query = self.query_embed.weight.to(dtype=memory.dtype).unsqueeze(0).expand(qpos.shape[0], -1, -1)
        target = torch.zeros_like(query)
        decoded = self.decoder(target + query, memory)
        pred_actions = self.action_head(decoded)
        if kl is None:
            kl = torch.zeros(1, device=qpos.device, dtype=qpos.dtype)
        return pred_actions, {"mu": mu, "logvar": logvar, "kl": kl, "kl_weight": self.kl_weight}


# --------------------------------------------------------------------------------------------
# Vision: LeRobot diffusion-style RGB encoder, one token per camera.
# --------------------------------------------------------------------------------------------


class SpatialSoftmax(nn.Module):
    """LeRobot's SpatialSoftmax: 1x1 conv to K keypoint maps, softmax over HxW, expected (x, y)."""

    def __init__(self, input_shape: Sequence[int], num_kp: int) -> None:
        super().__init__()
        self._in_c, self._in_h, self._in_w = (int(v) for v in input_shape)
        self.nets = nn.Conv2d(self._in_c, num_kp, kernel_size=1)
        self._out_c = num_kp
        pos_x, pos_y = np.meshgrid(np.linspace(-1.0, 1.0, self._in_w), np.linspace(-1.0, 1.0, self._in_h))
        pos_x = torch.from_numpy(pos_x.reshape(self._in_h * self._in_w, 1)).float()
        pos_y = torch.from_numpy(pos_y.reshape(self._in_h * self._in_w, 1)).float()
        self.register_buffer("pos_grid", torch.cat([pos_x, pos_y], dim=1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        features = self.nets(features)
        features = features.reshape(-1, self._in_h * self._in_w)
        attention = F.softmax(features, dim=-1)
        expected_xy = attention @ self.pos_grid
        return expected_xy.view(-1, self._out_c, 2)


class RgbEncoder(nn.Module):
    """resnet18 conv1..layer4 (`backbone`) -> SpatialSoftmax (`pool`) -> Linear (`out`) -> ReLU."""

    def __init__(self, vb: dict) -> None:
        super().__init__()
        resnet = torchvision.models.resnet18(weights=None)
        self.backbone = nn.Sequential(*list(resnet.children())[:-2])
        if vb["use_group_norm"]:
            _replace_batchnorm_with_groupnorm(self.backbone)
        h, w = backbone_image_hw(vb)
        with torch.no_grad():
            was_training = self.backbone.training
            self.backbone.eval()
            feat = self.backbone(torch.zeros(1, 3, h, w))
            self.backbone.train(was_training)
        self.feature_shape = tuple(feat.shape[1:])
        self.pool = SpatialSoftmax(self.feature_shape, int(vb["spatial_softmax_num_keypoints"]))
        self.out = nn.Linear(2 * int(vb["spatial_softmax_num_keypoints"]), int(vb["output_dim"]))
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.pool(self.backbone(x)), start_dim=1)
        return self.relu(self.out(x))


def _replace_batchnorm_with_groupnorm(module: nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, nn.GroupNorm(child.num_features // 16, child.num_features))
        else:
            _replace_batchnorm_with_groupnorm(child)


def backbone_image_hw(vb: dict) -> Tuple[int, int]:
    """The image size the trunk sees: the crop if one is set, else the resize target."""
    if vb.get("crop_shape"):
        return int(vb["crop_shape"][0]), int(vb["crop_shape"][1])
    return int(vb["input_shape"][1]), int(vb["input_shape"][2])


class ResNetDiffusionBackbone(nn.Module):
    """Shared trunk (`rgb_encoder`) or one per camera (`rgb_encoder.{i}`); tokens [B, N, D]."""

    def __init__(self, vb: dict, camera_names: Sequence[str]) -> None:
        super().__init__()
        self.camera_names = tuple(camera_names)
        self.num_cameras = len(self.camera_names)
        self.output_dim = int(vb["output_dim"])
        self.tokens_per_step = self.num_cameras
        self.separate = bool(vb["use_separate_rgb_encoder_per_camera"])
        if self.separate:
            self.rgb_encoder = nn.ModuleList([RgbEncoder(vb) for _ in self.camera_names])
        else:
            self.rgb_encoder = RgbEncoder(vb)

    def forward(self, images: Dict[str, torch.Tensor]) -> torch.Tensor:
        """images: camera -> preprocessed float [B, 3, h, w]; returns tokens [B, N, D] in camera order."""
        if self.separate:
            tokens = [enc(images[c]) for enc, c in zip(self.rgb_encoder, self.camera_names)]
            return torch.stack(tokens, dim=1)
        batch = images[self.camera_names[0]].shape[0]
        stacked = torch.cat([images[c] for c in self.camera_names], dim=0)
        feats = self.rgb_encoder(stacked)
        return feats.view(self.num_cameras, batch, -1).transpose(0, 1)


def preprocess(frames: torch.Tensor, vb: dict) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> float [B, 3, h, w]: /255, bilinear resize, center crop, ImageNet."""
    x = frames.permute(0, 3, 1, 2).to(torch.float32) / 255.0
    size = (int(vb["input_shape"][1]), int(vb["input_shape"][2]))
    if tuple(x.shape[-2:]) != size:
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=False)
    if vb.get("crop_shape"):
        x = torchvision.transforms.CenterCrop(tuple(int(v) for v in vb["crop_shape"]))(x)
    if vb.get("image_normalization") == "imagenet":
        mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
        x = (x - mean) / std
    return x


# --------------------------------------------------------------------------------------------
# Normalization (roboimi NormalizationModule semantics).
# --------------------------------------------------------------------------------------------

STAT_KEYS = ("qpos_min", "qpos_max", "qpos_mean", "qpos_std", "action_min", "action_max", "action_mean", "action_std")


class NormalizationModule(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, normalization_type: str) -> None:
        super().__init__()
        if normalization_type not in ("min_max", "mean_std"):
            raise ValueError(f"normalization_type must be min_max or mean_std, got {normalization_type!r}")
        self.normalization_type = normalization_type
        for key in STAT_KEYS:
            dim = obs_dim if key.startswith("qpos") else action_dim
            init = torch.ones(dim) if key.endswith(("max", "std")) else torch.zeros(dim)
            self.register_buffer(key, init)

    def _norm(self, x: torch.Tensor, kind: str) -> torch.Tensor:
        if self.normalization_type == "min_max":
            lo, hi = getattr(self, kind + "_min"), getattr(self, kind + "_max")
            return 2.0 * (x - lo) / torch.clamp(hi - lo, min=NORM_EPS) - 1.0
        mean, std = getattr(self, kind + "_mean"), getattr(self, kind + "_std")
        return (x - mean) / torch.clamp(std, min=NORM_EPS)

    def normalize_qpos(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x, "qpos")

    def normalize_action(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x, "action")

    def denormalize_action(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalization_type == "min_max":
            lo, hi = self.action_min, self.action_max
            return (x + 1.0) / 2.0 * torch.clamp(hi - lo, min=NORM_EPS) + lo
        return x * torch.clamp(self.action_std, min=NORM_EPS) + self.action_mean

    def get_stats(self) -> Dict[str, np.ndarray]:
        return {k: getattr(self, k).detach().cpu().numpy().astype(np.float32) for k in STAT_KEYS}

    def set_stats(self, stats: Dict[str, np.ndarray]) -> None:
        for k in STAT_KEYS:
            if k not in stats:
                raise KeyError(f"dataset stats lack '{k}' (have {sorted(stats)})")
            v = torch.as_tensor(np.asarray(stats[k], dtype=np.float32))
            if v.shape != getattr(self, k).shape:
                raise ValueError(f"dataset stats '{k}' has shape {tuple(v.shape)}, expected {tuple(getattr(self, k).shape)}")
            getattr(self, k).copy_(v)


# --------------------------------------------------------------------------------------------
# Agent: the module whose state_dict is a roboimi ACTAgent checkpoint.
# --------------------------------------------------------------------------------------------


class ACTAgent(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.cfg = cfg
        vb, hd = cfg["vision_backbone"], cfg["head"]
        self.action_dim, self.obs_dim = int(cfg["action_dim"]), int(cfg["obs_dim"])
        self.pred_horizon, self.obs_horizon = int(cfg["pred_horizon"]), int(cfg["obs_horizon"])
        self.num_action_steps = int(cfg["num_action_steps"])
        self.camera_names = tuple(cfg["camera_names"])
        self.num_cams = int(cfg["num_cams"])
        self.vision_encoder = ResNetDiffusionBackbone(vb, self.camera_names)
        self.normalization = NormalizationModule(self.obs_dim, self.action_dim, cfg["normalization_type"])
        head_args = {k: v for k, v in hd.items() if not k.startswith("_")}
        self.policy_head = ACTPolicyHead(
            action_dim=self.action_dim,
            obs_dim=self.obs_dim,
            vision_dim=self.vision_encoder.output_dim,
            num_cams=self.num_cams,
            pred_horizon=self.pred_horizon,
            obs_horizon=self.obs_horizon,
            **head_args,
        )
        # The seed's alias: the same head registered twice, so checkpoints carry both key sets.
        self.noise_pred_net = self.policy_head

    def visual_tokens(self, images: Dict[str, torch.Tensor]) -> torch.Tensor:
        missing = [c for c in self.camera_names if c not in images]
        if missing:
            raise ValueError(f"images lack cameras {missing}; expected {list(self.camera_names)}")
        vb = self.cfg["vision_backbone"]
        return self.vision_encoder({c: preprocess(images[c], vb) for c in self.camera_names})


def build_agent(cfg: Optional[dict] = None) -> ACTAgent:
    """An eval-mode agent for a (partial) Hydra agent section; defaults are act_resnet.yaml."""
    return ACTAgent(resolve_config(cfg)).eval()


def _encoders(agent: ACTAgent):
    encoders = agent.vision_encoder.rgb_encoder
    return list(encoders) if isinstance(encoders, nn.ModuleList) else [encoders]


@torch.no_grad()
def _calibrate_trunks(agent: ACTAgent, gen: torch.Generator, perturb) -> None:
    """Give each trunk the scale of real activations on smooth random images: BN running
    statistics are measured (then perturbed by `perturb`) so an 18-layer random trunk neither
    explodes nor collapses, and the keypoint conv is scaled so its maps have a spread of about
    2.5 logits: a softmax neither uniform nor one-hot."""
    h, w = backbone_image_hw(agent.cfg["vision_backbone"])
    images = F.interpolate(torch.rand(4, 3, 8, 8, generator=gen), size=(h, w), mode="bilinear", align_corners=False)
    for enc in _encoders(agent):
        bns = [m for m in enc.backbone.modules() if isinstance(m, nn.BatchNorm2d)]
        for m in bns:
            m.reset_running_stats()
            m.momentum = None
        if bns:
            enc.backbone.train()
            enc.backbone(images)
            enc.backbone.eval()
        for m in bns:
            m.momentum = 0.1
            perturb(m)
        logits = enc.pool.nets(enc.backbone(images)).flatten(2)
        spread = (logits - enc.pool.nets.bias.view(1, -1, 1)).std(-1).mean()
        enc.pool.nets.weight.mul_(2.5 / float(spread))


@torch.no_grad()
def randomize_(agent: ACTAgent, seed: int) -> ACTAgent:
    """Deterministic, non-trivial weights: nothing zero, nothing one, nothing symmetric."""
    gen = torch.Generator().manual_seed(int(seed))

    def normal(shape, std):
        return torch.randn(shape, generator=gen) * std

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=gen)

    for m in agent.modules():
        if isinstance(m, nn.Conv2d):
            fan_in = m.in_channels * m.kernel_size[0] * m.kernel_size[1]
            m.weight.copy_(normal(m.weight.shape, math.sqrt(2.0 / fan_in)))
            if m.bias is not None:
                m.bias.copy_(normal(m.bias.shape, 0.5))
        elif isinstance(m, nn.Linear):
            bound = math.sqrt(6.0 / (m.in_features + m.out_features))
            m.weight.copy_(uniform(m.weight.shape, -bound, bound))
            m.bias.copy_(normal(m.bias.shape, 0.1))
        elif isinstance(m, nn.MultiheadAttention):
            e = m.embed_dim
            bound = math.sqrt(6.0 / (e + e))
            m.in_proj_weight.copy_(uniform(m.in_proj_weight.shape, -bound, bound))
            m.in_proj_bias.copy_(normal(m.in_proj_bias.shape, 0.1))
        elif isinstance(m, nn.LayerNorm):
            m.weight.copy_(uniform(m.weight.shape, 0.7, 1.3))
            m.bias.copy_(normal(m.bias.shape, 0.1))
        elif isinstance(m, nn.GroupNorm):
            m.weight.copy_(uniform(m.weight.shape, 0.6, 1.4))
            m.bias.copy_(normal(m.bias.shape, 0.2))
        elif isinstance(m, nn.BatchNorm2d):
            m.weight.copy_(uniform(m.weight.shape, 0.6, 1.4))
            m.bias.copy_(normal(m.bias.shape, 0.2))
        elif isinstance(m, nn.Embedding):
            m.weight.copy_(normal(m.weight.shape, 0.5))
    head = agent.policy_head
    head.cls_embed.copy_(normal(head.cls_embed.shape, 0.5))

    def perturb_bn(m: nn.BatchNorm2d) -> None:
        m.running_mean.add_(normal(m.running_mean.shape, 0.1) * m.running_var.sqrt())
        m.running_var.mul_(uniform(m.running_var.shape, 0.7, 1.4))

    _calibrate_trunks(agent, gen, perturb_bn)

    norm = agent.normalization
    for kind, dim in (("qpos", agent.obs_dim), ("action", agent.action_dim)):
        lo = uniform((dim,), -2.0, 0.0)
        hi = lo + uniform((dim,), 0.5, 3.0)
        getattr(norm, kind + "_min").copy_(lo)
        getattr(norm, kind + "_max").copy_(hi)
        getattr(norm, kind + "_mean").copy_((lo + hi) / 2 + normal((dim,), 0.1))
        getattr(norm, kind + "_std").copy_(uniform((dim,), 0.2, 1.5))
    return agent.eval()


# --------------------------------------------------------------------------------------------
# Inference entry points (raw units in, raw units out).
# --------------------------------------------------------------------------------------------


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)


def _as_inputs(agent: ACTAgent, qpos, images) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    q = torch.as_tensor(np.asarray(qpos, dtype=np.float32))
    if q.ndim != 2 or q.shape[1] != agent.obs_dim:
        raise ValueError(f"qpos has shape {tuple(q.shape)}, expected [B, {agent.obs_dim}]")
    imgs = {}
    for c in agent.camera_names:
        if c not in images:
            raise ValueError(f"images lack camera '{c}'; expected {list(agent.camera_names)}")
        a = np.asarray(images[c])
        if a.dtype != np.uint8 or a.ndim != 4 or a.shape[0] != q.shape[0] or a.shape[3] != 3:
            raise ValueError(f"images['{c}'] is {a.dtype} {a.shape}, expected uint8 [{q.shape[0]}, H, W, 3]")
        imgs[c] = torch.from_numpy(np.ascontiguousarray(a))
    dev = next(agent.parameters()).device
    return q.to(dev), {c: v.to(dev) for c, v in imgs.items()}


@torch.no_grad()
def predict(agent: ACTAgent, qpos, images) -> np.ndarray:
    """The prior (z = 0) chunk, denormalized: float32 [B, pred_horizon, action_dim]."""
    agent.eval()
    q, imgs = _as_inputs(agent, qpos, images)
    tokens = agent.visual_tokens(imgs)
    pred, _ = agent.policy_head(agent.normalization.normalize_qpos(q), tokens)
    return _np(agent.normalization.denormalize_action(pred))


@torch.no_grad()
def posterior(agent: ACTAgent, qpos, images, actions, is_pad=None) -> Dict[str, np.ndarray]:
    """CVAE posterior with z = mu. Returns mu, logvar, kl (per sample, summed over latent dims),
    kl_mean (the seed's batch mean), actions_norm / actions (the chunk decoded from z = mu),
    prior_norm / prior (the z = 0 chunk) and loss (the seed's masked L1 + kl_weight * KL, z = mu)."""
    agent.eval()
    q, imgs = _as_inputs(agent, qpos, images)
    a = torch.as_tensor(np.asarray(actions, dtype=np.float32)).to(q.device)
    expected = (q.shape[0], agent.pred_horizon, agent.action_dim)
    if tuple(a.shape) != expected:
        raise ValueError(f"actions has shape {tuple(a.shape)}, expected {list(expected)}")
    pad = None if is_pad is None else torch.as_tensor(np.asarray(is_pad)).to(device=q.device, dtype=torch.bool)
    tokens = agent.visual_tokens(imgs)
    qn = agent.normalization.normalize_qpos(q)
    an = agent.normalization.normalize_action(a)
    head = agent.policy_head
    post, info = head(qn, tokens, an, pad, sample=False)
    prior, _ = head(qn, tokens)
    l1 = (post - an).abs()
    if pad is not None:
        mask = (~pad).unsqueeze(-1).to(l1.dtype)
        l1_loss = (l1 * mask).sum() / (mask.sum() * l1.shape[-1]).clamp_min(1.0)
    else:
        l1_loss = l1.mean()
    denorm = agent.normalization.denormalize_action
    return {
        "mu": _np(info["mu"]),
        "logvar": _np(info["logvar"]),
        "kl": _np(kl_per_sample(info["mu"], info["logvar"])),
        "kl_mean": _np(info["kl"]),
        "actions_norm": _np(post),
        "actions": _np(denorm(post)),
        "prior_norm": _np(prior),
        "prior": _np(denorm(prior)),
        "loss": float(l1_loss + head.kl_weight * info["kl"].squeeze()),
    }


# --------------------------------------------------------------------------------------------
# Checkpoints (torch.save zip, the layouts a roboimi training run or a user may produce).
# --------------------------------------------------------------------------------------------


def save_checkpoint(
    agent: ACTAgent,
    path: str,
    cfg: Optional[dict] = None,
    layout: str = "model_state_dict",
    stats_in: str = "state_dict",
    prefix: str = "",
    stats_path: Optional[str] = None,
    config_path: Optional[str] = None,
    include_config: bool = False,
) -> None:
    """Write `path` with torch.save (zip format). layout: where the state dict sits (see
    CHECKPOINT_LAYOUTS; `bare` = the state dict itself). stats_in: `state_dict` keeps the
    normalization.* buffers, `dataset_stats` moves them into a checkpoint entry, `pkl` moves them
    to stats_path only. stats_path, when given, always receives dataset_stats.pkl."""
    cfg = cfg if cfg is not None else agent.cfg
    if layout not in CHECKPOINT_LAYOUTS:
        raise ValueError(f"layout must be one of {CHECKPOINT_LAYOUTS}, got {layout!r}")
    if stats_in not in ("state_dict", "dataset_stats", "pkl"):
        raise ValueError(f"stats_in must be state_dict, dataset_stats or pkl, got {stats_in!r}")
    if stats_in == "pkl" and not stats_path:
        raise ValueError("stats_in='pkl' needs stats_path")
    if layout == "bare" and (stats_in == "dataset_stats" or include_config):
        raise ValueError("a bare state dict cannot carry dataset_stats or config entries")
    sd = agent.state_dict()
    stats = agent.normalization.get_stats()
    if stats_in != "state_dict":
        for k in STAT_KEYS:
            del sd["normalization." + k]
    if prefix:
        renamed = type(sd)((prefix + k, v) for k, v in sd.items())
        renamed._metadata = type(sd)((prefix + k, v) for k, v in getattr(sd, "_metadata", {}).items())
        sd = renamed
    if layout == "bare":
        obj = sd
    else:
        obj = {layout: sd, "epoch": 7, "step": 1234}
        if stats_in == "dataset_stats":
            obj["dataset_stats"] = stats
        if include_config:
            obj["config"] = copy.deepcopy(cfg)
    torch.save(obj, path)
    if stats_path:
        with open(stats_path, "wb") as f:
            pickle.dump(stats, f)
    if config_path:
        save_config(cfg, config_path)


def save_config(cfg: dict, path: str) -> None:
    import yaml

    with open(path, "w") as f:
        f.write("# @package agent\n")
        yaml.safe_dump(cfg, f, sort_keys=False)


def load_config(path: str) -> dict:
    import yaml

    with open(path) as f:
        cfg = yaml.safe_load(f)
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a mapping (the Hydra agent section)")
    return _with_dataset_resize(cfg, path)


def _with_dataset_resize(cfg: dict, path: str) -> dict:
    """The agent section, its input_shape set to the size the run's dataset resized the frames
    to (the converter's rule, convert_config.dataset_resize): this model resizes to input_shape."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    from convert_config import dataset_resize, pick_input_size, split_agent
    agent, root = split_agent(cfg)
    vb = agent.get("vision_backbone") if isinstance(agent.get("vision_backbone"), dict) else {}
    inp = tuple(vb["input_shape"][-2:]) if isinstance(vb.get("input_shape"), list) else None
    notes: list = []
    found = dataset_resize(agent, root, path, notes)
    picked = pick_input_size(found and (found[0], f"{path}: {found[1]}"),
                             inp and (inp, "vision_backbone.input_shape"), notes)
    for note in notes:
        warnings.warn(note)
    size = picked[0] if picked else None
    if size is not None and size != inp:
        agent = copy.deepcopy(agent)
        agent.setdefault("vision_backbone", {})["input_shape"] = [3, int(size[0]), int(size[1])]
    return agent


NORM_STAT_KINDS = {"min_max": ("min", "max"), "mean_std": ("mean", "std")}
INITIAL_STATS = {"min": 0.0, "mean": 0.0, "max": 1.0, "std": 1.0}   # NormalizationModule's buffers


def _stat_array(v) -> np.ndarray:
    v = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v
    return np.asarray(v, dtype=np.float64).reshape(-1)


def load_checkpoint(path: str, cfg: Optional[dict] = None, stats_path: Optional[str] = None,
                    stats_from: Optional[str] = None, allow_initial_stats: bool = False) -> ACTAgent:
    """Rebuild an agent from a checkpoint written by save_checkpoint (any layout/prefix).

    Normalization statistics are picked as tools/convert_checkpoint.py picks them: stats_path,
    else the state dict's normalization.* buffers (the seed's agent normalizes with its
    NormalizationModule, whose buffers load_state_dict overwrites), else a `dataset_stats`
    entry. Buffers and an entry that differ raise ValueError unless stats_from ('state_dict' or
    'dataset_stats') picks one; a stats_path file that differs from buffers which were set (not
    NormalizationModule's initial values) raises unless stats_from='file' (load_state_dict would
    put the buffers back over it); statistics still at the initial values (min/mean all 0,
    max/std all 1 for qpos or action) raise unless allow_initial_stats."""
    if stats_from not in (None, "state_dict", "dataset_stats", "file"):
        raise ValueError(f"stats_from must be state_dict, dataset_stats or file, got {stats_from!r}")
    if stats_from == "file" and not stats_path:
        raise ValueError("stats_from='file' needs stats_path (--stats)")
    if stats_path and stats_from not in (None, "file"):
        raise ValueError("stats_path and stats_from both choose the statistics: pass one")
    # weights_only=False: torch >= 2.6 loads only tensors and plain containers by default, and a
    # training checkpoint may carry numpy dataset_stats or a config. This module is the test and
    # bench reference, run on checkpoints the user made; the converter never unpickles anything.
    obj = torch.load(path, map_location="cpu", weights_only=False)
    sd, entry_stats, entry_cfg = obj, None, None
    if isinstance(obj, dict):
        for key in CHECKPOINT_LAYOUTS[:-1]:
            if key in obj and isinstance(obj[key], dict):
                sd = obj[key]
                entry_stats, entry_cfg = obj.get("dataset_stats"), obj.get("config")
                break
    for p in ("module.", "_orig_mod."):
        if sd and all(k.startswith(p) for k in sd):
            sd = {k[len(p):]: v for k, v in sd.items()}
    agent = build_agent(cfg if cfg is not None else entry_cfg)
    lo, hi = NORM_STAT_KINDS[agent.normalization.normalization_type]
    need = [f"{kind}_{s}" for kind in ("qpos", "action") for s in (lo, hi)]
    buffers = {k[len("normalization."):]: _stat_array(v) for k, v in sd.items()
               if k.startswith("normalization.")}
    entry = {k: _stat_array(v) for k, v in (entry_stats or {}).items() if k in STAT_KEYS}
    have_buffers = all(k in buffers for k in need)
    stats = None
    if stats_path:
        with open(stats_path, "rb") as f:
            stats = pickle.load(f)
        file_stats = {k: _stat_array(stats[k]) for k in need if k in stats}
        set_buffers = have_buffers and not all((buffers[k] == INITIAL_STATS[k.rsplit("_", 1)[1]]).all()
                                               for k in need)
        diff = [k for k in need if set_buffers and k in file_stats and
                (file_stats[k].shape != buffers[k].shape or not np.allclose(file_stats[k], buffers[k], rtol=1e-6))]
        if diff and stats_from != "file":
            raise ValueError(f"{path}: normalization statistics {diff} in {stats_path} differ from the state "
                             f"dict normalization.* buffers (what load_state_dict leaves the agent with); pass "
                             f"stats_from='file' (--stats-from file) to use the file anyway")
    elif stats_from == "dataset_stats" or (stats_from is None and not have_buffers and entry_stats is not None):
        if entry_stats is None:
            raise ValueError(f"{path}: stats_from='dataset_stats' but the checkpoint has no dataset_stats entry")
        stats = entry_stats
    elif stats_from == "state_dict" and not have_buffers:
        raise ValueError(f"{path}: stats_from='state_dict' but the state dict lacks normalization.* {need}")
    elif stats_from is None:
        diff = [k for k in need if k in entry and
                (entry[k].shape != buffers[k].shape or not np.allclose(entry[k], buffers[k], rtol=1e-6))]
        if diff:
            raise ValueError(f"{path}: normalization statistics {diff} from the state dict normalization.* differ "
                             f"from the checkpoint dataset_stats entry; pass a stats_path (--stats) or "
                             f"stats_from='state_dict' / 'dataset_stats' (--stats-from)")
    if stats is not None:
        agent.normalization.set_stats(stats)
        sd = {k: v for k, v in sd.items() if not k.startswith("normalization.")}
    missing, unexpected = agent.load_state_dict(sd, strict=False)
    if stats is not None:
        missing = [k for k in missing if not k.startswith("normalization.")]
    if missing or unexpected:
        raise ValueError(f"{path}: state dict does not fit the config: missing {missing[:8]}, unexpected {unexpected[:8]}")
    got = agent.normalization.get_stats()
    for kind in ("qpos", "action"):
        if not allow_initial_stats and all((got[f"{kind}_{s}"] == INITIAL_STATS[s]).all() for s in (lo, hi)):
            raise ValueError(f"{path}: the {kind} normalization statistics are NormalizationModule's initial "
                             f"values (never set?): pass --stats dataset_stats.pkl, or allow_initial_stats "
                             f"(--allow-initial-stats) if they are real")
    return agent.eval()


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _config_arg(name: str) -> dict:
    if name == "full":
        return copy.deepcopy(FULL_CFG)
    if name == "small":
        return copy.deepcopy(SMALL_CFG)
    return resolve_config(load_config(name))


def _cmd_make_checkpoint(args) -> int:
    cfg = _config_arg(args.config)
    vb = cfg["vision_backbone"]
    if args.norm:
        vb["use_group_norm"] = args.norm == "gn"
    if args.separate_trunks:
        vb["use_separate_rgb_encoder_per_camera"] = True
    if args.normalization:
        cfg["normalization_type"] = args.normalization
    if args.image_size:
        vb["image_shape"] = [args.image_size, args.image_size]
    if args.cameras:
        cfg["camera_names"] = args.cameras.split(",")
        cfg["num_cams"] = len(cfg["camera_names"])
    cfg = resolve_config(cfg)
    print(f"act_reference: building agent ({args.config}), seed {args.seed}", file=sys.stderr)
    agent = randomize_(build_agent(cfg), args.seed)
    save_checkpoint(agent, args.out, cfg, layout=args.layout, stats_in=args.stats_in, prefix=args.prefix,
                    stats_path=args.stats_out, config_path=args.config_out, include_config=args.include_config)
    n = sum(p.numel() for p in agent.parameters())
    print(f"act_reference: wrote {args.out} ({n} parameters)", file=sys.stderr)
    return 0


def _cmd_predict(args) -> int:
    import h5py

    cfg = resolve_config(load_config(args.config)) if args.config else None
    agent = load_checkpoint(args.ckpt, cfg, args.stats, args.stats_from, args.allow_initial_stats)
    with h5py.File(args.episode, "r") as f:
        qpos = f["observations/qpos"][()].astype(np.float32)
        frames = {c: f["observations/images/" + c] for c in agent.camera_names}
        out = np.zeros((qpos.shape[0], agent.pred_horizon, agent.action_dim), np.float32)
        for t0 in range(0, qpos.shape[0], args.batch):
            t1 = min(t0 + args.batch, qpos.shape[0])
            out[t0:t1] = predict(agent, qpos[t0:t1], {c: d[t0:t1] for c, d in frames.items()})
            print(f"act_reference: {t1}/{qpos.shape[0]} timesteps", file=sys.stderr)
    np.save(args.out, out)
    print(f"act_reference: wrote {args.out} {out.shape}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    torch.set_num_threads(int(os.environ.get("ACT_REF_THREADS", "2")))
    ap = argparse.ArgumentParser(description="PyTorch reference of the roboimi ACT policy (fixtures only).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make-checkpoint", help="write a randomized roboimi-layout checkpoint")
    mk.add_argument("--out", required=True)
    mk.add_argument("--config", default="full", help="full | small | agent.yaml")
    mk.add_argument("--norm", choices=("bn", "gn"))
    mk.add_argument("--separate-trunks", action="store_true")
    mk.add_argument("--normalization", choices=("min_max", "mean_std"))
    mk.add_argument("--cameras", help="comma-separated camera names (overrides the config)")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--image-size", type=int, help="uint8 frame size the model is served")
    mk.add_argument("--layout", choices=CHECKPOINT_LAYOUTS, default="model_state_dict")
    mk.add_argument("--stats-in", choices=("state_dict", "dataset_stats", "pkl"), default="state_dict")
    mk.add_argument("--prefix", default="", choices=("", "module.", "_orig_mod."))
    mk.add_argument("--include-config", action="store_true", help="add a `config` entry to the checkpoint")
    mk.add_argument("--stats-out", help="also write dataset_stats.pkl here")
    mk.add_argument("--config-out", help="write the agent config YAML here")
    pr = sub.add_parser("predict", help="prior chunks for every timestep of an episode -> .npy [T, H, A]")
    pr.add_argument("--ckpt", required=True)
    pr.add_argument("--config", help="agent config YAML (default: the checkpoint's config entry, else full)")
    pr.add_argument("--stats", help="dataset_stats.pkl (as convert_checkpoint.py --stats)")
    pr.add_argument("--stats-from", choices=("state_dict", "dataset_stats", "file"),
                    help="as convert_checkpoint.py --stats-from: the source when the checkpoint's differ")
    pr.add_argument("--allow-initial-stats", action="store_true",
                    help="as convert_checkpoint.py: accept statistics at NormalizationModule's initial values")
    pr.add_argument("--episode", required=True)
    pr.add_argument("--out", required=True)
    pr.add_argument("--batch", type=int, default=8)
    args = ap.parse_args(argv)
    if args.cmd == "make-checkpoint":
        return _cmd_make_checkpoint(args)
    return _cmd_predict(args)


if __name__ == "__main__":
    sys.exit(main())
