"""Validation and sizing of a generation's inputs, shared by every decode loop (host side)."""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Optional, Sequence

import jax
import numpy as np

from specjax.checks import check_count, check_int
from specjax.decode.config import DecodeConfig
from specjax.models import DecodingModel, check_same_vocab


def check_config(model: DecodingModel, config: Any) -> None:
  """ValueError unless `config` is a DecodeConfig whose eos_id is in the model's vocabulary
  (or -1: no EOS)."""
  if not isinstance(config, DecodeConfig):
    raise ValueError(f"config must be a DecodeConfig, got {type(config).__name__}")
  check_eos(model, config.eos_id)


def check_eos(model: DecodingModel, eos_id: Any) -> int:
  """eos_id as int; ValueError unless it is a token id of the model's vocabulary or -1."""
  return check_int("eos_id", eos_id, low=-1, high=model.vocab_size - 1,
                   expected=f"a token id in [0, vocab_size={model.vocab_size}) or -1 (no EOS)")


def check_inputs(model: DecodingModel, inputs: Any) -> np.ndarray:
  """int32 [B, L] token ids; ValueError for a wrong shape, non-integer ids or ids outside V."""
  try:
    inputs = np.asarray(inputs)
  except ValueError as e:  # ragged rows
    raise ValueError(f"inputs must be a rectangular int array [batch, length] (pad the rows "
                     f"with 0 to one length): {e}") from e
  if inputs.ndim != 2 or inputs.shape[0] == 0 or inputs.shape[1] == 0:
    raise ValueError(f"inputs must be int [batch >= 1, length >= 1], got shape {inputs.shape}")
  if not np.issubdtype(inputs.dtype, np.integer):
    raise ValueError(f"inputs must hold integer token ids, got dtype {inputs.dtype}")
  if inputs.min() < 0 or inputs.max() >= model.vocab_size:
    raise ValueError(f"inputs contain token ids outside [0, {model.vocab_size})")
  return inputs.astype(np.int32)


def prefix_lengths(model: DecodingModel, inputs: np.ndarray,
                   prompt_lengths: Optional[Any]) -> np.ndarray:
  """Per-row decoder prefix lengths int32 [B]: 1 (T5's start token) or the prompt length."""
  batch = inputs.shape[0]
  if model.is_encoder_decoder:
    empty = np.where((inputs != 0).sum(1) == 0)[0]
    if empty.size:
      raise ValueError(f"empty prompt: encoder inputs of rows {empty.tolist()} are all padding")
    return np.ones(batch, np.int32)
  lengths = np.asarray(prompt_lengths) if prompt_lengths is not None else (inputs != 0).sum(1)
  if (lengths.shape != (batch,) or not np.issubdtype(lengths.dtype, np.integer)
      or np.any(lengths > inputs.shape[1])):
    raise ValueError(f"prompt_lengths must be int [batch={batch}] and <= {inputs.shape[1]}, "
                     f"got {lengths.tolist()}")
  if np.any(lengths < 1):
    raise ValueError(f"empty prompt in rows {np.where(lengths < 1)[0].tolist()}: "
                     "a decoder-only model needs at least one prompt token")
  if prompt_lengths is None:  # 0 is padding: it may only trail the prompt
    inner = np.where((inputs[:, 1:] != 0) & (np.cumsum(inputs == 0, axis=1)[:, :-1] > 0))
    if inner[0].size:
      row, col = int(inner[0][0]), int(inner[1][0]) + 1
      raise ValueError(f"inputs row {row} has a 0 (padding) before token {inputs[row, col]} "
                       f"at column {col}: prompts are left-aligned and 0-padded; pass "
                       "prompt_lengths if token 0 belongs to a prompt")
  return lengths.astype(np.int32)


