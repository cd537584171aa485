"""Decoder-only LM of t5x/examples/decoder_only (the paper's "GPT-like" family).

Parameter tree (all under `decoder/`, as T5X's DecoderWrapper names it):
`token_embedder/embedding [V, E]`, `relpos_bias/rel_embedding [H, 32]`,
`layers_i/{pre_self_attention_layer_norm, self_attention/{query,key,value,out},
pre_mlp_layer_norm, mlp/{wi_0,wi_1,wo}}`, `decoder_norm`, and
`logits_dense/kernel [E, V]` unless logits come from the embedding (the default
of T5X's decoder-only base.gin).

This module also holds the decoder stack that T5's decoder reuses (with
cross-attention on): `DecoderLayer` and `DecoderStack`.

Example:
  model = DecoderOnlyModel(DecoderOnlyConfig(vocab_size=64, emb_dim=16,
      num_heads=2, num_layers=2, head_dim=8, mlp_dim=32))
  params = model.init(jax.random.PRNGKey(0))
  cache = model.init_cache(batch=2, max_len=32)
  logits, cache = model.decode(params, cache, prompts, jnp.zeros(2, jnp.int32))
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, Tuple

import flax.linen as nn
import jax.numpy as jnp
from jax import lax

from specjax.models.checks import (check_logits_at, check_positions, check_prefix_lengths,
                                   check_tokens, check_tree, validate_config)
from specjax.models import fused
from specjax.models.layers import (DTYPES, Array, Dense, EncodedInputs, Embed, KVCache, MlpBlock,
                                   MultiHeadAttention, RelativePositionBias, RMSNorm,
                                   activation_fn, attend_and_write, attention_parts,
                                   cache_attention, dense_params, dense_product, gate,
                                   mask_to_bias, mlp_input_names, mlp_kernel_init, write_rows)
from specjax.models.network import NetworkModel
from specjax.models.tree import TreeAttention


# ----------------------------------------------------------------------------
# Decoder: one layer and the stack.
# ----------------------------------------------------------------------------
def _attention(cfg: Any) -> MultiHeadAttention:
  return MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.emb_dim, DTYPES[cfg.dtype],
                            cfg.attention_impl)


def _params(module: nn.Module) -> Any:
  """A bound module's parameter dict."""
  return module.variables["params"]


