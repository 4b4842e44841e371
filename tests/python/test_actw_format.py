"""tools/actw.py against weights/FORMAT.md: byte layout read with independent struct offsets,
round trips (raw and zstd), the vectorized FNV-1a against the byte loop, and refusal of every
kind of damage the reader must catch (with the checksum recomputed where the damage would
otherwise only show as a checksum mismatch)."""

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import actw  # noqa: E402

P64 = 0x100000001B3


def fnv_loop(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * P64) & 0xFFFFFFFFFFFFFFFF
    return h


def random_tensors(rng):
    shapes = [(7,), (3, 5), (2, 3, 4), (4, 3, 2, 2), (1,), (33,)]
    return {f"t{i}.w": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}


def test_fnv1a64_matches_the_byte_loop(rng):
    assert actw.fnv1a64(b"") == 0xCBF29CE484222325
    assert actw.fnv1a64(b"a") == 0xAF63DC4C8601EC8C          # published FNV-1a 64 vectors
    assert actw.fnv1a64(b"foobar") == 0x85944171F73967E8
    for n in (1, 7, 8, 9, 63, 64, 65, 1000, 70001):
        data = rng.bytes(n)
        start = int(rng.integers(0, 2**63))
        assert actw.fnv1a64(data) == fnv_loop(data), n
        assert actw.fnv1a64(data, start) == fnv_loop(data, start), n


@pytest.mark.parametrize("compress", [None, "zstd"])
def test_round_trip_and_byte_layout(tmp_path, rng, compress):
    tensors = random_tensors(rng)
    meta = {"format": "actw", "arch": "act_resnet", "camera_names": "a,b", "norm.eps": "1e-08"}
    path = tmp_path / "m.actw"
    written = actw.write_actw(path, meta, tensors, compress=compress)
    got_meta, got, header = actw.read_actw(path)
    assert got_meta == meta
    assert list(got) == list(tensors)
    assert all(np.array_equal(got[k], tensors[k]) and got[k].dtype == np.float32 for k in tensors)
    assert header["checksum"] == written["checksum"]

    raw = path.read_bytes()
    (magic, version, endian, hsize, fsize, moff, msize, doff, n, data_off, dsize, ssize, comp,
     align, checksum) = struct.unpack_from("<4sIIIQQQQQQQQIIQ", raw, 0)
    assert (magic, version, endian, hsize, align) == (b"ACTW", 1, 0x01020304, 128, 64)
    assert fsize == len(raw) and moff == 128 and doff == moff + msize and n == len(tensors)
    assert data_off == -(-(doff + 128 * n) // 64) * 64 and data_off + ssize == fsize
    assert comp == (1 if compress else 0) and (compress or ssize == dsize)
    assert raw[96:128] == bytes(32)
    assert checksum == fnv_loop(raw[128:])
    assert raw[moff:doff].decode() == "".join(f"{k}={v}\n" for k, v in meta.items())
    spans = []
    for i, (name, a) in enumerate(tensors.items()):
        rec = raw[doff + 128 * i: doff + 128 * (i + 1)]
        assert rec[:64].rstrip(b"\0").decode() == name and rec[len(name)] == 0
        dtype, ndim = struct.unpack_from("<II", rec, 64)
        dims = struct.unpack_from("<4Q", rec, 72)
        off, nbytes = struct.unpack_from("<QQ", rec, 104)
        assert (dtype, ndim) == (0, a.ndim) and dims == a.shape + (0,) * (4 - a.ndim)
        assert off % 64 == 0 and nbytes == a.size * 4 and rec[120:] == bytes(8)
        spans.append((off, off + nbytes))
        if not compress:
            assert np.array_equal(np.frombuffer(raw, "<f4", a.size, data_off + off), a.ravel())
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])) and spans[-1][1] <= dsize


