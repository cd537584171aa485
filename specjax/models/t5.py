"""T5 1.1 encoder-decoder of t5x/examples/t5/network.py, with a multi-token cache.

Parameter tree (T5X names, so a T5X checkpoint's `target` loads as is):
  token_embedder/embedding                      [V, E]  shared by both stacks
  encoder/relpos_bias/rel_embedding             [H, 32]
  encoder/layers_i/pre_attention_layer_norm/scale          [E]
  encoder/layers_i/attention/{query,key,value}/kernel      [E, H*D]
  encoder/layers_i/attention/out/kernel                    [H*D, E]
  encoder/layers_i/pre_mlp_layer_norm/scale                [E]
  encoder/layers_i/mlp/{wi_0,wi_1}/kernel [E, F], mlp/wo/kernel [F, E]
  encoder/encoder_norm/scale                               [E]
  decoder/relpos_bias/rel_embedding             [H, 32]
  decoder/layers_i/{pre_self_attention_layer_norm, self_attention,
      pre_cross_attention_layer_norm, encoder_decoder_attention,
      pre_mlp_layer_norm, mlp}
  decoder/decoder_norm/scale                    [E]
  decoder/logits_dense/kernel                   [E, V]  (absent with logits_via_embedding)

Example:
  model = T5Model(T5Config(vocab_size=64, emb_dim=16, num_heads=2,
      num_encoder_layers=2, num_decoder_layers=2, head_dim=8, mlp_dim=32))
  params = model.init(jax.random.PRNGKey(0))
  encoded = model.encode(params, inputs)              # once per generation
  cache = model.init_cache(batch, max_len)
  logits, cache = model.decode(params, cache, jnp.zeros((batch, 1), jnp.int32),
                               jnp.zeros(batch, jnp.int32), encoded)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp

from specjax.models.decoder_only import DecoderStack
from specjax.models.checks import (check_logits_at, check_positions, check_tokens, check_tree,
                                   validate_config)
from specjax.models.layers import (DTYPES, Array, EncodedInputs, Embed, KVCache, MlpBlock,
                                   MultiHeadAttention, RelativePositionBias, RMSNorm, mask_to_bias)
from specjax.models.network import NetworkModel
from specjax.models.tree import TreeAttention

T5Encoded = EncodedInputs  # what `T5Model.encode` returns


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Sizes of a T5X encoder-decoder (field names of T5X's network.T5Config)."""
  vocab_size: int
  """Rows of the shared token embedding and size of the logits (T5: 32128)."""
  emb_dim: int
  """Width E of the residual stream."""
  num_heads: int
  """Attention heads H."""
  num_encoder_layers: int
  """Encoder layers."""
  num_decoder_layers: int
  """Decoder layers."""
  head_dim: int
  """Width D of each head (H * D need not equal E)."""
  mlp_dim: int
  """Hidden width of the MLP."""
  mlp_activations: Tuple[str, ...] = ("gelu", "linear")
  """One name per input kernel: ('gelu', 'linear') is T5 1.1's gated gelu
  (wi_0, wi_1); T5 1.0 uses ('relu',), whose single kernel is named `wi`."""
  logits_via_embedding: bool = False
  """True: logits = y @ embedding.T / sqrt(E) (no logits_dense kernel)."""
  dtype: str = "float32"
  """Activation, compute and cache dtype; parameters stay float32."""
  attention_impl: str = "specjax"
  """How attention is computed, not what (`layers.ATTENTION_IMPLEMENTATIONS`): 'specjax'
  (default), or jax.nn.dot_product_attention with 'xla' or 'cudnn'. Same parameters."""

  def __post_init__(self):
    validate_config(self, ("vocab_size", "emb_dim", "num_heads", "num_encoder_layers",
                           "num_decoder_layers", "head_dim", "mlp_dim"))


class EncoderLayer(nn.Module):
  """T5X encoder layer: bidirectional self-attention and gated MLP."""
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, bias: Array) -> Array:
    """x: [B, L, E]; bias: float32 [B, H, L, L] incl. the padding mask -> [B, L, E]."""
    cfg, dtype = self.config, DTYPES[self.config.dtype]
    h = RMSNorm(dtype, name="pre_attention_layer_norm")(x)
    x = x + MultiHeadAttention(cfg.num_heads, cfg.head_dim, cfg.emb_dim, dtype,
                               cfg.attention_impl, name="attention")(h, h, bias)
    h = RMSNorm(dtype, name="pre_mlp_layer_norm")(x)
    return x + MlpBlock(cfg.mlp_dim, cfg.mlp_activations, dtype, name="mlp")(h)


