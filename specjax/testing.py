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