@pytest.mark.parametrize("tensors,needle", [
    ({"w": np.array([1.0, np.nan], np.float32)}, "holds NaN or Inf"),
    ({"w": np.array([np.inf], np.float32)}, "holds NaN or Inf"),
    ({"x" * 64: np.ones(2)}, "1..63 printable ASCII"),
    ({"bad name": np.ones(2)}, "printable ASCII"),
    ({"w": np.ones((1, 1, 1, 1, 2))}, "needs 1..4 dims"),
    ({"w": np.ones((0, 3))}, "needs 1..4 dims"),
    ({}, "0 tensors"),
])
def test_writer_refuses_what_the_format_forbids(tmp_path, tensors, needle):
    with pytest.raises(actw.ActwError) as e:
        actw.write_actw(tmp_path / "x.actw", {"format": "actw"}, tensors)
    assert needle in str(e.value)
    with pytest.raises(actw.ActwError):
        actw.write_actw(tmp_path / "y.actw", {"k": "two\nlines"}, {"w": np.ones(2)})


def _rewrite(path, edit):
    """Apply edit(bytearray) and recompute the checksum, so only the edited rule is broken."""
    buf = bytearray(path.read_bytes())
    edit(buf)
    struct.pack_into("<Q", buf, 88, fnv_loop(bytes(buf[128:])))
    path.write_bytes(bytes(buf))


def test_reader_refuses_damage(tmp_path, rng):
    tensors = random_tensors(rng)
    good = tmp_path / "good.actw"
    actw.write_actw(good, {"format": "actw"}, tensors)
    raw = good.read_bytes()
    h = actw.read_actw(good)[2]
    rec0, rec1 = h["dir_offset"], h["dir_offset"] + 128

    def case(name, edit=None, data=None, fix_checksum=True):
        p = tmp_path / f"{name}.actw"
        p.write_bytes(raw if data is None else data)
        if edit:
            if fix_checksum:
                _rewrite(p, edit)
            else:
                buf = bytearray(p.read_bytes())
                edit(buf)
                p.write_bytes(bytes(buf))
        with pytest.raises(actw.ActwError) as e:
            actw.read_actw(p)
        assert str(p) in str(e.value)
        return str(e.value)

    flip = bytearray(raw)
    flip[-5] ^= 0x10
    assert "checksum" in case("flip", data=bytes(flip))
    assert "file_size" in case("truncated", data=raw[:-64])
    assert "file_size" in case("trailing", data=raw + b"\0")
    assert "shorter than" in case("tiny", data=raw[:100])
    assert "magic" in case("magic", lambda b: b.__setitem__(slice(0, 4), b"ACTX"))
    assert "version" in case("version", lambda b: struct.pack_into("<I", b, 4, 2))
    assert "endian" in case("endian", lambda b: struct.pack_into("<I", b, 8, 0x04030201))
    assert "overlap" in case("overlap", lambda b: b.__setitem__(
        slice(rec1 + 104, rec1 + 112), b[rec0 + 104:rec0 + 112]))
    assert "unaligned or past" in case("unaligned", lambda b: struct.pack_into(
        "<Q", b, rec1 + 104, struct.unpack_from("<Q", b, rec1 + 104)[0] + 4))
    assert "nbytes" in case("nbytes", lambda b: struct.pack_into("<Q", b, rec0 + 112, 4))
    assert "dtype" in case("dtype", lambda b: struct.pack_into("<I", b, rec0 + 64, 1))
    assert "appears twice" in case("dup", lambda b: b.__setitem__(
        slice(rec1, rec1 + 64), b[rec0:rec0 + 64]))
    nan_at = h["data_offset"] + 64 * 2
    assert "NaN or Inf" in case("nan", lambda b: b.__setitem__(
        slice(nan_at, nan_at + 4), np.array([np.nan], "<f4").tobytes()))
    assert "is not key=value" in case("meta", lambda b: b.__setitem__(h["meta_offset"] + 6,
                                                                      ord(":")))


def test_an_atomic_replace_keeps_the_files_permissions_and_owner(tmp_path):
    """write_file_atomic replaces a file by renaming a new one over it: the new file takes the
    old one's permissions, and (run as root, which may set them) its owner and group, instead of
    becoming the converting user's with the umask's mode."""
    import os
    import stat
    path = tmp_path / "m.actw"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    owner = (os.getuid(), os.getgid())
    if os.geteuid() == 0:
        owner = (4321, 4322)
        os.chown(path, *owner)
    actw.write_file_atomic(str(path), [b"new ", b"model"])
    st = os.stat(path)
    assert path.read_bytes() == b"new model"
    assert stat.S_IMODE(st.st_mode) == 0o640 and (st.st_uid, st.st_gid) == owner, (oct(st.st_mode), st.st_uid, st.st_gid)
    assert [f.name for f in tmp_path.iterdir()] == ["m.actw"], "a temporary file was left behind"


