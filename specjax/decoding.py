"""Autoregressive and speculative decode loops: one `lax.while_loop` under `jax.jit`.

Both loops keep, per row, a token buffer `seq` [B, T] holding the decoder
prefix (T5: the start token 0; decoder-only: the prompt) followed by the
generated tokens, and the committed length. Caches hold every committed token
but the last, which each round feeds again, so a round is always "feed the last
token (+ guesses) at length - 1". Rolling back rejected guesses is only not
advancing the length: their cache slots are overwritten before any query sees them.

Rows advance independently (each by its own n + 1 per round), finish at their
own EOS or budget, and draw randomness from keys tied to (row, absolute
position, stream), so a row's output does not depend on its batch.
`max_new_tokens` and γ ≤ `drafter.max_gamma` are traced data: changing them
does not recompile.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters import (ACCEPT_STREAM, CORRECTION_STREAM, Drafter, position_key, start_model,
                              take_rows)
from specjax.models.protocol import DecodingModel, check_same_vocab
from specjax.sampling import Sampling
from specjax.sharding import Partitioner, constrain, place, unpad
from specjax.speculative import argmax_lenient_step, check_lenience
from specjax.verifiers import ReferenceVerifier, Verifier


GAMMA_POLICIES = ("constant", "heuristic", "optimal")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Static decoding settings (hashable; part of the jit cache key)."""

  sampling: Sampling = Sampling()
  """Standardization applied to target and draft logits alike."""
  eos_id: int = 1
  """Generation of a row stops after it emits this token (T5 convention: 1)."""
  lenience: float = 1.0
  """l in (0, 1]; 1 is exact. At temperature 0 and l < 1 the argmax lenience of A.5 is used."""
  cache_len: Optional[int] = None
  """Decoder slots per row (prefix + new tokens + max_gamma + 1). None: rounded up to 128."""
  trace: bool = False
  """Record every round's guesses, accepted count and correction (for Figure-1 traces)."""
  gamma_policy: str = "constant"
  """How each row's γ evolves: 'constant'; 'heuristic' (+2 after a round that accepted all,
  −1 otherwise, within [1, max_gamma]); 'optimal' (the γ maximizing Thm 3.8 for the row's
  running α estimate and `cost_coefficient`). γ is data: policies never recompile per γ."""
  cost_coefficient: float = 0.0
  """c, the draft/target cost ratio the 'optimal' policy plugs into Thm 3.8."""
  verifier: Verifier = ReferenceVerifier()
  """The accept/reject step (`specjax.verifiers`): 'reference' and 'fused' are exact;
  'sigmoid' (SigmoidApproxVerifierNotExact) is NOT exact: its output follows the draft."""

  def __post_init__(self):
    check_lenience(self.lenience)
    if self.gamma_policy not in GAMMA_POLICIES:
      raise ValueError(f"gamma_policy must be one of {GAMMA_POLICIES}, got {self.gamma_policy!r}")
    if self.cost_coefficient < 0:
      raise ValueError(f"cost_coefficient must be >= 0, got {self.cost_coefficient}")


@flax.struct.dataclass
class Trace:
  """Per-round record of a speculative generation (rounds beyond `target_calls` are 0)."""

  guesses: jax.Array  # int32 [B, R, max_gamma]: the drafted tokens of round r
  accepted: jax.Array  # int32 [B, R]: guesses accepted in round r
  correction: jax.Array  # int32 [B, R]: the token the target drew after them
  gamma: jax.Array  # int32 [B, R]: guesses offered in round r (a row's γ may adapt)


@flax.struct.dataclass
class DecodeResult:
  """Tokens and per-row statistics of one generation."""

  tokens: jax.Array  # int32 [B, max_new_tokens]; 0 after each row's end
  lengths: jax.Array  # int32 [B]: generated tokens, a final EOS included
  target_calls: jax.Array  # int32 [B]: target `decode` calls (rounds), prefill excluded
  draft_calls: jax.Array  # int32 [B]: draft model calls (0 for table drafters)
  accepted_hist: jax.Array  # int32 [B, max_gamma + 1]: rounds that accepted n guesses
  alpha_sum: jax.Array  # float32 [B]: Σ_x min(p, q) summed over verified positions
  alpha_count: jax.Array  # int32 [B]: verified positions in alpha_sum
  trace: Optional[Trace] = None  # per-round record when DecodeConfig.trace

  @property
  def alpha(self) -> jax.Array:
    """float32 [B]: the acceptance-rate estimate, mean of Σ min(p, q)."""
    return self.alpha_sum / jnp.maximum(self.alpha_count, 1)

  @property
  def tokens_per_call(self) -> jax.Array:
    """float32 [B]: generated tokens per target call."""
    return self.lengths / jnp.maximum(self.target_calls, 1)


