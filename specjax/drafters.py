"""Drafters: who guesses the γ tokens that the target verifies.

One protocol, several drafters. A drafter is stateless Python configuration
(hashable, passed to `jax.jit` as static) plus a `params` pytree of arrays and a
per-generation `state` pytree, so the decode loop stays a pure function:

  state = drafter.init(params, inputs, seq, length, cache_len)
  tokens, probs, calls, state = drafter.propose(params, state, seq, length, gamma, row_keys, sampling)
  state = drafter.update(state, num_accepted, gamma)

`probs` are the standardized q (same `Sampling` as the target), which the
tokens were drawn from, so verification stays exact whatever the drafter.
Randomness: the guess at absolute position j of a row uses
`fold_in(fold_in(row_key, j), DRAFT_STREAM)`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Protocol, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specjax.models.protocol import DecodingModel
from specjax.sampling import Sampling, categorical

DRAFT_STREAM = 0
ACCEPT_STREAM = 1
CORRECTION_STREAM = 2


def position_key(row_key: jax.Array, position: jax.Array, stream: int) -> jax.Array:
  """The key of one (row, absolute position, stream); row_key is one row's key."""
  return jax.random.fold_in(jax.random.fold_in(row_key, position), stream)


def take_rows(seq: jax.Array, index: jax.Array) -> jax.Array:
  """seq: [B, T]; index: int32 [B, k] -> seq[b, index[b, i]] as [B, k] (clamped)."""
  index = jnp.clip(index, 0, seq.shape[1] - 1)
  return jnp.take_along_axis(seq, index, axis=1)


class Drafter(Protocol):
  """What `speculative_decode` needs from a drafter."""

  max_gamma: int
  """Static size of the guess buffers; γ (data) is at most this."""

  @property
  def vocab_size(self) -> Optional[int]:
    """The draft vocabulary, checked against the target's; None if it adapts."""

  def init(self, params: Any, inputs: jax.Array, seq: jax.Array, length: jax.Array,
           cache_len: int) -> Any:
    """inputs: int32 [B, L_in] (encoder inputs or prompts); seq: int32 [B, T]; length: int32 [B]."""

  def propose(self, params: Any, state: Any, seq: jax.Array, length: jax.Array,
              gamma: jax.Array, row_keys: jax.Array, sampling: Sampling
              ) -> Tuple[jax.Array, jax.Array, jax.Array, Any]:
    """gamma: int32 [B] (each row's γ) -> (tokens int32 [B, G], probs float32 [B, G, V],
    calls int32 [B], state); guesses beyond a row's γ are ignored by the verifier."""

  def update(self, state: Any, num_accepted: jax.Array, gamma: jax.Array) -> Any:
    """Called after verification with num_accepted int32 [B] (0..γ) and gamma int32 [B]."""


def _sample_guess(row_keys, length, i, probs, greedy: bool):
  """Draws guess i (absolute position length + i) from probs [B, V] per row."""
  if greedy:  # probs are one-hot: no randomness needed
    return jnp.argmax(probs, axis=-1).astype(jnp.int32)
  keys = jax.vmap(position_key, in_axes=(0, 0, None))(row_keys, length + i, DRAFT_STREAM)
  return jax.vmap(categorical)(keys, probs)


def _draft_step(row_keys, length, i, logits, sampling: Sampling):
  """Guess i and its standardized q from the draft's logits [B, V] -> (int32 [B], float32 [B, V]).

  Greedy: the guess is the argmax of the logits and q its one-hot, which is
  `sampling.probs` (argmax, ties to the lowest id) with one pass over the
  vocabulary instead of two (an argmax to build q, another to read it back).
  """
  if sampling.greedy:
    guess = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return guess, jax.nn.one_hot(guess, logits.shape[-1], dtype=jnp.float32)
  probs = sampling.probs(logits)
  return _sample_guess(row_keys, length, i, probs, False), probs


@flax.struct.dataclass
class ModelDrafterState:
  cache: Any  # the draft model's KV cache
  encoded: Any  # the draft's encoder output (None for decoder-only)
  fed: jax.Array  # int32 [B]: cache slots 0..fed-1 hold the row's committed tokens
  start: jax.Array  # int32 [B]: the row's length at the last `propose`


