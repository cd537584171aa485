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

from specjax.decode import DecodeResult


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
    table.add_row(str(key), f"{value:.3g}" if isinstance(value, float) else str(value))
  return table


def print_trace(console: Console, rounds, piece, plain: bool) -> None:
  """Prints the trace with colours on a terminal, else as plain text."""
  if plain or not console.is_terminal:
    console.print(plain_trace(rounds, piece), markup=False, highlight=False)
  else:
    console.print(render_trace(rounds, piece))
