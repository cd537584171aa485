"""Gemma 2 / Gemma 3 text decoders behind the `DecodingModel`, `FeatureModel` and `LayerFeatureModel` protocols.

The architecture (from the Gemma 2 and Gemma 3 reports and the gemma library's model, whose
parameter names this network keeps, so a tree written by `gm.ckpts.save_params` loads with
no renaming):

  embedder/input_embedding [V, E]          x = embedding[token] * sqrt(E); logits = y @ it.T
  layer_i/pre_attention_norm/scale [E]     RMS norms scale by (1 + scale), eps 1e-6
  layer_i/attn/q_einsum/w [N, E, H]        (qkv_einsum/w [3, N, E, H] when K == N)
  layer_i/attn/kv_einsum/w [2, K, E, H]    grouped-query attention: query head n reads
                                           key/value head n // (N / K)
  layer_i/attn/_query_norm, _key_norm      Gemma 3's QK norm over each head, before RoPE
  layer_i/attn/attn_vec_einsum/w [N, H, E]
  layer_i/post_attention_norm, pre_ffw_norm, post_ffw_norm
  layer_i/mlp/gating_einsum [2, E, F]      ([2, F, E] with transpose_gating_einsum):
  layer_i/mlp/linear [F, E]                gelu(x W0) * (x W1), then linear
  final_norm/scale [E]

RoPE rotates the two halves of each query and key head at its absolute position with the
layer's base frequency and scale factor (local layers and global layers differ); queries are
then multiplied by `query_pre_attn_scalar`. Local layers attend to the last
`sliding_window_size` positions only. Gemma 2 caps the attention scores and the final logits
with c * tanh(x / c).

The cache is the project's `KVCache` with K (not N) heads per layer. Sliding-window layers
keep their keys in the same multi-token cache and mask by position: in a (γ+1)-token call each
query's own window is masked (query at position p sees keys at positions p - W + 1 .. p,
among the cache and the call's own earlier tokens), so verification and rollback work as for
every other model.

Example:
  model = GemmaModel(GemmaConfig(num_embed=64, embed_dim=32, hidden_dim=64, num_heads=4,
      head_dim=8, num_kv_heads=1, attention_types=('local_sliding', 'global'),
      sliding_window_size=4, use_qk_norm=True))
  params = model.init(0)
  cache = model.init_cache(batch=2, max_len=32)
  logits, cache = model.decode(params, cache, prompts, jnp.zeros(2, jnp.int32), None)
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from specjax.checkpoints.gemma import load_gemma_params
from specjax.models.checks import check_cache, check_logits_at, check_positions, check_tokens, check_tree
from specjax.models.gemma_config import LOCAL, GemmaConfig
from specjax.models.decoder_only import joined_bias
from specjax.models.gemma_attention import Bias, cached_self_attention, grouped_attention
from specjax.models.layers import (DTYPES, Array, KVCache, embedding_rows, key_layout,
                                   mask_to_bias, pad_row, project, value_layout, zeros_cache)
from specjax.models.network import NetworkModel, check_token_ids
from specjax.models.tree import TreeAttention
from specjax.params import quantize

_EPSILON = 1e-6
# Random init (not the library's): unit-variance activations and an embedding of unit entries,
# so a random model's next-token laws are sharp (greedy tests then meet no near-ties).
_weight_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")


def rms_norm(x: Array, scale: Array, dtype: Any) -> Array:
  """Gemma's RMS norm: x [..., E] / rms(x) * (1 + scale [E]), normalized in float32."""
  x = x.astype(jnp.float32)
  normed = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + _EPSILON)
  return (normed * (1.0 + scale.astype(jnp.float32))).astype(dtype)


def rope(x: Array, positions: Array, base_frequency: int, scale_factor: float) -> Array:
  """Rotary position embedding of heads x [B, q, n, H] at positions int32 [B, q]: pair
  (x[i], x[i + H/2]) turns by the angle position / base^(2i / H) / scale_factor."""
  half = x.shape[-1] // 2
  timescale = jnp.float32(base_frequency) ** (
      (2.0 / x.shape[-1]) * jnp.arange(half, dtype=jnp.float32))  # [H/2]
  angle = positions.astype(jnp.float32)[..., None] / timescale / jnp.float32(scale_factor)
  sin, cos = jnp.sin(angle)[:, :, None, :], jnp.cos(angle)[:, :, None, :]  # [B, q, 1, H/2]
  first, second = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([first * cos - second * sin, second * cos + first * sin],
                         axis=-1).astype(x.dtype)


