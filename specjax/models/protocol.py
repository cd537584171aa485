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
  token's final hidden state beside its logits, for feature-level drafters; with
  ``feature_layers`` (`FEATURE_LAYERS`) the hidden states of chosen layers, concatenated.
- For an encoder-decoder model ``encoded = encode(params, inputs[B, L_in])``
  holds what cross-attention needs (computed once per generation); a
  decoder-only model returns ``None`` and ignores ``encoded``.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Tuple, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

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


FEATURE_LAYERS = """A model's `feature_layers`: a tuple of distinct layer indices i in
[0, L] (L = `num_feature_layers`, the decoder's layer count): i < L the output of the
decoder's layer `layers_i` (its residual stream, before any norm), i = L the final hidden
state (after the final norm: what `decode_features` returns without `feature_layers`). The
features are those hidden states concatenated in the tuple's order, float32 [..., n * E].
`eagle3_feature_layers(L)` is EAGLE-3's low / middle / high choice."""


def eagle3_feature_layers(num_layers: int) -> Tuple[int, ...]:
  """EAGLE-3's (Li et al., 2025) low, middle and high features for an L-layer decoder, as
  `FEATURE_LAYERS` indices: the output of layer min(1, L // 4) (EAGLE-3 reads an early
  layer: the input of layer 2 of 32), of layer L // 2 - 1 (the middle: the input of layer
  L // 2), and for the high one the final hidden state L (where EAGLE-3 reads layer L - 3 of
  32: on a decoder of a few layers the final state is that near the top, and a head whose
  fusion selects it starts as a head of the final features alone). Distinct indices only:
  (0, 1) for one layer, (0, 1, 2) for two, (1, 2, 6) for six."""
  low = min(1, num_layers // 4)
  middle = max(num_layers // 2 - 1, low + 1)
  return tuple(sorted({low, min(middle, num_layers), num_layers}))


def check_feature_layers(feature_layers: Any, num_layers: int,
                         what: str = "feature_layers") -> Tuple[int, ...]:
  """`feature_layers` as a tuple of ints; ValueError naming `what` unless they are distinct
  layer indices in [0, num_layers] (`FEATURE_LAYERS`), at least one."""
  if isinstance(feature_layers, (str, bytes)) or not hasattr(feature_layers, "__iter__"):
    raise ValueError(f"{what} must be a tuple of layer indices, got {feature_layers!r}")
  layers = tuple(feature_layers)
  if (not layers or any(isinstance(i, bool) or not isinstance(i, (int, np.integer))
                        for i in layers)
      or len(set(layers)) != len(layers) or min(layers) < 0 or max(layers) > num_layers):
    raise ValueError(f"{what} must be distinct layer indices in [0, {num_layers}] (the "
                     f"decoder's {num_layers} layers' outputs, {num_layers} the final hidden "
                     f"state), at least one; got {feature_layers!r}")
  return tuple(int(i) for i in layers)


def layers_kwargs(feature_layers: Optional[Tuple[int, ...]]) -> dict:
  """`decode_features`' keyword for `feature_layers`: none when None, so a model that
  predates the keyword (final features only) is called as before."""
  return {} if feature_layers is None else {"feature_layers": feature_layers}


@runtime_checkable
class FeatureModel(DecodingModel, Protocol):
  """A `DecodingModel` that can also return its target features (opt-in): the final hidden
  state (after the final norm, before the output projection) of every token it scores.
  Feature-level drafters (`specjax.draft.FeatureDrafter`) read them; the plain `decode` is
  unchanged (and compiles the same) when they are not asked for."""

  @property
  def feature_dim(self) -> int:
    """Width E of a feature (of each layer's, with `feature_layers`)."""

  def decode_features(self, params: Params, cache: Cache, tokens: jax.Array,
                      positions: jax.Array, encoded: Encoded, *, tree: Any = None
                      ) -> Tuple[jax.Array, jax.Array, Cache]:
    """As `decode` (a chain call, or a tree call with `tree`) -> (float32 logits [B, k, V],
    float32 features [B, k, E], cache). A `LayerFeatureModel` also takes `feature_layers`."""

  def embed(self, params: Params, tokens: jax.Array) -> jax.Array:
    """tokens int32 [...] -> the model's input embeddings [..., E]."""

  def feature_logits(self, params: Params, features: jax.Array) -> jax.Array:
    """features [..., E] -> float32 logits [..., V] through the model's own output
    projection, so `decode`'s logits equal feature_logits(decode_features(...)[1])."""


@runtime_checkable
class LayerFeatureModel(FeatureModel, Protocol):
  """A `FeatureModel` that also returns the hidden states of chosen decoder layers, for
  EAGLE-3 heads (`FeatureHeadConfig.feature_layers`): `decode_features(...,
  feature_layers=(i, ...))` and the teacher-forced `features(..., feature_layers=...)` return
  them concatenated, float32 [..., n * E] (`FEATURE_LAYERS`); without the keyword they
  return what a `FeatureModel` does. The loops pass the keyword only to heads that read
  layers (`layers_kwargs`), so a model family offers EAGLE-1 heads with `FeatureModel` alone
  and adds this when it can return its layers' outputs (the Flax models both do)."""

  @property
  def num_feature_layers(self) -> int:
    """The decoder's layer count L: `feature_layers` index 0..L (`FEATURE_LAYERS`)."""


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
