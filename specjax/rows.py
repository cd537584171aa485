"""Per-row batched primitives shared by the models, drafters, verifiers and loops.

Each row of a batch sits at its own position; these name the two batched
operations every part needs, once (T5X names its per-row dynamic update the same way).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def take_rows(seq: jax.Array, index: jax.Array) -> jax.Array:
  """seq: [B, T]; index: int32 [B, k] -> seq[b, index[b, i]] as [B, k] (index clamped to [0, T))."""
  index = jnp.clip(index, 0, seq.shape[1] - 1)
  return jnp.take_along_axis(seq, index, axis=1)


def _update_row(buffer: jax.Array, update: jax.Array, start: jax.Array) -> jax.Array:
  return lax.dynamic_update_slice_in_dim(buffer, update.astype(buffer.dtype), start, axis=0)


update_rows = jax.vmap(_update_row)
"""update_rows(buffer [B, T, ...], update [B, k, ...], starts int32 [B]) -> buffer with
update[b] written at buffer[b, starts[b]:starts[b] + k] (XLA clamps starts so the slice fits)."""
