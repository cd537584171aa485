"""The baseline loop: one token per target call, one `lax.while_loop` under `jax.jit`."""
from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from specjax.decode.config import DecodeConfig
from specjax.decode.inputs import (cache_length, check_cache_size, check_config, check_count,
                                   check_inputs, check_nan, initial_seq, prefix_lengths)
from specjax.decode.loop import advance, bad_logits, finish, last_tokens, start_loop
from specjax.decode.state import DecodeResult, LoopState
from specjax.models import DecodingModel
from specjax.sampling import CORRECTION_STREAM, Sampling, position_key, row_keys
from specjax.sharding import Partitioner, constrain, place, unpad


def next_tokens(sampling: Sampling, keys: jax.Array, length: jax.Array,
                logits: jax.Array) -> jax.Array:
  """The token each row draws at position `length` from logits [B, V] -> int32 [B].

  Key: the row's (position, correction stream) key, shared by every loop that takes a
  plain target step (here, and the speculative loop's γ = 0 rounds).
  """
  step_keys = jax.vmap(position_key, in_axes=(0, 0, None))(keys, length, CORRECTION_STREAM)
  return jax.vmap(sampling.sample)(step_keys, logits)


@functools.partial(jax.jit, static_argnames=("model", "config", "partitioner"))
def _autoregressive(model, config, partitioner, params, inputs, seq, length, keys,
                    max_new_tokens):
  prefix_len = length
  state, encoded = constrain(partitioner, start_loop(model, params, inputs, seq, length,
                                                     seq.shape[1], 1))

  def body(state: LoopState) -> LoopState:
    logits, cache = model.decode(params, state.cache, last_tokens(state), state.length - 1,
                                 encoded)
    token = next_tokens(config.sampling, keys, state.length, logits[:, 0])
    seq, length, done = advance(state, token[:, None], jnp.ones_like(state.length), prefix_len,
                                max_new_tokens, config.eos_id)
    active = ~state.done
    return constrain(partitioner, state.replace(
        seq=seq, length=length, done=done, cache=cache, target_calls=state.target_calls + active,
        nan=state.nan | (active & bad_logits(logits))))

  state = jax.lax.while_loop(lambda s: jnp.any(~s.done), body, state)
  return finish(state, prefix_len)


def autoregressive_decode(model: DecodingModel, params: Any, inputs, *, max_new_tokens: int,
                          rng: jax.Array, config: DecodeConfig = DecodeConfig(),
                          prompt_lengths=None,
                          partitioner: Optional[Partitioner] = None) -> DecodeResult:
  """The baseline: one token per target call (T5X `temperature_sample` semantics).

  Args:
    model: a `DecodingModel` (encoder-decoder or decoder-only).
    params: its parameters.
    inputs: int32 [B, L]: encoder inputs (T5) or left-aligned prompts (decoder-only), 0-padded.
    max_new_tokens: generation budget per row (data: changing it does not recompile
      as long as `config.cache_len` is set or the rounded cache length is unchanged).
    rng: one PRNG key, or one key per row [B].
    config: static settings.
    prompt_lengths: optional int [B] for decoder-only prompts (default: non-zero count).
    partitioner: a `specjax.sharding.Partitioner` to run on its mesh (params placed
      in their shardings, the batch padded to and split over the 'data' axis).
  Returns:
    A `DecodeResult` with tokens [B, max_new_tokens].
  """
  check_config(model, config)
  max_new_tokens = check_count("max_new_tokens", max_new_tokens)
  inputs = check_inputs(model, inputs)
  length = prefix_lengths(model, inputs, prompt_lengths)
  cache_len = cache_length(config.cache_len, int(length.max()), max_new_tokens, 1)
  check_cache_size([model], inputs.shape[0], cache_len, partitioner)
  seq = initial_seq(model, inputs, cache_len)
  (params,), rows = place(partitioner, [params], [
      jnp.asarray(inputs), jnp.asarray(seq), jnp.asarray(length),
      row_keys(rng, inputs.shape[0])])
  result, nan = unpad(partitioner, _autoregressive(model, config, partitioner, params, *rows,
                                                   jnp.int32(max_new_tokens)), inputs.shape[0])
  check_nan(nan)
  return result.replace(tokens=result.tokens[:, :max_new_tokens])
