"""Tiny fixtures shipped with the package: models given as fixed probability tables, and one
tiny random-init target/draft pair of real models.

`TableModel` implements `specjax.models.protocol.DecodingModel` with a trigram
table: the logits at slot t are `log_table[token at t-1, token at t]`, where
the token at t-1 is read from the model's own KV-style cache. Stale cache slots
therefore change its output, so decode-loop tests through it also check that
rollback never lets a rejected guess leak into later logits.

`tiny_pair(family)` is a random-init pair over the bundled 8k vocabulary ('t5': the pair of
gin/runs/random_tiny.gin; 'lm': a one-layer decoder-only pair), built once per process, so
that tests sharing it share its compiled loops too. Its outputs mean nothing.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import DecoderOnlyConfig, T5Config, build_model

TINY_VOCAB = 8192
"""The bundled SentencePiece vocabulary's size (`specjax.data.load_vocab`)."""

TINY_CONFIGS = {
    # gin/models/specjax_tiny_t5.gin, and its draft as gin/runs/random_tiny.gin binds it.
    "t5": (T5Config(vocab_size=TINY_VOCAB, emb_dim=64, num_heads=4, num_encoder_layers=2,
                    num_decoder_layers=2, head_dim=16, mlp_dim=128,
                    mlp_activations=("gelu", "linear"), logits_via_embedding=False),
           T5Config(vocab_size=TINY_VOCAB, emb_dim=64, num_heads=4, num_encoder_layers=1,
                    num_decoder_layers=1, head_dim=16, mlp_dim=128,
                    mlp_activations=("gelu", "linear"), logits_via_embedding=False)),
    "lm": (DecoderOnlyConfig(vocab_size=TINY_VOCAB, emb_dim=16, num_heads=1, num_layers=1,
                             head_dim=8, mlp_dim=16),
           DecoderOnlyConfig(vocab_size=TINY_VOCAB, emb_dim=16, num_heads=1, num_layers=1,
                             head_dim=8, mlp_dim=8)),
}
"""(target, draft) configs of the tiny pairs, by family."""


@dataclasses.dataclass(frozen=True)
class TinyPair:
  """A tiny random-init target/draft pair (`tiny_pair`)."""

  target: Any  # the target DecodingModel
  target_params: Any  # its random init (seed 0)
  draft: Any  # the draft DecodingModel
  draft_params: Any  # its random init (seed 1)


@functools.lru_cache(maxsize=None)
def tiny_pair(family: str = "t5") -> TinyPair:
  """The tiny pair of `family` ('t5' or 'lm', `TINY_CONFIGS`), built once per process.

  The params are shared by every caller: treat them as read-only."""
  if family not in TINY_CONFIGS:
    raise ValueError(f"family must be one of {sorted(TINY_CONFIGS)}, got {family!r}")
  target_config, draft_config = TINY_CONFIGS[family]
  target, draft = build_model(target_config), build_model(draft_config)
  return TinyPair(target=target, target_params=target.init(jax.random.PRNGKey(0)), draft=draft,
                  draft_params=draft.init(jax.random.PRNGKey(1)))


@dataclasses.dataclass(frozen=True)
class TableModel:
  """A decoder-only (or, with `encoder_decoder=True`, a T5-like) trigram table model.

  params: float32 log_table [V, V, V]. For the encoder-decoder flavour the
  encoder output is ignored apart from shape checks (the decoder starts at token 0).
  """

  vocab: int
  encoder_decoder: bool = False

  @property
  def vocab_size(self) -> int:
    return self.vocab

  @property
  def is_encoder_decoder(self) -> bool:
    return self.encoder_decoder

  def encode(self, params, inputs):
    return jnp.zeros((inputs.shape[0],), jnp.float32) if self.encoder_decoder else None

  def init_cache(self, batch, max_len):
    return jnp.zeros((batch, max_len), jnp.int32)  # the tokens written so far

  def decode(self, params, cache, tokens, positions, encoded, *, tree=None, **unused):
    k = tokens.shape[1]
    old = cache
    cache = jax.vmap(lambda c, t, p: jax.lax.dynamic_update_slice(c, t, (p,)))(
        cache, tokens, positions)
    if tree is not None:
      return params[_tree_prev(old, tokens, positions, tree), tokens], cache
    slots = positions[:, None] + jnp.arange(k)[None, :]  # [B, k]
    prev = jnp.where(slots > 0, jnp.take_along_axis(cache, jnp.maximum(slots - 1, 0), 1), 0)
    return params[prev, tokens], cache

  def move_slots(self, cache, src, dst):
    """Copies each row's slots src[b, i] to dst[b] + i (src int32 [B, n], dst int32 [B])."""
    moved = jnp.take_along_axis(cache, src, axis=1)
    return jax.vmap(lambda c, t, p: jax.lax.dynamic_update_slice(c, t, (p,)))(cache, moved, dst)


