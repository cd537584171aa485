"""The main job's models and vocabulary: built from gin, loaded from T5X checkpoints, checked
against each other before any weights load."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Tuple

import gin
import jax
import numpy as np

from specjax import files
from specjax.app import bundled, gin_config, prompts
from specjax.checkpoints import find_checkpoint, load_sharded, load_t5x_for_model
from specjax.data import Vocab
from specjax.data.user_vocab import BUNDLED, describe as describe_vocab
from specjax.data.user_vocab import resolve_vocabulary, vocabulary_difference
from specjax.checkpoints.gemma import load_gemma_params
from specjax.models import GemmaModel, build_model
from specjax.runtime.sharding import Partitioner

__all__ = ["build_model", "load_model", "load_params", "encode_inputs", "job_vocabulary",
           "check_models", "check_checkpoints"]


def load_model(checkpoint: Optional[str], scope: str, seed: int,
               partitioner: Optional[Partitioner] = None):
  """(model, params): the config bound under `scope`, weights from a T5X checkpoint.

  checkpoint None means random initialization (seeded): only for smoke runs;
  'bundled:PAIR/ROLE' is a shipped model (`specjax.app.bundled`).
  With a partitioner the params come back placed in their shardings.
  """
  model = build_model(gin_config.model_config(scope))
  return model, load_params(model, checkpoint, seed, partitioner)


def load_params(model, checkpoint: Optional[str], seed: int,
                partitioner: Optional[Partitioner] = None):
  """`model`'s params from a T5X checkpoint, or a Gemma model's from the folder the gemma
  library wrote (None: random init; 'bundled:...': shipped)."""
  checkpoint = bundled.resolve(checkpoint, "checkpoint")
  if checkpoint is None:
    params = model.init(jax.random.PRNGKey(seed))
    return params if partitioner is None else partitioner.shard_params(params)
  if isinstance(model, GemmaModel):  # the gemma library's Orbax tree (`load_gemma`)
    dtype = "float32" if model.config.dtype == "float32" else None
    params = jax.tree.map(jax.numpy.asarray,
                          load_gemma_params(checkpoint, model.param_shapes(), dtype=dtype))
    return params if partitioner is None else partitioner.shard_params(params)
  if partitioner is not None:
    return load_sharded(checkpoint, model, partitioner, dtype="float32")
  return jax.tree.map(jax.numpy.asarray, load_t5x_for_model(checkpoint, model, dtype="float32"))


def encode_inputs(vocab, texts: Sequence[str], encoder_decoder: bool, max_len: int) -> np.ndarray:
  """Texts -> int32 [B, L] (0-padded). Encoder inputs end with EOS; LM prompts do not.

  A text longer than `max_len` tokens is cut to its first max_len - 1 tokens + EOS (T5) or
  first max_len tokens (LM), with a logged warning naming the example. (The bundled
  pairs' framing; `specjax.app.prompts.frame` frames for any model's convention.)
  """
  rows = [vocab.encode(t) + ([vocab.eos_id] if encoder_decoder else []) for t in texts]
  rows = prompts.cut(rows, max_len, vocab.eos_id)
  out = np.zeros((len(rows), max(len(r) for r in rows)), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out


def _is_bundled(checkpoint: Any) -> bool:
  return isinstance(checkpoint, str) and checkpoint.startswith(bundled.PREFIX)


def model_gin_vocabulary(named: Optional[Dict[str, Any]]) -> Tuple[Any, str]:
  """(the vocabulary a target's model gin file names, or None; why not, or ''): `named` is
  its `seqio.SentencePieceVocabulary` fields (`gin_config.model_vocabulary`). A local or
  gs:// SentencePiece model of at most VOCABULARY_BYTES is read (a T5X base.gin names
  gs://t5-data/vocabs/..., read in place)."""
  if not named:
    return None, ""
  path = named["sentencepiece_model_file"]
  if files.is_remote(path):
    try:
      return Vocab(path, extra_ids=named["extra_ids"]), ""
    except (OSError, ValueError, RuntimeError) as e:
      return None, f"the target's model gin file names {path}, which cannot be read ({e})"
  if "://" in path:
    return None, f"the target's model gin file names {path}, which is not a local or gs:// file"
  try:
    files.check_regular(os.path.expanduser(path), "the model gin file's vocabulary")
    if os.path.getsize(os.path.expanduser(path)) > VOCABULARY_BYTES:
      return None, f"the target's model gin file names {path}, larger than a vocabulary"
    return Vocab(os.path.expanduser(path), extra_ids=named["extra_ids"]), ""
  except (OSError, ValueError, RuntimeError) as e:
    return None, f"the target's model gin file names {path}, which cannot be read ({e})"


VOCABULARY_BYTES = 64 * files.MIB
"""Largest SentencePiece model a model gin file may name (cc_all.32000's is 0.8 MiB)."""


def job_vocabulary(vocabulary: Any, draft_vocabulary: Any, task_vocabulary: Any,
                   checkpoints: Sequence[Any], model_vocabulary: Optional[Dict[str, Any]] = None):
  """The run's vocabulary: VOCABULARY, else the task's, else the one the target's model gin
  file names (`model_vocabulary`, T5X's seqio.SentencePieceVocabulary bindings) when it can
  be read, else the bundled one for the bundled pairs (all `checkpoints` 'bundled:...');
  ValueError when none applies or two differ."""
  from_model_gin, why_not = (None, "") if vocabulary is not None or task_vocabulary is not None \
      else model_gin_vocabulary(model_vocabulary)
  if vocabulary is None and from_model_gin is not None:
    vocabulary = from_model_gin
  if vocabulary is not None:
    vocab = resolve_vocabulary(vocabulary)
  elif task_vocabulary is not None:
    vocab = resolve_vocabulary(task_vocabulary)
  elif checkpoints and all(_is_bundled(c) for c in checkpoints):
    vocab = resolve_vocabulary(BUNDLED)
  else:
    raise ValueError(
        "no vocabulary: bind VOCABULARY to the checkpoints' own (a SentencePiece model path, "
        "e.g. --gin.VOCABULARY=\"'/path/sentencepiece.model'\", or @seqio.SentencePieceVocabulary() "
        f"as in T5X's gin); the bundled vocabulary ({BUNDLED!r}) is the default only for the "
        "bundled pairs" + (f" ({why_not})" if why_not else ""))
  shipped = [c for c in checkpoints if _is_bundled(c)]
  if vocabulary is not None and shipped:
    ours = resolve_vocabulary(BUNDLED)
    difference = vocabulary_difference(ours, vocab)
    if difference:
      raise ValueError(f"vocabulary mismatch: VOCABULARY ({describe_vocab(vocab)}) is not the "
                       f"vocabulary the bundled checkpoints ({', '.join(shipped)}) were "
                       f"trained with ({describe_vocab(ours)}): {difference}; leave VOCABULARY "
                       "unbound for the bundled pairs")
  for what, other in (("the task's vocabulary", task_vocabulary),
                      ("DRAFT_VOCABULARY", draft_vocabulary)):
    if other is None or other is vocabulary:
      continue
    other = resolve_vocabulary(other)
    difference = vocabulary_difference(vocab, other)
    if difference:
      raise ValueError(f"vocabulary mismatch: {what} ({describe_vocab(other)}) differs from "
                       f"the run's ({describe_vocab(vocab)}): {difference}; target, draft and "
                       "inputs must share one vocabulary")
  return vocab


def check_models(vocab: Any, models: Dict[str, Any]) -> None:
  """ValueError unless every model's logits cover the vocabulary (a larger vocab_size is fine,
  as T5's 32128 for 32100 ids) and all frame prompts alike."""
  for role, model in models.items():
    if model.vocab_size < vocab.vocab_size:
      raise ValueError(f"the {role} model's vocab_size {model.vocab_size} is smaller than the "
                       f"vocabulary's {vocab.vocab_size} ids ({describe_vocab(vocab)}): "
                       "wrong VOCABULARY (its extra_ids count too) or model gin file?")
  if "draft" in models and models["draft"].vocab_size != models["target"].vocab_size:
    raise ValueError(f"target and draft vocab_size differ ({models['target'].vocab_size} vs "
                     f"{models['draft'].vocab_size}): speculative decoding needs one shared "
                     "vocabulary; check the model gin files")
  conventions = {role: prompts.convention(m) for role, m in models.items()}
  if len(set(conventions.values())) > 1:
    raise ValueError(f"target and draft frame prompts differently ({conventions}): give both "
                     "the same DecoderOnlyConfig.prompt_convention")


def check_attention_backend(models: Dict[str, Any], backend: str) -> None:
  """ValueError when a model's `attention_impl` is 'cudnn' and the job runs on `backend`
  ('cpu', 'tpu', ...) rather than an NVIDIA GPU, where cuDNN's kernel does not exist (a
  compile for a GPU from this host is `python -m specjax.aot`'s, which takes it)."""
  for role, model in models.items():
    config = getattr(model, "config", None)
    if getattr(config, "attention_impl", None) == "cudnn" and backend != "gpu":
      raise ValueError(f"the {role} model's attention_impl 'cudnn' runs on an NVIDIA GPU only, "
                       f"and this job runs on {backend}: use 'specjax' or 'xla' "
                       f"(--gin.{role}/{type(config).__name__}.attention_impl=\"'xla'\")")


def check_checkpoints(checkpoints: Dict[str, Any]) -> None:
  """Finds every checkpoint before any loads ({role: path, 'bundled:...' or None for random
  init}): a missing draft checkpoint is named before the target's weights are read."""
  for role, checkpoint in checkpoints.items():
    if checkpoint is gin.REQUIRED:
      name = "TARGET_CHECKPOINT (T5X's CHECKPOINT_PATH)" if role == "target" else \
          f"{role.upper()}_CHECKPOINT"
      raise ValueError(f"no {role} checkpoint: bind {name} to a T5X checkpoint folder, e.g. "
                       f"--gin.{name.split()[0]}=\"'/path/checkpoint_1000000'\" (None: random "
                       "weights, for smoke runs)")
    path = bundled.resolve(checkpoint, "checkpoint")
    if path is None:
      continue
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
      raise ValueError(f"the {role} checkpoint must be a path (or None for random weights), "
                       f"got {checkpoint!r}")
    try:
      find_checkpoint(path)
    except FileNotFoundError as e:
      raise FileNotFoundError(f"the {role} checkpoint: {e}") from e
