"""actw.py - read and write .actw weight files (the format is weights/FORMAT.md, version 1).

defines: write_actw, read_actw, fnv1a64, ActwError

The converter writes with write_actw(); tests read its output back with read_actw(), which checks
every rule FORMAT.md states (the same rules the C loader enforces), so a converter bug shows up
here before it reaches the engine. numpy only; zstandard only for compressed files.

FNV-1a 64 over tens of megabytes is too slow byte by byte in Python (~0.12 s/MB), so fnv1a64()
uses an exact vectorized form: with l_i the low byte of the running hash h_i and
d_i = (l_i ^ b_i) - l_i, the recurrence h_{i+1} = (h_i ^ b_i) * P becomes
h_{i+1} = P*h_i + P*d_i (mod 2^64), so h_n = P^n h_0 + sum_i P^(n-i) d_i (a uint64 dot product).
The low bytes follow l_{i+1} = (l_i ^ b_i) * P mod 256, where bit j of the product depends only
on bits <= j of l_i ^ b_i. So eight passes, each one prefix-xor over the data, each make one more
bit of every l_i right: 20-50x faster than the byte loop, and exact (tests check it).
"""

import os
import stat
import struct
import tempfile

import numpy as np

MAGIC = b"ACTW"
VERSION = 1
ENDIAN_TAG = 0x01020304
HEADER_SIZE = 128
DIR_ENTRY_SIZE = 128
ALIGN = 64
NAME_MAX = 64
MAX_DIMS = 4
MAX_TENSORS = 65536
MAX_META_BYTES = 1 << 20
COMPRESSION = {None: 0, "zstd": 1}

FNV_INIT = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_M64 = (1 << 64) - 1
_BLOCK = 1 << 16        # bytes hashed per vectorized step (fits in L2)
_POWERS = None          # P^BLOCK .. P^1 as uint64, built on first use

# header: magic, version, endian, header_size, file_size, meta_offset, meta_size, dir_offset,
# n_tensors, data_offset, data_size, stored_size, compression, alignment, checksum, reserved
_HEADER = struct.Struct("<4sIII QQQQ QQQQ II Q 32s")
# directory record: name, dtype, ndim, dims[4], offset, nbytes, reserved
_RECORD = struct.Struct("<64sII4QQQ8s")
assert _HEADER.size == HEADER_SIZE and _RECORD.size == DIR_ENTRY_SIZE


