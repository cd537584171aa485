"""Human-readable output: the paper's Figure-1 trace and the summary table.

Colours (rich): accepted guesses green, rejected guess red, the target's
correction blue. Without a terminal (or with `plain=True`) the same trace is
plain text: accepted guesses as-is, a rejected guess as [-x-], a correction
as [+y+].
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specjax.app import display, records
from specjax.decode import DecodeResult
from specjax.verify import describe


def trace_rounds(result: DecodeResult, row: int) -> List[Dict]:
  """Per round of one row: {'accepted': [ids], 'rejected': id or None, 'correction': id}."""
  trace = result.trace
  if trace is None:
    raise ValueError("the result has no trace: decode with DecodeConfig(trace=True)")
  rounds, total, length = [], 0, int(result.lengths[row])
  for r in range(int(result.target_calls[row])):
    n, gamma = int(trace.accepted[row, r]), int(trace.gamma[row, r])
    guesses = [int(t) for t in np.asarray(trace.guesses[row, r, :n])]
    rejected = int(trace.guesses[row, r, n]) if n < gamma else None
    keep = max(0, min(n, length - total))
    entry = {"accepted": guesses[:keep], "rejected": rejected if keep == n else None,
             "correction": int(trace.correction[row, r]) if total + n < length else None}
    rounds.append(entry)
    total += n + 1
  return rounds


def render_trace(rounds: Sequence[Dict], piece: Callable[[int], str]) -> Text:
  """A rich Text of the trace, one line per round."""
  text = Text()
  for entry in rounds:
    for t in entry["accepted"]:
      text.append(piece(t), style="green")
    if entry["rejected"] is not None:
      text.append(piece(entry["rejected"]), style="red strike")
    if entry["correction"] is not None:
      text.append(piece(entry["correction"]), style="bold blue")
    text.append("\n")
  return text


def plain_trace(rounds: Sequence[Dict], piece: Callable[[int], str]) -> str:
  """The trace as plain text (for logs and non-terminals)."""
  lines = []
  for entry in rounds:
    line = "".join(piece(t) for t in entry["accepted"])
    if entry["rejected"] is not None:
      line += f"[-{piece(entry['rejected'])}-]"
    if entry["correction"] is not None:
      line += f"[+{piece(entry['correction'])}+]"
    lines.append(line)
  return "\n".join(lines)


def summary_table(summary: Dict, title: str = "specjax summary") -> Table:
  """A two-column rich table (metric, value); floats to 3 significant digits."""
  table = Table(title=title)
  table.add_column("metric")
  table.add_column("value", justify="right")
  for key, value in summary.items():
    table.add_row(display.text(key),
                  display.text(f"{value:.3g}" if isinstance(value, float) else value))
  return table


def print_trace(console: Console, rounds, piece, plain: bool) -> None:
  """Prints the trace with colours on a terminal, else as plain text."""
  if plain or not console.is_terminal:
    console.print(plain_trace(rounds, piece), markup=False, highlight=False)
  else:
    console.print(render_trace(rounds, piece))


def summarize(plan, measured) -> Dict:
  """The summary dict of a main job run (what the table prints and summary.json holds)."""
  settings, spec_out, ar_out = plan.settings, measured.spec, measured.ar
  timings, costs, sampling = measured.timings, measured.costs, settings["sampling"]
  verifier, lenience = settings["verifier"], settings["lenience"]
  identical = all(
      np.array_equal(np.asarray(ar_out.tokens[i, :int(ar_out.lengths[i])]),
                     np.asarray(spec_out.tokens[i, :int(spec_out.lengths[i])]))
      for i in range(len(plan.examples)))
  ratio, low, high = timings.ratio("ar", "spec")
  gamma_rounds = np.asarray(spec_out.gamma_hist).sum(0)
  ar_s, spec_s = timings.median("ar"), timings.median("spec")
  return {
      "examples": len(plan.examples), "gamma": settings["gamma"],
      "gamma_policy": settings["gamma_policy"], "drafter": settings["drafter"],
      "weights_dtype": settings["weights_dtype"],
      "draft_weights_dtype": settings["draft_weights_dtype"],
      "verifier": describe(verifier),
      "temperature": sampling.temperature, "lenience": lenience,
      "alpha": float(np.sum(spec_out.alpha_sum) / max(int(np.sum(spec_out.alpha_count)), 1)),
      "tokens_per_target_call": float(np.sum(spec_out.lengths)
                                      / max(int(np.sum(spec_out.target_calls)), 1)),
      "autoregressive_s": ar_s, "speculative_s": spec_s,
      "speedup": ar_s / max(spec_s, 1e-9),
      "timing_repeats": settings["timing_repeats"],
      "speedup_range": f"{low:.2f}-{high:.2f}",
      "compile_ar_s": measured.compile_s["ar"], "compile_spec_s": measured.compile_s["spec"],
      "slot_utilization": spec_out.slot_utilization,
      "slot_utilization_ar": ar_out.slot_utilization,
      "greedy_identical": (identical if sampling.greedy and lenience == 1.0
                           and verifier.exact else "n/a (sampling or not exact)"),
      "rounds_by_gamma": ", ".join(f"{g}: {int(n)}" for g, n in enumerate(gamma_rounds) if n),
      **(costs.summary() if costs is not None else {}),
  }


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
  console.print("\nFigure-1 trace of the first example (green accepted, red rejected, "
                "blue correction; one line per target call):")
  vocab = plan.vocab
  piece = lambda t: display.printable(vocab.decode([t])) if t != vocab.eos_id else "</s>"
  print_trace(console, trace_rounds(measured.spec, 0), lambda t: piece(t) + " ", plain)
  console.print(summary_table(summary))
