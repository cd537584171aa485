"""Helpers for parameter trees: nested dicts of arrays with T5X names."""
from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Tuple

import ml_dtypes
import numpy as np

# numpy dtypes (ml_dtypes' bfloat16 is jax's): reading checkpoints imports no jax.
WEIGHTS_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
"""Dtypes the dense kernels can be run in (`cast_kernels`; the main job's WEIGHTS_DTYPE)."""
DRAFT_WEIGHTS_DTYPES = {**WEIGHTS_DTYPES, "int8": np.dtype(np.int8)}
"""A draft's too (DRAFT_WEIGHTS_DTYPE): also 'int8' (`quantize_kernels`). A draft's weights
change only how often its guesses are accepted, never the output; a target's are the output
distribution, so a target is never quantized."""
SCALE_SUFFIX = "_scale"
"""An int8 parameter `.../kernel` comes with its float32 scales `.../kernel_scale`
(`quantize_kernels`)."""


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
  _fold_quantized(got, want, what)
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


def _fold_quantized(got: Dict[str, Any], want: Mapping[str, Any], what: str) -> None:
  """Checks each int8 parameter's scales (`quantize_kernels`) and drops them from `got`; the
  int8 values are then checked as the parameter itself (shape, and as floating point)."""
  for name in sorted(got):
    if (name not in got or _dtype(got[name]) != np.int8 or name not in want
        or not _floating(_dtype(want[name]))):
      continue
    scales = name + SCALE_SUFFIX
    if scales not in got:
      raise ValueError(f"{what}: parameter '{name}' is int8 without its scales '{scales}' "
                       "(`specjax.params.quantize_kernels`)")
    shape = tuple(np.shape(got[name]))
    need = (shape[scale_axis(name)],) if len(shape) == 2 else None
    if need is None or tuple(np.shape(got[scales])) != need:
      raise ValueError(f"{what}: parameter '{scales}' has shape {tuple(np.shape(got[scales]))}"
                       f", but the int8 '{name}' of shape {shape} needs {need}")
    del got[scales]
    got[name] = _Placeholder(shape, np.dtype(np.float32))


class _Placeholder:  # pylint: disable=too-few-public-methods
  """Shape and dtype only (np.shape reads .shape)."""

  def __init__(self, shape, dtype):
    self.shape, self.dtype = shape, dtype


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


GEMMA_WEIGHTS = ("/w", "mlp/gating_einsum", "mlp/linear", "embedder/input_embedding")
"""Ends of the names of a Gemma model's weights (`specjax.models.gemma`; its einsums are 3-D
and 4-D), which `cast_kernels` casts too (not `quantize_kernels`)."""


def cast_kernels(params: Mapping[str, Any], dtype: Any) -> Dict[str, Any]:
  """The tree with every 2-D `.../kernel` (the Dense layers' weights) and the token
  embedding (`token_embedder/embedding`) cast to `dtype` (int8: `quantize_kernels`); a Gemma
  model's weights (`GEMMA_WEIGHTS`) too.

  Layer-norm scales and relative-position tables keep their dtype. With bfloat16 weights
  the models run their dense dots and the vocabulary product (`Embed.attend`, the logits
  of a model with logits_via_embedding) in bfloat16 with float32 sums
  (`specjax.models.layers.bfloat16_dot`), reading half the weight bytes per step; an
  embedding lookup returns the bfloat16 rows as float32 (T5X's dtype bfloat16 rounds
  them the same way).
  """
  if np.dtype(dtype) == np.int8:
    return quantize_kernels(params)
  def castable(name, value):
    return ((is_castable(name) and np.ndim(value) == 2)
            or (name.endswith(GEMMA_WEIGHTS) and np.ndim(value) >= 2))
  items = {name: (value.astype(dtype) if castable(name, value) else value)
           for name, value in flatten(params)}
  return unflatten(items)


def scale_axis(name: str) -> int:
  """The axis of a quantized 2-D parameter that has one scale per entry: a kernel [in, out]
  one per output column (1), an embedding table [V, E] one per token row (0)."""
  return 0 if name.endswith("embedding") else 1


def quantize_kernels(params: Mapping[str, Any]) -> Dict[str, Any]:
  """The tree with every parameter `cast_kernels` casts stored as int8 values plus float32
  scales beside it (`<name>_scale`): symmetric, one scale per output column of a kernel
  [in, out] and per token row of an embedding [V, E] (`scale_axis`): w ~= values * scales,
  |values| <= 127. numpy leaves stay numpy, others (jax arrays) become jax arrays.

  The models then run those dots in int8 with int32 sums
  (`specjax.models.layers.int8_dot`: each input row quantized the same way on the fly), a
  quarter of float32's weight bytes. For drafts only (`DRAFT_WEIGHTS_DTYPES`).
  """
  items: Dict[str, Any] = {}
  for name, value in flatten(params):
    if not (is_castable(name) and np.ndim(value) == 2):
      items[name] = value
      continue
    values, scales = quantize(value, scale_axis(name))
    items[name], items[name + SCALE_SUFFIX] = values, scales
  return unflatten(items)


def quantize(w: Any, axis: int) -> Tuple[Any, Any]:
  """w [n, m] (numpy or jax, any float dtype) -> (int8 values [n, m], float32 scales
  [w.shape[axis]]), symmetric per slice along `axis`: its max |w| maps to 127 (an all-zero
  slice gets scale 1)."""
  if isinstance(w, np.ndarray):
    xp = np
  else:
    import jax.numpy as xp  # pylint: disable=import-outside-toplevel
  w = xp.asarray(w).astype(np.float32)
  top = xp.max(xp.abs(w), axis=1 - axis)
  scales = xp.where(top > 0, top / 127.0, 1.0).astype(np.float32)
  shaped = scales[None, :] if axis == 1 else scales[:, None]
  return xp.clip(xp.rint(w / shaped), -127, 127).astype(np.int8), scales
