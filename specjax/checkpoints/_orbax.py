"""Reads the `target` tree of a T5X Orbax checkpoint without importing orbax.

Layout written by orbax-checkpoint's PyTreeCheckpointHandler (what T5X uses,
item folder `checkpoint_N/state/`, or `checkpoint_N/` itself in older T5X):

- `_METADATA`: JSON. Current orbax writes ``{"tree_metadata": {"('optimizer',
  'target', 'encoder', ...)": {"key_metadata": [{"key": "optimizer",
  "key_type": 2}, ...], "value_metadata": {"value_type": "jax.Array",
  "skip_deserialize": false}}, ...}, "use_ocdbt": true, "use_zarr3": false}``;
  older orbax wrote the nested tree of value metadata directly. Both are read.
- Each array is a zarr (or zarr3) array whose name is the tree path joined
  with '.' (`optimizer.target.encoder.layers_0.mlp.wi_0.kernel`), stored
  either in one OCDBT database (`manifest.ocdbt`, `d/`, `ocdbt.process_N/`)
  or, without OCDBT, as a plain folder of that name.
- Values with `skip_deserialize: true` (orbax < 0.5 "aggregated" values) live
  in the msgpack file `checkpoint` of the item folder.

Only the leaves under `optimizer/target` (or a top-level `target`) are read.
"""
from __future__ import annotations

import ast
import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorstore as ts

from specjax import files
from specjax.checkpoints import _io
from specjax.checkpoints import _paths

_ARRAY_TYPES = ("jax.Array", "np.ndarray", "scalar", None)
_AGGREGATE_FILE = "checkpoint"

Entry = Tuple[Tuple[str, ...], Dict[str, Any]]  # (tree keys, value metadata)


def _read_json(path: str) -> Any:
  try:
    return json.loads(files.read_bytes(path, _io.METADATA_BYTES, "the Orbax metadata"))
  except RecursionError:
    raise ValueError(f"unreadable Orbax metadata {path}: nested too deep") from None
  except (OSError, ValueError) as e:
    raise ValueError(f"unreadable Orbax metadata {path}: {e}") from e


def _keys_of(flat_key: str, entry: Dict[str, Any], where: str) -> Tuple[str, ...]:
  key_meta = entry.get("key_metadata")
  if isinstance(key_meta, list) and all(isinstance(k, dict) for k in key_meta):
    return tuple(str(k.get("key")) for k in key_meta)
  try:  # "('a', 'b')" -> ('a', 'b'); literal_eval evaluates literals only.
    keys = ast.literal_eval(flat_key)
  except (ValueError, SyntaxError) as e:
    raise ValueError(f"{where}: unreadable tree key {flat_key!r}") from e
  if not isinstance(keys, tuple):
    raise ValueError(f"{where}: unreadable tree key {flat_key!r}")
  return tuple(str(k) for k in keys)


def _is_value_meta(node: Any) -> bool:
  return isinstance(node, dict) and ("value_type" in node or
                                     "skip_deserialize" in node)


def tree_entries(meta: Any, where: str) -> List[Entry]:
  """Every leaf of the saved tree as (keys, value metadata)."""
  if not isinstance(meta, dict):
    raise ValueError(f"{where}: Orbax _METADATA is not a JSON object")
  if isinstance(meta.get("tree_metadata"), dict):
    entries = []
    for flat_key, entry in meta["tree_metadata"].items():
      if not isinstance(entry, dict):
        raise ValueError(f"{where}: malformed entry for {flat_key!r}")
      value_meta = entry.get("value_metadata")
      entries.append((_keys_of(flat_key, entry, where),
                      value_meta if isinstance(value_meta, dict) else {}))
    return entries
  entries = []

  def walk(node: Dict[str, Any], keys: Tuple[str, ...]) -> None:
    _io.check_depth(len(keys), where)
    for key, value in node.items():
      if _is_value_meta(value):
        entries.append((keys + (str(key),), value))
      elif isinstance(value, dict):
        walk(value, keys + (str(key),))

  walk(meta, ())
  return entries


