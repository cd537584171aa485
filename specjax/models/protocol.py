"""The model protocol the decode loops see.

The decoding functions never see Flax modules. A model is an object with a few
pure functions; tests plug in fake models (fixed probability tables) through the
same protocol.

Cache semantics (shared by every implementation):
- ``init_cache(batch, max_len)`` allocates every buffer once: O(batch * max_len).
- ``decode(params, cache, tokens[B, k], positions[B], encoded)`` writes the k
  tokens of row b at cache slots ``positions[b] .. positions[b] + k - 1`` and
  returns logits for each of them. Query ``positions[b] + i`` attends to keys at
  slots ``<= positions[b] + i`` (causal); slots beyond are masked. So rolling
  back a rejected guess is only moving the row's length: stale slots are
  overwritten before any query can see them.
- Optionally (``accepts_logits_at = True``, as the Flax models), ``decode`` takes
  ``logits_at`` int32 [B] and returns only the logits of tokens[b, logits_at[b]]
  ([B, 1, V]); `decode_logits_at` calls any model that way or falls back to a
  gather from the full logits.
- Optionally (`FeatureModel`, as the Flax models), ``decode_features`` returns each
  token's final hidden state beside its logits, for feature-level drafters.
- For an encoder-decoder model ``encoded = encode(params, inputs[B, L_in])``
  holds what cross-attention needs (computed once per generation); a
  decoder-only model returns ``None`` and ignores ``encoded``.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Tuple, runtime_checkable

import jax
import jax.numpy as jnp

Params = Any  # a nested dict of arrays with T5X names
Cache = Any  # a pytree of arrays
Encoded = Any  # a pytree of arrays, or None


@runtime_checkable
class DecodingModel(Protocol):
  """What `specjax.decoding` needs from a model (target or draft)."""

  @property
  def vocab_size(self) -> int:
    """Size of the logits' last axis."""

  @property
  def is_encoder_decoder(self) -> bool:
    """True when `encode` must be called on the inputs (T5); False for decoder-only."""

  def encode(self, params: Params, inputs: jax.Array) -> Encoded:
    """inputs: int32 [B, L_in] (0 = padding) -> opaque pytree, or None."""

  def init_cache(self, batch: int, max_len: int) -> Cache:
    """Zeroed KV cache for `batch` rows of `max_len` decoder slots."""

  def decode(self, params: Params, cache: Cache, tokens: jax.Array,
             positions: jax.Array, encoded: Encoded
             ) -> Tuple[jax.Array, Cache]:
    """tokens: int32 [B, k]; positions: int32 [B] -> (float32 logits [B, k, V], cache)."""


@runtime_checkable
class FeatureModel(DecodingModel, Protocol):
  """A `DecodingModel` that can also return its target features (opt-in): the final hidden
  state (after the final norm, before the output projection) of every token it scores.
  Feature-level drafters (`specjax.draft.FeatureDrafter`) read them; the plain `decode` is
  unchanged (and compiles the same) when they are not asked for."""

  @property
  def feature_dim(self) -> int:
    """Width E of a feature."""

  def decode_features(self, params: Params, cache: Cache, tokens: jax.Array,
                      positions: jax.Array, encoded: Encoded, *, tree: Any = None
                      ) -> Tuple[jax.Array, jax.Array, Cache]:
    """As `decode` (a chain call, or a tree call with `tree`) -> (float32 logits [B, k, V],
    float32 features [B, k, E], cache)."""

  def embed(self, params: Params, tokens: jax.Array) -> jax.Array:
    """tokens int32 [...] -> the model's input embeddings [..., E]."""

  def feature_logits(self, params: Params, features: jax.Array) -> jax.Array:
    """features [..., E] -> float32 logits [..., V] through the model's own output
    projection, so `decode`'s logits equal feature_logits(decode_features(...)[1])."""


def decode_logits_at(model: DecodingModel, params: Params, cache: Cache, tokens: jax.Array,
                     positions: jax.Array, encoded: Encoded, index: jax.Array
                     ) -> Tuple[jax.Array, Cache]:
  """`model.decode` when only one token's logits per row are needed.

  tokens: int32 [B, k]; index: int32 [B] in [0, k) -> (float32 logits [B, V] of
  tokens[b, index[b]], cache). A model with `accepts_logits_at` computes the final norm
  and the vocabulary product for that token only (a drafter's catch-up window needs one
  distribution of its k tokens); any other model decodes all k and the row is gathered.
  """
  if getattr(model, "accepts_logits_at", False):
    logits, cache = model.decode(params, cache, tokens, positions, encoded, logits_at=index)
    return logits[:, 0], cache
  logits, cache = model.decode(params, cache, tokens, positions, encoded)
  return jnp.take_along_axis(logits, index[:, None, None], axis=1)[:, 0], cache


def check_same_vocab(target: DecodingModel, draft_vocab_size: Optional[int]) -> None:
  """Raises ValueError when target and draft vocabularies differ."""
  if draft_vocab_size is not None and draft_vocab_size != target.vocab_size:
    raise ValueError(
        f"target and draft vocabularies differ: target vocab_size="
        f"{target.vocab_size}, draft vocab_size={draft_vocab_size}; "
        "speculative decoding needs one shared vocabulary")
