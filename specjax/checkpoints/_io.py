"""Low-level pieces shared by the T5X checkpoint readers and writer.

- A msgpack codec for flax serialization's format that never unpickles: only
  flax's three extension types are understood (1: numpy array, 2: Python
  complex, 3: numpy scalar); an array is the msgpack triple
  (shape, dtype name, C-order bytes), its dtype taken from a fixed list.
- Safe resolution of array folders named inside a checkpoint.
- Concurrent tensorstore reads of zarr arrays with clear errors naming the
  parameter, and a check that no zarr chunk file is missing (a missing chunk
  would otherwise read back silently as zeros).

Public API lives in `specjax.checkpoints`; nothing here is meant for users.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import ml_dtypes
import msgpack
import numpy as np
import tensorstore as ts

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

# flax/serialization.py `_MsgpackExtType`.
EXT_NDARRAY = 1
EXT_COMPLEX = 2
EXT_NPSCALAR = 3

# The only dtypes an inline array may carry (no object or structured dtypes).
ARRAY_DTYPES = {
    name: np.dtype(name) for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
        "uint32", "uint64", "float16", "float32", "float64", "complex64",
        "complex128")
}
ARRAY_DTYPES["bfloat16"] = BFLOAT16


def resolve_dtype(dtype: Any, what: str) -> Optional[np.dtype]:
  """'float32' / 'bfloat16' / np / jnp dtypes -> a floating numpy dtype (or None)."""
  if dtype is None:
    return None
  try:
    dt = np.dtype(dtype)
  except TypeError as e:
    raise ValueError(f"{what}: unknown dtype {dtype!r}") from e
  if not is_floating(dt):
    raise ValueError(f"{what}: dtype must be a floating-point dtype such as "
                     f"'float32' or 'bfloat16', got {dt.name!r}")
  return dt


def is_floating(dt: np.dtype) -> bool:
  """True for float16/32/64 and bfloat16 (numpy does not count bfloat16)."""
  return dt.kind == "f" or dt == BFLOAT16


# ----------------------------------------------------------------------------
# msgpack (flax serialization format)


def _decode_ndarray(data: bytes) -> np.ndarray:
  """Decodes flax's (shape, dtype name, bytes) triple; raises ValueError.

  Returns a writable array of the encoded shape and (whitelisted) dtype.
  """
  triple = msgpack.unpackb(data, raw=True, use_list=True)
  if not isinstance(triple, list) or len(triple) != 3:
    raise ValueError("inline array is not a (shape, dtype, bytes) triple")
  shape, name, buffer = triple
  if isinstance(name, bytes):
    name = name.decode("ascii", errors="replace")
  if name not in ARRAY_DTYPES:
    raise ValueError(f"inline array has unsupported dtype {name!r}")
  if (not isinstance(shape, list)
      or not all(isinstance(d, int) and d >= 0 for d in shape)):
    raise ValueError(f"inline array has an invalid shape {shape!r}")
  if not isinstance(buffer, bytes):
    raise ValueError("inline array data is not a byte string")
  dtype = ARRAY_DTYPES[name]
  if len(buffer) != math.prod(shape) * dtype.itemsize:
    raise ValueError(f"inline array of shape {tuple(shape)} and dtype {name} "
                     f"needs {math.prod(shape) * dtype.itemsize} bytes, "
                     f"found {len(buffer)}")
  return np.frombuffer(buffer, dtype=dtype).reshape(shape).copy()


def _ext_hook(code: int, data: bytes) -> Any:
  """msgpack ext_hook that knows flax's array/complex/scalar codes and nothing else."""
  if code == EXT_NDARRAY:
    return _decode_ndarray(data)
  if code == EXT_NPSCALAR:
    return _decode_ndarray(data)[()]
  if code == EXT_COMPLEX:
    pair = msgpack.unpackb(data, raw=True)
    if (not isinstance(pair, list) or len(pair) != 2
        or not all(isinstance(x, (int, float)) for x in pair)):
      raise ValueError("invalid complex number encoding")
    return complex(pair[0], pair[1])
  raise ValueError(f"unsupported msgpack extension type {code} (only flax's "
                   "numpy array, numpy scalar and complex encodings are allowed)")


