"""torch_zip.py - read torch.save checkpoints and pickled stats without torch and without running
any code from the file.

defines: load_torch_zip, load_pickle, LazyTensor, CheckpointError

A torch.save zip archive is `<name>/data.pkl` (a pickle whose tensors point at storages through
persistent ids ('storage', storage_type, key, location, numel)) plus one raw little-endian
record `<name>/data/<key>` per storage. torch 2.x adds `<name>/byteorder` and
`<name>/.data/serialization_id`; the top folder name varies, so it is found, not assumed.

Unpickling is restricted: find_class() hands out only local stand-ins (tensor rebuilders that
build numpy views of the storage records, storage-type markers) and a few harmless constructors
(OrderedDict, numpy array/dtype/scalar rebuilders, latin-1 byte decoding, torch.Size as a tuple,
torch dtypes as markers). Any other global - os.system, builtins.eval, a class of the training
code - is refused with an error naming it, so nothing in the file ever executes; except where such
globals sit only in top-level entries the converter never reads (a date, the run's argparse
Namespace): those entries are left out, each named in `skipped`, the caller's list. Tensors stay
lazy until asked for, so optimizer state in the same checkpoint costs nothing. Records are checked
against their declared sizes before they are read (a storage record is stored, not compressed, and
holds exactly its elements), so a small file cannot make the reader inflate gigabytes.
"""

import _compat_pickle
import collections
import io
import math
import pickle
import sys
import zipfile
import zlib

import numpy as np


MAX_EXPANDED = 1 << 26   # elements a stride-0 (expanded) tensor may unfold to
# bytes of a pickle (a checkpoint's data.pkl is KB to a few MB, more with inline numpy data; a
# stats file's KB): unpickling costs up to ~75 bytes of memory per byte of pickle
MAX_PICKLE = 1 << 30   # (a compressed record is refused, so this costs its size on disk)


class CheckpointError(ValueError):
    """A checkpoint or stats file that cannot be read safely or correctly."""


class _StandIn:
    """Objects this module hands to the unpickler; a pickle may not set their state (BUILD)."""

    def __setstate__(self, state):
        raise CheckpointError(f"the pickle tries to set the state of a {type(self).__name__}")


class _StorageType(_StandIn):
    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype


_STORAGE_TYPES = {n: _StorageType(n, d) for n, d in {
    "FloatStorage": "f4", "DoubleStorage": "f8", "HalfStorage": "f2", "BFloat16Storage": "bf16",
    "LongStorage": "i8", "IntStorage": "i4", "ShortStorage": "i2", "CharStorage": "i1",
    "ByteStorage": "u1", "BoolStorage": "?", "UntypedStorage": "u1"}.items()}


class _Storage(_StandIn):
    def __init__(self, archive, key, stype, numel):
        self.archive, self.key, self.stype, self.numel = archive, key, stype, numel
        self._array = None

    def array(self):
        if self._array is None:
            self._array = self.archive.storage_array(self.key, self.stype, self.numel)
        return self._array