def soft_cap(x: Array, cap: Optional[float]) -> Array:
  """c * tanh(x / c), or x when `cap` is None."""
  return x if cap is None else jnp.tanh(x / cap) * cap


def _product(x: Array, weight: Array, axis: int, dtype: Any) -> Array:
  """x [..., D] times `weight` contracted over its axis `axis` (of size D) -> [..., the
  weight's other axes] in `dtype`, with float32 sums (the library's einsums).

  A single row (a batch-1 decode step) is padded to two (`layers.pad_row`) where XLA would
  run a one-row product as an elementwise multiply writing a float32 temporary the size of
  the weight, then a reduce: bfloat16 weights on every platform, float32 ones where lowered
  for a GPU or TPU (XLA:CPU runs their one row as a matrix-vector product), as
  `layers.bfloat16_dot` and `layers.plain_dot` do."""
  lead = x.shape[:-1]
  rows = x.reshape(-1, x.shape[-1]).astype(dtype)  # [M, D]
  weight = weight.astype(dtype)
  rest = weight.shape[:axis] + weight.shape[axis + 1:]
  product = lambda r: jax.lax.dot_general(r, weight, (((1,), (axis,)), ((), ())),
                                          preferred_element_type=jnp.float32)
  padded = lambda r: product(pad_row(r))[:1]
  if rows.shape[0] > 1:
    out = product(rows)
  elif rows.dtype == jnp.float32:
    out = jax.lax.platform_dependent(rows, cpu=product, default=padded)
  else:
    out = padded(rows)
  return out.astype(dtype).reshape(lead + rest)


class _Weight(nn.Module):
  """One stored weight `w` (the library's einsum modules): calling it returns the array."""
  shape: Tuple[int, ...]

  def setup(self):
    self.w = self.param("w", _weight_init, self.shape, jnp.float32)

  def __call__(self) -> Array:
    return self.w


class _Norm(nn.Module):
  """An RMS norm's `scale` [E] (initialized to 0: the identity)."""
  features: int

  def setup(self):
    self.scale = self.param("scale", nn.initializers.zeros, (self.features,), jnp.float32)

  def __call__(self, x: Array, dtype: Any) -> Array:
    return rms_norm(x, self.scale, dtype)


class GemmaAttention(nn.Module):
  """Gemma self-attention (library names: q_einsum / kv_einsum or qkv_einsum, attn_vec_einsum,
  _query_norm, _key_norm)."""
  config: GemmaConfig
  layer: int

  def setup(self):
    cfg = self.config
    n, k, e, h = cfg.num_heads, cfg.num_kv_heads, cfg.embed_dim, cfg.head_dim
    if k == n:
      self.qkv_einsum = _Weight((3, n, e, h))
    else:
      self.q_einsum = _Weight((n, e, h))
      self.kv_einsum = _Weight((2, k, e, h))
    self.attn_vec_einsum = _Weight((n, h, e))
    if cfg.use_qk_norm:
      self._query_norm = _Norm(h)
      self._key_norm = _Norm(h)

  def project(self, x: Array, positions: Array) -> Tuple[Array, Array, Array]:
    """x [B, q, E] at positions int32 [B, q] -> (queries [B, q, N, H] normed, rotated and
    scaled; keys [B, q, K, H] normed and rotated; values [B, q, K, H])."""
    cfg, dtype = self.config, DTYPES[self.config.dtype]
    if cfg.num_kv_heads == cfg.num_heads:
      joined = _product(x, self.qkv_einsum(), 2, dtype)  # [B, q, 3, N, H]
      query, key, value = (joined[..., i, :, :] for i in range(3))
    else:
      query = _product(x, self.q_einsum(), 1, dtype)  # [B, q, N, H]
      joined = _product(x, self.kv_einsum(), 2, dtype)  # [B, q, 2, K, H]
      key, value = joined[..., 0, :, :], joined[..., 1, :, :]
    if cfg.use_qk_norm:
      query, key = self._query_norm(query, dtype), self._key_norm(key, dtype)
    base, scale = cfg.rope(self.layer)
    query = rope(query, positions, base, scale) * jnp.asarray(cfg.query_pre_attn_scalar(),
                                                               dtype)
    return query, rope(key, positions, base, scale), value

  def output(self, heads: Array) -> Array:
    """The heads' outputs [B, q, N * H] -> [B, q, E] (attn_vec_einsum)."""
    weight = self.attn_vec_einsum()  # [N, H, E]: its leading axes joined, a free reshape
    dtype = DTYPES[self.config.dtype]
    return _product(heads, weight.reshape(-1, weight.shape[-1]), 0, dtype)