@pytest.mark.parametrize("model, drop, key", [
    ("small_sep_gn.actw", "vision.norm", "vision.norm=batchnorm"),          # GroupNorm tensors
    ("small_sep_gn.actw", "vision.separate_trunks", "vision.separate_trunks=0"),
    ("small.actw", "vision.num_keypoints", "vision.num_keypoints=32"),
])
def test_a_file_whose_tensors_need_a_key_it_left_out_names_that_key(build_dir, act_infer, tmp_path, model, drop, key):
    """A third-party writer that leaves an optional metadata key out gets its default (FORMAT.md
    lists them); where the tensors do not fit that default, the loader used to name only the
    tensor it stopped at ('unknown tensor vision.0.conv1.gn.w'), not the key that explains it."""
    import subprocess
    src = build_dir / "testdata" / model
    if not src.exists():
        pytest.skip(f"{src} not made (ctest's make_testdata)")
    meta, tensors, _ = actw.read_actw(src)
    meta = {k: v for k, v in meta.items() if k != drop}
    out = tmp_path / "m.actw"
    actw.write_actw(out, meta, tensors)
    p = subprocess.run([str(act_infer), "info", "--model", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "leaves" in p.stderr and key in p.stderr, p.stderr


def test_the_loader_and_actw_py_take_the_same_metadata_and_names(build_dir, act_infer, tmp_path):
    """What FORMAT.md states, both readers enforce alike (a clean-room writer found them apart):
    metadata values are UTF-8 (the C loader took 0xff), numbers are decimal (it read ' 1e-05'
    and hex floats), tensor names have no space (it took 'a b'); actw.py's writer refuses keys
    and values the C loader refuses (it wrote 'k v=' and CR without complaint)."""
    import subprocess
    src = build_dir / "testdata" / "small.actw"
    if not src.exists():
        pytest.skip(f"{src} not made (ctest's make_testdata)")
    meta, tensors, _ = actw.read_actw(src)

    def refused(name, meta_over=None, edit=None, words=""):
        out = tmp_path / f"{name}.actw"
        actw.write_actw(out, {**meta, **(meta_over or {})}, tensors)
        if edit:
            _rewrite(out, edit)
        p = subprocess.run([str(act_infer), "info", "--model", str(out)], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode != 0 and words in p.stderr, (name, p.stderr)
        if edit:
            with pytest.raises(actw.ActwError):
                actw.read_actw(out)

    def patch(old, new):
        def edit(buf):
            i = bytes(buf).index(old)
            buf[i:i + len(new)] = new
        return edit

    refused("utf8", {"note": "XY"}, patch(b"note=XY", b"note=\xff\xfe"), "not UTF-8")
    # what FORMAT.md excludes beyond bytes that never occur: an overlong form, a surrogate, a
    # code point past U+10FFFF, a sequence cut short
    for name, bad in (("overlong", b"\xc0\xafAB"), ("surrogate", b"\xed\xa0\x80A"),
                      ("past_10ffff", b"\xf4\x90\x80\x80"), ("cut_short", b"\xe2\x82AB")):
        refused(name, {"note": "WXYZ"}, patch(b"note=WXYZ", b"note=" + bad), "not UTF-8")
    ok = tmp_path / "utf8_ok.actw"   # 4-byte and 2-byte sequences are text like any other
    actw.write_actw(ok, {**meta, "note": "robot \U0001f916 caf\u00e9"}, tensors)
    p = subprocess.run([str(act_infer), "info", "--model", str(ok)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert actw.read_actw(ok)[0]["note"] == "robot \U0001f916 caf\u00e9"
    refused("space_float", {"head.kl_weight": " 10"}, None, "is not a finite number")
    refused("hex_float", {"head.kl_weight": "0x1p3"}, None, "is not a finite number")
    refused("name_space", None, patch(b"head.cls_embed\0", b"head.cls embed\0"), "space or non-printable")
    for key, value in (("k v", "1"), ("k", "a\rb"), ("k", "a\0b")):
        with pytest.raises(actw.ActwError):
            actw.write_actw(tmp_path / "w.actw", {**meta, key: value}, tensors)