class LazyTensor(_StandIn):
    """A tensor rebuilt from the checkpoint: shape now, data (numpy) on demand."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset = storage, int(offset)
        self.shape, self.stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
        if len(self.shape) != len(self.stride) or any(s < 0 for s in self.shape + self.stride) \
                or self.offset < 0:
            raise CheckpointError(f"tensor in storage '{storage.key}' has size {list(self.shape)}, "
                                  f"stride {list(self.stride)}, offset {self.offset}")
        # more elements than the storage is fine (x.expand() saves stride 0), but numpy() makes
        # them real: a bound keeps a hostile file from asking for terabytes
        if math.prod(self.shape) > max(storage.numel, MAX_EXPANDED):
            raise CheckpointError(f"tensor of size {list(self.shape)} repeats its storage "
                                  f"'{storage.key}' ({storage.numel} elements) beyond "
                                  f"{MAX_EXPANDED} elements")
        if all(self.shape):
            last = self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.stride))
            if last >= storage.numel:
                raise CheckpointError(f"tensor of size {list(self.shape)} (stride "
                                      f"{list(self.stride)}, offset {self.offset}) reaches element "
                                      f"{last} of storage '{storage.key}' with {storage.numel}")

    @property
    def dtype(self):
        return self.storage.stype.dtype

    def numpy(self):
        """The values as a fresh C-contiguous array; floating types become float32."""
        base = self.storage.array()
        item = base.itemsize
        view = np.lib.stride_tricks.as_strided(
            base[self.offset:], shape=self.shape, strides=[s * item for s in self.stride],
            writeable=False)
        a = np.array(view)
        if self.dtype == "bf16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        if a.dtype.kind == "f":
            return a.astype(np.float32)
        return a


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
    if not isinstance(storage, _Storage):
        raise CheckpointError(f"_rebuild_tensor_v2 got {type(storage).__name__}, not a storage")
    return LazyTensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, state=None):
    if not isinstance(data, LazyTensor):
        raise CheckpointError(f"_rebuild_parameter got {type(data).__name__}, not a tensor")
    return data


def _np_reconstruct(subtype, shape, dtype):
    if subtype is not np.ndarray:
        raise CheckpointError("numpy _reconstruct of a type other than numpy.ndarray")
    return np.ndarray.__new__(np.ndarray, shape, dtype)


def _np_dtype(spec, align=False, copy=False):
    if not isinstance(spec, str):
        raise CheckpointError(f"numpy dtype from {type(spec).__name__}, expected a string")
    dt = np.dtype(spec, align, copy)
    if dt.hasobject:
        raise CheckpointError(f"numpy dtype {spec!r} holds Python objects")
    return dt


def _np_scalar(dtype, raw=None):
    if not isinstance(dtype, np.dtype) or dtype.hasobject or not isinstance(raw, bytes):
        raise CheckpointError("numpy scalar without a plain dtype and raw bytes")
    return np.frombuffer(raw, dtype, count=1)[0]


def _np_frombuffer(buf, dtype, shape, order):
    if not isinstance(dtype, np.dtype) or dtype.hasobject:
        raise CheckpointError("numpy _frombuffer without a plain dtype")
    return np.frombuffer(bytes(buf), dtype).reshape(shape, order=order).copy()


class _TorchDtype(_StandIn):
    """torch.float32 and the like (a checkpoint's metadata): a marker, never a computation."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"torch.{self.name}"


def _torch_size(dims=()):
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, int) for d in dims):
        raise CheckpointError("torch.Size of something other than integers")
    return tuple(dims)


_TORCH_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
                 "uint8", "bool", "float", "double", "half", "long", "int", "short", "complex64",
                 "complex128")


def _codecs_encode(text, encoding="utf-8"):
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise CheckpointError(f"_codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


_NUMPY = {"_reconstruct": _np_reconstruct, "scalar": _np_scalar}
_ALLOWED = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _np_dtype,
    ("numpy.core.numeric", "_frombuffer"): _np_frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _np_frombuffer,
    ("_codecs", "encode"): _codecs_encode,
}
_ALLOWED.update({("torch", n): t for n, t in _STORAGE_TYPES.items()})
_ALLOWED[("torch", "Size")] = _torch_size
_ALLOWED.update({("torch", n): _TorchDtype(n) for n in _TORCH_DTYPES})
for _mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _ALLOWED.update({(_mod, n): f for n, f in _NUMPY.items()})


class _GlobalRefused(CheckpointError):
    """A global outside the allowed set (the probe pass then looks for where it sits)."""


class _Opaque:
    """Probe pass only: what an unknown global becomes. It runs nothing: calling, building,
    appending to or filling it is swallowed; only its name is kept."""
    _global = "?"

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def append(self, item):
        pass

    def extend(self, items):
        pass

    def __setitem__(self, key, value):
        pass


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data, source, archive=None, probe=False):
        super().__init__(io.BytesIO(data))
        self.source, self.archive, self.probe = source, archive, probe

    def find_class(self, module, name):
        # protocol-2 pickles (torch.save's) spell some globals the Python 2 way
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        fn = _ALLOWED.get((module, name))
        if fn is None and self.probe:
            return type("opaque", (_Opaque,), {"_global": f"{module}.{name}"})
        if fn is None:
            hint = ""
            top = module.split(".")[0]
            if top == "omegaconf":
                hint = (" (an OmegaConf config object: re-save the checkpoint with "
                        "OmegaConf.to_container(cfg) or without it, and pass --config)")
            elif (module, name) == ("torch.storage", "_load_from_bytes"):
                hint = (" (torch tensors pickled with pickle.dump: save them with torch.save, "
                        "or as numpy arrays: {k: v.cpu().numpy() for k, v in stats.items()})")
            elif top not in ("torch", "numpy", "builtins", "os", "posix", "subprocess") \
                    and top not in getattr(sys, "stdlib_module_names", ()) and name[:1].isupper():
                hint = (f" (a class of the training code: torch.save of a whole object such as "
                        f"the agent pickles its class; save agent.state_dict() instead)")
            raise _GlobalRefused(f"refusing to load global '{module}.{name}' from {self.source}: "
                                 f"only tensors, storages, OrderedDict and numpy arrays are "
                                 f"allowed{hint}")
        return fn

    def persistent_load(self, pid):
        if self.archive is None:
            raise CheckpointError(f"{self.source}: a plain pickle refers to external storage "
                                  f"{pid!r}")
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)
                and isinstance(pid[4], int) and pid[4] >= 0):
            raise CheckpointError(f"{self.source}: unsupported persistent id {pid!r}")
        return self.archive.storage(pid[2], pid[1], pid[4])


