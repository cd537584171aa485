"""Starting a model for one generation: allocate its cache, then encode or prefill."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.models.protocol import DecodingModel, layers_kwargs


def start_model(model: DecodingModel, params, inputs: jax.Array, length: jax.Array,
                cache_len: int):
  """Allocates a model's cache, then encodes (T5) or prefills the prompts (decoder-only).

  Args:
    model: a `DecodingModel`.
    params: its parameters.
    inputs: int32 [B, L] encoder inputs or left-aligned prompts.
    length: int32 [B] decoder prefix lengths.
    cache_len: decoder slots per row.
  Returns:
    (cache, encoded or None, fed int32 [B]: cache slots holding the prefix).
  """
  batch = inputs.shape[0]
  cache = model.init_cache(batch, cache_len)
  if model.is_encoder_decoder:
    return cache, model.encode(params, inputs), jnp.zeros((batch,), jnp.int32)
  return prefill(model, params, cache, inputs, length), None, length


def prefill(model: DecodingModel, params, cache, prompts: jax.Array, length: jax.Array):
  """Writes a decoder-only model's prompts [B, P] into its cache (positions 0..P-1)."""
  batch = prompts.shape[0]
  kwargs = {"prefix_lengths": length} if getattr(model, "prefix_lm", False) else {}
  _, cache = model.decode(params, cache, prompts, jnp.zeros((batch,), jnp.int32), None, **kwargs)
  return cache


def prefill_features(model: DecodingModel, params, cache, prompts: jax.Array, length: jax.Array,
                     feature_layers=None):
  """`prefill` through `decode_features`: -> (cache, the prompts' features float32 [B, P, E],
  or [B, P, n * E] with `feature_layers`) (for a feature drafter's start, without a second
  pass over the prompts)."""
  batch = prompts.shape[0]
  kwargs = {"prefix_lengths": length} if getattr(model, "prefix_lm", False) else {}
  kwargs.update(layers_kwargs(feature_layers))
  _, features, cache = model.decode_features(params, cache, prompts,
                                             jnp.zeros((batch,), jnp.int32), None, **kwargs)
  return cache, features.astype(jnp.float32)
