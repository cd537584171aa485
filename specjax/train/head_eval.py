"""Feature heads and their checkpoints judged on held-out text, side by side.

    python -m specjax.train.head_eval --gin_file=runs/train_lm_eagle3.gin \\
        --gin.DATA_DIR="'DIR'" --heads "EAGLE-1=bundled:lm/eagle" --checkpoints MODEL_DIR

The run file gives what a training run of these heads reads (`DataConfig`, and
`FeatureHeadTraining`'s target, vocab_limit and eval_guesses); each head comes from its own
folder (its model.gin and, with a vocab_limit, its token_ranking.npy, as its drafter reads
them), so EAGLE-1 and EAGLE-3 heads compare. Every head is evaluated as a training run with
`TrainConfig.eval_every` evaluates (`feature_head.held_out`): on the validation split, a rollout
of eval_guesses guesses per position, its agreement with the target's argmax by guess and the
chain estimate of tokens per target call (`feature_head.head_record`). One line per head, then
the records as JSON (`--output FILE` writes them too). A cheap way to pick the checkpoint a
drafted table (`python -m experiments.bench.eagle --heads ...`) then measures.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import gin
import jax
import jax.numpy as jnp
import numpy as np

from specjax import command
from specjax.app import gin_config
from specjax.draft.ranking import load_token_ranking
from specjax.train.batches import DataConfig, make_batches
from specjax.train.checkpoints import bundled_folder, list_checkpoints
from specjax.train.feature_head import (FeatureHeadTraining, head_loss_sums, head_record,
                                        held_out, load_head, load_target)


def parse_heads(spec: str) -> List[Tuple[str, str]]:
  """'NAME=HEAD,NAME=HEAD' -> [(name, head)] (spaces around either trimmed); ValueError naming
  a malformed entry or a repeated name."""
  heads = []
  for entry in spec.split(","):
    name, sep, head = entry.partition("=")
    if not sep or not name.strip() or not head.strip():
      raise ValueError(f"--heads takes NAME=HEAD entries separated by commas (e.g. "
                       f"'EAGLE-1=bundled:lm/eagle'), got {entry!r}")
    heads.append((name.strip(), head.strip()))
  if len({name for name, _ in heads}) != len(heads):
    raise ValueError(f"--heads names a head twice: {spec!r}")
  return heads


def checkpoint_heads(model_dir: str) -> List[Tuple[str, str]]:
  """[('step N', model_dir/checkpoint_N)] for every complete checkpoint of a head's run;
  FileNotFoundError when it has none."""
  steps = list_checkpoints(model_dir)
  if not steps:
    raise FileNotFoundError(f"--checkpoints {model_dir}: no complete checkpoint_N in it")
  return [(f"step {n}", os.path.join(model_dir, f"checkpoint_{n}")) for n in steps]


def evaluate_heads(heads: Sequence[Tuple[str, str]], data: DataConfig,
                   feature: FeatureHeadTraining,
                   max_batches: Optional[int] = None) -> List[Dict[str, Any]]:
  """`head_record` (plus `name` and `head`) of each (name, folder) on `data`'s validation
  split, over its first `max_batches` batches (None: all); heads of one config and ranking
  share one compiled step.

  Raises ValueError when a head does not fit the target (`FeatureHead.check_target`) or a
  vocab_limit is set and a head's folder has no token_ranking.npy."""
  target, target_params = load_target(feature.target)
  _, batches = make_batches(data, target.config)
  evaluation = held_out(feature)
  steps: Dict[Any, Any] = {}
  out = []
  for name, folder in heads:
    head, params = load_head(folder)
    head.check_target(target)
    ids = None
    if feature.vocab_limit is not None:
      ranking = load_token_ranking(bundled_folder(folder), head.config.vocab_size)
      if ranking is None:
        raise ValueError(f"head {folder}: FeatureHeadTraining.vocab_limit is "
                         f"{feature.vocab_limit} but the folder has no token_ranking.npy")
      ids = np.asarray(ranking[:feature.vocab_limit], np.int32)
    key = (head.config, None if ids is None else ids.tobytes())
    if key not in steps:  # the checkpoints of one run (one ranking) share a compiled step
      steps[key] = jax.jit(lambda p, b, head=head, ids=None if ids is None else jnp.asarray(ids):
                           head_loss_sums(head, target, p, target_params, b, evaluation, ids))
    parts = jax.device_get([steps[key](params, batch)
                            for batch in batches.eval_batches(max_batches)])
    total = {k: sum(float(part[k]) for part in parts) for k in parts[0]}
    out.append(dict(head_record(total), name=name, head=os.fspath(folder)))
  return out


def format_line(record: Mapping[str, Any]) -> str:
  """One head's line: agreement by guess, chain estimate, 1 - TV, tokens evaluated."""
  return (f"{record['name']}: agreement by guess "
          + " ".join(f"{a:.3f}" for a in record["agreement_by_guess"])
          + f"  chain estimate {record['chain_tokens_estimate']:.2f} tokens/call"
          f"  1-TV {1 - record['teacher_tv']:.3f}  ({int(record['tokens'])} tokens)")


def main(argv: Optional[Sequence[str]] = None) -> int:
  """CLI; see the module docstring."""
  files, bindings, paths, rest = gin_config.split_gin_args(
      sys.argv[1:] if argv is None else argv)
  p = command.ArgumentParser(prog="python -m specjax.train.head_eval",
                             description=__doc__.split("\n")[0])
  p.add_argument("--heads", default=None, help="NAME=HEAD,...: head folders, checkpoint_N folders in them or bundled names")
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
