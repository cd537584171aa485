"""The speculative round: Algorithm 1's five named steps over the loop state.

  draft   the drafter proposes γ guesses and their q        (`Proposal`)
  score   the target scores all γ+1 positions in ONE call   (logits [B, bucket+1, V])
  verify  Algorithm 1 per row accepts n guesses, draws one  (`specjax.verify.verify_batch`)
  commit  the row advances by n + 1; the drafter rolls back (seq, length, done, caches)
  record  per-row statistics, the trace, the next round's γ

`SpeculativeLoop` holds them on the skeleton it shares with the tree loop (`DraftingLoop`:
start, the narrow round, rounds); the padded-batch loop
(`specjax.decode.speculative`) and the streaming decode (`specjax.decode.stream`) both run
its `rounds`. Under the 'auto' γ policy a round is one of len(buckets) + 1 compiled
variants (`specjax.decode.auto.rounds`): the narrow round (every row at γ = 0: the
autoregressive step) or a wide round whose target call has the width of a bucket.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Optional, Tuple

import flax
import jax
import jax.numpy as jnp

from specjax.decode import auto
from specjax.decode.auto import rounds as auto_rounds
from specjax.decode.autoregressive import AutoregressiveLoop
from specjax.decode.config import DecodeConfig
from specjax.decode.gamma import next_gamma
from specjax.decode.loop import advance, bad_logits, going, last_tokens, start_drafting
from specjax.decode.state import LoopParams, LoopState, Trace, empty_trace
from specjax.draft import Accepted, Drafter, Proposal
from specjax.models import DecodingModel
from specjax.models.protocol import layers_kwargs
from specjax.rows import take_rows
from specjax.verify import emitted_tokens, verify_batch


@flax.struct.dataclass
class Verdict:
  """The outcome of verifying one round."""

  n: jax.Array  # int32 [B]: guesses accepted
  token: jax.Array  # int32 [B]: the token drawn after them
  overlap: jax.Array  # float32 [B, G]: Σ_x min(p_i, q_i) at each guess position
  bad: jax.Array  # bool [B]: NaN in the row's target logits or draft q


def draft(drafter: Drafter, params: LoopParams, state: LoopState, keys,
          config: DecodeConfig) -> Tuple[Proposal, Any]:
  """Every row's γ guesses (tokens [B, max_gamma], probs [B, max_gamma, V]) and the drafter's
  new state."""
  return drafter.propose(params.drafter, state.drafter_state, state.seq, state.length,
                         state.gamma, keys, config.sampling)


def score(target: DecodingModel, params: LoopParams, state: LoopState, proposal: Proposal,
          encoded, bucket: int, features: bool = False, feature_layers=None):
  """The target's logits [B, bucket+1, V] at the last token and the first `bucket` guesses,
  its features there (float32 [B, bucket+1, E], or [B, bucket+1, n * E] with static
  `feature_layers`) when `features` (static; else None), and its cache."""
  tokens = jnp.concatenate([last_tokens(state), proposal.tokens[:, :bucket]], axis=1)
  if features:
    return target.decode_features(params.target, state.cache, tokens, state.length - 1,
                                  encoded, **layers_kwargs(feature_layers))
  logits, cache = target.decode(params.target, state.cache, tokens, state.length - 1, encoded)
  return logits, None, cache


def verify(config: DecodeConfig, keys, state: LoopState, proposal: Proposal, logits) -> Verdict:
  """Algorithm 1 per row over the round's width (logits [B, bucket+1, V]; every row's γ ≤
  bucket ≤ max_gamma)."""
  bucket = logits.shape[1] - 1
  probs = proposal.probs[:, :bucket]
  n, token, overlap = verify_batch(config.sampling, config.verifier, config.lenience, keys,
                                   state.length, proposal.tokens[:, :bucket], probs, logits,
                                   state.gamma)
  bad = bad_logits(logits) | jnp.any(jnp.isnan(probs), axis=(1, 2))
  pad = proposal.tokens.shape[1] - bucket
  return Verdict(n=n, token=token, overlap=jnp.pad(overlap, ((0, 0), (0, pad))), bad=bad)


def commit(config: DecodeConfig, drafter: Drafter, state: LoopState, proposal: Proposal,
           verdict: Verdict, cache, drafter_state, prefix_len, max_new_tokens,
           features=None) -> LoopState:
  """Each active row advances by n + 1 (stopping at EOS and its budget); the drafter rolls
  back to what was accepted (and reads the scored positions' `features` when it wants them)."""
  emitted = emitted_tokens(proposal.tokens, verdict.n, verdict.token)  # [B, G+1]
  seq, length, done = advance(state, emitted, verdict.n + 1, prefix_len, max_new_tokens,
                              config.eos_id)
  return state.replace(seq=seq, length=length, done=done, cache=cache,
                       drafter_state=drafter.update(drafter_state, Accepted(
                           start=state.length, n=verdict.n, gamma=state.gamma,
                           features=features)))


def record_trace(trace: Trace, active, round_index, guesses, n, token, gamma) -> Trace:
  """`trace` with round `round_index` [B] of the active rows written: guesses [B, G],
  accepted n [B], correction token [B], γ [B]."""
  rows, r = jnp.arange(n.shape[0]), jnp.minimum(round_index, trace.accepted.shape[1] - 1)
  keep = lambda new, old: jnp.where(active.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)
  return trace.replace(
      guesses=trace.guesses.at[rows, r].set(keep(guesses, trace.guesses[rows, r])),
      accepted=trace.accepted.at[rows, r].set(keep(n, trace.accepted[rows, r])),
      correction=trace.correction.at[rows, r].set(keep(token, trace.correction[rows, r])),
      gamma=trace.gamma.at[rows, r].set(keep(gamma, trace.gamma[rows, r])))


def record(config: DecodeConfig, before: LoopState, after: LoopState, proposal: Proposal,
           verdict: Verdict, max_gamma: int) -> LoopState:
  """`after` with the round's statistics: γ and accepted histograms, calls, the α estimate,
  the trace, NaN flags, and every row's γ for the next round."""
  active = ~before.done
  gamma, n = before.gamma, verdict.n
  # α estimate over positions whose prefix is the committed one: i ≤ n, i < γ.
  at = jnp.arange(max_gamma)[None, :]
  seen = (at <= n[:, None]) & (at < gamma[:, None]) & active[:, None]
  alpha_sum = before.alpha_sum + jnp.where(seen, verdict.overlap, 0.0).sum(1)
  alpha_count = before.alpha_count + seen.sum(1)
  trace = before.trace
  if trace is not None:
    trace = record_trace(trace, active, before.target_calls, proposal.tokens, n, verdict.token,
                         gamma)
  return after.replace(
      trace=trace,
      gamma_hist=before.gamma_hist + (jax.nn.one_hot(gamma, max_gamma + 1, dtype=jnp.int32)
                                      * active[:, None]),
      target_calls=before.target_calls + active,
      draft_calls=before.draft_calls + jnp.where(active, proposal.calls, 0),
      accepted_hist=before.accepted_hist + (jax.nn.one_hot(n, max_gamma + 1, dtype=jnp.int32)
                                            * active[:, None]),
      alpha_sum=alpha_sum, alpha_count=alpha_count,
      gamma=next_gamma(config, gamma, n, alpha_sum / jnp.maximum(alpha_count, 1), max_gamma),
      nan=before.nan | (active & verdict.bad))


def narrow_round(target: DecodingModel, config: DecodeConfig, params: LoopParams,
                 state: LoopState, keys, encoded, prefix_len, max_new_tokens,
                 max_gamma: int, drafter: Optional[Drafter] = None) -> LoopState:
  """Every row one autoregressive step (one 1-token target call, the same key, no draft
  call), counted as a γ = 0 round in the histograms and the trace (`max_gamma` guesses wide).
  A `drafter` that `wants_features` gets the target's feature at the scored position (its
  `update` with n = 0); other drafters catch up on their next `propose`."""
  wants = drafter is not None and drafter.wants_features
  after, scored = AutoregressiveLoop(target, config).step(
      params, state, keys, encoded, prefix_len, max_new_tokens, features=wants,
      feature_layers=drafter.feature_layers if wants else None)
  active = ~state.done
  if wants:
    zeros = jnp.zeros_like(state.length)
    after = after.replace(drafter_state=drafter.update(state.drafter_state, Accepted(
        start=state.length, n=zeros, gamma=zeros, features=scored)))
  counted = active.astype(jnp.int32)
  after = after.replace(gamma_hist=state.gamma_hist.at[:, 0].add(counted),
                        accepted_hist=state.accepted_hist.at[:, 0].add(counted))
  if state.trace is None:
    return after
  zeros = jnp.zeros_like(state.length)
  token = take_rows(after.seq, state.length[:, None])[:, 0]
  guesses = jnp.zeros((zeros.shape[0], max_gamma), jnp.int32)
  return after.replace(trace=record_trace(state.trace, active, state.target_calls, guesses,
                                          zeros, token, zeros))


class DraftingLoop:
  """The skeleton the chain and tree loops share as `runner.Loop`s (both hold `target`,
  `drafter` and `config`): `start`, the narrow round, `rounds` (one round, or the 'auto'
  policy's phases over the narrow round and one wide round per bucket), γ's bound, the fallback
  and when the decode goes on. A loop adds its `round(bucket, ...)` (draft -> score -> verify
  -> commit -> record, the target call `bucket` guesses wide) and its `buckets`."""

  takes_gamma: ClassVar[bool]
  """Whether `start` reads γ: the chain's first γ per row (a tree's shape replaces γ: 0)."""
  alpha_rounds: ClassVar[Optional[int]] = None
  """'auto': rounds of the calibration's α run (None: as many as it times)."""

  @property
  def auto(self) -> Optional[auto.AutoSpec]:
    """The 'auto' policy's spec (`runner.auto_spec`), None under a fixed γ."""
    if not self._auto:
      return None
    return auto.AutoSpec(buckets=self.buckets, alpha_rounds=self.alpha_rounds,
                                fallback=AutoregressiveLoop.of(self.target, self.config))

  @property
  def _auto(self) -> bool:
    return self.config.gamma_policy == "auto"

  @property
  def max_gamma(self) -> int:
    return self.drafter.max_gamma

  @property
  def buckets(self) -> Tuple[int, ...]:
    """'auto': the γ of each wide-round variant."""
    raise NotImplementedError

  def round(self, bucket: int, params: LoopParams, state: LoopState, keys, encoded,
            prefix_len, max_new_tokens) -> LoopState:
    """One round whose target call scores the last token and `bucket` guesses."""
    raise NotImplementedError

  def going(self, params: LoopParams, state: LoopState) -> jax.Array:
    """bool []: whether the decode goes on (a row is busy; 'auto': within control.max_rounds)."""
    return going(state, params.control if self._auto else None)

  def start(self, params: LoopParams, inputs, seq, length, gamma=None) -> Tuple[LoopState, Any]:
    """inputs [B, L], seq [B, T], length [B], gamma int32 [] (read when `takes_gamma`) ->
    (LoopState, encoded): the target encoded / prefilled, the drafter started, every row at
    its first γ (a tree: 0, which under 'auto' is the narrow round), histograms of γ up to
    max_gamma."""
    max_gamma = self.max_gamma
    batch, width = seq.shape
    state, encoded = start_drafting(self.target, self.drafter, params, inputs, seq, length,
                                    max_gamma + 1)
    return state.replace(
        gamma=jnp.full((batch,), gamma if self.takes_gamma else 0, jnp.int32),
        gamma_hist=jnp.zeros((batch, max_gamma + 1), jnp.int32),
        trace=empty_trace(batch, width, max_gamma) if self.config.trace else None), encoded

  def narrow(self, params: LoopParams, state: LoopState, keys, encoded, prefix_len,
             max_new_tokens) -> LoopState:
    """A round in which every row has γ = 0: the autoregressive step (one 1-token target call,
    the same key, no draft call) counted as a γ = 0 round. A drafter that wants features gets
    the scored one; others catch up the tokens they missed on their next `propose`."""
    return narrow_round(self.target, self.config, params, state, keys, encoded, prefix_len,
                        max_new_tokens, self.max_gamma, self.drafter)

  def rounds(self, params: LoopParams, state: LoopState, keys, encoded, prefix_len,
             max_new_tokens, running: Callable = lambda s: True,
             place: Callable = lambda s: s) -> LoopState:
    """At least one round. Fixed γ policies: exactly one, max_gamma wide. 'auto': one
    `auto_rounds.run` pass, rounds of each variant (the narrow round, then one per bucket)
    while `running(state)` and `going` hold (the streaming decode stops it when a slot is
    free). `place` constrains each round's state (sharding)."""
    step = dict(params=params, keys=keys, encoded=encoded, prefix_len=prefix_len,
                max_new_tokens=max_new_tokens)
    if not self._auto:
      return place(self.round(self.max_gamma, state=state, **step))
    variants = [lambda s: self.narrow(state=s, **step)] + [
        lambda s, b=b: self.round(b, state=s, **step) for b in self.buckets]
    return auto_rounds.run(params.control, self.buckets, variants, state, prefix_len,
                           max_new_tokens,
                           running=lambda s: self.going(params, s) & running(s), place=place)


@dataclasses.dataclass(frozen=True)
class SpeculativeLoop(DraftingLoop):
  """Algorithm 1 as a `runner.Loop` (static, hashable; `params` is a `LoopParams`): the
  `DraftingLoop` skeleton with the chain's round, shared by the padded-batch loop and the
  streaming decode (`specjax.decode.stream`)."""

  target: DecodingModel
  drafter: Drafter
  config: DecodeConfig

  takes_gamma: ClassVar[bool] = True  # every row's first γ

  @property
  def buckets(self) -> Tuple[int, ...]:
    """'auto': the γ of each wide-round variant (`DecodeConfig.auto_buckets` resolved)."""
    return auto.resolve_buckets(self.config.auto_buckets, self.max_gamma) if self._auto else ()

  def round(self, bucket: int, params: LoopParams, state: LoopState, keys, encoded, prefix_len,
            max_new_tokens) -> LoopState:
    """draft -> score -> verify -> commit -> record, the target call scoring the last token
    and `bucket` guesses; keys [B] row keys, prefix_len int32 [B]."""
    config, drafter = self.config, self.drafter
    round_keys = keys
    if config.verifier.fresh_round_keys:
      # The verifier reads guesses and uniforms past what it accepts, and the next round
      # draws at those positions again: fold in the round's start (unique per row).
      round_keys = jax.vmap(jax.random.fold_in)(keys, state.length)
    proposal, drafter_state = draft(drafter, params, state, round_keys, config)
    logits, features, cache = score(self.target, params, state, proposal, encoded, bucket,
                                    drafter.wants_features, drafter.feature_layers)
    verdict = verify(config, round_keys, state, proposal, logits)
    after = commit(config, drafter, state, proposal, verdict, cache, drafter_state, prefix_len,
                   max_new_tokens, features)
    return record(config, state, after, proposal, verdict, drafter.max_gamma)