class GemmaMlp(nn.Module):
  """The gated MLP (library names: `gating_einsum`, `linear`)."""
  config: GemmaConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x [..., E] -> [..., E]: linear(gelu(x W0) * (x W1))."""
    cfg, dtype = self.config, DTYPES[self.config.dtype]
    e, f = cfg.embed_dim, cfg.hidden_dim
    if cfg.transpose_gating_einsum:
      gating = self.param("gating_einsum", _weight_init, (2, f, e), jnp.float32)
      gates = _product(x, gating, 2, dtype)  # [..., 2, F]
    else:
      gating = self.param("gating_einsum", _weight_init, (2, e, f), jnp.float32)
      gates = _product(x, gating, 1, dtype)  # [..., 2, F]
    hidden = nn.gelu(gates[..., 0, :]) * gates[..., 1, :]
    linear = self.param("linear", _weight_init, (f, e), jnp.float32)
    return _product(hidden, linear, 0, dtype)


class GemmaBlock(nn.Module):
  """One layer: norms around attention and the MLP, each with its residual add."""
  config: GemmaConfig
  layer: int

  def setup(self):
    cfg, e = self.config, self.config.embed_dim
    self.pre_attention_norm = _Norm(e)
    self.attn = GemmaAttention(cfg, self.layer)
    if cfg.use_post_attn_norm:
      self.post_attention_norm = _Norm(e)
    self.pre_ffw_norm = _Norm(e)
    self.mlp = GemmaMlp(cfg)
    if cfg.use_post_ffw_norm:
      self.post_ffw_norm = _Norm(e)

  def __call__(self, x: Array, positions: Array, bias: Bias,
               cache: Optional[Tuple[Array, Array]], starts: Optional[Array]):
    """x [B, q, E] at positions int32 [B, q]; `bias` the layer type's; with `cache` (keys
    [B, K, H, S], values [B, K, S, H]) the call's keys are attended after the cache's and
    written at slots starts[b] .. starts[b] + q - 1 -> ([B, q, E], the written cache or None).
    """
    cfg, dtype = self.config, DTYPES[self.config.dtype]
    query, key, value = self.attn.project(self.pre_attention_norm(x, dtype), positions)
    if cache is None:
      heads, _ = grouped_attention(cfg, query, [(key_layout(key), value_layout(value),
                                                 bias[1])], dtype)
    else:
      heads, cache = cached_self_attention(cfg, dtype, query, key, value, cache, bias, starts)
    out = self.attn.output(heads)
    if self.config.use_post_attn_norm:
      out = self.post_attention_norm(out, dtype)
    x = x + out
    out = self.mlp(self.pre_ffw_norm(x, dtype))
    if self.config.use_post_ffw_norm:
      out = self.post_ffw_norm(out, dtype)
    return x + out, cache


def _biases(cfg: GemmaConfig, token_pos: Array, new_visible: Array,
            old: Optional[Tuple[Array, Array]]):
  """{attention type: Bias} of a call whose tokens sit at token_pos int32 [B, q] and see
  each other where new_visible bool [B|1, q, q]; `old` = (bool [B, q, S] visible cache slots,
  int32 [B|1, S] the positions the slots hold) or None (no cache). A local layer's query at
  position p also needs a key at a position above p - sliding_window_size."""
  out = {}
  for kind in set(cfg.attention_types):
    new, cached = new_visible, None if old is None else old[0]
    if kind == LOCAL:
      floor = token_pos[:, :, None] - cfg.sliding_window_size  # [B, q, 1]
      new = new & (token_pos[:, None, :] > floor)
      if old is not None:
        cached = cached & (old[1][:, None, :] > floor)
    out[kind] = (None if cached is None else mask_to_bias(cached)[:, None],
                 mask_to_bias(new)[:, None])
  return out


class GemmaNetwork(nn.Module):
  """The Flax network with the gemma library's top-level names (embedder, layer_i,
  final_norm)."""
  config: GemmaConfig

  def setup(self):
    cfg = self.config
    self.embedder = _Embedder(cfg.num_embed, cfg.embed_dim)
    self.blocks = [GemmaBlock(cfg, i, name=f"layer_{i}") for i in range(cfg.num_layers)]
    self.final_norm = _Norm(cfg.embed_dim)

  def embed(self, tokens: Array) -> Array:
    """tokens int32 [...] -> input embeddings [..., E] (scaled by sqrt(E))."""
    dtype = DTYPES[self.config.dtype]
    rows = embedding_rows(self.embedder.input_embedding, tokens).astype(dtype)
    return rows * jnp.sqrt(jnp.float32(self.config.embed_dim)).astype(dtype)

  def output_logits(self, y: Array) -> Array:
    """Final hidden states y [..., E] -> float32 logits [..., V] (tied, soft-capped)."""
    logits = project(y, self.embedder.input_embedding, transposed=True)
    return soft_cap(logits, self.config.final_logit_softcap)

  def _run(self, tokens, token_pos, biases, caches, starts, logits_at=None,
           feature_layers=None):
    """-> (float32 logits, features, per-layer written caches or Nones): the features the
    final hidden states float32 [B, q, E] (after `final_norm`), or with static
    `feature_layers` (`specjax.models.protocol.FEATURE_LAYERS`: i < num_layers the output of
    `layer_i`, its residual stream; num_layers the final hidden state) those, concatenated
    float32 [B, q, n * E]; [B, 1, ...] with logits_at."""
    x = self.embed(tokens)
    written, hidden = [], []
    for i, block in enumerate(self.blocks):
      x, cache = block(x, token_pos, biases[self.config.attention_types[i]],
                       None if caches is None else caches[i], starts)
      written.append(cache)
      hidden.append(x)
    if logits_at is not None:
      x = jnp.take_along_axis(x, logits_at[:, None, None], axis=1)
    y = self.final_norm(x, jnp.float32)
    if feature_layers is None:
      return self.output_logits(y), y, written
    if logits_at is not None:
      hidden = [jnp.take_along_axis(h, logits_at[:, None, None], axis=1) for h in hidden]
    hidden.append(y)  # index num_layers: the final hidden state
    chosen = jnp.concatenate([hidden[i].astype(jnp.float32) for i in feature_layers], axis=-1)
    return self.output_logits(y), chosen, written

  def forward(self, tokens: Array, features: bool = False,
              feature_layers: Optional[Tuple[int, ...]] = None):
    """Teacher-forced logits float32 [B, L, V] of tokens int32 [B, L] at positions 0..L-1
    (with static `features`: (logits, features float32 [B, L, E]), or [B, L, n * E] with
    static `feature_layers`, as `_run`)."""
    length = tokens.shape[1]
    pos = jnp.arange(length, dtype=jnp.int32)
    token_pos = jnp.broadcast_to(pos[None], tokens.shape)
    biases = _biases(self.config, token_pos, (pos[None, :] <= pos[:, None])[None], None)
    logits, y, _ = self._run(tokens, token_pos, biases, None, None,
                             feature_layers=feature_layers if features else None)
    return (logits, y) if features else logits

  def decode_step(self, tokens: Array, positions: Array, cache: KVCache,
                  logits_at: Optional[Array] = None, tree: Optional[TreeAttention] = None,
                  features: bool = False, feature_layers: Optional[Tuple[int, ...]] = None):
    """Writes tokens int32 [B, k] at slots positions[b] + (0..k-1) -> (float32 logits
    [B, k, V] ([B, 1, V] with logits_at), KVCache), with static `features` (logits, float32
    features [B, k, E] ([B, k, n * E] with static `feature_layers`, as `_run`), KVCache).
    `tree`: the call's token tree (`specjax.models.tree`)."""
    k, slots = tokens.shape[1], jnp.arange(cache.max_len, dtype=jnp.int32)
    if tree is None:
      token_pos = positions[:, None] + jnp.arange(k, dtype=jnp.int32)[None, :]
      new = jnp.arange(k)
      new_visible = (new[None, :] <= new[:, None])[None]
      old_visible = jnp.broadcast_to(slots[None, None, :] < positions[:, None, None],
                                     (tokens.shape[0], k, cache.max_len))
      key_pos = slots[None]
    else:
      token_pos, new_visible = tree.token_pos, tree.visible
      old_visible = tree.cache_visible
      if old_visible is None:
        old_visible = jnp.broadcast_to(slots[None, None, :] < positions[:, None, None],
                                       tree.visible.shape[:2] + slots.shape)
      key_pos = slots[None] if tree.cache_pos is None else tree.cache_pos
    biases = {kind: (old, new, joined_bias(old, new, positions)) for kind, (old, new)
              in _biases(self.config, token_pos, new_visible, (old_visible, key_pos)).items()}
    logits, y, written = self._run(tokens, token_pos, biases,
                                   list(zip(cache.keys, cache.values)), positions, logits_at,
                                   feature_layers if features else None)
    cache = KVCache(keys=tuple(c[0] for c in written), values=tuple(c[1] for c in written))
    return (logits, y, cache) if features else (logits, cache)

  def decode_step_features(self, tokens, positions, cache, tree=None, feature_layers=None):
    """`decode_step` with features (of static `feature_layers`, if given)."""
    return self.decode_step(tokens, positions, cache, None, tree, True, feature_layers)

  def forward_features(self, tokens, feature_layers=None):
    """`forward` with features (of static `feature_layers`, if given)."""
    return self.forward(tokens, True, feature_layers)


