"""Recipe: train the shipped target / draft pairs on the prepared Debian data.

    python -m experiments.train_bundled --data_dir data/ --out /tmp/pairs
    python -m experiments.train_bundled --data_dir data/ --out /tmp/pairs --only lm_draft
    python -m experiments.train_bundled --data_dir data/ --measure 5   # tokens/s only

Four models, each one gin run file under gin/runs/ (the hyperparameters live there):

  lm_target         runs/train_lm_target.gin         decoder-only, ~14M parameters
  lm_draft          runs/train_lm_draft.gin          decoder-only, ~1.4M
  translate_target  runs/train_translate_target.gin  T5 1.1 EN->DE, ~10M
  translate_draft   runs/train_translate_draft.gin   T5 1.1 EN->DE, ~1.8M

Each trains into OUT/NAME (resumable: rerun the same command after an
interruption), with its model.gin beside the checkpoints; the final checkpoint
is bfloat16. `--measure N` instead runs N steps of each in a temporary folder
and prints the steady-state training throughput (non-padding target tokens per
second, compilation excluded) and what the configured run would take at that
rate. Extra `--gin.NAME=VALUE` flags are applied to every model.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import gin

from specjax import gin_config
from specjax import train as train_lib
from specjax.params import count_params

RUNS = {
    "lm_target": "runs/train_lm_target.gin",
    "lm_draft": "runs/train_lm_draft.gin",
    "translate_target": "runs/train_translate_target.gin",
    "translate_draft": "runs/train_translate_draft.gin",
}


def run_one(name: str, model_dir: str, data_dir: Optional[str],
            bindings: Sequence[str] = (), measure_steps: Optional[int] = None,
            progress: bool = True) -> Dict:
  """Trains (or, with `measure_steps`, times) one shipped model; returns a summary dict."""
  if name not in RUNS:
    raise ValueError(f"unknown run {name!r}; expected one of {sorted(RUNS)}")
  gin.clear_config()
  extra = [f"MODEL_DIR = {model_dir!r}", f"DATA_DIR = {data_dir!r}",
           f"TrainConfig.progress = {progress}"]
  configured_steps = None
  if measure_steps is not None:
    gin_config.parse([RUNS[name]], [])
    configured_steps = gin.query_parameter("%NUM_STEPS")
    gin.clear_config()
    extra += [f"NUM_STEPS = {measure_steps}", "EVAL_EVERY = 0", f"CHECKPOINT_EVERY = {10**9}",
              "TrainConfig.eval_batches = 1", "TrainConfig.log_every = 1",
              "TrainConfig.final_dtype = 'float32'"]
  gin_config.parse([RUNS[name]], [*extra, *bindings])
  start = time.perf_counter()
  result = train_lib.train()
  seconds = time.perf_counter() - start
  steps = result.step - result.start_step
  tokens = sum(h["tokens"] for h in result.history)
  summary = {
      "name": name, "gin_file": RUNS[name], "model_dir": model_dir,
      "params": count_params(result.params), "steps": steps, "wall_seconds": seconds,
      "tokens_per_second": result.tokens_per_second,
      "target_tokens_per_step": tokens / max(steps, 1),
      "batch_size": result.data.batch_size,
      "validation": result.evals[-1] if result.evals else None,
      "checkpoint": result.checkpoint,
  }
  if configured_steps is not None:
    summary["configured_steps"] = configured_steps
    summary["projected_hours"] = (configured_steps * summary["target_tokens_per_step"]
                                  / result.tokens_per_second / 3600.0)
  return summary


def main(argv: Optional[Sequence[str]] = None) -> List[Dict]:
  """CLI (see the module docstring)."""
  files, bindings, _, rest = gin_config.split_gin_args(sys.argv[1:] if argv is None else argv)
  if files:
    raise ValueError("the runs are fixed (see RUNS); pass --gin.NAME=VALUE overrides only")
  parser = argparse.ArgumentParser(prog="python -m experiments.train_bundled",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--data_dir", default="data",
                      help="prepared data (python -m specjax.data prepare --out DIR)")
  parser.add_argument("--out", help="one sub-folder per model (required unless --measure)")
  parser.add_argument("--only", action="append", choices=sorted(RUNS),
                      help="train only these (repeatable); default: all four")
  parser.add_argument("--measure", type=int, metavar="N",
                      help="time N training steps of each model instead of training")
  args = parser.parse_args(rest)
  if args.measure is None and not args.out:
    parser.error("--out is required unless --measure is given")
  if args.measure is not None and args.measure < 2:
    parser.error("--measure needs at least 2 steps (the first one compiles)")
  if not Path(args.data_dir, "lm_ddtp_en", "train.txt").is_file():
    parser.error(f"no prepared data under {args.data_dir}: run "
                 "`python -m specjax.data prepare --out DIR` first")
  summaries = []
  for name in args.only or list(RUNS):
    if args.measure is not None:
      with tempfile.TemporaryDirectory() as tmp:
        summary = run_one(name, tmp, args.data_dir, bindings, args.measure, progress=False)
    else:
      summary = run_one(name, str(Path(args.out) / name), args.data_dir, bindings)
    summaries.append(summary)
    print(json.dumps(summary), flush=True)
  if args.out:
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n")
  return summaries


if __name__ == "__main__":
  main()