class DecoderLayer(nn.Module):
  """T5X decoder layer: self-attention, optional cross-attention, gated MLP."""
  config: Any  # T5Config or DecoderOnlyConfig
  cross_attention: bool

  def setup(self):
    cfg, dtype = self.config, DTYPES[self.config.dtype]
    self.pre_self_attention_layer_norm = RMSNorm(dtype)
    self.self_attention = _attention(cfg)
    if self.cross_attention:
      self.pre_cross_attention_layer_norm = RMSNorm(dtype)
      self.encoder_decoder_attention = _attention(cfg)
    self.pre_mlp_layer_norm = RMSNorm(dtype)
    self.mlp = MlpBlock(cfg.mlp_dim, cfg.mlp_activations, dtype)

  def __call__(self, x: Array, bias: Any, cache: Optional[Tuple[Array, Array]],
               starts: Optional[Array], cross: Optional[Tuple[Array, Array, Array]]
               ) -> Tuple[Array, Optional[Tuple[Array, Array]]]:
    """One layer.

    Args:
      x: [B, q, E] layer input.
      bias: without a cache, float32 [B|1, H, q, q] (mask included) over this
        call's own keys; with one, the triple of `chain_bias` / `tree_bias` (over
        the cache as it was before this call, over this call's keys, over the
        cache after its write), see `cached_self_attention`.
      cache: (keys [B, H, D, max_len], values [B, H, max_len, D]) to attend over and then write
        into, or None (teacher forcing).
      starts: int32 [B] slot of x[:, 0] when `cache` is given.
      cross: (keys [B, H, D, L_in], values [B, H, L_in, D], bias float32 [B, 1, 1, L_in])
        or None.

    Returns:
      ([B, q, E], updated cache or None).
    """
    if cache is not None:
      return self._cached(x, bias, cache, starts, cross)
    h = self.pre_self_attention_layer_norm(x)
    att = self.self_attention
    x = x + att.attend(att.project_q(h), *att.project_kv(h), bias)
    if self.cross_attention:
      h = self.pre_cross_attention_layer_norm(x)
      att = self.encoder_decoder_attention
      x = x + att.attend_parts(att.project_q(h), [cross])
    return x + self.mlp(self.pre_mlp_layer_norm(x)), None

  def _entry(self, norm: RMSNorm, x: Array, delta: Optional[Array], denses: Sequence[Any],
             activations: Optional[Sequence[str]] = None) -> Tuple[Array, Tuple[Array, ...]]:
    """A sublayer's entry in a cached call: (x + delta, the products of its norm by `denses`
    (the `Dense` modules' parameter dicts), or with `activations` their gated product), by
    `fused.norm_project`: one kernel where lowered for an NVIDIA GPU, the layers' own ops
    elsewhere."""
    dtype = DTYPES[self.config.dtype]
    params = [dense_params(d) for d in denses]  # (kernel, int8 scales or None) each

    def plain(normed):
      parts = [dense_product(normed, k, s, dtype) for k, s in params]
      return parts if activations is None else [gate(parts, activations)]

    return fused.norm_project(
        x, delta, norm, plain, norm.variables["params"]["scale"], [k for k, _ in params],
        dtype=dtype, epsilon=norm.epsilon,
        activations=None if activations is None else [activation_fn(a) for a in activations])

  def _cached(self, x, bias, cache, starts, cross):
    """`__call__` with a cache: the same values, each sublayer's residual add, norm and input
    projections handed to `_entry` together."""
    att = self.self_attention
    x, (query, key, value) = self._entry(self.pre_self_attention_layer_norm, x, None,
                                         [_params(d) for d in (att.query, att.key, att.value)])
    heads, cache = cached_self_attention(att.implementation, att.dtype, att.split_heads(query),
                                         att.split_heads(key), att.split_heads(value), cache, bias,
                                         starts)
    delta = att.output(heads)
    if self.cross_attention:
      att = self.encoder_decoder_attention
      x, (query,) = self._entry(self.pre_cross_attention_layer_norm, x, delta, [_params(att.query)])
      delta = att.attend_parts(att.split_heads(query), [cross])
    mlp = self.mlp
    names = mlp_input_names(mlp.activations)
    x, (hidden,) = self._entry(self.pre_mlp_layer_norm, x, delta,
                               [_params(mlp)[n] for n in names], mlp.activations)
    kernel, scales = dense_params(_params(mlp)["wo"])
    return x + dense_product(hidden, kernel, scales, DTYPES[self.config.dtype]), cache


def cached_self_attention(implementation: str, dtype: Any, query: Array, key: Array,
                          value: Array, cache: Tuple[Array, Array], bias: Tuple[Array, Array],
                          starts: Array) -> Tuple[Array, Tuple[Array, Array]]:
  """A cached call's self-attention and cache write, in the order that runs fastest where it
  is lowered (`jax.lax.platform_dependent`; both orders compute the same values):

    CPU          attend over the cache as it was and the call's own keys (two parts of one
                 softmax, `cached_attention`), then write the keys: XLA:CPU reads each buffer
                 where it lies and updates it in place after its last reader (`after`)
    GPU, TPU     write the keys first, then attend over the written cache (one part, its bias
                 made once per call by `join_bias`, not per layer; `cache_attention` for the
                 'specjax' implementation): XLA:GPU
                 fuses the scores, the softmax and the weighted sum into one kernel, where
                 the two parts took six

  Args:
    implementation, dtype: the attention's (`MultiHeadAttention`).
    query, key, value: [B, k, H, D], the call's projections.
    cache: (keys [B, H, D, max_len], values [B, H, max_len, D]).
    bias: (float32 [B, H, k, max_len] over the cache before the call, float32 [B|1, H, k, k]
      over the call's own keys, float32 [B, H, k, max_len] over the cache after the call's
      write), as `chain_bias` / `tree_bias` make them.
    starts: int32 [B], the slot of each row's first token.

  Returns:
    (the heads' outputs [B, k, H, D], the written cache).
  """
  parts = attention_parts(implementation, dtype)

  def attend(query, pieces):
    heads = parts(query, pieces)
    return heads, heads

  def attend_written(query, keys, values, joined):
    if implementation == "specjax":
      return cache_attention(query, keys, values, joined, dtype)
    return parts(query, [(keys, values, joined)])

  return attend_and_write(query, key, value, cache, bias, starts, attend, attend_written)


