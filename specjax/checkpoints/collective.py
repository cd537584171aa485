"""Writing a T5X legacy checkpoint from global arrays, together, by every process of a job.

Every process calls `save_t5x_collective` with the same (global, possibly
process-spanning) `jax.Array` parameters. Process 0 makes the temporary folder
`checkpoint_N.tmp-TOKEN` and creates each zarr array with one chunk per shard of
its sharding; each process writes the shards it holds (one copy of each slice:
the replica 0 of it); process 0 then writes the msgpack `checkpoint` file and the
extra files and renames the folder into place (`specjax.checkpoints._commit`).
The result is the same layout `save_t5x` writes (readable by T5X and `load_t5x`),
chunked by shard. The folder must be on a file system every process sees.
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Dict, Mapping, Optional

import jax
import numpy as np
import tensorstore as ts

from specjax.runtime import distributed
from specjax.checkpoints import _commit, _io
from specjax.checkpoints.t5x import VERSION, check_path, clean_model_dir
from specjax.params import flatten, unflatten


def _zarr_spec(folder: str, array: jax.Array, dtype: np.dtype) -> Dict[str, Any]:
  """The tensorstore spec of one parameter: chunks = the shard shape of its sharding."""
  chunks = [max(1, int(c)) for c in array.sharding.shard_shape(array.shape)]
  return {"driver": "zarr", "dtype": dtype.name,
          "kvstore": {"driver": "file", "path": folder + "/"},
          "metadata": {"chunks": chunks, "compressor": {"id": "gzip", "level": 1},
                       "shape": [int(d) for d in array.shape]}}


def _absolute(spec: Dict[str, Any], root: str) -> Dict[str, Any]:
  return dict(spec, kvstore={"driver": "file", "path": os.path.join(root, spec["kvstore"]["path"])})


def save_t5x_collective(params: Mapping[str, Any], path: str, *, step: int,
                        dtype: Any = "float32", overwrite: bool = True,
                        extra_files: Optional[Mapping[str, bytes]] = None) -> str:
  """Writes `path/checkpoint_{step}` from every process at once; returns its path.

  Args:
    params: nested dict of `jax.Array`s with T5X names (the same tree in every process).
    path: the model folder, shared by all processes.
    step: the training step.
    dtype: floating arrays are stored in this dtype (None keeps theirs).
    overwrite: replace an existing `checkpoint_{step}`.
    extra_files: {name: bytes} written by process 0 and committed with the checkpoint.
  Raises:
    ValueError: a leaf that is not a `jax.Array`, or as `save_t5x`.
  """
  cast = _io.resolve_dtype(dtype, "save_t5x_collective")
  path = check_path(path, "save_t5x_collective")
  flat = dict(flatten(params))
  for name, leaf in flat.items():
    if not isinstance(leaf, jax.Array):
      raise ValueError(f"save_t5x_collective: parameter '{name}' is not a jax.Array")
  final = os.path.join(path, f"checkpoint_{int(step)}")
  tmp = None
  if distributed.is_writer():
    os.makedirs(path, exist_ok=True)
    clean_model_dir(path)
    if os.path.lexists(final) and not overwrite:
      raise FileExistsError(f"checkpoint already exists: {final}")
    tmp = _commit.new_name(final, "tmp")
    os.mkdir(tmp)
  tmp = distributed.broadcast_text(tmp or "")
  try:
    specs = {}
    for name, leaf in flat.items():
      stored = cast if cast is not None and _io.is_floating(np.dtype(leaf.dtype)) else \
          np.dtype(leaf.dtype)
      specs[name] = (_zarr_spec("target." + name.replace("/", "."), leaf, stored), stored)
    if distributed.is_writer():  # the arrays' metadata, before anyone writes a chunk
      for spec, _ in specs.values():
        ts.open(_absolute(spec, tmp), create=True).result()
    distributed.sync(f"{final} created")
    pending = []
    for name, leaf in flat.items():
      spec, stored = specs[name]
      store = ts.open(_absolute(spec, tmp), open=True).result()
      for shard in leaf.addressable_shards:
        if shard.replica_id == 0:
          pending.append(store[shard.index].write(np.asarray(shard.data).astype(stored)))
    for future in pending:
      future.result()
    distributed.sync(f"{final} shards written")
    if distributed.is_writer():
      _finish(tmp, final, specs, int(step), dict(extra_files or {}), overwrite)
  except BaseException:
    if distributed.is_writer():
      shutil.rmtree(tmp, ignore_errors=True)
    raise
  finally:
    if distributed.is_writer():
      _commit.release(tmp)
  distributed.sync(f"{final} committed")
  return final


def _finish(tmp: str, final: str, specs: Dict[str, Any], step: int,
            extra: Dict[str, bytes], overwrite: bool) -> None:
  """Process 0: the msgpack tree and extra files, then the atomic rename."""
  for name, payload in extra.items():
    with open(os.path.join(tmp, name), "xb") as f:
      f.write(payload)
  target = unflatten({name: spec for name, (spec, _) in specs.items()})
  with open(os.path.join(tmp, "checkpoint"), "xb") as f:
    f.write(_io.encode({"version": VERSION,
                        "optimizer": {"target": target,
                                      "state": {"step": np.asarray(step, np.int32)}}}))
    f.flush()
    os.fsync(f.fileno())
  _commit.fsync_dir(tmp)
  _commit.commit(tmp, final, overwrite)