def cache_length(cache_len: Optional[int], prefix_max: int, max_new_tokens: int,
                 extra_positions: int) -> int:
  """Cache positions per row: prefix + max_new_tokens + extra, rounded up to 128 unless pinned."""
  need = prefix_max + max_new_tokens + extra_positions
  if need + 128 > 2**31 - 1:  # positions and budgets are int32 on the device
    raise ValueError(f"prompt + max_new_tokens = {prefix_max} + {max_new_tokens} "
                     f"(+ {extra_positions} extra positions) is beyond the int32 positions of the loops (2**31 - 128)")
  if cache_len is None:
    return int(-(-need // 128) * 128)
  if need > cache_len:
    raise ValueError(
        f"prompt + max_new_tokens beyond the cache length: prefix {prefix_max} + "
        f"max_new_tokens {max_new_tokens} + {extra_positions} extra positions = {need} > "
        f"cache_len {cache_len}")
  return cache_len


MEMORY_FRACTION = 0.5
"""The largest share of a device's memory (or of the host's, on CPU) the caches may take."""


def cache_bytes(model: DecodingModel, batch: int, positions: int) -> int:
  """Bytes of `model.init_cache(batch, positions)`, from its abstract shapes (nothing allocated).

  Remembered per (model, batch, positions) for hashable models: tracing `init_cache` costs
  milliseconds, paid before every decode call otherwise."""
  try:
    hash(model)
  except TypeError:
    return _cache_bytes(model, batch, positions)
  return _remembered_cache_bytes(model, batch, positions)


def _cache_bytes(model: DecodingModel, batch: int, positions: int) -> int:
  shapes = jax.eval_shape(lambda: model.init_cache(batch, positions))
  return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize
                 for x in jax.tree.leaves(shapes)))


_remembered_cache_bytes = functools.lru_cache(maxsize=256)(_cache_bytes)


def device_memory(partitioner: Any = None) -> int:
  """Bytes the caches may be spread over: on CPU the host's physical memory; on an accelerator
  its `memory_stats()['bytes_limit']` times the devices of the partitioner's mesh (or one)."""
  devices = list(partitioner.mesh.devices.flat) if partitioner is not None else jax.devices()[:1]
  # One of this process's own (a device of another process reports nothing here).
  local = next((d for d in devices if d.process_index == jax.process_index()), devices[0])
  stats = None
  if local.platform != "cpu":
    try:
      stats = local.memory_stats()
    except Exception:  # pylint: disable=broad-except  (some backends do not report)
      stats = None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"]) * len(devices)
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_cache_size(models: Sequence[DecodingModel], batch: Any, positions: int,
                     partitioner: Any = None) -> int:
  """Refuses, before any allocation, caches larger than MEMORY_FRACTION of `device_memory`.

  The size is each model's KV cache (layers × 2 × heads × head_dim × dtype bytes per position,
  read from `init_cache`'s abstract shapes) × `positions` × `batch` rows, summed over `models`
  (`batch`: one row count for all, or one per model). Returns the size in bytes; ValueError
  giving it (GiB) and the limit.
  """
  rows = [int(batch)] * len(models) if np.ndim(batch) == 0 else [int(b) for b in batch]
  size = sum(cache_bytes(m, b, positions) for m, b in zip(models, rows))
  limit = int(MEMORY_FRACTION * device_memory(partitioner))
  if size > limit:
    raise ValueError(
        f"the KV caches would take {size / 2**30:.2f} GiB ({max(rows)} rows × {positions} "
        f"positions over {len(models)} model(s)), above the limit of {limit / 2**30:.2f} GiB "
        f"({MEMORY_FRACTION:.0%} of the device's memory): lower max_new_tokens, the batch or "
        "cache_len")
  return size


def param_bytes(model: Any, itemsize: int = 4) -> int:
  """Bytes of `model`'s parameters at `itemsize` bytes each (float32: 4), from its shapes."""
  shapes = model.param_shapes()
  return int(sum(np.prod(x.shape, dtype=np.int64) for x in jax.tree.leaves(shapes))) * itemsize


