"""The paper's Figure-1 trace of one row: one line per target call, each guess marked by its fate.

On a terminal (rich): accepted guesses green, the rejected guess red and struck through, the
target's correction blue. In plain text (`--plain`, or output that is not a terminal):

  [+x+]  accepted guesses (the run of them in one round)
  [-x-]  the rejected guess (not in the output)
  [*x*]  the target's own token: the correction after a rejection, or the extra token after a
         round whose guesses were all accepted

Pieces read as the output text does (`readable_rounds`): each token shows what it adds to the
decoded text so far (SentencePiece word pieces joined, a word's leading space outside its
marker), white space that ends a marked part, or a part that is only white space, shows as
`␣`, and the trace stops at the row's first EOS (`</s>`), as its output does.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np
from rich.console import Console
from rich.text import Text

from specjax.command import printable
from specjax.decode import DecodeResult

SPACE = "␣"
"""How a piece that adds only white space to the text is shown."""
EOS = "</s>"
MARKS = {"accepted": ("[+", "+]"), "rejected": ("[-", "-]"), "correction": ("[*", "*]")}
"""Plain-text markers of each kind."""
STYLES = {"accepted": "green", "rejected": "red strike", "correction": "bold blue"}
"""Terminal styles of each kind."""


def legend(colours: bool) -> str:
  """What the trace's markers mean in the mode it is printed in."""
  if colours:
    return "green accepted, red rejected, blue the target's correction"
  return (f"{MARKS['accepted'][0]}x{MARKS['accepted'][1]} accepted, "
          f"{MARKS['rejected'][0]}x{MARKS['rejected'][1]} rejected, "
          f"{MARKS['correction'][0]}x{MARKS['correction'][1]} the target's correction, "
          f"{SPACE} a space")


def trace_rounds(result: DecodeResult, row: int) -> List[Dict]:
  """Per round of one row: {'gamma': guesses offered, 'accepted': [ids], 'rejected': id or
  None, 'correction': id or None}."""
  trace = result.trace
  if trace is None:
    raise ValueError("the result has no trace: decode with DecodeConfig(trace=True)")
  rounds, total, length = [], 0, int(result.lengths[row])
  for r in range(int(result.target_calls[row])):
    n, gamma = int(trace.accepted[row, r]), int(trace.gamma[row, r])
    guesses = [int(t) for t in np.asarray(trace.guesses[row, r, :n])]
    rejected = int(trace.guesses[row, r, n]) if n < gamma else None
    keep = max(0, min(n, length - total))
    entry = {"gamma": gamma, "accepted": guesses[:keep],
             "rejected": rejected if keep == n else None,
             "correction": int(trace.correction[row, r]) if total + n < length else None}
    rounds.append(entry)
    total += n + 1
  return rounds


def _added(vocab: Any, before: List[int], token: int) -> str:
  """The text `token` adds after the tokens `before` (its own decode where the longer text
  does not extend the shorter, as a normalizing vocabulary may do)."""
  head, text = vocab.decode(before), vocab.decode(before + [token])
  return text[len(head):] if text.startswith(head) else vocab.decode([token])


def readable_rounds(rounds: Sequence[Dict], vocab: Any) -> List[Dict]:
  """`trace_rounds` as text: each id replaced by what it adds to the decoded output before
  it (a rejected guess: what it would have added), EOS by '</s>', up to the round that emits
  the first EOS; the same keys, strings for ids."""
  shown, emitted = [], []

  def text(token: int, before: List[int]) -> str:
    return EOS if token == vocab.eos_id else printable(_added(vocab, before, token))

  for entry in rounds:
    accepted = []
    for token in entry["accepted"]:
      accepted.append(text(token, emitted))
      emitted = emitted + [token]
    rejected = None if entry["rejected"] is None else text(entry["rejected"], emitted)
    correction = None if entry["correction"] is None else text(entry["correction"], emitted)
    shown.append({"gamma": entry["gamma"], "accepted": accepted, "rejected": rejected,
                  "correction": correction})
    ended = vocab.eos_id in entry["accepted"] or entry["correction"] == vocab.eos_id
    if entry["correction"] is not None:
      emitted = emitted + [entry["correction"]]
    if ended:
      break
  return shown


def _parts(entry: Dict) -> List[tuple]:
  """(kind, leading white space, text) of a round's marked parts, in order: the accepted run
  as one part, then the rejected guess, then the correction. A part's leading space (a word's
  start) stands before its marker; white space at its end, or a part of white space alone,
  shows as `SPACE` inside it."""
  parts = []
  for kind, text in (("accepted", "".join(entry["accepted"])), ("rejected", entry["rejected"]),
                     ("correction", entry["correction"])):
    if not text:
      continue
    body = text.lstrip()
    lead = text[:len(text) - len(body)]
    if not body:
      parts.append((kind, "", SPACE))
    else:
      parts.append((kind, lead, body.rstrip() + (SPACE if body != body.rstrip() else "")))
  return parts


def plain_trace(rounds: Sequence[Dict], piece: Optional[Any] = None) -> str:
  """The trace as plain text, one line per round (`readable_rounds`; `piece`: ids -> text when
  the rounds still hold ids)."""
  lines = []
  for entry in _as_text(rounds, piece):
    line = ""
    for kind, space, body in _parts(entry):
      start, end = MARKS[kind]
      line += f"{space}{start}{body}{end}"
    lines.append(line.lstrip())
  return "\n".join(lines)


def render_trace(rounds: Sequence[Dict], piece: Optional[Any] = None) -> Text:
  """The trace as a rich Text in colours, one line per round."""
  out = Text()
  for entry in _as_text(rounds, piece):
    first = True
    for kind, space, body in _parts(entry):
      if not first:
        out.append(space)
      out.append(body, style=STYLES[kind])
      first = False
    out.append("\n")
  return out


def _as_text(rounds: Sequence[Dict], piece: Optional[Any]) -> Sequence[Dict]:
  if piece is None:
    return rounds
  return [{**r, "accepted": [piece(t) for t in r["accepted"]],
           "rejected": None if r["rejected"] is None else piece(r["rejected"]),
           "correction": None if r["correction"] is None else piece(r["correction"])}
          for r in rounds]


def print_trace(console: Console, rounds: Sequence[Dict], colours: bool) -> None:
  """Prints readable rounds in colours, or as plain text."""
  if colours:
    console.print(render_trace(rounds))
  else:
    console.print(plain_trace(rounds), markup=False, highlight=False)
