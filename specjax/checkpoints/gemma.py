"""Reads the parameters of a Gemma checkpoint written by the gemma library, without orbax.

`gm.ckpts.save_params(params, path)` writes the Flax parameter tree (`embedder`, `layer_i`,
`final_norm`, and a vision encoder's for multimodal models) with Orbax's
StandardCheckpointer: `path/_METADATA` and the arrays in an OCDBT database. The checkpoints
Google publishes hold the same arrays under the library's older flat names
(`transformer/layer_0/attn/q_einsum` with leaf `w`, the MLP's as `.../mlp/linear/w`); a
Kauldron training checkpoint holds the tree under `default/` and `params`. All three are read
into the nested names of `specjax.models.gemma` (the library's `model.init()` names); vision
parameters are left unread (specjax decodes text).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from specjax.checkpoints import _io, _orbax
from specjax.checkpoints.t5x import check_path
from specjax.params import flatten, unflatten

_FLAT_ROOT = "transformer"
_VISION = ("vision_encoder", "SigLiPFromPatches_0")
_VISION_EMBEDDER = ("mm_input_projection", "mm_soft_embedding_norm")
_FLAT_MLP_LEAVES = ("mlp/linear/w", "mlp/gating_einsum/w")


def gemma_name(keys: Tuple[str, ...], where: str) -> Optional[str]:
  """A saved leaf's tree keys -> its parameter name ('layer_0/attn/q_einsum/w'), or None for
  what a text decode does not read (vision parameters, a Kauldron checkpoint's optimizer
  state). Flat keys ('transformer/layer_0/attn/q_einsum', 'w') are split and renamed."""
  if keys and keys[0] == "params" and len(keys) > 1:  # a Kauldron checkpoint's params
    keys = keys[1:]
  elif keys and keys[0] in ("collections", "opt_state", "step"):
    return None
  parts = tuple(p for key in keys for p in key.split("/"))
  if parts and parts[0] == _FLAT_ROOT:
    parts = parts[1:]
    name = "/".join(parts)
    for leaf in _FLAT_MLP_LEAVES:
      if name.endswith("/" + leaf):
        parts = parts[:-1]
  if not parts or parts[0] in _VISION or (parts[0] == "embedder"
                                          and len(parts) > 1 and parts[1] in _VISION_EMBEDDER):
    return None
  return _orbax._param_name(parts, where)  # pylint: disable=protected-access


def _item_folder(path: str, where: str) -> str:
  """The Orbax item folder at `path` (itself, or a Kauldron checkpoint's `default/`)."""
  if os.path.isfile(os.path.join(path, "_METADATA")):
    return path
  inner = os.path.join(path, "default")
  if os.path.isfile(os.path.join(inner, "_METADATA")):
    return inner
  if not os.path.isdir(path):
    raise FileNotFoundError(f"{where}: no Gemma checkpoint there (not a folder)")
  raise FileNotFoundError(f"{where}: no Gemma checkpoint there: no Orbax _METADATA (a folder "
                          "written by gm.ckpts.save_params holds one)")


def load_gemma_params(path: Any, expected: Mapping[str, Any], *, dtype: Any = None
                      ) -> Dict[str, Any]:
  """The text parameters of the Gemma checkpoint at `path`, checked against `expected`.

  Args:
    path: the folder `gm.ckpts.save_params` wrote (or a published checkpoint's folder).
    expected: the model's parameter tree, leaves with `.shape` (`GemmaModel.param_shapes()`);
      names and shapes are checked from the metadata before any array is read.
    dtype: None keeps the stored dtypes; else floating-point arrays are cast to it.

  Returns:
    Nested dicts of numpy arrays with the library's names (`params['layer_0']['attn']...`).

  Raises:
    FileNotFoundError: no checkpoint at `path`.
    ValueError: one line naming the first parameter missing, unexpected or of the wrong
      shape (the model config does not match the checkpoint), or what else is wrong inside.
  """
  where = check_path(path, "load_gemma")
  cast = _io.resolve_dtype(dtype, "load_gemma")
  item = _item_folder(os.path.abspath(where), where)
  shapes = {name: tuple(leaf.shape) for name, leaf in flatten(expected)}
  flat = _orbax.load_target(item, where, shapes,
                            name_of=lambda keys: gemma_name(keys, where))
  if not flat:
    raise ValueError(f"{where}: the checkpoint holds no Gemma text parameters")
  _io.warn_non_finite(where, {n: _io.count_non_finite(a) for n, a in flat.items()},
                      {n: int(np.size(a)) for n, a in flat.items()})
  if cast is not None:
    flat = {name: _io.cast_float(arr, cast)[0] for name, arr in flat.items()}
  return unflatten(flat)
