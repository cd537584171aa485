"""Why greedy speculative output differs from the autoregressive one: near-ties or a defect.

At temperature 0 with an exact verifier the two decodes emit the same tokens in exact
arithmetic. In reduced precision they need not: the speculative loop scores γ+1 positions in
one target call where the autoregressive loop scores one, the two shapes round differently,
and where the target's two best logits lie within that rounding of each other the argmax can
flip. From that position on the two outputs go their own ways, legitimately.

For each row that differs this module takes the first differing position and the target's
logits there along the autoregressive decode's own sequence (teacher-forced), and tells the
two cases apart: the two decodes' tokens within `NEAR_TIE_ULPS` units in the last place of the
target's compute precision at the logits' magnitude (a near-tie), or farther apart (a defect).

    diffs = row_differences(ar_tokens, ar_lengths, spec_tokens, spec_lengths, logits)
    print(verdict(diffs, "bfloat16"))
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence

import jax
import numpy as np

from specjax.app.scoring import teacher_forced_logits

EPSILON = {"float32": 2.0 ** -23, "tensorfloat32": 2.0 ** -10, "float16": 2.0 ** -10,
           "bfloat16": 2.0 ** -7}
"""The spacing of each precision's numbers just above 1 (its significand's last bit)."""

NEAR_TIE_ULPS = 4
"""How many units in the last place (of the compute precision, at the logits' magnitude) two
logits may be apart and still count as tied. Each of the two differently shaped calls rounds
each logit its own way: with the bundled LM target in bfloat16 on XLA:CPU, a logit of a
5-wide call differed from the 1-wide call's by up to 1.3 units (8 prompts x 40 positions), so
the gap between two logits can swing by about 2.6; 4 leaves room for other backends' kernels
while a token a quarter of a logit below the top (at |logit| 8-16) already counts as a defect."""


@dataclasses.dataclass(frozen=True)
class RowDifference:
  """Where one row's speculative output first leaves the autoregressive one, and how close
  the target's logits were there (along the autoregressive sequence)."""

  row: int
  """The example's index."""
  position: int
  """The first generated position whose tokens differ (or where one output ended)."""
  ar_token: Optional[int]
  """The autoregressive token there (None: that output had ended)."""
  spec_token: Optional[int]
  """The speculative token there (None: that output had ended)."""
  margin: Optional[float]
  """The target's top-1 minus top-2 logit there (None: past the autoregressive output)."""
  gap: Optional[float]
  """The target's top-1 logit minus the lower of the two emitted tokens' logits: the margin
  when the two decodes chose the two best tokens, larger when one chose a worse token."""
  magnitude: Optional[float]
  """|top-1 logit| there, which sets the size of a rounding step."""


def first_difference(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
  """The first index where two token lists differ, counting an end as a difference (the
  shorter length when one is a prefix of the other); None when equal."""
  a, b = np.asarray(a), np.asarray(b)
  n = min(len(a), len(b))
  differ = np.flatnonzero(a[:n] != b[:n])
  if differ.size:
    return int(differ[0])
  return None if len(a) == len(b) else n


def row_differences(ar_tokens, ar_lengths, spec_tokens, spec_lengths, logits,
                    rows: Optional[Sequence[int]] = None) -> List[RowDifference]:
  """One `RowDifference` per row whose outputs differ.

  Args:
    ar_tokens / spec_tokens: int [B, N]: the two decodes' tokens.
    ar_lengths / spec_lengths: int [B]: tokens emitted per row.
    logits: float [R, N, V]: the target's logits along the autoregressive tokens
      (logits[r, j] predicts ar_tokens[rows[r], j]), for the rows in `rows`.
    rows: the rows `logits` covers (default: all B).
  Returns:
    The differing rows among `rows`, in order.
  """
  rows = range(len(ar_lengths)) if rows is None else rows
  out = []
  for r, b in enumerate(rows):
    ar = np.asarray(ar_tokens[b][:int(ar_lengths[b])])
    spec = np.asarray(spec_tokens[b][:int(spec_lengths[b])])
    j = first_difference(ar, spec)
    if j is None:
      continue
    ar_tok = int(ar[j]) if j < len(ar) else None
    spec_tok = int(spec[j]) if j < len(spec) else None
    margin = gap = magnitude = None
    if ar_tok is not None:
      there = np.asarray(logits[r][j], np.float64)  # [V]
      second, first = np.sort(there)[-2:]
      margin, magnitude = float(first - second), float(abs(first))
      emitted = [there[t] for t in (ar_tok, spec_tok) if t is not None]
      gap = float(first - min(emitted))
    out.append(RowDifference(b, j, ar_tok, spec_tok, margin, gap, magnitude))
  return out


def rounding(precision: str, magnitude: float) -> float:
  """One unit in the last place of `precision` (a key of `EPSILON`) at `magnitude`."""
  if precision not in EPSILON:
    raise ValueError(f"precision must be one of {sorted(EPSILON)}, got {precision!r}")
  return EPSILON[precision] * 2.0 ** math.floor(math.log2(max(magnitude, 2.0 ** -126)))


def compute_precision(weights_dtype: str, backend: str, matmul_precision: Optional[str]) -> str:
  """The precision the target's products are rounded to: its weights' dtype, or for float32
  weights the backend's default float32 matmul (TPU: bfloat16 passes; NVIDIA GPU: TF32)
  unless the matmul precision is set to 'highest' / 'float32'."""
  if weights_dtype != "float32" or matmul_precision in ("highest", "float32"):
    return weights_dtype
  return {"tpu": "bfloat16", "gpu": "tensorfloat32", "cuda": "tensorfloat32"}.get(backend,
                                                                                 "float32")


def is_near_tie(diff: RowDifference, precision: str, ulps: float = NEAR_TIE_ULPS) -> bool:
  """Whether the row's two tokens were within `ulps` rounding steps of the top logit."""
  return diff.gap is not None and diff.gap <= ulps * rounding(precision, diff.magnitude)


def describe(diff: RowDifference) -> str:
  """One line about one row."""
  tokens = f"autoregressive {_token(diff.ar_token)}, speculative {_token(diff.spec_token)}"
  if diff.margin is None:
    return (f"example {diff.row}: first differs at position {diff.position} ({tokens}), past "
            "the autoregressive output")
  text = (f"example {diff.row}: first differs at position {diff.position} ({tokens}); "
          f"target top-2 logit margin {diff.margin:.3g} at |logit| {diff.magnitude:.3g}")
  if diff.gap > diff.margin:
    text += f", the lower of the two tokens {diff.gap:.3g} below the top"
  return text


def _token(token: Optional[int]) -> str:
  return "ended" if token is None else f"token {token}"


def verdict(diffs: Sequence[RowDifference], precision: str, ulps: float = NEAR_TIE_ULPS
            ) -> str:
  """One line: whether every difference sits at a near-tie of the target's logits, where
  `precision` (a key of `EPSILON`) is what the target's products were rounded to."""
  if not diffs:
    return "identical"
  if all(is_near_tie(d, precision, ulps) for d in diffs):
    largest = max(diffs, key=lambda d: d.gap)
    return (f"differs only at near-ties (largest margin {largest.gap:.3g}, within {precision} "
            f"rounding at that magnitude: {ulps} x {rounding(precision, largest.magnitude):.3g})")
  return "differs at a clear margin: a defect"


def greedy_difference(model, params, inputs, prompt_lengths, ar, spec, weights_dtype: str
                      ) -> Dict[str, str]:
  """The summary entries that explain a greedy difference between two decodes.

  Args:
    model, params: the target and its parameters as the decodes used them.
    inputs: int32 [B, L] and prompt_lengths int32 [B] or None: the decodes' inputs.
    ar / spec: the autoregressive and speculative `DecodeResult`s.
    weights_dtype: the target's weights dtype ('bfloat16', 'float32'); with the default
      backend and matmul precision it gives the precision of the verdict (`compute_precision`).
  Returns:
    {'greedy_difference': one line per differing row, 'greedy_verdict': one line}.
  """
  precision = compute_precision(weights_dtype, jax.default_backend(),
                                jax.config.jax_default_matmul_precision)
  ar_tokens, spec_tokens = np.asarray(ar.tokens), np.asarray(spec.tokens)
  ar_lengths, spec_lengths = np.asarray(ar.lengths), np.asarray(spec.lengths)
  rows = [b for b in range(len(ar_lengths))
          if first_difference(ar_tokens[b, :ar_lengths[b]], spec_tokens[b, :spec_lengths[b]])
          is not None]
  if not rows:
    return {"greedy_verdict": verdict([], precision)}
  lengths = None if prompt_lengths is None else np.asarray(prompt_lengths)[rows]
  logits = teacher_forced_logits(model, params, np.asarray(inputs)[rows], lengths,
                                 ar_tokens[rows])  # [R, N, V]
  diffs = row_differences(ar_tokens, ar_lengths, spec_tokens, spec_lengths,
                          np.asarray(logits, np.float32), rows)
  return {"greedy_difference": "\n".join(describe(d) for d in diffs),
          "greedy_verdict": verdict(diffs, precision)}


def explained(summary: Dict, plan, loaded, measured) -> Dict:
  """The main job's summary, with `greedy_difference` and `greedy_verdict` added when it
  reports `greedy_identical` False (plan, loaded, measured: the job's steps' results)."""
  if summary.get("greedy_identical") is not False:
    return summary
  return {**summary, **greedy_difference(plan.target, loaded.target_params, plan.inputs,
                                         plan.prompt_lengths, measured.ar, measured.spec,
                                         plan.settings.weights_dtype)}
