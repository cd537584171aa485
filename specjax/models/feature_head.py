"""A feature head: a T5X decoder layer (or a few) that predicts the target's next feature (EAGLE).

The target's feature at position p is its final hidden state there (after `decoder_norm`,
before the output projection; `specjax.models.FeatureModel`). The head runs over the same
positions as the target: at position p it reads [f_{p-1}, embedding(x_p)] (f_{-1} = 0, the
embedding the target's own frozen input embedding), projects the concatenation to E
(`input_projection`, as EAGLE's fc), runs one decoder layer (`num_layers` of them) with its
own KV cache and a final RMSNorm, and predicts f_p; the target's own `feature_logits(f_p)`
then give the distribution of x_{p+1}. The head's parameters hold no vocabulary matrix.

With `feature_layers` (EAGLE-3's fused features) the head reads, in place of the target's
final feature f_{p-1}, the fusion g_{p-1} = `feature_fusion`(h_{p-1}) of the target's hidden
states at the chosen layers (`specjax.models.protocol.FEATURE_LAYERS`, concatenated,
[n * E] -> E): a drafter fuses the target's true hidden states with `fuse_layers` before
feeding them, and feeds its own predictions (E wide) unfused, as EAGLE-3 does from the second
guess on. Without it (EAGLE-1's head, the shipped ones) the parameters are those below and
nothing is fused. `rollout` runs the head teacher-forced over K guesses per position at once
(training-time test, `specjax.train.feature_head`).

With `cross_attention` (an encoder-decoder target) the layer also attends to the source: its
queries read the target's own last decoder layer's cross-attention keys and values
(`EncodedInputs.keys[-1]`, `values[-1]`, computed once per generation by the target's
`encode`), so the head sees the encoder output through the target's projections and holds
only a query and an output kernel for it.

Parameter tree (T5X names): `input_projection/kernel [2E, E]`, `relpos_bias/rel_embedding
[H, 32]`, `layers_0/{pre_self_attention_layer_norm, self_attention/{query,key,value,out},
pre_mlp_layer_norm, mlp/{wi_0,wi_1,wo}}` (and `layers_1` .. alike with `num_layers`),
`decoder_norm/scale [E]`; with `cross_attention` also each layer's
`{pre_cross_attention_layer_norm, encoder_decoder_attention/{query,out}}`; with
n `feature_layers` also `feature_fusion/kernel [n * E, E]`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specjax.models.decoder_only import (DecoderLayer, causal_bias, chain_bias, joined_bias,
                                         tree_bias)
from specjax.checks import check_int
from specjax.models.checks import check_dtype_and_attention, check_tree
from specjax.models.layers import (DTYPES, Array, Dense, EncodedInputs, KVCache,
                                   RelativePositionBias, RMSNorm, activation_fn, mask_to_bias,
                                   mlp_kernel_init, zeros_cache)
from specjax.models.network import apply_network
from specjax.models.protocol import LayerFeatureModel, check_feature_layers
from specjax.models.tree import TreeAttention
from specjax.params import check_params_match

Cross = Tuple[Array, Array, Array]  # keys [B, H, D, L_in], values [B, H, L_in, D], bias [B, 1, 1, L_in]


@dataclasses.dataclass(frozen=True)
class FeatureHeadConfig:
  """Sizes of a feature head (field names of T5X's TransformerConfig)."""
  vocab_size: int
  """The vocabulary of the target it reads (it holds no vocabulary matrix itself)."""
  emb_dim: int
  """Width E of the target's features and embeddings (the head's residual stream too)."""
  num_heads: int
  """Attention heads H of its one layer."""
  head_dim: int
  """Width D of each head."""
  mlp_dim: int
  """Hidden width of its MLP."""
  mlp_activations: Tuple[str, ...] = ("gelu", "linear")
  """One name per MLP input kernel, as `DecoderOnlyConfig.mlp_activations`."""
  dtype: str = "float32"
  """Activation, compute and cache dtype; parameters stay float32."""
  attention_impl: str = "specjax"
  """How the layer's attention is computed (`layers.ATTENTION_IMPLEMENTATIONS`), as on the
  target's configs; same parameters."""
  cross_attention: bool = False
  """Attend to an encoder-decoder target's source through the target's last decoder layer's
  cross-attention keys and values (module docstring); num_heads and head_dim then equal the
  target's."""
  feature_layers: Optional[Tuple[int, ...]] = None
  """None: read the target's final features (EAGLE-1). A tuple of the target's layer indices
  (`specjax.models.protocol.FEATURE_LAYERS`; `eagle3_feature_layers(L)` is EAGLE-3's choice):
  read their hidden states, fused by one projection (module docstring)."""
  num_layers: int = 1
  """Decoder layers L_h (`layers_0` .. `layers_{L_h - 1}`, each with its own KV cache); the
  shipped heads have one (EAGLE's)."""

  def __post_init__(self):
    name = type(self).__name__
    for field in ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim", "num_layers"):
      check_int(f"{name}.{field}", getattr(self, field), low=1, expected="a positive integer")
    acts = self.mlp_activations
    if isinstance(acts, str) or not isinstance(acts, (tuple, list)) or not acts:
      raise ValueError(f"{name}.mlp_activations must be a non-empty tuple of names, got {acts!r}")
    object.__setattr__(self, "mlp_activations", tuple(acts))  # gin may give a list
    for act in self.mlp_activations:
      activation_fn(act)
    if not isinstance(self.cross_attention, bool):
      raise ValueError(f"{name}.cross_attention must be True or False, "
                       f"got {self.cross_attention!r}")
    check_dtype_and_attention(self)
    if self.feature_layers is not None:  # the upper bound is the target's (`check_target`)
      layers = check_feature_layers(self.feature_layers, 1 << 30, f"{name}.feature_layers")
      object.__setattr__(self, "feature_layers", layers)  # gin may give a list

  @property
  def feature_width(self) -> int:
    """Width of the target features the head is fed: n * E with n `feature_layers`, else E."""
    return self.emb_dim * (1 if self.feature_layers is None else len(self.feature_layers))


class FeatureHeadNetwork(nn.Module):
  """Flax module of the head (module docstring)."""
  config: FeatureHeadConfig

  def setup(self):
    cfg, dtype = self.config, DTYPES[self.config.dtype]
    self.input_projection = Dense(cfg.emb_dim, mlp_kernel_init, dtype)
    self.relpos_bias = RelativePositionBias(cfg.num_heads)
    self.layers = [DecoderLayer(cfg, cross_attention=cfg.cross_attention)
                   for _ in range(cfg.num_layers)]  # flax names them layers_0, layers_1, ..
    self.decoder_norm = RMSNorm(dtype)
    if cfg.feature_layers is not None:
      self.feature_fusion = Dense(cfg.emb_dim, mlp_kernel_init, dtype)

  def fuse_layers(self, features: Array) -> Array:
    """The target's hidden states [..., n * E] -> the fused feature float32 [..., E]."""
    if self.config.feature_layers is None:
      return features.astype(jnp.float32)
    return self.feature_fusion(features.astype(DTYPES[self.config.dtype])).astype(jnp.float32)

  def init_all(self, features: Array, embedded: Array, cross: Optional[Cross]) -> Array:
    """Touches every parameter (initialization): `fuse_layers`, then `forward`."""
    return self.forward(shift_features(self.fuse_layers(features)), embedded, cross)

  def rollout(self, prev_features: Array, embedded: Array, steps: int,
              cross: Optional[Cross] = None) -> Array:
    """Teacher-forced over `steps` guesses per position: prev_features [B, L, E] (the fused
    true features, shifted), embedded [B, L, E] -> predicted features float32
    [steps, B, L, E].

    Step 0 is `forward`. Step k at position p is the head's k-th further guess after the
    committed prefix 0 .. p - k: it reads step k - 1's prediction at p - 1 and embedding(x_p),
    and attends to step 0's keys at positions <= p - k (the prefix, fed true features) and to
    step j's key at position p - k + j for j = 1 .. k (its own earlier guesses), as a
    chain's k-th guess sees the head's cache. Steps' keys sit in one cache of steps * L
    slots (step j at slots j * L ..). Positions p < k have no such prefix (their values are
    not a decode's)."""
    batch, length = embedded.shape[:2]
    slots = jnp.arange(steps * length, dtype=jnp.int32)
    slot_pos, slot_step = slots % length, slots // length  # [S]
    pos = jnp.arange(length, dtype=jnp.int32)
    old_rel = self.relpos_bias(pos[None], slot_pos, False)  # [1, H, L, S]
    new_rel = self.relpos_bias(pos[None], pos, False)  # [1, H, L, L]
    cfg = self.config
    dtype = DTYPES[cfg.dtype]
    caches = [(jnp.zeros((batch, cfg.num_heads, cfg.head_dim, slots.shape[0]), dtype),
               jnp.zeros((batch, cfg.num_heads, slots.shape[0], cfg.head_dim), dtype))
              for _ in range(cfg.num_layers)]
    query, key, step = pos[:, None], slot_pos[None, :], slot_step[None, :]  # [L, 1], [1, S]
    outputs, inputs = [], prev_features
    for k in range(steps):
      old_visible = (((step == 0) & (key <= query - k))  # [L, S]; step 0: nothing written
                     | ((step >= 1) & (key == query - k + step))) & (step < k)
      new_visible = pos[None, :] <= query if k == 0 else pos[None, :] == query  # [L, L]
      old_bias = jnp.broadcast_to(old_rel + mask_to_bias(old_visible)[None, None],
                                  (batch,) + old_rel.shape[1:])
      new_bias = new_rel + mask_to_bias(new_visible)[None, None]
      starts = jnp.full((batch,), k * length, jnp.int32)
      bias = (old_bias, new_bias, joined_bias(old_bias, new_bias, starts))
      x = self._fuse(inputs, embedded)
      for i, layer in enumerate(self.layers):
        x, caches[i] = layer(x, bias, caches[i], starts, cross)
      outputs.append(self.decoder_norm(x).astype(jnp.float32))
      inputs = shift_features(outputs[-1])
    return jnp.stack(outputs)

  def _fuse(self, prev_features: Array, embedded: Array) -> Array:
    dtype = DTYPES[self.config.dtype]
    return self.input_projection(jnp.concatenate(
        [prev_features.astype(dtype), embedded.astype(dtype)], axis=-1))

  def forward(self, prev_features: Array, embedded: Array, cross: Optional[Cross] = None
              ) -> Array:
    """Teacher-forced: [B, L, E] twice -> predicted features float32 [B, L, E]."""
    bias = causal_bias(self.relpos_bias, prev_features.shape[1])
    x = self._fuse(prev_features, embedded)
    for layer in self.layers:
      x, _ = layer(x, bias, None, None, cross)
    return self.decoder_norm(x).astype(jnp.float32)

  def decode_step(self, prev_features: Array, embedded: Array, positions: Array,
                  cache: KVCache, tree: Optional[TreeAttention] = None,
                  cross: Optional[Cross] = None) -> Tuple[Array, KVCache]:
    """Cached step at slots positions[b] + i, a chain or (`tree`) a token tree ->
    (features float32 [B, k, E], cache)."""
    if tree is None:
      bias = chain_bias(self.relpos_bias, positions, prev_features.shape[1], cache.max_len)
    else:
      bias = tree_bias(self.relpos_bias, tree, positions,
                       jnp.arange(cache.max_len, dtype=jnp.int32))
    x, keys, values = self._fuse(prev_features, embedded), [], []
    for i, layer in enumerate(self.layers):
      x, (k, v) = layer(x, bias, (cache.keys[i], cache.values[i]), positions, cross)
      keys.append(k)
      values.append(v)
    return (self.decoder_norm(x).astype(jnp.float32),
            KVCache(keys=tuple(keys), values=tuple(values)))


@dataclasses.dataclass(frozen=True)
class FeatureHead:
  """The head behind pure functions (hashable: a jit static argument, a drafter field).

  Example:
    head = FeatureHead(FeatureHeadConfig(vocab_size=V, emb_dim=E, num_heads=2, head_dim=8,
                                         mlp_dim=32))
    params = head.init(jax.random.PRNGKey(0))
    predicted = head.forward(params, shift_right(features), target.embed(tp, tokens))
  """
  config: FeatureHeadConfig

  @property
  def _net(self) -> FeatureHeadNetwork:
    return FeatureHeadNetwork(self.config)

  def init(self, rng: Any) -> Any:
    """Random float32 parameters with T5X names (module docstring)."""
    if isinstance(rng, (int, np.integer)):
      rng = jax.random.PRNGKey(int(rng))
    return flax.core.unfreeze(_init(self._net, rng))

  def check_params(self, params: Any, what: str = "feature head parameters") -> None:
    """ValueError naming the first parameter that does not fit the config."""
    if not hasattr(params, "keys"):
      raise ValueError(f"{what} must be a nested dict of arrays, got {type(params).__name__}")
    check_params_match(params, self.param_shapes(), what)

  def param_shapes(self) -> Any:
    """The parameter tree as jax.ShapeDtypeStruct leaves (no computation)."""
    return flax.core.unfreeze(jax.eval_shape(lambda: _init(self._net, jax.random.PRNGKey(0))))

  def check_target(self, target: Any) -> None:
    """ValueError, naming both shapes, unless `target` has this head's feature width and
    vocabulary (a head only fits the target it was trained for), and with `cross_attention`
    is an encoder-decoder model with the head's num_heads and head_dim."""
    cfg = self.config
    target_dim = target.feature_dim
    if (cfg.emb_dim, cfg.vocab_size) != (target_dim, target.vocab_size):
      raise ValueError(f"the feature head was built for a target with emb_dim {cfg.emb_dim} "
                       f"and vocab_size {cfg.vocab_size}, but this target has emb_dim "
                       f"{target_dim} and vocab_size {target.vocab_size}")
    if cfg.feature_layers is not None:
      if not isinstance(target, LayerFeatureModel):
        raise ValueError(f"the feature head reads the target's layers {cfg.feature_layers} "
                         "(FeatureHeadConfig.feature_layers), but this target "
                         f"({type(target).__name__}) returns its final features only (it is "
                         "no specjax.models.protocol.LayerFeatureModel)")
      layers = target.num_feature_layers
      if max(cfg.feature_layers) > layers:
        raise ValueError(f"the feature head reads the target's layers {cfg.feature_layers} "
                         f"(FeatureHeadConfig.feature_layers), but this target has "
                         f"{layers} decoder layers: indices 0..{layers} ({layers} the final "
                         "hidden state)")
    if not cfg.cross_attention:
      return
    if not getattr(target, "is_encoder_decoder", False):
      raise ValueError("a feature head with cross_attention reads an encoder-decoder "
                       f"target's source; this target ({type(target).__name__}) has none")
    heads = (target.config.num_heads, target.config.head_dim)
    if (cfg.num_heads, cfg.head_dim) != heads:
      raise ValueError(f"a feature head with cross_attention reads the target's last "
                       f"cross-attention keys and values: it needs num_heads {heads[0]} and "
                       f"head_dim {heads[1]} as the target, got {cfg.num_heads} and "
                       f"{cfg.head_dim}")

  def fuse_layers(self, params: Any, features: Array) -> Array:
    """The target's features [..., feature_width] (its `feature_layers`' hidden states
    concatenated) -> what the head reads float32 [..., E]: their fusion; unchanged without
    `feature_layers`."""
    if self.config.feature_layers is None:
      return jnp.asarray(features, jnp.float32)
    return apply_network(self._net, "fuse_layers", params, features)

  def rollout(self, params: Any, prev_features: Array, embedded: Array, steps: int,
              encoded: Optional[EncodedInputs] = None) -> Array:
    """Training-time test: `steps` guesses per position teacher-forced in one call
    (`FeatureHeadNetwork.rollout`): prev_features [B, L, E] (the fused true features,
    shifted: `shift_features(fuse_layers(...))`), embedded [B, L, E] -> float32
    [steps, B, L, E]; step 0 equals `forward`. `encoded` as `forward`."""
    check_int("rollout steps", steps, low=1, expected="a positive integer")
    return self._net.apply({"params": params}, prev_features, embedded, steps,
                           self._cross(encoded), method="rollout")

  def init_cache(self, batch: int, max_len: int) -> KVCache:
    """The head's zeroed KV cache, per layer keys [batch, H, D, max_len] and values
    [batch, H, max_len, D]."""
    cfg = self.config
    return zeros_cache(batch, max_len, cfg.num_layers, cfg.num_heads, cfg.head_dim,
                       DTYPES[cfg.dtype])

  def forward(self, params: Any, prev_features: Array, embedded: Array,
              encoded: Optional[EncodedInputs] = None) -> Array:
    """Teacher-forced: prev_features [B, L, E] (f_{p-1}, zeros at p = 0), embedded [B, L, E]
    (the target's embedding of x_p) -> predicted f_p float32 [B, L, E]. `encoded`: the
    target's `encode` of the rows' source, needed with `cross_attention` (ignored without)."""
    return apply_network(self._net, "forward", params, prev_features, embedded,
                         self._cross(encoded))

  def decode(self, params: Any, cache: KVCache, prev_features: Array, embedded: Array,
             positions: Array, tree: Optional[TreeAttention] = None,
             encoded: Optional[EncodedInputs] = None) -> Tuple[Array, KVCache]:
    """Writes k positions per row at positions[b] .. positions[b] + k - 1 (inputs as
    `forward`, [B, k, E]) -> (predicted features float32 [B, k, E], cache). Slots past a
    row's position are masked, as the target's cache (`specjax.models.protocol`). With
    `tree` (a `specjax.models.tree.TreeAttention`) the k inputs are tree nodes: each sees
    the visible cache and its ancestors only, at its own sequence position. `encoded` as
    `forward`."""
    batch, k = prev_features.shape[:2]
    check_tree(tree, batch, k, cache.max_len, None)
    return apply_network(self._net, "decode_step", params, prev_features, embedded,
                         positions, cache, tree, self._cross(encoded))

  def _cross(self, encoded: Optional[EncodedInputs]) -> Optional[Cross]:
    """The layer's cross-attention input from the target's `encode` (None without
    `cross_attention`)."""
    if not self.config.cross_attention:
      return None
    if not isinstance(encoded, EncodedInputs):
      raise ValueError("this feature head has cross_attention: it needs encoded = the "
                       "target's encode(params, inputs) of the same rows, got "
                       f"{type(encoded).__name__}")
    return encoded_cross(encoded)


def shift_features(features: Array) -> Array:
  """f [B, L, E] -> f_{p-1} [B, L, E] (zeros at p = 0): the head's feature input."""
  return jnp.pad(features, ((0, 0), (1, 0), (0, 0)))[:, :-1]


def encoded_cross(encoded: EncodedInputs) -> Cross:
  """The target's last decoder layer's cross-attention keys and values, with the source's
  padding bias float32 [B, 1, 1, L_in]: what a head with `cross_attention` attends to."""
  return (encoded.keys[-1], encoded.values[-1],
          mask_to_bias(encoded.mask)[:, None, None, :])


def _init(net: FeatureHeadNetwork, rng: Array) -> Any:
  cfg = net.config
  zeros = jnp.zeros((1, 1, cfg.emb_dim), jnp.float32)
  features = jnp.zeros((1, 1, cfg.feature_width), jnp.float32)
  cross = None
  if cfg.cross_attention:  # one source position (the kernels do not depend on its length)
    cross = (jnp.zeros((1, cfg.num_heads, cfg.head_dim, 1), jnp.float32),
             jnp.zeros((1, cfg.num_heads, 1, cfg.head_dim), jnp.float32),
             jnp.zeros((1, 1, 1, 1), jnp.float32))
  return net.init(rng, features, zeros, cross, method="init_all")["params"]
