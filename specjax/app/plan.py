"""The main job's plan: every setting checked, the models built and the inputs framed, before
any weights load (a bad setting, vocabulary, checkpoint path or cache size is named first)."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Mapping, Optional, Sequence

from specjax.app import gin_config, prompts, records
from specjax.app.loading import check_checkpoints, check_models, job_vocabulary
from specjax.checks import check_count, check_int
from specjax.data import inputs as inputs_lib
from specjax.decode import GAMMA_POLICIES, CostTable, DecodeConfig
from specjax.decode.inputs import check_cache_size, check_inputs, check_memory, drafter_models
from specjax.decode.inputs import prefix_lengths
from specjax.draft import (DynamicTree, ModelDrafter, PromptLookupDrafter, StaticTree,
                           TreeModelDrafter)
from specjax.models import build_model
from specjax.params import WEIGHTS_DTYPES
from specjax.sampling import Sampling
from specjax.sharding import Partitioner
from specjax.verify import ReferenceVerifier, default_verifier


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the main job will run: settings, models (not loaded), framed inputs."""

  examples: Sequence[Any]  # specjax.data.DecodeInput per example
  inputs: Any  # int32 [N, L]: encoder inputs or prompts, 0-padded
  prompt_lengths: Any  # int32 [N] (decoder-only) or None
  vocab: Any  # the run's vocabulary
  target: Any  # the target DecodingModel
  draft: Any  # the draft DecodingModel, None for prompt lookup
  drafter: Any  # the specjax.draft drafter
  config: DecodeConfig  # the autoregressive decode's config (the speculative one adds a trace)
  checkpoints: Dict[str, Any]  # {'target': ..., 'draft': ...}: paths, 'bundled:...' or None
  costs: Optional[CostTable]  # a saved 'auto' cost table, else None (calibrated)
  settings: Mapping[str, Any]  # the decode_job arguments, checked


def check_settings(*, drafter: str, gamma: Any, max_gamma: Any, max_new_tokens: Any,
                   batch_size: Any, max_input_len: Any, seed: Any,
                   timing_repeats: Any = 1) -> int:
  """ValueError naming the first bad setting of `decode_job` (nothing loaded yet).

  Returns max_gamma (gamma when None)."""
  if drafter not in ("model", "prompt_lookup"):
    raise ValueError(f"drafter must be 'model' or 'prompt_lookup', got {drafter!r}")
  gamma = check_count("gamma", gamma)
  max_gamma = gamma if max_gamma is None else check_count("max_gamma", max_gamma)
  if gamma > max_gamma:
    raise ValueError(f"gamma must be in [1, max_gamma={max_gamma}], got {gamma}")
  check_count("max_new_tokens", max_new_tokens)
  check_count("batch_size", batch_size)
  check_count("timing_repeats", timing_repeats)
  if check_count("max_input_len", max_input_len) < 2:
    raise ValueError(f"max_input_len must be >= 2 (a token and EOS), got {max_input_len}")
  check_int("seed", seed)
  return max_gamma


def prepare_output_dir(output_dir: Optional[str]) -> None:
  """Creates `output_dir` and checks a file can be written there and that its output files
  can be replaced (not symlinks or folders), before any decoding."""
  if not output_dir:
    return
  if not isinstance(output_dir, (str, os.PathLike)):
    raise ValueError(f"output_dir must be a folder path (or None), got {output_dir!r}")
  probe = os.path.join(output_dir, ".specjax_write_test")
  try:
    os.makedirs(output_dir, exist_ok=True)
    with open(probe, "w", encoding="utf-8") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ValueError(f"output_dir '{output_dir}' is not writable: {e}") from e
  records.check_destinations(output_dir)


def cost_table_file(path: Optional[str], gamma_policy: str) -> Optional[CostTable]:
  """The saved table at `path` if it exists (checked before any model loads), else None."""
  if not path:
    return None
  if gamma_policy != "auto":
    raise ValueError(f"cost_table is for gamma_policy='auto', not {gamma_policy!r}")
  if os.path.exists(path):
    return CostTable.load(path)
  folder = os.path.dirname(path) or "."
  if not os.path.isdir(folder):
    raise ValueError(f"cost_table '{path}': folder '{folder}' does not exist")
  return None


def check_tree(tree: Any, drafter: str, gamma_policy: str, verifier: Any,
               sampling: Sampling) -> None:
  """ValueError naming the first setting a TREE run cannot take (None: a chain, nothing to
  check)."""
  if tree is None:
    return
  if not isinstance(tree, (StaticTree, DynamicTree)):
    raise ValueError(f"TREE must be a StaticTree or DynamicTree (gin: "
                     f"@specjax.draft.tree_spines() ...), got {tree!r}")
  if drafter != "model":
    raise ValueError("TREE needs the draft model (drafter='model'); prompt lookup as a tree "
                     "is specjax.draft.PromptLookupTreeDrafter in Python")
  if gamma_policy not in ("constant", "auto"):
    raise ValueError(f"TREE takes GAMMA_POLICY 'constant' or 'auto', got {gamma_policy!r}")
  if verifier is not None and not isinstance(verifier, ReferenceVerifier):
    raise ValueError("TREE verifies with the tree rule: leave VERIFIER None (or the reference "
                     "verifier)")
  if tree.greedy_only and not sampling.greedy:
    raise ValueError("DynamicTree(keep=...) is exact at temperature 0 only")