def _target_prefix(entries: Sequence[Entry], where: str) -> Tuple[str, ...]:
  for prefix in (("optimizer", "target"), ("target",)):
    if any(keys[:len(prefix)] == prefix and len(keys) > len(prefix)
           for keys, _ in entries):
      return prefix
  tops = sorted({keys[0] for keys, _ in entries if keys})
  raise ValueError(f"{where}: the Orbax checkpoint has no 'optimizer/target' "
                   f"(or 'target') tree; top-level keys: {tops}")


def _param_name(sub: Tuple[str, ...], where: str) -> str:
  for key in sub:
    if not key or "/" in key or "\x00" in key or key in (".", ".."):
      raise ValueError(f"{where}: invalid parameter name component {key!r} "
                       f"in {'/'.join(sub)!r}")
  return "/".join(sub)


def _ocdbt_keys(item_dir: str, where: str) -> set:
  # Every file of the database must resolve inside the item folder.
  _io.scan_files(item_dir, item_dir, "the OCDBT database", where)
  try:
    kv = ts.KvStore.open(_paths.ocdbt_kvstore(item_dir),
                         context=_paths.open_context([item_dir])).result()
    return {k.decode("utf-8", errors="replace") for k in kv.list().result()}
  except Exception as e:  # tensorstore raises ValueError and friends
    raise ValueError(f"{where}: cannot open the OCDBT database in {item_dir}: "
                     f"{e}") from e


def _aggregate_value(item_dir: str, keys: Tuple[str, ...], name: str,
                     cache: Dict[str, Any], where: str) -> np.ndarray:
  path = os.path.join(item_dir, _AGGREGATE_FILE)
  if "tree" not in cache:
    if not _paths.is_file(path):
      raise ValueError(f"{where}: parameter '{name}' is stored in the "
                       f"aggregate file {path}, which is missing")
    _io.check_inside(item_dir, path, "the aggregate file", where)
    cache["tree"] = _io.decode_all(
        files.read_bytes(path, _io.max_array_bytes(), "the aggregate file"), path)
  node = cache["tree"]
  for key in keys:
    if not isinstance(node, dict) or key not in node:
      raise ValueError(f"{where}: the array of parameter '{name}' is missing "
                       f"from the aggregate file {path}")
    node = node[key]
  if not isinstance(node, (np.ndarray, np.generic, int, float)):
    raise ValueError(f"{where}: parameter '{name}' in {path} is not an array")
  return np.asarray(node)


