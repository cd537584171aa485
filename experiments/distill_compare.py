"""Small-budget comparison of draft distillation recipes: data choice × divergence.

    python -m experiments.distill_compare --pair translate --data_dir data/ \\
        --teacher_data /work/kd/tr_greedy --steps 300 --out /work/kd/cmp_translate

What it runs, its columns and settings: docs/experiments.md, section "distill_compare".
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import gin

from experiments.common.cli import gin_overrides
from experiments.common.output import Output, markdown_table
from specjax import timing
from specjax.app import bundled, gin_config
from specjax.command import run_cli
from specjax.models import read_model_gin
from specjax import train as train_lib
from specjax.train import distill
from specjax.train.trainer import initial_params

RUN_FILES = {"lm": "runs/train_lm_draft.gin", "translate": "runs/train_translate_draft.gin"}
DEFAULT_RECIPES = ("data:kl", "teacher:kl", "data:tv", "teacher:tv")


def _parse(pair: str, model_dir: str, data_dir: str, steps: int, divergence: str,
           bindings: Sequence[str]) -> None:
  gin.clear_config()
  gin_config.parse([RUN_FILES[pair], "runs/distill.gin"], [
      f"MODEL_DIR = {model_dir!r}", f"DATA_DIR = {data_dir!r}",
      f"TEACHER = {str(bundled.PAIRS_DIR / pair / 'target')!r}",
      f"TrainConfig.init_from = {str(bundled.PAIRS_DIR / pair / 'draft')!r}",
      f"NUM_STEPS = {steps}", f"EVAL_EVERY = {steps}", f"CHECKPOINT_EVERY = {steps}",
      "TrainConfig.final_dtype = 'float32'", "TrainConfig.progress = False",
      f"DistillConfig.divergence = {divergence!r}", *bindings])


def _row(name: str, evals: Dict, seconds: Optional[float], steps: int) -> Dict:
  return {"recipe": name, "steps": steps, "train_s": None if seconds is None else round(seconds),
          "perplexity": round(evals["perplexity"], 2), "kl": round(evals["teacher_kl"], 4),
          "alpha_t1": round(1.0 - evals["teacher_tv"], 4),
          "alpha_t0": round(evals["teacher_agree"], 4)}


def evaluate(pair: str, folder: str, data_dir: str, eval_batches: Optional[int]) -> Dict:
  """The draft in `folder` (a model folder or checkpoint) on `data_dir`'s validation batches,
  against the bundled target."""
  _parse(pair, "/nonexistent", data_dir, 1, "kl", [])
  data = gin.get_configurable(train_lib.DataConfig)()
  model_config = read_model_gin(str(bundled.PAIRS_DIR / pair / "draft"))
  dconf = gin.get_configurable(distill.DistillConfig)()
  teacher, teacher_params = distill.load_teacher(dconf, model_config)
  trainer = train_lib.get_trainer(model_config, train_lib.OptimizerConfig(), 1, 1e-4, teacher)
  trainer.teacher_params = teacher_params
  config = train_lib.TrainConfig(model_dir="/nonexistent", num_steps=1, init_from=folder)
  params = initial_params(trainer.model, model_config, config)
  _, val = train_lib.make_batches(data, model_config)
  evals = trainer.evaluate(params, val.eval_batches(eval_batches))
  gin.clear_config()
  return evals


def main(argv: Optional[Sequence[str]] = None) -> List[Dict]:
  bindings, rest = gin_overrides(argv, "see RUN_FILES")
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--pair", required=True, choices=sorted(RUN_FILES))
  p.add_argument("--data_dir", required=True)
  p.add_argument("--teacher_data", required=True)
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--recipes", nargs="*", default=list(DEFAULT_RECIPES),
                 help="DATA:DIVERGENCE, DATA in {data, teacher}, DIVERGENCE in kl/tv/jsd")
  p.add_argument("--eval_data", default=None,
                 help="a data folder whose validation split every row is evaluated on "
                      "(e.g. the target's own outputs on the validation inputs, the text a "
                      "speculative decode verifies); default: --data_dir")
  p.add_argument("--eval_batches", type=int, default=50)
  p.add_argument("--out", required=True)
  args = p.parse_args(rest)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  seconds_path = out / "train_seconds.json"
  seconds = json.loads(seconds_path.read_text()) if seconds_path.is_file() else {}
  for recipe in args.recipes:  # train (each resumable; a finished one is skipped)
    source, divergence = recipe.split(":")
    model_dir = out / recipe.replace(":", "_")
    if train_lib.list_checkpoints(str(model_dir))[-1:] == [args.steps]:
      continue
    data_dir = {"data": args.data_dir, "teacher": args.teacher_data}[source]
    _parse(args.pair, str(model_dir), data_dir, args.steps, divergence, bindings)
    seconds[recipe] = timing.timed(gin.get_configurable(train_lib.train))[1]
    seconds_path.write_text(json.dumps(seconds, indent=1))
  eval_data = args.eval_data or args.data_dir
  rows = [_row("shipped draft", evaluate(args.pair, str(bundled.PAIRS_DIR / args.pair / "draft"),
                                         eval_data, args.eval_batches), None, 0)]
  for recipe in args.recipes:
    source, divergence = recipe.split(":")
    model_dir = str(out / recipe.replace(":", "_"))
    rows.append(_row(f"{source} + {divergence}",
                     evaluate(args.pair, model_dir, eval_data, args.eval_batches),
                     seconds.get(recipe), args.steps))
    print(json.dumps(rows[-1]), flush=True)
  written = Output(out, "compare")
  written.json(rows)
  md = markdown_table(rows, cell=str)
  written.markdown(md)
  print(md)
  return rows


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
