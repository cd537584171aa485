"""Drafters: who guesses the γ tokens that the target verifies.

One protocol, several drafters. A drafter is stateless Python configuration
(hashable, passed to `jax.jit` as static) plus a `params` pytree of arrays and a
per-generation `state` pytree, so the decode loop stays a pure function:

  state = drafter.init(params, inputs, seq, length, cache_len)
  proposal, state = drafter.propose(params, state, seq, length, gamma, row_keys, sampling)
  state = drafter.update(state, num_accepted, gamma)

`proposal.probs` are the standardized q (same `Sampling` as the target), which the
tokens were drawn from, so verification stays exact whatever the drafter.
Randomness: the guess at absolute position j of a row uses
`fold_in(fold_in(row_key, j), DRAFT_STREAM)`.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Tuple

import flax
import jax
import jax.numpy as jnp

from specjax.checks import check_int
from specjax.sampling import DRAFT_STREAM, Sampling, argmax, categorical, position_key


@flax.struct.dataclass
class Proposal:
  """What a drafter hands the target for one round."""

  tokens: jax.Array  # int32 [B, G]: the guesses x_1..x_G (beyond a row's γ: ignored)
  probs: jax.Array  # float32 [B, G, V]: the standardized q each guess was drawn from
  calls: jax.Array  # int32 [B]: draft model calls spent (0 for table drafters)


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
              ) -> Tuple["Proposal", Any]:
    """gamma: int32 [B] (each row's γ) -> (Proposal, state); guesses beyond a row's γ
    are ignored by the verifier."""

  def update(self, state: Any, num_accepted: jax.Array, gamma: jax.Array) -> Any:
    """Called after verification with num_accepted int32 [B] (0..γ) and gamma int32 [B]."""


def check_sizes(drafter: Any, **minimums: int) -> None:
  """ValueError unless each named field of `drafter` is an integer >= its minimum (bools
  refused), e.g. `check_sizes(self, max_gamma=1)`."""
  for field, low in minimums.items():
    check_int(f"{type(drafter).__name__}.{field}", getattr(drafter, field), low=low)


def sample_guess(row_keys, length, i, probs, greedy: bool):
  """Draws guess i (absolute position length + i) from probs [B, V] per row."""
  if greedy:  # probs are one-hot: no randomness needed
    return argmax(probs)
  keys = jax.vmap(position_key, in_axes=(0, 0, None))(row_keys, length + i, DRAFT_STREAM)
  return jax.vmap(categorical)(keys, probs)


def draft_step(row_keys, length, i, logits, sampling: Sampling):
  """Guess i and its standardized q from a draft's logits [B, V] -> (int32 [B], float32 [B, V]).

  Greedy: the guess is the argmax of the logits and q its one-hot, which is
  `sampling.probs` (argmax, ties to the lowest id) with one pass over the
  vocabulary instead of two (an argmax to build q, another to read it back).
  """
  if sampling.greedy:
    guess = argmax(logits)
    return guess, jax.nn.one_hot(guess, logits.shape[-1], dtype=jnp.float32)
  probs = sampling.probs(logits)
  return sample_guess(row_keys, length, i, probs, False), probs