def join_bias(old_bias: Array, new_bias: Array, starts: Array) -> Array:
  """The bias over the cache after a call's write: `old_bias` [B, H, k, max_len] (the cache
  before it: slots from a row's start on are masked) with `new_bias` [B|1, H, k, k] written
  over slots starts[b] .. starts[b] + k - 1 -> float32 [B, H, k, max_len]."""
  new_bias = jnp.broadcast_to(new_bias, old_bias.shape[:3] + new_bias.shape[3:])
  return write_rows(old_bias, new_bias, starts, 3)


def chain_bias(relpos_bias: nn.Module, positions: Array, k: int, max_len: int,
               prefix_lengths: Optional[Array] = None) -> Tuple[Array, Array]:
  """The self-attention biases of a cached chain call of k tokens at positions[b] + i.

  Returns (float32 [B, H, k, max_len] over the cache before the call: every query sees the
  slots before its row's position, later ones are stale or about to be written; float32
  [B|1, H, k, k] over the call's own keys: causal, or also every key below
  prefix_lengths[b] when given; float32 [B, H, k, max_len] over the cache after the call's
  write, `joined_bias`).
  """
  slots = jnp.arange(max_len, dtype=jnp.int32)
  query_pos = positions[:, None] + jnp.arange(k, dtype=jnp.int32)[None, :]  # [B, k]
  old_visible = (slots[None, :] < positions[:, None])[:, None, None, :]  # [B, 1, 1, max_len]
  old_bias = relpos_bias(query_pos, slots, False) + mask_to_bias(old_visible)
  # Key j minus query i is j - i in every row.
  new = jnp.arange(k, dtype=jnp.int32)
  visible = (new[None, :] <= new[:, None])[None]  # [1, k, k]
  if prefix_lengths is not None:
    visible = visible | (query_pos[:, None, :] < prefix_lengths[:, None, None])
  new_bias = relpos_bias(new[None], new, False) + mask_to_bias(visible)[:, None]
  return old_bias, new_bias, joined_bias(old_bias, new_bias, positions)


def joined_bias(old_bias: Array, new_bias: Array, starts: Array) -> Array:
  """`join_bias` where lowered for a GPU or TPU (their attention reads the cache after the
  call's write); on the CPU, whose attention reads the two parts, `old_bias` unchanged (a
  placeholder of the same shape, computed nowhere).

  The joined bias is made once per call, behind an optimization barrier: every layer then
  reads it as a buffer, and XLA:GPU fuses each layer's scores, bias, softmax and weighted sum
  into one kernel (without the barrier it folds the bias's making into a separate kernel per
  layer, with the scores in another: three kernels where one does)."""
  return lax.platform_dependent(
      old_bias, new_bias, starts, cpu=lambda o, n, s: o,
      default=lambda o, n, s: lax.optimization_barrier(join_bias(o, n, s)))


def tree_bias(relpos_bias: nn.Module, tree: TreeAttention, positions: Array, slots: Array
              ) -> Tuple[Array, Array]:
  """A tree call's attention biases: (over the old cache [B, H, k, S], over the call's own
  keys [B, H, k, k], over the cache after the write [B, H, k, S]) from its `TreeAttention`, the call's first slots positions int32 [B] and
  the cache's slot indices slots int32 [S]."""
  old_visible = tree.cache_visible
  if old_visible is None:
    old_visible = jnp.broadcast_to(slots[None, None, :] < positions[:, None, None],
                                   tree.visible.shape[:2] + slots.shape)
  key_pos = slots if tree.cache_pos is None else tree.cache_pos
  old_bias = (relpos_bias(tree.token_pos, key_pos, False)
              + mask_to_bias(old_visible)[:, None])
  new_bias = (relpos_bias(tree.token_pos, tree.token_pos, False)
              + mask_to_bias(tree.visible)[:, None])
  return old_bias, new_bias, joined_bias(old_bias, new_bias, positions)


