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

Under the 'auto' γ policy (`specjax.decode.auto`) each round first picks every row's
γ in [0, max_gamma], then runs one of len(buckets) + 1 compiled round variants
(`auto.run_phases`): the narrow round (all γ = 0: one 1-token target call, no draft
call, an autoregressive step) or the round above with its target call at the width of
the smallest bucket ≥ the batch's largest γ.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specjax.decode import auto
from specjax.decode.autoregressive import autoregressive_decode, next_tokens
from specjax.decode.config import DecodeConfig
from specjax.decode.gamma import next_gamma
from specjax.decode.inputs import (cache_length, check_cache_size, check_config, check_count,
                                   check_inputs, check_nan, drafter_models, initial_seq,
                                   prefix_lengths)
from specjax.decode.loop import advance, bad_logits, finish, last_tokens, start_loop
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


def _score(target, target_params, state: LoopState, proposal: Proposal, encoded, guesses: int):
  """The target's logits [B, guesses+1, V] at the last token and the first `guesses` guesses."""
  tokens = jnp.concatenate([last_tokens(state), proposal.tokens[:, :guesses]], axis=1)
  return target.decode(target_params, state.cache, tokens, state.length - 1, encoded)


def _verify(config: DecodeConfig, keys, state: LoopState, proposal: Proposal, logits) -> Verdict:
  guesses = logits.shape[1] - 1  # the round's width - 1 (≤ max_gamma; every row's γ ≤ it)
  probs = proposal.probs[:, :guesses]
  n, token, overlap = verify_batch(config.sampling, config.verifier, config.lenience, keys,
                                   state.length, proposal.tokens[:, :guesses], probs, logits,
                                   state.gamma)
  bad = bad_logits(logits) | jnp.any(jnp.isnan(probs), axis=(1, 2))
  pad = proposal.tokens.shape[1] - guesses
  return Verdict(n=n, token=token, overlap=jnp.pad(overlap, ((0, 0), (0, pad))), bad=bad)


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
      gamma_hist=before.gamma_hist + (jax.nn.one_hot(gamma, max_gamma + 1, dtype=jnp.int32)
                                      * active[:, None]),
      target_calls=before.target_calls + active,
      draft_calls=before.draft_calls + jnp.where(active, proposal.calls, 0),
      accepted_hist=before.accepted_hist + (jax.nn.one_hot(n, max_gamma + 1, dtype=jnp.int32)
                                            * active[:, None]),
      alpha_sum=alpha_sum, alpha_count=alpha_count,
      gamma=next_gamma(config, gamma, n, alpha_sum / jnp.maximum(alpha_count, 1), max_gamma),
      nan=before.nan | (active & verdict.bad))


def _narrow(config: DecodeConfig, target, target_params, encoded, keys, state: LoopState,
            prefix_len, max_new_tokens, max_gamma: int) -> LoopState:
  """A round in which every row has γ = 0: one 1-token target call and no draft call.

  The token is drawn exactly as the autoregressive loop draws it (same key), and the
  drafter's state is left as it is: its next `propose` catches up the tokens it missed.
  """
  logits, cache = target.decode(target_params, state.cache, last_tokens(state), state.length - 1,
                                encoded)
  token = next_tokens(config.sampling, keys, state.length, logits[:, 0])
  seq, length, done = advance(state, token[:, None], jnp.ones_like(state.length), prefix_len,
                              max_new_tokens, config.eos_id)
  batch, zeros = token.shape[0], jnp.zeros_like(token)
  nothing = Proposal(tokens=jnp.zeros((batch, max_gamma), jnp.int32),
                     probs=jnp.zeros((batch, max_gamma, 0), jnp.float32), calls=zeros)
  verdict = Verdict(n=zeros, token=token, overlap=jnp.zeros((batch, max_gamma), jnp.float32),
                    bad=bad_logits(logits))
  after = state.replace(seq=seq, length=length, done=done, cache=cache)
  if state.trace is not None:
    return _record(config, state, after, nothing, verdict, max_gamma)
  # `_record` with n = γ = 0 written out: no position is verified (α unchanged), no draft
  # call; only the γ = 0 / accepted = 0 counts move. Each small op is a visible share of a
  # narrow round on a small model, which the policy picks when speculation does not pay.
  active = ~state.done
  counted = active.astype(jnp.int32)
  return after.replace(gamma_hist=state.gamma_hist.at[:, 0].add(counted),
                       accepted_hist=state.accepted_hist.at[:, 0].add(counted),
                       target_calls=state.target_calls + counted,
                       nan=state.nan | (active & verdict.bad))


