"""The experiments' one comparison: decoders run on the same inputs one example at a time,
interleaved, with the standard columns.

  result = compare({"autoregressive": ar, "chain γ=4": chain}, inputs, repeats=3,
                   reference="autoregressive", gammas={"chain γ=4": 4})
  rows = result.rows()   # decoder, alpha, tokens_per_call, E_tokens, ms_per_token, speedup, ...

Each example (a row of `inputs`, decoded at batch 1) is decoded by every decoder in `repeats`
timed passes, the order alternating (`specjax.timing.interleaved`; the first example's warm-up
compiles, reported apart). Speed: a decoder's time is the sum of its per-example medians;
speedup is the reference's over the decoder's per emitted token, its range the lowest and
highest per-example ratio. α pools the decodes' own estimates (`DecodeResult.alpha_sum` /
`alpha_count`), tokens per call their lengths over their target calls.

Whole batches (a decode of several rows at once, a streamed run) are `batched`'s: each
decoder's one call timed side by side, with the same columns.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from specjax import analysis, timing

Decode = Callable[[np.ndarray], Any]
"""A decoder: fn(row int32 [1, W]) -> DecodeResult."""


@dataclasses.dataclass
class Comparison:
  """What `compare` measured, per decoder name (in the order given)."""
  compile_s: Dict[str, float]  # the first example's warm-up less its median pass
  medians: Dict[str, List[float]]  # per example: the median seconds of its passes
  stats: Dict[str, Dict[str, float]]  # tokens, target_calls, alpha_sum, alpha_count (summed)
  differences: Dict[str, List[str]]  # per decoder: how examples differed from the reference
  reference: Optional[str]
  gammas: Mapping[str, int]
  examples: int
  first: Dict[str, Any] = dataclasses.field(default_factory=dict)  # example 0's DecodeResults

  @property
  def seconds(self) -> Dict[str, float]:
    """Summed per-example medians."""
    return {name: float(np.sum(m)) for name, m in self.medians.items()}

  def alpha(self, name: str) -> Optional[float]:
    """The pooled α estimate of `name` (None when it made no speculative round)."""
    st = self.stats[name]
    return st["alpha_sum"] / st["alpha_count"] if st["alpha_count"] else None

  def rows(self) -> List[Dict[str, Any]]:
    """The standard columns, one row per decoder: decoder, alpha, tokens_per_call, E_tokens
    (Eq. 1 at alpha and the decoder's γ, when `gammas` names it), ms_per_token, and beside a
    reference: speedup (the reference's ms per token over the decoder's), speedup_range
    (per example), greedy (examples whose output equals the reference's, and how the others
    differed); compile_s."""
    rows = []
    ref = self.reference
    for name, medians in self.medians.items():
      st, alpha, gamma = self.stats[name], self.alpha(name), self.gammas.get(name)
      row = {"decoder": name, "alpha": alpha,
             "tokens_per_call": st["tokens"] / max(st["target_calls"], 1),
             "E_tokens": (float(analysis.expected_tokens(alpha, gamma))
                          if gamma and alpha is not None else None),
             "ms_per_token": 1e3 * float(np.sum(medians)) / max(st["tokens"], 1)}
      if ref is not None:
        own, base = np.asarray(medians), np.asarray(self.medians[ref])
        per_token = lambda s, n: s / max(self.stats[n]["tokens"], 1)
        ratios = base / own * (st["tokens"] / max(self.stats[ref]["tokens"], 1))
        diffs = self.differences[name]
        row.update(speedup=float(per_token(base.sum(), ref) / per_token(own.sum(), name)),
                   speedup_range=f"{ratios.min():.2f}-{ratios.max():.2f}",
                   greedy=(f"{self.examples - len(diffs)} of {self.examples} identical"
                           + (f"; {'; '.join(diffs)}" if diffs else "")))
      row["compile_s"] = self.compile_s.get(name, 0.0)
      rows.append(row)
    return rows


def compare(decoders: Mapping[str, Decode], inputs: np.ndarray, repeats: int, *,
            reference: Optional[str] = None, gammas: Optional[Mapping[str, int]] = None,
            check: Optional[Callable[[str, int, np.ndarray, Any, Any], Optional[str]]] = None,
            progress: bool = False) -> Comparison:
  """Decodes every row of `inputs` [N, W] alone with every decoder (module docstring).

  Args:
    decoders: name -> fn(row [1, W]) -> DecodeResult.
    inputs: int32 [N, W]: the examples.
    repeats: timed passes per example (after the first example's warm-up).
    reference: the decoder the others are compared with (speedup, greedy), or None.
    gammas: name -> the γ of a chain decoder (its E_tokens column).
    check: check(name, example, row, reference's result, the decoder's result), called when
      their tokens differ -> a line saying how (it raises when they must not differ); None:
      the difference is reported as such.
    progress: print a line per example.
  """
  names = list(decoders)
  medians: Dict[str, List[float]] = {name: [] for name in names}
  stats = {name: dict(tokens=0, target_calls=0, alpha_sum=0.0, alpha_count=0)
           for name in names}
  differences: Dict[str, List[str]] = {name: [] for name in names}
  compile_s: Dict[str, float] = {}
  first: Dict[str, Any] = {}
  start = time.perf_counter()
  for i in range(len(inputs)):
    row = inputs[i:i + 1]
    t = timing.interleaved({name: functools.partial(decoders[name], row) for name in names},
                           repeats, warmup=i == 0)
    compile_s = compile_s or dict(t.compile_s)
    first = first or dict(t.outputs)
    for name in names:
      out, st = t.outputs[name], stats[name]
      medians[name].append(t.median(name))
      st["tokens"] += int(np.asarray(out.lengths).sum())
      st["target_calls"] += int(np.asarray(out.target_calls).sum())
      st["alpha_sum"] += float(np.asarray(out.alpha_sum).sum())
      st["alpha_count"] += int(np.asarray(out.alpha_count).sum())
      if reference is not None and name != reference:
        found = _differs(name, i, row, t.outputs[reference], out, check)
        if found:
          differences[name].append(found)
    if progress:
      print(f"example {i + 1} of {len(inputs)} done, {time.perf_counter() - start:.0f} s"
            + (f" (compiles {sum(compile_s.values()):.0f} s)" if i == 0 else ""), flush=True)
  return Comparison(compile_s=compile_s, medians=medians, stats=stats,
                    differences=differences, reference=reference, gammas=dict(gammas or {}),
                    examples=len(inputs), first=first)


def _differs(name: str, i: int, row, reference, out, check) -> Optional[str]:
  if np.array_equal(np.asarray(out.tokens), np.asarray(reference.tokens)):
    return None
  if check is not None:
    return check(name, i, row, reference, out)
  return f"example {i} differs"


def batched(runs: Mapping[str, Callable[[], Any]], repeats: int, *,
            reference: Optional[str] = None, **columns: Any
            ) -> Tuple[List[Dict[str, Any]], timing.Timings]:
  """Whole-batch decodes side by side (`specjax.timing.interleaved`): one row per run with
  `columns` first, then decoder, compile_s, steady_s (the median pass), ms_per_token (over the
  tokens the batch emitted), tokens, tokens_per_call, alpha (pooled over the rows, as
  `DecodeResult.pooled_alpha`; None without a speculative round) and beside a `reference`
  run: speedup (its time per emitted token over this run's) with speedup_range (per pass).
  Returns the rows and the timings.

  runs: name -> a zero-argument call returning a DecodeResult.
  """
  t = timing.interleaved(runs, repeats)
  rows = []
  for name, out in t.outputs.items():
    tokens, counted = int(np.asarray(out.lengths).sum()), int(np.asarray(out.alpha_count).sum())
    row = {**columns, "decoder": name, "compile_s": t.compile_s[name],
           "steady_s": t.median(name), "ms_per_token": 1e3 * t.median(name) / max(tokens, 1),
           "tokens": tokens,
           "tokens_per_call": tokens / max(int(np.asarray(out.target_calls).sum()), 1),
           "alpha": float(np.asarray(out.alpha_sum).sum()) / counted if counted else None}
    if reference is not None:
      per_token = tokens / max(int(np.asarray(t.outputs[reference].lengths).sum()), 1)
      _, low, high = t.ratio(reference, name)
      row.update(speedup=t.median(reference) / t.median(name) * per_token,
                 speedup_range=f"{low * per_token:.2f}-{high * per_token:.2f}")
    rows.append(row)
  return rows, t
