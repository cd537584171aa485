"""`ModelDrafter`: any specjax model as the draft, with its own KV cache."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Tuple

import flax
import jax
import jax.numpy as jnp

from specjax.draft.base import (Accepted, DrafterDefaults, Proposal, check_sizes,
                                guess_chain)
from specjax.models import DecodingModel, start_model
from specjax.models.protocol import decode_logits_at
from specjax.rows import take_rows


@flax.struct.dataclass
class ModelDrafterState:
  """A `ModelDrafter`'s per-decode state: its KV cache and how far each row has fed it."""
  cache: Any  # the draft model's KV cache
  encoded: Any  # the draft's encoder output (None for decoder-only)
  fed: jax.Array  # int32 [B]: cache positions 0..fed-1 hold the row's committed tokens
  start: jax.Array  # int32 [B]: the row's length at the last `propose`


@dataclasses.dataclass(frozen=True)
class ModelDrafter(DrafterDefaults):
  """Any specjax model as the draft, with its own KV cache.

  The cache holds the committed tokens at positions 0..fed-1. A round needs positions up
  to length-2 (the last token is fed again), so its first call feeds a short
  catch-up window [x_{L-1-lag} .. x_{L-1}] with lag = L-1-fed: after a rejection
  lag is 0 (stale positions are overwritten), after a round that accepted all γ it is
  1 (x_γ was drafted but never fed), so no extra full draft pass is needed.
  Rounds the drafter did not see (γ = 0 rounds of the 'auto' policy: a plain target
  step, no draft call) leave a longer lag; `propose` first feeds the missed tokens
  in chunks of `catch_up` (`catch_up_cache`), so any lag is caught up exactly.
  """

  model: DecodingModel
  max_gamma: int
  window: int = 2
  """Static catch-up window: lags up to window-1 (2 suffices alone; 3 inside a hierarchy)."""
  catch_up: int = 8
  """Static chunk width that feeds longer lags (after rounds without a draft call)."""

  tree: ClassVar[None] = None  # a chain drafter
  deterministic: ClassVar[bool] = False

  def __post_init__(self):
    check_sizes(self, max_gamma=1, window=2)

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  @property
  def lookahead(self) -> int:
    """Cache positions a round writes past the committed tokens: the guesses."""
    return self.max_gamma

  @property
  def models(self) -> Tuple[DecodingModel, ...]:
    return (self.model,)

  def init(self, params, inputs, seq, length, cache_len):
    cache, encoded, fed = start_model(self.model, params, inputs, length, cache_len)
    return ModelDrafterState(cache=cache, encoded=encoded, fed=fed, start=length)

  def propose(self, params, state, seq, length, gamma, row_keys, sampling):
    cache, fed = catch_up_cache(self.model, params, state.cache, state.encoded, seq, length,
                                state.fed, self.window, self.catch_up)
    state = state.replace(cache=cache, fed=fed)
    lag = jnp.clip(length - 1 - state.fed, 0, self.window - 1)
    # First call: the catch-up window x_{L-1-lag} .. x_{L-1} (+ junk positions that
    # later calls overwrite); the distribution of x_1 is read at index lag.
    begin = length - 1 - lag
    window = take_rows(seq, begin[:, None] + jnp.arange(self.window)[None, :])
    logits, cache = decode_logits_at(self.model, params, state.cache, window, begin,
                                     state.encoded, lag)  # [B, V]

    def step(cache, prev, i):  # the model on guess i - 1
      logits, cache = self.model.decode(params, cache, prev, length + i - 1, state.encoded)
      return logits[:, 0], cache

    tokens, all_probs, cache = guess_chain(logits, step, cache, row_keys, length, gamma,
                                           self.max_gamma, sampling)
    # Fed: the committed tokens, then x_1 .. x_{G-1} (G = the batch's largest γ).
    state = state.replace(cache=cache, fed=length + jnp.max(gamma) - 1, start=length)
    return Proposal(tokens=tokens, probs=all_probs, calls=gamma), state

  def update(self, state, accepted: Accepted):
    return self.truncate(state, state.start + accepted.n)

  def truncate(self, state, valid):
    """Only positions 0..valid-1 still hold committed tokens (valid int32 [B])."""
    return state.replace(fed=jnp.minimum(state.fed, valid))


def catch_up_cache(model: DecodingModel, params, cache, encoded, seq, length, fed, window: int,
                   chunk: int):
  """Feeds the committed tokens a model's cache missed until every row lags < `window`.

  seq: int32 [B, T]; length, fed: int32 [B] (positions 0..fed-1 hold committed tokens).
  While some row lags by window or more (lag = length-1-fed), every row is fed the
  `chunk` tokens from its position min(fed, length-1, T-chunk): committed positions are only
  ever rewritten with the same tokens, and junk written past a row's length is
  overwritten by later calls before any query reads it (keys past a row's position are
  masked). Returns (cache, fed int32 [B]); no call at all when no row lags that far.
  """
  chunk = min(chunk, seq.shape[1])
  offsets = jnp.arange(chunk)[None, :]

  def behind(carry):
    return jnp.any(length - 1 - carry[1] >= window)

  def feed(carry):
    cache, fed = carry
    start = jnp.minimum(jnp.minimum(fed, length - 1), seq.shape[1] - chunk)
    _, cache = model.decode(params, cache, take_rows(seq, start[:, None] + offsets), start,
                            encoded)
    return cache, jnp.minimum(start + chunk, length)

  return jax.lax.while_loop(behind, feed, (cache, fed))