@flax.struct.dataclass
class _Loop:
  seq: jax.Array  # int32 [B, T]: decoder prefix then generated tokens
  length: jax.Array  # int32 [B]: committed tokens in seq
  done: jax.Array  # bool [B]
  cache: Any  # the target's KV cache
  drafter_state: Any  # the drafter's own state (None when autoregressive)
  target_calls: jax.Array  # int32 [B]
  draft_calls: jax.Array  # int32 [B]
  accepted_hist: jax.Array  # int32 [B, G + 1]
  alpha_sum: jax.Array  # float32 [B]
  alpha_count: jax.Array  # int32 [B]
  nan: jax.Array  # bool [B]: NaN seen in this row's logits
  gamma: Optional[jax.Array] = None  # int32 [B]: each row's γ for the next round
  trace: Optional[Trace] = None  # filled when DecodeConfig.trace


# ------------------------------------------------------------------ input handling


def _row_keys(rng: jax.Array, batch: int) -> jax.Array:
  """One key per row: a single key is folded with the row index; [B] keys pass through."""
  rng = jnp.asarray(rng)
  typed = jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
  single = rng.ndim == (0 if typed else 1)
  if single:
    return jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(batch))
  if rng.shape[0] != batch:
    raise ValueError(f"rng has {rng.shape[0]} row keys but the batch has {batch} rows")
  return rng


def _prefix(model: DecodingModel, inputs: np.ndarray, prompt_lengths) -> np.ndarray:
  """Per-row decoder prefix lengths; validates inputs."""
  if inputs.ndim != 2:
    raise ValueError(f"inputs must be int [batch, length], got shape {inputs.shape}")
  if model.is_encoder_decoder:
    empty = np.where((inputs != 0).sum(1) == 0)[0]
    if empty.size:
      raise ValueError(f"empty prompt: encoder inputs of rows {empty.tolist()} are all padding")
    return np.ones(inputs.shape[0], np.int32)
  lengths = (np.asarray(prompt_lengths, np.int32) if prompt_lengths is not None
             else (inputs != 0).sum(1).astype(np.int32))
  if lengths.shape != (inputs.shape[0],) or np.any(lengths > inputs.shape[1]):
    raise ValueError(f"prompt_lengths must be [batch] and ≤ {inputs.shape[1]}, got {lengths}")
  if np.any(lengths < 1):
    raise ValueError(f"empty prompt in rows {np.where(lengths < 1)[0].tolist()}: "
                     "a decoder-only model needs at least one prompt token")
  return lengths


def _check_vocab(model: DecodingModel, inputs: np.ndarray, what: str) -> None:
  if inputs.size and (inputs.min() < 0 or inputs.max() >= model.vocab_size):
    raise ValueError(f"{what} contain token ids outside [0, {model.vocab_size})")


