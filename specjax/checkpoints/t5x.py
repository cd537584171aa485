"""Read T5X checkpoints (legacy msgpack+zarr, Orbax) and write legacy T5X ones.

Legacy T5X format (t5x/checkpoints.py, `VERSION = 3`):

    model_dir/checkpoint_N/checkpoint       msgpack written by flax serialization:
        {'version': 3, 'optimizer': {'target': params, 'state': {'step': ..., ...}}}
    model_dir/checkpoint_N/target.decoder.layers_0.mlp.wi_0.kernel/
        .zarray, 0.0, 0.1, ...              a tensorstore zarr v2 array, gzip chunks

An array written through tensorstore is replaced in the msgpack by its
tensorstore spec (`{'driver': 'zarr', 'dtype': 'bfloat16', 'kvstore': {'driver':
'file', 'path': 'target.decoder...kernel/'}, 'metadata': {'chunks': [..],
'compressor': {'id': 'gzip'}, 'shape': [..]}}`), its path relative to the
checkpoint folder (`gfile` and `gcs` kvstores are read from the checkpoint's own
folder the same way, local or gs://; tensorstore < 0.1.14 put `path` beside `kvstore`).
A gs:// checkpoint is read in place: its arrays through tensorstore's `gcs` kvstore,
its small files through `specjax.remote` (`specjax.checkpoints._paths`). Small arrays are
inline msgpack extension values (flax: code 1 = numpy array, 3 = numpy scalar).

Orbax format: `checkpoint_N/state/` (or `checkpoint_N/` itself, as older T5X
wrote it) holding `_METADATA` plus an OCDBT database; see `specjax.checkpoints._orbax`.
Orbax is not needed to read it (tensorstore's `ocdbt` driver does the work).

Reading never unpickles: the msgpack extension hook understands flax's array,
scalar and complex codes only, and array paths that are absolute or escape the
checkpoint folder are refused, as are files that resolve outside it through a
symlink. Every chunk an array declares must be stored (a missing one would
otherwise read as the fill value); metadata (shape against the declared and the
model's, chunk count) is checked before any chunk is read. Only `target` is
decoded; the optimizer state is skipped in the msgpack stream and none of its
arrays are opened.

Writing (`save_t5x`) assembles a checkpoint in a temporary sibling folder and
renames it into place in one step; without `overwrite` that rename fails if
another writer put the step in place meanwhile, and a save first recovers the
model folder from crashed saves (`specjax.checkpoints._commit`); into gs:// it
writes in place, the `checkpoint` object last (`specjax.checkpoints._save_gcs`).
It produces the legacy layout above: every target array with at least one dimension goes to
its own zarr folder (as T5X does for every partitioned parameter, i.e. every
model parameter), 0-d arrays go inline; the
state is `{'step': int32}`, exactly T5X's `InferenceState.state_dict()`, so T5X
eval/infer restore it as is. To train from it with an optimizer in T5X, restore
with `RestoreCheckpointConfig(assignment_map=((r'state/param_states.*', None),),
fallback_to_scratch=True)` so the optimizer state starts fresh.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import shutil
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np
import tensorstore as ts

from specjax import files
from specjax.checks import check_int
from specjax.checkpoints import _commit
from specjax.checkpoints import _io
from specjax.checkpoints import _orbax
from specjax.checkpoints import _paths
from specjax.params import check_params_match, flatten, unflatten

VERSION = 3
LEGACY = "legacy"
ORBAX = "orbax"
_CHUNK_BYTES = 64 * 2**20  # T5X's desired zarr chunk size
_STEP_DIR = re.compile(r"checkpoint_(\d+)")


@dataclasses.dataclass(frozen=True)
class CheckpointLocation:
  """Where a checkpoint lives once a user path has been resolved."""
  format: str  # LEGACY or ORBAX
  path: str  # LEGACY: the `checkpoint` msgpack file; ORBAX: the item folder
  step: Optional[int]  # N of the enclosing checkpoint_N folder, if any


def _in_folder(folder: str) -> Optional[Tuple[str, str]]:
  """The checkpoint stored directly in `folder` (local or gs://), if any."""
  if _paths.is_file(os.path.join(folder, "state", "_METADATA")):
    return ORBAX, os.path.join(folder, "state")
  if _paths.is_file(os.path.join(folder, "_METADATA")):
    return ORBAX, folder  # T5X's rule: _METADATA beside `checkpoint` is Orbax
  if _paths.is_file(os.path.join(folder, "checkpoint")):
    return LEGACY, os.path.join(folder, "checkpoint")
  return None


def _step_of(path: str) -> Optional[int]:
  for part in reversed(os.path.normpath(path).split(os.sep)):
    match = _STEP_DIR.fullmatch(part)
    if match:
      return int(match.group(1))
  return None


def _holds_checkpoint(folder: str) -> bool:
  return os.path.isdir(folder) and _in_folder(folder) is not None


def list_checkpoint_dirs(model_dir: str) -> List[Tuple[int, str]]:
  """(N, folder) of every complete checkpoint in a model folder, by ascending N.

  The folder is `checkpoint_N`, or, when a save that overwrote it crashed
  between its two renames (no `checkpoint_N` holds a checkpoint), the
  `checkpoint_N.old-TOKEN` folder it left, which holds the previous complete one.
  Temporary `.tmp-*` / `.del-*` folders never count, nor folders of other names.
  Where two names give one N (`checkpoint_010`, `checkpoint_10`), `checkpoint_N`
  wins; two other spellings are a ValueError naming both.
  """
  if not os.path.isdir(model_dir):
    return []
  finals: Dict[int, str] = {}
  for entry in sorted(os.listdir(model_dir)):
    match = _STEP_DIR.fullmatch(entry)
    if not match:
      continue
    step, path = int(match.group(1)), os.path.join(model_dir, entry)
    if step in finals and _holds_checkpoint(path) and _holds_checkpoint(finals[step]):
      names = sorted({os.path.basename(finals[step]), entry})
      if f"checkpoint_{step}" not in names:
        raise ValueError(f"{model_dir}: {names[0]} and {names[1]} are both step {step}; "
                         f"rename one (checkpoint_{step} is the name T5X writes)")
      path = os.path.join(model_dir, f"checkpoint_{step}")  # the name T5X writes wins
    elif step in finals and not _holds_checkpoint(path):
      continue
    finals[step] = path
  olds = _commit.old_folders(model_dir)
  out = []
  for step in sorted(set(finals) | set(olds)):
    for folder in [finals.get(step)] + olds.get(step, []):
      if folder is not None and _holds_checkpoint(folder):
        out.append((step, folder))
        break
  return out


class _Moved(FileNotFoundError):
  """A checkpoint folder that was listed went away before it was opened (a save moved it)."""


def _located(folder: str, step: Optional[int]) -> CheckpointLocation:
  found = _in_folder(folder)
  if found is None:
    raise _Moved(f"checkpoint folder {folder} went away while it was being opened")
  return CheckpointLocation(found[0], found[1], step)


def find_checkpoint(path: str) -> CheckpointLocation:
  """Resolves a model folder, a `checkpoint_N` folder or a `checkpoint` file.

  In a model folder the highest N whose `checkpoint_N` holds a complete
  checkpoint wins (numerically: checkpoint_10 beats checkpoint_9); temporary
  folders such as `checkpoint_N.tmp-...` are ignored, and a crashed overwrite
  is read from the previous checkpoint it set aside (`list_checkpoint_dirs`).

  A gs:// URL is resolved the same way, in place: a `checkpoint_N` holds a checkpoint once its
  `checkpoint` object (or Orbax `state/_METADATA`) exists, which a gs:// save writes last, so
  an unfinished save is passed over; no set-aside folders are looked for (nothing is renamed
  there).

  Raises:
    FileNotFoundError: `path` does not exist or holds no checkpoint.
    ValueError: `path` is a FIFO, device or socket, or a remote URL other than gs://.
  """
  path = files.check_path(path, "the checkpoint path")
  if _paths.is_remote(path):
    return _find_remote(path.rstrip("/"))
  match = _STEP_DIR.fullmatch(os.path.basename(os.path.normpath(path)))
  if match and not (os.path.isdir(path) and _in_folder(path)):
    # checkpoint_N named directly, but an overwrite crashed between its renames.
    parent = os.path.dirname(os.path.normpath(path)) or "."
    step = int(match.group(1))
    for folder in (_commit.old_folders(parent).get(step, [])
                   if os.path.isdir(parent) else []):
      if _holds_checkpoint(folder):
        return _located(folder, step)
  if not os.path.exists(path):
    raise FileNotFoundError(f"checkpoint path does not exist: {path}")
  if not os.path.isdir(path):
    files.check_regular(path, "the checkpoint path")  # a FIFO would block its reader
  if os.path.isfile(path):
    found = _in_folder(os.path.dirname(os.path.abspath(path)))
    if found is None or (found[0] == LEGACY and
                         os.path.basename(path) != "checkpoint"):
      found = (LEGACY, path)
    return CheckpointLocation(found[0], found[1], _step_of(found[1]))
  found = _in_folder(path)
  if found is not None:
    return CheckpointLocation(found[0], found[1], _step_of(found[1]))
  steps = list_checkpoint_dirs(path)
  if steps:
    step, folder = steps[-1]
    return _located(folder, step)
  raise FileNotFoundError(
      f"no T5X checkpoint in {path}: expected a 'checkpoint' msgpack file, "
      "'state/_METADATA' (Orbax) or checkpoint_N folders holding one")


def _find_remote(path: str) -> CheckpointLocation:
  """`find_checkpoint` of a gs:// URL: an object (the `checkpoint` file), a folder holding a
  checkpoint, or a model folder (its highest complete `checkpoint_N`). A save into a bucket
  renames nothing (`_save_gcs`), so no set-aside folders are looked for."""
  if _paths.is_file(path):
    found = _in_folder(_paths.dirname(path))
    if found is None or (found[0] == LEGACY and os.path.basename(path) != "checkpoint"):
      found = (LEGACY, path)
    return CheckpointLocation(found[0], found[1], _step_of(found[1]))
  found = _in_folder(path)
  if found is not None:
    return CheckpointLocation(found[0], found[1], _step_of(found[1]))
  from specjax import remote  # pylint: disable=import-outside-toplevel
  names = remote.children(path)
  if not names:
    raise FileNotFoundError(f"checkpoint path does not exist: {path} (no object or folder of "
                            f"that name, or no bucket {remote.split(path)[0]!r})")
  steps = sorted(((int(m.group(1)), m.group(0)) for m in map(_STEP_DIR.fullmatch, names) if m),
                 reverse=True)
  for step, name in steps:
    found = _in_folder(os.path.join(path, name))
    if found is not None:
      return CheckpointLocation(found[0], found[1], step)
  raise FileNotFoundError(
      f"no T5X checkpoint in {path}: expected a 'checkpoint' msgpack object, "
      "'state/_METADATA' (Orbax) or checkpoint_N folders holding one")


# ----------------------------------------------------------------------------
# Reading


def _is_ts_spec(node: Any) -> bool:
  return isinstance(node, dict) and {"driver", "kvstore", "metadata"} <= set(node)


def _declared_dtype(spec: Dict[str, Any], meta: Dict[str, Any], name: str,
                    where: str) -> Optional[np.dtype]:
  declared = spec.get("dtype", meta.get("dtype"))
  if declared is None:
    return None
  try:
    return np.dtype(declared)
  except TypeError as e:
    raise ValueError(f"{where}: parameter '{name}' declares an unknown dtype "
                     f"{declared!r}") from e


def _legacy_read(spec: Dict[str, Any], ckpt_dir: str, name: str, where: str,
                 expected: Optional[Tuple[int, ...]] = None) -> _io.ZarrRead:
  """Turns a T5X tensorstore spec from the msgpack into a safe local read.

  The declared shape is checked against `expected` (the model's) and the
  folder's .zarray before any chunk is looked for (`_io.check_zarr_folder`).
  """
  if spec.get("driver") != "zarr":
    raise ValueError(f"{where}: parameter '{name}' uses tensorstore driver "
                     f"{spec.get('driver')!r}; only 'zarr' is supported")
  kvstore, meta = spec.get("kvstore"), spec.get("metadata")
  if not isinstance(kvstore, dict) or not isinstance(meta, dict):
    raise ValueError(f"{where}: parameter '{name}' has a malformed tensorstore "
                     f"spec {spec!r}")
  if kvstore.get("driver") not in ("file", "gfile", "gcs"):
    raise ValueError(f"{where}: parameter '{name}' uses kvstore driver "
                     f"{kvstore.get('driver')!r}; expected 'file', 'gfile' or "
                     "'gcs' (read from the local checkpoint folder)")
  rel = kvstore["path"] if "path" in kvstore else spec.get("path")
  folder = _io.safe_join(ckpt_dir, rel, name, where)
  shape = meta.get("shape")
  if shape is not None and not _io.int_list(shape):
    raise ValueError(f"{where}: parameter '{name}' declares an invalid shape "
                     f"{shape!r}")
  if shape is not None and expected is not None and tuple(shape) != tuple(expected):
    raise ValueError(f"{where}: parameter '{name}' has shape {tuple(shape)} but the "
                     f"model config expects {tuple(expected)}")
  dtype = _declared_dtype(spec, meta, name, where)
  checked, source = ((shape, "the checkpoint declares") if shape is not None
                     else (expected, "the model config expects"))
  zarray = _io.check_zarr_folder(ckpt_dir, folder, name, where, meta,
                                 shape=checked, shape_source=source, dtype=dtype)
  open_spec: Dict[str, Any] = {"driver": "zarr", "kvstore": _paths.kvstore(folder)}
  if zarray is None:  # rebuild the array metadata from the msgpack's spec
    missing = [k for k in ("shape", "chunks", "compressor") if k not in meta]
    if dtype is None:
      missing.append("dtype")
    if missing:
      raise ValueError(f"{where}: parameter '{name}' has no .zarray in {folder} "
                       f"and its spec lacks {missing} to rebuild it")
    open_spec["dtype"] = dtype.name
    open_spec["metadata"] = {
        k: meta[k] for k in ("shape", "chunks", "compressor", "order",
                             "fill_value", "filters", "dimension_separator")
        if k in meta}
  elif _paths.is_remote(folder):  # the .zarray just checked, not fetched again at the open
    open_spec["metadata"] = zarray
  return _io.ZarrRead(name=name, spec=open_spec,
                      shape=None if shape is None else tuple(shape),
                      dtype=dtype, assume_metadata="metadata" in open_spec,
                      expected=expected)


def load_legacy_target(ckpt_file: str, where: str,
                       read_arrays: Callable[..., List[Any]] = _io.read_zarr_arrays,
                       expected: Optional[Mapping[str, Tuple[int, ...]]] = None
                       ) -> Dict[str, Any]:
  """Reads optimizer/target of a legacy checkpoint -> {'a/b/kernel': array}.

  `read_arrays(reads, where)` reads the zarr arrays (`specjax.checkpoints.sharded`
  passes one that only opens them, to read per shard). With `expected` ({name: shape} of
  the model) names and shapes are checked before any array is opened.
  """
  ckpt_dir = _paths.dirname(_paths.absolute(ckpt_file))
  if _paths.is_remote(ckpt_dir):  # one listing and every .zarray at once, not one by one
    _paths.prefetch_metadata(ckpt_dir, where)
  _io.check_inside(ckpt_dir, ckpt_file, "the checkpoint file", where)
  data = files.read_bytes(ckpt_file, _io.max_array_bytes(), "the checkpoint file")
  if data.startswith(b"model_checkpoint_path"):
    raise ValueError(f"{ckpt_file} is a TensorFlow checkpoint index, not a T5X "
                     "checkpoint; convert it with T5X first")
  version, target = _io.decode_t5x_target(data, ckpt_file)
  if version not in (2, VERSION):
    raise ValueError(f"{ckpt_file}: unsupported T5X checkpoint version "
                     f"{version} (expected 2 or 3)")
  if not isinstance(target, dict):
    raise ValueError(f"{ckpt_file}: 'optimizer/target' is not a tree of arrays")
  out: Dict[str, Any] = {}
  specs: Dict[str, Dict[str, Any]] = {}

  def walk(node: Dict[Any, Any], prefix: str, depth: int = 0) -> None:
    _io.check_depth(depth, where)
    for key, value in node.items():
      if not isinstance(key, str) or not key or "/" in key:
        raise ValueError(f"{where}: invalid parameter name {key!r} under "
                         f"'{prefix or 'target'}'")
      name = f"{prefix}/{key}" if prefix else key
      if _is_ts_spec(value):
        specs[name] = value
        out[name] = None
      elif isinstance(value, dict):
        walk(value, name, depth + 1)
      elif isinstance(value, (np.ndarray, np.generic, int, float, complex)):
        out[name] = np.asarray(value)
      else:
        raise ValueError(f"{where}: parameter '{name}' holds a "
                         f"{type(value).__name__}, not an array")

  walk(target, "")
  if expected is not None:
    def declared(name):
      shape = specs[name].get("metadata", {}).get("shape") if isinstance(
          specs[name].get("metadata"), dict) else None
      return tuple(shape) if _io.int_list(shape) else None
    _io.check_names({n: (np.shape(a) if n not in specs else declared(n))
                     for n, a in out.items()}, expected, where)
  reads = [_legacy_read(spec, ckpt_dir, name, where,
                        None if expected is None else tuple(expected[name]))
           for name, spec in specs.items()]
  for read, arr in zip(reads, read_arrays(reads, where)):
    out[read.name] = arr
  if version == 2:
    for name, arr in out.items():
      if arr.dtype == np.uint16:
        raise ValueError(f"{where}: parameter '{name}' is uint16, how T5X "
                         "version-2 checkpoints stored bfloat16; re-save it "
                         "with a current T5X")
  return out


def _expected_shapes(model: Any) -> Dict[str, Tuple[int, ...]]:
  return {name: tuple(leaf.shape) for name, leaf in flatten(model.param_shapes())}


_SNAPSHOT_TRIES = 20
"""Times a reader resolves a checkpoint name again after a save moved it away."""


def _checkpoint_folder(location: CheckpointLocation) -> str:
  """The folder a save renames as a whole: `checkpoint_N` (or the item folder itself)."""
  item = os.path.abspath(location.path)
  if location.format == LEGACY or os.path.basename(item) == "state":
    return os.path.dirname(item)
  return item


@contextlib.contextmanager
def snapshot(path: str, where: str) -> Iterator[CheckpointLocation]:
  """The checkpoint at `path`, held for reading as one save while the block runs.

  The checkpoint folder is found and share-locked (`_commit.reading`), so no
  `save_t5x(overwrite=True)`, pruning or recovery renames or deletes it until
  the block ends; if a save moved the name before the lock was taken, the name
  is resolved again. Every read of the block thus comes from one save.

  Raises:
    FileNotFoundError: as `find_checkpoint`.
    ValueError: saves kept replacing the checkpoint (_SNAPSHOT_TRIES times).

  A gs:// checkpoint is not locked (a bucket has no locks; T5X writes a step once).
  """
  if _paths.is_remote(path):
    from specjax import remote  # pylint: disable=import-outside-toplevel
    with remote.cached(), _paths.one_context():
      yield find_checkpoint(path)
    return
  for attempt in range(_SNAPSHOT_TRIES):
    try:
      location = find_checkpoint(path)
    except _Moved:
      continue
    except FileNotFoundError:
      # A model folder listed in the instant an overwrite's old folder went away.
      if attempt >= 2 or not os.path.isdir(path):
        raise
      time.sleep(0.01)
      continue
    with _commit.reading(_checkpoint_folder(location)) as same:
      if same:
        with _paths.one_context():
          yield location
        return
  raise ValueError(f"{where}: the checkpoint was replaced by another save each of the "
                   f"{_SNAPSHOT_TRIES} times it was opened; retry when the writer is done")


def read_flat(location: CheckpointLocation, where: str,
              expected: Optional[Mapping[str, Tuple[int, ...]]] = None,
              read_arrays: Callable[..., List[Any]] = _io.read_zarr_arrays
              ) -> Dict[str, Any]:
  """The target leaves of the checkpoint at `location` as {'a/b/kernel': array}.

  Call it inside `snapshot` (which gives `location`) so every read is of one save.

  Args:
    location: from `snapshot` / `find_checkpoint`.
    where: how messages name the checkpoint.
    expected: {name: shape} the model expects; checked before arrays are read.
    read_arrays: reads the zarr arrays of either format (`specjax.checkpoints.sharded`
      opens them lazily, and reads them before its `snapshot` ends).
  """
  if location.format == ORBAX:
    flat = _orbax.load_target(location.path, where, expected, read_arrays)
  else:
    flat = load_legacy_target(location.path, where, read_arrays, expected)
  if not flat:
    raise ValueError(f"{where}: the checkpoint's target tree is empty")
  return flat


def load_flat(path: str, where: str,
              expected: Optional[Mapping[str, Tuple[int, ...]]] = None) -> Dict[str, Any]:
  """`read_flat` of the checkpoint at `path` (as for `load_t5x`), read as one save."""
  with snapshot(path, where) as location:
    return read_flat(location, where, expected)


def load_t5x(path: str, *, dtype: Any = None) -> Dict[str, Any]:
  """Loads the `target` tree (the model parameters) of a T5X checkpoint.

  Args:
    path: a model folder (the highest `checkpoint_N` is used), a
      `checkpoint_N` folder, its `checkpoint` file, or an Orbax item folder; local, or a
      gs:// URL read in place (docs/checkpoints.md, "Checkpoints in Google Cloud Storage").
    dtype: None keeps the stored dtypes; otherwise floating-point arrays are
      cast to it (e.g. 'float32', 'bfloat16'); integer arrays are kept.

  Returns:
    Nested dicts of numpy arrays with T5X names, e.g.
    `params['decoder']['layers_0']['mlp']['wi_0']['kernel']`.

  Raises:
    FileNotFoundError: no checkpoint at `path`.
    ValueError: a corrupt msgpack, a missing array or chunk, an unsafe array
      path, a symlink out of the checkpoint folder or anything else wrong
      inside the checkpoint (the message names it).
  """
  return _load(path, dtype, None)


def check_path(path: Any, what: str, remote: bool = False) -> str:
  """os.fspath(path); ValueError naming `what` unless path is a non-empty str or PathLike of
  the local file system, or (`remote`: where it is read) a gs:// URL."""
  if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
    raise ValueError(f"{what}: the checkpoint path must be a non-empty str or os.PathLike, "
                     f"got {path!r}")
  if remote:
    return files.check_path(path, f"{what}: the checkpoint path")
  return files.check_local(path, f"{what}: the checkpoint path")


def _load(path: str, dtype: Any, model: Any) -> Dict[str, Any]:
  cast = _io.resolve_dtype(dtype, "load_t5x")
  where = check_path(path, "load_t5x", remote=True)
  if model is not None and not callable(getattr(model, "param_shapes", None)):
    raise ValueError(f"load_t5x_for_model: model must be a specjax model (with param_shapes()), "
                     f"got {type(model).__name__}")
  expected = None if model is None else _expected_shapes(model)
  flat = load_flat(path, where, expected)
  _io.warn_non_finite(where, {n: _io.count_non_finite(a) for n, a in flat.items()},
                      {n: int(np.size(a)) for n, a in flat.items()})
  if cast is not None:
    cast_and_count = {name: _io.cast_float(arr, cast) for name, arr in flat.items()}
    flat = {name: arr for name, (arr, _) in cast_and_count.items()}
    _io.warn_overflow(where, cast, {n: c for n, (_, c) in cast_and_count.items()},
                      {n: int(np.size(a)) for n, a in flat.items()})
  params = unflatten(flat)
  if model is not None:
    check_params_match(params, model.param_shapes(), what=where)
  return params


def load_t5x_for_model(path: str, model: Any, *, dtype: Any = None
                       ) -> Dict[str, Any]:
  """`load_t5x`, checking names and shapes against `model.param_shapes()`.

  Names and shapes are checked from the checkpoint's metadata before any
  array is read, so a checkpoint of another model costs nothing to refuse.

  Args:
    path: as for `load_t5x`.
    model: any object whose `param_shapes()` returns the expected tree (leaves
      with `.shape`, e.g. `jax.ShapeDtypeStruct`).
    dtype: as for `load_t5x`.

  Raises:
    ValueError: naming the first parameter that is missing, unexpected or of
      the wrong shape (besides the errors of `load_t5x`).
  """
  return _load(path, dtype, model)


# ----------------------------------------------------------------------------
# Writing


def _chunk_shape(shape: Tuple[int, ...], itemsize: int) -> List[int]:
  """Largest chunk of at most 64 MiB whose sides divide the array's sides.

  The currently longest chunk side is shrunk to its next smaller divisor until
  the chunk fits (the rule T5X uses, so chunks tile the array exactly).
  """
  limit = max(1, _CHUNK_BYTES // itemsize)
  chunk = [max(1, s) for s in shape]
  while math.prod(chunk) > limit:
    axis = max(range(len(chunk)), key=lambda i: chunk[i])
    size = shape[axis]
    chunk[axis] = max(d for d in range(1, chunk[axis]) if size % d == 0)
  return chunk


def _as_array(value: Any, name: str) -> np.ndarray:
  # value: an array-like of any shape; returns it as numpy with a numeric dtype.
  try:
    arr = np.asarray(value)
  except Exception as e:  # arbitrary objects may fail in arbitrary ways
    raise ValueError(f"save_t5x: parameter '{name}' is not an array: {e}") from e
  if arr.dtype.name not in _io.ARRAY_DTYPES:
    raise ValueError(f"save_t5x: parameter '{name}' has unsupported dtype "
                     f"{arr.dtype}")
  return arr


def _build_target(node: Mapping[Any, Any], prefix: str, cast: Optional[np.dtype],
                  ckpt_dir: str, writes: List[Tuple[Dict[str, Any], np.ndarray]],
                  folders: Dict[str, str]) -> Dict[str, Any]:
  """The msgpack `target` tree; queues (absolute spec, array) zarr writes.

  `node` leaves are arrays of any shape (numpy or jax, numeric dtype); 0-d
  ones stay inline, the others become tensorstore specs.
  """
  out: Dict[str, Any] = {}
  for key, value in node.items():
    if not isinstance(key, str) or not key or "/" in key or "\x00" in key:
      raise ValueError(f"save_t5x: invalid parameter name {key!r} under "
                       f"'{prefix or 'params'}' (names are non-empty strings "
                       "without '/')")
    name = f"{prefix}/{key}" if prefix else key
    if isinstance(value, Mapping):
      out[key] = _build_target(value, name, cast, ckpt_dir, writes, folders)
      continue
    arr, overflowed = _io.cast_float(_as_array(value, name), cast)
    if overflowed:
      _io.warn_overflow("save_t5x", cast, {name: overflowed}, {name: int(arr.size)})
    if arr.ndim == 0:
      out[key] = arr
      continue
    folder = "target." + name.replace("/", ".")
    if folder in folders:
      raise ValueError(f"save_t5x: parameters '{folders[folder]}' and '{name}' "
                       f"would share the array folder {folder}")
    folders[folder] = name
    spec = {"driver": "zarr", "dtype": arr.dtype.name,
            "kvstore": {"driver": "file", "path": folder + "/"},
            "metadata": {"chunks": _chunk_shape(arr.shape, arr.dtype.itemsize),
                         "compressor": {"id": "gzip", "level": 1},
                         "shape": [int(d) for d in arr.shape]}}
    out[key] = spec
    absolute = dict(spec, kvstore=_paths.kvstore(os.path.join(ckpt_dir, folder)))
    writes.append((absolute, np.ascontiguousarray(arr)))
  return out


def _write_zarr(writes: List[Tuple[Dict[str, Any], np.ndarray]]) -> None:
  """Creates every zarr array, starts every write, then waits for all.

  Args:
    writes: (absolute tensorstore spec, array of the spec's shape and dtype).
  """
  context = ts.Context(_paths.context([spec for spec, _ in writes]))
  opens = [ts.open(spec, create=True, context=context) for spec, _ in writes]
  stores = [future.result() for future in opens]
  pending = [store.write(arr) for store, (_, arr) in zip(stores, writes)]
  for future in pending:
    future.result()


def _write_file(path: str, payload: bytes, final: str) -> None:
  """Writes a new file of the checkpoint being built (`path`, inside its temporary folder);
  an OSError names the checkpoint `final` and the file (a full disk gives none)."""
  try:
    with open(path, "xb") as f:
      f.write(payload)
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:
    raise OSError(e.errno, f"cannot write {os.path.basename(path)} of checkpoint {final}: "
                  f"{e.strerror}") from e


def _check_extra(extra_files: Optional[Mapping[str, bytes]]) -> Dict[str, bytes]:
  out = {}
  for name, payload in (extra_files or {}).items():
    if (not isinstance(name, str) or not name or name in (".", "..", "checkpoint")
        or "/" in name or os.sep in name or "\x00" in name or name.startswith("target.")):
      raise ValueError(f"save_t5x: invalid extra file name {name!r} (a plain file name, "
                       "not 'checkpoint' or 'target.*')")
    if not isinstance(payload, (bytes, bytearray, memoryview)):
      raise ValueError(f"save_t5x: extra file {name!r} must be bytes, got "
                       f"{type(payload).__name__}")
    out[name] = bytes(payload)
  return out


def clean_model_dir(path: str) -> List[str]:
  """Recovers a model folder from crashed saves; returns what it changed.

  A `checkpoint_N.old-*` folder left by an overwrite that died between its two
  renames goes back to `checkpoint_N`; temporary `.tmp-*` / `.old-*` / `.del-*`
  folders of writers that are gone are deleted (same host: the PID in their
  name no longer runs; otherwise after a day). `save_t5x` runs this first.
  """
  if not os.path.isdir(path):
    return []
  return _commit.recover(os.fspath(path), _holds_checkpoint)


def delete_checkpoint(path: str, step: int) -> None:
  """Removes `path/checkpoint_{step}`, renamed aside first so no half-deleted
  folder keeps a checkpoint's name."""
  folder = os.path.join(os.fspath(path), f"checkpoint_{int(step)}")
  if os.path.lexists(folder):
    _commit.discard(folder)


def save_t5x(params: Mapping[str, Any], path: str, *, step: int = 0,
             dtype: Any = "bfloat16", overwrite: bool = False,
             extra_files: Optional[Mapping[str, bytes]] = None) -> str:
  """Writes `params` as the T5X checkpoint `path/checkpoint_{step}`.

  The checkpoint is assembled in a temporary sibling folder and renamed into
  place, so `checkpoint_{step}` is either absent or complete (with its extra
  files); see `specjax.checkpoints._commit`. Leftovers of crashed saves in
  `path` are cleaned first (`clean_model_dir`). A gs:// `path` is written in
  place, its `checkpoint` object last (a bucket has no rename; an existing
  checkpoint is not replaced there): `specjax.checkpoints._save_gcs`.

  Args:
    params: nested dicts of arrays (numpy or jax) with T5X names.
    path: the model folder (created if needed), local or gs://.
    step: the training step, N in `checkpoint_N` and `state/step`.
    dtype: floating-point arrays are stored in this dtype ('bfloat16' or
      'float32', say); None keeps each array's dtype.
    overwrite: replace an existing `checkpoint_{step}` instead of failing.
    extra_files: {file name: bytes} written into the checkpoint folder and
      committed with it (e.g. an optimizer state); T5X ignores them.

  Returns:
    The path of the written `checkpoint_{step}` folder.

  Raises:
    FileExistsError: `checkpoint_{step}` exists, or another writer put it in
      place while this one was writing, and `overwrite` is False.
    ValueError: params that are not a non-empty tree of numeric arrays, an
      invalid name, step, dtype or extra file.
  """
  cast = _io.resolve_dtype(dtype, "save_t5x")
  check_int("save_t5x: step", step, low=0, high=2**31 - 1, expected="an integer in [0, 2**31)")
  if not isinstance(params, Mapping) or not params:
    raise ValueError("save_t5x: params must be a non-empty nested dict of arrays")
  extra = _check_extra(extra_files)
  step = int(step)
  path = check_path(path, "save_t5x", remote=True)
  if _paths.is_remote(path):
    from specjax.checkpoints import _save_gcs  # pylint: disable=import-outside-toplevel
    return _save_gcs.save(params, path, step, cast, overwrite, extra,
                          build_target=_build_target, write_zarr=_write_zarr, version=VERSION)
  if os.path.exists(path) and not os.path.isdir(path):
    raise FileExistsError(f"save_t5x: {path} is a file, not a model folder to write "
                          "checkpoint_N into")
  os.makedirs(path, exist_ok=True)
  clean_model_dir(path)
  final = os.path.join(path, f"checkpoint_{step}")
  if os.path.lexists(final) and not overwrite:
    raise FileExistsError(f"checkpoint already exists: {final} "
                          "(pass overwrite=True to replace it)")
  tmp = _commit.new_name(final, "tmp")
  os.mkdir(tmp)
  try:
    writes: List[Tuple[Dict[str, Any], np.ndarray]] = []
    target = _build_target(params, "", cast, tmp, writes, {})
    _write_zarr(writes)
    for name, payload in extra.items():
      _write_file(os.path.join(tmp, name), payload, final)
    _write_file(os.path.join(tmp, "checkpoint"), _io.encode({
        "version": VERSION,
        "optimizer": {"target": target,
                      "state": {"step": np.asarray(step, np.int32)}}}), final)
    _commit.fsync_dir(tmp)
    try:
      _commit.commit(tmp, final, overwrite)
    except FileExistsError as e:
      raise FileExistsError(f"checkpoint already exists: {final} (another writer put it "
                            "in place while this one was writing; pass overwrite=True "
                            "to replace it)") from e
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  finally:
    _commit.release(tmp)
  return final
