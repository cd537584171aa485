"""`NetworkModel`: the plumbing T5Model and DecoderOnlyModel share around their Flax networks
(parameters with T5X names, their shapes and check, the cache, jitted application)."""
from __future__ import annotations

import functools
from typing import Any, Optional, Tuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specjax.models.checks import check_cache
from specjax.models.layers import (DTYPES, KEY_SLOT_AXIS, VALUE_SLOT_AXIS, Array, KVCache,
                                   project, write_rows, zeros_cache)
from specjax.models.protocol import check_feature_layers
from specjax.models.tree import gather_slots
from specjax.params import check_params_match, quantize


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _init_network(net: nn.Module, method: str, num_inputs: int, rng: Array) -> Any:
  tokens = jnp.ones((1, 1), jnp.int32)
  return net.init(rng, *([tokens] * num_inputs), method=method)["params"]


@functools.lru_cache(maxsize=64)
def _network_shapes(net: nn.Module, method: str, num_inputs: int) -> Any:
  return flax.core.unfreeze(jax.eval_shape(
      functools.partial(_init_network, net, method, num_inputs), jax.random.PRNGKey(0)))


@functools.partial(jax.jit, static_argnums=(0, 1))
def apply_network(net: nn.Module, method: str, params: Any, *args: Any) -> Any:
  """Jitted `net.apply`; equal networks (equal configs) share compiled code."""
  return net.apply({"params": params}, *args, method=method)


def check_token_ids(token_ids: Any, vocab_size: int) -> Array:
  """`token_ids` as int32 [K]; ValueError unless they are K >= 1 distinct ids in [0, V)."""
  ids = np.asarray(token_ids)
  if (ids.ndim != 1 or ids.size < 1 or not np.issubdtype(ids.dtype, np.integer)
      or ids.min() < 0 or ids.max() >= vocab_size or np.unique(ids).size != ids.size):
    raise ValueError(f"token_ids must be distinct token ids in [0, {vocab_size}), "
                     f"int [K] with K >= 1; got shape {ids.shape}, dtype {ids.dtype}")
  return jnp.asarray(ids, jnp.int32)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def apply_network_layers(net: nn.Module, method: str, feature_layers: Tuple[int, ...],
                         params: Any, *args: Any) -> Any:
  """`apply_network` of a features method with static `feature_layers` (its last argument)."""
  return net.apply({"params": params}, *args, feature_layers, method=method)


