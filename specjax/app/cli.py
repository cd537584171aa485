"""The `specjax` command's surface: its flags, a --help that lists the bundled gin files,
and the contract every entry point keeps (`run_cli`): a user's error as one line
`specjax: error: ...` with exit status 2, Ctrl-C as exit status 130, a traceback only for
a defect."""
from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
import traceback
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

from specjax import distributed
from specjax.app import display
from specjax.app.gin_config import GIN_DIR

USAGE_ERRORS = (ValueError, OSError, NameError, ImportError)
"""What a user's input raises (a bad path, gin file, binding or value, a vocabulary or task
mismatch); anything else is a bug and keeps its traceback."""

EXIT_USAGE = 2
"""The exit status of a usage error (argparse's)."""

EXIT_INTERRUPTED = 130
"""The exit status after Ctrl-C (128 + SIGINT, as a shell reports it)."""

PROG = "specjax"

_GIN_CONTEXT = re.compile(r"^\s*In call to configurable ")


def one_line(error: BaseException) -> str:
  """The error's message on one line, without gin's 'In call to configurable' notes, its
  control characters shown as escapes (a message may quote user text)."""
  lines = [l.strip() for l in str(error).splitlines()
           if l.strip() and not _GIN_CONTEXT.match(l)]
  return display.printable(" ".join(lines) or type(error).__name__)


def report_error(error: BaseException, verbose: bool = False) -> int:
  """Prints a user's error as `specjax: error: ...` on stderr (the traceback first when
  `verbose`); returns EXIT_USAGE."""
  if verbose:
    traceback.print_exception(error)
  print(f"{PROG}: error: {one_line(error)}", file=sys.stderr, flush=True)
  return EXIT_USAGE


def exit_interrupted() -> None:
  """Ends the process after Ctrl-C: says so, flushes, and exits 130 at once.

  The exit is `os._exit`: an interrupt can land while XLA's threads still run work that
  the interpreter's teardown would free under them (a segfault at exit, -11 instead of
  130). Nothing is left to save: every output is written atomically or not at all."""
  print(f"{PROG}: interrupted", file=sys.stderr)
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(EXIT_INTERRUPTED)


def run_cli(job: Callable[[List[str]], Any], argv: Optional[Sequence[str]] = None) -> int:
  """Runs `job(argv)` as a command: its status when it returns an int (else 0), EXIT_USAGE with one line for a user's
  error (USAGE_ERRORS; `--verbose` in argv adds the traceback), 130 on Ctrl-C; any other
  exception is a defect and propagates with its traceback."""
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    result = job(argv)
  except KeyboardInterrupt:
    exit_interrupted()
  except USAGE_ERRORS as e:
    return report_error(e, "--verbose" in argv)
  return result if isinstance(result, int) and not isinstance(result, bool) else 0


def check_positive(values: Any, names: Sequence[str], minimum: int = 1) -> None:
  """ValueError naming the first of `names` (attributes of `values`) below `minimum`."""
  for name in names:
    value = getattr(values, name)
    if value is not None and value < minimum:
      raise ValueError(f"--{name} must be at least {minimum}, got {value}")


def _first_comment(path: Path) -> str:
  for line in path.read_text(encoding="utf-8").splitlines():
    if line.startswith("#"):
      return line.lstrip("# ").strip()
  return ""


def gin_listing(gin_dir: Path = GIN_DIR) -> str:
  """The bundled gin files, for --help: runs with their first comment line, then names."""
  lines = [f"bundled gin files (in {gin_dir}; --gin_file=NAME;",
           "  runs/train_*.gin and runs/distill.gin are for python -m specjax.train):"]
  runs = sorted((gin_dir / "runs").glob("*.gin"))
  width = max((len(f"runs/{p.name}") for p in runs), default=0)
  for p in runs:
    about = textwrap.shorten(_first_comment(p), 96 - width, placeholder=" ...")
    lines.append(f"  {'runs/' + p.name:<{width}}  {about}")
  for folder in ("models", "decoding"):
    names = ", ".join(sorted(p.name for p in (gin_dir / folder).glob("*.gin")))
    lines += textwrap.wrap(names, 96, initial_indent=f"  {folder}/: ", subsequent_indent="    ")
  return "\n".join(lines)


GIN_HELP = """gin, the T5X way (parsed before the flags above):
  --gin_file=FILE            a gin file (repeatable), found on --gin_search_paths, then in
                             specjax's gin/ folder, then in the working directory
  --gin.NAME=VALUE           a binding, e.g. --gin.GAMMA=5 --gin.TARGET_CHECKPOINT="'/ckpt'"
  --gin_search_paths=A,B     more folders for gin files and their includes
macros read by runs/decode.gin: TARGET_CHECKPOINT, DRAFT_CHECKPOINT, TARGET_MODEL,
  DRAFT_MODEL, VOCABULARY, DRAFT_VOCABULARY, MIXTURE_OR_TASK_NAME, MIXTURE_OR_TASK_MODULE,
  TASK_FEATURE_LENGTHS, GAMMA, MAX_NEW_TOKENS, BATCH_SIZE, OUTPUT_DIR, WRITE_SCORES,
  WEIGHTS_DTYPE, NUM_PARTITIONS (see README, "Use your own T5X checkpoints")."""


def build_parser(description: Optional[str]) -> argparse.ArgumentParser:
  """The command's flags (the gin flags are split off before it parses)."""
  parser = argparse.ArgumentParser(
      prog="specjax", description=description,
      epilog=GIN_HELP + "\n\n" + gin_listing(),
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--prompt", action="append", help="an input text (repeatable)")
  parser.add_argument("--input_file", help="a UTF-8 text file, one input per line")
  parser.add_argument("--task", help="NAME[:SPLIT]: a bundled split (translate_en_de, "
                      "summarize_ddtp, lm_ddtp_en) or a registered seqio task or mixture "
                      "(gin: MIXTURE_OR_TASK_NAME)")
  parser.add_argument("--num_examples", type=int, default=16,
                      help="examples read from --task (default 16)")
  parser.add_argument("--prompt_words", type=int, default=12,
                      help="words of each language-modelling document used as its prompt")
  parser.add_argument("--plain", action="store_true", help="no colours in the trace")
  parser.add_argument("--verbose", action="store_true",
                      help="on an error, show the full traceback")
  distributed.add_arguments(parser)
  return parser


def check_counts(parser: argparse.ArgumentParser, args: argparse.Namespace,
                 names: List[str]) -> None:
  """parser.error (exit 2) for a count flag below 1."""
  for name in names:
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
