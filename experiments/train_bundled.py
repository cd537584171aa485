"""Recipe: train the shipped target / draft pairs on the prepared Debian data.

    python -m experiments.train_bundled --data_dir data/ --out /tmp/pairs
    python -m experiments.train_bundled --data_dir data/ --out /tmp/pairs --only lm_draft
    python -m experiments.train_bundled --data_dir data/ --measure 5   # tokens/s only
    python -m experiments.train_bundled --ship /tmp/pairs   # copy into specjax/assets/pairs

What it runs, its columns and settings: docs/experiments.md, section "train_bundled".
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import gin
import numpy as np

from experiments.common.cli import gin_overrides
from specjax import checkpoints, timing
from specjax.app import bundled, gin_config
from specjax import train as train_lib
from specjax.command import run_cli
from specjax.params import count_params, flatten

RUNS = {
    "lm_target": "runs/train_lm_target.gin",
    "lm_draft": "runs/train_lm_draft.gin",
    "translate_target": "runs/train_translate_target.gin",
    "translate_draft": "runs/train_translate_draft.gin",
    "lm_tiny": "runs/train_lm_tiny.gin",
    "lm_draft_distilled": "runs/distill_lm_draft.gin",
    "translate_draft_distilled": "runs/distill_translate_draft.gin",
    "lm_eagle": "runs/train_lm_eagle.gin",
    "translate_eagle": "runs/train_translate_eagle.gin",
    "lm_eagle3": "runs/train_lm_eagle3.gin",
    "lm_eagle3_no_ttt": "runs/train_lm_eagle3_no_ttt.gin",
    "lm_eagle3_past_eos": "runs/train_lm_eagle3_past_eos.gin",
    "translate_eagle3": "runs/train_translate_eagle3.gin",
}
# Distilled drafts learn from OUT/TEACHER (train it first).
TEACHERS = {"lm_draft_distilled": "lm_target", "translate_draft_distilled": "translate_target"}
DEFAULT_RUNS = ("lm_target", "lm_draft", "translate_target", "translate_draft")
SHIP = {  # run name -> (pair, role) under specjax.app.bundled.PAIRS_DIR
    "lm_target": ("lm", "target"), "lm_draft": ("lm", "draft"), "lm_tiny": ("lm", "tiny"),
    "translate_target": ("translate", "target"), "translate_draft": ("translate", "draft"),
    "lm_draft_distilled": ("lm", "draft"), "translate_draft_distilled": ("translate", "draft"),
    "lm_eagle": ("lm", "eagle"), "translate_eagle": ("translate", "eagle"),
    "lm_eagle3": ("lm", "eagle3"), "lm_eagle3_no_ttt": ("lm", "eagle3"),
    "lm_eagle3_past_eos": ("lm", "eagle3"),
    "translate_eagle3": ("translate", "eagle3"),
}
DEFAULT_SHIP = ("lm_target", "lm_draft", "lm_tiny", "translate_target", "translate_draft")


def ship(source: Path, dest: Path = bundled.PAIRS_DIR,
         names: Sequence[str] = DEFAULT_SHIP) -> List[Dict]:
  """Copies FROM/NAME's final checkpoint (+ model.gin, a feature head's token_ranking.npy,
  train_summary.json) into dest/PAIR/ROLE.

  The copy is written to a temporary folder beside the destination and renamed
  into place, so an interrupted ship never leaves a half-written model behind.
  """
  taken = {}
  for name in names:
    if SHIP[name] in taken:
      raise ValueError(f"{taken[SHIP[name]]} and {name} would both ship as {SHIP[name]}")
    taken[SHIP[name]] = name
  summaries = {}
  if (source / "summary.json").is_file():
    summaries = {s["name"]: s for s in json.loads((source / "summary.json").read_text())}
  shipped = []
  for name in names:
    model_dir = source / name
    if not model_dir.is_dir():
      print(f"skip {name}: {model_dir} missing")
      continue
    steps = train_lib.list_checkpoints(str(model_dir))
    if not steps:
      raise FileNotFoundError(f"no complete checkpoint_N under {model_dir}")
    ckpt = model_dir / f"checkpoint_{steps[-1]}"
    records = [json.loads(l) for l in (model_dir / "metrics.jsonl").read_text().splitlines()
               if l.strip()]
    train = [r for r in records if r.get("split") == "train"]
    evals = [r for r in records if r.get("split") == "validation"]
    # A resumed run logs its resumed steps twice; count each step once (the last log).
    by_step = {r["step"]: r for r in train}
    params = checkpoints.load_t5x(str(ckpt))
    info = {"name": name, "gin_files": list(_files(name)), "teacher": TEACHERS.get(name),
            "steps": int(ckpt.name.split("_")[1]),
            "train_tokens": int(sum(r["tokens"] for r in by_step.values())),
            # Time in train steps (from the logged tokens/s), evals and restarts excluded.
            "train_seconds": (round(sum(r["tokens"] / r["tokens_per_second"]
                                        for r in by_step.values()
                                        if r.get("tokens_per_second")), 1)
                              if any(r.get("tokens_per_second") for r in by_step.values())
                              else None),  # a feature head's run logs no throughput
            "wall_seconds": summaries.get(name, {}).get("wall_seconds"),
            "params": count_params(params),
            "validation": evals[-1] if evals else None}
    pair, role = SHIP[name]
    final = dest / pair / role
    tmp = dest / pair / f".{role}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy(model_dir / "model.gin", tmp / "model.gin")
    if (model_dir / train_lib.RANKING_FILE).is_file():  # a feature head's token ranking
      shutil.copy(model_dir / train_lib.RANKING_FILE, tmp / train_lib.RANKING_FILE)
    if any(np.asarray(v).dtype == np.float32 for _, v in flatten(params)):
      checkpoints.save_t5x(params, str(tmp), step=info["steps"], dtype="bfloat16")
    else:
      shutil.copytree(ckpt, tmp / ckpt.name,
                      ignore=shutil.ignore_patterns("optimizer_state.npz"))
    (tmp / "train_summary.json").write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    shipped.append(info)
    print(f"shipped {name} -> {final} ({ckpt.name})")
  return shipped


def _files(name: str) -> Tuple[str, ...]:
  return (RUNS[name],) if isinstance(RUNS[name], str) else RUNS[name]


def run_one(name: str, model_dir: str, data_dir: Optional[str],
            bindings: Sequence[str] = (), measure_steps: Optional[int] = None,
            progress: bool = True, out: Optional[str] = None) -> Dict:
  """Trains (or, with `measure_steps`, times) one shipped model; returns a summary dict.

  A distilled run (TEACHERS) reads its teacher from OUT/TEACHER (`out`).
  """
  if name not in RUNS:
    raise ValueError(f"unknown run {name!r}; expected one of {sorted(RUNS)}")
  gin.clear_config()
  extra = [f"MODEL_DIR = {model_dir!r}", f"DATA_DIR = {data_dir!r}",
           f"TrainConfig.progress = {progress}"]
  if name in TEACHERS:
    teacher = Path(out or "") / TEACHERS[name]
    if out is None or not (teacher / "model.gin").is_file():
      raise FileNotFoundError(f"{name} distills from {TEACHERS[name]}: train it into "
                              f"OUT/{TEACHERS[name]} first (--out, here {out})")
    extra.append(f"TEACHER = {str(teacher)!r}")
  configured_steps = None
  if measure_steps is not None:
    gin_config.parse(list(_files(name)), extra[-1:] if name in TEACHERS else [])
    configured_steps = gin.query_parameter("%NUM_STEPS")
    gin.clear_config()
    extra += [f"NUM_STEPS = {measure_steps}", "EVAL_EVERY = 0", f"CHECKPOINT_EVERY = {10**9}",
              "TrainConfig.eval_batches = 1", "TrainConfig.log_every = 1",
              "TrainConfig.final_dtype = 'float32'"]
  gin_config.parse(list(_files(name)), [*extra, *bindings])
  result, seconds = timing.timed(gin.get_configurable(train_lib.train))
  steps = result.step - result.start_step
  tokens = sum(h["tokens"] for h in result.history)
  summary = {
      "name": name, "gin_files": list(_files(name)), "model_dir": model_dir,
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
  bindings, rest = gin_overrides(argv, "see RUNS")
  parser = argparse.ArgumentParser(prog="python -m experiments.train_bundled",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--data_dir", default="data",
                      help="prepared data (python -m specjax.data prepare --out DIR)")
  parser.add_argument("--out", help="one sub-folder per model (required unless --measure)")
  parser.add_argument("--only", action="append", choices=sorted(RUNS),
                      help="train only these (repeatable); default: the four of the pairs")
  parser.add_argument("--ship", metavar="FROM",
                      help="copy FROM/NAME (trained models) into specjax/assets/pairs instead")
  parser.add_argument("--measure", type=int, metavar="N",
                      help="time N training steps of each model instead of training")
  args = parser.parse_args(rest)
  if args.ship:
    return ship(Path(args.ship), names=args.only or DEFAULT_SHIP)
  if args.measure is None and not args.out:
    parser.error("--out is required unless --measure is given")
  if args.measure is not None and args.measure < 2:
    parser.error("--measure needs at least 2 steps (the first one compiles)")
  if not Path(args.data_dir, "lm_ddtp_en", "train.txt").is_file():
    parser.error(f"no prepared data under {args.data_dir}: run "
                 "`python -m specjax.data prepare --out DIR` first")
  summaries = []
  for name in args.only or list(DEFAULT_RUNS):
    if args.measure is not None:
      with tempfile.TemporaryDirectory() as tmp:
        summary = run_one(name, tmp, args.data_dir, bindings, args.measure, progress=False,
                          out=args.out)
    else:
      summary = run_one(name, str(Path(args.out) / name), args.data_dir, bindings,
                        out=args.out)
    summaries.append(summary)
    print(json.dumps(summary), flush=True)
  if args.out:
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "summary.json"
    merged = {s["name"]: s for s in (json.loads(path.read_text()) if path.is_file() else [])}
    merged.update({s["name"]: s for s in summaries})
    path.write_text(json.dumps(list(merged.values()), indent=2) + "\n")
  return summaries


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