def _empty_trace(batch: int, rounds: int, max_gamma: int) -> Trace:
  return Trace(guesses=jnp.zeros((batch, rounds, max_gamma), jnp.int32),
               accepted=jnp.zeros((batch, rounds), jnp.int32),
               correction=jnp.zeros((batch, rounds), jnp.int32),
               gamma=jnp.zeros((batch, rounds), jnp.int32))


@dataclasses.dataclass(frozen=True)
class SpeculativeLoop:
  """Algorithm 1's start and rounds (static, hashable), shared by the padded-batch loop and
  the streaming decode (`specjax.decode.stream`).

  `params` is (target_params, drafter_params, control): control is the 'auto' policy's
  `auto.AutoControl` (data), None under the other policies.
  """

  target: DecodingModel
  drafter: Drafter
  config: DecodeConfig

  def start(self, params, inputs, seq, length, gamma) -> Tuple[LoopState, Any]:
    """inputs [B, L], seq [B, T], length [B], gamma int32 [] -> (LoopState, encoded): the
    target encoded / prefilled, the drafter started, every row at γ."""
    target_params, drafter_params, _ = params
    max_gamma = self.drafter.max_gamma
    batch, width = seq.shape
    state, encoded = start_loop(self.target, target_params, inputs, seq, length, width,
                                max_gamma + 1)
    return state.replace(
        drafter_state=self.drafter.init(drafter_params, inputs, seq, length, width),
        gamma=jnp.full((batch,), gamma, jnp.int32),
        gamma_hist=jnp.zeros((batch, max_gamma + 1), jnp.int32),
        trace=_empty_trace(batch, width, max_gamma) if self.config.trace else None), encoded

  def wide(self, guesses: int, params, state: LoopState, keys, encoded, prefix_len,
           max_new_tokens) -> LoopState:
    """draft -> score -> verify -> commit -> record, the target call scoring the last token
    and `guesses` guesses; keys [B] row keys, prefix_len int32 [B]."""
    target_params, drafter_params, _ = params
    config, drafter = self.config, self.drafter
    round_keys = keys
    if config.verifier.fresh_round_keys:
      # The verifier reads guesses and uniforms past what it accepts, and the next round
      # draws at those positions again: fold in the round's start (unique per row).
      round_keys = jax.vmap(jax.random.fold_in)(keys, state.length)
    proposal, drafter_state = _draft(drafter, drafter_params, state, round_keys, config)
    logits, cache = _score(self.target, target_params, state, proposal, encoded, guesses)
    verdict = _verify(config, round_keys, state, proposal, logits)
    after = _commit(config, drafter, state, proposal, verdict, cache, drafter_state, prefix_len,
                    max_new_tokens)
    return _record(config, state, after, proposal, verdict, drafter.max_gamma)

  def going(self, params, state: LoopState) -> jax.Array:
    """bool []: whether the decode goes on (a row is busy; 'auto': within control.max_rounds)."""
    busy = jnp.any(~state.done)
    if self.config.gamma_policy != "auto":
      return busy
    return busy & (jnp.max(state.target_calls) < params[2].max_rounds)

  def rounds(self, params, state: LoopState, keys, encoded, prefix_len, max_new_tokens,
             running: Callable = lambda s: True, place: Callable = lambda s: s) -> LoopState:
    """At least one round. Fixed γ policies: exactly one. 'auto': one `auto.run_phases` pass,
    rounds of each variant while `running(state)` and `going` hold (the streaming decode stops
    it when a slot is free). `place` constrains each round's state (sharding)."""
    max_gamma = self.drafter.max_gamma
    wide = lambda guesses, s: self.wide(guesses, params, s, keys, encoded, prefix_len,
                                        max_new_tokens)
    if self.config.gamma_policy != "auto":
      return place(wide(max_gamma, state))
    control = params[2]
    buckets = auto.resolve_buckets(self.config.auto_buckets, max_gamma)
    narrow = lambda s: _narrow(self.config, self.target, params[0], encoded, keys, s,
                               prefix_len, max_gamma=max_gamma, max_new_tokens=max_new_tokens)
    variants = [narrow] + [functools.partial(wide, b) for b in buckets]
    decide = functools.partial(_auto_decision, control, buckets, prefix_len, max_new_tokens)
    cond = lambda s: self.going(params, s) & running(s)
    return auto.run_phases([functools.partial(_auto_round, control, lambda s, v=v: place(v(s)))
                            for v in variants], decide, cond, state,
                           stands=(lambda s: s.done,
                                   functools.partial(_narrow_stands, control, prefix_len)))