class ActwError(ValueError):
    """A file that breaks a rule of weights/FORMAT.md, or a tensor set that cannot be written."""


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _prefix_xor(t, start):
    """out[i] = start ^ t[0] ^ ... ^ t[i] for a uint8 array: xor-shifts inside 8-byte words, then
    one short accumulate over the words' totals."""
    n = t.size
    w = np.zeros((n + 7) // 8, "<u8")
    w.view(np.uint8)[:n] = t
    for s in (8, 16, 32):
        w ^= w << np.uint64(s)
    carry = np.bitwise_xor.accumulate((w >> np.uint64(56)).astype(np.uint8))
    carry[1:] = carry[:-1]
    carry[0] = 0
    carry ^= np.uint8(start)
    w ^= carry.astype("<u8") * np.uint64(0x0101010101010101)
    return w.view(np.uint8)[:n]


def fnv1a64(data, h=FNV_INIT):
    """FNV-1a 64 of a bytes-like object, continuing from h (see the module comment). Works in
    blocks that stay in cache; each block continues from the hash of the ones before."""
    global _POWERS
    if _POWERS is None:
        _POWERS = np.cumprod(np.full(_BLOCK, FNV_PRIME, dtype=np.uint64))[::-1].copy()
    b = np.frombuffer(data, np.uint8)
    for start in range(0, b.size, _BLOCK):
        h = _fnv_block(b[start:start + _BLOCK], h)
    return h


def _fnv_block(b, h):
    n = b.size
    l0 = h & 0xFF
    low = np.full(n, l0, np.uint8)       # l_i; pass j makes bit j right for every i
    x = np.empty(n, np.uint8)
    t = np.empty(n, np.uint8)
    for _ in range(8):
        np.bitwise_xor(low, b, out=x)
        np.multiply(x, np.uint8(FNV_PRIME & 0xFF), out=t)   # l_{i+1} = x_i * P mod 256
        t ^= low                                             # = l_i ^ t_i
        low[1:] = _prefix_xor(t, l0)[:-1]
    np.bitwise_xor(low, b, out=x)
    d = np.subtract(x, low, dtype=np.int64).view(np.uint64)
    return (h * pow(FNV_PRIME, n, 1 << 64) + int(np.dot(d, _POWERS[_BLOCK - n:]))) & _M64


def _meta_entry_error(key, value):
    """Why key=value is not a metadata line the C loader (engine/weights.c) takes, or None:
    a key is printable ASCII without spaces or '=', a value has no control character but tab."""
    if not key or "=" in key or not all("\x21" <= ch <= "\x7e" for ch in key):
        return "a key is non-empty printable ASCII without spaces or '='"
    if any(ch < " " and ch != "\t" for ch in value):
        return "a value has no control character but tab (no newline, CR or NUL)"
    return None


def _format_meta(meta):
    lines = []
    for key, value in meta.items():
        key, value = str(key), str(value)
        why = _meta_entry_error(key, value)
        if why:
            raise ActwError(f"metadata entry {key!r}={value!r}: {why}")
        lines.append(f"{key}={value}\n")
    text = "".join(lines).encode("utf-8")
    if len(text) > MAX_META_BYTES:
        raise ActwError(f"metadata is {len(text)} bytes, the limit is {MAX_META_BYTES}")
    return text


def write_actw(path, meta, tensors, compress=None):
    """Write meta (dict, insertion order kept) and tensors (dict name -> array, directory order
    = insertion order) to path. Every tensor is stored as float32 and must be finite.
    Returns the header fields as a dict (checksum = the model hash)."""
    if compress not in COMPRESSION:
        raise ActwError(f"unknown compression {compress!r} (expected None or 'zstd')")
    if not 1 <= len(tensors) <= MAX_TENSORS:
        raise ActwError(f"{len(tensors)} tensors: a file holds 1..{MAX_TENSORS}")
    meta_bytes = _format_meta(meta)
    records, chunks, offset = [], [], 0
    for name, arr in tensors.items():
        raw = name.encode("ascii", "replace")
        if not raw or len(raw) >= NAME_MAX or not all(0x20 < c < 0x7F for c in raw):
            raise ActwError(f"tensor name {name!r}: must be 1..{NAME_MAX - 1} printable ASCII "
                            f"characters without spaces")
        a = np.ascontiguousarray(np.asarray(arr, dtype=np.float32))
        if not 1 <= a.ndim <= MAX_DIMS or a.size == 0:
            raise ActwError(f"tensor '{name}' has shape {list(a.shape)}: needs 1..{MAX_DIMS} "
                            f"dims, each >= 1")
        if not np.isfinite(a).all():
            raise ActwError(f"tensor '{name}' holds NaN or Inf")
        dims = list(a.shape) + [0] * (MAX_DIMS - a.ndim)
        records.append(_RECORD.pack(raw, 0, a.ndim, *dims, offset, a.nbytes, bytes(8)))
        data = a.astype("<f4", copy=False).tobytes()
        chunks.append(data + bytes(_align(len(data)) - len(data)))
        offset += _align(a.nbytes)
    data = b"".join(chunks)
    stored = data
    if compress == "zstd":
        import zstandard
        stored = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(data)
        if len(data) > 64 * len(stored) + (1 << 20):   # readers refuse more than 64:1: mostly zeros,
            stored, compress = data, None              # stored raw instead (FORMAT.md)
    meta_offset = HEADER_SIZE
    dir_offset = meta_offset + len(meta_bytes)
    dir_end = dir_offset + DIR_ENTRY_SIZE * len(records)
    data_offset = _align(dir_end)
    body = meta_bytes + b"".join(records) + bytes(data_offset - dir_end) + stored
    header = dict(file_size=HEADER_SIZE + len(body), meta_offset=meta_offset,
                  meta_size=len(meta_bytes), dir_offset=dir_offset, n_tensors=len(records),
                  data_offset=data_offset, data_size=len(data), stored_size=len(stored),
                  compression=COMPRESSION[compress], alignment=ALIGN, checksum=fnv1a64(body))
    head = _HEADER.pack(MAGIC, VERSION, ENDIAN_TAG, HEADER_SIZE, header["file_size"],
                        meta_offset, header["meta_size"], dir_offset, header["n_tensors"],
                        data_offset, header["data_size"], header["stored_size"],
                        header["compression"], ALIGN, header["checksum"], bytes(32))
    write_file_atomic(path, (head, body))
    return header


def _write_in_place(path, parts):
    try:
        with open(path, "wb") as f:
            for p in parts:
                f.write(p)
    except OSError as e:
        raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from None


def write_file_atomic(path, parts):
    """Writes the byte strings `parts` to path as a whole or not at all: into a temporary file
    beside it, synced, then renamed over it, so a full disk, a signal or a crash leaves the old
    file as it was (and no half file). A symbolic link is followed (its target is replaced, the
    link kept). Written in place, as a plain open would: a path that is not a regular file
    (/dev/null, /dev/stdout, a FIFO) and an existing writable file in a folder that takes no new
    file. A replaced file keeps its permissions, and its owner and group where the user may set
    them (root); a hard link to it keeps the old contents, as with any atomic replace. An OSError
    names the path."""
    # /dev/stdout is a link to /proc/self/fd/1 and /dev/fd/N lies in /proc: whatever that
    # descriptor is (a pipe, a tty, the file a shell redirected it to) is written, not replaced
    parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    if parent == "/proc" or parent.startswith("/proc/") or \
            (os.path.islink(path) and os.readlink(path).startswith("/proc/")):
        return _write_in_place(path, parts)
    target = os.path.realpath(path) if os.path.islink(path) else path
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        return _write_in_place(path, parts)
    folder = os.path.dirname(os.path.abspath(target))
    if st is not None and not os.access(folder, os.W_OK | os.X_OK) and os.access(target, os.W_OK):
        return _write_in_place(target, parts)
    try:   # the name kept short: NAME_MAX counts the prefix and suffix too
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(target)[:64] + ".", suffix=".tmp", dir=folder)
    except OSError as e:
        raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            for p in parts:
                f.write(p)
            f.flush()
            os.fsync(f.fileno())
        if st is not None:
            mode = stat.S_IMODE(st.st_mode)   # the file it replaces keeps its permissions
            try:   # and its owner and group where this user may give them (root; a group of ours)
                os.chown(tmp, st.st_uid, st.st_gid)
            except OSError:
                pass
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from None
        raise