_PROBE_NODES = 1 << 22   # containers the probe pass's walk visits before it gives up ("cannot tell")
_CONTAINERS = (dict, list, tuple, set, frozenset)


def _opaque_paths(obj):
    """Every place the probe pass's stand-ins sit: [(keys from the top object, global name)], or
    None when the walk cannot tell (too many objects). The walk has no depth limit and looks at
    dict keys as well as values, list/tuple/set members and an object's attributes (a pickle's
    BUILD can give an OrderedDict some), so that no stand-in can hide from the check that
    decides what is left out."""
    def opaque(o):
        return isinstance(o, _Opaque) or (isinstance(o, type) and issubclass(o, _Opaque))

    # (object, parent node, its key there): a path is built only for a stand-in found, so a list
    # of millions of floats costs a type check per member, not a tuple of keys each
    out, seen, stack, visited = [], set(), [(obj, None, None)], 0

    def path(node):
        keys = []
        while node is not None and node[1] is not None:
            keys.append(node[2])
            node = node[1]
        return tuple(reversed(keys))

    while stack:
        node = stack.pop()
        o = node[0]
        if opaque(o):
            out.append((path(node), o._global))
            continue
        if id(o) in seen:
            continue
        seen.add(id(o))
        visited += 1
        if visited > _PROBE_NODES:
            return None
        members = list(o.items()) if isinstance(o, dict) else list(enumerate(o))
        extra = getattr(o, "__dict__", None)
        if extra:
            members += [(f".{k}", v) for k, v in extra.items()]
        for k, v in members:
            if isinstance(o, dict) and (opaque(k) or isinstance(k, _CONTAINERS)):
                stack.append((k, node, "<a key>"))
            if opaque(v) or isinstance(v, _CONTAINERS):
                stack.append((v, node, k))
    return out


def _probe(data, source, archive):
    """(top object, stand-in places) of the probe pass (nothing in the pickle runs), or (None, [])
    when that pass cannot tell."""
    try:
        top = _RestrictedUnpickler(data, source, archive, probe=True).load()
    except Exception:   # a pickle the stand-ins cannot carry through: the first message stands
        return None, []
    where = _opaque_paths(top)
    return (top, where) if where else (None, [])


def _unpickle(data, source, archive=None, skipped=None, reads=None):
    try:
        return _RestrictedUnpickler(data, source, archive).load()
    except _GlobalRefused as e:
        top, where = _probe(data, source, archive)
        if not where:
            raise
        # Entries of their own beside the ones the converter reads (a date, a path, the run's
        # argparse Namespace) are left out: the probe pass loaded them as inert stand-ins, and
        # everything else it loaded is what the strict pass gives. Never in a bare state dict
        # (its entries are the tensors: one left out is a tensor the model misses), never an
        # entry the caller reads, and only when every stand-in sits inside a left-out entry.
        tops = sorted({keys[0] for keys, _ in where if keys}, key=str)
        # a bare state dict: tensors are most of its entries (a checkpoint beside its state dict
        # may hold a tensor or two, e.g. the tutorial's 'loss')
        bare = sum(isinstance(v, LazyTensor) for v in top.values()) * 2 > len(top) if isinstance(top, dict) else True
        droppable = (skipped is not None and reads is not None and not bare and all(keys for keys, _ in where)
                     and all(isinstance(k, str) and k in top and not reads(k) for k in tops))
        if droppable:
            for k in tops:
                skipped.append((k, ", ".join(sorted({name for keys, name in where if keys[0] == k}))))
                del top[k]
            return top
        at = ", ".join(f"{''.join(f'[{k!r}]' for k in keys) or 'the top object'} ({name})"
                       for keys, name in where[:5])
        raise CheckpointError(f"{e} - it sits at {at}") from None
    except CheckpointError:
        raise
    except Exception as e:   # malformed pickles raise many types; all mean "bad file"
        raise CheckpointError(f"{source}: cannot unpickle ({type(e).__name__}: {e})") from None