@functools.partial(jax.jit, static_argnames=("loop", "partitioner"))
def _speculative(loop, partitioner, params, inputs, seq, length, keys, max_new_tokens, gamma):
  prefix_len = length
  state, encoded = constrain(partitioner, loop.start(params, inputs, seq, length, gamma))
  place = functools.partial(constrain, partitioner)
  body = lambda s: loop.rounds(params, s, keys, encoded, prefix_len, max_new_tokens,
                               place=place)
  state = jax.lax.while_loop(functools.partial(loop.going, params), body, state)
  return finish(state, prefix_len)


def _auto_decision(control: auto.AutoControl, buckets, prefix_len, max_new_tokens,
                   state: LoopState):
  """Every row's γ for the next round (the policy, or the control's schedule) and its
  variant (0 narrow, i ≥ 1 bucket i-1) -> (int32 [B], int32 [])."""
  active, room = ~state.done, prefix_len + max_new_tokens - state.length
  rounds = jnp.max(state.target_calls)
  forced = control.schedule[jnp.minimum(rounds, auto.SCHEDULE_SLOTS - 1)]
  forced = jnp.where(rounds < auto.SCHEDULE_SLOTS, forced, -1)
  rule = auto.choose_gamma(control.costs, state.alpha_sum, state.alpha_count, active, room,
                           control.cap, control.prior, control.prior_weight)
  # A probe (auto module docstring): a narrow choice gives way, every PROBE_EVERY-th round, to
  # the prior's own choice, so rows whose α̂ fell on an unlucky start are measured again.
  probe = (rounds % auto.PROBE_EVERY == auto.PROBE_EVERY - 1) & jnp.all(rule == 0)
  prior_only = auto.choose_gamma(control.costs, jnp.zeros_like(state.alpha_sum),
                                 jnp.zeros_like(state.alpha_count), active, room, control.cap,
                                 control.prior, control.prior_weight)
  rule = jnp.where(probe, prior_only, rule)
  gamma = jnp.where(forced >= 0, auto.forced_gamma(forced, active, room), rule)
  return gamma, auto.branch_index(gamma, buckets)


def _narrow_stands(control: auto.AutoControl, prefix_len, done, state: LoopState) -> jax.Array:
  """bool []: whether a decision for narrow rounds (every row γ = 0), made when the rows'
  done mask was `done`, still holds in `state` without recomputing it.

  Narrow rounds add no guesses, so each row's α estimate stays, and every busy row moves
  one token. When the busy rows have the same room r, `auto.choose_gamma` compares
  s[γ] / min_row E(α_row, min(γ, r − 1)) across γ (r factors out); as r shrinks only the
  γ ≥ 1 terms can grow, so γ = 0 stays the batch's choice. It is recomputed when a row
  finishes, when busy rows' rooms differ (a row far from its budget can then tip the
  balance), while the control's schedule forces a γ (calibration), and before a probe round
  (`auto.PROBE_EVERY`)."""
  rounds = jnp.max(state.target_calls)
  forced = (rounds < auto.SCHEDULE_SLOTS) & (
      control.schedule[jnp.minimum(rounds, auto.SCHEDULE_SLOTS - 1)] >= 0)
  made = state.length - prefix_len  # tokens so far per row: equal iff the rooms are
  busy = ~state.done
  first = jnp.max(jnp.where(busy, made, jnp.iinfo(jnp.int32).min))
  same_room = jnp.all(jnp.where(busy, made == first, True))
  probe = rounds % auto.PROBE_EVERY == auto.PROBE_EVERY - 1  # the next round may probe
  return jnp.all(state.done == done) & same_room & ~forced & ~probe


def _auto_round(control: auto.AutoControl, variant, state: LoopState, gamma) -> LoopState:
  """One round of `variant` with the rows' γ; calibration rolls it back (rows never move or
  finish: every round is the same work; stale cache slots past a row's length are never
  read, as after a rejection)."""
  after = variant(state.replace(gamma=gamma))
  return after.replace(length=jnp.where(control.rollback, state.length, after.length),
                       done=jnp.where(control.rollback, state.done, after.done))