def causal_bias(relpos_bias: nn.Module, length: int,
                prefix_lengths: Optional[Array] = None) -> Array:
  """The self-attention bias [B|1, H, L, L] of a teacher-forced pass over L tokens: causal,
  or also every key below prefix_lengths[b] (T5X's prefix-LM mask) when given."""
  pos = jnp.arange(length, dtype=jnp.int32)
  visible = (pos[None, :] <= pos[:, None])[None]  # [1, L, L]
  if prefix_lengths is not None:
    visible = visible | (pos[None, None, :] < prefix_lengths[:, None, None])
  return relpos_bias(pos[None], pos, False) + mask_to_bias(visible)[:, None]


class DecoderStack(nn.Module):
  """T5X decoder: embedding, `relpos_bias`, `layers_i`, `decoder_norm`, logits.

  With `shared_embedding` (T5) the embedding lives outside this scope; without
  it (decoder-only) the stack owns `token_embedder`.
  """
  config: Any  # T5Config or DecoderOnlyConfig
  num_layers: int
  cross_attention: bool
  shared_embedding: Optional[Embed] = None

  def setup(self):
    cfg, dtype = self.config, DTYPES[self.config.dtype]
    if self.shared_embedding is None:
      self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, dtype)
    self.relpos_bias = RelativePositionBias(cfg.num_heads)
    self.layers = [DecoderLayer(cfg, self.cross_attention) for _ in range(self.num_layers)]
    self.decoder_norm = RMSNorm(dtype)
    if not cfg.logits_via_embedding:
      self.logits_dense = Dense(cfg.vocab_size, mlp_kernel_init, jnp.float32)

  def _embedder(self) -> Embed:
    return self.shared_embedding if self.shared_embedding is not None else self.token_embedder

  def cross_kv(self, encoded: Array) -> Tuple[Tuple[Array, ...], Tuple[Array, ...]]:
    """Encoder output [B, L_in, E] -> per-layer cross-attention keys [B, H, D, L_in] and
    values [B, H, L_in, D]."""
    pairs = [layer.encoder_decoder_attention.project_kv_heads(encoded) for layer in self.layers]
    return tuple(k for k, _ in pairs), tuple(v for _, v in pairs)

  def embed(self, tokens: Array) -> Array:
    """tokens int32 [...] -> the input embeddings [..., E] (the model's dtype)."""
    return self._embedder()(tokens)

  def output_logits(self, y: Array) -> Array:
    """The final hidden state y [..., E] (after `decoder_norm`) -> float32 logits [..., V]."""
    cfg = self.config
    if cfg.logits_via_embedding:
      logits = self._embedder().attend(y) / jnp.sqrt(jnp.float32(cfg.emb_dim))
    else:
      logits = self.logits_dense(y)
    return logits.astype(jnp.float32)

  def _run(self, tokens, bias, caches, starts, encoded, logits_at=None, features=False,
           feature_layers=None):
    """Shared body of `forward` and `decode_step`.

    Args:
      tokens: int32 [B, q].
      bias: the self-attention bias (mask included), as `DecoderLayer` takes it.
      caches: per layer (keys [B, H, D, max_len], values [B, H, max_len, D]), or None.
      starts: int32 [B] slot of tokens[:, 0] when `caches` is given.
      encoded: EncodedInputs (cross-attention) or None.
      logits_at: int32 [B] or None: the logits of token logits_at[b] only.
      features: static; also return the final hidden states (after `decoder_norm`).
      feature_layers: static, with `features`: None (the final hidden states), or the
        hidden states to return, concatenated (`specjax.models.protocol.FEATURE_LAYERS`:
        i < num_layers the output of `layers_i`, num_layers the final hidden state).

    Returns:
      (float32 logits [B, q, V] ([B, 1, V] with logits_at), per-layer updated caches
      or Nones), and with `features` float32 features [B, q, E] ([B, 1, E]; with
      feature_layers [B, q, n * E]) third.
    """
    cross_bias = None
    if self.cross_attention:
      cross_bias = mask_to_bias(encoded.mask)[:, None, None, :]  # [B, 1, 1, L_in]
    x = self._embedder()(tokens)
    new_caches, hidden = [], []
    for i, layer in enumerate(self.layers):
      cross = None
      if self.cross_attention:
        cross = (encoded.keys[i], encoded.values[i], cross_bias)
      x, cache = layer(x, bias, None if caches is None else caches[i], starts, cross)
      new_caches.append(cache)
      hidden.append(x)
    if logits_at is not None:  # the final norm and logits of one token per row
      x = jnp.take_along_axis(x, logits_at[:, None, None], axis=1)
    y = self.decoder_norm(x)
    if not features:
      return self.output_logits(y), new_caches
    if feature_layers is None:
      return self.output_logits(y), new_caches, y.astype(jnp.float32)
    if logits_at is not None:
      hidden = [jnp.take_along_axis(h, logits_at[:, None, None], axis=1) for h in hidden]
    hidden.append(y)  # index num_layers: the final hidden state
    chosen = [hidden[i].astype(jnp.float32) for i in feature_layers]
    return self.output_logits(y), new_caches, jnp.concatenate(chosen, axis=-1)

  def forward(self, tokens: Array, prefix_lengths: Optional[Array] = None,
              encoded: Optional[EncodedInputs] = None, features: bool = False,
              feature_layers: Optional[Tuple[int, ...]] = None) -> Array:
    """Teacher-forced logits (with static `features`: (logits, features float32 [B, L, E]),
    or [B, L, n * E] with `feature_layers`, as `_run`).

    Args:
      tokens: int32 [B, L] decoder input tokens.
      prefix_lengths: int32 [B] or None; query i sees key j when j <= i or
        j < prefix_lengths[b] (T5X's prefix-LM mask).
      encoded: cross-attention inputs (T5) or None.

    Returns:
      float32 [B, L, V].
    """
    bias = causal_bias(self.relpos_bias, tokens.shape[1], prefix_lengths)
    out = self._run(tokens, bias, None, None, encoded, features=features,
                    feature_layers=feature_layers)
    return (out[0], out[2]) if features else out[0]

  def decode_step(self, tokens: Array, positions: Array, cache: KVCache,
                  prefix_lengths: Optional[Array] = None,
                  encoded: Optional[EncodedInputs] = None,
                  logits_at: Optional[Array] = None, tree: Optional[TreeAttention] = None,
                  features: bool = False, feature_layers: Optional[Tuple[int, ...]] = None
                  ) -> Tuple[Array, KVCache]:
    """Writes tokens[b] at slots positions[b] + (0..k-1) and returns their logits.

    Args:
      tokens: int32 [B, k].
      positions: int32 [B] slot of tokens[:, 0] in each row.
      cache: KVCache with max_len >= positions + k.
      prefix_lengths: int32 [B] or None; as in `forward` (prefill of a prefix LM).
      encoded: cross-attention inputs (T5) or None.
      logits_at: int32 [B] or None: only the logits of tokens[b, logits_at[b]].
      tree: None (a chain: token i at position positions + i, causal), or the call's
        `TreeAttention` (positions and visibility of a token tree).
      features: static; also return the final hidden states of the k tokens.
      feature_layers: static; with `features`, the hidden states to return (`_run`).

    Returns:
      (float32 logits [B, k, V] ([B, 1, V] with logits_at), updated KVCache); with
      `features` (logits, float32 features [B, k, E], KVCache).
    """
    k = tokens.shape[1]
    slots = jnp.arange(cache.max_len, dtype=jnp.int32)
    if tree is None:
      bias = chain_bias(self.relpos_bias, positions, k, cache.max_len, prefix_lengths)
    else:
      bias = tree_bias(self.relpos_bias, tree, positions, slots)
    caches = list(zip(cache.keys, cache.values))
    result = self._run(tokens, bias, caches, positions, encoded, logits_at,
                       features, feature_layers)
    out = result[1]
    cache = KVCache(keys=tuple(c[0] for c in out), values=tuple(c[1] for c in out))
    return (result[0], result[2], cache) if features else (result[0], cache)


