"""What the main job says while its first runs compile and decode (`specjax.app.progress`)."""
import io

from rich.console import Console

from specjax.app import progress


class Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_without_a_terminal_lines_say_what_compiles_then_how_far_decoding_got():
  clock, err = Clock(), io.StringIO()
  report = Console(file=io.StringIO())  # stdout piped: not a terminal
  with progress.FirstRuns(report, stream=err, clock=clock) as runs:
    hook = runs.loop("autoregressive", 16)
    clock.now += 21.25
    for done in (2, 4, 6, 8, 10, 12, 14, 16):  # batch_size 2: a call per two examples
      hook(done, 16)
    runs.loop("speculative", 16)(16, 16)
    runs.timing(3)
  assert err.getvalue().splitlines() == [
      "compiling the autoregressive loop (first run; cached after) ...",
      "autoregressive: compiled, 2 of 16 examples decoded, 21.2 s",
      "autoregressive: 6 of 16 examples decoded, 21.2 s",   # a line per further quarter
      "autoregressive: 10 of 16 examples decoded, 21.2 s",
      "autoregressive: 14 of 16 examples decoded, 21.2 s",
      "autoregressive: 16 of 16 examples decoded, 21.2 s",  # and at the end
      "compiling the speculative loop (first run; cached after) ...",
      "speculative: compiled, 16 of 16 examples decoded, 0.0 s",
      "timing 3 interleaved passes of both decodes ...",
  ]
  assert report.file.getvalue() == ""  # the report's stream holds only the report


def test_on_a_terminal_the_bar_names_the_loop_compiling_with_the_time_elapsed():
  screen = io.StringIO()
  console = Console(file=screen, force_terminal=True, width=120)
  err = io.StringIO()
  with progress.FirstRuns(console, stream=err) as runs:
    runs.loop("speculative", 4)
    runs.bar.refresh()
    columns = [type(c).__name__ for c in runs.bar.columns]
    first = runs.bar.tasks[0].description
    runs.loop("speculative", 4)(2, 4)
    later = runs.bar.tasks[0].description
  assert first == "compiling the speculative loop (first run; cached after)"
  assert "TimeElapsedColumn" in columns and later == "decoding (speculative)"
  assert "compiling the speculative loop" in screen.getvalue() and err.getvalue() == ""
