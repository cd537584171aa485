"""The experiment scripts' one command line: T5X-style gin flags plus --pair, --fast, --seed,
--output_dir, the weight dtypes and a script's own flags; `cli_main` makes a script's `main`."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import gin

from experiments.common.pairs import Pair, load_pair, pair_from_gin, with_weights
from specjax.app import bundled, gin_config
from specjax.params import DRAFT_WEIGHTS_DTYPES, WEIGHTS_DTYPES

@dataclasses.dataclass
class Cli:
  pairs: List[Pair]
  output_dir: Path
  fast: bool
  flags: Dict[str, Any] = dataclasses.field(default_factory=dict)
  """The module's own flags (`parse_cli`'s `flags`), by destination name."""
  seed: int = 0
  gin: Tuple[List[str], List[str], List[str]] = ([], [], [])
  """The gin files, bindings and search paths given (`gin_config.parse`'s arguments)."""

  @property
  def args(self) -> argparse.Namespace:
    """The module's own flags as attributes."""
    return argparse.Namespace(**self.flags)


def parse_cli(argv: Optional[Sequence[str]], description: str, name: str,
              default_pairs: Sequence[str] = ("lm", "translate"),
              needs_pairs: Union[bool, Callable[[Dict[str, Any]], bool]] = True,
              flags: Optional[Dict[str, Dict[str, Any]]] = None,
              weights_dtype: str = "float32", fast: Optional[Dict[str, Any]] = None) -> Cli:
  """gin flags (T5X style) plus --pair (repeatable), --fast and --output_dir.

  `--fast` asks for the module's FAST settings (tests, smoke runs); they win over
  gin. Pairs are loaded before the experiment's own gin settings are parsed
  again, since a preset pair parses its own model gin files.
  flags: the module's own flags, '--name' -> `argparse.add_argument` keywords (in Cli.flags);
  needs_pairs: whether pairs are loaded, or a function of those flags (and 'pair', the
    --pair values) that says so (False: no --pair flag);
  weights_dtype: --weights_dtype's default (None: no weight dtype flags);
  fast: own flags' values under --fast (by destination name), where a flag keeps its default.
  """
  argv = sys.argv[1:] if argv is None else list(argv)
  files, bindings, paths, rest = gin_config.split_gin_args(argv)
  parser = argparse.ArgumentParser(description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  if needs_pairs is not False:
    parser.add_argument("--pair", action="append", choices=sorted(bundled.PAIRS),
                        help="a preset pair (repeatable; default: both)")
  parser.add_argument("--fast", action="store_true", help="tiny settings (tests, smoke runs)")
  parser.add_argument("--output_dir", default=f"out/experiments/{name}")
  parser.add_argument("--seed", type=int, default=0)
  if weights_dtype is not None:
    add_weights_flags(parser, weights_dtype)
  actions = [parser.add_argument(flag, **kwargs) for flag, kwargs in (flags or {}).items()]
  args = parser.parse_args(rest)
  own = {action.dest: getattr(args, action.dest) for action in actions}
  for dest, value in (fast or {}).items() if args.fast else ():
    if own[dest] == parser.get_default(dest):
      own[dest] = value
  if callable(needs_pairs):
    needs_pairs = needs_pairs({**own, "pair": args.pair})
  pair_names = list(getattr(args, "pair", None) or [])

  def reparse():
    gin.clear_config()
    gin_config.parse(files, bindings, paths)

  reparse()
  pairs = []
  if needs_pairs:
    if isinstance(gin_config.query_macro("TARGET_MODEL"), str):
      if pair_names:
        raise ValueError("give either --pair or TARGET_MODEL/DRAFT_MODEL in gin, not both")
      pairs = [pair_from_gin(args.seed)]
    else:
      for pair_name in pair_names or default_pairs:
        pairs.append(load_pair(pair_name, args.seed))
      reparse()
  if weights_dtype is not None:
    pairs = [with_weights(pair, args.weights_dtype, args.draft_weights_dtype) for pair in pairs]
  return Cli(pairs=pairs, output_dir=Path(args.output_dir), fast=args.fast, flags=own,
             seed=args.seed,
             gin=(list(files), list(bindings), list(paths)))


def add_weights_flags(parser: argparse.ArgumentParser, default: str = "float32") -> None:
  """--weights_dtype (the target's, default `default`) and --draft_weights_dtype: the dtypes
  the pair's dense kernels and embedding run in (`with_weights`)."""
  parser.add_argument("--weights_dtype", choices=sorted(WEIGHTS_DTYPES), default=default,
                      help="run the target's dense kernels and embedding in this dtype "
                      "(cast once)")
  parser.add_argument("--draft_weights_dtype", choices=sorted(DRAFT_WEIGHTS_DTYPES),
                      default="float32", help="the same for the draft model (also int8)")


def cli_main(run: Callable[..., Any], name: str, description: str, fast: Dict[str, Any],
             **parse_kwargs: Any) -> Callable[[Optional[Sequence[str]]], Any]:
  """The `main(argv=None)` of a gin-configured experiment: `parse_cli(argv, description, name,
  **parse_kwargs)`, then `run(cli)`, with the `fast` settings under --fast."""
  def main(argv: Optional[Sequence[str]] = None) -> Any:
    cli = parse_cli(argv, description, name, **parse_kwargs)
    return run(cli, **(fast if cli.fast else {}))
  return main


def gin_overrides(argv: Optional[Sequence[str]], runs: str) -> Tuple[List[str], List[str]]:
  """(--gin.NAME=VALUE bindings, the other arguments) of a module whose gin run files are
  fixed (`runs` names them in the error); ValueError on --gin_file."""
  files, bindings, _, rest = gin_config.split_gin_args(sys.argv[1:] if argv is None else argv)
  if files:
    raise ValueError(f"the run files are fixed ({runs}); pass --gin.NAME=VALUE overrides only")
  return list(bindings), list(rest)