def _tree_prev(cache, tokens, positions, tree):
  """The token before each token of a tree call: the visible token one position earlier,
  among the call's tokens or the cache before it (0 at position 0). -> int32 [B, k]."""
  pos = tree.token_pos  # [B, k]
  want = pos - 1
  in_call = tree.visible & (pos[:, None, :] == want[:, :, None])  # [B, k, k]
  slots = jnp.arange(cache.shape[1])[None, :]
  cache_pos = jnp.broadcast_to(slots, cache.shape) if tree.cache_pos is None else tree.cache_pos
  seen = (tree.cache_visible if tree.cache_visible is not None
          else (slots < positions[:, None])[:, None, :])
  in_cache = seen & (cache_pos[:, None, :] == want[:, :, None])  # [B, k, S]
  from_call = jnp.sum(jnp.where(in_call, tokens[:, None, :], 0), axis=2)
  from_cache = jnp.sum(jnp.where(in_cache, cache[:, None, :], 0), axis=2)
  return jnp.where(want >= 0, from_call + from_cache, 0)


def random_table(seed: int, vocab: int, sharpness: float = 1.5) -> jnp.ndarray:
  """Random log-probabilities [V, V, V] (rows normalized)."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(vocab, vocab, vocab)) * sharpness
  return jnp.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1))


def exact_joint(log_table: np.ndarray, sampling, prefix, steps: int) -> dict:
  """Exact distribution of the next `steps` tokens of a TableModel, enumerated.

  Args:
    log_table: [V, V, V] the model's params.
    sampling: a `Sampling`; applied to each row of logits.
    prefix: the decoder prefix (prompt, or [0] for encoder-decoder).
    steps: how many tokens to enumerate (V**steps outcomes).
  Returns:
    {tuple of tokens: probability}.
  """
  vocab = log_table.shape[0]
  probs = np.asarray(sampling.probs(jnp.asarray(log_table)), np.float64)  # [V, V, V]
  out = {}
  for seq in itertools.product(range(vocab), repeat=steps):
    context = list(prefix)
    prob = 1.0
    for token in seq:
      prev = context[-2] if len(context) >= 2 else 0
      prob *= probs[prev, context[-1], token]
      context.append(token)
    out[seq] = prob
  return out


def joint_tv(tokens: Any, law: dict, steps: int) -> float:
  """Total variation distance between the empirical law of the first `steps` tokens of each
  row of `tokens` int [N, >= steps] and `law` ({tuple of tokens: probability}, e.g.
  `exact_joint`'s)."""
  counts = collections.Counter(map(tuple, np.asarray(tokens)[:, :steps].tolist()))
  total = len(tokens)
  return 0.5 * sum(abs(counts.get(k, 0) / total - law.get(k, 0.0))
                   for k in set(law) | set(counts))


def _tiny_gemma_configs():
  from specjax.models.gemma_config import GemmaConfig  # pylint: disable=import-outside-toplevel
  local, glob = "local_sliding", "global"
  gemma3 = dict(num_embed=TINY_GEMMA_VOCAB, use_qk_norm=True, transpose_gating_einsum=True,
                sliding_window_size=TINY_GEMMA_WINDOW, local_base_frequency=10_000,
                global_base_frequency=1_000_000, global_scale_factor=8.0)
  gemma2 = dict(num_embed=TINY_GEMMA_VOCAB, final_logit_softcap=4.0, attn_logits_soft_cap=2.0,
                sliding_window_size=TINY_GEMMA_WINDOW)
  return {
      # Local and global layers, a window shorter than the sequences, QK norm, GQA 4:1.
      "gemma3": (GemmaConfig(embed_dim=32, hidden_dim=64, num_heads=8, head_dim=8,
                             num_kv_heads=2, attention_types=(local, local, glob), **gemma3),
                 GemmaConfig(embed_dim=16, hidden_dim=32, num_heads=4, head_dim=8,
                             num_kv_heads=1, attention_types=(local, glob), **gemma3)),
      # Soft caps; the query scale by embed_dim // num_heads; the draft with K = N (qkv_einsum).
      "gemma2": (GemmaConfig(embed_dim=32, hidden_dim=64, num_heads=4, head_dim=16,
                             num_kv_heads=2, attention_types=(local, glob),
                             query_pre_attn_norm="by_one_over_sqrt_embed_dim_div_num_heads",
                             **gemma2),
                 GemmaConfig(embed_dim=16, hidden_dim=32, num_heads=2, head_dim=8,
                             num_kv_heads=2, attention_types=(local, glob),
                             use_post_attn_norm=False, use_post_ffw_norm=False, **gemma2)),
  }


TINY_GEMMA_VOCAB = 48
"""Vocabulary of the tiny Gemma configs (`tiny_gemma_configs`)."""
TINY_GEMMA_WINDOW = 8
"""Sliding window of their local layers: shorter than the sequences the tests decode."""


@functools.lru_cache(maxsize=None)
def tiny_gemma_configs(family: str) -> Any:
  """(target, draft) `GemmaConfig`s of a tiny Gemma pair: 'gemma3' (local and global layers,
  QK norm, GQA 4:1, RoPE scale factor) or 'gemma2' (soft caps)."""
  configs = _tiny_gemma_configs()
  if family not in configs:
    raise ValueError(f"family must be one of {sorted(configs)}, got {family!r}")
  return configs[family]
