"""model.gin: the model config beside a checkpoint, written by specjax and read back safely.

A model folder holds `model.gin` with one binding per config field
(`DecoderOnlyConfig.emb_dim = 384`). It is read by a restricted parser: only
`T5Config.*` / `DecoderOnlyConfig.*` bindings to Python literals, nothing gin
would execute (imports, registrations, references to other configurables).
"""
from __future__ import annotations

import ast
import dataclasses
import os
from typing import Any, List

from specjax.models.decoder_only import DecoderOnlyConfig
from specjax.models.t5 import T5Config

MODEL_GIN = "model.gin"


WRITTEN_WHEN_SET = frozenset({"prompt_convention", "inputs_bidirectional_attention"})
"""Fields added after model.gin files were first written: written only when they differ
from their default, so the model.gin of an older folder still matches its config."""


def model_gin_text(config: Any) -> str:
  """gin bindings that rebuild `config` (e.g. `DecoderOnlyConfig.emb_dim = 384`)."""
  name = type(config).__name__
  lines = [f"# {name} of the checkpoints in this folder (written by specjax)."]
  lines += [f"{name}.{f.name} = {getattr(config, f.name)!r}"
            for f in dataclasses.fields(config)
            if f.name not in WRITTEN_WHEN_SET or getattr(config, f.name) != f.default]
  return "\n".join(lines) + "\n"


def _bindings(text: str) -> List[str]:
  return [l.strip() for l in text.splitlines() if l.strip() and not l.startswith("#")]


def bindings(text: str) -> List[str]:
  """The non-empty, non-comment lines of a model.gin text, stripped."""
  return [l.strip() for l in text.splitlines() if l.strip() and not l.startswith("#")]


def read_model_gin(path: str) -> Any:
  """The model config a `model.gin` (as `model_gin_text` writes it) describes.

  Args:
    path: a model.gin file, or the folder that holds one.
  Returns:
    A DecoderOnlyConfig or T5Config.
  Raises ValueError for a binding that is not `Config.field = python literal`.
  """
  if os.path.isdir(path):
    path = os.path.join(path, MODEL_GIN)
  classes = {"DecoderOnlyConfig": DecoderOnlyConfig, "T5Config": T5Config}
  with open(path, encoding="utf-8") as f:
    lines = bindings(f.read())
  names, kwargs = set(), {}
  for line in lines:
    key, sep, value = line.partition("=")
    name, _, field = key.strip().partition(".")
    if not sep or name not in classes or not field:
      raise ValueError(f"{path}: not a model.gin binding: {line!r}")
    names.add(name)
    kwargs[field] = ast.literal_eval(value.strip())
  if len(names) != 1:
    raise ValueError(f"{path} must bind exactly one of {sorted(classes)}, found {sorted(names)}")
  return classes[names.pop()](**kwargs)
