"""Validation and sizing of a generation's inputs, shared by every decode loop (host side)."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from specjax.models import DecodingModel


def check_count(name: str, value: Any) -> int:
  """Returns value as int; ValueError naming `name` unless it is an integer >= 1 (bools refused)."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
  return int(value)


def check_inputs(model: DecodingModel, inputs: Any) -> np.ndarray:
  """int32 [B, L] token ids; ValueError for a wrong shape, non-integer ids or ids outside V."""
  inputs = np.asarray(inputs)
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
  return lengths.astype(np.int32)


def cache_length(cache_len: Optional[int], prefix_max: int, max_new_tokens: int,
                 extra_slots: int) -> int:
  """Decoder slots per row: prefix + max_new_tokens + extra, rounded up to 128 unless pinned."""
  need = prefix_max + max_new_tokens + extra_slots
  if cache_len is None:
    return int(-(-need // 128) * 128)
  if need > cache_len:
    raise ValueError(
        f"prompt + max_new_tokens beyond the cache length: prefix {prefix_max} + "
        f"max_new_tokens {max_new_tokens} + {extra_slots} extra slots = {need} > "
        f"cache_len {cache_len}")
  return cache_len


def initial_seq(model: DecodingModel, inputs: np.ndarray, width: int) -> np.ndarray:
  """int32 [B, width]: the decoder prefix (T5: the start token 0; decoder-only: the prompt)."""
  seq = np.zeros((inputs.shape[0], width), np.int32)
  if not model.is_encoder_decoder:
    seq[:, :inputs.shape[1]] = inputs
  return seq


def check_nan(nan: Any) -> None:
  """ValueError naming the rows whose logits held NaN (nan: bool [B])."""
  rows = np.where(np.asarray(nan))[0]
  if rows.size:
    raise ValueError(f"NaN logits from the target or draft model in rows {rows.tolist()}")
