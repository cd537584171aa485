"""Gemma's attention over its KV cache: grouped queries (G = N / K query heads per key/value
head), and a cached call's attention and cache write in the order each platform runs fastest
(`specjax.models.gemma`'s layers call these; pure functions of arrays)."""
from __future__ import annotations

from typing import Any, Tuple

import jax.numpy as jnp

from specjax.models.gemma_config import GemmaConfig
from specjax.models.layers import Array, attend_and_write, cache_attention, cached_attention

Bias = Tuple[Array, ...]  # (over the cache before the call [B, 1, q, S], over the call's
# own keys [B|1, 1, q, q], and in a cached call over the cache after its write [B, 1, q, S]);
# float32, 0 visible, NEG_INF masked


def grouped_attention(cfg: GemmaConfig, query: Array, parts, dtype: Any,
                      written: bool = False) -> Tuple[Array, Array]:
  """Queries [B, q, N, H] over head-major parts (keys [B, K, H, kv_i], values [B, K, kv_i, H],
  bias float32 [B|1, 1, q, kv_i]) -> (the heads' outputs [B, q, N * H], the same as
  [B, G*q, K, H]).

  The G = N / K query heads that share a key/value head join the query axis (as G * q
  queries of K heads), so the cache is read once per key/value head. `written`: one part,
  the cache after the call's write, attended as plain products (`layers.cache_attention`,
  the form XLA:GPU fuses into one kernel) unless the scores are soft-capped; else the parts'
  union by `layers.cached_attention`."""
  batch, q, n, h = query.shape
  kv, groups = cfg.num_kv_heads, n // cfg.num_kv_heads
  grouped = query.reshape(batch, q, kv, groups, h).transpose(0, 3, 1, 2, 4)
  grouped = grouped.reshape(batch, groups * q, kv, h)  # [B, G*q, K, H]
  tiled = [(keys, values, jnp.tile(bias, (1, 1, groups, 1))) for keys, values, bias in parts]
  if written and cfg.attn_logits_soft_cap is None:
    grouped = cache_attention(grouped, *tiled[0], dtype)
  else:
    grouped = cached_attention(grouped, tiled, dtype, soft_cap=cfg.attn_logits_soft_cap)
  heads = grouped.reshape(batch, groups, q, kv, h).transpose(0, 2, 3, 1, 4)
  return heads.reshape(batch, q, n * h), grouped


def cached_self_attention(cfg: GemmaConfig, dtype: Any, query: Array, key: Array,
                          value: Array, cache: Tuple[Array, Array], bias: Bias,
                          starts: Array) -> Tuple[Array, Tuple[Array, Array]]:
  """A cached call's attention and cache write, in the order that runs fastest where it is
  lowered, as `decoder_only.cached_self_attention` (both orders compute the same values):
  on the CPU attend over the cache as it was and the call's own keys, then write; on a GPU or
  TPU write first and attend over the written cache with the joined bias (bias[2]).

  Args:
    query [B, k, N, H], key and value [B, k, K, H]: the call's projections; cache (keys
    [B, K, H, S], values [B, K, S, H]); bias: the layer type's (three parts); starts int32
    [B]: the slot of each row's first token.

  Returns:
    (the heads' outputs [B, k, N * H], the written cache).
  """
  def attend(query, parts):
    return grouped_attention(cfg, query, parts, dtype)

  def attend_written(query, keys, values, joined):
    return grouped_attention(cfg, query, [(keys, values, joined)], dtype, written=True)[0]

  return attend_and_write(query, key, value, cache, bias, starts, attend, attend_written)
