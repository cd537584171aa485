"""Walltime of jitted work: one timed call, and several calls timed side by side.

`timed` times one call and waits for its arrays (JAX dispatches asynchronously, so a call
returns before its device work is done). `interleaved` times several functions pass by pass,
each pass running every function once, the order reversed on every other pass: a busy spell
of a shared machine, or a slow drift of its clock speed, then hits every function alike, and
per-pass ratios (`Timings.ratio`) compare runs that stood next to each other.
"""
from __future__ import annotations

import dataclasses
import numbers
import statistics
import time
from typing import Any, Callable, Dict, List, Mapping, Tuple, TypeVar

import jax

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> Tuple[T, float]:
  """Calls fn, blocks until its arrays are ready (jax.block_until_ready), returns (out, seconds).

  Leaves of the output that are not JAX arrays (numbers, host objects) are returned as they are.
  """
  start = time.perf_counter()
  out = fn()
  jax.block_until_ready(out)
  return out, time.perf_counter() - start


@dataclasses.dataclass(frozen=True)
class Timings:
  """What `interleaved` measured, by function name."""
  samples: Mapping[str, Tuple[float, ...]]
  """Seconds of each timed pass, in pass order."""
  compile_s: Mapping[str, float]
  """The warm-up call less the median pass, never below 0 (0.0 if there was no warm-up)."""
  outputs: Mapping[str, Any]
  """Each function's last output."""

  def median(self, name: str) -> float:
    """Median seconds of `name`'s timed passes."""
    return statistics.median(self._times(name))

  def spread(self, name: str) -> Tuple[float, float]:
    """(min, max) seconds of `name`'s timed passes."""
    times = self._times(name)
    return min(times), max(times)

  def ratio(self, num: str, den: str) -> Tuple[float, float, float]:
    """Per-pass num / den (the two runs of one pass stood side by side): (median, min, max).

    A ratio of times: `ratio(baseline, x)` > 1 means x is faster than the baseline.
    """
    a, b = self._times(num), self._times(den)
    if len(a) != len(b):
      raise ValueError(f"{num!r} has {len(a)} passes and {den!r} {len(b)}: no per-pass ratio")
    ratios = [x / max(y, 1e-12) for x, y in zip(a, b)]
    return statistics.median(ratios), min(ratios), max(ratios)

  def extended(self, later: "Timings") -> "Timings":
    """These timings with `later`'s passes appended (its functions a subset of these; compile
    times kept from these, outputs updated to the later ones)."""
    unknown = set(later.samples) - set(self.samples)
    if unknown:
      raise ValueError(f"no earlier timings of {sorted(unknown)}")
    samples = {n: tuple(t) + tuple(later.samples.get(n, ())) for n, t in self.samples.items()}
    return Timings(samples=samples, compile_s=dict(self.compile_s),
                   outputs={**self.outputs, **later.outputs})

  def _times(self, name: str) -> Tuple[float, ...]:
    if name not in self.samples:
      raise KeyError(f"no timings of {name!r}; timed: {list(self.samples)}")
    if not self.samples[name]:
      raise ValueError(f"{name!r} has no timed passes")
    return self.samples[name]


def interleaved(fns: Mapping[str, Callable[[], Any]], passes: int, *,
                warmup: bool = True) -> Timings:
  """Each fn once untimed (warm-up: compile, reported apart as compile_s) unless warmup=False,
  then `passes` passes; each pass runs every fn once, the order reversed on every other pass
  (drift hits all alike).

  Args:
    fns: name -> a zero-argument call (its output's arrays are waited for, see `timed`).
    passes: timed passes (>= 1).
    warmup: run every fn once first, untimed as a pass; its seconds less the median pass are
      `compile_s`. Leave it on unless every fn is compiled already.
  Returns:
    The `Timings` of every fn, in the order of `fns`.
  """
  if isinstance(passes, bool) or not isinstance(passes, numbers.Integral) or passes < 1:
    raise ValueError(f"passes must be an integer >= 1, got {passes!r}")
  if not fns:
    raise ValueError("interleaved needs at least one function to time")
  names = list(fns)
  outputs: Dict[str, Any] = {}
  first: Dict[str, float] = {}
  if warmup:
    for name in names:
      outputs[name], first[name] = timed(fns[name])
  samples: Dict[str, List[float]] = {name: [] for name in names}
  for i in range(passes):
    for name in (names if i % 2 == 0 else names[::-1]):
      outputs[name], seconds = timed(fns[name])
      samples[name].append(seconds)
  compile_s = {name: max(first[name] - statistics.median(samples[name]), 0.0) if warmup
               else 0.0 for name in names}
  return Timings(samples={n: tuple(t) for n, t in samples.items()}, compile_s=compile_s,
                 outputs=outputs)
