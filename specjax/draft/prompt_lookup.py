"""Prompt lookup: copy the continuation of the row's last n-gram from its own context."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from specjax.draft.base import Accepted, TableDrafter, Proposal, check_sizes
from specjax.draft.ngram import NoState
from specjax.rows import take_rows


def match_scores(seq: jax.Array, length: jax.Array, max_ngram: int) -> jax.Array:
  """int32 [B, T]: for each end e of an earlier match of the row's last n-gram (n ≤
  max_ngram, continuation at e + 1 ≤ length - 1), run · T + e, the longest match and then
  the most recent first; -1 where none ends. seq [B, T], length [B]."""
  batch, total = seq.shape
  ends = jnp.arange(total)[None, :]  # candidate match end e, continuation at e+1
  run = jnp.zeros((batch, total), jnp.int32)
  alive = jnp.ones((batch, total), jnp.bool_)
  for j in range(max_ngram):
    here = take_rows(seq, ends - j)
    suffix = take_rows(seq, (length - 1 - j)[:, None])
    alive &= (here == suffix) & (ends - j >= 0) & (length[:, None] - 1 - j >= 0)
    run += alive.astype(jnp.int32)
  run = jnp.where(ends <= length[:, None] - 2, run, 0)
  return jnp.where(run > 0, run * total + ends, -1)


def continuation(seq: jax.Array, length: jax.Array, end: jax.Array, found: jax.Array,
                 count: int) -> jax.Array:
  """int32 [B, count]: the tokens after match end `end` [B], continued periodically (a match
  near the end repeats itself); the last token repeated where not `found` [B]."""
  period = jnp.maximum(length - 1 - end, 1)
  offsets = jnp.arange(count)[None, :]
  index = jnp.where(found[:, None], end[:, None] + 1 + offsets % period[:, None],
                    (length - 1)[:, None])
  return take_rows(seq, index)


@dataclasses.dataclass(frozen=True)
class PromptLookupDrafter(TableDrafter):
  """Copies the continuation of the longest earlier match of the row's last n-gram.

  Looks for the longest suffix (up to `max_ngram` tokens) of the row's committed
  tokens that occurred earlier in its own context (prompt + generated; the most
  recent occurrence wins) and proposes the tokens that followed it, continued
  periodically. With no match it proposes the last token repeated. q is one-hot
  at each guess, so verification keeps the output exactly the target's: a
  rejected guess is replaced by a draw from the target's residual, which is p
  with the guess removed.
  """

  vocab: int
  max_gamma: int
  max_ngram: int = 3

  deterministic: ClassVar[bool] = True  # q is one-hot at each guess

  def __post_init__(self):
    check_sizes(self, vocab=1, max_gamma=1, max_ngram=1)

  def init(self, params, inputs, seq, length, cache_len):
    return NoState()

  def propose(self, params, state, seq, length, gamma, row_keys, sampling):
    batch = seq.shape[0]
    score = match_scores(seq, length, self.max_ngram)
    tokens = continuation(seq, length, jnp.argmax(score, axis=1), jnp.max(score, axis=1) >= 0,
                          self.max_gamma)
    probs = jax.nn.one_hot(tokens, self.vocab, dtype=jnp.float32)
    return Proposal(tokens=tokens, probs=probs, calls=jnp.zeros((batch,), jnp.int32)), state

  def update(self, state, accepted: Accepted):
    return state
