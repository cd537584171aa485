"""The trained target/draft pairs shipped in the package, by name.

    from specjax.app import bundled
    pair = bundled.load_pair("lm")        # decoder-only LM pair (English descriptions)
    pair = bundled.load_pair("translate") # T5 1.1 EN->DE pair

Each model lives in `specjax/assets/pairs/PAIR/ROLE/` as a folder written by
`specjax.train` (`model.gin` + one bfloat16 T5X legacy `checkpoint_N/` +
`train_summary.json`), made by `python -m experiments.train_bundled`.

gin and the command line name them `bundled:PAIR/ROLE`, e.g.
`--gin.TARGET_MODEL="'bundled:lm/target'" --gin.TARGET_CHECKPOINT="'bundled:lm/target'"`:
as a model gin file that is the folder's model.gin, as a checkpoint its latest
`checkpoint_N`, wherever the package is installed.
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Dict, Tuple

import jax
import jax.numpy as jnp

from specjax.checkpoints import load_t5x_for_model
from specjax.models import FeatureHead, FeatureHeadConfig, build_model, read_model_gin

PAIRS_DIR = Path(__file__).resolve().parents[1] / "assets" / "pairs"
PAIRS = {"lm": "lm_ddtp_en", "translate": "translate_en_de"}
"""Bundled pair -> its task (the bundled evaluation split in specjax/assets/eval)."""
ROLES = ("target", "draft", "tiny", "eagle", "eagle3")
"""A pair's models: its target, its draft, a tiny smoke model (LM) and feature heads trained
for its target: 'eagle' reads the target's final hidden states and was trained teacher-forced
(EAGLE-1); 'eagle3' reads a fusion of three layers' hidden states (EAGLE-3's fused features)
and was trained on its own rollouts (training-time test; the LM pair's on teacher data decoded
past EOS)."""
PREFIX = "bundled:"
_CKPT = re.compile(r"checkpoint_(\d+)")


def model_dir(pair: str, role: str) -> Path:
  """specjax/assets/pairs/PAIR/ROLE; ValueError for an unknown pair or role."""
  if pair not in PAIRS:
    raise ValueError(f"unknown bundled pair {pair!r}; expected one of {sorted(PAIRS)}")
  if role not in ROLES:
    raise ValueError(f"unknown role {role!r} of a bundled pair; expected one of {ROLES}")
  return PAIRS_DIR / pair / role


def available(pair: str, role: str = "target") -> bool:
  """Whether PAIR/ROLE is shipped (its model.gin and a checkpoint are present)."""
  folder = model_dir(pair, role)
  return (folder / "model.gin").is_file() and any(
      _CKPT.fullmatch(p.name) for p in folder.glob("checkpoint_*"))


def checkpoint_dir(pair: str, role: str) -> Path:
  """The latest checkpoint_N folder of PAIR/ROLE; FileNotFoundError if none is shipped."""
  folder = model_dir(pair, role)
  found = sorted((int(m.group(1)), p) for p in folder.glob("checkpoint_*")
                 if (m := _CKPT.fullmatch(p.name)))
  if not found or not (folder / "model.gin").is_file():
    raise FileNotFoundError(
        f"the bundled {pair}/{role} model is not in {folder} (model.gin + checkpoint_N/); "
        "train and ship it with `python -m experiments.train_bundled`")
  return found[-1][1]


def resolve(name: str, what: str) -> str:
  """'bundled:PAIR/ROLE' -> a path ('model' -> its model.gin, 'checkpoint' -> checkpoint_N);
  any other string is returned unchanged."""
  if not isinstance(name, str) or not name.startswith(PREFIX):
    return name
  pair, _, role = name[len(PREFIX):].partition("/")
  if what == "model":
    checkpoint_dir(pair, role)  # the same clear error when it is missing
    return str(model_dir(pair, role) / "model.gin")
  if what == "checkpoint":
    return str(checkpoint_dir(pair, role))
  raise ValueError(f"what must be 'model' or 'checkpoint', got {what!r}")


def train_summary(pair: str, role: str) -> Dict[str, Any]:
  """The shipped train_summary.json of PAIR/ROLE ({} when absent)."""
  path = model_dir(pair, role) / "train_summary.json"
  return json.loads(path.read_text()) if path.is_file() else {}


def load(pair: str, role: str) -> Tuple[Any, Any]:
  """(model, float32 params as jax arrays) of the bundled PAIR/ROLE (the 'eagle' and 'eagle3'
  roles: a `FeatureHead` and its params)."""
  ckpt = checkpoint_dir(pair, role)
  config = read_model_gin(str(ckpt.parent))
  model = FeatureHead(config) if isinstance(config, FeatureHeadConfig) else build_model(config)
  params = load_t5x_for_model(str(ckpt), model, dtype="float32")
  return model, jax.tree.map(jnp.asarray, params)


@dataclasses.dataclass
class BundledPair:
  """A shipped target/draft pair."""
  name: str
  """'lm' or 'translate'."""
  task: str
  """Its bundled evaluation split ('lm_ddtp_en' or 'translate_en_de')."""
  target: Any
  target_params: Any
  draft: Any
  draft_params: Any


def load_pair(name: str) -> BundledPair:
  """The bundled target and draft of `name` ('lm' or 'translate')."""
  target, target_params = load(name, "target")
  draft, draft_params = load(name, "draft")
  return BundledPair(name, PAIRS[name], target, target_params, draft, draft_params)
