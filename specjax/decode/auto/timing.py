"""The 'auto' policy's cost table, measured so that a busy machine cannot fool it.

`time_rounds` times each compiled round variant inside the loop (rolled-back rounds: the same
work every round), as one of several defences against a neighbour's load (a test suite beside
the run slowed a γ = 1 round to 2.27 one-token steps where it cost about 1.4, and speculation
was turned off where a constant γ = 4 ran 1.45x autoregressive):

- interleaved: every repeat times the fixed part, the narrow round and each bucket next to each
  other, the order reversed on every other repeat, so a busy spell or a drift hits all alike;
- repeated (`REPEATS`) with robust statistics: a bucket's cost is the narrow cost (the median
  over repeats) times the median of its per-repeat ratios to the narrow round of the same
  repeat, and the quartiles of those ratios are kept (`CostTable.low` / `high`);
- checked against real rounds: `CHECK_PAIRS` interleaved pairs of runs that move through the
  text (not rolled back), narrow and at the widest bucket, give that bucket's cost ratio as a
  decode meets it (`CostTable.real_ratio`); when it and the calibrated ratio differ by more than
  `TOLERANCE`, the calibration is repeated and pooled (at most `RECALIBRATIONS` times), and if
  they still differ, the real rounds' ratio rescales the buckets (`CostTable.recalibrated`).

The wide real runs also give the table's α (the batch's slowest row, as a decode verifies).
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Tuple

import jax
import numpy as np

from specjax.decode.auto.policy import SCHEDULE_ROUNDS, AutoControl, CostTable

REPEATS = 5
"""Interleaved repeats of the calibration (each times the fixed part and every variant)."""
CHECK_PAIRS = 3
"""Interleaved pairs of real (not rolled-back) runs, narrow and widest, that check it."""
TOLERANCE = 1.25
"""The largest factor between the calibrated and the real rounds' ratio that is agreement."""
RECALIBRATIONS = 2
"""Further calibrations, pooled with the first, while the two disagree."""


def _alpha(alpha_sum, alpha_count) -> Optional[float]:
  """Σ min(p, q) per verified position of the batch's slowest row (None: none verified)."""
  alpha_sum, alpha_count = np.asarray(alpha_sum, np.float64), np.asarray(alpha_count)
  seen = alpha_count > 0
  if not np.any(seen):
    return None
  return min(max(float(np.min(alpha_sum[seen] / alpha_count[seen])), 0.0), 1.0)


def time_rounds(run: Callable[[AutoControl], Tuple], *, batch: int, cache_len: int,
                max_gamma: int, buckets: Tuple[int, ...], models: str, rounds: int = 6,
                repeats: int = REPEATS, alpha_rounds: Optional[int] = None,
                clock: Callable[[], float] = time.perf_counter) -> CostTable:
  """Times every round variant inside the compiled loop and returns the `CostTable`.

  run(control) executes the loop once with that control (blocking) and returns the rows'
  (alpha_sum [B], alpha_count [B]). Each timed run forces one variant for R rolled-back rounds
  and a run of 0 rounds gives the fixed part (prefill, transfers), so a round costs
  (t − t₀) / R; R is at least `rounds`, up to 4 × `rounds` when the fixed part is long next
  to a γ = 0 round. The statistics and the check are the module docstring's. The α is the
  slowest row's over the wide real runs (their rows move through their text, as a decode
  does: the rolled-back runs see only the inputs' first positions), which run `alpha_rounds`
  rounds (a token tree's α is one indicator per round, so it needs more; at most
  SCHEDULE_ROUNDS) or R. No bucket is costed below the narrow round (a round with guesses
  does all a γ = 0 round does, and more). `clock`: seconds (tests inject one).
  """
  if not 1 <= rounds <= SCHEDULE_ROUNDS:
    raise ValueError(f"calibration rounds must be in [1, {SCHEDULE_ROUNDS}], got {rounds}")
  choices = (0,) + tuple(buckets)
  ones = np.ones(max_gamma + 1, np.float32)

  def timed(gamma: int, count: int, rollback: bool = True) -> Tuple[float, Tuple]:
    control = AutoControl.make(ones, max_gamma, [gamma] * count, max_rounds=count,
                               rollback=rollback)
    start = clock()
    out = run(control)
    return clock() - start, out

  timed(0, 1)  # compiles the loop, if this is its first use
  start = clock()
  fixed = min(timed(0, 0)[0], timed(0, 0)[0])
  step = (timed(0, rounds)[0] - fixed) / rounds
  count = int(min(SCHEDULE_ROUNDS, 4 * rounds, max(rounds, np.ceil(fixed / max(step, 1e-9)))))
  narrow: List[float] = []
  ratios: Dict[int, List[float]] = {g: [] for g in choices}

  def calibrate() -> None:
    for r in range(repeats):
      base = timed(0, 0)[0]
      cost = {g: max((timed(g, count)[0] - base) / count, 1e-9)
              for g in (choices if r % 2 == 0 else choices[::-1])}
      narrow.append(cost[0])
      for g in choices:
        ratios[g].append(cost[g] / cost[0])

  calibrate()
  widest, wide = min(SCHEDULE_ROUNDS, alpha_rounds or count), buckets[-1]
  checks, alphas = [], []
  for pair in range(CHECK_PAIRS):
    base = timed(0, 0, rollback=False)[0]
    order = (0, wide) if pair % 2 == 0 else (wide, 0)
    real = {}
    for g in order:
      real[g], out = timed(g, widest, rollback=False)
      if g == wide:
        alphas.append(_alpha(*out))
    checks.append(max(real[wide] - base, 1e-9) / max(real[0] - base, 1e-9))
  check = float(np.median(checks))
  recalibrations = 0
  while (_disagree(float(np.median(ratios[wide])), check)
         and recalibrations < RECALIBRATIONS):
    calibrate()
    recalibrations += 1
  relative = {g: float(np.median(ratios[g])) for g in choices}
  scale = check / relative[wide] if _disagree(relative[wide], check) else 1.0
  spent = clock() - start
  seconds_0 = max(float(np.median(narrow)), 1e-6)
  quartile = lambda g, q: max(float(np.percentile(ratios[g], q)) * scale, 1.0)
  return CostTable(
      batch=batch, cache_len=cache_len, max_gamma=max_gamma, buckets=buckets,
      seconds=(seconds_0,) + tuple(seconds_0 * max(relative[g] * scale, 1.0) for g in buckets),
      models=models, samples=(len(narrow) * count,) * len(choices), calibration_s=spent,
      platform=jax.devices()[0].platform,
      alpha=alphas[0] if alphas and alphas[0] is not None else None,
      low=tuple(quartile(g, 25) for g in buckets), high=tuple(quartile(g, 75) for g in buckets),
      real_ratio=check, recalibrations=recalibrations, recalibrated=scale != 1.0)


def _disagree(calibrated: float, real: float) -> bool:
  """Whether two cost ratios of the widest bucket differ by more than TOLERANCE."""
  return max(calibrated / real, real / calibrated) > TOLERANCE
