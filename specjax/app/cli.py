"""The `specjax` command's surface: its flags, a --help that lists the bundled gin files,
and the contract every command keeps (`specjax.command`, re-exported here): a user's error
as one line `specjax: error: ...` with exit status 2, Ctrl-C as exit status 130, a
traceback only for a defect."""
from __future__ import annotations

import argparse
import re
import textwrap
from pathlib import Path
from typing import List, Optional

from specjax.runtime import compile_cache, distributed
from specjax.app.gin_config import GIN_DIR
from specjax.command import (EXIT_INTERRUPTED, EXIT_USAGE, USAGE_ERRORS,  # noqa: F401
                             ArgumentParser, one_line, report_error, run_cli)

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


def _run_file_macros(gin_dir: Path = GIN_DIR) -> List[str]:
  """The macros runs/decode.gin binds (its top-level `NAME = value` lines), in order."""
  text = (gin_dir / "runs" / "decode.gin").read_text(encoding="utf-8")
  return re.findall(r"^([A-Z][A-Z0-9_]*)\s*=", text, re.M)


GIN_HELP = """gin, the T5X way (parsed before the flags above):
  --gin_file=FILE            a gin file (repeatable): a path, or relative to the working folder
                             or specjax's gin/ folder (a name in both is refused); a settings
                             file alone (decoding/sampling.gin) applies on top of the default
  --gin.NAME=VALUE           a binding, e.g. --gin.GAMMA=5 --gin.TARGET_CHECKPOINT="'/ckpt'"
  --gin_search_paths=A,B     folders of model gin files (TARGET_MODEL, DRAFT_MODEL, their
                             includes): read by a parser that runs nothing
""" + textwrap.fill("macros of runs/decode.gin: " + ", ".join(_run_file_macros()) +
                    ' (see README, "Your own T5X checkpoints", and docs/main_job.md).', 92,
                    subsequent_indent="  ")


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
  compile_cache.add_arguments(parser)
  distributed.add_arguments(parser)
  return parser


def check_counts(parser: argparse.ArgumentParser, args: argparse.Namespace,
                 names: List[str]) -> None:
  """parser.error (exit 2) for a count flag below 1."""
  for name in names:
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
