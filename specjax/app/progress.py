"""What the main job says while its first runs compile and decode.

A loop's first run compiles it (20-60 s on a CPU for the bundled pairs; a run's compiled loops
are cached for the next, `specjax.runtime.compile_cache`), then decodes. On a terminal a bar
says which loop is compiling, with the time elapsed, then how many examples are decoded; when
the output is not a terminal (piped, a log) the same is written as lines on stderr, so the
report on stdout stays as it was:

  compiling the autoregressive loop (first run; cached after) ...
  autoregressive: compiled, 4 of 16 examples decoded, 21.3 s
  autoregressive: 16 of 16 examples decoded, 24.0 s
  ...
  timing 3 interleaved passes of both decodes ...
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn)

LINES_EVERY = 0.25
"""Without a terminal, a progress line after each further quarter of the examples."""


def compiling(name: str) -> str:
  """The message while the `name` loop ('autoregressive', 'speculative') compiles."""
  return f"compiling the {name} loop (first run; cached after)"


class FirstRuns:
  """Progress of the main job's first run of each loop (`measure.measure`).

  Use as a context manager; `loop(name)` before each loop's first run returns its progress
  hook, `hook(done, total)` (examples done), which the streaming decode calls after each
  batch_size finished examples.
  """

  def __init__(self, console: Console, stream: Optional[TextIO] = None,
               clock: Callable[[], float] = time.monotonic):
    self.console, self.clock = console, clock
    self.stream = sys.stderr if stream is None else stream
    self.bar = None
    if console.is_terminal:
      self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=console, transient=True)
    self._task = None

  def __enter__(self) -> "FirstRuns":
    if self.bar is not None:
      self.bar.__enter__()
    return self

  def __exit__(self, *exc) -> None:
    if self.bar is not None:
      self.bar.__exit__(*exc)

  def loop(self, name: str, total: int) -> Callable[[int, int], None]:
    """Announces the first run of the `name` loop over `total` examples; its progress hook."""
    start, shown = self.clock(), [0]
    if self.bar is not None:
      if self._task is not None:
        self.bar.remove_task(self._task)
      self._task = self.bar.add_task(compiling(name), total=total)
    else:
      self._line(f"{compiling(name)} ...")

    def hook(done: int, count: int) -> None:
      first = shown[0] == 0
      if self.bar is not None:
        self.bar.update(self._task, completed=done, description=f"decoding ({name})")
        shown[0] = done
        return
      if first or done == count or done - shown[0] >= LINES_EVERY * count:
        what = "compiled, " if first else ""
        self._line(f"{name}: {what}{done} of {count} examples decoded, "
                   f"{self.clock() - start:.1f} s")
        shown[0] = max(done, 1)
    return hook

  def timing(self, repeats: int) -> None:
    """Announces the timed passes that follow the first runs (no terminal: a line)."""
    if self.bar is None:
      self._line(f"timing {repeats} interleaved passes of both decodes ...")

  def _line(self, text: str) -> None:
    print(text, file=self.stream, flush=True)