# ----------------------------------------------------------------------------
# The decoder-only model.
# ----------------------------------------------------------------------------
PROMPT_CONVENTIONS = {
    "t5x": "BOS 0, then the inputs (text prompts end with EOS), as T5X's DecoderOnlyModel",
    "lm": "the prompt's tokens from position 0, no BOS (specjax.train, the bundled LM)",
}
"""DecoderOnlyConfig.prompt_convention values and what each means."""


@dataclasses.dataclass(frozen=True)
class DecoderOnlyConfig:
  """Sizes of a T5X decoder-only network (field names of T5X's TransformerConfig)."""
  vocab_size: int
  """Rows of the token embedding and size of the logits (T5X: 32128)."""
  emb_dim: int
  """Width E of the residual stream."""
  num_heads: int
  """Attention heads H."""
  num_layers: int
  """Decoder layers."""
  head_dim: int
  """Width D of each head (H * D need not equal E)."""
  mlp_dim: int
  """Hidden width of the MLP."""
  mlp_activations: Tuple[str, ...] = ("gelu", "linear")
  """One name per input kernel: ('gelu', 'linear') is gated gelu (wi_0, wi_1);
  a single activation such as ('relu',) names the kernel `wi`."""
  logits_via_embedding: bool = True
  """True: logits = y @ embedding.T / sqrt(E) (no logits_dense kernel)."""
  dtype: str = "float32"
  """Activation, compute and cache dtype; parameters stay float32."""
  prompt_convention: str = "lm"
  """How a prompt becomes the decoder sequence (see PROMPT_CONVENTIONS):
  't5x': T5X's DecoderOnlyModel (seqio's DecoderFeatureConverter): BOS 0, then the
  example's `inputs` (a text prompt is tokenized with EOS, as seqio's default `inputs`
  feature adds it); the models/decoder_only_*.gin files set it for T5X checkpoints.
  'lm': the prompt's tokens from position 0, no BOS, no EOS: the convention of
  `specjax.train` and the bundled LM pair."""
  inputs_bidirectional_attention: bool = False
  """T5X's DecoderOnlyModel flag of the same name: the prompt (BOS and `inputs`) attends
  to itself bidirectionally (a prefix LM); later tokens are causal."""
  attention_impl: str = "specjax"
  """How attention is computed, not what (`layers.ATTENTION_IMPLEMENTATIONS`): 'specjax'
  (default), or jax.nn.dot_product_attention with 'xla' or 'cudnn'. Same parameters."""

  def __post_init__(self):
    validate_config(self, ("vocab_size", "emb_dim", "num_heads", "num_layers",
                           "head_dim", "mlp_dim"))
    if self.prompt_convention not in PROMPT_CONVENTIONS:
      raise ValueError(f"DecoderOnlyConfig.prompt_convention must be one of "
                       f"{sorted(PROMPT_CONVENTIONS)}, got {self.prompt_convention!r}")
    if not isinstance(self.inputs_bidirectional_attention, bool):
      raise ValueError("DecoderOnlyConfig.inputs_bidirectional_attention must be True or "
                       f"False, got {self.inputs_bidirectional_attention!r}")


