"""The 'auto' policy's cost tables: measured once per decode shape, kept in a bounded cache.

A table is valid for one (models, drafter, config, partitioner, input shape, cache length);
`measure` measures it with the compiled loop of a `PreparedDecode` (no extra compile),
`CALIBRATED` keeps the tables this process measured (least recently used dropped past
`CostCache.max_entries`), and `decode_control` turns a table into the loop's data.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
from typing import Callable, Hashable, Optional, Tuple

import jax
import numpy as np

from specjax.runtime import distributed
from specjax.decode import auto


@dataclasses.dataclass(frozen=True)
class PreparedDecode:
  """A checked, placed speculative decode over one padded batch, ready to run with data
  arguments (`speculative.prepare_decode`): what calibration runs."""

  key: Hashable  # what a cost table is valid for
  models: str  # the target's and drafter's descriptions
  batch: int
  cache_len: int
  max_gamma: int
  buckets: Tuple[int, ...]
  max_new_tokens: int
  run: Callable  # (max_new_tokens, gamma, control) -> (DecodeResult, nan)
  alpha_rounds: Optional[int] = None  # the α run's rounds (`auto.time_rounds`); None: as timed


class CostCache:
  """The cost tables this process calibrated, by `PreparedDecode.key` (least recently used
  dropped past `max_entries`). `clear()` forgets them all (the next decode recalibrates)."""

  def __init__(self, max_entries: int = 32):
    self.max_entries = max_entries
    self._tables: "collections.OrderedDict[Hashable, auto.CostTable]" = collections.OrderedDict()

  def get(self, key: Hashable) -> Optional[auto.CostTable]:
    table = self._tables.get(key)
    if table is not None:
      self._tables.move_to_end(key)
    return table

  def put(self, key: Hashable, table: auto.CostTable) -> None:
    self._tables[key] = table
    self._tables.move_to_end(key)
    while len(self._tables) > self.max_entries:
      self._tables.popitem(last=False)

  def clear(self) -> None:
    self._tables.clear()

  def __len__(self) -> int:
    return len(self._tables)


CALIBRATED = CostCache()
"""The tables `costs_for` calibrated in this process (bounded; `CALIBRATED.clear()` resets)."""


def measure(prepared: PreparedDecode, rounds: int = 6, repeats: int = 5) -> auto.CostTable:
  """Measures `prepared`'s cost table (`auto.time_rounds` over its compiled loop) and keeps it."""
  # Rounds are rolled back, so the budget only has to let every bucket's γ be offered.
  budget = max(prepared.max_new_tokens, prepared.max_gamma + 1)

  def run(control):
    result, _ = jax.block_until_ready(prepared.run(budget, 1, control))
    return np.asarray(result.alpha_sum), np.asarray(result.alpha_count)

  table = auto.time_rounds(run, batch=prepared.batch, cache_len=prepared.cache_len,
                         max_gamma=prepared.max_gamma, buckets=prepared.buckets,
                         models=prepared.models, rounds=rounds, repeats=repeats,
                         alpha_rounds=prepared.alpha_rounds)
  if jax.process_count() > 1:  # every process decides with process 0's table, in lockstep
    table = auto.CostTable.from_json(json.loads(distributed.broadcast_text(
        json.dumps(table.to_json()))), "process 0's cost table")
  CALIBRATED.put(prepared.key, table)
  return table


def costs_for(prepared: PreparedDecode, costs: Optional[auto.CostTable]) -> auto.CostTable:
  """The given table (checked against the decode), else this process's calibration of it."""
  if costs is not None:
    costs.check(batch=prepared.batch, cache_len=prepared.cache_len,
                max_gamma=prepared.max_gamma, buckets=prepared.buckets, models=prepared.models)
    return costs
  return CALIBRATED.get(prepared.key) or measure(prepared)


@functools.lru_cache(maxsize=64)
def decode_control(costs: auto.CostTable, gamma_cap: int) -> auto.AutoControl:
  """The policy's control for a decode (device arrays made once per table and γ cap)."""
  prior, weight = auto.prior_of(costs)
  return auto.AutoControl.make(costs.per_gamma(), gamma_cap, prior=prior, prior_weight=weight)


def decide(prepared: PreparedDecode, costs: Optional[auto.CostTable], gamma_cap: int,
         max_new_tokens: int) -> Tuple[auto.CostTable, Optional[auto.AutoControl]]:
  """The 'auto' branch of a speculative decode, decided once: (the cost table, the loop's
  control), the control None when the policy would play only γ = 0 rounds (the caller then
  runs the autoregressive loop instead, `specjax.decode.auto.fallback`)."""
  costs = costs_for(prepared, costs)
  if auto.never_speculates(costs, gamma_cap, max_new_tokens):
    return costs, None
  return costs, decode_control(costs, gamma_cap)