def _parse_header(path, buf):
    if len(buf) < HEADER_SIZE:
        raise ActwError(f"{path}: file is {len(buf)} bytes, shorter than the {HEADER_SIZE}-byte "
                        f"header")
    f = _HEADER.unpack_from(buf, 0)
    keys = ("magic", "version", "endian", "header_size", "file_size", "meta_offset", "meta_size",
            "dir_offset", "n_tensors", "data_offset", "data_size", "stored_size", "compression",
            "alignment", "checksum", "reserved")
    h = dict(zip(keys, f))
    n = h["n_tensors"]
    expect = [
        ("magic", h["magic"] == MAGIC, f"{h['magic']!r}, expected {MAGIC!r}"),
        ("version", h["version"] == VERSION, f"{h['version']}, expected {VERSION}"),
        ("endian", h["endian"] == ENDIAN_TAG, f"{h['endian']:#x}, expected {ENDIAN_TAG:#x}"),
        ("header_size", h["header_size"] == HEADER_SIZE, f"{h['header_size']}"),
        ("file_size", h["file_size"] == len(buf),
         f"{h['file_size']}, but the file has {len(buf)} bytes"),
        ("meta_offset", h["meta_offset"] == HEADER_SIZE, f"{h['meta_offset']}"),
        ("meta_size", h["meta_size"] <= MAX_META_BYTES, f"{h['meta_size']}"),
        ("dir_offset", h["dir_offset"] == h["meta_offset"] + h["meta_size"], f"{h['dir_offset']}"),
        ("n_tensors", 1 <= n <= MAX_TENSORS, f"{n}"),
        ("data_offset", h["data_offset"] == _align(h["dir_offset"] + DIR_ENTRY_SIZE * n),
         f"{h['data_offset']}"),
        ("compression", h["compression"] in (0, 1), f"{h['compression']}"),
        ("alignment", h["alignment"] == ALIGN, f"{h['alignment']}"),
        ("stored_size", h["data_offset"] + h["stored_size"] == h["file_size"]
         and (h["compression"] != 0 or h["stored_size"] == h["data_size"]),
         f"{h['stored_size']} (data_offset {h['data_offset']}, data_size {h['data_size']}, "
         f"file_size {h['file_size']})"),
        ("reserved", h["reserved"] == bytes(32), "not zero"),
    ]
    for field, ok, got in expect:
        if not ok:
            raise ActwError(f"{path}: header field {field} is {got}")
    return h


