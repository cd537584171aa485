"""A plain greedy decoder for specjax's decoder-only parameters: the peer of its AR loop.

One jitted `lax.fori_loop`, one token per step, attention by `jax.nn.dot_product_attention`
over a [B, L, H, D] cache updated with `lax.dynamic_update_slice`: what a JAX user would write
by hand with no framework. It reads the same T5X-named parameter tree as
`specjax.models.DecoderOnlyModel` (float32, or with kernels cast by
`specjax.params.cast_kernels`) and decodes prompts of one common length, so its tokens can be
compared with `specjax.decode.autoregressive_decode`'s and its time put beside it
(`experiments.bench.scale`). Causal models only (no prefix LM).
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax import lax

from specjax.models import DecoderOnlyConfig
from specjax.models.layers import DTYPES, activation_fn, relative_position_bucket

Array = jax.Array


def _dense(x: Array, kernel: Array, dtype: Any) -> Array:
  """x [..., in] @ kernel [in, out] -> [..., out] in `dtype` (float32 sums for bfloat16)."""
  if kernel.dtype == jnp.bfloat16:
    out = lax.dot_general(x.astype(jnp.bfloat16), kernel, (((x.ndim - 1,), (0,)), ((), ())),
                          preferred_element_type=jnp.float32)
    return out.astype(dtype)
  return jnp.dot(x.astype(dtype), kernel.astype(dtype))


def _norm(x: Array, scale: Array, dtype: Any) -> Array:
  """T5's RMS layer norm, in float32."""
  x = x.astype(jnp.float32)
  y = (x * lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6)).astype(dtype)
  return y * scale.astype(dtype)


def _mlp(x: Array, p: Any, activations, dtype: Any) -> Array:
  names = ["wi"] if len(activations) == 1 else [f"wi_{i}" for i in range(len(activations))]
  h = functools.reduce(lambda a, b: a * b, [activation_fn(act)(_dense(x, p[n]["kernel"], dtype))
                                            for act, n in zip(activations, names)])
  return _dense(h, p["wo"]["kernel"], dtype)


def _step(cfg: DecoderOnlyConfig, params: Any, cache, tokens: Array, start: Array):
  """tokens int32 [B, k] at slots start .. start + k - 1 -> (float32 logits [B, V] of the
  last token, updated cache: per layer (keys, values) [B, L, H, D])."""
  dtype, dec = DTYPES[cfg.dtype], params["decoder"]
  batch, k = tokens.shape
  length = cache[0][0].shape[1]
  query_pos = start + jnp.arange(k, dtype=jnp.int32)  # [k]
  slots = jnp.arange(length, dtype=jnp.int32)
  buckets = relative_position_bucket(slots[None, :] - query_pos[:, None], False)  # [k, L]
  table = dec["relpos_bias"]["rel_embedding"]  # [H, 32]
  bias = jnp.transpose(table.T[buckets], (2, 0, 1))[None]  # [1, H, k, L]
  bias = jnp.where(slots[None, None, None, :] <= query_pos[None, None, :, None], bias, -1e10)
  embedding = dec["token_embedder"]["embedding"]
  x = jnp.take(embedding, tokens, axis=0).astype(dtype)  # [B, k, E]
  heads = lambda y: y.reshape(batch, k, cfg.num_heads, cfg.head_dim)
  new_cache = []
  for i, (keys, values) in enumerate(cache):
    p = dec[f"layers_{i}"]
    att = p["self_attention"]
    h = _norm(x, p["pre_self_attention_layer_norm"]["scale"], dtype)
    q, kk, vv = (heads(_dense(h, att[n]["kernel"], dtype)) for n in ("query", "key", "value"))
    keys = lax.dynamic_update_slice(keys, kk.astype(keys.dtype), (0, start, 0, 0))
    values = lax.dynamic_update_slice(values, vv.astype(values.dtype), (0, start, 0, 0))
    out = jax.nn.dot_product_attention(q, keys.astype(dtype), values.astype(dtype), bias=bias,
                                       scale=1.0)  # [B, k, H, D]
    x = x + _dense(out.reshape(batch, k, -1).astype(dtype), att["out"]["kernel"], dtype)
    x = x + _mlp(_norm(x, p["pre_mlp_layer_norm"]["scale"], dtype), p["mlp"],
                 cfg.mlp_activations, dtype)
    new_cache.append((keys, values))
  y = _norm(x[:, -1], dec["decoder_norm"]["scale"], dtype)  # [B, E]
  if cfg.logits_via_embedding:
    if embedding.dtype == jnp.bfloat16:
      logits = lax.dot_general(y.astype(jnp.bfloat16), embedding, (((1,), (1,)), ((), ())),
                               preferred_element_type=jnp.float32)
    else:
      logits = jnp.dot(y.astype(jnp.float32), embedding.T)
    logits = logits / jnp.sqrt(jnp.float32(cfg.emb_dim))
  else:
    logits = _dense(y, dec["logits_dense"]["kernel"], jnp.float32)
  return logits.astype(jnp.float32), tuple(new_cache)


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def reference_decode(cfg: DecoderOnlyConfig, params: Any, prompts: Array, new_tokens: int,
                     cache_len: Optional[int] = None) -> Array:
  """Greedy decoding: the prompt in one call, then `new_tokens` - 1 one-token steps.

  Args:
    cfg: the model's DecoderOnlyConfig (causal; static).
    params: its parameter tree (T5X names), float32 or with kernels cast to bfloat16.
    prompts: int32 [B, P], every row P real tokens (no padding).
    new_tokens: tokens to generate per row (static).
    cache_len: slots of the cache (static), >= P + new_tokens; default P + new_tokens.

  Returns:
    int32 [B, new_tokens]: the argmax after the prompt, then after each generated token.
  """
  batch, plen = prompts.shape
  length = cache_len or plen + new_tokens
  if length < plen + new_tokens:
    raise ValueError(f"cache_len {length} cannot hold {plen} prompt and {new_tokens} new tokens")
  dtype = DTYPES[cfg.dtype]
  shape = (batch, length, cfg.num_heads, cfg.head_dim)
  cache = tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
                for _ in range(cfg.num_layers))
  logits, cache = _step(cfg, params, cache, prompts.astype(jnp.int32), jnp.int32(0))
  out = jnp.zeros((batch, new_tokens), jnp.int32).at[:, 0].set(jnp.argmax(logits, -1))

  def body(i, carry):
    out, cache = carry
    logits, cache = _step(cfg, params, cache, lax.dynamic_slice_in_dim(out, i - 1, 1, axis=1),
                          plen + i - 1)
    return out.at[:, i].set(jnp.argmax(logits, -1).astype(jnp.int32)), cache

  return lax.fori_loop(1, new_tokens, body, (out, cache))[0]