def check_memory(models: Sequence[Any], cache_size: int, partitioner: Any = None) -> int:
  """Refuses, before any weights load or initialize, parameters (float32) plus KV caches
  (`cache_size` bytes) larger than the device's memory (`device_memory`). Returns the bytes."""
  params = sum(param_bytes(m) for m in models)
  limit = device_memory(partitioner)
  if params + cache_size > limit:
    raise ValueError(
        f"the models' float32 parameters ({params / 2**30:.2f} GiB over {len(models)} model(s)) "
        f"and KV caches ({cache_size / 2**30:.2f} GiB) would not fit in the device's "
        f"{limit / 2**30:.2f} GiB: check the model gin files' sizes, or shard the models "
        "(NUM_PARTITIONS)")
  return params + cache_size


def initial_seq(model: DecodingModel, inputs: np.ndarray, width: int) -> np.ndarray:
  """int32 [B, width]: the decoder prefix (T5: the start token 0; decoder-only: the prompt)."""
  seq = np.zeros((inputs.shape[0], width), np.int32)
  if not model.is_encoder_decoder:
    seq[:, :inputs.shape[1]] = inputs
  return seq


def check_nan(nan: Any) -> None:
  """ValueError naming the rows whose logits held NaN, +inf or only -inf (nan: bool [B])."""
  rows = np.where(np.asarray(nan))[0]
  if rows.size:
    raise ValueError(f"NaN logits (or +inf, or -inf everywhere) from the target or draft model "
                     f"in rows {rows.tolist()}")


@dataclasses.dataclass(frozen=True)
class Checked:
  """A generation's arguments after `check_decode`: validated and sized (host side)."""

  inputs: np.ndarray  # int32 [B, L]: encoder inputs or left-aligned prompts, 0-padded
  length: np.ndarray  # int32 [B]: each row's decoder prefix length
  max_new_tokens: int  # generation budget per row
  cache_len: int  # cache positions per row
  gamma: Optional[int] = None  # the checked `gamma` argument (speculative decodes)
  cache_size: int = 0  # bytes of every model's KV caches (`check_cache_size`)


def check_decode(target: DecodingModel, config: Any, inputs: Any, max_new_tokens: Any,
                 prompt_lengths: Any = None, *, drafter: Any = None, gamma: Any = None,
                 rows: Optional[int] = None, partitioner: Any = None) -> Checked:
  """The one validation preamble of every decode entry, run before anything compiles.

  Checks the config (a `DecodeConfig`, an EOS id in the vocabulary), the drafter's
  vocabulary against the target's, `max_new_tokens` >= 1, the inputs (int [B, L] ids in the
  vocabulary, no empty prompt), `gamma` (when a drafter is given: an integer in
  [1, drafter.max_gamma]; None: max_gamma), sizes the cache (prefix + budget + the round's
  width: 1, or `drafter.lookahead` + 1 with a drafter) and refuses caches for `rows` rows
  (default B) that would not fit the device (`check_cache_size`).
  """
  check_config(target, config)
  width = 1
  if drafter is not None:
    check_same_vocab(target, drafter.vocab_size)
    gamma = drafter.max_gamma if gamma is None else gamma
    gamma = check_int("gamma", gamma, low=1, high=drafter.max_gamma,
                      expected=f"an integer in [1, max_gamma={drafter.max_gamma}]")
    width = drafter.lookahead + 1
  max_new_tokens = check_count("max_new_tokens", max_new_tokens)
  inputs = check_inputs(target, inputs)
  length = prefix_lengths(target, inputs, prompt_lengths)
  cache_len = cache_length(config.cache_len, int(length.max()), max_new_tokens, width)
  models = [target] + (list(drafter.models) if drafter is not None else [])
  cache_size = check_cache_size(models, inputs.shape[0] if rows is None else rows, cache_len,
                                partitioner)
  return Checked(inputs=inputs, length=length, max_new_tokens=max_new_tokens,
                 cache_len=cache_len, gamma=gamma, cache_size=cache_size)