def _cache_len(config: DecodeConfig, prefix_max: int, max_new_tokens: int, max_gamma: int) -> int:
  need = prefix_max + max_new_tokens + max_gamma + 1
  if config.cache_len is None:
    return int(-(-need // 128) * 128)
  if need > config.cache_len:
    raise ValueError(
        f"prompt + max_new_tokens beyond the cache length: prefix {prefix_max} + "
        f"max_new_tokens {max_new_tokens} + max_gamma {max_gamma} + 1 = {need} > "
        f"cache_len {config.cache_len}")
  return config.cache_len


def _initial_seq(model: DecodingModel, inputs: np.ndarray, cache_len: int) -> np.ndarray:
  seq = np.zeros((inputs.shape[0], cache_len), np.int32)
  if not model.is_encoder_decoder:
    seq[:, :inputs.shape[1]] = inputs
  return seq


def _check_nan(nan: jax.Array) -> None:
  rows = np.where(np.asarray(nan))[0]
  if rows.size:
    raise ValueError(f"NaN logits from the target or draft model in rows {rows.tolist()}")


# ----------------------------------------------------------------------- the loops


def _advance(state: _Loop, emitted, num_emitted, prefix_len, max_new_tokens, eos_id):
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
  seq = jax.vmap(lambda s, w, i: jax.lax.dynamic_update_slice(s, w, (i,)))(state.seq, window, start)
  length = jnp.where(active, state.length + count, state.length)
  done = state.done | hit_eos | (length >= prefix_len + max_new_tokens)
  return seq, length, done


def _result(state: _Loop, prefix_len):
  """-> (DecodeResult with tokens [B, T], nan flags bool [B])."""
  width = state.seq.shape[1]
  generated = state.length - prefix_len
  index = prefix_len[:, None] + jnp.arange(width)[None, :]
  tokens = jnp.where(jnp.arange(width)[None, :] < generated[:, None], take_rows(state.seq, index), 0)
  return DecodeResult(tokens=tokens, lengths=generated, target_calls=state.target_calls,
                      draft_calls=state.draft_calls, accepted_hist=state.accepted_hist,
                      alpha_sum=state.alpha_sum, alpha_count=state.alpha_count,
                      trace=state.trace), state.nan


def _start(model, params, inputs, seq, length, cache_len, gamma_slots):
  batch = seq.shape[0]
  cache, encoded, _ = start_model(model, params, inputs, length, cache_len)
  zeros = jnp.zeros((batch,), jnp.int32)
  state = _Loop(seq=seq, length=length, done=jnp.zeros((batch,), jnp.bool_), cache=cache,
                drafter_state=None, target_calls=zeros, draft_calls=zeros,
                accepted_hist=jnp.zeros((batch, gamma_slots), jnp.int32),
                alpha_sum=jnp.zeros((batch,), jnp.float32), alpha_count=zeros,
                nan=jnp.zeros((batch,), jnp.bool_))
  return state, encoded


@functools.partial(jax.jit, static_argnames=("model", "config", "partitioner"))
def _autoregressive(model, config, partitioner, params, inputs, seq, length, row_keys,
                    max_new_tokens):
  prefix_len = length
  state, encoded = constrain(partitioner, _start(model, params, inputs, seq, length,
                                                 seq.shape[1], 1))

  def body(state: _Loop) -> _Loop:
    last = take_rows(state.seq, (state.length - 1)[:, None])
    logits, cache = model.decode(params, state.cache, last, state.length - 1, encoded)
    keys = jax.vmap(position_key, in_axes=(0, 0, None))(row_keys, state.length, CORRECTION_STREAM)
    token = jax.vmap(config.sampling.sample)(keys, logits[:, 0])
    seq, length, done = _advance(state, token[:, None], jnp.ones_like(state.length), prefix_len,
                                 max_new_tokens, config.eos_id)
    active = ~state.done
    return constrain(partitioner, state.replace(
        seq=seq, length=length, done=done, cache=cache, target_calls=state.target_calls + active,
        nan=state.nan | (active & jnp.any(jnp.isnan(logits), axis=(1, 2)))))

  state = jax.lax.while_loop(lambda s: jnp.any(~s.done), body, state)
  return _result(state, prefix_len)


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
  inputs = np.asarray(inputs)
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  _check_vocab(model, inputs, "inputs")
  length = _prefix(model, inputs, prompt_lengths)
  cache_len = _cache_len(config, int(length.max()), max_new_tokens, 0)
  seq = _initial_seq(model, inputs, cache_len)
  (params,), rows = place(partitioner, [params], [
      jnp.asarray(inputs, jnp.int32), jnp.asarray(seq), jnp.asarray(length),
      _row_keys(rng, inputs.shape[0])])
  result, nan = unpad(partitioner, _autoregressive(model, config, partitioner, params, *rows,
                                                   jnp.int32(max_new_tokens)), inputs.shape[0])
  _check_nan(nan)
  return result.replace(tokens=result.tokens[:, :max_new_tokens])


def verify_batch(config: DecodeConfig, row_keys, length, guesses, draft_probs, logits, gamma):
  """vmapped Algorithm 1 with position-tied randomness; gamma int32 [B].

  Returns (n int32 [B], next int32 [B], target_probs float32 [B, G+1, V]).
  """
  max_gamma = guesses.shape[1]
  target_probs = config.sampling.probs(logits)  # [B, G+1, V]

  def one(key, start, x, q, p, raw, gamma):
    if config.sampling.greedy and config.verifier.exact:
      # Algorithm 1 on one-hot p, q is exactly this (and needs no randomness).
      return argmax_lenient_step(x, jax.nn.softmax(raw, -1), lenience=config.lenience,
                                 num_guesses=gamma)
    offsets = jnp.arange(max_gamma + 1)
    keys = jax.vmap(position_key, in_axes=(None, 0, None))(key, start + offsets, ACCEPT_STREAM)
    uniforms = jax.vmap(lambda k: jax.random.uniform(k, dtype=jnp.float32))(keys[:max_gamma])
    correction = jax.vmap(position_key, in_axes=(None, 0, None))(key, start + offsets,
                                                                 CORRECTION_STREAM)
    return config.verifier(uniforms, correction, x, q, p, raw, None, lenience=config.lenience,
                           num_guesses=gamma)

  n, token = jax.vmap(one)(row_keys, length, guesses, draft_probs, target_probs, logits, gamma)
  return n, token, target_probs


def _next_gamma(config: DecodeConfig, gamma, n, alpha, max_gamma: int):
  """Each row's γ for its next round under `config.gamma_policy`. All int32 [B]."""
  if config.gamma_policy == "heuristic":
    return jnp.clip(jnp.where(n >= gamma, gamma + 2, gamma - 1), 1, max_gamma)
  if config.gamma_policy == "optimal":
    a = jnp.clip(alpha, 0.0, 0.999)[:, None]  # [B, 1]
    g = jnp.arange(1, max_gamma + 1, dtype=jnp.float32)[None, :]  # [1, G]
    speed = (1 - a ** (g + 1)) / ((1 - a) * (g * config.cost_coefficient + 1))  # Thm 3.8
    return (jnp.argmax(speed, axis=1) + 1).astype(jnp.int32)
  return gamma


@functools.partial(jax.jit, static_argnames=("target", "drafter", "config", "partitioner"))
def _speculative(target, drafter, config, partitioner, target_params, drafter_params, inputs, seq,
                 length, row_keys, max_new_tokens, gamma):
  prefix_len = length
  max_gamma = drafter.max_gamma
  state, encoded = _start(target, target_params, inputs, seq, length, seq.shape[1], max_gamma + 1)
  state = state.replace(drafter_state=drafter.init(drafter_params, inputs, seq, length,
                                                   seq.shape[1]))
  batch = seq.shape[0]
  state = state.replace(gamma=jnp.full((batch,), gamma, jnp.int32))
  if config.trace:
    rounds = seq.shape[1]
    state = state.replace(trace=Trace(
        guesses=jnp.zeros((batch, rounds, max_gamma), jnp.int32),
        accepted=jnp.zeros((batch, rounds), jnp.int32),
        correction=jnp.zeros((batch, rounds), jnp.int32),
        gamma=jnp.zeros((batch, rounds), jnp.int32)))
  state, encoded = constrain(partitioner, (state, encoded))

  def body(state: _Loop) -> _Loop:
    active = ~state.done
    gamma = state.gamma  # int32 [B]
    guesses, q, draft_calls, dstate = drafter.propose(
        drafter_params, state.drafter_state, state.seq, state.length, gamma, row_keys,
        config.sampling)
    last = take_rows(state.seq, (state.length - 1)[:, None])
    logits, cache = target.decode(target_params, state.cache,
                                  jnp.concatenate([last, guesses], axis=1), state.length - 1,
                                  encoded)  # ONE call scores γ+1 positions
    n, token, p = verify_batch(config, row_keys, state.length, guesses, q, logits, gamma)
    slots = jnp.arange(max_gamma + 1)[None, :]
    padded = jnp.concatenate([guesses, jnp.zeros_like(guesses[:, :1])], axis=1)
    emitted = jnp.where(slots < n[:, None], padded, token[:, None])
    seq, length, done = _advance(state, emitted, n + 1, prefix_len, max_new_tokens, config.eos_id)
    # α estimate over positions whose prefix is the committed one: i ≤ n, i < γ.
    overlap = jnp.minimum(p[:, :max_gamma], q).sum(-1)  # [B, G]
    seen = (slots[:, :max_gamma] <= n[:, None]) & (slots[:, :max_gamma] < gamma[:, None]) & active[:, None]
    bad = jnp.any(jnp.isnan(logits), axis=(1, 2)) | jnp.any(jnp.isnan(q), axis=(1, 2))
    trace = state.trace
    alpha_sum = state.alpha_sum + jnp.where(seen, overlap, 0.0).sum(1)
    alpha_count = state.alpha_count + seen.sum(1)
    if trace is not None:
      rows, r = jnp.arange(n.shape[0]), jnp.minimum(state.target_calls, trace.accepted.shape[1] - 1)
      keep = lambda new, old: jnp.where(active.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)
      trace = trace.replace(
          guesses=trace.guesses.at[rows, r].set(keep(guesses, trace.guesses[rows, r])),
          accepted=trace.accepted.at[rows, r].set(keep(n, trace.accepted[rows, r])),
          correction=trace.correction.at[rows, r].set(keep(token, trace.correction[rows, r])),
          gamma=trace.gamma.at[rows, r].set(keep(gamma, trace.gamma[rows, r])))
    return constrain(partitioner, state.replace(
        trace=trace,
        seq=seq, length=length, done=done, cache=cache,
        drafter_state=drafter.update(dstate, n, gamma),
        target_calls=state.target_calls + active,
        draft_calls=state.draft_calls + jnp.where(active, draft_calls, 0),
        accepted_hist=state.accepted_hist + (jax.nn.one_hot(n, max_gamma + 1, dtype=jnp.int32)
                                             * active[:, None]),
        alpha_sum=alpha_sum, alpha_count=alpha_count,
        gamma=_next_gamma(config, gamma, n, alpha_sum / jnp.maximum(alpha_count, 1), max_gamma),
        nan=state.nan | (active & bad)))

  state = jax.lax.while_loop(lambda s: jnp.any(~s.done), body, state)
  return _result(state, prefix_len)


def speculative_decode(target: DecodingModel, target_params: Any, drafter: Drafter,
                       drafter_params: Any, inputs, *, max_new_tokens: int, gamma: int,
                       rng: jax.Array, config: DecodeConfig = DecodeConfig(),
                       prompt_lengths=None,
                       partitioner: Optional[Partitioner] = None) -> DecodeResult:
  """Speculative decoding (Algorithm 1 in a loop), exact for the target's distribution.

  Each round the drafter proposes γ guesses with their standardized q, the target
  scores all γ+1 positions in ONE `decode` call, `verify` accepts n of them and
  draws one more token, and the row advances by n + 1.

  Args:
    target: the target `DecodingModel`.
    target_params: its parameters.
    drafter: a `specjax.drafters` drafter (its `max_gamma` sizes the static buffers).
    drafter_params: the drafter's parameters (model params or n-gram tables; None if unused).
    inputs: int32 [B, L]: encoder inputs (T5) or left-aligned prompts (decoder-only), 0-padded.
    max_new_tokens: generation budget per row (data).
    gamma: guesses per round, 1 ≤ γ ≤ drafter.max_gamma (data: no recompile).
    rng: one PRNG key, or one key per row [B].
    config: static settings.
    prompt_lengths: optional int [B] for decoder-only prompts.
    partitioner: as for `autoregressive_decode` (drafter params are placed too).
  Returns:
    A `DecodeResult` with tokens [B, max_new_tokens] and per-row statistics.
  """
  check_same_vocab(target, drafter.vocab_size)
  if not 1 <= gamma <= drafter.max_gamma:
    raise ValueError(f"gamma must be in [1, max_gamma={drafter.max_gamma}], got {gamma}")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  inputs = np.asarray(inputs)
  _check_vocab(target, inputs, "inputs")
  length = _prefix(target, inputs, prompt_lengths)
  cache_len = _cache_len(config, int(length.max()), max_new_tokens, drafter.max_gamma)
  seq = _initial_seq(target, inputs, cache_len)
  (target_params, drafter_params), rows = place(partitioner, [target_params, drafter_params], [
      jnp.asarray(inputs, jnp.int32), jnp.asarray(seq), jnp.asarray(length),
      _row_keys(rng, inputs.shape[0])])
  result, nan = unpad(partitioner, _speculative(
      target, drafter, config, partitioner, target_params, drafter_params, *rows,
      jnp.int32(max_new_tokens), jnp.int32(gamma)), inputs.shape[0])
  _check_nan(nan)
  return result.replace(tokens=result.tokens[:, :max_new_tokens])
