"""Walltime measurement: interleaved passes, medians, spread, compile reported apart.

Every comparison of decodes (the main job, the experiments) goes through `interleaved`:
each function runs once untimed (its compile, reported apart as `compile_s`), then
`passes` passes run every function once each, the order reversed on every other pass so
that a slow spell of the machine hits all of them alike. Ratios are taken pass by pass.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, Mapping, Tuple, TypeVar

import jax
import numpy as np

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> Tuple[T, float]:
  """Calls fn, blocks until its arrays are ready (jax.block_until_ready), returns (out, seconds)."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - start


@dataclasses.dataclass(frozen=True)
class Timings:
  """The seconds of each function's timed passes, its warm-up's extra, its last output."""

  samples: Mapping[str, Tuple[float, ...]]  # seconds of each timed pass, in pass order
  compile_s: Mapping[str, float]  # the warm-up call less the median pass (0.0 if none)
  outputs: Mapping[str, Any]  # each function's last output

  def median(self, name: str) -> float:
    """The median seconds of `name`'s passes."""
    return float(np.median(self.samples[name]))

  def spread(self, name: str) -> Tuple[float, float]:
    """(min, max) seconds of `name`'s passes."""
    return float(np.min(self.samples[name])), float(np.max(self.samples[name]))

  def ratio(self, num: str, den: str) -> Tuple[float, float, float]:
    """Per-pass num / den seconds: (median, min, max)."""
    ratios = np.asarray(self.samples[num]) / np.maximum(np.asarray(self.samples[den]), 1e-12)
    return float(np.median(ratios)), float(np.min(ratios)), float(np.max(ratios))


def interleaved(fns: Mapping[str, Callable[[], Any]], passes: int, *,
                warmup: bool = True) -> Timings:
  """Each fn once untimed (warm-up: compile, reported apart as compile_s) unless warmup=False,
  then `passes` passes; each pass runs every fn once, the order reversed on every other pass
  (drift hits all alike)."""
  if passes < 1:
    raise ValueError(f"passes must be >= 1, got {passes}")
  names = list(fns)
  first: Dict[str, float] = {}
  outputs: Dict[str, Any] = {}
  if warmup:
    for name in names:
      outputs[name], first[name] = timed(fns[name])
  samples: Dict[str, list] = {name: [] for name in names}
  for i in range(passes):
    for name in (names if i % 2 == 0 else names[::-1]):
      outputs[name], seconds = timed(fns[name])
      samples[name].append(seconds)
  frozen = {name: tuple(s) for name, s in samples.items()}
  compile_s = {name: max(first[name] - float(np.median(frozen[name])), 0.0) if warmup else 0.0
               for name in names}
  return Timings(samples=frozen, compile_s=compile_s, outputs=outputs)
