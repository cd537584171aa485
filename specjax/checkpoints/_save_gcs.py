"""`save_t5x` into a gs:// model folder: the checkpoint appears whole or not at all.

A bucket has no rename, so the checkpoint is not assembled elsewhere and moved: its objects are
written in place under `checkpoint_N/`, the arrays and extra files first and the `checkpoint`
msgpack last. A reader (specjax's `find_checkpoint`, T5X's restore) takes a folder for a legacy
checkpoint only once its `checkpoint` object exists, and GCS makes an object visible only once
its upload is complete, so until that last upload the folder holds no checkpoint, and after it
a complete one. Objects left below `checkpoint_N/` by a save that failed before its msgpack
(no checkpoint) are removed before the next save of that step writes.

An existing checkpoint is not replaced (`overwrite=True` is refused for gs://): without a
rename the old one would be gone before the new one is whole.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from specjax.checkpoints import _io


def save(params: Mapping[str, Any], path: str, step: int, cast: Optional[np.dtype],
         overwrite: bool, extra: Mapping[str, bytes], *, build_target: Callable,
         write_zarr: Callable, version: int) -> str:
  """`save_t5x(params, path, step=step, ...)` for a gs:// `path` (checked by the caller);
  returns the URL of `checkpoint_{step}`. build_target, write_zarr, version: the legacy
  writer's (`specjax.checkpoints.t5x`, which calls this: passed in, not imported)."""
  from specjax import remote  # pylint: disable=import-outside-toplevel
  path = path.rstrip("/")
  remote.split(path, "save_t5x: the model folder")
  if remote.exists(path):
    raise FileExistsError(f"save_t5x: {path} is an object, not a model folder to write "
                          "checkpoint_N into")
  final = remote.join(path, f"checkpoint_{step}")
  marker = remote.join(final, "checkpoint")
  if remote.exists(marker):
    if overwrite:
      raise ValueError(f"save_t5x: cannot replace {final}: a bucket has no rename, so the old "
                       "checkpoint would be gone before the new one is complete; delete it "
                       "first or write another step")
    raise FileExistsError(f"checkpoint already exists: {final} "
                          "(a gs:// checkpoint is not replaced; delete it first)")
  _remove_below(final)  # a failed save's arrays: no `checkpoint` object, so no checkpoint
  writes: List[Tuple[Dict[str, Any], np.ndarray]] = []
  target = build_target(params, "", cast, final, writes, {})
  try:
    try:
      write_zarr(writes)
    except Exception as e:  # tensorstore reports every failure as ValueError and friends
      raise remote.error(e, final, "write the arrays of the checkpoint") from e
    remote.write_objects({remote.join(final, name): payload for name, payload in extra.items()},
                         f"an extra file of checkpoint {final}")
    remote.write_objects({marker: _io.encode({
        "version": version,
        "optimizer": {"target": target,
                      "state": {"step": np.asarray(step, np.int32)}}})},
                         f"the checkpoint file of {final}")
  except BaseException:
    try:
      if not remote.exists(marker):
        _remove_below(final)
    except (OSError, ValueError):
      pass  # the server went away too: the objects left hold no checkpoint
    raise
  return final


def _remove_below(folder: str) -> None:
  """Deletes every object below the gs:// `folder`."""
  from specjax import remote  # pylint: disable=import-outside-toplevel
  for key in sorted(remote.list_folder(folder, "the checkpoint folder")):
    remote.delete(remote.join(folder, key), "a leftover of an unfinished save")

