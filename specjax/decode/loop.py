"""Pieces shared by the decode loops (traced, inside jit).

Both loops keep, per row, a token buffer `seq` [B, T] holding the decoder
prefix (T5: the start token 0; decoder-only: the prompt) followed by the
generated tokens, and the committed length. Caches hold every committed token
but the last, which each round feeds again, so a round is always "feed the last
token (+ guesses) at length - 1". Rolling back rejected guesses is only not
advancing the length: their cache positions are overwritten before any query sees them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decode.state import DecodeResult, LoopState
from specjax.models import start_model
from specjax.models.start import prefill_features
from specjax.rows import take_rows, update_rows


def start_loop(model, params, inputs, seq, length, cache_len: int, hist_width: int,
               features: bool = False, feature_layers=None):
  """The loop state after the target's encode / prefill -> (LoopState, encoded); with
  `features` (static) a third element: a decoder-only target's prompt features float32
  [B, P, E] from the prefill itself ([B, P, n * E] with static `feature_layers`, the
  drafter's; None for T5)."""
  batch = seq.shape[0]
  prompt_features = None
  if features and not model.is_encoder_decoder:
    cache, prompt_features = prefill_features(model, params, model.init_cache(batch, cache_len),
                                              inputs, length, feature_layers)
    encoded = None
  else:
    cache, encoded, _ = start_model(model, params, inputs, length, cache_len)
  zeros = jnp.zeros((batch,), jnp.int32)
  state = LoopState(seq=seq, length=length, done=jnp.zeros((batch,), jnp.bool_), cache=cache,
                    drafter_state=None, target_calls=zeros, draft_calls=zeros,
                    accepted_hist=jnp.zeros((batch, hist_width), jnp.int32),
                    alpha_sum=jnp.zeros((batch,), jnp.float32), alpha_count=zeros,
                    nan=jnp.zeros((batch,), jnp.bool_))
  return (state, encoded, prompt_features) if features else (state, encoded)


def start_drafting(target, drafter, params, inputs, seq, length, hist_width: int):
  """`start_loop` with the drafter started (`drafter.init`; a drafter that `wants_features`
  gets the prefill's prompt features) -> (LoopState, encoded)."""
  width = seq.shape[1]
  if not drafter.wants_features:
    state, encoded = start_loop(target, params.target, inputs, seq, length, width, hist_width)
    return state.replace(drafter_state=drafter.init(params.drafter, inputs, seq, length,
                                                    width)), encoded
  state, encoded, features = start_loop(target, params.target, inputs, seq, length, width,
                                        hist_width, features=True,
                                        feature_layers=drafter.feature_layers)
  return state.replace(drafter_state=drafter.init(params.drafter, inputs, seq, length, width,
                                                  features=features, encoded=encoded)), encoded


def last_tokens(state: LoopState) -> jax.Array:
  """int32 [B, 1]: each row's last committed token (fed again at position length - 1)."""
  return take_rows(state.seq, (state.length - 1)[:, None])


def advance(state: LoopState, emitted, num_emitted, prefix_len, max_new_tokens, eos_id):
  """Appends emitted[:, :num_emitted] to active rows, stopping at EOS and the budget.

  emitted: int32 [B, W]; num_emitted: int32 [B] in [1, W]. Returns (seq, length, done).
  """
  width = emitted.shape[1]
  active = ~state.done
  is_eos = (emitted == eos_id) & (jnp.arange(width)[None, :] < num_emitted[:, None])
  count = jnp.where(jnp.any(is_eos, 1), jnp.argmax(is_eos, 1) + 1, num_emitted)
  room = prefix_len + max_new_tokens - state.length
  hit_eos = jnp.any(is_eos, 1) & (jnp.argmax(is_eos, 1) < room)
  count = jnp.minimum(count, room)
  current = take_rows(state.seq, state.length[:, None] + jnp.arange(width)[None, :])
  window = jnp.where(active[:, None], emitted, current)
  start = jnp.minimum(state.length, state.seq.shape[1] - width)
  seq = update_rows(state.seq, window, start)
  length = jnp.where(active, state.length + count, state.length)
  done = state.done | hit_eos | (length >= prefix_len + max_new_tokens)
  return seq, length, done


def going(state: LoopState, control=None) -> jax.Array:
  """bool []: whether a decode goes on: a row is busy and, given the 'auto' policy's control
  (`auto.AutoControl`), the rounds are within its max_rounds."""
  busy = jnp.any(~state.done)
  if control is None:
    return busy
  return busy & (jnp.max(state.target_calls) < control.max_rounds)


def bad_logits(logits: jax.Array) -> jax.Array:
  """bool [B]: rows whose logits [B, k, V] hold NaN or +inf, or only -inf at some position
  (no distribution can be read from them; the argmax would silently be token 0)."""
  return jnp.any(~jnp.isfinite(jnp.max(logits, axis=-1)), axis=1)


def finish(state: LoopState, prefix_len):
  """-> (DecodeResult with tokens [B, T], nan flags bool [B])."""
  width = state.seq.shape[1]
  generated = state.length - prefix_len
  index = prefix_len[:, None] + jnp.arange(width)[None, :]
  tokens = jnp.where(jnp.arange(width)[None, :] < generated[:, None], take_rows(state.seq, index), 0)
  return DecodeResult(tokens=tokens, lengths=generated, target_calls=state.target_calls,
                      draft_calls=state.draft_calls, accepted_hist=state.accepted_hist,
                      alpha_sum=state.alpha_sum, alpha_count=state.alpha_count,
                      trace=state.trace, gamma_hist=state.gamma_hist), state.nan
