"""The networks' argument checks: a config's fields (`validate_config`), and a call's inputs
(tokens, cache, positions, logits_at, tree, prefix lengths), shapes always (free under jit),
values only when concrete."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.checks import check_bool, check_choice, check_int
from specjax.models.layers import (ATTENTION_IMPLEMENTATIONS, DTYPES, Array, KVCache,
                                   activation_fn)
from specjax.models.tree import TreeAttention


def check_dtype_and_attention(config: Any) -> None:
  """ValueError naming `config`'s class and field unless its `dtype` is one of `DTYPES` and
  its `attention_impl` one of `ATTENTION_IMPLEMENTATIONS`."""
  name = type(config).__name__
  check_choice(f"{name}.dtype", config.dtype, DTYPES)
  check_choice(f"{name}.attention_impl", config.attention_impl, ATTENTION_IMPLEMENTATIONS)


def validate_config(config: Any, int_fields: Sequence[str]) -> None:
  """Raises ValueError for non-positive sizes, unknown activations, dtypes or attention
  implementations, a non-bool logits_via_embedding.

  Also turns a list of activations (as gin may give) into a tuple, so the
  frozen config stays hashable.
  """
  name = type(config).__name__
  for field in int_fields:
    check_int(f"{name}.{field}", getattr(config, field), low=1, expected="a positive integer")
  acts = config.mlp_activations
  if isinstance(acts, str) or not isinstance(acts, Sequence) or not acts:
    raise ValueError(f"{name}.mlp_activations must be a non-empty tuple of names, "
                     f"got {acts!r}")
  object.__setattr__(config, "mlp_activations", tuple(acts))
  for act in config.mlp_activations:
    activation_fn(act)
  check_dtype_and_attention(config)
  if config.attention_impl == "cudnn" and config.dtype == "float32":
    raise ValueError(f"{name}.attention_impl 'cudnn' needs dtype 'bfloat16' or 'float16' "
                     "(cuDNN's fused attention has no float32 kernel)")
  check_bool(f"{name}.logits_via_embedding", config.logits_via_embedding)


def is_concrete(x: Any) -> bool:
  """True when x holds values now (not a jit/vmap tracer)."""
  return not isinstance(x, jax.core.Tracer)


def check_tokens(tokens: Any, vocab_size: int, what: str) -> Array:
  """Returns tokens as an int32 [B, L] array; ValueError on bad shape or ids."""
  tokens = jnp.asarray(tokens)
  if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"{what} must be an integer array [batch, length], got "
                     f"{tokens.dtype} {tuple(tokens.shape)}")
  if tokens.shape[1] == 0:
    raise ValueError(f"{what} must hold at least one token per row")
  if is_concrete(tokens):
    values = np.asarray(tokens)
    bad = (values < 0) | (values >= vocab_size)
    if bad.any():
      row, col = np.argwhere(bad)[0]
      raise ValueError(f"{what}: token id {int(values[row, col])} at [{row}, {col}] is "
                       f"outside the vocabulary [0, {vocab_size})")
  return tokens.astype(jnp.int32)


def check_cache(cache: Any, batch: int, num_layers: int, num_heads: int,
                head_dim: int) -> None:
  """ValueError unless cache is a KVCache for `batch` rows of this model."""
  if not isinstance(cache, KVCache):
    raise ValueError(f"cache must be the KVCache from init_cache, got {type(cache).__name__}")
  if len(cache.keys) != num_layers or len(cache.values) != num_layers:
    raise ValueError(f"cache has {len(cache.keys)} layers but the model has {num_layers}")
  max_len = cache.max_len
  for what, bufs, want, axes in (
      ("key", cache.keys, (batch, num_heads, head_dim, max_len), "head_dim, max_len"),
      ("value", cache.values, (batch, num_heads, max_len, head_dim), "max_len, head_dim")):
    for buf in bufs:
      if tuple(buf.shape) != want:
        raise ValueError(f"cache {what} buffer shape {tuple(buf.shape)} does not match "
                         f"[batch={batch}, heads={num_heads}, {axes}] = {list(want)}")


def _row_ints(x: Any, batch: int, name: str) -> Array:
  """x as an array; ValueError unless it is an integer array [batch]."""
  x = jnp.asarray(x)
  if x.shape != (batch,) or not jnp.issubdtype(x.dtype, jnp.integer):
    raise ValueError(f"{name} must be an integer array [batch={batch}], got "
                     f"{x.dtype} {tuple(x.shape)}")
  return x


def check_positions(positions: Any, batch: int, k: int, max_len: int,
                    name: str = "positions") -> Array:
  """Returns positions as int32 [B]; ValueError if a row would run past the cache."""
  positions = _row_ints(positions, batch, name)
  if is_concrete(positions):
    values = np.asarray(positions)
    if (values < 0).any():
      raise ValueError(f"{name} must be >= 0, got {values.tolist()}")
    if (values + k > max_len).any():
      row = int(np.argmax(values + k > max_len))
      raise ValueError(
          f"{name}[{row}]={int(values[row])} with {k} tokens runs past the cache "
          f"length {max_len} (needs max_len >= position + k)")
  return positions.astype(jnp.int32)


def check_logits_at(logits_at: Any, batch: int, k: int) -> Optional[Array]:
  """Returns logits_at as int32 [B] (or None); ValueError on a bad shape or an index
  outside [0, k)."""
  if logits_at is None:
    return None
  logits_at = _row_ints(logits_at, batch, "logits_at")
  if is_concrete(logits_at):
    values = np.asarray(logits_at)
    if (values < 0).any() or (values >= k).any():
      raise ValueError(f"logits_at {values.tolist()} must index the call's {k} tokens")
  return logits_at.astype(jnp.int32)


def check_tree(tree: Any, batch: int, k: int, max_len: int, prefix_lengths: Any) -> None:
  """ValueError unless tree is None or a TreeAttention for a [batch, k] call (no prefix LM)."""
  if tree is None:
    return
  if not isinstance(tree, TreeAttention):
    raise ValueError(f"tree must be a specjax.models.tree.TreeAttention, got "
                     f"{type(tree).__name__}")
  if prefix_lengths is not None:
    raise ValueError("a tree call cannot take prefix_lengths (the prefill is a chain call)")
  want = {"token_pos": (batch, k), "visible": (batch, k, k),
          "cache_visible": (batch, k, max_len), "cache_pos": (batch, max_len)}
  for name, shape in want.items():
    value = getattr(tree, name)
    if value is not None and tuple(value.shape) != shape:
      raise ValueError(f"tree.{name} must have shape {list(shape)}, got {list(value.shape)}")


def check_prefix_lengths(prefix_lengths: Any, batch: int, limit: Optional[Array]) -> Array:
  """Returns int32 [B] prefix lengths; ValueError outside [0, limit[b]]."""
  prefix_lengths = _row_ints(prefix_lengths, batch, "prefix_lengths")
  if is_concrete(prefix_lengths) and (limit is None or is_concrete(limit)):
    values = np.asarray(prefix_lengths)
    top = np.broadcast_to(np.asarray(limit) if limit is not None else np.inf, values.shape)
    if (values < 0).any() or (values > top).any():
      raise ValueError(f"prefix_lengths {values.tolist()} must lie in [0, number of "
                       f"tokens written so far], here at most {top.tolist()}")
  return prefix_lengths.astype(jnp.int32)
