"""Checkpoints of `specjax.train`: T5X params, the optax state beside them, model.gin.

`save_checkpoint` writes `checkpoint_N` with `specjax.checkpoints.save_t5x` and,
for a float32 one, `checkpoint_N/optimizer_state.npz` (the optax state's leaves
and their tree paths as plain numpy arrays, never pickled); `restore` reads both
back, falling back to a fresh optimizer state (with a warning) when the file is
missing or was written for another optimizer.
"""
from __future__ import annotations

import dataclasses
import io
import logging
import os
import re
import shutil
from typing import Any, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from specjax import checkpoints
from specjax.models.model_gin import MODEL_GIN, model_gin_text, read_model_gin

log = logging.getLogger("specjax.train")
OPT_STATE_FILE = "optimizer_state.npz"
_CKPT_DIR = re.compile(r"checkpoint_(\d+)")


def check_model_gin(model_dir: str, config: Any) -> None:
  """Writes model.gin, or ValueError if the one there describes another model.

  The file is read with the restricted parser (`specjax.models.read_model_gin`).
  """
  path, text = os.path.join(model_dir, MODEL_GIN), model_gin_text(config)
  if os.path.exists(path):
    old = read_model_gin(path)
    if old != config:
      diff = sorted(f.name for f in dataclasses.fields(config)
                    if type(old) is not type(config)
                    or getattr(old, f.name) != getattr(config, f.name))
      raise ValueError(f"{path} describes a different model than this run's config "
                       f"({type(old).__name__} vs {type(config).__name__}, differing "
                       f"fields: {diff}); use another model_dir or the same config")
    return
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(path + ".tmp", path)


def _tree_names(tree: Any) -> List[str]:
  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def save_opt_state(folder: str, opt_state: Any) -> str:
  """Writes the optax state's leaves to `folder/optimizer_state.npz` (no pickle)."""
  leaves = jax.device_get(jax.tree_util.tree_leaves(opt_state))
  arrays = {f"leaf_{i}": np.asarray(x) for i, x in enumerate(leaves)}
  arrays["names"] = np.asarray(_tree_names(opt_state), dtype=np.str_)
  path = os.path.join(folder, OPT_STATE_FILE)
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  with open(path + ".tmp", "wb") as f:
    f.write(buf.getvalue())
  os.replace(path + ".tmp", path)
  return path


def load_opt_state(folder: str, like: Any) -> Optional[Any]:
  """The optax state saved in `folder`, structured as `like`; None if absent or not matching.

  Args:
    folder: a checkpoint folder.
    like: an optax state (arrays or jax.ShapeDtypeStruct leaves) of the current
      optimizer; a saved state with other tree paths or shapes is not loaded.
  """
  path = os.path.join(folder, OPT_STATE_FILE)
  if not os.path.isfile(path):
    return None
  with np.load(path, allow_pickle=False) as saved:
    leaves, treedef = jax.tree_util.tree_flatten(like)
    names = [str(n) for n in saved["names"]] if "names" in saved else []
    if names != _tree_names(like):
      return None
    restored = []
    for i, leaf in enumerate(leaves):
      arr = saved[f"leaf_{i}"]
      if arr.shape != np.shape(leaf):
        return None
      restored.append(jnp.asarray(arr, dtype=leaf.dtype))
  return jax.tree_util.tree_unflatten(treedef, restored)


def list_checkpoints(model_dir: str) -> List[int]:
  """Steps of the complete `checkpoint_N` folders in `model_dir`, ascending."""
  if not os.path.isdir(model_dir):
    return []
  steps = []
  for entry in os.listdir(model_dir):
    match = _CKPT_DIR.fullmatch(entry)
    if match and os.path.isfile(os.path.join(model_dir, entry, "checkpoint")):
      steps.append(int(match.group(1)))
  return sorted(steps)


def save_checkpoint(model_dir: str, state: Any, dtype: str = "float32",
                    keep: int = 2) -> str:
  """save_t5x of the params (+ optimizer_state.npz when float32), then prunes to `keep`."""
  step = int(state.step)
  params = jax.device_get(state.params)
  path = checkpoints.save_t5x(params, model_dir, step=step, dtype=dtype, overwrite=True)
  if dtype == "float32":
    save_opt_state(path, state.opt_state)
  for old in list_checkpoints(model_dir)[:-keep]:
    shutil.rmtree(os.path.join(model_dir, f"checkpoint_{old}"), ignore_errors=True)
  return path


def restore(model_dir: str, trainer: Any) -> Optional[Any]:
  """The state of the latest checkpoint in `model_dir`, or None if there is none."""
  try:
    location = checkpoints.find_checkpoint(model_dir)
  except FileNotFoundError:
    return None
  folder = os.path.dirname(location.path)
  params = checkpoints.load_t5x_for_model(folder, trainer.model, dtype="float32")
  state = trainer.init_state(params, step=location.step or 0)
  opt_state = load_opt_state(folder, state.opt_state)
  if opt_state is None:
    log.warning("%s has no matching %s: the optimizer state starts from scratch",
                folder, OPT_STATE_FILE)
    return state
  return state.replace(opt_state=opt_state)
