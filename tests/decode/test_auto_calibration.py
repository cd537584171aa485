"""'auto' calibration against a busy machine: injected round costs and a neighbour's load (a fake
loop and a fake clock; nothing is timed for real). The policy's verdict must follow the true
costs, and the summary says what was measured."""
import numpy as np
import pytest

from specjax.app import report
from specjax.decode import auto
from specjax.decode.auto import timing

BUCKETS = (1, 2, 4)
FIXED = 1.0  # s: prefill and transfers of every run


class Machine:
  """A fake loop on a fake clock: a run costs FIXED + rounds × its variant's round cost, times a
  neighbour's slowdown where `load(run index, gamma, rollback)` says so."""

  def __init__(self, costs, real_costs=None, load=lambda i, g, rollback: 1.0):
    self.now, self.runs = 0.0, 0
    self.costs, self.real = costs, real_costs or costs
    self.load = load

  def clock(self):
    return self.now

  def run(self, control):
    forced = [int(g) for g in np.asarray(control.schedule) if g >= 0]
    rounds, gamma = len(forced), (forced[0] if forced else 0)
    rollback = bool(control.rollback)
    per_round = (self.costs if rollback else self.real)[gamma]
    self.now += (FIXED + rounds * per_round) * self.load(self.runs, gamma, rollback)
    self.runs += 1
    return np.array([0.8 * 4 * rounds]), np.array([4 * rounds])  # α 0.8


def _table(machine):
  return auto.time_rounds(machine.run, batch=1, cache_len=64, max_gamma=4, buckets=BUCKETS,
                          models="fake", rounds=4, clock=machine.clock)


TRUE = {0: 0.010, 1: 0.0125, 2: 0.0135, 4: 0.015}  # γ = 4 costs 1.5 narrow rounds


def test_a_quiet_machine_measures_the_true_costs_and_the_check_agrees():
  table = _table(Machine(TRUE))
  assert table.relative() == pytest.approx({0: 1.0, 1: 1.25, 2: 1.35, 4: 1.5}, rel=1e-6)
  assert table.real_ratio == pytest.approx(1.5) and table.recalibrations == 0
  assert not table.recalibrated and table.alpha == pytest.approx(0.8)
  assert not auto.never_speculates(table, 4, 128)  # at α 0.8 a γ = 4 round pays


def test_a_neighbour_slowing_some_runs_does_not_change_the_verdict():
  # A fifth of the runs, at random (seeded), run 1.5x slower (the neighbour's busy spells):
  # medians of paired ratios over the interleaved repeats keep the true costs near.
  spells = np.random.default_rng(0).random(1000) < 0.2
  table = _table(Machine(TRUE, load=lambda i, g, rollback: 1.5 if spells[i] else 1.0))
  relative = table.relative()
  assert relative[4] == pytest.approx(1.5, rel=0.2) and relative[1] == pytest.approx(1.25,
                                                                                      rel=0.2)
  assert not auto.never_speculates(table, 4, 128)
  assert table.low[-1] <= relative[4] <= table.high[-1]


def test_a_calibration_that_disagrees_with_real_rounds_is_repeated_then_corrected():
  # The rolled-back timings see a γ = 4 round at 3 narrow rounds (memory-bandwidth contention
  # while the rounds repeat), the real rounds at 1.5: calibrated again, still off, so the
  # real rounds' ratio rescales every bucket.
  skewed = {0: 0.010, 1: 0.020, 2: 0.025, 4: 0.030}
  table = _table(Machine(skewed, real_costs=TRUE))
  assert table.recalibrations == timing.RECALIBRATIONS and table.recalibrated
  assert table.real_ratio == pytest.approx(1.5)
  assert table.relative()[4] == pytest.approx(1.5, rel=1e-6)
  assert table.relative()[1] == pytest.approx(2.0 * 1.5 / 3.0, rel=1e-6)
  assert not auto.never_speculates(table, 4, 128)
  said = table.summary()["calibration"]
  assert "interleaved repeats" in said and "quartiles γ=1:" in said
  assert "checked on real rounds: a γ = 4 round cost 1.50 narrow rounds" in said
  assert f"recalibrated {timing.RECALIBRATIONS} time(s), the real rounds' ratio kept" in said


def test_a_transient_disagreement_is_recalibrated_away():
  # The first calibration's wide timings ran beside a burst of load; the repeat is quiet.
  burst = lambda i, g, rollback: 2.5 if (rollback and g == 4 and i < 40) else 1.0
  machine = Machine(TRUE, load=burst)
  table = _table(machine)
  assert table.recalibrations >= 1 and not table.recalibrated
  assert table.relative()[4] == pytest.approx(1.5, rel=0.3)


def test_the_summary_note_says_what_the_calibration_measured():
  costly = {0: 0.010, 1: 0.030, 2: 0.035, 4: 0.040}  # speculation does not pay
  table = _table(Machine(costly))
  note = report.speculation_off(0, 10, table, draft_cost=None)
  assert "a γ = 1 round costs 3.00 autoregressive steps" in note
  assert "(measured: " in note and "checked on real rounds: a γ = 4 round cost 4.00" in note