def _unchunk(node: Any) -> Any:
  """Reassembles flax's `__msgpack_chunked_array__` leaves (arrays over 1 GiB)."""
  if not isinstance(node, dict):
    return node
  if node.get("__msgpack_chunked_array__") is True:
    shape_d, chunks_d = node.get("shape"), node.get("chunks")
    if not isinstance(shape_d, dict) or not isinstance(chunks_d, dict):
      raise ValueError("malformed chunked array")
    shape = [shape_d.get(str(i)) for i in range(len(shape_d))]
    chunks = [chunks_d.get(str(i)) for i in range(len(chunks_d))]
    if (not all(isinstance(d, int) and d >= 0 for d in shape)
        or not all(isinstance(c, np.ndarray) and c.ndim == 1 for c in chunks)
        or not chunks):
      raise ValueError("malformed chunked array")
    flat = np.concatenate(chunks)
    if flat.size != math.prod(shape):
      raise ValueError(f"chunked array has {flat.size} values for shape {shape}")
    return flat.reshape(shape)
  return {k: _unchunk(v) for k, v in node.items()}


def _unpacker(data: bytes) -> msgpack.Unpacker:
  unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, use_list=True,
                              ext_hook=_ext_hook,
                              max_buffer_size=max(len(data), 1))
  unpacker.feed(data)
  return unpacker


def _expect_end(unpacker: msgpack.Unpacker) -> None:
  try:
    unpacker.unpack()
  except msgpack.OutOfData:
    return
  raise ValueError("extra data after the top-level object")


def decode_all(data: bytes, where: str) -> Any:
  """Decodes a whole msgpack file (an Orbax aggregate file) safely."""
  try:
    unpacker = _unpacker(data)
    tree = unpacker.unpack()
    _expect_end(unpacker)
    return _unchunk(tree)
  except msgpack.OutOfData as e:
    raise ValueError(f"corrupt msgpack in {where}: the file is truncated") from e
  except (ValueError, TypeError, msgpack.UnpackException) as e:
    raise ValueError(f"corrupt msgpack in {where}: {e}") from e


def decode_t5x_target(data: bytes, where: str) -> Tuple[int, Any]:
  """Reads `version` and `optimizer/target` from a T5X `checkpoint` msgpack.

  Everything else (the optimizer state above all) is skipped in the stream
  without being decoded.

  Returns:
    (version, target) where target is the decoded `optimizer['target']` tree.
  """
  version: Any = None
  target: Any = None
  has_optimizer = has_target = False
  keys: List[Any] = []
  try:
    unpacker = _unpacker(data)
    for _ in range(unpacker.read_map_header()):
      key = unpacker.unpack()
      keys.append(key)
      if key == "version":
        version = unpacker.unpack()
      elif key == "optimizer":
        has_optimizer = True
        for _ in range(unpacker.read_map_header()):
          if unpacker.unpack() == "target":
            has_target = True
            target = _unchunk(unpacker.unpack())
          else:
            unpacker.skip()
      else:
        unpacker.skip()
    _expect_end(unpacker)
  except msgpack.OutOfData as e:
    raise ValueError(f"corrupt msgpack in {where}: the file is truncated") from e
  except (ValueError, TypeError, msgpack.UnpackException) as e:
    raise ValueError(f"corrupt msgpack in {where}: {e}") from e
  if not has_optimizer:
    raise ValueError(f"{where} is not a T5X checkpoint: its msgpack has no "
                     f"'optimizer' entry (top-level keys: {keys})")
  if not has_target:
    raise ValueError(f"{where}: the checkpoint has no 'optimizer/target' tree")
  if not isinstance(version, int) or isinstance(version, bool):
    raise ValueError(f"{where}: missing or invalid 'version' {version!r}")
  return version, target


def _ext_default(x: Any) -> msgpack.ExtType:
  """msgpack `default` hook writing numpy arrays/scalars the way flax does."""
  if isinstance(x, (np.ndarray, np.generic)):
    arr = np.asarray(x)
    if arr.dtype.name not in ARRAY_DTYPES:
      raise ValueError(f"cannot write dtype {arr.dtype} inline")
    payload = msgpack.packb([list(arr.shape), arr.dtype.name, arr.tobytes("C")],
                            use_bin_type=True)
    code = EXT_NDARRAY if isinstance(x, np.ndarray) else EXT_NPSCALAR
    return msgpack.ExtType(code, payload)
  raise TypeError(f"cannot serialize {type(x).__name__}")


def encode(tree: Any) -> bytes:
  """Encodes dicts / lists / str / int / numpy arrays like flax.serialization."""
  return msgpack.packb(tree, default=_ext_default, use_bin_type=True,
                       strict_types=True)


# ----------------------------------------------------------------------------
# Paths and zarr arrays


