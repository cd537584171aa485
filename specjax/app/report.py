"""Human-readable output: the outputs, the paper's Figure-1 trace (`specjax.app.trace`) and the
summary table."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specjax.app import display, records
from specjax.app.trace import (legend, plain_trace, print_trace, readable_rounds,  # noqa: F401
                               render_trace, trace_rounds)
from specjax.decode import DecodeResult
from specjax.verify import describe


NOT_IN_TABLE = ("speculation_off",)
"""Summary entries printed below the table (as a note) rather than in it."""


def summary_table(summary: Dict, title: str = "specjax summary") -> Table:
  """A two-column rich table (metric, value); floats to 3 significant digits."""
  table = Table(title=title)
  table.add_column("metric")
  table.add_column("value", justify="right")
  for key, value in summary.items():
    if key in NOT_IN_TABLE:
      continue
    shown = f"{value:.3g}" if isinstance(value, float) else str(value)
    # a value of several lines (greedy_difference: a line per row) keeps its lines; each is
    # shown as data (its control characters escaped)
    table.add_row(display.text(key),
                  Text("\n").join(display.text(line) for line in shown.split("\n")))
  return table


def decode_figures(name: str, result: DecodeResult, seconds: float) -> Dict:
  """One decode's tokens (total and per row) and milliseconds per emitted token."""
  lengths = np.asarray(result.lengths)
  total = int(lengths.sum())
  return {f"{name}_tokens": total,
          f"{name}_tokens_per_row": f"{lengths.mean():.1f} ({lengths.min()}-{lengths.max()})",
          f"{name}_ms_per_token": 1e3 * seconds / max(total, 1)}


def speculation_rounds(result: DecodeResult) -> tuple:
  """(rounds with γ > 0, all rounds) over every row of a speculative result."""
  by_gamma = np.asarray(result.gamma_hist).sum(0)
  return int(by_gamma[1:].sum()), int(by_gamma.sum())


def per_token_speedup(timings, ar_tokens: int, spec_tokens: int) -> tuple:
  """(speedup, low, high). The speedup is the autoregressive decode's median seconds per
  emitted token over the speculative one's: the summary's autoregressive_ms_per_token /
  speculative_ms_per_token. low and high are the least and greatest of the same ratio taken
  pass by pass (the two decodes of a pass ran side by side); the ratio of the medians always
  lies between them. At T = 0 both decodes emit the same tokens; at T > 0 they differ."""
  _, low, high = timings.ratio("ar", "spec")
  scale = spec_tokens / max(ar_tokens, 1)
  speedup = timings.median("ar") / max(timings.median("spec"), 1e-12) * scale
  return speedup, low * scale, high * scale


def tree_name(tree) -> str:
  """A tree in one line: kind, nodes per level."""
  return f"{type(tree).__name__}, nodes per level {'/'.join(map(str, tree.levels))}"


def summarize(plan, measured) -> Dict:
  """The summary dict of a main job run (what the table prints and summary.json holds)."""
  settings, spec_out, ar_out = plan.settings, measured.spec, measured.ar
  timings, costs, decoding = measured.timings, measured.costs, plan.settings.decoding
  sampling, verifier, lenience = decoding.sampling, decoding.verifier, decoding.lenience
  tree = plan.drafter.tree  # TREE, or the tree a drafter drafts on its own (None: a chain)
  identical = all(
      np.array_equal(np.asarray(ar_out.tokens[i, :int(ar_out.lengths[i])]),
                     np.asarray(spec_out.tokens[i, :int(spec_out.lengths[i])]))
      for i in range(len(plan.examples)))
  ar_s, spec_s = timings.median("ar"), timings.median("spec")
  ar, spec = decode_figures("autoregressive", ar_out, ar_s), decode_figures(
      "speculative", spec_out, spec_s)
  speedup, low, high = per_token_speedup(timings, ar["autoregressive_tokens"],
                                         spec["speculative_tokens"])
  speculated, rounds = speculation_rounds(spec_out)
  gamma_rounds = np.asarray(spec_out.gamma_hist).sum(0)
  summary = {
      "examples": len(plan.examples),
      **({} if not speculated else
         {"gamma": settings.gamma if tree is None else "n/a: a tree"}),
      **({} if tree is None else {"tree": tree_name(tree)}),
      "gamma_policy": decoding.gamma_policy, "drafter": settings.drafter,
      "weights_dtype": settings.weights_dtype,
      "draft_weights_dtype": settings.draft_weights_dtype,
      **({} if settings.draft_weights_why is None else
         {"draft_weights_dtype_why": settings.draft_weights_why}),
      "verifier": describe(verifier),
      "temperature": sampling.temperature, "lenience": lenience,
      **({} if not settings.ignore_eos else
         {"eos": f"ignored: every example decodes {settings.max_new_tokens} tokens"}),
      **ar, **spec,
      "speedup": speedup if speculated else "n/a: speculation was off (below)",
      **({} if not speculated else {"speedup_range": f"{low:.2f}-{high:.2f}"}),
      "speedup_is": speedup_is(settings.timing_repeats, bool(speculated)),
      "speculating_rounds": f"{speculated} of {rounds} ({speculated / max(rounds, 1):.0%})",
      "alpha": float(np.sum(spec_out.alpha_sum) / max(int(np.sum(spec_out.alpha_count)), 1)),
      "tokens_per_target_call": float(np.sum(spec_out.lengths)
                                      / max(int(np.sum(spec_out.target_calls)), 1)),
      "greedy_identical": (identical if sampling.greedy and lenience == 1.0
                           and verifier.exact else "n/a (sampling or not exact)"),
      "autoregressive_s": ar_s, "speculative_s": spec_s,
      "timing_repeats": settings.timing_repeats,
      "compile_ar_s": measured.compile_s["ar"], "compile_spec_s": measured.compile_s["spec"],
      "slot_utilization": spec_out.slot_utilization,
      "slot_utilization_ar": ar_out.slot_utilization,
      "rounds_by_gamma": ", ".join(f"{g}: {int(n)}" for g, n in enumerate(gamma_rounds) if n),
      **(costs.summary() if costs is not None else {}),
  }
  if speculated < 0.5 * rounds:
    summary["speculation_off"] = speculation_off(speculated, rounds, costs, measured.draft_cost)
  return summary


