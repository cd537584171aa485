"""Loading a T5X checkpoint straight into sharded `jax.Array`s (per-shard reads)."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import jax
import numpy as np

from specjax.checkpoints import _io
from specjax.checkpoints.t5x import check_path, read_flat, snapshot
from specjax.params import check_params_match, flatten, unflatten
from specjax.runtime.sharding import Partitioner


class _LazyZarr:
  """An opened, unread zarr array: `shape`, `dtype`; `[index]` reads only that slice."""

  def __init__(self, store: Any, name: str, where: str):
    self.store, self.name, self.where = store, name, where
    self.shape = tuple(store.shape)
    self.dtype = np.dtype(store.dtype.numpy_dtype)

  def __getitem__(self, index: Any) -> np.ndarray:
    # A missing chunk fails here too (the store was opened with
    # fill_missing_data_reads=False by `_io.open_arrays`).
    return _io.read_array(self.store, self.name, self.where, index)


def _open_lazy(reads: List[_io.ZarrRead], where: str) -> List[_LazyZarr]:
  """Opens (and checks: shape, dtype, chunk count) every array without reading it."""
  return [_LazyZarr(store, r.name, where)
          for r, store in zip(reads, _io.open_arrays(reads, where))]


def load_t5x_sharded(path: str, shardings: Mapping[str, Any], *, dtype: Any = None,
                     expected: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
  """Loads a T5X checkpoint's `target` straight into `jax.Array`s of the given shardings.

  Both formats are read per shard: each addressable device's slice is read from
  tensorstore on its own (replicas of a slice once), so a process never holds a
  whole parameter it only needs a part of: its peak memory is its shards plus
  the chunks a slice touches. Small values stored inline (legacy msgpack, Orbax
  aggregate file) are read whole.

  Args:
    path: as for `specjax.checkpoints.load_t5x`.
    shardings: nested dict of `jax.sharding.Sharding` with T5X names (e.g.
      `specjax.runtime.sharding.Partitioner.param_shardings(model.param_shapes())`).
    dtype: as for `specjax.checkpoints.load_t5x`.
    expected: optional tree of expected shapes (e.g. `model.param_shapes()`).

  Raises:
    As `specjax.checkpoints.load_t5x`; ValueError when names or shapes differ
    from `expected`, or names from `shardings`.
  """
  cast = _io.resolve_dtype(dtype, "load_t5x_sharded")
  where = check_path(path, "load_t5x_sharded", remote=True)
  shapes = None if expected is None else {
      name: tuple(np.shape(leaf)) for name, leaf in flatten(expected)}
  with snapshot(path, where) as location:  # every shard read from one save
    flat = read_flat(location, where, shapes, read_arrays=_open_lazy)
    if expected is not None:
      check_params_match(unflatten(flat), expected, what=where)
    want = dict(flatten(shardings))
    differ = sorted(set(want) ^ set(flat))
    if differ:
      raise ValueError(f"{where}: parameter '{differ[0]}' is " + (
          "missing from the checkpoint" if differ[0] in want else "not in the shardings tree"))
    out, bad, overflowed = {}, {}, {}
    for name, arr in flat.items():
      seen: Dict[str, np.ndarray] = {}

      def read(index, arr=arr, seen=seen, name=name):
        key = repr(index)  # replicas of one slice are read once
        if key not in seen:
          x = np.asarray(arr[index])
          bad[name] = bad.get(name, 0) + _io.count_non_finite(x)
          seen[key], n = _io.cast_float(x, cast)
          overflowed[name] = overflowed.get(name, 0) + n
        return seen[key]
      out[name] = jax.make_array_from_callback(tuple(arr.shape), want[name], read)
    sizes = {n: int(np.prod(a.shape)) for n, a in flat.items()}
    _io.warn_non_finite(where, bad, sizes)
    _io.warn_overflow(where, cast, overflowed, sizes)
  return unflatten(out)


def load_sharded(path: str, model: Any, partitioner: Partitioner, *, dtype: Any = None) -> Any:
  """Loads a T5X checkpoint for `model` straight into `partitioner`'s parameter shardings.

  Args:
    path: as for `specjax.checkpoints.load_t5x`.
    model: its `param_shapes()` gives the expected names and shapes.
    partitioner: a `specjax.runtime.sharding.Partitioner`.
    dtype: as for `load_t5x` (None keeps the stored dtypes).
  """
  shapes = model.param_shapes()
  return load_t5x_sharded(path, partitioner.param_shardings(shapes), dtype=dtype,
                          expected=shapes)