def safe_join(root: str, rel: Any, name: str, where: str) -> str:
  """root/rel, refusing anything that is absolute or escapes `root`."""
  if (not isinstance(rel, str) or not rel.strip("/") or "\x00" in rel
      or os.path.isabs(rel) or rel.startswith(("/", "\\")) or "://" in rel):
    raise ValueError(f"{where}: parameter '{name}' has an array path {rel!r} "
                     "that is not a relative path inside the checkpoint folder")
  root_n = os.path.normpath(os.path.abspath(root))
  full = os.path.normpath(os.path.join(root_n, rel))
  if full == root_n or os.path.commonpath([root_n, full]) != root_n:
    raise ValueError(f"{where}: parameter '{name}' has an array path {rel!r} "
                     "that escapes the checkpoint folder")
  return full


@dataclasses.dataclass
class ZarrRead:
  """One array to read with tensorstore."""
  name: str  # the parameter's tree path, for messages ('decoder/.../kernel')
  spec: Dict[str, Any]  # tensorstore spec with an absolute kvstore
  shape: Optional[Tuple[int, ...]] = None  # the shape the checkpoint declares
  dtype: Optional[np.dtype] = None  # the dtype the checkpoint declares
  assume_metadata: bool = False  # open without reading .zarray (it is missing)


def chunk_keys(shape: Sequence[int], chunks: Sequence[int],
               separator: str = ".") -> List[str]:
  """The zarr v2 chunk keys a fully written array of `shape` has."""
  if len(shape) == 0:
    return ["0"]
  if any(s == 0 for s in shape):
    return []
  grid = [-(-s // c) for s, c in zip(shape, chunks)]
  keys = [""]
  for n in grid:
    keys = [f"{k}{separator}{i}" if k else str(i) for k in keys for i in range(n)]
  return keys


def check_zarr_folder(folder: str, name: str, where: str,
                      spec_meta: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
  """Checks a zarr v2 array folder and returns its .zarray (None when absent).

  Raises ValueError naming the parameter when the folder or one of its chunk
  files is missing, or when .zarray is unreadable.
  """
  if not os.path.isdir(folder):
    raise ValueError(f"{where}: the array of parameter '{name}' is missing "
                     f"(no folder {folder})")
  zarray_path = os.path.join(folder, ".zarray")
  zarray = None
  if os.path.isfile(zarray_path):
    try:
      with open(zarray_path, "rb") as f:
        zarray = json.loads(f.read())
    except (OSError, ValueError) as e:
      raise ValueError(f"{where}: unreadable {zarray_path} for parameter "
                       f"'{name}': {e}") from e
    if not isinstance(zarray, dict):
      raise ValueError(f"{where}: {zarray_path} is not a JSON object")
  meta = zarray if zarray is not None else spec_meta
  shape, chunks = meta.get("shape"), meta.get("chunks", meta.get("shape"))
  if meta.get("fill_value") is None and int_list(shape) and int_list(chunks):
    sep = meta.get("dimension_separator") or "."
    missing = [k for k in chunk_keys(shape, chunks, sep)
               if not os.path.isfile(os.path.join(folder, *k.split("/")))]
    if missing:
      raise ValueError(f"{where}: the array of parameter '{name}' is missing "
                       f"chunk file(s) {missing[:4]} in {folder}")
  return zarray


def int_list(x: Any) -> bool:
  return isinstance(x, list) and all(
      isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in x)


def read_zarr_arrays(reads: Sequence[ZarrRead], where: str) -> List[np.ndarray]:
  """Reads all arrays concurrently (every open, then every read, then waits)."""
  context = ts.Context()
  opens = []
  for r in reads:
    kwargs = {"assume_metadata": True} if r.assume_metadata else {}
    opens.append(ts.open(r.spec, open=True, read=True, context=context, **kwargs))
  stores = []
  for r, future in zip(reads, opens):
    try:
      store = future.result()
    except Exception as e:  # tensorstore reports every failure as ValueError etc.
      raise ValueError(f"{where}: cannot open the array of parameter "
                       f"'{r.name}': {e}") from e
    if r.shape is not None and tuple(store.shape) != tuple(r.shape):
      raise ValueError(f"{where}: the array of parameter '{r.name}' has shape "
                       f"{tuple(store.shape)} but the checkpoint declares "
                       f"{tuple(r.shape)}")
    if r.dtype is not None and np.dtype(store.dtype.numpy_dtype) != r.dtype:
      raise ValueError(f"{where}: the array of parameter '{r.name}' has dtype "
                       f"{store.dtype.name} but the checkpoint declares "
                       f"{r.dtype.name}")
    stores.append(store)
  pending = [store.read() for store in stores]
  out = []
  for r, future in zip(reads, pending):
    try:
      out.append(np.asarray(future.result()))
    except Exception as e:
      raise ValueError(f"{where}: cannot read the array of parameter "
                       f"'{r.name}': {e}") from e
  return out
