#!/usr/bin/env python3
"""make_seeds.py - starting corpora for the fuzz targets (tests/fuzz/README.md), made fresh
rather than committed: they are valid inputs, not findings.

  /usr/bin/python3 tests/fuzz/make_seeds.py OUT_DIR [--model MODEL.actw ...]

Writes OUT_DIR/<target>/ for protocol, weights, json, episode and lzf:
  protocol  [mode byte][contract byte] + a valid frame header, HELLO or PREDICT payload (raw and
            zstd frames, with and without an action chunk) for both contracts of fuzz_protocol.c
  weights   tiny .actw files (raw and zstd) with the full metadata of a small model, and for
            every --model file the same file with its tensor data zeroed and zstd-compressed:
            a complete model in a few KB, so mutations reach the model binder (model.c)
  json      a valid eval summary (two episodes, one failed) and a few plain JSON documents
  episode   two episodes from tools/make_episodes.py for fuzz_episode.c's contract (raw and gzip),
            and the raw one again in uncompressed tiles of a resizable dataset; 80 frames appended
            one chunk each (a chunk index of two B-tree levels, which episode_index.c walks);
            h5py's lzf, and fletcher32 checksums on gzip tiles and on raw frames
  lzf       [room, 2 bytes little-endian] + LZF streams h5py's filter made of small frames (flat
            colours: runs of period 3; noise; a far repeat), each with its exact room
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import zstandard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import actw  # noqa: E402

# the two contracts of fuzz_protocol.c: (obs_dim, action_dim, horizon, cameras, h, w)
CONTRACTS = [(5, 4, 6, ["l_vis", "r_vis", "front"], 8, 6),
             (16, 16, 16, ["a_camera_name_of_31_characters_"], 4, 4)]


def name(s):
    b = s.encode()
    return struct.pack("<B", len(b)) + b


def predict(contract, rng, with_actions, zstd):
    obs, act, hor, cams, h, w = contract
    p = struct.pack("<QII", int(rng.integers(1 << 62)), 1 if with_actions else 0, obs)
    p += rng.uniform(-1, 1, obs).astype("<f4").tobytes() + struct.pack("<I", len(cams))
    for cam in cams:
        frame = rng.integers(0, 256, h * w * 3, dtype=np.uint8).tobytes()
        if zstd:
            frame = zstandard.ZstdCompressor(write_content_size=True).compress(frame)
        p += name(cam) + struct.pack("<BIII", 1 if zstd else 0, h, w, len(frame)) + frame
    if with_actions:
        p += struct.pack("<II", hor, act) + rng.uniform(-5, 5, hor * act).astype("<f4").tobytes()
        p += bytes([1 if t >= hor - 2 else 0 for t in range(hor)]) + struct.pack("<Q", 42)
    return p


def protocol_seeds(out, rng):
    seeds = {}
    for ci, c in enumerate(CONTRACTS):
        obs, act, hor, cams, h, w = c
        for typ, ln in ((1, 40), (3, 1234), (6, 8), (9, 0)):
            seeds[f"hdr_{ci}_{typ}"] = bytes([0, ci]) + b"ACTS" + struct.pack("<HHI", 1, typ, ln)
        hello = struct.pack("<IIIII", obs, act, h, w, len(cams)) + b"".join(name(x) for x in cams)
        seeds[f"hello_{ci}"] = bytes([1, ci]) + hello + name("fuzz-client")
        seeds[f"hello_any_{ci}"] = bytes([1, ci]) + struct.pack("<IIIII", 0, 0, 0, 0, 0) + name("")
        for mode in (2, 3):
            for wa in (0, 1):
                for z in (0, 1):
                    seeds[f"predict_{mode}_{ci}_{wa}{z}"] = bytes([mode, ci]) + predict(c, rng, wa, z)
    write_all(os.path.join(out, "protocol"), seeds)


SMALL_META = {
    "format": "actw", "arch": "act_resnet", "converter_version": "0.1.0", "source_sha256": "0" * 64,
    "obs_dim": 5, "action_dim": 4, "pred_horizon": 6, "obs_horizon": 1, "num_action_steps": 3,
    "camera_names": "l_vis,r_vis,front", "image_height": 80, "image_width": 80,
    "vision.input_height": 64, "vision.input_width": 64, "vision.crop_height": 0, "vision.crop_width": 0,
    "vision.imagenet_norm": 0, "vision.norm": "batchnorm", "vision.separate_trunks": 0,
    "vision.num_keypoints": 8, "vision.output_dim": 16, "vision.feature_height": 2,
    "vision.feature_width": 2, "head.hidden_dim": 32, "head.nheads": 4, "head.enc_layers": 2,
    "head.dec_layers": 2, "head.dim_feedforward": 64, "head.latent_dim": 8, "head.activation": "gelu",
    "head.kl_weight": 10, "head.layer_norm_eps": 1e-05, "norm.type": "min_max", "norm.eps": 1e-08,
}


def weights_seeds(out, rng, models):
    d = os.path.join(out, "weights")
    os.makedirs(d, exist_ok=True)
    tiny = {"head.cls_embed": rng.standard_normal(32), "norm.qpos.min": -np.ones(5),
            "norm.qpos.max": np.ones(5), "head.query": rng.standard_normal((6, 32))}
    actw.write_actw(os.path.join(d, "tiny_raw.actw"), SMALL_META, tiny)
    actw.write_actw(os.path.join(d, "tiny_zstd.actw"), SMALL_META, tiny, compress="zstd")
    for path in models:
        meta, tensors, _ = actw.read_actw(path)
        zeros = {k: np.zeros(v.shape, np.float32) for k, v in tensors.items()}
        base = os.path.splitext(os.path.basename(path))[0]
        actw.write_actw(os.path.join(d, base + "_zeros_zstd.actw"), meta, zeros, compress="zstd")


def summary():
    ep = lambda i, st: {"name": f"episode_{i}.hdf5", "index": i, "steps": 40, "status": st,
                        **({"error": "episode_1.hdf5: missing dataset 'action'"} if st != "ok" else
                           {"sums": {"l1": 12.5, "sq": 3.25, "count": 960, "val_l1": 7.0, "kl": 0.5,
                                     "kl_count": 40, "joint_l1": [1.5, 2.5, 3.5, 5.0]}})}
    return {"format": "act-eval-summary", "version": 1, "model_hash": "0123456789abcdef",
            "device": "cpu", "precision": "fp32", "device_name": "x86-64", "kl_weight": 10.0,
            "action_dim": 4, "pred_horizon": 6, "num_cams": 3, "shard_count": 2, "shards": [0, 1],
            "overall": {"timesteps": 40, "throughput": {"elapsed_s": 1.25, "elapsed_max_s": 0.75,
                                                        "steady_s": 0.5, "steady_timesteps": 24,
                                                        "padded_rows": 3}},
            "episodes": [ep(0, "ok"), ep(1, "failed")]}


def json_seeds(out):
    seeds = {"summary": json.dumps(summary(), indent=1).encode(),
             "values": b'[1, -2.5e-3, "a\\u00e9\\n\\"", true, false, null, {}, [], {"k": [0.1]}, NaN]',
             "nested": b'{"a": {"b": [[[{"c": "\\ud83d"}]]]}}'}
    write_all(os.path.join(out, "json"), seeds)


def episode_seeds(out):
    d = os.path.join(out, "episode")
    with tempfile.TemporaryDirectory() as tmp:
        for extra in ([], ["--gzip"]):
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_episodes.py"), "--out", tmp,
                            "--episodes", "1", "--T", "3", "--image-size", "4", "--cameras", "front",
                            "--obs-dim", "3", "--action-dim", "2", "--seed", "1"] + extra, check=True,
                           stdout=subprocess.DEVNULL)
            os.makedirs(d, exist_ok=True)
            os.replace(os.path.join(tmp, "episode_0.hdf5"),
                       os.path.join(d, "episode" + ("_gzip" if extra else "") + ".hdf5"))
    # the same frames appended to a resizable dataset, uncompressed: h5py stores those in tiles,
    # here (2, 2, 2, 1), which the pool copies into place (episode_inflate.c, raw tiles)
    import h5py
    raw = os.path.join(d, "episode_raw_tiles.hdf5")
    shutil.copyfile(os.path.join(d, "episode.hdf5"), raw)
    with h5py.File(raw, "r+") as f:
        frames = f["observations/images/front"][()]
        del f["observations/images/front"]
        f.create_dataset("observations/images/front", data=frames, maxshape=(None,) + frames.shape[1:],
                         chunks=(2, 2, 2, 1))
    # the same frames with h5py's own lzf filter (engine/episode_lzf.c decodes it), whole frames and
    # shuffle, repeated 4 times so lzf has repeats to find (a chunk it cannot shrink is stored raw)
    with h5py.File(os.path.join(d, "episode_lzf.hdf5"), "w") as f:
        f["action"] = np.zeros((6, 2), np.float32) + 0.5
        f["observations/qpos"] = np.zeros((6, 3), np.float32) - 0.25
        f.create_dataset("observations/images/front", data=np.concatenate([frames, frames]).repeat(2, 0)[:6],
                         chunks=(2, 4, 4, 3), compression="lzf", shuffle=True)
    # the same frames with fletcher32 checksums (engine/episode_fletcher.c checks them on the pool):
    # gzip + shuffle tiles, and raw whole frames
    for name, kw in (("episode_fletcher_gzip.hdf5", dict(chunks=(2, 2, 4, 3), compression="gzip", shuffle=True)),
                     ("episode_fletcher_raw.hdf5", dict(chunks=(1, 4, 4, 3)))):
        with h5py.File(os.path.join(d, name), "w") as f:
            f["action"] = np.zeros((6, 2), np.float32) + 0.5
            f["observations/qpos"] = np.zeros((6, 3), np.float32) - 0.25
            f.create_dataset("observations/images/front", data=np.concatenate([frames, frames])[:6],
                             fletcher32=True, **kw)
    # 80 frames appended one chunk each: HDF5's nodes hold 64 chunks, so the index has two levels
    # (episode_index.c reads it from the file: its own parser of untrusted bytes)
    rng = np.random.default_rng(3)
    with h5py.File(os.path.join(d, "episode_btree.hdf5"), "w") as f:
        f["action"] = rng.standard_normal((80, 2)).astype(np.float32)
        f["observations/qpos"] = rng.standard_normal((80, 3)).astype(np.float32)
        ds = f.create_dataset("observations/images/front", (0, 4, 4, 3), maxshape=(None, 4, 4, 3), dtype=np.uint8,
                              chunks=(1, 4, 4, 3))
        for t in range(80):
            ds.resize(t + 1, axis=0)
            ds[t] = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    # the same, written with libver="latest" (as SWMR recorders do): layout version 4, an
    # extensible array index, whose layout message the walk in episode_index.c parses to tell it
    # (with HDF5 1.10), and qpos/action chunked a row each
    with h5py.File(os.path.join(d, "episode_v4.hdf5"), "w", libver="latest") as f:
        for name, width in (("action", 2), ("observations/qpos", 3)):
            f.create_dataset(name, data=rng.standard_normal((40, width)).astype(np.float32), chunks=(1, width),
                             maxshape=(None, width))
        ds = f.create_dataset("observations/images/front", (0, 4, 4, 3), maxshape=(None, 4, 4, 3), dtype=np.uint8,
                              chunks=(1, 4, 4, 3))
        for t in range(40):
            ds.resize(t + 1, axis=0)
            ds[t] = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)


def lzf_seeds(out):
    import h5py
    rng = np.random.default_rng(5)
    flat = np.zeros((16, 16, 3), np.uint8) + np.array([200, 40, 40], np.uint8)
    flat[8:] = (40, 160, 60)
    noisy = flat.copy()   # noise on a quarter of it (all noise would not shrink: stored raw)
    noisy[:4] = np.clip(flat[:4].astype(int) + rng.integers(-6, 7, flat[:4].shape), 0, 255)
    far = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    far[8:] = far[:8]
    seeds = {}
    with tempfile.TemporaryDirectory() as tmp:
        with h5py.File(os.path.join(tmp, "lzf.hdf5"), "w") as f:
            for name, img in (("flat", flat), ("noisy", noisy), ("far", far)):
                ds = f.create_dataset(name, data=img[None], chunks=(1, 16, 16, 3), compression="lzf")
                mask, stored = ds.id.read_direct_chunk((0, 0, 0, 0))
                assert mask == 0, name   # compressed, not stored raw
                seeds[name] = struct.pack("<H", img.nbytes) + stored
    write_all(os.path.join(out, "lzf"), seeds)


def write_all(d, seeds):
    os.makedirs(d, exist_ok=True)
    for k, v in seeds.items():
        with open(os.path.join(d, k), "wb") as f:
            f.write(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--model", action="append", default=[], help="a real .actw to zero and compress")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    protocol_seeds(a.out, rng)
    weights_seeds(a.out, rng, a.model)
    json_seeds(a.out)
    episode_seeds(a.out)
    lzf_seeds(a.out)
    for t in sorted(os.listdir(a.out)):
        files = os.listdir(os.path.join(a.out, t))
        print(f"{t}: {len(files)} seeds, {sum(os.path.getsize(os.path.join(a.out, t, f)) for f in files)} bytes")


if __name__ == "__main__":
    main()