class NetworkModel:
  """Plumbing shared by T5Model and DecoderOnlyModel (params, shapes, cache).

  Subclasses set `_net` (a hashable Flax module), `_init_method` (the module
  method that touches every parameter) and `_init_inputs` (how many int32
  [1, 1] token arrays it takes).
  """
  is_encoder_decoder: bool = False
  accepts_logits_at: bool = True  # decode(..., logits_at=...): see specjax.models.protocol
  _net: nn.Module
  _init_method: str = "forward"
  _init_inputs: int = 1

  def __init__(self, config: Any, num_decoder_layers: int):
    self.config = config
    self._num_decoder_layers = num_decoder_layers

  def _key(self) -> Tuple[Any, ...]:
    return (type(self), self.config, getattr(self, "prefix_lm", False))

  def __eq__(self, other: Any) -> bool:
    """Models with equal configs are interchangeable (e.g. as jit static args)."""
    return isinstance(other, NetworkModel) and self._key() == other._key()

  def __hash__(self) -> int:
    return hash(self._key())

  @property
  def vocab_size(self) -> int:
    """Size of the logits' last axis."""
    return self.config.vocab_size

  def init(self, rng: Any) -> Any:
    """Random float32 parameters with T5X names and T5X initializers.

    Args:
      rng: a PRNG key (or an int seed).

    Returns:
      Nested dict of arrays, no top-level 'params' wrapper.
    """
    if isinstance(rng, (int, np.integer)):
      rng = jax.random.PRNGKey(int(rng))
    return flax.core.unfreeze(
        _init_network(self._net, self._init_method, self._init_inputs, rng))

  def param_shapes(self) -> Any:
    """The parameter tree as jax.ShapeDtypeStruct leaves (no computation)."""
    shapes = _network_shapes(self._net, self._init_method, self._init_inputs)
    return jax.tree_util.tree_map(lambda x: x, shapes)  # a copy: the cache stays intact

  def check_params(self, params: Any, what: str = "parameters") -> None:
    """Raises ValueError naming the first parameter that does not fit the config."""
    if not hasattr(params, "keys"):
      raise ValueError(f"{what} must be a nested dict of arrays, got {type(params).__name__}")
    keys = set(params.keys())
    if len(keys) == 1 and keys & {"params", "target"}:
      raise ValueError(f"{what} is wrapped in {{'{keys.pop()}': ...}}; pass the tree "
                       "inside it (T5X names at the top level)")
    check_params_match(params, _network_shapes(self._net, self._init_method,
                                               self._init_inputs), what)

  def init_cache(self, batch: int, max_len: int) -> KVCache:
    """Zeroed cache: per decoder layer keys [batch, H, D, max_len] and values
    [batch, H, max_len, D]."""
    cfg = self.config
    return zeros_cache(batch, max_len, self._num_decoder_layers, cfg.num_heads,
                       cfg.head_dim, DTYPES[cfg.dtype])

  def _apply(self, method: str, params: Any, *args: Any) -> Any:
    return apply_network(self._net, method, params, *args)

  # Target features (opt-in; `specjax.models.FeatureModel`), the same for both families: the
  # decoder's final hidden state after `decoder_norm`, its embedding and output projection.
  @property
  def feature_dim(self) -> int:
    """Width E of the features `decode_features` returns (of each chosen layer's)."""
    return self.config.emb_dim

  @property
  def num_feature_layers(self) -> int:
    """The decoder's layer count L: `feature_layers` index 0..L (`FEATURE_LAYERS`)."""
    return self._num_decoder_layers

  def _apply_features(self, method: str, feature_layers: Any, params: Any, *args: Any) -> Any:
    """A features method: without `feature_layers` the same compiled code as before they
    existed; with them checked (`check_feature_layers`) and static."""
    if feature_layers is None:
      return self._apply(method, params, *args)
    layers = check_feature_layers(feature_layers, self._num_decoder_layers)
    return apply_network_layers(self._net, method, layers, params, *args)

  def embed(self, params: Any, tokens: Any) -> Array:
    """tokens int32 [...] -> the model's (shared) input embeddings [..., E]."""
    return self._apply("embed", params, jnp.asarray(tokens, jnp.int32))

  def feature_logits(self, params: Any, features: Any) -> Array:
    """features [..., E] -> float32 logits [..., V] through the model's own output projection
    (the embedding / sqrt(E) when `logits_via_embedding`, else `logits_dense`); `output_rows`
    and `rows_logits` give the logits of chosen token ids only."""
    return self._apply("output_logits", params, features)

  def output_rows(self, params: Any, token_ids: Any) -> Array:
    """The output projection's weights of `token_ids` int [K] only, in that order (the
    embedding rows [K, E] with `logits_via_embedding`, else decoder/logits_dense/kernel's
    columns [E, K]), for `rows_logits`. ValueError unless the ids are distinct and in
    [0, V)."""
    ids = check_token_ids(token_ids, self.vocab_size)
    if self.config.logits_via_embedding:
      owner = params if "token_embedder" in params else params["decoder"]  # T5 / decoder-only
      return jnp.take(owner["token_embedder"]["embedding"], ids, axis=0)
    return jnp.take(params["decoder"]["logits_dense"]["kernel"], ids, axis=1)

  def rows_logits(self, rows: Array, features: Any, scales: Optional[Array] = None) -> Array:
    """features [..., E] -> float32 logits [..., K] of the ids `rows` (`output_rows`) was cut
    to: `feature_logits(params, features)[..., ids]` at the cost of K columns. int8 rows
    (`quantize_rows`) need their `scales` [K]."""
    if self.config.logits_via_embedding:
      return (project(features, rows, transposed=True, scales=scales)
              / jnp.sqrt(jnp.float32(self.feature_dim)))
    return project(features, rows, scales=scales)

  def quantize_rows(self, rows: Array) -> Tuple[Array, Array]:
    """`output_rows`' weights -> (int8 values, float32 scales [K]), one scale per token id
    (`specjax.params.quantize`), for `rows_logits` in int8."""
    return quantize(rows, 0 if self.config.logits_via_embedding else 1)

  def move_slots(self, cache: KVCache, src: Any, dst: Any) -> KVCache:
    """Copies each row's cache slots src[b, i] to dst[b] + i (all read before any write).

    src: int32 [B, n]; dst: int32 [B]. After a tree call, the accepted path's slots move
    to the slots after the committed tokens (`specjax.models.tree`).
    """
    src, dst = jnp.asarray(src, jnp.int32), jnp.asarray(dst, jnp.int32)
    keys = tuple(write_rows(k, gather_slots(k, src, KEY_SLOT_AXIS), dst, KEY_SLOT_AXIS)
                 for k in cache.keys)
    values = tuple(write_rows(v, gather_slots(v, src, VALUE_SLOT_AXIS), dst, VALUE_SLOT_AXIS)
                   for v in cache.values)
    return KVCache(keys=keys, values=values)

  def _check_cache(self, cache: Any, batch: int) -> None:
    cfg = self.config
    check_cache(cache, batch, self._num_decoder_layers, cfg.num_heads, cfg.head_dim)
