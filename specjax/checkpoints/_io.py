"""Low-level pieces shared by the T5X checkpoint readers and writer.

- A msgpack codec for flax serialization's format that never unpickles: only
  flax's three extension types are understood (1: numpy array, 2: Python
  complex, 3: numpy scalar); an array is the msgpack triple
  (shape, dtype name, C-order bytes), its dtype taken from a fixed list.
- Safe resolution of array folders named inside a checkpoint.
- Concurrent tensorstore reads of zarr arrays with clear errors naming the
  parameter. Every declared chunk must be stored: arrays are opened with
  `fill_missing_data_reads=False` (zarr, zarr3, sharded, OCDBT alike), and
  zarr v2 folders are also checked up front. Metadata is checked before any
  chunk is touched (shape against the declared / expected one, at most
  MAX_CHUNKS chunks), so a hostile .zarray costs nothing.
- Sizes: an array's declared shape x dtype, and its chunk's, must fit
  `max_array_bytes()` (SPECJAX_MAX_ARRAY_BYTES), and each zarr v2 chunk file
  must be large enough to hold its chunk under its compressor (gzip/zlib at most
  1032:1, none 1:1), all before tensorstore allocates anything.
- Symlinks and special files: every file read must resolve inside the
  checkpoint folder and be a regular file (a FIFO would block, a device never end).
- Trees: nested at most MAX_DEPTH levels.

Public API lives in `specjax.checkpoints`; nothing here is meant for users.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import ml_dtypes
import msgpack
import numpy as np
import tensorstore as ts

from specjax import files
from specjax.checkpoints import _paths
from specjax.checks import is_int
from specjax.params import check_params_match, unflatten

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


def count_non_finite(arr: Any) -> int:
  """NaN and ±inf entries of a floating-point array (0 for other dtypes)."""
  arr = np.asarray(arr)
  if not is_floating(arr.dtype):
    return 0
  return int(arr.size - np.count_nonzero(np.isfinite(arr)))


def _named_counts(counts: Mapping[str, int], sizes: Mapping[str, int]) -> Tuple[int, str]:
  """(how many parameters have a count, "'a' (3 of 10), ... and N more")."""
  bad = sorted(name for name, n in counts.items() if n)
  shown = ", ".join(f"'{n}' ({counts[n]} of {sizes[n]})" for n in bad[:8])
  return len(bad), shown + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")


def warn_non_finite(where: str, counts: Mapping[str, int], sizes: Mapping[str, int]) -> None:
  """Logs one warning naming the parameters that hold NaN or inf ({name: count})."""
  n, shown = _named_counts(counts, sizes)
  if n:
    logging.warning("%s: %d parameter(s) hold NaN or inf values: %s; the model's outputs "
                    "will be NaN wherever they are read", where, n, shown)


def cast_float(arr: Any, cast: Optional[np.dtype]) -> Tuple[np.ndarray, int]:
  """(`arr` cast to `cast` if both are floating-point, else as is; how many of its finite
  values the cast turned into ±inf because they lie outside `cast`'s range)."""
  arr = np.asarray(arr)
  if cast is None or not is_floating(arr.dtype):
    return arr, 0
  with np.errstate(over="ignore"):  # counted and warned about below, by name
    out = arr.astype(cast)
  if ml_dtypes.finfo(cast).max >= ml_dtypes.finfo(arr.dtype).max:
    return out, 0  # a cast that cannot overflow is not scanned
  return out, int(np.count_nonzero(np.isfinite(arr) & ~np.isfinite(out)))


def warn_overflow(where: str, cast: Optional[np.dtype], counts: Mapping[str, int],
                  sizes: Mapping[str, int]) -> None:
  """Logs one warning naming the parameters whose finite values a cast made ±inf."""
  n, shown = _named_counts(counts, sizes)
  if n:
    logging.warning("%s: casting to %s turned finite values into inf in %d parameter(s): %s; "
                    "they exceed %s's largest value %g", where, np.dtype(cast).name, n, shown,
                    np.dtype(cast).name, float(ml_dtypes.finfo(cast).max))


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


MAX_DEPTH = 64
"""Deepest tree of dicts a checkpoint may hold (T5X trees are under 10 deep)."""


def check_depth(depth: int, where: str) -> None:
  """ValueError once a tree walk goes past MAX_DEPTH levels."""
  if depth > MAX_DEPTH:
    raise ValueError(f"{where}: the parameter tree is nested more than {MAX_DEPTH} levels "
                     "deep")


def _unchunk(node: Any, depth: int = 0) -> Any:
  """Reassembles flax's `__msgpack_chunked_array__` leaves (arrays over 1 GiB)."""
  if not isinstance(node, dict):
    return node
  check_depth(depth, "msgpack")
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
  return {k: _unchunk(v, depth + 1) for k, v in node.items()}


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


def _reason(e: Exception) -> str:
  if isinstance(e, msgpack.StackError):
    return "nested too deep"
  return str(e) or type(e).__name__


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
    raise ValueError(f"corrupt msgpack in {where}: {_reason(e)}") from e


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
    raise ValueError(f"corrupt msgpack in {where}: {_reason(e)}") from e
  if not has_optimizer:
    raise ValueError(f"{where} is not a T5X checkpoint: its msgpack has no "
                     f"'optimizer' entry (top-level keys: {keys})")
  if not has_target:
    raise ValueError(f"{where}: the checkpoint has no 'optimizer/target' tree")
  if not is_int(version):
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

MAX_ARRAY_BYTES_ENV = "SPECJAX_MAX_ARRAY_BYTES"
DEFAULT_MAX_ARRAY_BYTES = 2**35
"""32 GiB: the largest array (and chunk) a checkpoint may declare unless
SPECJAX_MAX_ARRAY_BYTES says otherwise (mT5-XXL's largest is 4 GiB)."""
DEFLATE_MAX_RATIO = 1032
"""Deflate (gzip, zlib) cannot shrink data more than 1032:1 (258 bytes per 2 bits)."""
_MAX_RATIO = {None: 1, "gzip": DEFLATE_MAX_RATIO, "zlib": DEFLATE_MAX_RATIO}
METADATA_BYTES = _paths.METADATA_BYTES
"""Largest JSON metadata file read (.zarray, Orbax _METADATA)."""


def max_array_bytes() -> int:
  """The byte ceiling on one declared array: $SPECJAX_MAX_ARRAY_BYTES, else 32 GiB."""
  raw = os.environ.get(MAX_ARRAY_BYTES_ENV, "").strip()
  if not raw:
    return DEFAULT_MAX_ARRAY_BYTES
  try:
    value = int(raw)
  except ValueError:
    value = 0
  if value <= 0:
    raise ValueError(f"{MAX_ARRAY_BYTES_ENV}={raw!r} must be a positive number of bytes")
  return value


def check_bytes(shape: Sequence[int], chunks: Optional[Sequence[int]], dtype: Any, name: str,
                where: str) -> None:
  """A declared array and chunk against `max_array_bytes()`, before anything is allocated.

  Args:
    shape: the declared shape; chunks: its chunk shape (None: unknown).
    dtype: its dtype (None or unknown: counted as 1 byte per value).
  """
  itemsize = _itemsize(dtype)
  limit = max_array_bytes()
  for what, dims in (("the array", shape), ("one chunk of the array", chunks)):
    if dims is None:
      continue
    size = math.prod(int(d) for d in dims) * itemsize
    if size > limit:
      raise ValueError(f"{where}: {what} of parameter '{name}' declares {size} bytes (shape "
                       f"{tuple(dims)}, {itemsize} bytes per value), more than the {limit} "
                       f"allowed; refusing to allocate it (raise {MAX_ARRAY_BYTES_ENV} if "
                       "the checkpoint is trusted)")


def _itemsize(dtype: Any) -> int:
  try:
    return np.dtype(dtype).itemsize if dtype is not None else 1
  except TypeError:
    return 1


MAX_CHUNKS = 2**20
"""Most chunks one array may declare (a T5X array of 64 MiB chunks would need
64 TiB to reach it); more is refused before any chunk is looked for."""


def safe_join(root: str, rel: Any, name: str, where: str) -> str:
  """root/rel, refusing anything that is absolute or escapes `root`."""
  if (not isinstance(rel, str) or not rel.strip("/") or "\x00" in rel
      or os.path.isabs(rel) or rel.startswith(("/", "\\")) or "://" in rel):
    raise ValueError(f"{where}: parameter '{name}' has an array path {rel!r} "
                     "that is not a relative path inside the checkpoint folder")
  if _paths.is_remote(root):
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts or not parts:
      raise ValueError(f"{where}: parameter '{name}' has an array path {rel!r} "
                       "that escapes the checkpoint folder")
    return "/".join([root.rstrip("/")] + parts)
  root_n = os.path.normpath(os.path.abspath(root))
  full = os.path.normpath(os.path.join(root_n, rel))
  if full == root_n or os.path.commonpath([root_n, full]) != root_n:
    raise ValueError(f"{where}: parameter '{name}' has an array path {rel!r} "
                     "that escapes the checkpoint folder")
  return full


def _within(root_real: str, real: str) -> bool:
  return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def check_inside(root: str, path: str, what: str, where: str) -> str:
  """`path` once its symlinks are resolved; ValueError if that leaves `root`.

  Args:
    root: the checkpoint folder (itself may be a symlink).
    path: a file or folder inside it that is about to be read.
    what: how to name `path` in the message (e.g. "the array of parameter 'x'").
  A gs:// path has no symlinks: it is returned as it is.
  """
  if _paths.is_remote(path):
    return path
  root_real, real = os.path.realpath(root), os.path.realpath(path)
  if not _within(root_real, real):
    raise ValueError(f"{where}: {what} ({path}) is a symlink to {real}, outside "
                     f"the checkpoint folder {root_real}; refusing to read it")
  return real


def scan_files(root: str, folder: str, what: str, where: str) -> set:
  """Relative paths ('a/b', '/'-separated) of the files under `folder`.

  Every symlink met on the way must resolve inside `root` (the checkpoint
  folder), and every file must be a regular one, else ValueError naming it;
  symlinked folders are scanned once. A gs:// folder's objects are listed.
  """
  if _paths.is_remote(folder):
    return _paths.list_files(folder, what)
  root_real = os.path.realpath(root)
  start = check_inside(root, folder, what, where)
  found, seen, stack = set(), {start}, [(folder, "")]
  while stack:
    path, rel = stack.pop()
    try:
      entries = list(os.scandir(path))
    except OSError as e:
      raise ValueError(f"{where}: cannot list {path} ({what}): {e}") from e
    for entry in entries:
      sub = f"{rel}/{entry.name}" if rel else entry.name
      if entry.is_symlink():
        real = os.path.realpath(entry.path)
        if not _within(root_real, real):
          raise ValueError(f"{where}: {what} holds {entry.path}, a symlink to {real} "
                           f"outside the checkpoint folder {root_real}; refusing to "
                           "read it")
        is_dir = os.path.isdir(real)
      else:
        is_dir = entry.is_dir(follow_symlinks=False)
        real = None
      if is_dir:
        real = real or os.path.realpath(entry.path)
        if real not in seen:
          seen.add(real)
          stack.append((entry.path, sub))
      elif entry.is_file(follow_symlinks=True):
        found.add(sub)
      elif os.path.lexists(entry.path):  # a FIFO would block its reader, a device never end
        raise ValueError(f"{where}: {what} holds {entry.path}, which is not a regular file; "
                         "refusing to read it")
  return found


@dataclasses.dataclass
class ZarrRead:
  """One array to read with tensorstore."""
  name: str  # the parameter's tree path, for messages ('decoder/.../kernel')
  spec: Dict[str, Any]  # tensorstore spec with an absolute kvstore
  shape: Optional[Tuple[int, ...]] = None  # the shape the checkpoint declares
  dtype: Optional[np.dtype] = None  # the dtype the checkpoint declares
  assume_metadata: bool = False  # open without reading .zarray (it is missing)
  expected: Optional[Tuple[int, ...]] = None  # the shape the model expects
  allow_missing_chunks: bool = False  # missing chunks read as the fill value


def check_names(names_shapes: Mapping[str, Optional[Tuple[int, ...]]],
                expected: Mapping[str, Tuple[int, ...]], where: str) -> None:
  """The names (and known shapes) of a checkpoint against the model's, before reading.

  Args:
    names_shapes: parameter name -> its shape, or None where it is not known
      until its array is opened (checked then).
    expected: parameter name -> the shape the model config expects.
  """
  def placeholder(shape):  # an array of any shape that takes no memory
    return np.broadcast_to(np.zeros((), np.int8), shape)
  got = {n: placeholder(expected[n] if s is None and n in expected else (s or ()))
         for n, s in names_shapes.items()}
  check_params_match(unflatten(got), unflatten({n: placeholder(s) for n, s in expected.items()}),
                     what=where)


def read_spec(spec: Dict[str, Any], allow_missing_chunks: bool = False) -> Dict[str, Any]:
  """`spec` set to fail on a missing chunk instead of reading the fill value, and to trust
  what its context has cached (a checkpoint does not change while it is read: the OCDBT
  manifest is then read once per context, not revalidated at every array's open)."""
  return dict(spec, fill_missing_data_reads=bool(allow_missing_chunks),
              recheck_cached_metadata=False, recheck_cached_data=False)


def int_list(x: Any) -> bool:
  return isinstance(x, list) and all(
      isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in x)


def chunk_grid(shape: Any, chunks: Any, name: str, where: str) -> List[int]:
  """Chunks per dimension of a zarr array; ValueError for an invalid or absurd grid.

  Checked from the metadata alone, before anything else is read: `chunks` must
  be positive and of the array's rank, and the grid at most MAX_CHUNKS chunks.
  """
  if not int_list(shape) or not int_list(chunks) or len(chunks) != len(shape) \
      or not all(c > 0 for c in chunks):
    raise ValueError(f"{where}: the array of parameter '{name}' declares an invalid "
                     f"chunk grid: shape {shape!r}, chunks {chunks!r}")
  grid = [-(-s // c) for s, c in zip(shape, chunks)]
  count = math.prod(grid)
  if count > MAX_CHUNKS:
    raise ValueError(f"{where}: the array of parameter '{name}' declares {count} chunks "
                     f"(shape {tuple(shape)} in chunks of {tuple(chunks)}), more than "
                     f"the {MAX_CHUNKS} allowed; refusing to read it")
  return grid


def iter_chunk_keys(grid: Sequence[int], separator: str = ".") -> Iterator[str]:
  """The zarr v2 chunk keys of a fully written array with this chunk grid, lazily."""
  if len(grid) == 0:
    yield "0"
    return
  for index in itertools.product(*(range(n) for n in grid)):
    yield separator.join(map(str, index))


def check_zarr_folder(root: str, folder: str, name: str, where: str,
                      spec_meta: Mapping[str, Any],
                      shape: Optional[Sequence[int]] = None,
                      shape_source: str = "the checkpoint declares",
                      require_all_chunks: bool = True,
                      dtype: Optional[np.dtype] = None) -> Optional[Dict[str, Any]]:
  """Checks a zarr v2 array folder and returns its .zarray (None when absent).

  In this order, so a hostile .zarray costs nothing before it is refused: the
  folder resolves inside `root`; .zarray's shape equals `shape` (when given);
  its chunk grid is valid and at most MAX_CHUNKS; the array and one chunk fit
  `max_array_bytes()` (`dtype`: the spec's, where .zarray is absent); then the
  folder is listed (no symlink may leave `root`, only regular files) and every
  chunk must be there, each file large enough for a chunk under its compressor.

  Raises ValueError naming the parameter.
  """
  what = f"the array of parameter '{name}'"
  remote = _paths.is_remote(folder)
  if not remote and not os.path.isdir(folder):
    raise ValueError(f"{where}: {what} is missing (no folder {folder})")
  check_inside(root, folder, what, where)
  zarray_path = os.path.join(folder, ".zarray")
  zarray = None
  present = scan_files(root, folder, what, where) if remote else None
  if remote and not present:
    raise ValueError(f"{where}: {what} is missing (no object below {folder}/)")
  if (".zarray" in present) if remote else os.path.lexists(zarray_path):
    check_inside(root, zarray_path, f"the .zarray of parameter '{name}'", where)
    try:
      zarray = json.loads(files.read_bytes(zarray_path, METADATA_BYTES, "the .zarray file"))
    except RecursionError:
      raise ValueError(f"{where}: {zarray_path} is nested too deep") from None
    except (OSError, ValueError) as e:
      raise ValueError(f"{where}: unreadable {zarray_path} for parameter "
                       f"'{name}': {e}") from e
    if not isinstance(zarray, dict):
      raise ValueError(f"{where}: {zarray_path} is not a JSON object")
  meta = zarray if zarray is not None else spec_meta
  zshape = meta.get("shape")
  if shape is not None and zarray is not None and zshape != list(shape):
    raise ValueError(f"{where}: shape mismatch: {what} has shape "
                     f"{tuple(zshape) if int_list(zshape) else zshape!r} "
                     f"but {shape_source} {tuple(shape)} ({zarray_path})")
  if "shape" not in meta:  # nothing to check the chunks against: tensorstore says why
    if not remote:
      scan_files(root, folder, what, where)
    return zarray
  chunks = meta.get("chunks", zshape)
  grid = chunk_grid(zshape, chunks, name, where)
  itemsize = _itemsize(meta.get("dtype", dtype))
  check_bytes(zshape, chunks, meta.get("dtype", dtype), name, where)
  if not remote:
    present = scan_files(root, folder, what, where)
  if not require_all_chunks:
    return zarray
  sep = meta.get("dimension_separator") or "."
  if sep not in (".", "/"):
    raise ValueError(f"{where}: {what} has an invalid dimension_separator {sep!r}")
  # object sizes are not listed: a truncated remote chunk fails when it is decoded
  min_size = 0 if remote else _min_chunk_file(meta, math.prod(chunks) * itemsize)
  missing = []
  for key in iter_chunk_keys(grid, sep):
    if key not in present:
      missing.append(key)
      if len(missing) == 4:
        break
    elif min_size:
      size = os.stat(os.path.join(folder, key)).st_size
      if size < min_size:
        raise ValueError(f"{where}: {what} declares chunks of {tuple(chunks)} values, but its "
                         f"chunk file {key} holds {size} bytes, too few to hold one under "
                         f"its compressor (at least {min_size}); refusing to read it")
  if missing:
    hint = "" if shape is not None else f" (or its .zarray declares a wrong shape {tuple(zshape)})"
    raise ValueError(f"{where}: {what} is missing chunk file(s) {missing} in "
                     f"{folder}{hint}")
  return zarray


def _min_chunk_file(meta: Mapping[str, Any], chunk_bytes: int) -> int:
  """The fewest bytes a chunk file of `chunk_bytes` decoded bytes can take (0: unknown)."""
  compressor = meta.get("compressor")
  codec = compressor.get("id") if isinstance(compressor, dict) else compressor
  if meta.get("filters") or codec not in _MAX_RATIO:
    return 0  # blosc, zstd, bz2 and filters shrink data without a useful bound
  return chunk_bytes // _MAX_RATIO[codec]


def _ts_error(e: Exception, name: str, where: str, action: str) -> ValueError:
  """A tensorstore failure as a ValueError naming the parameter."""
  text = str(e)
  if "NOT_FOUND" in text and "chunk" in text:
    return ValueError(f"{where}: the array of parameter '{name}' is missing a chunk "
                      f"(every chunk it declares must be stored): {text}")
  return ValueError(f"{where}: cannot {action} the array of parameter '{name}': {text}")


def check_store(store: Any, r: ZarrRead, where: str) -> None:
  """An opened array against what the checkpoint declares and the model expects.

  Checked before any chunk is read: shape, dtype, the number of chunks a read
  visits (at most MAX_CHUNKS) and the bytes of the array and of one chunk
  (`max_array_bytes()`).
  """
  got = tuple(store.shape)
  for want, source in ((r.shape, "the checkpoint declares"),
                       (r.expected, "the model config expects")):
    if want is not None and got != tuple(want):
      raise ValueError(f"{where}: shape mismatch: the array of parameter '{r.name}' "
                       f"has shape {got} but {source} {tuple(want)}")
  if r.dtype is not None and np.dtype(store.dtype.numpy_dtype) != r.dtype:
    raise ValueError(f"{where}: the array of parameter '{r.name}' has dtype "
                     f"{store.dtype.name} but the checkpoint declares "
                     f"{r.dtype.name}")
  chunk = store.chunk_layout.read_chunk.shape
  chunks = None if chunk is None else [int(c) if c else 1 for c in chunk]
  if chunks is not None and got:
    chunk_grid(list(got), chunks, r.name, where)
  check_bytes(got, chunks, store.dtype.numpy_dtype, r.name, where)


def open_arrays(reads: Sequence[ZarrRead], where: str) -> List[Any]:
  """Opens every array (metadata only), then checks each with `check_store`."""
  context = _paths.open_context([r.spec for r in reads])
  opens = []
  for r in reads:
    kwargs = {"assume_metadata": True} if r.assume_metadata else {}
    opens.append(ts.open(read_spec(r.spec, r.allow_missing_chunks), open=True, read=True,
                         context=context, **kwargs))
  stores = []
  for r, future in zip(reads, opens):
    try:
      store = future.result()
    except Exception as e:  # tensorstore reports every failure as ValueError etc.
      raise _ts_error(e, r.name, where, "open") from e
    check_store(store, r, where)
    stores.append(store)
  return stores


def read_array(store: Any, name: str, where: str, index: Any = ()) -> np.ndarray:
  """`store[index]` read into numpy; a missing chunk is an error naming `name`."""
  try:
    return np.asarray((store[index] if index != () else store).read().result())
  except Exception as e:  # tensorstore reports every failure as ValueError etc.
    raise _ts_error(e, name, where, "read") from e


def read_zarr_arrays(reads: Sequence[ZarrRead], where: str) -> List[np.ndarray]:
  """Reads all arrays concurrently (every open, then every read, then waits)."""
  stores = open_arrays(reads, where)
  pending = [store.read() for store in stores]
  out = []
  for r, future in zip(reads, pending):
    try:
      out.append(np.asarray(future.result()))
    except Exception as e:
      raise _ts_error(e, r.name, where, "read") from e
  return out