def speculative_decode(target: DecodingModel, target_params: Any, drafter: Drafter,
                       drafter_params: Any, inputs, *, max_new_tokens: int,
                       gamma: Optional[int] = None, rng: jax.Array,
                       config: DecodeConfig = DecodeConfig(), prompt_lengths=None,
                       partitioner: Optional[Partitioner] = None,
                       costs: Optional[auto.CostTable] = None,
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
    gamma: guesses per round, 1 ≤ γ ≤ drafter.max_gamma (data: no recompile); the first
      round's γ for 'heuristic' / 'optimal'; for 'auto' the largest γ the policy may pick
      (default max_gamma).
    rng: one PRNG key, or one key per row [B].
    config: static settings.
    prompt_lengths: optional int [B] for decoder-only prompts.
    partitioner: as for `autoregressive_decode` (drafter params are placed too).
    costs: 'auto' only: the `auto.CostTable` to decide with. None: calibrated on these
      inputs on the first call for these models, batch size and cache length, then reused
      for the rest of the process (`calibrate_costs`). Decisions are a pure function of
      the table and the decode state, so the same table and seed reproduce the tokens.
      Streaming: calibrated at batch `slots` on the first `slots` inputs.
    slots: stream the B inputs through this many slots (in-flight batching,
      `specjax.decode.stream`): a finished row takes the next input, its encoder / prefill and
      drafter state start for that slot. None: one padded batch.
      A `specjax.decode.Streaming` sets refill rows and the tail shrink too.
    on_progress: streaming: called as on_progress(done, B) after every `slots` finished inputs.
  Returns:
    A `DecodeResult` with tokens [B, max_new_tokens], per-row statistics, in input order
    (streaming: with `rounds` and `slot_rounds`, see `DecodeResult.slot_utilization`) and,
    under 'auto', the cost table it used.
  """
  check_config(target, config)
  check_same_vocab(target, drafter.vocab_size)
  auto_policy = config.gamma_policy == "auto"
  if gamma is None and not auto_policy:
    raise ValueError(f"gamma is required for gamma_policy={config.gamma_policy!r}")
  gamma = drafter.max_gamma if gamma is None else gamma
  if (isinstance(gamma, (bool, np.bool_)) or not isinstance(gamma, (int, np.integer))
      or not 1 <= gamma <= drafter.max_gamma):
    raise ValueError(f"gamma must be an integer in [1, max_gamma={drafter.max_gamma}], "
                     f"got {gamma!r}")
  if costs is not None and not auto_policy:
    raise ValueError(f"a cost table is for gamma_policy='auto', not {config.gamma_policy!r}")
  if slots is not None:
    return _stream(target, target_params, drafter, drafter_params, inputs, max_new_tokens,
                   int(gamma), rng, config, prompt_lengths, partitioner, costs,
                   as_streaming(slots), on_progress)
  call = _prepare(target, target_params, drafter, drafter_params, inputs, max_new_tokens,
                  config, prompt_lengths, partitioner, rng)
  control = None
  if auto_policy:
    costs = _costs_for(call, costs)
    if auto.never_speculates(costs, int(gamma), call.max_new_tokens):
      return _autoregressive_instead(target, target_params, inputs, call.max_new_tokens, rng,
                                     config, call.cache_len, drafter.max_gamma, costs,
                                     prompt_lengths=prompt_lengths, partitioner=partitioner)
    control = _decode_control(costs, int(gamma))
  result, nan = call.run(call.max_new_tokens, gamma, control)
  check_nan(nan)
  return result.replace(tokens=result.tokens[:, :call.max_new_tokens], cost_table=costs)


def _stream(target, target_params, drafter, drafter_params, inputs, max_new_tokens, gamma, rng,
            config, prompt_lengths, partitioner, costs, streaming: Streaming,
            on_progress) -> DecodeResult:
  """`speculative_decode` with `slots`: checked, the cost table found ('auto'), streamed."""
  max_new_tokens = check_count("max_new_tokens", max_new_tokens)
  inputs = check_inputs(target, inputs)
  length = prefix_lengths(target, inputs, prompt_lengths)
  cache_len = cache_length(config.cache_len, int(length.max()), max_new_tokens,
                           drafter.max_gamma + 1)
  # The cache length is fixed here, so the calibration's padded batch sees the stream's.
  config = dataclasses.replace(config, cache_len=cache_len)
  slot_rows = streaming.sizes(partitioner)[0] + streaming.refill_rows
  check_cache_size([target, *drafter_models(drafter)], slot_rows, cache_len, partitioner)
  control = None
  if config.gamma_policy == "auto":
    some = np.arange(streaming.sizes(partitioner)[0]) % inputs.shape[0]
    call = _prepare(target, target_params, drafter, drafter_params, inputs[some],
                    max_new_tokens, config,
                    None if target.is_encoder_decoder else length[some], partitioner,
                    jax.random.PRNGKey(0))
    costs = _costs_for(call, costs)
    if auto.never_speculates(costs, gamma, max_new_tokens):
      return _autoregressive_instead(target, target_params, inputs, max_new_tokens, rng, config,
                                     cache_len, drafter.max_gamma, costs,
                                     prompt_lengths=prompt_lengths, partitioner=partitioner,
                                     slots=streaming, on_progress=on_progress)
    control = _decode_control(costs, gamma)
  if partitioner is not None:
    target_params = partitioner.shard_params(target_params)
    drafter_params = partitioner.shard_params(drafter_params)
  result = decode_streaming(SpeculativeLoop(target, drafter, config),
                            (target_params, drafter_params, control), inputs, length, rng,
                            streaming=streaming, width=cache_len, max_new_tokens=max_new_tokens,
                            gamma=gamma, partitioner=partitioner, on_progress=on_progress)
  return result.replace(cost_table=costs)


def _autoregressive_instead(target, target_params, inputs, max_new_tokens, rng, config,
                            cache_len, max_gamma, costs, **kwargs) -> DecodeResult:
  """The decode of an 'auto' policy that never speculates (`auto.never_speculates`): the
  autoregressive loop, the same tokens as its narrow rounds, reported as every round at
  γ = 0 (no draft call, nothing verified; a trace has one correction per round)."""
  result = autoregressive_decode(
      target, target_params, inputs, max_new_tokens=max_new_tokens, rng=rng,
      config=dataclasses.replace(config, trace=False, cache_len=cache_len), **kwargs)
  return _as_narrow_rounds(result, max_gamma, cache_len if config.trace else 0).replace(
      cost_table=costs)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _as_narrow_rounds(result: DecodeResult, max_gamma: int, trace_width: int) -> DecodeResult:
  """An autoregressive result as the speculative loop reports all-γ = 0 rounds (one call;
  trace_width > 0: with a trace of that many rounds, round r having emitted token r)."""
  calls = result.target_calls
  batch = calls.shape[0]
  hist = jnp.zeros((batch, max_gamma + 1), jnp.int32).at[:, 0].set(calls)
  trace = None
  if trace_width:
    correction = jnp.zeros((batch, trace_width), jnp.int32).at[:, :result.tokens.shape[1]].set(
        result.tokens)
    trace = _empty_trace(batch, trace_width, max_gamma).replace(correction=correction)
  return result.replace(
      draft_calls=jnp.zeros_like(calls), accepted_hist=hist, gamma_hist=hist,
      alpha_sum=jnp.zeros(batch, jnp.float32), alpha_count=jnp.zeros_like(calls), trace=trace)


def calibrate_costs(target: DecodingModel, target_params: Any, drafter: Drafter,
                    drafter_params: Any, inputs, *, max_new_tokens: int,
                    config: DecodeConfig = DecodeConfig(gamma_policy="auto"), prompt_lengths=None,
                    partitioner: Optional[Partitioner] = None, rng: Optional[jax.Array] = None,
                    rounds: int = 6, repeats: int = 3) -> auto.CostTable:
  """Measures the 'auto' policy's `CostTable` for these models, batch and cache length.

  Runs the compiled speculative loop on `inputs` (the same executable the decode uses:
  no extra compile), each run forcing one round variant (γ = 0 or a bucket) for R ≥
  `rounds` rolled-back rounds, beside runs of 0 rounds for the fixed part
  (`auto.calibrate`): about repeats × (len(buckets) + 2) runs holding repeats ×
  (len(buckets) + 1) × R rounds, milliseconds on an accelerator, seconds on a loaded CPU
  at large batch (reported as `calibration_s`). Arguments as for `speculative_decode`;
  config must use gamma_policy='auto'.
  """
  if config.gamma_policy != "auto":
    raise ValueError(f"calibrate_costs needs gamma_policy='auto', got {config.gamma_policy!r}")
  rng = jax.random.PRNGKey(0) if rng is None else rng
  call = _prepare(target, target_params, drafter, drafter_params, inputs, max_new_tokens,
                  config, prompt_lengths, partitioner, rng)
  return _calibrate(call, rounds, repeats)


@dataclasses.dataclass(frozen=True)
class _Call:
  """A checked, placed speculative decode, ready to run with data arguments."""

  key: Tuple  # what a cost table is valid for (hashable)
  models: str
  batch: int
  cache_len: int
  max_gamma: int
  buckets: Tuple[int, ...]
  max_new_tokens: int
  run: Callable  # (max_new_tokens, gamma, control) -> (DecodeResult, nan)


_CALIBRATED: Dict[Tuple, auto.CostTable] = {}


@functools.lru_cache(maxsize=64)
def _decode_control(costs: auto.CostTable, cap: int) -> auto.AutoControl:
  """The policy's control for a decode (device arrays made once per table and cap)."""
  prior, weight = auto.prior_of(costs)
  return auto.AutoControl.make(costs.per_gamma(), cap, prior=prior, prior_weight=weight)


def _prepare(target, target_params, drafter, drafter_params, inputs, max_new_tokens, config,
             prompt_lengths, partitioner, rng) -> _Call:
  check_same_vocab(target, drafter.vocab_size)
  max_new_tokens = check_count("max_new_tokens", max_new_tokens)
  inputs = check_inputs(target, inputs)
  length = prefix_lengths(target, inputs, prompt_lengths)
  cache_len = cache_length(config.cache_len, int(length.max()), max_new_tokens,
                           drafter.max_gamma + 1)
  check_cache_size([target, *drafter_models(drafter)], inputs.shape[0], cache_len, partitioner)
  batch = inputs.shape[0]
  buckets = (auto.resolve_buckets(config.auto_buckets, drafter.max_gamma)
             if config.gamma_policy == "auto" else ())

  loop = SpeculativeLoop(target, drafter, config)

  @functools.lru_cache(maxsize=1)
  def placed():  # on the first run only: a call that runs the autoregressive loop never does
    seq = initial_seq(target, inputs, cache_len)
    return place(partitioner, [target_params, drafter_params], [
        jnp.asarray(inputs), jnp.asarray(seq), jnp.asarray(length),
        row_keys(rng, inputs.shape[0])])

  def run(budget: int, gamma: int, control):
    (target_params_, drafter_params_), rows = placed()
    return unpad(partitioner, _speculative(
        loop, partitioner, (target_params_, drafter_params_, control), *rows, jnp.int32(budget),
        jnp.int32(gamma)), batch)

  return _Call(key=(target, drafter, config, partitioner, inputs.shape, cache_len),
               models=f"target {auto.describe(target)}; drafter {auto.describe(drafter)}",
               batch=batch, cache_len=cache_len, max_gamma=drafter.max_gamma, buckets=buckets,
               max_new_tokens=max_new_tokens, run=run)


def _calibrate(call: _Call, rounds: int = 6, repeats: int = 3) -> auto.CostTable:
  # Rounds are rolled back, so the budget only has to let every bucket's γ be offered.
  budget = max(call.max_new_tokens, call.max_gamma + 1)
  def run(control):
    result, _ = jax.block_until_ready(call.run(budget, 1, control))
    return np.asarray(result.alpha_sum), np.asarray(result.alpha_count)

  table = auto.calibrate(run,
                         batch=call.batch, cache_len=call.cache_len, max_gamma=call.max_gamma,
                         buckets=call.buckets, models=call.models, rounds=rounds,
                         repeats=repeats)
  _CALIBRATED[call.key] = table
  return table


def _costs_for(call: _Call, costs: Optional[auto.CostTable]) -> auto.CostTable:
  """The given table (checked against the call), else this process's calibration of it."""
  if costs is not None:
    costs.check(batch=call.batch, cache_len=call.cache_len, max_gamma=call.max_gamma,
                buckets=call.buckets, models=call.models)
    return costs
  return _CALIBRATED.get(call.key) or _calibrate(call)