class _Embedder(nn.Module):
  """`input_embedding` [V, E]."""
  vocab_size: int
  embed_dim: int

  def setup(self):
    self.input_embedding = self.param("input_embedding", nn.initializers.normal(1.0),
                                      (self.vocab_size, self.embed_dim), jnp.float32)


class GemmaModel(NetworkModel):
  """A Gemma 2 / Gemma 3 text decoder behind the `DecodingModel` and `FeatureModel`
  protocols (parameters with the gemma library's names; see the module docstring)."""
  is_encoder_decoder = False

  def __init__(self, config: Any):
    config = GemmaConfig.of(config)
    super().__init__(config, config.num_layers)
    self._net = GemmaNetwork(config)

  @property
  def vocab_size(self) -> int:
    """Size of the logits' last axis (`num_embed`)."""
    return self.config.num_embed

  @property
  def feature_dim(self) -> int:
    """Width E of the features (`embed_dim`)."""
    return self.config.embed_dim

  def init_cache(self, batch: int, max_len: int) -> KVCache:
    """Zeroed cache: per layer keys [batch, K, H, max_len], values [batch, K, max_len, H]."""
    cfg = self.config
    return zeros_cache(batch, max_len, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                       DTYPES[cfg.dtype])

  def _check_cache(self, cache: Any, batch: int) -> None:
    cfg = self.config
    check_cache(cache, batch, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)

  def encode(self, params: Any, inputs: Any) -> None:
    """A decoder-only model has no encoder: returns None."""
    del params, inputs
    return None

  def logits(self, params: Any, tokens: Any) -> Array:
    """Teacher-forced logits: tokens int32 [B, L] (positions 0..L-1) -> float32 [B, L, V];
    logits[:, i] predicts the token after tokens[:, i]."""
    self.check_params(params)
    return self._apply("forward", params, check_tokens(tokens, self.vocab_size, "logits tokens"))

  def features(self, params: Any, tokens: Any, feature_layers: Any = None
               ) -> Tuple[Array, Array]:
    """Teacher-forced (logits float32 [B, L, V], features float32 [B, L, E]), or with
    `feature_layers` (a tuple of layer indices, `specjax.models.protocol.FEATURE_LAYERS`)
    those layers' hidden states concatenated, float32 [B, L, n * E]."""
    self.check_params(params)
    tokens = check_tokens(tokens, self.vocab_size, "features tokens")
    return self._apply_features("forward_features", feature_layers, params, tokens)

  def _check_decode(self, params, cache, tokens, positions):
    self.check_params(params)
    tokens = check_tokens(tokens, self.vocab_size, "decode tokens")
    self._check_cache(cache, tokens.shape[0])
    return tokens, check_positions(positions, tokens.shape[0], tokens.shape[1], cache.max_len)

  def decode(self, params: Any, cache: KVCache, tokens: Any, positions: Any,
             encoded: Any = None, *, logits_at: Any = None,
             tree: Optional[TreeAttention] = None) -> Tuple[Array, KVCache]:
    """Writes k tokens per row at the row's own position; returns their logits.

    Args:
      params: parameter tree (the gemma library's names).
      cache: KVCache from `init_cache`.
      tokens: int32 [B, k].
      positions: int32 [B] slot (and sequence position) of tokens[b, 0]; slots after
        positions[b] + k - 1 are masked, so moving a row's position back rolls it back.
      encoded: ignored (decoder-only).
      logits_at: int32 [B] in [0, k) or None: only the logits of tokens[b, logits_at[b]],
        as [B, 1, V].
      tree: None (a chain call) or a `TreeAttention` (a token tree).

    Returns:
      (float32 logits [B, k, V] ([B, 1, V] with logits_at), updated cache).
    """
    del encoded
    tokens, positions = self._check_decode(params, cache, tokens, positions)
    batch, k = tokens.shape
    logits_at = check_logits_at(logits_at, batch, k)
    check_tree(tree, batch, k, cache.max_len, None)
    return self._apply("decode_step", params, tokens, positions, cache, logits_at, tree)

  def decode_features(self, params: Any, cache: KVCache, tokens: Any, positions: Any,
                      encoded: Any = None, *, tree: Optional[TreeAttention] = None,
                      feature_layers: Any = None) -> Tuple[Array, Array, KVCache]:
    """`decode` that also returns each token's final hidden state (after `final_norm`), or
    with `feature_layers` (`specjax.models.protocol.FEATURE_LAYERS`) the chosen layers'
    hidden states concatenated: (float32 logits [B, k, V], float32 features [B, k, E]
    ([B, k, n * E] with n feature_layers), cache)."""
    del encoded
    tokens, positions = self._check_decode(params, cache, tokens, positions)
    check_tree(tree, tokens.shape[0], tokens.shape[1], cache.max_len, None)
    return self._apply_features("decode_step_features", feature_layers, params, tokens,
                                positions, cache, tree)

  def output_rows(self, params: Any, token_ids: Any) -> Array:
    """The tied embedding's rows [K, E] of `token_ids` int [K] (distinct, in [0, V))."""
    return jnp.take(params["embedder"]["input_embedding"],
                    check_token_ids(token_ids, self.vocab_size), axis=0)

  def rows_logits(self, rows: Array, features: Any, scales: Optional[Array] = None) -> Array:
    """features [..., E] -> float32 logits [..., K] of the ids `output_rows` was cut to."""
    return soft_cap(project(features, rows, transposed=True, scales=scales),
                    self.config.final_logit_softcap)

  def quantize_rows(self, rows: Array) -> Tuple[Array, Array]:
    """`output_rows`' rows -> (int8 values, float32 scales [K]), one scale per token id."""
    return quantize(rows, 0)


def load_gemma(checkpoint_dir: Any, config: Any, *, dtype: Any = None
               ) -> Tuple[GemmaModel, Any]:
  """A Gemma model and its parameters from a checkpoint the gemma library wrote.

  Args:
    checkpoint_dir: the folder `gm.ckpts.save_params(params, checkpoint_dir)` wrote (or a
      published Gemma checkpoint's folder, or a Kauldron checkpoint's).
    config: a `GemmaConfig`, the gemma library's `TransformerConfig`, or a `gm.nn` model
      class or instance (`gm.nn.Gemma3_270M`); the gemma package is not needed to decode.
    dtype: None keeps the stored parameter dtypes; else floating-point parameters are cast
      to it ('float32', 'bfloat16').

  Returns:
    (GemmaModel, nested dict of numpy arrays with the library's names).

  Raises:
    FileNotFoundError: no checkpoint there.
    ValueError: one line naming the first parameter that is missing, unexpected or of the
      wrong shape for `config`, or what else is wrong inside the checkpoint.
  """
  model = GemmaModel(config)
  return model, load_gemma_params(checkpoint_dir, model.param_shapes(), dtype=dtype)
