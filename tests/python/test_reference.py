"""The PyTorch reference checks itself before anything is checked against it.

The head is compared with a verbatim copy of the seed's ACTPolicyHead (below: it is the spec),
the checkpoint layout with ARCHITECTURE section 4, the vision path with direct PyTorch
formulas (F.interpolate, BN folding, GroupNorm, SpatialSoftmax). Tolerances: the head against
the seed copy and checkpoint round trips are exact up to 1e-6 relative (same ops, same order);
formula restatements (BN folding, manual softmax) 1e-5 relative.
"""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
import zipfile
from typing import Optional, Tuple

import h5py
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------- verbatim: seed 000, roboimi/vla/models/heads/act.py (the spec) ----------------


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
    """ACT CVAE head using native PyTorch transformer blocks.

    Args follow the existing Hydra style and are intentionally configurable so
    this implementation is not tied to ACT's original 14-DoF ALOHA setup.
    """

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
            raise ValueError(
                f"hidden_dim({self.hidden_dim}) must be divisible by nheads({self.nheads})"
            )

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
        self.register_buffer(
            "memory_pos_table",
            _build_sinusoidal_table(1024, self.hidden_dim),
            persistent=False,
        )
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

    def _validate_inputs(
        self,
        qpos: torch.Tensor,
        visual_tokens: torch.Tensor,
        actions: Optional[torch.Tensor],
        action_is_pad: Optional[torch.Tensor],
    ) -> None:
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
                raise ValueError(
                    f"action_is_pad must have shape {expected[:2]}, got {tuple(action_is_pad.shape)}"
                )

    def _posterior(
        self,
        qpos: torch.Tensor,
        actions: Optional[torch.Tensor],
        action_is_pad: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
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
            prefix = torch.zeros(
                batch_size,
                2,
                dtype=torch.bool,
                device=action_is_pad.device,
            )
            padding_mask = torch.cat([prefix, action_is_pad.to(torch.bool)], dim=1)

        encoded = self.posterior_encoder(tokens, src_key_padding_mask=padding_mask)
        latent_info = self.latent_proj(encoded[:, 0])
        mu, logvar = torch.chunk(latent_info, 2, dim=-1)
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        latent = mu + eps * std
        kl, _, _ = kl_divergence(mu, logvar)
        return latent, mu, logvar, kl

    def _memory(self, qpos: torch.Tensor, visual_tokens: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        batch_size = qpos.shape[0]
        latent_token = self.latent_out_proj(latent).unsqueeze(1)
        qpos_token = self.decoder_qpos_proj(qpos).unsqueeze(1)
        visual = self.visual_proj(visual_tokens)
        memory = torch.cat([latent_token, qpos_token, visual], dim=1)

        if memory.shape[1] > self.memory_pos_table.shape[1]:
            pos = _build_sinusoidal_table(memory.shape[1], self.hidden_dim).to(
                device=memory.device,
                dtype=memory.dtype,
            )
        else:
            pos = self.memory_pos_table[:, : memory.shape[1]].to(
                device=memory.device,
                dtype=memory.dtype,
            )
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

    def forward(
        self,
        qpos: torch.Tensor,
        visual_tokens: torch.Tensor,
        actions: Optional[torch.Tensor] = None,
        action_is_pad: Optional[torch.Tensor] = None,
    ):
        self._validate_inputs(qpos, visual_tokens, actions, action_is_pad)
        latent, mu, logvar, kl = self._posterior(qpos, actions, action_is_pad)
        memory = self._memory(qpos, visual_tokens, latent)
        query = self.query_embed.weight.to(dtype=memory.dtype).unsqueeze(0).expand(qpos.shape[0], -1, -1)
        target = torch.zeros_like(query)
        decoded = self.decoder(target + query, memory)
        pred_actions = self.action_head(decoded)
        if kl is None:
            kl = torch.zeros(1, device=qpos.device, dtype=qpos.dtype)
        latent_info = {
            "mu": mu,
            "logvar": logvar,
            "kl": kl,
            "kl_weight": self.kl_weight,
        }
        return pred_actions, latent_info


# ---------------------------------------- helpers ----------------------------------------------


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def random_inputs(rng, cfg, batch):
    h, w = cfg["vision_backbone"]["image_shape"]
    qpos = rng.normal(0.0, 1.0, size=(batch, cfg["obs_dim"])).astype(np.float32)
    images = {c: rng.integers(0, 256, size=(batch, h, w, 3), dtype=np.uint8) for c in cfg["camera_names"]}
    actions = rng.normal(0.0, 1.0, size=(batch, cfg["pred_horizon"], cfg["action_dim"])).astype(np.float32)
    return qpos, images, actions


def seed_head_like(agent) -> ACTPolicyHead:
    cfg = agent.cfg
    head = ACTPolicyHead(action_dim=cfg["action_dim"], obs_dim=cfg["obs_dim"],
                         vision_dim=cfg["vision_backbone"]["output_dim"], num_cams=cfg["num_cams"],
                         pred_horizon=cfg["pred_horizon"], obs_horizon=cfg["obs_horizon"], **cfg["head"])
    head.load_state_dict(agent.policy_head.state_dict())
    return head.eval()


@pytest.fixture(scope="module")
def small_agent(ref, make_cfg):
    return ref.randomize_(ref.build_agent(make_cfg()), 11)


# ---------------------------------------- the head ---------------------------------------------


def test_output_shapes(ref, small_agent, rng):
    cfg = small_agent.cfg
    qpos, images, actions = random_inputs(rng, cfg, 3)
    pred = ref.predict(small_agent, qpos, images)
    assert pred.shape == (3, cfg["pred_horizon"], cfg["action_dim"]) and pred.dtype == np.float32
    assert np.isfinite(pred).all()
    post = ref.posterior(small_agent, qpos, images, actions)
    L = cfg["head"]["latent_dim"]
    assert post["mu"].shape == (3, L) and post["logvar"].shape == (3, L) and post["kl"].shape == (3,)
    assert post["actions"].shape == pred.shape and post["actions_norm"].shape == pred.shape
    np.testing.assert_array_equal(post["prior"], pred)


def test_head_prior_matches_seed(ref, small_agent, rng):
    seed = seed_head_like(small_agent)
    cfg = small_agent.cfg
    qpos = torch.from_numpy(rng.normal(size=(4, cfg["obs_dim"])).astype(np.float32))
    tokens = torch.from_numpy(rng.normal(size=(4, cfg["num_cams"], cfg["vision_backbone"]["output_dim"])).astype(np.float32))
    with torch.no_grad():
        ours, info = small_agent.policy_head(qpos, tokens)
        theirs, _ = seed(qpos, tokens)
    assert rel(ours, theirs) <= 1e-6
    assert info["mu"] is None and float(info["kl"]) == 0.0
    assert float(ours.std()) > 0.1  # a non-trivial chunk


def test_head_posterior_matches_seed(ref, small_agent, rng, monkeypatch):
    seed = seed_head_like(small_agent)
    cfg = small_agent.cfg
    B, H = 4, cfg["pred_horizon"]
    qpos = torch.from_numpy(rng.normal(size=(B, cfg["obs_dim"])).astype(np.float32))
    tokens = torch.from_numpy(rng.normal(size=(B, cfg["num_cams"], cfg["vision_backbone"]["output_dim"])).astype(np.float32))
    actions = torch.from_numpy(rng.normal(size=(B, H, cfg["action_dim"])).astype(np.float32))
    pad = torch.zeros(B, H, dtype=torch.bool)
    pad[1, -2:] = True
    pad[3, 1:] = True
    with torch.no_grad():
        # sampled z: the same eps stream on both sides
        torch.manual_seed(5)
        ours_s, info_s = small_agent.policy_head(qpos, tokens, actions, pad, sample=True)
        torch.manual_seed(5)
        theirs_s, seed_info = seed(qpos, tokens, actions, pad)
        assert rel(ours_s, theirs_s) <= 1e-6
        assert rel(info_s["mu"], seed_info["mu"]) <= 1e-6 and rel(info_s["logvar"], seed_info["logvar"]) <= 1e-6
        assert rel(info_s["kl"], seed_info["kl"]) <= 1e-6
        # z = mu: the seed with eps forced to zero
        ours_d, _ = small_agent.policy_head(qpos, tokens, actions, pad, sample=False)
        monkeypatch.setattr(torch, "randn_like", torch.zeros_like)
        theirs_d, _ = seed(qpos, tokens, actions, pad)
    assert rel(ours_d, theirs_d) <= 1e-6
    assert rel(ours_d, ours_s) > 1e-4  # sampling really moved z
    per_sample = ref.kl_per_sample(info_s["mu"], info_s["logvar"])
    assert (per_sample > 0).all()
    assert abs(float(per_sample.mean()) - float(seed_info["kl"])) <= 1e-5 * float(seed_info["kl"])


def test_padded_actions_do_not_reach_the_latent(ref, small_agent, rng):
    cfg = small_agent.cfg
    qpos, images, actions = random_inputs(rng, cfg, 2)
    pad = np.zeros((2, cfg["pred_horizon"]), bool)
    pad[:, -3:] = True
    a = ref.posterior(small_agent, qpos, images, actions, pad)
    changed = actions.copy()
    changed[:, -3:] += rng.normal(0, 5, size=changed[:, -3:].shape).astype(np.float32)
    b = ref.posterior(small_agent, qpos, images, changed, pad)
    assert rel(a["mu"], b["mu"]) <= 1e-5
    c = ref.posterior(small_agent, qpos, images, changed)
    assert rel(c["mu"], a["mu"]) > 1e-3


def test_full_size_agrees_with_seed(ref, rng):
    agent = ref.randomize_(ref.build_agent(ref.FULL_CFG), 2)
    qpos, images, actions = random_inputs(rng, agent.cfg, 1)
    pred = ref.predict(agent, qpos, images)
    assert pred.shape == (1, 16, 16)
    with torch.no_grad():
        tokens = agent.visual_tokens({c: torch.from_numpy(v) for c, v in images.items()})
        assert tokens.shape == (1, 3, 64)
        qn = agent.normalization.normalize_qpos(torch.from_numpy(qpos))
        theirs, _ = seed_head_like(agent)(qn, tokens)
    assert rel(pred, agent.normalization.denormalize_action(theirs).numpy()) <= 1e-6
    assert agent.vision_encoder.rgb_encoder.feature_shape == (512, 7, 7)


# ---------------------------------------- layout -----------------------------------------------


def expected_vision_keys(prefix: str, norm: str):
    def norm_keys(p):
        if norm == "gn":
            return [p + ".weight", p + ".bias"]
        return [p + s for s in (".weight", ".bias", ".running_mean", ".running_var", ".num_batches_tracked")]

    keys = [prefix + "backbone.0.weight"] + norm_keys(prefix + "backbone.1")
    for layer in range(4, 8):
        for blk in range(2):
            p = f"{prefix}backbone.{layer}.{blk}."
            keys += [p + "conv1.weight"] + norm_keys(p + "bn1") + [p + "conv2.weight"] + norm_keys(p + "bn2")
            if layer > 4 and blk == 0:
                keys += [p + "downsample.0.weight"] + norm_keys(p + "downsample.1")
    keys += [prefix + k for k in ("pool.nets.weight", "pool.nets.bias", "pool.pos_grid", "out.weight", "out.bias")]
    return keys


@pytest.mark.parametrize("norm,separate", [("bn", False), ("gn", False), ("bn", True)])
def test_state_dict_layout(ref, make_cfg, norm, separate):
    agent = ref.build_agent(make_cfg(norm=norm, separate_trunks=separate))
    sd = agent.state_dict()
    if separate:
        vision = [k for i in range(3) for k in expected_vision_keys(f"vision_encoder.rgb_encoder.{i}.", norm)]
    else:
        vision = expected_vision_keys("vision_encoder.rgb_encoder.", norm)
    head = list(seed_head_like(agent).state_dict())
    expected = set(vision) | {"policy_head." + k for k in head} | {"noise_pred_net." + k for k in head}
    expected |= {f"normalization.{a}_{b}" for a in ("qpos", "action") for b in ("min", "max", "mean", "std")}
    assert set(sd) == expected
    for k in head:
        assert sd["noise_pred_net." + k].data_ptr() == sd["policy_head." + k].data_ptr()
    assert sd["policy_head.cls_embed"].shape == (1, 1, 32)


def test_checkpoint_round_trips(ref, small_agent, tmp_ckpt, tmp_path, rng):
    def made_from(agent, name, **kw):
        out = type("Made", (), {})()
        out.ckpt, out.config, out.stats = tmp_path / f"{name}.pt", tmp_path / f"{name}.yaml", tmp_path / f"{name}.pkl"
        out.agent, out.cfg = agent, agent.cfg
        ref.save_checkpoint(agent, str(out.ckpt), layout=kw["layout"], stats_in=kw["stats_in"], prefix=kw["prefix"],
                            stats_path=str(out.stats), config_path=str(out.config),
                            include_config=kw.get("include_config", False))
        return out

    variants = [
        dict(layout="model_state_dict", stats_in="state_dict", prefix=""),
        dict(layout="agent", stats_in="dataset_stats", prefix="module.", include_config=True),
        dict(layout="bare", stats_in="pkl", prefix="_orig_mod.", norm="gn", normalization="mean_std"),
    ]
    for i, v in enumerate(variants):
        if "norm" in v:
            made = tmp_ckpt(seed=20 + i, name=f"c{i}", **v)
        else:
            made = made_from(small_agent, f"c{i}", **v)
        assert zipfile.is_zipfile(made.ckpt)
        raw = torch.load(made.ckpt, weights_only=False)   # numpy dataset_stats (torch >= 2.6)
        sd = raw if v["layout"] == "bare" else raw[v["layout"]]
        assert all(k.startswith(v["prefix"]) for k in sd)
        has_norm = any(k.endswith("normalization.qpos_min") for k in sd)
        assert has_norm == (v["stats_in"] == "state_dict")
        if v["stats_in"] == "dataset_stats":
            assert isinstance(raw["dataset_stats"]["action_max"], np.ndarray)
        if v.get("include_config"):
            assert raw["config"]["head"]["nheads"] == 4
        with open(made.stats, "rb") as f:
            stats = pickle.load(f)
        assert set(stats) == set(ref.STAT_KEYS)
        np.testing.assert_array_equal(stats["qpos_min"], made.agent.normalization.qpos_min.numpy())
        loaded = ref.load_checkpoint(str(made.ckpt), ref.load_config(str(made.config)),
                                     str(made.stats) if v["stats_in"] == "pkl" else None)
        qpos, images, _ = random_inputs(rng, made.cfg, 2)
        np.testing.assert_array_equal(ref.predict(loaded, qpos, images), ref.predict(made.agent, qpos, images))


def test_randomize_is_nontrivial_and_deterministic(ref, make_cfg):
    a = ref.randomize_(ref.build_agent(make_cfg()), 4).state_dict()
    b = ref.randomize_(ref.build_agent(make_cfg()), 4).state_dict()
    c = ref.randomize_(ref.build_agent(make_cfg()), 5).state_dict()
    for k, v in a.items():
        assert torch.equal(v, b[k]), k
        if v.is_floating_point() and k != "vision_encoder.rgb_encoder.pool.pos_grid":
            assert not torch.equal(v, c[k]), k
            if k.endswith(("bias", "running_mean", "_min", "_mean")):
                assert (v != 0).all(), k
            if k.endswith(("running_var", "bn1.weight", "norm1.weight")):
                assert (v != 1).all(), k
    for kind in ("qpos", "action"):
        lo, hi = a[f"normalization.{kind}_min"], a[f"normalization.{kind}_max"]
        assert (hi > lo).all() and len(set((hi - lo).tolist())) == len(lo)


# ---------------------------------------- vision -----------------------------------------------


def test_preprocess_matches_direct_interpolate(ref, rng):
    frames = torch.from_numpy(rng.integers(0, 256, size=(2, 80, 96, 3), dtype=np.uint8))
    x = frames.permute(0, 3, 1, 2).float() / 255.0
    vb = {"input_shape": [3, 64, 72]}
    want = F.interpolate(x, size=(64, 72), mode="bilinear", align_corners=False)
    assert torch.equal(ref.preprocess(frames, vb), want)
    # center crop (torchvision rounding) then ImageNet statistics
    vb = {"input_shape": [3, 64, 72], "crop_shape": [57, 60], "image_normalization": "imagenet"}
    top, left = int(round((64 - 57) / 2.0)), int(round((72 - 60) / 2.0))
    crop = want[:, :, top:top + 57, left:left + 60]
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    got = ref.preprocess(frames, vb)
    assert got.shape == (2, 3, 57, 60)
    assert rel(got, (crop - mean) / std) <= 1e-6


def test_crop_sets_feature_map(ref, make_cfg):
    agent = ref.build_agent(make_cfg(crop_shape=[48, 48]))
    assert agent.vision_encoder.rgb_encoder.feature_shape == (512, 2, 2)
    assert agent.state_dict()["vision_encoder.rgb_encoder.pool.pos_grid"].shape == (4, 2)
    agent = ref.build_agent(make_cfg(vision_backbone={"input_shape": [3, 96, 128]}))
    assert agent.vision_encoder.rgb_encoder.feature_shape == (512, 3, 4)


def test_spatial_softmax_layout(ref, rng):
    pool = ref.SpatialSoftmax((6, 3, 4), 5)
    grid = pool.pos_grid
    assert grid.shape == (12, 2)
    for i in range(12):
        row, col = divmod(i, 4)
        assert abs(float(grid[i, 0]) - (-1 + 2 * col / 3)) < 1e-6 and abs(float(grid[i, 1]) - (-1 + row)) < 1e-6
    feat = torch.from_numpy(rng.normal(size=(2, 6, 3, 4)).astype(np.float32))
    with torch.no_grad():
        out = pool(feat)
        logits = F.conv2d(feat, pool.nets.weight, pool.nets.bias).flatten(2)
    p = torch.softmax(logits, -1)
    want_x = (p * grid[:, 0]).sum(-1)
    want_y = (p * grid[:, 1]).sum(-1)
    assert out.shape == (2, 5, 2)
    flat = out.reshape(2, 10)  # interleaved x0, y0, x1, y1, ...
    assert rel(flat[:, 0::2], want_x) <= 1e-5 and rel(flat[:, 1::2], want_y) <= 1e-5


def test_batchnorm_folds_into_conv(ref, small_agent, rng):
    """The converter folds eval BN into the conv: check the folding formula on the stem."""
    bb = small_agent.vision_encoder.rgb_encoder.backbone
    conv, bn = bb[0], bb[1]
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    x = torch.from_numpy(rng.normal(size=(2, 3, 64, 64)).astype(np.float32))
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    with torch.no_grad():
        want = bn(conv(x))
        got = F.conv2d(x, conv.weight * scale.view(-1, 1, 1, 1), bn.bias - bn.running_mean * scale, stride=2, padding=3)
    assert rel(got, want) <= 1e-5


def test_groupnorm_trunk(ref, make_cfg, small_agent, rng):
    agent = ref.randomize_(ref.build_agent(make_cfg(norm="gn")), 3)
    gns = [m for m in agent.vision_encoder.modules() if isinstance(m, nn.GroupNorm)]
    assert len(gns) == 20 and not any(isinstance(m, nn.BatchNorm2d) for m in agent.modules())
    assert all(m.num_groups == m.num_channels // 16 and m.eps == 1e-5 for m in gns)
    bb = agent.vision_encoder.rgb_encoder.backbone
    x = torch.from_numpy(rng.normal(size=(2, 3, 64, 64)).astype(np.float32))
    with torch.no_grad():
        y = bb[0](x)
        want = F.group_norm(y, 4, bb[1].weight, bb[1].bias, 1e-5)
        assert rel(bb[1](y), want) <= 1e-6
    qpos, images, _ = random_inputs(rng, agent.cfg, 1)
    assert rel(ref.predict(agent, qpos, images), ref.predict(small_agent, qpos, images)) > 1e-2


@pytest.mark.parametrize("separate", [False, True])
def test_tokens_per_camera(ref, make_cfg, small_agent, rng, separate):
    agent = ref.randomize_(ref.build_agent(make_cfg(separate_trunks=True)), 8) if separate else small_agent
    _, images, _ = random_inputs(rng, agent.cfg, 2)
    vb = agent.cfg["vision_backbone"]
    with torch.no_grad():
        tokens = agent.visual_tokens({c: torch.from_numpy(v) for c, v in images.items()})
        encs = agent.vision_encoder.rgb_encoder
        for i, cam in enumerate(agent.camera_names):
            enc = encs[i] if separate else encs
            alone = enc(ref.preprocess(torch.from_numpy(images[cam]), vb))
            assert rel(tokens[:, i], alone) <= 1e-6, cam
        if separate:
            other = encs[1](ref.preprocess(torch.from_numpy(images["l_vis"]), vb))
            assert rel(tokens[:, 0], other) > 1e-2
    assert (tokens >= 0).all() and (tokens > 0).float().mean() > 0.2  # ReLU, not dead


# ---------------------------------------- normalization ----------------------------------------


@pytest.mark.parametrize("kind", ["min_max", "mean_std"])
def test_normalization_formulas(ref, rng, kind):
    norm = ref.NormalizationModule(3, 3, kind)
    stats = {k: rng.uniform(0.2, 1.0, size=3).astype(np.float32) for k in ref.STAT_KEYS}
    stats["action_max"] = stats["action_min"] + np.array([0.5, 1e-12, 2.0], np.float32)  # one degenerate dim
    stats["action_std"][1] = 0.0
    norm.set_stats(stats)
    x = torch.from_numpy(rng.normal(size=(4, 3)).astype(np.float32))
    lo, hi = torch.from_numpy(stats["action_min"]), torch.from_numpy(stats["action_max"])
    if kind == "min_max":
        want = 2 * (x - lo) / torch.clamp(hi - lo, min=1e-8) - 1
    else:
        want = (x - torch.from_numpy(stats["action_mean"])) / torch.clamp(torch.from_numpy(stats["action_std"]), min=1e-8)
    got = norm.normalize_action(x)
    assert torch.isfinite(got).all() and rel(got, want) <= 1e-6
    ok = [0, 2]
    assert rel(norm.denormalize_action(got)[:, ok], x[:, ok]) <= 1e-5
    with pytest.raises(ValueError, match="shape"):
        norm.set_stats({**stats, "qpos_min": np.zeros(4, np.float32)})


# ---------------------------------------- episodes and CLI -------------------------------------


@pytest.mark.parametrize("gzip,chunked", [(False, True), (True, True), (False, False)])
def test_episode_layout(episode_factory, gzip, chunked):
    path = episode_factory(T=6, image_size=40, gzip=gzip, chunked=chunked, seed=3, obs_dim=16, action_dim=16)
    with h5py.File(path, "r") as f:
        assert f["action"].shape == (6, 16) and f["action"].dtype == np.float32
        assert f["observations/qpos"].shape == (6, 16) and f["observations/qpos"].dtype == np.float32
        assert set(f["observations/images"]) == {"l_vis", "r_vis", "front"}
        for cam in ("l_vis", "r_vis", "front"):
            ds = f["observations/images/" + cam]
            assert ds.shape == (6, 40, 40, 3) and ds.dtype == np.uint8
            assert ds.compression == ("gzip" if gzip else None)
            assert (ds.chunks is not None) == chunked
            img = ds[()]
            assert img.std() > 10 and (img[1:] != img[:-1]).any()
        q = f["observations/qpos"][()]
        assert np.abs(np.diff(q, axis=0)).max() < 0.5  # smooth
        assert np.abs(f["action"][()][:-1] - q[1:]).max() < 0.1  # actions lead qpos by a step


def test_episode_determinism(episode_factory, tmp_path):
    a = episode_factory(T=3, image_size=32, seed=9, dir=tmp_path / "a")
    b = episode_factory(T=3, image_size=32, seed=9, dir=tmp_path / "b")
    c = episode_factory(T=3, image_size=32, seed=10, dir=tmp_path / "c")
    with h5py.File(a) as fa, h5py.File(b) as fb, h5py.File(c) as fc:
        for k in ("action", "observations/qpos", "observations/images/front"):
            assert np.array_equal(fa[k][()], fb[k][()]) and not np.array_equal(fa[k][()], fc[k][()])


def test_cli_make_checkpoint_and_predict(ref, repo_root, tmp_path, episode_factory):
    tool = str(repo_root / "tools" / "act_reference.py")
    ckpt, cfg, stats = tmp_path / "m.pt", tmp_path / "m.yaml", tmp_path / "m.pkl"
    subprocess.run([sys.executable, tool, "make-checkpoint", "--out", str(ckpt), "--config", "small", "--norm", "gn",
                    "--normalization", "mean_std", "--seed", "6", "--stats-in", "pkl", "--stats-out", str(stats),
                    "--config-out", str(cfg)], check=True, capture_output=True)
    ep = episode_factory(T=5, seed=2)
    out = tmp_path / "pred.npy"
    subprocess.run([sys.executable, tool, "predict", "--ckpt", str(ckpt), "--config", str(cfg), "--stats", str(stats),
                    "--episode", str(ep), "--out", str(out), "--batch", "2"], check=True, capture_output=True)
    pred = np.load(out)
    agent = ref.load_checkpoint(str(ckpt), ref.load_config(str(cfg)), str(stats))
    assert agent.cfg["vision_backbone"]["use_group_norm"] and agent.cfg["normalization_type"] == "mean_std"
    with h5py.File(ep) as f:
        want = ref.predict(agent, f["observations/qpos"][()], {c: f["observations/images/" + c][()] for c in agent.camera_names})
    assert pred.shape == (5, 6, 4) and rel(pred, want) <= 1e-6


def test_shipped_configs(ref, repo_root):
    """tools/configs/*.yaml are the Hydra-resolved forms of FULL_CFG and SMALL_CFG."""
    def core(cfg):
        out = {k: v for k, v in cfg.items() if not k.startswith("_")}
        out["head"] = {k: v for k, v in cfg["head"].items() if not k.startswith("_")}
        out["vision_backbone"] = {k: v for k, v in cfg["vision_backbone"].items()
                                  if not k.startswith("_") and k not in ("num_cameras", "camera_names")}
        return out

    paper = ref._merge(ref.FULL_CFG, {"pred_horizon": 100, "num_action_steps": 50,
                                      "head": {"hidden_dim": 512, "dec_layers": 7, "dim_feedforward": 3200}})
    for name, want in (("act_resnet.yaml", ref.FULL_CFG), ("act_resnet_small.yaml", ref.SMALL_CFG),
                       ("act_chunk100.yaml", paper)):
        assert core(ref.resolve_config(ref.load_config(str(repo_root / "tools" / "configs" / name)))) == want, name
    bad = ref._merge(ref.SMALL_CFG, {"vision_backbone": {"camera_names": ["front", "l_vis", "r_vis"]}})
    with pytest.raises(ValueError, match="camera_names"):
        ref.resolve_config(bad)
