"""The 'auto' policy inside the loop: which round variant plays next, and calibration's rollback.

`run` is one pass of `auto.run_phases` over the round variants (narrow: every row at γ = 0;
wide: a bucket's width): every round ends with a `decision` (each row's γ and the variant),
narrow rounds follow each other while `narrow_stands` holds, and under calibration every
round is rolled back (`rolled_back`). The policy itself (the choice of γ from the cost table
and the rows' α) is `specjax.decode.auto`.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from specjax.decode import auto
from specjax.decode.state import LoopState


def run(control: auto.AutoControl, buckets, variants: Sequence[Callable], state: LoopState,
        prefix_len, max_new_tokens, running: Callable, place: Callable) -> LoopState:
  """Rounds of `variants` ([narrow, bucket 1, ...], each state -> state) while `running`
  holds, the variant and the rows' γ decided after each round."""
  decide = functools.partial(decision, control, buckets, prefix_len, max_new_tokens)
  return auto.run_phases(
      [functools.partial(rolled_back, control, lambda s, v=v: place(v(s))) for v in variants],
      decide, running, state,
      stands=(lambda s: s.done, functools.partial(narrow_stands, control, prefix_len)))


def decision(control: auto.AutoControl, buckets, prefix_len, max_new_tokens,
                   state: LoopState):
  """Every row's γ for the next round (the policy, or the control's schedule) and its
  variant (0 narrow, i ≥ 1 bucket i-1) -> (int32 [B], int32 [])."""
  active, room = ~state.done, prefix_len + max_new_tokens - state.length
  rounds = jnp.max(state.target_calls)
  forced = control.schedule[jnp.minimum(rounds, auto.SCHEDULE_ROUNDS - 1)]
  forced = jnp.where(rounds < auto.SCHEDULE_ROUNDS, forced, -1)
  rule = auto.choose_gamma(control.costs, state.alpha_sum, state.alpha_count, active, room,
                           control.gamma_cap, control.prior, control.prior_weight)
  # A probe (auto module docstring): a narrow choice gives way, every PROBE_EVERY-th round, to
  # the prior's own choice, so rows whose α̂ fell on an unlucky start are measured again.
  probe = (rounds % auto.PROBE_EVERY == auto.PROBE_EVERY - 1) & jnp.all(rule == 0)
  prior_only = auto.choose_gamma(control.costs, jnp.zeros_like(state.alpha_sum),
                                 jnp.zeros_like(state.alpha_count), active, room, control.gamma_cap,
                                 control.prior, control.prior_weight)
  rule = jnp.where(probe, prior_only, rule)
  gamma = jnp.where(forced >= 0, auto.forced_gamma(forced, active, room), rule)
  return gamma, auto.branch_index(gamma, buckets)


def narrow_stands(control: auto.AutoControl, prefix_len, done, state: LoopState) -> jax.Array:
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
  forced = (rounds < auto.SCHEDULE_ROUNDS) & (
      control.schedule[jnp.minimum(rounds, auto.SCHEDULE_ROUNDS - 1)] >= 0)
  made = state.length - prefix_len  # tokens so far per row: equal iff the rooms are
  busy = ~state.done
  first = jnp.max(jnp.where(busy, made, jnp.iinfo(jnp.int32).min))
  same_room = jnp.all(jnp.where(busy, made == first, True))
  probe = rounds % auto.PROBE_EVERY == auto.PROBE_EVERY - 1  # the next round may probe
  return jnp.all(state.done == done) & same_room & ~forced & ~probe


def rolled_back(control: auto.AutoControl, variant, state: LoopState, gamma) -> LoopState:
  """One round of `variant` with the rows' γ; calibration rolls it back (rows never move or
  finish: every round is the same work; stale cache positions past a row's length are never
  read, as after a rejection)."""
  after = variant(state.replace(gamma=gamma))
  return after.replace(length=jnp.where(control.rollback, state.length, after.length),
                       done=jnp.where(control.rollback, state.done, after.done))
