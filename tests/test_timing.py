"""specjax.timing on a fake clock: the pass order, the statistics, the warm-up, bad input."""
import jax.numpy as jnp
import pytest

from specjax import timing


class FakeClock:
  """`time.perf_counter` stand-in: a function advances it by its scripted seconds per call."""

  def __init__(self):
    self.now = 0.0
    self.calls = []

  def __call__(self):
    return self.now

  def fn(self, name, seconds):
    """A zero-argument function that takes seconds[i] on its i-th call and returns (name, i)."""
    count = [0]

    def run():
      i = count[0]
      count[0] += 1
      self.calls.append(name)
      self.now += seconds[i]
      return name, i
    return run


@pytest.fixture
def clock(monkeypatch):
  fake = FakeClock()
  monkeypatch.setattr(timing.time, "perf_counter", fake)
  return fake


def test_timed_returns_output_and_seconds(clock):
  out, seconds = timing.timed(clock.fn("a", [0.25]))
  assert out == ("a", 0) and seconds == 0.25


def test_timed_waits_for_arrays():
  out, seconds = timing.timed(lambda: {"x": jnp.arange(3) * 2, "n": 4})
  assert out["x"].tolist() == [0, 2, 4] and out["n"] == 4 and seconds >= 0.0


def test_order_alternates_after_the_warm_up(clock):
  fns = {n: clock.fn(n, [1.0] * 5) for n in "abc"}
  timing.interleaved(fns, 4)
  assert "".join(clock.calls) == "abc" + "abc" + "cba" + "abc" + "cba"


def test_without_warm_up_no_extra_call_and_no_compile_time(clock):
  fns = {n: clock.fn(n, [1.0] * 3) for n in "ab"}
  t = timing.interleaved(fns, 3, warmup=False)
  assert "".join(clock.calls) == "ab" + "ba" + "ab"
  assert t.compile_s == {"a": 0.0, "b": 0.0}
  assert t.outputs == {"a": ("a", 2), "b": ("b", 2)}


def test_statistics_from_the_samples(clock):
  # a: warm-up 10 s, then passes 2, 4, 3; b: warm-up 1 s, then 1, 1, 2.
  fns = {"a": clock.fn("a", [10.0, 2.0, 4.0, 3.0]), "b": clock.fn("b", [1.0, 1.0, 1.0, 2.0])}
  t = timing.interleaved(fns, 3)
  assert t.samples == {"a": (2.0, 4.0, 3.0), "b": (1.0, 1.0, 2.0)}
  assert t.median("a") == 3.0 and t.median("b") == 1.0
  assert t.spread("a") == (2.0, 4.0) and t.spread("b") == (1.0, 2.0)
  assert t.compile_s == {"a": 7.0, "b": 0.0}  # b's warm-up was faster than its median: 0
  # per pass a / b: 2, 4, 1.5 -> median 2 (not the ratio of medians, 3)
  assert t.ratio("a", "b") == (2.0, 1.5, 4.0)
  assert t.ratio("b", "a") == (0.5, 0.25, 2 / 3)
  assert t.outputs == {"a": ("a", 3), "b": ("b", 3)}


def test_extended_appends_passes(clock):
  fns = {"a": clock.fn("a", [5.0, 1.0, 3.0, 2.0]), "b": clock.fn("b", [1.0, 2.0, 2.0, 2.0])}
  first = timing.interleaved({"a": fns["a"], "b": fns["b"]}, 1)
  both = first.extended(timing.interleaved(fns, 2, warmup=False))
  assert both.samples == {"a": (1.0, 3.0, 2.0), "b": (2.0, 2.0, 2.0)}
  assert both.compile_s == first.compile_s and both.outputs["a"] == ("a", 3)
  with pytest.raises(ValueError, match="no earlier timings"):
    first.extended(timing.interleaved({"c": clock.fn("c", [1.0, 1.0])}, 1))


@pytest.mark.parametrize("passes", [0, -1, True, 2.0, "3"])
def test_bad_passes_are_named(passes):
  with pytest.raises(ValueError, match="passes must be an integer >= 1"):
    timing.interleaved({"a": lambda: 1}, passes)


def test_no_functions_and_unknown_names():
  with pytest.raises(ValueError, match="at least one function"):
    timing.interleaved({}, 1)
  t = timing.interleaved({"a": lambda: 1, "b": lambda: 2}, 1)
  with pytest.raises(KeyError, match="no timings of 'c'"):
    t.median("c")
  uneven = timing.Timings(samples={"a": (1.0, 2.0), "b": (1.0,)}, compile_s={}, outputs={})
  with pytest.raises(ValueError, match="no per-pass ratio"):
    uneven.ratio("a", "b")