@dataclasses.dataclass(frozen=True)
class ModelDrafter:
  """Any specjax model as the draft, with its own KV cache.

  The cache holds the committed tokens in slots 0..fed-1. A round needs slots up
  to length-2 (the last token is fed again), so its first call feeds a short
  catch-up window [x_{L-1-lag} .. x_{L-1}] with lag = L-1-fed: after a rejection
  lag is 0 (stale slots are overwritten), after a round that accepted all γ it is
  1 (x_γ was drafted but never fed), so no extra full draft pass is needed.
  """

  model: DecodingModel
  max_gamma: int
  window: int = 2
  """Static catch-up window: lags up to window-1 (2 suffices alone; 3 inside a hierarchy)."""

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def init(self, params, inputs, seq, length, cache_len):
    cache, encoded, fed = start_model(self.model, params, inputs, length, cache_len)
    return ModelDrafterState(cache=cache, encoded=encoded, fed=fed, start=length)

  def propose(self, params, state, seq, length, gamma, row_keys, sampling):
    batch = seq.shape[0]
    lag = jnp.clip(length - 1 - state.fed, 0, self.window - 1)
    # First call: the catch-up window x_{L-1-lag} .. x_{L-1} (+ junk slots that
    # later calls overwrite); the distribution of x_1 is read at index lag.
    begin = length - 1 - lag
    window = take_rows(seq, begin[:, None] + jnp.arange(self.window)[None, :])
    logits, cache = self.model.decode(params, state.cache, window, begin, state.encoded)
    logits = jnp.take_along_axis(logits, lag[:, None, None], axis=1)[:, 0]  # [B, V]
    guess0, probs0 = _draft_step(row_keys, length, 0, logits, sampling)
    tokens = jnp.zeros((batch, self.max_gamma), jnp.int32)
    all_probs = jnp.zeros((batch, self.max_gamma, probs0.shape[-1]), jnp.float32)
    tokens = tokens.at[:, 0].set(guess0)
    all_probs = all_probs.at[:, 0].set(probs0)

    def body(i, carry):  # one draft step; runs γ - 1 times per round
      tokens, all_probs, cache = carry
      prev = jax.lax.dynamic_slice_in_dim(tokens, i - 1, 1, axis=1)  # [B, 1]
      logits, cache = self.model.decode(params, cache, prev, length + i - 1, state.encoded)
      guess, probs = _draft_step(row_keys, length, i, logits[:, 0], sampling)
      tokens = jax.lax.dynamic_update_slice_in_dim(tokens, guess[:, None], i, axis=1)
      all_probs = jax.lax.dynamic_update_slice_in_dim(all_probs, probs[:, None], i, axis=1)
      return tokens, all_probs, cache

    # Rows with a smaller γ ride along to the batch's largest γ; only their own count.
    most = jnp.max(gamma)
    tokens, all_probs, cache = jax.lax.fori_loop(1, most, body, (tokens, all_probs, cache))
    # Fed: the committed tokens, then x_1 .. x_{G-1} (G = the batch's largest γ).
    state = state.replace(cache=cache, fed=length + most - 1, start=length)
    return tokens, all_probs, gamma, state

  def update(self, state, num_accepted, gamma):
    return self.truncate(state, state.start + num_accepted)

  def truncate(self, state, valid):
    """Only slots 0..valid-1 still hold committed tokens (valid int32 [B])."""
    return state.replace(fed=jnp.minimum(state.fed, valid))


def start_model(model: DecodingModel, params, inputs: jax.Array, length: jax.Array,
                cache_len: int):
  """Allocates a model's cache, then encodes (T5) or prefills the prompts (decoder-only).

  inputs: int32 [B, L]; length: int32 [B] decoder prefix lengths.
  Returns (cache, encoded or None, fed int32 [B]: cache slots holding the prefix).
  """
  batch = inputs.shape[0]
  cache = model.init_cache(batch, cache_len)
  if model.is_encoder_decoder:
    return cache, model.encode(params, inputs), jnp.zeros((batch,), jnp.int32)
  return prefill(model, params, cache, inputs, length), None, length


def prefill(model: DecodingModel, params, cache, prompts: jax.Array, length: jax.Array):
  """Writes a decoder-only model's prompts [B, P] into its cache (positions 0..P-1)."""
  batch = prompts.shape[0]
  kwargs = {"prefix_lengths": length} if getattr(model, "prefix_lm", False) else {}
  _, cache = model.decode(params, cache, prompts, jnp.zeros((batch,), jnp.int32), None, **kwargs)
  return cache


# --------------------------------------------------------------------------- n-grams


def _table_probs(params, prev: jax.Array) -> jax.Array:
  """Add-k smoothed q(· | prev) from a sparse table. prev: int32 [B] -> float32 [B, V]."""
  ids = params["ids"][prev]  # int32 [B, M]
  counts = params["counts"][prev]  # float32 [B, M]
  total = params["totals"][prev]  # float32 [B]
  vocab = params["smoothing"].shape[0]
  k = params["smoothing"][0]
  base = jnp.full((prev.shape[0], vocab), k, jnp.float32)
  dense = jax.vmap(lambda b, i, c: b.at[i].add(c))(base, ids, counts)
  return dense / (total + k * vocab)[:, None]


@flax.struct.dataclass
class _NoState:
  pass


