"""The 'auto' γ policy in one room: speculate only where it pays, per batch and per row.

  policy       the rule (`choose_gamma`), the `CostTable`, the `AutoControl` a loop reads, the
               compiled phases (`run_phases`)
  timing       the round timings (`time_rounds`): interleaved, repeated, robust, checked
  rounds       a loop's rounds under the policy: the narrow round and one round per bucket
  calibration  the cost table measured once per (models, batch, cache length), kept, decided
  fallback     a decode that never speculates reported as rounds at γ = 0

A loop opts in through `DecodeConfig.gamma_policy = 'auto'` and says what the runner needs by
its optional `auto` member (an `AutoSpec`); docs/auto_and_streaming.md
explains the rule and its measurements.
"""
from specjax.decode.auto.policy import (NO_LIMIT, PRIOR_ALPHA, PRIOR_POSITIONS, PROBE_EVERY,
                                        SCHEDULE_ROUNDS, AutoControl, AutoSpec, CostTable, branch_index,
                                        choose_gamma, default_buckets, describe, forced_gamma,
                                        never_speculates, prior_of, resolve_buckets,
                                        run_phases)
from specjax.decode.auto.timing import time_rounds

__all__ = ["NO_LIMIT", "PRIOR_ALPHA", "PRIOR_POSITIONS", "PROBE_EVERY", "SCHEDULE_ROUNDS",
           "AutoControl", "AutoSpec", "CostTable", "branch_index", "choose_gamma", "default_buckets",
           "describe", "forced_gamma", "never_speculates", "prior_of", "resolve_buckets",
           "run_phases", "time_rounds"]