class DecoderOnlyNetwork(nn.Module):
  """Flax module with T5X's `decoder/` scope around the stack."""
  config: DecoderOnlyConfig

  def setup(self):
    self.decoder = DecoderStack(self.config, self.config.num_layers, cross_attention=False)

  def forward(self, tokens: Array, prefix_lengths: Optional[Array] = None) -> Array:
    """Teacher-forced logits: tokens int32 [B, L] -> float32 [B, L, V]."""
    return self.decoder.forward(tokens, prefix_lengths)

  def decode_step(self, tokens: Array, positions: Array, cache: KVCache,
                  prefix_lengths: Optional[Array] = None,
                  logits_at: Optional[Array] = None, tree: Optional[TreeAttention] = None
                  ) -> Tuple[Array, KVCache]:
    """Cached step; see `DecoderStack.decode_step`."""
    return self.decoder.decode_step(tokens, positions, cache, prefix_lengths, None, logits_at,
                                    tree)

  def forward_features(self, tokens: Array, prefix_lengths: Optional[Array] = None,
                       feature_layers: Optional[Tuple[int, ...]] = None):
    """Teacher-forced (logits float32 [B, L, V], features float32 [B, L, E] or [B, L, n * E]
    with static `feature_layers`)."""
    return self.decoder.forward(tokens, prefix_lengths, features=True,
                                feature_layers=feature_layers)

  def decode_step_features(self, tokens: Array, positions: Array, cache: KVCache,
                           prefix_lengths: Optional[Array] = None,
                           tree: Optional[TreeAttention] = None,
                           feature_layers: Optional[Tuple[int, ...]] = None):
    """Cached step -> (logits [B, k, V], features [B, k, E] or [B, k, n * E], KVCache)."""
    return self.decoder.decode_step(tokens, positions, cache, prefix_lengths, tree=tree,
                                    features=True, feature_layers=feature_layers)

  def embed(self, tokens: Array) -> Array:
    """The input embeddings [..., E] of tokens int32 [...]."""
    return self.decoder.embed(tokens)

  def output_logits(self, features: Array) -> Array:
    """Features [..., E] -> float32 logits [..., V] (the model's own output projection)."""
    return self.decoder.output_logits(features)