def speedup_is(repeats: int, speculated: bool) -> str:
  """What the summary's speedup is, in words (the range only where there is a speedup)."""
  text = f"ms per emitted token, autoregressive / speculative, medians of {repeats} passes"
  return text + ("; range: pass by pass" if speculated else "")


def break_even_alpha(round_cost: float, gamma: int) -> Optional[float]:
  """The α above which a round of `gamma` guesses costing `round_cost` autoregressive steps
  emits more tokens per step than the autoregressive loop: Σ_{i ≤ γ} α^i = round_cost
  (Eq. 1); None when even α = 1 does not pay."""
  expected = lambda a: sum(a ** i for i in range(gamma + 1))
  if expected(1.0) <= round_cost:
    return None
  low, high = 0.0, 1.0
  for _ in range(60):
    mid = 0.5 * (low + high)
    low, high = (mid, high) if expected(mid) < round_cost else (low, mid)
  return high


def speculation_off(speculated: int, rounds: int, costs, draft_cost: Optional[float]) -> str:
  """Why most rounds played γ = 0, in words, from the 'auto' policy's measurements."""
  text = f"speculation was off in {rounds - speculated} of {rounds} rounds"
  if costs is not None:
    bucket = costs.buckets[0]
    round_cost = costs.relative()[bucket]
    alpha = costs.alpha
    even = break_even_alpha(round_cost, bucket)
    text += (f": the 'auto' policy measured α = {alpha:.2f}" if alpha is not None
             else ": the 'auto' policy had no measured α")
    if draft_cost is not None:
      text += f", a draft step costs c = {draft_cost:.2f} target steps"
    text += (f", and a γ = {bucket} round costs {round_cost:.2f} autoregressive steps, so "
             + (f"speculating pays only above α = {even:.2f}" if even is not None
                else "no α makes it pay"))
    if costs.real_ratio is not None:
      text += f" (measured: {costs.measured()})"
  return (text + ". The two decodes above are then both autoregressive: their time ratio is "
          "noise, not a speedup. To speculate anyway: --gin.GAMMA_POLICY=\"'constant'\"")


def example_records(plan, measured, scores=None) -> List[Dict]:
  """One JSONL record per example (`specjax.app.records.record`)."""
  ar_out, spec_out, inputs = measured.ar, measured.spec, plan.inputs
  out = []
  for i, example in enumerate(plan.examples):
    ar_ids = np.asarray(ar_out.tokens[i, :int(ar_out.lengths[i])]).tolist()
    sp_ids = np.asarray(spec_out.tokens[i, :int(spec_out.lengths[i])]).tolist()
    width = (int(plan.prompt_lengths[i]) if plan.prompt_lengths is not None
             else int(np.count_nonzero(inputs[i])))
    out.append(records.record(example, inputs[i, :width], ar_ids, sp_ids, plan.vocab,
                              target_calls=int(spec_out.target_calls[i]),
                              alpha=float(spec_out.alpha[i]),
                              score=None if scores is None else scores[i]))
  return out


def print_run(console: Console, plan, measured, recs: Sequence[Dict], summary: Dict,
              plain: bool) -> None:
  """The outputs, the first example's Figure-1 trace and the summary table."""
  for rec in recs:  # user and model text shown as data: no markup, no control bytes
    console.print(Text.assemble(("> ", "bold"), display.text(rec["input"])), highlight=False)
    console.print(display.text(f"  {rec['speculative']}"), highlight=False)
  rounds = trace_rounds(measured.spec, 0)
  shown = readable_rounds(rounds, plan.vocab)
  colours = not plain and console.is_terminal
  console.print(f"\nFigure-1 trace of the first example ({legend(colours)}; one line per target "
                "call):", markup=False, highlight=False)
  print_trace(console, shown, colours)
  wide = sum(1 for r in rounds if r["gamma"] > 0)
  emitted = int(measured.spec.lengths[0])
  past = len(rounds) - len(shown)
  console.print(f"{len(rounds)} target calls, {wide} of them speculating (γ > 0), "
                f"{emitted / max(len(rounds), 1):.2f} tokens per call"
                + (f" ({past} calls past the first EOS not shown)" if past else ""),
                highlight=False)
  console.print(summary_table(summary))
  if "speculation_off" in summary:
    console.print(f"Note: {summary['speculation_off']}", markup=False, highlight=False)
