"""The main job's plan: every setting checked, the models built and the inputs framed, before
any weights load (a bad setting, vocabulary, checkpoint path or cache size is named first)."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Optional, Sequence

import jax

from specjax import files
from specjax.app import bundled, gin_config, prompts, records
from specjax.app.loading import (check_attention_backend, check_checkpoints, check_models,
                                 job_vocabulary)
from specjax.app.settings import JobSettings
from specjax.data import inputs as inputs_lib
from specjax.decode import CostTable, check_tree
from specjax.decode.chain_checks import check_chain
from specjax.decode.inputs import check_cache_size, check_inputs, check_memory, prefix_lengths
from specjax.draft import drafter_fields, get_drafter
from specjax.draft.tree import cap_depth
from specjax.draft.ranking import load_token_ranking
from specjax.models import FeatureHead, FeatureHeadConfig, build_model


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the main job will run: settings, models (not loaded), framed inputs."""

  settings: JobSettings  # checked; its DecodeConfig carries the EOS (the vocabulary's, -1 with
  # ignore_eos) and cache_len
  examples: Sequence[Any]  # specjax.data.DecodeInput per example
  inputs: Any  # int32 [N, L]: encoder inputs or prompts, 0-padded
  prompt_lengths: Any  # int32 [N] (decoder-only) or None
  vocab: Any  # the run's vocabulary
  target: Any  # the target DecodingModel
  draft: Any  # the draft DecodingModel, a FeatureHead (feature drafters), None for prompt lookup
  drafter: Any  # the specjax.draft drafter
  slots: int  # decode rows: min(batch_size, examples)
  checkpoints: Dict[str, Any]  # {'target': ..., 'draft': ...}: paths, 'bundled:...' or None
  costs: Optional[CostTable]  # a saved 'auto' cost table, else None (calibrated)
  token_ranking: Any = None  # a feature head's token_ranking.npy (int32 [V]), else None


def prepare_output_dir(output_dir: Optional[str]) -> None:
  """Creates `output_dir` and checks a file can be written there and that its output files
  can be replaced (not symlinks or folders), before any decoding."""
  if not output_dir:
    return
  if not isinstance(output_dir, (str, os.PathLike)):
    raise ValueError(f"output_dir must be a folder path (or None), got {output_dir!r}")
  probe = os.path.join(output_dir, ".specjax_write_test")
  if files.is_remote(output_dir):  # a bucket folder: a probe object written and removed
    from specjax import remote  # pylint: disable=import-outside-toplevel
    try:
      remote.write_objects({probe: b"ok"})
      remote.delete(probe)
    except (OSError, ValueError) as e:
      raise ValueError(f"output_dir '{output_dir}' is not writable: {e}") from e
    records.check_destinations(output_dir)
    return
  try:
    os.makedirs(output_dir, exist_ok=True)
    with open(probe, "w", encoding="utf-8") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ValueError(f"output_dir '{output_dir}' is not writable: {e}") from e
  records.check_destinations(output_dir)


def cost_table_file(path: Optional[str]) -> Optional[CostTable]:
  """The saved table at `path` if it exists (checked before any model loads), else None."""
  if not path:
    return None
  if files.is_remote(path):  # read in place when it is there; saved there after the run
    from specjax import remote  # pylint: disable=import-outside-toplevel
    return CostTable.load(path) if remote.exists(path) else None
  if os.path.exists(path):
    return CostTable.load(path)
  folder = os.path.dirname(path) or "."
  if not os.path.isdir(folder):
    raise ValueError(f"cost_table '{path}': folder '{folder}' does not exist")
  return None


def feature_head(name: str, config: Any) -> FeatureHead:
  """The feature head a feature drafter reads: DRAFT_MODEL must describe one."""
  if not isinstance(config, FeatureHeadConfig):
    raise ValueError(f"drafter {name!r} drafts with a feature head trained for the target: "
                     f"DRAFT_MODEL must be its model.gin (a FeatureHeadConfig, e.g. "
                     f"'bundled:lm/eagle'), got a {type(config).__name__}")
  return FeatureHead(config)


def cap_gamma(settings: JobSettings) -> JobSettings:
  """`settings` with a chain's gamma and max_gamma, or a tree's depth, capped at
  max_new_tokens: a round emits at most the budget, so more guesses only cost draft steps and
  a wider verification call."""
  if settings.tree is not None:
    return dataclasses.replace(settings, tree=cap_depth(settings.tree, settings.max_new_tokens))
  if settings.max_gamma <= settings.max_new_tokens:
    return settings
  budget = settings.max_new_tokens
  buckets = tuple(b for b in settings.decoding.auto_buckets if b <= budget)
  return dataclasses.replace(settings, gamma=min(settings.gamma, budget), max_gamma=budget,
                             decoding=dataclasses.replace(settings.decoding,
                                                          auto_buckets=buckets))


