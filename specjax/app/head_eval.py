"""`python -m specjax.app.head_eval --gin_file=RUN --heads NAME=HEAD,... [--checkpoints DIR]`:
feature heads and a run's checkpoints judged on held-out text side by side
(`specjax.train.head_eval`, whose docstring says what is measured)."""
from __future__ import annotations

import json
import sys
from typing import Optional, Sequence

import gin

from specjax import command
from specjax.app import gin_config
from specjax.train.batches import DataConfig
from specjax.train.feature_head import FeatureHeadTraining
from specjax.train.head_eval import checkpoint_heads, evaluate_heads, format_line, parse_heads


def main(argv: Optional[Sequence[str]] = None) -> int:
  """CLI; see the module docstring."""
  files, bindings, paths, rest = gin_config.split_gin_args(
      sys.argv[1:] if argv is None else argv)
  p = command.ArgumentParser(prog="python -m specjax.app.head_eval",
                             description=__doc__.split("\n")[1])
  p.add_argument("--heads", default=None,
                 help="NAME=HEAD,...: head folders, checkpoint_N folders in them or bundled "
                      "names")
  p.add_argument("--checkpoints", default=None,
                 help="a head's run folder: every checkpoint_N in it, named 'step N'")
  p.add_argument("--max_batches", type=int, default=None,
                 help="validation batches per head (default: the whole split)")
  p.add_argument("--output", default=None, help="also write the records here (JSON)")
  args = p.parse_args(rest)
  if not files:
    raise ValueError("give the heads' run file, e.g. --gin_file=runs/train_lm_eagle3.gin")
  if args.max_batches is not None and args.max_batches < 1:
    raise ValueError(f"--max_batches must be >= 1, got {args.max_batches}")
  heads = (parse_heads(args.heads) if args.heads else []) + (
      checkpoint_heads(args.checkpoints) if args.checkpoints else [])
  if not heads:
    raise ValueError("give --heads NAME=HEAD,... and/or --checkpoints MODEL_DIR")
  gin_config.parse(files, bindings, paths)
  records = evaluate_heads(heads, gin.get_configurable(DataConfig)(),
                           gin.get_configurable(FeatureHeadTraining)(), args.max_batches)
  for record in records:
    print(format_line(record), flush=True)
  best = max(records, key=lambda r: r["chain_tokens_estimate"])
  print(f"highest chain estimate: {best['name']} ({best['chain_tokens_estimate']:.2f})")
  text = json.dumps(records, indent=1)
  if args.output:
    with open(args.output, "w", encoding="utf-8") as f:
      f.write(text + "\n")
  print(text)
  return 0


def cli(argv: Optional[Sequence[str]] = None) -> int:
  """The command: `main` with the project's error contract (`specjax: error: ...`, exit 2;
  130 on Ctrl-C)."""
  return command.run_cli(main, argv)


if __name__ == "__main__":
  sys.exit(cli())