def _parse_meta(path, text):
    try:
        text = text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ActwError(f"{path}: metadata is not UTF-8 ({e})") from None
    if text and not text.endswith("\n"):
        raise ActwError(f"{path}: metadata does not end with a newline")
    meta = {}
    for i, line in enumerate(text.split("\n")[:-1], 1):
        key, sep, value = line.partition("=")
        if not sep or not key:
            raise ActwError(f"{path}: metadata line {i} {line!r} is not key=value")
        why = _meta_entry_error(key, value)
        if why:
            raise ActwError(f"{path}: metadata line {i} {line!r}: {why}")
        if key in meta:
            raise ActwError(f"{path}: metadata key '{key}' appears twice")
        meta[key] = value
    return meta


def read_actw(path, verify_checksum=True):
    """Read and fully validate an .actw file.
    Returns (meta dict, {name: float32 array} in directory order, header dict)."""
    with open(path, "rb") as f:
        buf = f.read()
    h = _parse_header(path, buf)
    if verify_checksum:
        got = fnv1a64(memoryview(buf)[HEADER_SIZE:])
        if got != h["checksum"]:
            raise ActwError(f"{path}: checksum is {got:016x}, the header says "
                            f"{h['checksum']:016x} (the file is corrupt)")
    meta = _parse_meta(path, buf[h["meta_offset"]:h["dir_offset"]])
    stored = buf[h["data_offset"]:]
    if h["compression"] == 1:
        import zstandard
        try:
            data = zstandard.ZstdDecompressor().decompress(stored, max_output_size=h["data_size"])
        except zstandard.ZstdError as e:
            raise ActwError(f"{path}: zstd data section does not inflate ({e})") from None
        if len(data) != h["data_size"]:
            raise ActwError(f"{path}: zstd data inflates to {len(data)} bytes, header data_size "
                            f"is {h['data_size']}")
    else:
        data = stored
    for i in range(h["dir_offset"] + DIR_ENTRY_SIZE * h["n_tensors"], h["data_offset"]):
        if buf[i]:
            raise ActwError(f"{path}: padding before the data section is not zero")
    tensors, spans = {}, []
    for i in range(h["n_tensors"]):
        rec = _RECORD.unpack_from(buf, h["dir_offset"] + i * DIR_ENTRY_SIZE)
        raw_name, dtype, ndim, dims, off, nbytes, reserved = (rec[0], rec[1], rec[2], rec[3:7],
                                                              rec[7], rec[8], rec[9])
        name_b, nul, pad = raw_name.partition(b"\0")
        where = f"{path}: directory record {i}"
        if not nul or pad.strip(b"\0") or not name_b or not all(0x20 < c < 0x7F for c in name_b):
            raise ActwError(f"{where}: name {raw_name!r} is not NUL-terminated printable ASCII")
        name = name_b.decode("ascii")
        where = f"{path}: tensor '{name}'"
        if name in tensors:
            raise ActwError(f"{where} appears twice in the directory")
        if dtype != 0:
            raise ActwError(f"{where}: dtype {dtype}, expected 0 (float32)")
        if not 1 <= ndim <= MAX_DIMS or any(d < 1 for d in dims[:ndim]) or any(dims[ndim:]):
            raise ActwError(f"{where}: ndim {ndim} with dims {list(dims)}")
        numel = int(np.prod(dims[:ndim], dtype=np.int64))
        if nbytes != numel * 4:
            raise ActwError(f"{where}: nbytes {nbytes}, expected {numel * 4} for dims "
                            f"{list(dims[:ndim])}")
        if off % ALIGN or off + nbytes > h["data_size"]:
            raise ActwError(f"{where}: offset {off} (nbytes {nbytes}) is unaligned or past "
                            f"data_size {h['data_size']}")
        if reserved != bytes(8):
            raise ActwError(f"{where}: reserved bytes are not zero")
        a = np.frombuffer(data, "<f4", count=numel, offset=off).reshape(dims[:ndim])
        if not np.isfinite(a).all():
            raise ActwError(f"{where} holds NaN or Inf")
        tensors[name] = a.astype(np.float32)
        spans.append((off, off + nbytes, name))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise ActwError(f"{path}: tensors '{a}' and '{b}' overlap in the data section")
    packed = sum(_align(e - s) for s, e, _ in spans)
    if h["data_size"] > packed:
        raise ActwError(f"{path}: data_size {h['data_size']} exceeds the tensors' {packed} bytes "
                        f"(each padded to {ALIGN}): the file holds data no tensor reads")
    return meta, tensors, h