class _Archive:
    def __init__(self, path, zf, prefix, big_endian):
        self.path, self.zf, self.prefix, self.big_endian = path, zf, prefix, big_endian
        self.storages = {}

    def storage(self, key, stype, numel):
        s = self.storages.get(key)
        if s is None:
            s = self.storages[key] = _Storage(self, key, stype, numel)
        elif s.stype is not stype or s.numel != numel:
            raise CheckpointError(f"{self.path}: storage '{key}' is referenced as "
                                  f"{stype.name}[{numel}] and {s.stype.name}[{s.numel}]")
        return s

    def storage_array(self, key, stype, numel):
        record = f"{self.prefix}data/{key}"
        dt = np.dtype("<u2" if stype.dtype == "bf16" else stype.dtype)
        if self.big_endian:
            dt = dt.newbyteorder(">")
        raw = _read_record(self.path, self.zf, record, size=numel * dt.itemsize)
        return np.frombuffer(raw, dt, count=numel).astype(dt.newbyteorder("="))


def _read_record(path, zf, record, size=None, limit=MAX_PICKLE):
    """The bytes of one record, which must be stored (torch.save never compresses: a deflated
    record is a small file asking for much more); size: what a storage record must hold
    exactly, limit: the most any other record may hold. Checked against the zip's declared
    sizes before a byte is read (zipfile reads no more than it declared)."""
    try:
        info = zf.getinfo(record)
        if info.compress_type != zipfile.ZIP_STORED:
            raise CheckpointError(f"{path}: record '{record}' is compressed; torch.save stores every "
                                  f"record uncompressed (re-save the file with torch.save)")
        if size is not None and info.file_size != size:
            raise CheckpointError(f"{path}: storage record '{record}' is stored, {info.file_size} bytes; "
                                  f"torch.save stores exactly the storage's {size} bytes, uncompressed")
        if size is None and info.file_size > limit:
            raise CheckpointError(f"{path}: record '{record}' declares {info.file_size} bytes, more than "
                                  f"the {limit} a checkpoint's pickle may hold")
        return zf.read(record)
    except KeyError:
        raise CheckpointError(f"{path}: storage record '{record}' is missing") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as e:
        raise CheckpointError(f"{path}: record '{record}' is damaged ({e})") from None


def load_torch_zip(path, skipped=None, reads=None):
    """Load a torch.save zip archive; tensors come back as LazyTensor. skipped: a list that gets
    (entry, global) for each top-level entry left out (see the module's docstring), and reads(key):
    is this top-level entry one the caller reads (never left out)? Without both, such entries are
    refused like any other."""
    with open(path, "rb") as f:
        head = f.read(8)
    if not zipfile.is_zipfile(path):
        if head[:1] == b"\x80":
            raise CheckpointError(f"{path}: a legacy (pre-1.6, non-zip) torch.save file; re-save "
                                  f"it with torch >= 1.6 (torch.save(torch.load(p), p2)) and "
                                  f"convert that")
        if head[:4] == b"PK\x03\x04":
            raise CheckpointError(f"{path}: a damaged or truncated zip archive")
        raise CheckpointError(f"{path}: not a torch.save zip archive")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, EOFError) as e:
        raise CheckpointError(f"{path}: a damaged zip archive ({e})") from None
    pkls = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pkls) != 1:
        raise CheckpointError(f"{path}: expected one '<name>/data.pkl' record, found {pkls}")
    prefix = pkls[0][:-len("data.pkl")]
    big_endian = False
    if prefix + "byteorder" in zf.namelist():
        order = _read_record(path, zf, prefix + "byteorder", limit=64).decode("ascii", "replace").strip()
        if order not in ("little", "big"):
            raise CheckpointError(f"{path}: byteorder record says {order!r}")
        big_endian = order == "big"
    archive = _Archive(path, zf, prefix, big_endian)
    return _unpickle(_read_record(path, zf, pkls[0]), path, archive, skipped, reads)


def load_pickle(path, skipped=None, reads=None):
    """Load a plain pickle (e.g. dataset_stats.pkl) with the same restrictions; a torch.save
    archive under a .pkl name (stats saved with torch.save) is read as one."""
    with open(path, "rb") as f:
        data = f.read(MAX_PICKLE + 1)
    if data[:4] != b"PK\x03\x04" and len(data) > MAX_PICKLE:
        raise CheckpointError(f"{path}: a pickle of more than {MAX_PICKLE} bytes; statistics take KB")
    if data[:4] == b"PK\x03\x04":
        return load_torch_zip(path, skipped, reads)
    return _unpickle(data, path, skipped=skipped, reads=reads)