class Encoder(nn.Module):
  """T5X encoder stack (`relpos_bias`, `layers_i`, `encoder_norm`)."""
  config: T5Config
  shared_embedding: Embed

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    """inputs: int32 [B, L_in], 0 = padding -> [B, L_in, E]."""
    cfg = self.config
    pos = jnp.arange(inputs.shape[1], dtype=jnp.int32)
    real = inputs > 0
    bias = RelativePositionBias(cfg.num_heads, name="relpos_bias")(pos[None], pos, True)
    bias = bias + mask_to_bias(real[:, None, :, None] & real[:, None, None, :])
    x = self.shared_embedding(inputs)
    for i in range(cfg.num_encoder_layers):
      x = EncoderLayer(cfg, name=f"layers_{i}")(x, bias)
    return RMSNorm(DTYPES[cfg.dtype], name="encoder_norm")(x)


class T5Network(nn.Module):
  """Flax module with T5X's tree: `token_embedder`, `encoder`, `decoder`."""
  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, DTYPES[cfg.dtype])
    self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = DecoderStack(cfg, cfg.num_decoder_layers, cross_attention=True,
                                shared_embedding=self.token_embedder)

  def encode(self, inputs: Array) -> EncodedInputs:
    """inputs int32 [B, L_in] -> cross-attention keys/values of every decoder layer."""
    keys, values = self.decoder.cross_kv(self.encoder(inputs))
    return EncodedInputs(keys=keys, values=values, mask=inputs > 0)

  def forward(self, inputs: Array, decoder_input_tokens: Array) -> Array:
    """Teacher-forced logits float32 [B, L_dec, V]."""
    return self.decoder.forward(decoder_input_tokens, None, self.encode(inputs))

  def decode_step(self, tokens: Array, positions: Array, cache: KVCache,
                  encoded: EncodedInputs, logits_at: Optional[Array] = None,
                  tree: Optional[TreeAttention] = None) -> Tuple[Array, KVCache]:
    """Cached step; see `DecoderStack.decode_step`."""
    return self.decoder.decode_step(tokens, positions, cache, None, encoded, logits_at, tree)

  def forward_features(self, inputs: Array, decoder_input_tokens: Array,
                       encoded: Optional[EncodedInputs] = None,
                       feature_layers: Optional[Tuple[int, ...]] = None):
    """Teacher-forced (logits float32 [B, L_dec, V], features float32 [B, L_dec, E], or
    [B, L_dec, n * E] with static `feature_layers`); `encoded`: `encode(inputs)` when the
    caller has it already."""
    encoded = self.encode(inputs) if encoded is None else encoded
    return self.decoder.forward(decoder_input_tokens, None, encoded, features=True,
                                feature_layers=feature_layers)

  def decode_step_features(self, tokens: Array, positions: Array, cache: KVCache,
                           encoded: EncodedInputs, tree: Optional[TreeAttention] = None,
                           feature_layers: Optional[Tuple[int, ...]] = None):
    """Cached step -> (logits [B, k, V], features [B, k, E] or [B, k, n * E], KVCache)."""
    return self.decoder.decode_step(tokens, positions, cache, None, encoded, tree=tree,
                                    features=True, feature_layers=feature_layers)

  def embed(self, tokens: Array) -> Array:
    """The shared input embeddings [..., E] of tokens int32 [...]."""
    return self.token_embedder(tokens)

  def output_logits(self, features: Array) -> Array:
    """Decoder features [..., E] -> float32 logits [..., V]."""
    return self.decoder.output_logits(features)


