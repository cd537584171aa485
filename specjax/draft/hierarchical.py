"""Hierarchical drafting: a drafter that is itself a speculative decoder.

A medium model M drafts for the target, and is itself sped up by an inner
drafter (e.g. a small model): inside `propose`, inner rounds of exact
speculative sampling (inner guesses verified by M in one call each) produce γ
tokens distributed exactly as M's standardized distribution, and the q handed
to the target's verification is M's distribution at those positions. So the
target's output stays exactly the target's (three models, still exact).

Randomness: the inner rounds use the row key folded with `INNER_KEY`, so they
never reuse the target-level streams.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Tuple

import flax
import jax
import jax.numpy as jnp

from specjax.draft.base import Accepted, DrafterDefaults, Proposal, check_sizes
from specjax.draft.model import ModelDrafter, catch_up_cache
from specjax.models import DecodingModel, start_model
from specjax.rows import take_rows, update_rows
from specjax.verify import ReferenceVerifier, emitted_tokens, verify_batch

INNER_KEY = 7


@flax.struct.dataclass
class HierarchicalState:
  cache: Any  # the medium model's KV cache
  encoded: Any  # the medium model's encoder output (None for decoder-only)
  fed: jax.Array  # int32 [B]: medium cache positions 0..fed-1 hold committed tokens
  start: jax.Array  # int32 [B]: the row's committed length at the last `propose`
  inner: Any  # the inner ModelDrafter's state


@dataclasses.dataclass(frozen=True)
class HierarchicalDrafter(DrafterDefaults):
  """Medium model verified against an inner `ModelDrafter`, drafting for the target.

  params: {'medium': medium params, 'inner': the inner drafter's params}.
  """

  medium: DecodingModel
  inner: ModelDrafter
  max_gamma: int
  inner_gamma: int = 3

  tree: ClassVar[None] = None  # a chain drafter
  deterministic: ClassVar[bool] = False

  def __post_init__(self):
    check_sizes(self, max_gamma=1, inner_gamma=1)
    if not isinstance(self.inner, ModelDrafter):  # e.g. a FeatureDrafter: no target features here
      raise ValueError(f"HierarchicalDrafter.inner must be a ModelDrafter, got "
                       f"{type(self.inner).__name__}")
    if self.inner.vocab_size != self.medium.vocab_size:
      raise ValueError(f"medium and inner draft vocabularies differ: {self.medium.vocab_size} "
                       f"vs {self.inner.vocab_size}")
    if not 1 <= self.inner_gamma <= self.inner.max_gamma:
      raise ValueError(f"inner_gamma must be in [1, {self.inner.max_gamma}], got {self.inner_gamma}")
    if self.inner.window < 3:
      raise ValueError("the inner ModelDrafter needs window=3: a target rollback can leave it "
                       "two tokens behind")

  @property
  def vocab_size(self) -> int:
    return self.medium.vocab_size

  @property
  def lookahead(self) -> int:
    """Cache positions a round writes past the committed tokens: the guesses."""
    return self.max_gamma

  @property
  def models(self) -> Tuple[DecodingModel, ...]:
    return (self.medium,) + self.inner.models

  def init(self, params, inputs, seq, length, cache_len):
    cache, encoded, fed = start_model(self.medium, params["medium"], inputs, length, cache_len)
    inner = self.inner.init(params["inner"], inputs, seq, length, cache_len)
    return HierarchicalState(cache=cache, encoded=encoded, fed=fed, start=length, inner=inner)

  def propose(self, params, state, seq, length, gamma, row_keys, sampling):
    batch, total = seq.shape
    big = self.max_gamma
    inner_keys = jax.vmap(lambda k: jax.random.fold_in(k, INNER_KEY))(row_keys)
    inner_gamma = jnp.full((batch,), self.inner_gamma, jnp.int32)
    width = self.inner_gamma + 2  # catch-up token + last token + inner guesses

    def round_(carry):
      tseq, tlen, made, out, probs, cache, fed, inner, calls = carry
      proposal, inner = self.inner.propose(params["inner"], inner, tseq, tlen, inner_gamma,
                                           inner_keys, sampling)
      guesses = proposal.tokens[:, :self.inner_gamma]
      q = proposal.probs[:, :self.inner_gamma]
      # The medium scores [x_{L-1-lag}, x_{L-1}, guesses] in ONE call (lag 0 or 1).
      lag = jnp.clip(tlen - 1 - fed, 0, 1)
      ext = update_rows(tseq, guesses, jnp.minimum(tlen, total - self.inner_gamma))
      begin = tlen - 1 - lag
      tokens = take_rows(ext, begin[:, None] + jnp.arange(width)[None, :])
      logits, cache = self.medium.decode(params["medium"], cache, tokens, begin, state.encoded)
      index = lag[:, None] + jnp.arange(self.inner_gamma + 1)[None, :]
      logits = jnp.take_along_axis(logits, index[:, :, None], axis=1)  # [B, g+1, V]
      # Exact inner verification (reference verifier, lenience 1).
      n, token, _ = verify_batch(sampling, ReferenceVerifier(), 1.0, inner_keys, tlen, guesses, q,
                                 logits, inner_gamma)
      p = sampling.probs(logits)  # M's standardized distribution at the g+1 positions
      # NaN in the inner q breaks the inner verification: pass it on as NaN in M's q, so the
      # decode loop reports the row instead of verifying tokens not drawn from that q.
      p = jnp.where(jnp.any(jnp.isnan(q), axis=(1, 2))[:, None, None], jnp.nan, p)
      inner = self.inner.update(inner, Accepted(start=tlen, n=n, gamma=inner_gamma))
      fed = tlen + n  # the medium fed everything it accepted, not the correction
      emitted = emitted_tokens(guesses, n, token)  # [B, g+1]
      # Append to the tentative sequence and to the outputs (with M's probabilities).
      tseq = update_rows(tseq, emitted, jnp.minimum(tlen, total - emitted.shape[1]))
      out_at = jnp.minimum(made, big)
      pad_out = jnp.concatenate([out, jnp.zeros((batch, self.inner_gamma + 1), jnp.int32)], 1)
      pad_probs = jnp.concatenate(
          [probs, jnp.zeros((batch, self.inner_gamma + 1, probs.shape[-1]), jnp.float32)], 1)
      keep = (made < gamma)[:, None]
      out = jnp.where(keep, update_rows(pad_out, emitted, out_at)[:, :big], out)
      probs = jnp.where(keep[:, :, None], update_rows(pad_probs, p, out_at)[:, :big], probs)
      step = jnp.where(made < gamma, n + 1, 0)
      calls = calls + (made < gamma)
      return (tseq, tlen + step, made + step, out, probs, cache, fed, inner, calls)

    vocab = self.medium.vocab_size
    # Rounds this drafter did not see (γ = 0 rounds) leave the medium further behind than
    # the one-token lag its calls absorb: feed it the missed tokens first.
    cache, fed = catch_up_cache(self.medium, params["medium"], state.cache, state.encoded, seq,
                                length, state.fed, 2, self.inner.catch_up)
    carry = (seq, length, jnp.zeros((batch,), jnp.int32), jnp.zeros((batch, big), jnp.int32),
             jnp.zeros((batch, big, vocab), jnp.float32), cache, fed, state.inner,
             jnp.zeros((batch,), jnp.int32))
    carry = jax.lax.while_loop(lambda c: jnp.any(c[2] < gamma), round_, carry)
    _, _, _, out, probs, cache, fed, inner, calls = carry
    state = state.replace(cache=cache, fed=fed, start=length, inner=inner)
    return Proposal(tokens=out, probs=probs, calls=calls), state  # calls: medium-model calls

  def update(self, state, accepted: Accepted):
    valid = state.start + accepted.n  # committed positions that survived the target's check
    return state.replace(fed=jnp.minimum(state.fed, valid),
                         inner=self.inner.truncate(state.inner, valid))
