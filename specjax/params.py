"""Helpers for parameter trees: nested dicts of arrays with T5X names."""
from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Tuple

import ml_dtypes
import numpy as np

# numpy dtypes (ml_dtypes' bfloat16 is jax's): reading checkpoints imports no jax.
WEIGHTS_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
"""Dtypes the dense kernels can be run in (`cast_kernels`; the main job's WEIGHTS_DTYPE)."""


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Iterator[Tuple[str, Any]]:
  """Yields ('decoder/layers_0/mlp/wo/kernel', leaf) pairs in sorted key order."""
  for key in sorted(tree):
    value = tree[key]
    path = f"{prefix}/{key}" if prefix else str(key)
    if isinstance(value, Mapping):
      yield from flatten(value, path)
    else:
      yield path, value


def unflatten(items: Mapping[str, Any]) -> Dict[str, Any]:
  """Inverse of `flatten`: {'a/b': x} -> {'a': {'b': x}}."""
  out: Dict[str, Any] = {}
  for path, value in items.items():
    node = out
    parts = path.split("/")
    for part in parts[:-1]:
      node = node.setdefault(part, {})
    node[parts[-1]] = value
  return out


def check_params_match(params: Mapping[str, Any], expected: Mapping[str, Any],
                       what: str = "parameters") -> None:
  """Raises ValueError naming the first parameter whose name, shape or dtype differs
  (dtype: an integer, bool or complex array where the model expects floating point).

  Args:
    params: the tree to check (arrays or anything with `.shape`).
    expected: the tree the model config implies (e.g. from `jax.eval_shape`).
    what: how to call `params` in the message (e.g. a checkpoint path).
  """
  got = dict(flatten(params))
  want = dict(flatten(expected))
  for name in sorted(want):
    if name not in got:
      raise ValueError(f"{what}: missing parameter '{name}' "
                       f"(expected shape {tuple(want[name].shape)})")
  for name in sorted(got):
    if name not in want:
      raise ValueError(f"{what}: unexpected parameter '{name}' "
                       f"(shape {tuple(np.shape(got[name]))}) not in the model config")
  for name in sorted(want):
    if tuple(np.shape(got[name])) != tuple(want[name].shape):
      raise ValueError(
          f"{what}: parameter '{name}' has shape {tuple(np.shape(got[name]))} "
          f"but the model config expects {tuple(want[name].shape)}")
  for name in sorted(want):
    got_dtype = _dtype(got[name])
    if _floating(_dtype(want[name])) and not _floating(got_dtype):
      raise ValueError(f"{what}: parameter '{name}' has dtype {got_dtype} but the model "
                       "expects floating-point values (float32, bfloat16, ...)")


def _dtype(x: Any) -> np.dtype:
  dtype = getattr(x, "dtype", None)
  return np.dtype(dtype) if dtype is not None else np.asarray(x).dtype


def _floating(dtype: np.dtype) -> bool:
  """float16/32/64, bfloat16 and the float8 types (numpy's kind 'f' misses the ml_dtypes)."""
  return dtype.kind == "f" or dtype.name.startswith(("bfloat", "float"))


def count_params(params: Mapping[str, Any]) -> int:
  """Total number of scalars in a parameter tree."""
  return int(sum(np.prod(np.shape(v)) for _, v in flatten(params)))


def is_castable(name: str) -> bool:
  """Whether `cast_kernels` casts the parameter `name` (a 2-D one): Dense kernels and the
  token embedding."""
  return name.endswith("kernel") or name.endswith("token_embedder/embedding")


def cast_kernels(params: Mapping[str, Any], dtype: Any) -> Dict[str, Any]:
  """The tree with every 2-D `.../kernel` (the Dense layers' weights) and the token
  embedding (`token_embedder/embedding`) cast to `dtype`.

  Layer-norm scales and relative-position tables keep their dtype. With bfloat16 weights
  the models run their dense dots and the vocabulary product (`Embed.attend`, the logits
  of a model with logits_via_embedding) in bfloat16 with float32 sums
  (`specjax.models.layers.bfloat16_dot`), reading half the weight bytes per step; an
  embedding lookup returns the bfloat16 rows as float32 (T5X's dtype bfloat16 rounds
  them the same way).
  """
  items = {name: (value.astype(dtype) if is_castable(name) and np.ndim(value) == 2
                  else value)
           for name, value in flatten(params)}
  return unflatten(items)
