"""The experiments' target/draft pairs: named by gin, the bundled ones, or random-init tiny
stand-ins with the real vocabulary (labelled so in every output)."""
from __future__ import annotations

import dataclasses

import jax

from specjax.app import build_model, bundled, gin_config, load_model
from specjax.models.decoder_only import DecoderOnlyConfig
from specjax.models.t5 import T5Config
from specjax.params import DRAFT_WEIGHTS_DTYPES, WEIGHTS_DTYPES, cast_kernels

RANDOM_NOTE = "random init: numbers are meaningless"
V = 8192  # the bundled SentencePiece vocabulary
RANDOM_CONFIGS = {  # tiny stand-ins with the real vocabulary
    "lm": (DecoderOnlyConfig(vocab_size=V, emb_dim=64, num_heads=4, num_layers=2, head_dim=16,
                             mlp_dim=128),
           DecoderOnlyConfig(vocab_size=V, emb_dim=32, num_heads=2, num_layers=1, head_dim=16,
                             mlp_dim=64)),
    "translate": (T5Config(vocab_size=V, emb_dim=64, num_heads=4, num_encoder_layers=2,
                           num_decoder_layers=2, head_dim=16, mlp_dim=128),
                  T5Config(vocab_size=V, emb_dim=32, num_heads=2, num_encoder_layers=1,
                           num_decoder_layers=1, head_dim=16, mlp_dim=64)),
}


@dataclasses.dataclass
class Pair(bundled.BundledPair):
  """A target/draft pair and where it came from ('gin' pairs as well as the bundled ones)."""
  source: str
  """Human-readable origin (checkpoint paths, or RANDOM_NOTE)."""

  @property
  def random_init(self) -> bool:
    return self.source.startswith("random init")

  @property
  def label(self) -> str:
    return f"{self.name} ({self.source})"


def pair_from_gin(seed: int) -> Pair:
  """The pair gin names: TARGET_MODEL / DRAFT_MODEL, TARGET_CHECKPOINT / DRAFT_CHECKPOINT
  (None: random init) and PAIR_TASK (default: by model family)."""
  target_ckpt = gin_config.query_macro("TARGET_CHECKPOINT")
  draft_ckpt = gin_config.query_macro("DRAFT_CHECKPOINT")
  for name, value in (("TARGET_CHECKPOINT", target_ckpt), ("DRAFT_CHECKPOINT", draft_ckpt)):
    if value is not None and not isinstance(value, str):
      raise ValueError(f"{name} must be a checkpoint path or None, got {value!r}")
  target, target_params = load_model(target_ckpt, "target", seed)
  draft, draft_params = load_model(draft_ckpt, "draft", seed + 1)
  task = gin_config.query_macro("PAIR_TASK") or (
      "translate_en_de" if target.is_encoder_decoder else "lm_ddtp_en")
  source = (f"target {target_ckpt}, draft {draft_ckpt}" if target_ckpt and draft_ckpt
            else RANDOM_NOTE)
  return Pair("gin", task, target, target_params, draft, draft_params, source)


def with_weights(pair: Pair, weights_dtype: str, draft_weights_dtype: str = "float32") -> Pair:
  """The pair with the target's weights (dense kernels and token embedding,
  `cast_kernels`) cast to `weights_dtype` and the draft's to `draft_weights_dtype`
  (labelled in source)."""
  target_params, draft_params, notes = pair.target_params, pair.draft_params, []
  if weights_dtype != "float32":
    target_params = cast_kernels(target_params, WEIGHTS_DTYPES[weights_dtype])
    notes.append(f"target weights {weights_dtype}")
  if draft_weights_dtype != "float32":
    draft_params = cast_kernels(draft_params, DRAFT_WEIGHTS_DTYPES[draft_weights_dtype])
    notes.append(f"draft weights {draft_weights_dtype}")
  if not notes:
    return pair
  return dataclasses.replace(pair, target_params=target_params, draft_params=draft_params,
                             source="; ".join([pair.source] + notes))


def load_pair(name: str, seed: int = 0) -> Pair:
  """A preset pair: the bundled trained checkpoints when shipped, else random init (labelled)."""
  if name not in bundled.PAIRS:
    raise ValueError(f"unknown pair {name!r}; expected one of {sorted(bundled.PAIRS)}")
  if bundled.available(name, "target") and bundled.available(name, "draft"):
    target, tp = bundled.load(name, "target")
    draft, dp = bundled.load(name, "draft")
    source = ", ".join(str(bundled.checkpoint_dir(name, r).relative_to(bundled.PAIRS_DIR.parent))
                       for r in ("target", "draft"))
    return Pair(name, bundled.PAIRS[name], target, tp, draft, dp, f"trained: {source}")
  target_cfg, draft_cfg = RANDOM_CONFIGS[name]
  target, draft = build_model(target_cfg), build_model(draft_cfg)
  return Pair(name, bundled.PAIRS[name], target, target.init(jax.random.PRNGKey(seed)), draft,
              draft.init(jax.random.PRNGKey(seed + 1)), RANDOM_NOTE)


def tiny_model(pair: Pair, seed: int = 7):
  """(model, params) of the small third model of hierarchical drafting, or None.

  The bundled PAIR/tiny for a trained pair; a random-init one beside a random-init
  pair (smoke runs); None when a trained pair has none shipped.
  """
  if not pair.random_init and bundled.available(pair.name, "tiny"):
    return bundled.load(pair.name, "tiny")
  if pair.random_init:
    family = "lm" if not pair.target.is_encoder_decoder else "translate"
    small = dataclasses.replace(RANDOM_CONFIGS[family][1], emb_dim=16, mlp_dim=32)
    model = build_model(small)
    return model, model.init(jax.random.PRNGKey(seed))
  return None
