"""The main job's settings as one frozen, typed object, checked when it is made.

`decode_job` (gin: `decode_job.NAME`) builds a `JobSettings` field by field; the plan, the
measurement and the report read its fields. Each value is stored once: sampling, lenience,
the verifier and the γ policy live in `JobSettings.decoding` (a `DecodeConfig`), nowhere else.
γ, for one, goes gin `decode_job.gamma` -> `JobSettings.gamma` -> `speculative_decode(gamma=...)`
-> `LoopState.gamma`.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Mapping, Optional

import jax

from specjax import machine
from specjax.checks import check_bool, check_choice, check_count, check_int
from specjax.decode import DecodeConfig
from specjax.decode import check_tree as decode_check_tree
from specjax.draft import DRAFTERS, drafter_fields
from specjax.params import DRAFT_WEIGHTS_DTYPES, WEIGHTS_DTYPES
from specjax.runtime.sharding import Partitioner
from specjax.verify import ReferenceVerifier, default_verifier

FITTED_IN_PYTHON = ("ngram", "ngram_tree", "hierarchical")
"""Registered drafters whose params the main job has no source for (an n-gram table fitted
on a corpus, an inner drafter): they run from Python (`specjax.draft`)."""

TREE_DRAFTERS = {"model": "tree_model", "feature": "feature_tree"}
"""Drafters that draft a TREE when one is given, and the registry name that then drafts it."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSettings:
  """Every setting of the main job, checked (a bad one is named before anything loads).

  The defaults are `decode_job`'s (its signature is what gin binds); this object has none.
  """

  decoding: DecodeConfig
  """Sampling (both models' standardization), lenience (l in (0, 1]; 1 = exact), verifier (the
  sigmoid one is NOT exact, flagged in the output) and γ policy ('auto': per round and row, γ
  in [0, gamma] from measured costs, γ = 0 a plain target step; 'constant', 'heuristic',
  'optimal'); the plan adds the vocabulary's EOS and the cache length."""
  drafter: str
  """A name in `specjax.draft.DRAFTERS`: 'model' (the draft checkpoint; with a TREE it drafts
  the tree), 'feature' (the draft checkpoint is a feature head for the target; with a TREE it
  drafts the tree), 'prompt_lookup', 'prompt_lookup_tree', ..."""
  drafter_options: Mapping[str, Any]
  """More fields of the drafter's class (e.g. {'max_ngram': 4}); the job gives the draft
  model, the vocabulary size, max_gamma and the tree itself."""
  gamma: int
  """Guesses per round (the γ policy's start, or with 'auto' the largest γ it may pick)."""
  max_gamma: int
  """The largest γ a round may play (>= gamma)."""
  tree: Any
  """TREE: a `specjax.draft.StaticTree` / `DynamicTree` drafted every round (`tree_decode`), or
  None for a chain of gamma."""
  max_new_tokens: int
  """Generation budget per example."""
  ignore_eos: bool
  """IGNORE_EOS: decode every example to max_new_tokens, past any EOS (both decodes alike), so
  a run times a fixed number of tokens per example, as serving benchmarks do (vLLM's
  `ignore_eos`); False: an example stops at its first EOS."""
  batch_size: int
  """Decode slots: the examples stream through this many rows (in-flight batching: a finished
  example's slot takes the next input)."""
  max_input_len: int
  """Input tokens kept per example (EOS included; a BOS comes on top)."""
  seed: int
  """Random init (smoke runs) and the per-example keys."""
  target_checkpoint: Optional[str]
  """The target's T5X checkpoint, 'bundled:...', or None (random init: smoke runs only)."""
  draft_checkpoint: Optional[str]
  """The draft's T5X checkpoint, 'bundled:...', or None (random init: smoke runs only)."""
  weights_dtype: str
  """WEIGHTS_DTYPE: 'float32', or 'bfloat16' to run the target's dense layers and vocabulary
  product with bfloat16 weights, sums in float32 (`specjax.params.cast_kernels`), for both
  decodes alike."""
  draft_weights_dtype: str
  """DRAFT_WEIGHTS_DTYPE: the same for the draft (a model or a feature head), which may also
  be 'int8' (`specjax.params.quantize_kernels`: a quarter of float32's weight bytes; it
  changes α, never the output), or 'auto': the dtype a draft runs fastest in on this machine
  (`specjax.machine.draft_weights_dtype`), resolved when the settings are made."""
  draft_weights_why: Optional[str] = None
  """Why 'auto' chose the draft's dtype (None: DRAFT_WEIGHTS_DTYPE named it)."""
  partitioner: Optional[Partitioner]
  """A `specjax.runtime.sharding.Partitioner` (gin: NUM_PARTITIONS) to decode on a device
  mesh; None: one device."""
  vocabulary: Any
  """VOCABULARY: a SentencePiece model path, 'bundled:specjax_8k', a `Vocab` or a
  seqio.Vocabulary. None: the task's vocabulary, or the bundled one when both checkpoints are
  bundled pairs; otherwise an error."""
  draft_vocabulary: Any
  """DRAFT_VOCABULARY, checked to be the run's (None: shared)."""
  task_vocabulary: Any
  """The inputs' seqio task's vocabulary, checked to be the run's (None: no task)."""
  cost_table: Optional[str]
  """'auto' only: a JSON cost table (`specjax.decode.auto.CostTable`). If the file exists it is
  used as is (same table + same seed = same tokens); otherwise the table is calibrated on the
  first batch and written there. None: calibrate, keep."""
  output_dir: Optional[str]
  """Where results.jsonl and summary.json go (None: nowhere)."""
  timing_repeats: int
  """TIMING_REPEATS: each decode is timed this many times, the two interleaved (order
  alternating); the summary reports the medians (the speedup is their ratio per token) and
  the range of the per-pass ratios. Compile time is reported apart."""
  write_scores: bool
  """WRITE_SCORES: add each prediction's log-likelihood under the target to its record."""
  plain: bool
  """Print the trace without colours."""

  def __post_init__(self):
    check_choice("drafter", self.drafter, DRAFTERS)
    if self.drafter in FITTED_IN_PYTHON:
      raise ValueError(f"drafter {self.drafter!r} drafts from params fitted in Python (an n-gram "
                       "table or an inner drafter): the main job runs 'model', 'prompt_lookup', "
                       "'prompt_lookup_tree' and 'feature'")
    if not isinstance(self.drafter_options, Mapping):
      raise ValueError(f"drafter_options must be a dict of the drafter's fields, "
                       f"got {self.drafter_options!r}")
    fields = drafter_fields(self.drafter_class)
    unknown = sorted(set(self.drafter_options) - set(fields))
    if unknown:
      raise ValueError(f"drafter_options: drafter {self.drafter_class!r} has no field "
                       f"{unknown[0]!r}; its fields are {list(fields)}")
    if "head" in fields and self.draft_checkpoint is None:
      raise ValueError(f"drafter {self.drafter!r} drafts with a trained feature head: "
                       "DRAFT_CHECKPOINT must be its folder (e.g. 'bundled:lm/eagle'), got None")
    gamma = check_count("gamma", self.gamma)
    max_gamma = check_count("max_gamma", self.max_gamma)
    if gamma > max_gamma:
      raise ValueError(f"gamma must be in [1, max_gamma={max_gamma}], got {gamma}")
    check_count("max_new_tokens", self.max_new_tokens)
    for name in ("ignore_eos", "write_scores", "plain"):
      check_bool(name, getattr(self, name))
    if self.cost_table is not None and not isinstance(self.cost_table, str):
      raise ValueError(f"COST_TABLE must be a path (a quoted string) or None, got "
                       f"{type(self.cost_table).__name__} {self.cost_table!r}")
    for name in ("target_checkpoint", "draft_checkpoint", "cost_table", "output_dir"):
      object.__setattr__(self, name, check_path(name, getattr(self, name)))
    for name in ("vocabulary", "draft_vocabulary"):
      check_vocabulary(name, getattr(self, name))
    check_count("batch_size", self.batch_size)
    check_count("timing_repeats", self.timing_repeats)
    if check_count("max_input_len", self.max_input_len) < 2:
      raise ValueError(f"max_input_len must be >= 2 (a token and EOS), got {self.max_input_len}")
    check_int("seed", self.seed)
    check_choice("draft_weights_dtype", self.draft_weights_dtype,
                 [*DRAFT_WEIGHTS_DTYPES, "auto"])
    if self.draft_weights_dtype == "auto":
      dtype, why = machine.draft_weights_dtype(jax.default_backend())
      object.__setattr__(self, "draft_weights_dtype", dtype)
      object.__setattr__(self, "draft_weights_why", f"'auto' chose {dtype}: {why}")
    if (isinstance(self.weights_dtype, str) and self.weights_dtype in DRAFT_WEIGHTS_DTYPES
        and self.weights_dtype not in WEIGHTS_DTYPES):
      raise ValueError(f"weights_dtype {self.weights_dtype!r} is for drafts only "
                       f"(DRAFT_WEIGHTS_DTYPE): the target's weights are the output "
                       f"distribution; use one of {sorted(WEIGHTS_DTYPES)}")
    check_choice("weights_dtype", self.weights_dtype, WEIGHTS_DTYPES)
    if self.partitioner is not None and not isinstance(self.partitioner, Partitioner):
      raise ValueError(f"partitioner must be a specjax.runtime.sharding.Partitioner (gin: "
                       f"NUM_PARTITIONS) or None, got {self.partitioner!r}")
    if self.cost_table and self.decoding.gamma_policy != "auto":
      raise ValueError(f"cost_table is for gamma_policy='auto', not "
                       f"{self.decoding.gamma_policy!r}")
    check_tree(self)

  @property
  def drafter_class(self) -> str:
    """The registry name of the drafter built: `drafter`, where 'model' with a TREE is the
    draft model drafting that tree ('tree_model'), and 'feature' with a TREE the feature head
    drafting it ('feature_tree')."""
    if self.tree is not None and self.drafter in TREE_DRAFTERS:
      return TREE_DRAFTERS[self.drafter]
    return self.drafter


