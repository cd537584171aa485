"""The contract every specjax command keeps, and how it shows a user's text.

A user's error (a bad path, value, gin file or binding) is one line on stderr,
`specjax: error: ...`, and exit status 2 (`--verbose` adds the traceback); Ctrl-C ends the
command with status 130; only a defect shows a traceback. `run_cli` gives any command
function this contract and `ArgumentParser` gives argparse's own errors the same line.

Text a user gave can hold anything: `printable` shows control characters (and the
bidirectional overrides that reorder what a reader sees) as visible escapes (`\\x1b`,
`\\n`, `\\u202e`), and `shorten` cuts a long one to its head and tail (a 1 MB prompt is
not echoed whole).
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import traceback
import unicodedata
from typing import Any, Callable, List, Optional, Sequence

PROG = "specjax"

USAGE_ERRORS = (ValueError, OSError, NameError, ImportError)
"""What a user's input raises (a bad path, gin file, binding or value, a vocabulary or task
mismatch, a full disk); anything else is a defect and keeps its traceback."""

EXIT_USAGE = 2
"""The exit status of a user's error (argparse's)."""

EXIT_INTERRUPTED = 130
"""The exit status after Ctrl-C (128 + SIGINT, as a shell reports it)."""

SHOWN_CHARS = 1000
"""The longest text shown whole; a longer one is cut to its head and tail."""

_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_GIN_CONTEXT = re.compile(r"^\s*In call to configurable ")


def _visible(ch: str) -> str:
  if ch == "\n":
    return "\\n"
  if ch == "\t":
    return "\\t"
  code = ord(ch)
  return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
  """str(value) with control characters (and bidi overrides) as visible escapes."""
  s = str(value)
  if s.isprintable():
    return s
  return "".join(_visible(ch) if unicodedata.category(ch) == "Cc" or ch in _BIDI
                 or 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in s)


def shorten(value: object, limit: int = SHOWN_CHARS) -> str:
  """str(value), or when longer than `limit` its head and tail around a note of how many
  characters were left out."""
  s = str(value)
  if len(s) <= limit:
    return s
  keep = limit // 2
  return f"{s[:keep]} … [{len(s) - 2 * keep} characters not shown] … {s[-keep:]}"


def one_line(error: BaseException) -> str:
  """The error's message on one line, without gin's 'In call to configurable' notes, its
  control characters shown as escapes and a very long one shortened (a message may quote
  user text)."""
  lines = [l.strip() for l in str(error).splitlines()
           if l.strip() and not _GIN_CONTEXT.match(l)]
  return printable(shorten(" ".join(lines) or type(error).__name__))


class ArgumentParser(argparse.ArgumentParser):
  """argparse with the project's error line: usage, then `specjax: error: ...`, exit 2."""

  def error(self, message: str):
    self.print_usage(sys.stderr)
    self.exit(EXIT_USAGE, f"{PROG}: error: {printable(shorten(message))}\n")


def report_error(error: BaseException, verbose: bool = False) -> int:
  """Prints a user's error as `specjax: error: ...` on stderr (the traceback first when
  `verbose`); returns EXIT_USAGE."""
  if verbose:
    traceback.print_exception(error)
  print(f"{PROG}: error: {one_line(error)}", file=sys.stderr, flush=True)
  return EXIT_USAGE


def exit_interrupted() -> None:
  """Ends the process after Ctrl-C: says so, flushes, and exits 130 at once.

  The exit is `os._exit`, without the interpreter's teardown. A KeyboardInterrupt raised
  while one of jaxlib's extension modules was being imported leaves that module half made;
  the teardown then frees it (nanobind's `nb_module_free`) and the process dies by SIGSEGV
  after saying it was interrupted (-11 instead of 130). Nothing is left to save: every
  output is written atomically or not at all. A progress display interrupted while it
  started may leave sys.stderr redirected into the display (rich's proxy, which writes to
  stdout): the message goes to the file behind it."""
  stderr = getattr(sys.stderr, "rich_proxied_file", sys.stderr)
  print(f"{PROG}: interrupted", file=stderr)
  for stream in (sys.stdout, sys.stderr, stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(EXIT_INTERRUPTED)


def _on_interrupt(signum, frame) -> None:
  """SIGINT: KeyboardInterrupt, except inside an import, where unwinding a half-imported
  extension module crashes the process (see `exit_interrupted`): exit at once there."""
  while frame is not None:
    if frame.f_code.co_filename.startswith("<frozen importlib"):
      exit_interrupted()
    frame = frame.f_back
  raise KeyboardInterrupt


def run_cli(job: Callable[[List[str]], Any], argv: Optional[Sequence[str]] = None) -> int:
  """Runs `job(argv)` as a command: its status when it returns an int (else 0), EXIT_USAGE
  with one line for a user's error (USAGE_ERRORS; `--verbose` in argv adds the traceback),
  130 on Ctrl-C (the process ends there); any other exception is a defect and propagates
  with its traceback."""
  argv = list(sys.argv[1:] if argv is None else argv)
  previous = None
  if (threading.current_thread() is threading.main_thread()
      and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
    previous = signal.signal(signal.SIGINT, _on_interrupt)
  try:
    result = job(argv)
  except KeyboardInterrupt:
    exit_interrupted()
  except USAGE_ERRORS as e:
    return report_error(e, "--verbose" in argv)
  finally:
    if previous is not None:
      signal.signal(signal.SIGINT, previous)
  return result if isinstance(result, int) and not isinstance(result, bool) else 0
