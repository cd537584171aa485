"""Feature heads and their checkpoints judged on held-out text, side by side.

`evaluate_heads` is the library; `python -m specjax.app.head_eval` the command:

    python -m specjax.app.head_eval --gin_file=runs/train_lm_eagle3.gin \\
        --gin.DATA_DIR="'DIR'" --heads "EAGLE-1=bundled:lm/eagle" --checkpoints MODEL_DIR

The run file gives what a training run of these heads reads (`DataConfig`, and
`FeatureHeadTraining`'s target, vocab_limit and eval_guesses); each head comes from its own
folder (its model.gin and, with a vocab_limit, its token_ranking.npy, as its drafter reads
them), so EAGLE-1 and EAGLE-3 heads compare. Every head is evaluated as a training run with
`TrainConfig.eval_every` evaluates (`feature_head.held_out_step`): on the validation split, a
rollout of eval_guesses guesses per position, its agreement with the target's argmax by guess and the
chain estimate of tokens per target call (`feature_head.head_record`). One line per head, then
the records as JSON (`--output FILE` writes them too). A training diagnostic, not the
measurement: tokens per target call are the drafted table's (`python -m experiments.bench.eagle
--heads ...`), and the estimate has ranked heads otherwise (docs/feature_drafts.md).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from specjax.draft.ranking import load_token_ranking
from specjax.train.batches import DataConfig, make_batches
from specjax.train.checkpoints import bundled_folder, list_checkpoints
from specjax.train.feature_head import (FeatureHeadTraining, evaluate_with, held_out_step,
                                        load_head, load_target)


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
      steps[key] = held_out_step(head, target, target_params, feature, ids)
    record = evaluate_with(steps[key], params, batches.eval_batches(max_batches))
    out.append(dict(record, name=name, head=os.fspath(folder)))
  return out


def format_line(record: Mapping[str, Any]) -> str:
  """One head's line: agreement by guess, chain estimate, 1 - TV, tokens evaluated."""
  return (f"{record['name']}: agreement by guess "
          + " ".join(f"{a:.3f}" for a in record["agreement_by_guess"])
          + f"  chain estimate {record['chain_tokens_estimate']:.2f} tokens/call"
          f"  1-TV {1 - record['teacher_tv']:.3f}  ({int(record['tokens'])} tokens)")