PATH_MACROS = {"target_checkpoint": "TARGET_CHECKPOINT", "draft_checkpoint": "DRAFT_CHECKPOINT",
               "cost_table": "COST_TABLE", "output_dir": "OUTPUT_DIR"}
"""The settings that name a file or folder, and the gin macro each is bound through."""


def check_path(name: str, value: Any) -> Any:
  """A path setting with `~` expanded as a shell would (a str; anything else is returned for
  the setting's own check); ValueError naming the setting's macro for a NUL byte in it."""
  if isinstance(value, os.PathLike):
    value = os.fspath(value)
  if not isinstance(value, str):
    return value
  if "\0" in value:
    raise ValueError(f"{PATH_MACROS.get(name, name)} contains a NUL byte (at character "
                     f"{value.index(chr(0))}): a path cannot hold one")
  return value if value.startswith(("bundled:", "gs://")) else os.path.expanduser(value)


def check_vocabulary(name: str, value: Any) -> None:
  """ValueError naming VOCABULARY / DRAFT_VOCABULARY when it is a number, bool or container
  (a vocabulary is a path, 'bundled:specjax_8k', a `Vocab` or a seqio.Vocabulary)."""
  if isinstance(value, (bool, int, float, bytes, list, tuple, dict, set)):
    raise ValueError(f"{name.upper()} must be a SentencePiece model path, 'bundled:specjax_8k', "
                     f"@Vocab() or a seqio vocabulary (or None), got {type(value).__name__} "
                     f"{value!r}")
  if isinstance(value, str) and "\0" in value:
    raise ValueError(f"{name.upper()} contains a NUL byte: a path cannot hold one")