@dataclasses.dataclass(frozen=True)
class Pair:
  """The models of a run, built and checked against their vocabulary, before any inputs are
  framed (the main job's plan builds one per run; `specjax.app.generate.Generator` keeps one
  for many calls)."""

  settings: JobSettings  # checked, cap_gamma applied
  vocab: Any  # the run's vocabulary
  target: Any  # the target DecodingModel
  draft: Any  # the draft DecodingModel, a FeatureHead (feature drafters), None for prompt lookup
  drafter: Any  # the specjax.draft drafter
  checkpoints: Dict[str, Any]  # {'target': ..., 'draft': ...}: paths, 'bundled:...' or None
  models: Dict[str, Any]  # {'target': ..., 'draft': ...}: the models checked against vocab


def build_pair(settings: JobSettings) -> Pair:
  """The target, the draft and the drafter the parsed gin describes (`gin_config.model_config`
  under the scopes target/ and draft/), and the run's vocabulary, checked against each other;
  loads nothing."""
  settings = cap_gamma(settings)
  target = build_model(gin_config.model_config("target"))
  models = {"target": target}
  draft = None
  name = settings.drafter_class
  if "model" in drafter_fields(name):
    draft = models["draft"] = build_model(gin_config.model_config("draft"))
  elif "head" in drafter_fields(name):
    draft = feature_head(name, gin_config.model_config("draft"))
  drafter = get_drafter(name, {"model": draft, "head": draft, "target": target,
                               "vocab": target.vocab_size, "tree": settings.tree,
                               "max_gamma": settings.max_gamma}, **settings.drafter_options)
  checkpoints = {"target": settings.target_checkpoint,
                 **({"draft": settings.draft_checkpoint} if draft is not None else {})}
  vocab = job_vocabulary(settings.vocabulary, settings.draft_vocabulary,
                         settings.task_vocabulary, list(checkpoints.values()),
                         gin_config.model_vocabulary("target"))
  check_models(vocab, models)
  check_attention_backend(models, jax.default_backend())
  return Pair(settings=settings, vocab=vocab, target=target, draft=draft, drafter=drafter,
              checkpoints=checkpoints, models=models)


def token_ranking(pair: Pair) -> Any:
  """A feature head's token ranking (int32 [V], read from the draft checkpoint's folder), or
  None for every other drafter."""
  if not pair.drafter.wants_features:
    return None
  return load_token_ranking(bundled.resolve(pair.settings.draft_checkpoint, "checkpoint"),
                            pair.draft.config.vocab_size)


def make_plan(texts: Sequence[Any], settings: JobSettings, pair: Optional[Pair] = None) -> Plan:
  """Frames the inputs of `decode_job` and checks what the settings alone could not (the
  inputs, output folder, cost table file, vocabulary, checkpoints, caches); loads nothing.
  `pair`: the models, already built (`build_pair`) from settings that differ from these at
  most in max_new_tokens and seed (None: built here)."""
  examples = inputs_lib.as_inputs(texts)
  if not examples:
    raise ValueError("no inputs to decode")
  settings = cap_gamma(settings)
  prepare_output_dir(settings.output_dir)
  costs = cost_table_file(settings.cost_table)
  pair = build_pair(settings) if pair is None else pair
  vocab, target, draft, drafter = pair.vocab, pair.target, pair.draft, pair.drafter
  checkpoints, models = pair.checkpoints, pair.models
  rows = [list(e.ids) if e.ids is not None else prompts.text_ids(vocab, e.text, target)
          for e in examples]
  inputs, prompt_lengths = prompts.frame(target, rows, max_len=settings.max_input_len,
                                         eos_id=vocab.eos_id, round_to=16)
  prefix_lengths(target, check_inputs(target, inputs), prompt_lengths)  # empty prompts, ids
  # Sized by the work, not the settings' upper bounds: a slot per input at most, and a
  # cache as long as the longest framed input (<= max_input_len + BOS) and the budget.
  slots = min(settings.batch_size, len(examples))
  decoding = dataclasses.replace(
      settings.decoding, eos_id=-1 if settings.ignore_eos else vocab.eos_id,
      cache_len=inputs.shape[1] + settings.max_new_tokens + 1 + drafter.lookahead)
  if drafter.tree is not None:  # TREE, or a tree the drafter drafts: its round must fit
    check_tree(drafter.tree, decoding, vocab_size=target.vocab_size,
               models=[target, *drafter.models], rows=slots, cache_len=decoding.cache_len,
               costs=costs, partitioner=settings.partitioner)
  cache_size = check_cache_size([target, *drafter.models], slots, decoding.cache_len,
                                settings.partitioner)
  if drafter.tree is None:  # a chain: its widest verification call must fit beside the caches
    check_chain(drafter.max_gamma, [target, *drafter.models], slots, decoding.cache_len,
                target.vocab_size, cache_size, settings.partitioner)
  check_checkpoints(checkpoints)
  ranking = token_ranking(pair)
  check_memory(list(models.values()), cache_size, settings.partitioner)
  return Plan(settings=dataclasses.replace(settings, decoding=decoding), examples=examples,
              inputs=inputs, prompt_lengths=prompt_lengths, vocab=vocab, target=target,
              draft=draft, drafter=drafter, slots=slots, checkpoints=checkpoints, costs=costs,
              token_ranking=ranking)