class T5Model(NetworkModel):
  """T5 1.1 encoder-decoder behind the `DecodingModel` protocol.

  The decoder starts at position 0 with token 0 (T5X's start token).
  `encode` runs the encoder once and precomputes every decoder layer's
  cross-attention keys and values; `decode` only reads them.
  """
  is_encoder_decoder = True
  _init_inputs = 2  # forward(inputs, decoder_input_tokens)

  def __init__(self, config: T5Config):
    if not isinstance(config, T5Config):
      raise ValueError(f"T5Model needs a T5Config, got {type(config).__name__}")
    super().__init__(config, config.num_decoder_layers)
    self._net = T5Network(config)

  def encode(self, params: Any, inputs: Any) -> EncodedInputs:
    """Runs the encoder once per generation.

    Args:
      params: parameter tree (T5X names).
      inputs: int32 [B, L_in], 0 = padding.

    Returns:
      EncodedInputs: per decoder layer cross-attention keys [B, H, D, L_in] and
      values [B, H, L_in, D], and the input mask bool [B, L_in].
    """
    self.check_params(params)
    inputs = check_tokens(inputs, self.vocab_size, "encoder inputs")
    return self._apply("encode", params, inputs)

  def logits(self, params: Any, inputs: Any, decoder_input_tokens: Any) -> Array:
    """Teacher-forced logits (training, scoring).

    Args:
      params: parameter tree (T5X names).
      inputs: int32 [B, L_in], 0 = padding.
      decoder_input_tokens: int32 [B, L_dec], the targets shifted right with
        0 as the start token (T5X convention).

    Returns:
      float32 [B, L_dec, V]; logits[:, i] predicts target i.
    """
    self.check_params(params)
    inputs = check_tokens(inputs, self.vocab_size, "encoder inputs")
    decoder_input_tokens = check_tokens(decoder_input_tokens, self.vocab_size,
                                        "decoder_input_tokens")
    if inputs.shape[0] != decoder_input_tokens.shape[0]:
      raise ValueError(f"inputs have {inputs.shape[0]} rows but decoder_input_tokens "
                       f"have {decoder_input_tokens.shape[0]}")
    return self._apply("forward", params, inputs, decoder_input_tokens)

  def decode(self, params: Any, cache: KVCache, tokens: Any, positions: Any,
             encoded: EncodedInputs, *, logits_at: Any = None,
             tree: Optional[TreeAttention] = None) -> Tuple[Array, KVCache]:
    """Writes k decoder tokens per row at the row's own position; returns their logits.

    Args:
      params: parameter tree (T5X names).
      cache: KVCache from `init_cache`.
      tokens: int32 [B, k].
      positions: int32 [B] slot of tokens[b, 0]; positions + k <= max_len.
        Slots after positions[b] + k - 1 are masked, so moving a row's
        position back rolls it back.
      encoded: what `encode` returned for these rows.
      logits_at: int32 [B] in [0, k) or None: return only the logits of
        tokens[b, logits_at[b]], as [B, 1, V].
      tree: None (a chain call), or a `specjax.models.tree.TreeAttention`: the k tokens
        are a token tree (each attends to the visible cache and its ancestors only, at
        its own sequence position).

    Returns:
      (float32 logits [B, k, V] ([B, 1, V] with logits_at), updated cache).
    """
    tokens, positions = self._check_decode(params, cache, tokens, positions, encoded)
    batch, k = tokens.shape
    logits_at = check_logits_at(logits_at, batch, k)
    check_tree(tree, batch, k, cache.max_len, None)
    return self._apply("decode_step", params, tokens, positions, cache, encoded, logits_at,
                       tree)

  # Target features (opt-in): the decoder's final hidden state, after `decoder_norm`.
  def decode_features(self, params: Any, cache: KVCache, tokens: Any, positions: Any,
                      encoded: EncodedInputs, *, tree: Optional[TreeAttention] = None,
                      feature_layers: Any = None) -> Tuple[Array, Array, KVCache]:
    """`decode` (a chain call, or a tree call with `tree`) that also returns each decoder
    token's final hidden state: (float32 logits [B, k, V], float32 features [B, k, E],
    updated cache); with `feature_layers` (`specjax.models.protocol.FEATURE_LAYERS`) those
    hidden states concatenated, [B, k, n * E]."""
    tokens, positions = self._check_decode(params, cache, tokens, positions, encoded)
    check_tree(tree, tokens.shape[0], tokens.shape[1], cache.max_len, None)
    return self._apply_features("decode_step_features", feature_layers, params, tokens,
                                positions, cache, encoded, tree)

  def features(self, params: Any, inputs: Any, decoder_input_tokens: Any,
               encoded: Optional[EncodedInputs] = None, feature_layers: Any = None
               ) -> Tuple[Array, Array]:
    """Teacher-forced (logits float32 [B, L_dec, V], features float32 [B, L_dec, E], or
    [B, L_dec, n * E] with `feature_layers` as `decode_features`); `encoded`: this model's
    `encode(params, inputs)` when the caller has it (not run again)."""
    self.check_params(params)
    inputs = check_tokens(inputs, self.vocab_size, "encoder inputs")
    decoder_input_tokens = check_tokens(decoder_input_tokens, self.vocab_size,
                                        "decoder_input_tokens")
    return self._apply_features("forward_features", feature_layers, params, inputs,
                                decoder_input_tokens, encoded)

  def _check_decode(self, params, cache, tokens, positions, encoded):
    self.check_params(params)
    tokens = check_tokens(tokens, self.vocab_size, "decode tokens")
    batch, k = tokens.shape
    self._check_cache(cache, batch)
    positions = check_positions(positions, batch, k, cache.max_len)
    if not isinstance(encoded, EncodedInputs):
      raise ValueError("T5Model.decode needs encoded = T5Model.encode(params, inputs), "
                       f"got {type(encoded).__name__}")
    if (len(encoded.keys) != self.config.num_decoder_layers
        or encoded.mask.shape[0] != batch):
      raise ValueError(f"encoded holds {len(encoded.keys)} layers for "
                       f"{encoded.mask.shape[0]} rows; decode has {batch} rows and the "
                       f"model {self.config.num_decoder_layers} decoder layers")
    return tokens, positions