@dataclasses.dataclass(frozen=True)
class NGramDrafter:
  """Unigram (order 1) or bigram (order 2) drafter with add-k smoothing; c ≈ 0.

  `params` (from `from_corpus`) is a sparse count table: for each context token
  the `max_followers` most frequent next tokens and their counts (the rest
  count as 0), and the total count, so a row of q costs O(V) and the table
  O(V · max_followers) memory instead of O(V²).
  """

  order: int
  vocab: int
  max_gamma: int

  @property
  def vocab_size(self) -> int:
    return self.vocab

  @staticmethod
  def from_corpus(token_lists: Sequence[Sequence[int]], vocab_size: int, *, order: int,
                  max_gamma: int, k: float = 0.01, max_followers: int = 64
                  ) -> Tuple["NGramDrafter", dict]:
    """Counts n-grams in a token corpus. Returns (drafter, params)."""
    if order not in (1, 2):
      raise ValueError(f"order must be 1 (unigram) or 2 (bigram), got {order}")
    if k <= 0:
      raise ValueError(f"add-k smoothing needs k > 0, got {k}")
    contexts = vocab_size if order == 2 else 1
    counts = np.zeros((contexts, vocab_size), np.float64)
    for tokens in token_lists:
      tokens = np.asarray(tokens, np.int64)
      if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"corpus token ids must be in [0, {vocab_size})")
      if order == 1:
        np.add.at(counts[0], tokens, 1)
      elif tokens.size > 1:
        np.add.at(counts, (tokens[:-1], tokens[1:]), 1)
    m = min(max_followers, vocab_size)
    ids = np.argsort(-counts, axis=1, kind="stable")[:, :m]
    top = np.take_along_axis(counts, ids, axis=1)
    params = {
        "ids": jnp.asarray(ids, jnp.int32),
        "counts": jnp.asarray(top, jnp.float32),
        "totals": jnp.asarray(top.sum(1), jnp.float32),
        "smoothing": jnp.full((vocab_size,), k, jnp.float32),
    }
    return NGramDrafter(order=order, vocab=vocab_size, max_gamma=max_gamma), params

  def init(self, params, inputs, seq, length, cache_len):
    return _NoState()

  def propose(self, params, state, seq, length, gamma, row_keys, sampling):
    batch = seq.shape[0]
    prev = take_rows(seq, (length - 1)[:, None])[:, 0]
    tokens = jnp.zeros((batch, self.max_gamma), jnp.int32)
    all_probs = jnp.zeros((batch, self.max_gamma, self.vocab), jnp.float32)

    def body(i, carry):
      tokens, all_probs, prev = carry
      context = prev if self.order == 2 else jnp.zeros_like(prev)
      probs = sampling.probs(jnp.log(_table_probs(params, context)))
      guess = _sample_guess(row_keys, length, i, probs, sampling.greedy)
      tokens = jax.lax.dynamic_update_slice_in_dim(tokens, guess[:, None], i, axis=1)
      all_probs = jax.lax.dynamic_update_slice_in_dim(all_probs, probs[:, None], i, axis=1)
      return tokens, all_probs, guess

    tokens, all_probs, _ = jax.lax.fori_loop(0, jnp.max(gamma), body, (tokens, all_probs, prev))
    return tokens, all_probs, jnp.zeros((batch,), jnp.int32), state

  def update(self, state, num_accepted, gamma):
    return state


def UnigramDrafter(token_lists, vocab_size, *, max_gamma, k=0.01):  # pylint: disable=invalid-name
  """A unigram `NGramDrafter` from a token corpus -> (drafter, params)."""
  return NGramDrafter.from_corpus(token_lists, vocab_size, order=1, max_gamma=max_gamma, k=k)


def BigramDrafter(token_lists, vocab_size, *, max_gamma, k=0.01, max_followers=64):  # pylint: disable=invalid-name
  """A bigram `NGramDrafter` from a token corpus -> (drafter, params)."""
  return NGramDrafter.from_corpus(token_lists, vocab_size, order=2, max_gamma=max_gamma, k=k,
                                  max_followers=max_followers)


# --------------------------------------------------------------------- prompt lookup


@dataclasses.dataclass(frozen=True)
class PromptLookupDrafter:
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

  @property
  def vocab_size(self) -> int:
    return self.vocab

  def init(self, params, inputs, seq, length, cache_len):
    return _NoState()

  def propose(self, params, state, seq, length, gamma, row_keys, sampling):
    batch, total = seq.shape
    ends = jnp.arange(total)[None, :]  # candidate match end e, continuation at e+1
    run = jnp.zeros((batch, total), jnp.int32)
    alive = jnp.ones((batch, total), jnp.bool_)
    for j in range(self.max_ngram):
      here = take_rows(seq, ends - j)
      suffix = take_rows(seq, (length - 1 - j)[:, None])
      alive &= (here == suffix) & (ends - j >= 0) & (length[:, None] - 1 - j >= 0)
      run += alive.astype(jnp.int32)
    run = jnp.where(ends <= length[:, None] - 2, run, 0)
    # The longest match, most recent first: score = run * T + e.
    best = jnp.argmax(run * total + ends, axis=1)
    found = jnp.max(run, axis=1) > 0
    period = jnp.maximum(length - 1 - best, 1)
    offsets = jnp.arange(self.max_gamma)[None, :]
    index = jnp.where(found[:, None], best[:, None] + 1 + offsets % period[:, None],
                      (length - 1)[:, None])
    tokens = take_rows(seq, index)
    probs = jax.nn.one_hot(tokens, self.vocab, dtype=jnp.float32)
    return tokens, probs, jnp.zeros((batch,), jnp.int32), state

  def update(self, state, num_accepted, gamma):
    return state
