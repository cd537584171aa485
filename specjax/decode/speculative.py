"""The speculative loop: Algorithm 1 in one `lax.while_loop` under `jax.jit`.

A round is five named steps over the loop state:
  draft   the drafter proposes γ guesses and their q        (`Proposal`)
  score   the target scores all γ+1 positions in ONE call   (logits [B, G+1, V])
  verify  Algorithm 1 per row accepts n guesses, draws one  (`specjax.verify.verify_batch`)
  commit  the row advances by n + 1; the drafter rolls back (seq, length, done, caches)
  record  per-row statistics, the trace, the next round's γ

Rows advance independently (each by its own n + 1 per round), finish at their
own EOS or budget, and draw randomness from keys tied to (row, absolute
position, stream), so a row's output does not depend on its batch.
`max_new_tokens` and γ ≤ `drafter.max_gamma` are traced data: changing them
does not recompile.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specjax.decode.config import DecodeConfig
from specjax.decode.gamma import next_gamma
from specjax.decode.inputs import (cache_length, check_cache_size, check_count, check_inputs,
                                   check_nan, drafter_models, initial_seq, prefix_lengths)
from specjax.decode.loop import advance, finish, last_tokens, start_loop
from specjax.decode.state import DecodeResult, LoopState, Trace
from specjax.decode.stream import Streaming, as_streaming, decode_streaming
from specjax.draft import Drafter, Proposal
from specjax.models import DecodingModel, check_same_vocab
from specjax.sampling import row_keys
from specjax.sharding import Partitioner, constrain, place, unpad
from specjax.verify import emitted_tokens, verify_batch


@flax.struct.dataclass
class Verdict:
  """The outcome of verifying one round."""

  n: jax.Array  # int32 [B]: guesses accepted
  token: jax.Array  # int32 [B]: the token drawn after them
  overlap: jax.Array  # float32 [B, G]: Σ_x min(p_i, q_i) at each guess position
  bad: jax.Array  # bool [B]: NaN in the row's target logits or draft q


def _draft(drafter, drafter_params, state: LoopState, keys, config: DecodeConfig):
  return drafter.propose(drafter_params, state.drafter_state, state.seq, state.length,
                         state.gamma, keys, config.sampling)


def _score(target, target_params, state: LoopState, proposal: Proposal, encoded):
  tokens = jnp.concatenate([last_tokens(state), proposal.tokens], axis=1)  # [B, G+1]
  return target.decode(target_params, state.cache, tokens, state.length - 1, encoded)


def _verify(config: DecodeConfig, keys, state: LoopState, proposal: Proposal, logits) -> Verdict:
  n, token, overlap = verify_batch(config.sampling, config.verifier, config.lenience, keys,
                                   state.length, proposal.tokens, proposal.probs, logits,
                                   state.gamma)
  bad = jnp.any(jnp.isnan(logits), axis=(1, 2)) | jnp.any(jnp.isnan(proposal.probs), axis=(1, 2))
  return Verdict(n=n, token=token, overlap=overlap, bad=bad)


def _commit(config: DecodeConfig, drafter, state: LoopState, proposal: Proposal, verdict: Verdict,
            cache, drafter_state, prefix_len, max_new_tokens) -> LoopState:
  emitted = emitted_tokens(proposal.tokens, verdict.n, verdict.token)  # [B, G+1]
  seq, length, done = advance(state, emitted, verdict.n + 1, prefix_len, max_new_tokens,
                              config.eos_id)
  return state.replace(seq=seq, length=length, done=done, cache=cache,
                       drafter_state=drafter.update(drafter_state, verdict.n, state.gamma))


def _record(config: DecodeConfig, before: LoopState, after: LoopState, proposal: Proposal,
            verdict: Verdict, max_gamma: int) -> LoopState:
  active = ~before.done
  gamma, n = before.gamma, verdict.n
  # α estimate over positions whose prefix is the committed one: i ≤ n, i < γ.
  slots = jnp.arange(max_gamma)[None, :]
  seen = (slots <= n[:, None]) & (slots < gamma[:, None]) & active[:, None]
  alpha_sum = before.alpha_sum + jnp.where(seen, verdict.overlap, 0.0).sum(1)
  alpha_count = before.alpha_count + seen.sum(1)
  trace = before.trace
  if trace is not None:
    rows, r = jnp.arange(n.shape[0]), jnp.minimum(before.target_calls, trace.accepted.shape[1] - 1)
    keep = lambda new, old: jnp.where(active.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)
    trace = trace.replace(
        guesses=trace.guesses.at[rows, r].set(keep(proposal.tokens, trace.guesses[rows, r])),
        accepted=trace.accepted.at[rows, r].set(keep(n, trace.accepted[rows, r])),
        correction=trace.correction.at[rows, r].set(keep(verdict.token, trace.correction[rows, r])),
        gamma=trace.gamma.at[rows, r].set(keep(gamma, trace.gamma[rows, r])))
  return after.replace(
      trace=trace,
      target_calls=before.target_calls + active,
      draft_calls=before.draft_calls + jnp.where(active, proposal.calls, 0),
      accepted_hist=before.accepted_hist + (jax.nn.one_hot(n, max_gamma + 1, dtype=jnp.int32)
                                            * active[:, None]),
      alpha_sum=alpha_sum, alpha_count=alpha_count,
      gamma=next_gamma(config, gamma, n, alpha_sum / jnp.maximum(alpha_count, 1), max_gamma),
      nan=before.nan | (active & verdict.bad))


def _empty_trace(batch: int, rounds: int, max_gamma: int) -> Trace:
  return Trace(guesses=jnp.zeros((batch, rounds, max_gamma), jnp.int32),
               accepted=jnp.zeros((batch, rounds), jnp.int32),
               correction=jnp.zeros((batch, rounds), jnp.int32),
               gamma=jnp.zeros((batch, rounds), jnp.int32))


@dataclasses.dataclass(frozen=True)
class SpeculativeLoop:
  """Algorithm 1's start and round (static, hashable), shared by the padded-batch loop and the
  streaming decode (`specjax.decode.stream`). `params` is (target_params, drafter_params)."""

  target: DecodingModel
  drafter: Drafter
  config: DecodeConfig

  def start(self, params, inputs, seq, length, gamma) -> Tuple[LoopState, Any]:
    """inputs [B, L], seq [B, T], length [B], gamma int32 [] -> (LoopState, encoded): the
    target encoded / prefilled, the drafter started, every row at γ."""
    target_params, drafter_params = params
    max_gamma = self.drafter.max_gamma
    batch, width = seq.shape
    state, encoded = start_loop(self.target, target_params, inputs, seq, length, width,
                                max_gamma + 1)
    return state.replace(
        drafter_state=self.drafter.init(drafter_params, inputs, seq, length, width),
        gamma=jnp.full((batch,), gamma, jnp.int32),
        trace=_empty_trace(batch, width, max_gamma) if self.config.trace else None), encoded

  def round(self, params, state: LoopState, keys, encoded, prefix_len,
            max_new_tokens) -> LoopState:
    """draft -> score -> verify -> commit -> record; keys [B] row keys, prefix_len int32 [B]."""
    target_params, drafter_params = params
    config, drafter = self.config, self.drafter
    round_keys = keys
    if config.verifier.fresh_round_keys:
      # The verifier reads guesses and uniforms past what it accepts, and the next round
      # draws at those positions again: fold in the round's start (unique per row).
      round_keys = jax.vmap(jax.random.fold_in)(keys, state.length)
    proposal, drafter_state = _draft(drafter, drafter_params, state, round_keys, config)
    logits, cache = _score(self.target, target_params, state, proposal, encoded)
    verdict = _verify(config, round_keys, state, proposal, logits)
    after = _commit(config, drafter, state, proposal, verdict, cache, drafter_state, prefix_len,
                    max_new_tokens)
    return _record(config, state, after, proposal, verdict, drafter.max_gamma)


@functools.partial(jax.jit, static_argnames=("loop", "partitioner"))
def _speculative(loop, partitioner, params, inputs, seq, length, keys, max_new_tokens, gamma):
  prefix_len = length
  state, encoded = constrain(partitioner, loop.start(params, inputs, seq, length, gamma))

  def body(state: LoopState) -> LoopState:
    return constrain(partitioner, loop.round(params, state, keys, encoded, prefix_len,
                                             max_new_tokens))

  state = jax.lax.while_loop(lambda s: jnp.any(~s.done), body, state)
  return finish(state, prefix_len)


def speculative_decode(target: DecodingModel, target_params: Any, drafter: Drafter,
                       drafter_params: Any, inputs, *, max_new_tokens: int, gamma: int,
                       rng: jax.Array, config: DecodeConfig = DecodeConfig(),
                       prompt_lengths=None,
                       partitioner: Optional[Partitioner] = None,
                       slots: Union[int, Streaming, None] = None,
                       on_progress: Optional[Callable[[int, int], None]] = None
                       ) -> DecodeResult:
  """Speculative decoding (Algorithm 1 in a loop), exact for the target's distribution.

  Each round the drafter proposes γ guesses with their standardized q, the target
  scores all γ+1 positions in ONE `decode` call, `verify` accepts n of them and
  draws one more token, and the row advances by n + 1.

  Args:
    target: the target `DecodingModel`.
    target_params: its parameters.
    drafter: a `specjax.draft` drafter (its `max_gamma` sizes the static buffers).
    drafter_params: the drafter's parameters (model params or n-gram tables; None if unused).
    inputs: int32 [B, L]: encoder inputs (T5) or left-aligned prompts (decoder-only), 0-padded.
    max_new_tokens: generation budget per row (data).
    gamma: guesses per round, 1 ≤ γ ≤ drafter.max_gamma (data: no recompile).
    rng: one PRNG key, or one key per row [B].
    config: static settings.
    prompt_lengths: optional int [B] for decoder-only prompts.
    partitioner: as for `autoregressive_decode` (drafter params are placed too).
    slots: stream the B inputs through this many slots (in-flight batching,
      `specjax.decode.stream`): a finished row takes the next input, its encoder / prefill and
      drafter state start for that slot. None: one padded batch.
      A `specjax.decode.Streaming` sets refill rows and the tail shrink too.
    on_progress: streaming: called as on_progress(done, B) after every `slots` finished inputs.
  Returns:
    A `DecodeResult` with tokens [B, max_new_tokens] and per-row statistics, in input order
    (streaming: with `rounds` and `slot_rounds`, see `DecodeResult.slot_utilization`).
  """
  check_same_vocab(target, drafter.vocab_size)
  if (isinstance(gamma, (bool, np.bool_)) or not isinstance(gamma, (int, np.integer))
      or not 1 <= gamma <= drafter.max_gamma):
    raise ValueError(f"gamma must be an integer in [1, max_gamma={drafter.max_gamma}], "
                     f"got {gamma!r}")
  max_new_tokens = check_count("max_new_tokens", max_new_tokens)
  inputs = check_inputs(target, inputs)
  length = prefix_lengths(target, inputs, prompt_lengths)
  cache_len = cache_length(config.cache_len, int(length.max()), max_new_tokens,
                           drafter.max_gamma + 1)
  loop = SpeculativeLoop(target, drafter, config)
  if slots is not None:
    streaming = as_streaming(slots)
    slot_rows = streaming.sizes(partitioner)[0] + streaming.refill_rows
    check_cache_size([target, *drafter_models(drafter)], slot_rows, cache_len, partitioner)
    if partitioner is not None:
      target_params = partitioner.shard_params(target_params)
      drafter_params = partitioner.shard_params(drafter_params)
    return decode_streaming(loop, (target_params, drafter_params), inputs, length, rng,
                            streaming=streaming, width=cache_len, max_new_tokens=max_new_tokens,
                            gamma=gamma, partitioner=partitioner,
                            on_progress=on_progress)
  check_cache_size([target, *drafter_models(drafter)], inputs.shape[0], cache_len, partitioner)
  seq = initial_seq(target, inputs, cache_len)
  (target_params, drafter_params), rows = place(partitioner, [target_params, drafter_params], [
      jnp.asarray(inputs), jnp.asarray(seq), jnp.asarray(length),
      row_keys(rng, inputs.shape[0])])
  result, nan = unpad(partitioner, _speculative(
      loop, partitioner, (target_params, drafter_params),
      *rows, jnp.int32(max_new_tokens), jnp.int32(gamma)), inputs.shape[0])
  check_nan(nan)
  return result.replace(tokens=result.tokens[:, :max_new_tokens])
