"""`python -m specjax.train --gin_file=...`: gin-configured training from the command line
(`specjax.train.train` with the run file's bindings)."""
from __future__ import annotations

import json
import math
import sys
from typing import Optional, Sequence

import gin

from specjax import command
from specjax.app import gin_config
from specjax.train.trainer import TrainResult, train


def main(argv: Optional[Sequence[str]] = None) -> TrainResult:
  """CLI: `--gin_file` (repeatable), `--gin.NAME=VALUE`, `--gin_search_paths`."""
  files, bindings, paths, rest = gin_config.split_gin_args(
      sys.argv[1:] if argv is None else argv)
  if rest:
    raise ValueError(f"unknown arguments {rest}; use --gin_file, --gin.NAME=VALUE and "
                     "--gin_search_paths")
  if not files:
    raise ValueError("give a run file, e.g. --gin_file=runs/train_lm.gin")
  gin_config.parse(files, bindings, paths)
  result = gin.get_configurable(train)()
  print(summary_line(result))
  return result


def summary_line(result: TrainResult) -> str:
  """The run's last line: JSON of its step, checkpoint, tokens per second and final
  validation metrics, a number that is not finite (a feature head's unmeasured throughput is
  NaN) written as null, so the line is valid JSON."""
  def finite(value):
    if isinstance(value, float) and not math.isfinite(value):
      return None
    if isinstance(value, dict):
      return {k: finite(v) for k, v in value.items()}
    return value
  final = result.evals[-1] if result.evals else {}
  return json.dumps(finite({"step": result.step, "checkpoint": result.checkpoint,
                            "tokens_per_second": result.tokens_per_second,
                            "validation": final}), allow_nan=False)


def cli(argv: Optional[Sequence[str]] = None) -> int:
  """The command: `main` with the project's error contract (`specjax: error: ...`, exit 2;
  130 on Ctrl-C; a traceback only for a defect)."""
  return command.run_cli(main, argv)


if __name__ == "__main__":
  sys.exit(cli())