def load_target(item_dir: str, where: str,
                expected: Optional[Dict[str, Tuple[int, ...]]] = None,
                read_arrays: Callable[..., List[Any]] = _io.read_zarr_arrays,
                name_of: Optional[Callable[[Tuple[str, ...]], Optional[str]]] = None
                ) -> Dict[str, Any]:
  """Reads the target leaves of an Orbax item folder -> {'a/b/kernel': array}.

  `read_arrays(reads, where)` reads the zarr arrays (`specjax.checkpoints.sharded`
  opens them lazily, so each process reads only its shards). `name_of(tree keys)` gives a
  saved leaf's parameter name, or None to leave it unread; by default the leaves under
  T5X's `optimizer/target` (or `target`), named by their path below it.

  Every chunk an array declares must be stored (unless `_METADATA` says the
  writer skipped chunks equal to the fill value), every file read must resolve
  inside `item_dir`, and with `expected` ({name: shape} of the model) names are
  checked before any array is opened and shapes before any chunk is read.
  """
  item_dir = _paths.absolute(item_dir)
  if _paths.is_remote(item_dir):  # one listing and the metadata at once, not one by one
    _paths.prefetch_metadata(item_dir, where, ("_METADATA",))
  meta_path = os.path.join(item_dir, "_METADATA")
  _io.check_inside(item_dir, meta_path, "the Orbax _METADATA file", where)
  meta = _read_json(meta_path)
  entries = tree_entries(meta, meta_path)
  if name_of is None:
    prefix = _target_prefix(entries, where)

    def name_of(keys: Tuple[str, ...]) -> Optional[str]:
      if keys[:len(prefix)] != prefix or len(keys) == len(prefix):
        return None
      return _param_name(keys[len(prefix):], where)
  use_zarr3 = meta.get("use_zarr3") is True
  # Orbax records whether chunks equal to the fill value were written; only an
  # explicit False lets a missing chunk read as the fill value.
  allow_missing = meta.get("store_array_data_equal_to_fill_value") is False
  driver = "zarr3" if use_zarr3 else "zarr"
  marker = "zarr.json" if use_zarr3 else ".zarray"
  ocdbt = _paths.is_file(os.path.join(item_dir, "manifest.ocdbt"))
  if meta.get("use_ocdbt") is True and not ocdbt:
    raise ValueError(f"{where}: {meta_path} says the arrays are in an OCDBT database, but "
                     f"its manifest {os.path.join(item_dir, 'manifest.ocdbt')} is missing (or "
                     "not a regular file)")

  targets = _target_arrays(entries, name_of, where)
  if expected is not None:
    _io.check_names({name: None for _, _, name in targets}, expected, where)
  present: Optional[set] = _ocdbt_keys(item_dir, where) if ocdbt else None

  out: Dict[str, np.ndarray] = {}
  reads: List[_io.ZarrRead] = []
  aggregate_cache: Dict[str, Any] = {}
  for keys, value_meta, name in targets:
    want = None if expected is None else tuple(expected[name])
    if value_meta.get("skip_deserialize") is True:
      out[name] = _aggregate_value(item_dir, keys, name, aggregate_cache, where)
      if want is not None and out[name].shape != want:
        raise ValueError(f"{where}: shape mismatch: parameter '{name}' has shape "
                         f"{out[name].shape} but the model config expects {want}")
      continue
    kvstore = _array_kvstore(item_dir, ".".join(keys), name, marker, present, want,
                             use_zarr3, allow_missing, where)
    out[name] = None  # filled below, keeps the tree order of the metadata
    reads.append(_io.ZarrRead(name=name, spec={"driver": driver, "kvstore": kvstore},
                              expected=want, allow_missing_chunks=allow_missing))
  for read, arr in zip(reads, read_arrays(reads, where)):
    out[read.name] = arr
  return out


def _target_arrays(entries, name_of, where: str) -> List[Tuple[Tuple[str, ...], Dict, str]]:
  """(keys, value metadata, parameter name) of every array `name_of` names."""
  targets = []
  for keys, value_meta in entries:
    name = name_of(keys)
    if name is None:
      continue
    if value_meta.get("value_type") not in _ARRAY_TYPES:
      raise ValueError(f"{where}: parameter '{name}' has Orbax value type "
                       f"{value_meta.get('value_type')!r}, not an array")
    targets.append((keys, value_meta, name))
  return targets


def _array_kvstore(item_dir: str, stored: str, name: str, marker: str,
                   present: Optional[set], want, use_zarr3: bool, allow_missing: bool,
                   where: str) -> Dict[str, Any]:
  """The tensorstore kvstore of one stored array (in the OCDBT database whose keys are
  `present`, else its own folder), after checking that its metadata is there."""
  if present is not None:
    if f"{stored}/{marker}" not in present:
      raise ValueError(f"{where}: the array of parameter '{name}' is missing "
                       f"(no '{stored}/{marker}' in the OCDBT database)")
    return _paths.ocdbt_kvstore(item_dir, stored + "/")
  folder = _io.safe_join(item_dir, stored, name, where)
  what = f"the array of parameter '{name}'"
  if use_zarr3:
    if not _paths.is_file(os.path.join(folder, marker)):
      raise ValueError(f"{where}: {what} is missing (no {os.path.join(folder, marker)})")
    _io.scan_files(item_dir, folder, what, where)
  elif _io.check_zarr_folder(item_dir, folder, name, where, {}, shape=want,
                             shape_source="the model config expects",
                             require_all_chunks=not allow_missing) is None:
    raise ValueError(f"{where}: {what} is missing its metadata "
                     f"{os.path.join(folder, marker)}")
  return _paths.kvstore(folder)