def drafts_a_tree(drafter: str, tree: Any) -> bool:
  """Whether the job drafts a token tree: a TREE is given, or the drafter's class drafts its
  own (`Drafter.tree` is None only on chain drafters)."""
  return tree is not None or (isinstance(drafter, str) and drafter in DRAFTERS
                              and getattr(DRAFTERS[drafter], "tree", True) is not None)


def check_tree(settings: JobSettings) -> None:
  """ValueError naming the first setting a TREE run cannot take (a chain: nothing to check):
  the main job's own rule (a TREE is drafted by the draft model), then the decode's rules
  (`specjax.decode.check_tree`; the plan checks the tree again with the models' sizes)."""
  if settings.tree is None:
    return
  if settings.drafter not in TREE_DRAFTERS:
    raise ValueError("TREE needs the draft model (drafter='model') or a feature head "
                     "(drafter='feature'); prompt lookup drafts its own tree with "
                     "drafter='prompt_lookup_tree' and no TREE")
  decode_check_tree(settings.tree, settings.decoding)


def job_verifier(verifier: Any, drafter: str, tree: Any, sampling: Any, lenience: Any) -> Any:
  """`verifier`, or when None the main job's default: the reference verifier for a tree (it
  verifies with the tree rule), else `specjax.verify.default_verifier`."""
  if verifier is not None:
    return verifier
  if drafts_a_tree(drafter, tree):
    return ReferenceVerifier()
  return default_verifier(sampling, lenience)


def feature_lengths(task_feature_lengths: Any) -> Dict[str, int]:
  """TASK_FEATURE_LENGTHS checked: a dict of feature name -> length >= 1 (None: {})."""
  if task_feature_lengths is None:
    return {}
  if not isinstance(task_feature_lengths, Mapping):
    raise ValueError("TASK_FEATURE_LENGTHS must be a dict such as {'inputs': 64, 'targets': 32}, "
                     f"got {task_feature_lengths!r}")
  return {k: check_count(f"TASK_FEATURE_LENGTHS['{k}']", v)
          for k, v in task_feature_lengths.items()}