def feature_lengths(task_feature_lengths: Any) -> Dict[str, int]:
  """TASK_FEATURE_LENGTHS checked: a dict of feature name -> length >= 1 (None: {})."""
  if task_feature_lengths is None:
    return {}
  if not isinstance(task_feature_lengths, Mapping):
    raise ValueError("TASK_FEATURE_LENGTHS must be a dict such as {'inputs': 64, 'targets': 32}, "
                     f"got {task_feature_lengths!r}")
  return {k: check_count(f"TASK_FEATURE_LENGTHS['{k}']", v)
          for k, v in task_feature_lengths.items()}


def make_plan(texts: Sequence[Any], *, target_checkpoint: Optional[str],
              draft_checkpoint: Optional[str], drafter: str, gamma: int,
              max_gamma: Optional[int], max_new_tokens: int, sampling: Sampling,
              lenience: float, batch_size: int, max_input_len: int, seed: int, verifier,
              gamma_policy: str, cost_table: Optional[str], output_dir: Optional[str],
              tree: Any,
              partitioner: Optional[Partitioner], vocabulary: Any, draft_vocabulary: Any,
              task_vocabulary: Any, task_feature_lengths: Optional[Mapping],
              timing_repeats: int, weights_dtype: str, draft_weights_dtype: str,
              **settings) -> Plan:
  """Checks every setting of `decode_job` and frames its inputs; loads nothing."""
  lengths = feature_lengths(task_feature_lengths)
  max_input_len = lengths.get("inputs", max_input_len)
  max_new_tokens = lengths.get("targets", max_new_tokens)
  max_gamma = check_settings(drafter=drafter, gamma=gamma, max_gamma=max_gamma,
                             max_new_tokens=max_new_tokens, batch_size=batch_size,
                             max_input_len=max_input_len, seed=seed,
                             timing_repeats=timing_repeats)
  examples = inputs_lib.as_inputs(texts)
  if not examples:
    raise ValueError("no inputs to decode")
  prepare_output_dir(output_dir)
  for name, value in (("weights_dtype", weights_dtype),
                      ("draft_weights_dtype", draft_weights_dtype)):
    if value not in WEIGHTS_DTYPES:
      raise ValueError(f"{name} must be one of {sorted(WEIGHTS_DTYPES)}, got {value!r}")
  if gamma_policy not in GAMMA_POLICIES:
    raise ValueError(f"gamma_policy must be one of {GAMMA_POLICIES}, got {gamma_policy!r}")
  costs = cost_table_file(cost_table, gamma_policy)
  check_tree(tree, drafter, gamma_policy, verifier, sampling)
  target = build_model(gin_config.model_config("target"))
  models = {"target": target}
  draft = None
  if drafter == "model":
    draft = models["draft"] = build_model(gin_config.model_config("draft"))
    the_drafter = (ModelDrafter(draft, max_gamma=max_gamma) if tree is None
                   else TreeModelDrafter(draft, tree))
  else:
    the_drafter = PromptLookupDrafter(vocab=target.vocab_size, max_gamma=max_gamma)
  checkpoints = {"target": target_checkpoint,
                 **({"draft": draft_checkpoint} if drafter == "model" else {})}
  vocab = job_vocabulary(vocabulary, draft_vocabulary, task_vocabulary, list(checkpoints.values()))
  check_models(vocab, models)
  rows = [list(e.ids) if e.ids is not None else prompts.text_ids(vocab, e.text, target)
          for e in examples]
  inputs, prompt_lengths = prompts.frame(target, rows, max_len=max_input_len,
                                         eos_id=vocab.eos_id, round_to=16)
  prefix_lengths(target, check_inputs(target, inputs), prompt_lengths)  # empty prompts, ids
  if verifier is None:
    verifier = ReferenceVerifier() if tree is not None else default_verifier(sampling, lenience)
  # Sized by the work, not the settings' upper bounds: a slot per input at most, and a
  # cache as long as the longest framed input (<= max_input_len + BOS) and the budget.
  slots = min(batch_size, len(examples))
  config = DecodeConfig(sampling=sampling, eos_id=vocab.eos_id, lenience=lenience,
                        verifier=verifier, gamma_policy=gamma_policy,
                        cache_len=inputs.shape[1] + max_new_tokens + 1 + (
                            max_gamma if tree is None else the_drafter.slots))
  cache_size = check_cache_size([target, *drafter_models(the_drafter)], slots,
                                config.cache_len, partitioner)
  check_checkpoints(checkpoints)
  check_memory(list(models.values()), cache_size, partitioner)
  return Plan(examples=examples, inputs=inputs, prompt_lengths=prompt_lengths, vocab=vocab,
              target=target, draft=draft, drafter=the_drafter, config=config,
              checkpoints=checkpoints, costs=costs,
              settings=dict(settings, drafter=drafter, gamma=gamma, tree=tree,
                            max_new_tokens=max_new_tokens,
                            sampling=sampling, lenience=lenience, batch_size=batch_size,
                            slots=slots,
                            seed=seed, verifier=verifier, gamma_policy=gamma_policy,
                            cost_table=cost_table, output_dir=output_dir,
                            partitioner=partitioner, timing_repeats=timing_repeats,
                            weights_dtype=weights_dtype,
                            draft_weights_dtype=draft_weights_dtype))