class DecoderOnlyModel(NetworkModel):
  """Decoder-only LM behind the `DecodingModel` protocol.

  Causal by default. With `prefix_lm=True` (T5X's prefix LM; by default the
  config's `inputs_bidirectional_attention`), a call that passes
  `prefix_lengths` lets each row's first `prefix_lengths[b]` slots attend to
  each other bidirectionally: pass it on the prefill call with the prompts'
  true lengths; later calls are causal (their queries lie past the prefix and
  see all of it anyway).
  """
  is_encoder_decoder = False

  def __init__(self, config: DecoderOnlyConfig, prefix_lm: Optional[bool] = None):
    if not isinstance(config, DecoderOnlyConfig):
      raise ValueError(f"DecoderOnlyModel needs a DecoderOnlyConfig, got {type(config).__name__}")
    super().__init__(config, config.num_layers)
    self.prefix_lm = bool(config.inputs_bidirectional_attention if prefix_lm is None
                          else prefix_lm)
    self._net = DecoderOnlyNetwork(config)

  def encode(self, params: Any, inputs: Any) -> None:
    """A decoder-only model has no encoder: returns None."""
    del params, inputs
    return None

  def logits(self, params: Any, tokens: Any, prefix_lengths: Any = None) -> Array:
    """Teacher-forced logits (training, scoring).

    Args:
      params: parameter tree (T5X names).
      tokens: int32 [B, L] decoder input tokens.
      prefix_lengths: int32 [B], required in prefix-LM mode (bidirectional
        attention over each row's first prefix_lengths[b] tokens); ignored
        by a causal model.

    Returns:
      float32 [B, L, V]; logits[:, i] predicts the token after tokens[:, i].
    """
    tokens, prefix_lengths = self._check_teacher_forced(params, tokens, prefix_lengths,
                                                        "logits")
    return self._apply("forward", params, tokens, prefix_lengths)

  def _check_teacher_forced(self, params, tokens, prefix_lengths, method: str):
    self.check_params(params)
    tokens = check_tokens(tokens, self.vocab_size, f"{method} tokens")
    if not self.prefix_lm:
      return tokens, None
    if prefix_lengths is None:
      raise ValueError(f"a prefix-LM model needs prefix_lengths int32 [batch] in {method}()")
    return tokens, check_prefix_lengths(prefix_lengths, tokens.shape[0],
                                        jnp.full(tokens.shape[:1], tokens.shape[1]))

  def decode(self, params: Any, cache: KVCache, tokens: Any, positions: Any,
             encoded: Any = None, *, prefix_lengths: Any = None, logits_at: Any = None,
             tree: Optional[TreeAttention] = None) -> Tuple[Array, KVCache]:
    """Writes k tokens per row at the row's own position; returns their logits.

    Args:
      params: parameter tree (T5X names).
      cache: KVCache from `init_cache`.
      tokens: int32 [B, k] (k = padded prompt length for the prefill, 1 for
        plain decoding, gamma + 1 for verification, ...).
      positions: int32 [B] slot of tokens[b, 0]; positions + k <= max_len.
        Slots after positions[b] + k - 1 are masked, so moving a row's
        position back rolls it back.
      encoded: ignored (decoder-only).
      prefix_lengths: int32 [B] or None; in prefix-LM mode, slots below
        prefix_lengths[b] are visible to every query of the call. Ignored by
        a causal model.
      logits_at: int32 [B] in [0, k) or None: return only the logits of
        tokens[b, logits_at[b]] (the others' final norm and vocabulary product
        are not computed), as [B, 1, V].
      tree: None (a chain call), or a `specjax.models.tree.TreeAttention`: the k tokens
        are a token tree (each attends to the visible cache and its ancestors only, at
        its own sequence position); not with prefix_lengths.

    Returns:
      (float32 logits [B, k, V] ([B, 1, V] with logits_at), updated cache).
    """
    del encoded
    tokens, positions, prefix_lengths = self._check_decode(params, cache, tokens, positions,
                                                           prefix_lengths)
    batch, k = tokens.shape
    logits_at = check_logits_at(logits_at, batch, k)
    check_tree(tree, batch, k, cache.max_len, prefix_lengths)
    return self._apply("decode_step", params, tokens, positions, cache, prefix_lengths,
                       logits_at, tree)

  # Target features (opt-in): the final hidden state, after `decoder_norm`, of every token.
  def decode_features(self, params: Any, cache: KVCache, tokens: Any, positions: Any,
                      encoded: Any = None, *, prefix_lengths: Any = None,
                      tree: Optional[TreeAttention] = None, feature_layers: Any = None
                      ) -> Tuple[Array, Array, KVCache]:
    """`decode` (a chain call, or a tree call with `tree`, as `decode`'s) that also returns
    each token's final hidden state, or with `feature_layers` (a tuple of layer indices,
    `specjax.models.protocol.FEATURE_LAYERS`) those hidden states concatenated.

    Returns:
      (float32 logits [B, k, V], float32 features [B, k, E] ([B, k, n * E] with n
      feature_layers), updated cache); logits equal `feature_logits(params, features)` of
      the final hidden states.
    """
    del encoded
    tokens, positions, prefix_lengths = self._check_decode(params, cache, tokens, positions,
                                                           prefix_lengths)
    check_tree(tree, tokens.shape[0], tokens.shape[1], cache.max_len, prefix_lengths)
    return self._apply_features("decode_step_features", feature_layers, params, tokens,
                                positions, cache, prefix_lengths, tree)

  def features(self, params: Any, tokens: Any, prefix_lengths: Any = None,
               feature_layers: Any = None) -> Tuple[Array, Array]:
    """Teacher-forced (logits float32 [B, L, V], features float32 [B, L, E], or
    [B, L, n * E] with `feature_layers` as `decode_features`); arguments as `logits`."""
    tokens, prefix_lengths = self._check_teacher_forced(params, tokens, prefix_lengths,
                                                        "features")
    return self._apply_features("forward_features", feature_layers, params, tokens,
                                prefix_lengths)

  def _check_decode(self, params, cache, tokens, positions, prefix_lengths):
    self.check_params(params)
    tokens = check_tokens(tokens, self.vocab_size, "decode tokens")
    batch, k = tokens.shape
    self._check_cache(cache, batch)
    positions = check_positions(positions, batch, k, cache.max_len)
    if self.prefix_lm and prefix_lengths is not None:
      prefix_lengths = check_prefix_lengths(prefix_lengths, batch, positions + k)
    else:
      prefix_lengths = None
    return tokens, positions, prefix_lengths
