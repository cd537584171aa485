"""Algorithm 1's accept/reject step for ONE row (paper §2.3), and lenience (A.5).

All functions here act on a single row; `jax.vmap` them over a batch. They are
pure, jit-compatible, never divide and never produce NaN: acceptance is tested
as ``r * l * q(x) < p(x)`` (equal in law to ``r <= p(x) / (l q(x))`` for
continuous r), and the residual is sampled with the exponential race of
`specjax.sampling.categorical`, which needs no normalizing sum.
"""
from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from specjax.sampling import argmax, categorical


def check_step_args(gamma: int, draft_tokens_shape, draft_probs_shape,
                    target_probs_shape, lenience: Optional[float] = None) -> None:
  """Raises ValueError for shapes that disagree, gamma < 1 or a bad lenience.

  Shapes are those of ONE row: draft_tokens [γ], draft_probs [γ, V], target_probs [γ+1, V].
  """
  if gamma < 1:
    raise ValueError(f"gamma must be >= 1 (number of drafted tokens), got {gamma}")
  if len(draft_probs_shape) != 2 or draft_probs_shape[0] != gamma:
    raise ValueError(f"draft_probs must have shape [gamma={gamma}, V], got {tuple(draft_probs_shape)}")
  vocab = draft_probs_shape[1]
  if tuple(target_probs_shape) != (gamma + 1, vocab):
    raise ValueError(f"target_probs must have shape [gamma+1={gamma + 1}, V={vocab}], "
                     f"got {tuple(target_probs_shape)}")
  if tuple(draft_tokens_shape) != (gamma,):
    raise ValueError(f"draft_tokens must have shape [gamma={gamma}], got {tuple(draft_tokens_shape)}")
  check_lenience(lenience)


def check_lenience(lenience) -> None:
  """Raises ValueError unless lenience is in (0, 1] (tracers pass unchecked)."""
  if lenience is None or isinstance(lenience, jax.core.Tracer):
    return
  try:  # a number, a numpy scalar or a concrete 0-d array; not a bool or a string
    value = None if isinstance(lenience, (bool, str, bytes)) else float(lenience)
  except (TypeError, ValueError):
    value = None
  if value is None or not 0 < value <= 1:
    raise ValueError(f"lenience must be a number in (0, 1], got {lenience!r}")


def count_accepted(accepted: jax.Array, num_guesses=None) -> Tuple[jax.Array, jax.Array]:
  """The length of the accepted prefix: accepted bool [γ] -> (n int32 [], limit int32 []).

  Only the first `num_guesses` (default γ) guesses count; n is the number of
  leading True entries among them and `limit` that number of guesses.
  """
  gamma = accepted.shape[0]
  limit = jnp.int32(gamma) if num_guesses is None else jnp.asarray(num_guesses, jnp.int32)
  accepted = accepted & (jnp.arange(gamma) < limit)
  return jnp.sum(jnp.cumprod(accepted.astype(jnp.int32))).astype(jnp.int32), limit


def at_guesses(table: jax.Array, draft_tokens: jax.Array) -> jax.Array:
  """table [≥γ, V] -> [γ]: row i's entry at guess x_i (draft_tokens int32 [γ])."""
  gamma = draft_tokens.shape[0]
  return jnp.take_along_axis(table[:gamma], draft_tokens[:, None], axis=-1)[:, 0]


def verify(uniforms: jax.Array, correction_keys: jax.Array, draft_tokens: jax.Array,
           draft_probs: jax.Array, target_probs: jax.Array, *, lenience=1.0,
           num_guesses=None) -> Tuple[jax.Array, jax.Array]:
  """Algorithm 1 for one row with caller-supplied randomness.

  The decode loop calls this with randomness tied to absolute positions, so a
  row's output does not depend on how many guesses earlier rounds accepted.

  Args:
    uniforms: float32 [γ], r_i ~ U[0, 1) for guess i.
    correction_keys: PRNG keys [γ+1]; key n draws the token after n accepted guesses.
    draft_tokens: int32 [γ], the guesses x_1..x_γ.
    draft_probs: float32 [γ, V], q_i (standardized draft distributions).
    target_probs: float32 [γ+1, V], p_1..p_{γ+1} (standardized target distributions).
    lenience: l in (0, 1]; 1 is exact (Algorithm 1).
    num_guesses: optional int32 scalar ≤ γ: only the first num_guesses guesses
      are considered (for a γ that is data, with buffers of a static max_gamma).
  Returns:
    (num_accepted int32 [], next_token int32 []).
  """
  gamma = draft_tokens.shape[0]
  p_x = at_guesses(target_probs, draft_tokens)
  q_x = at_guesses(draft_probs, draft_tokens)
  num_accepted, limit = count_accepted(uniforms * lenience * q_x < p_x, num_guesses)
  p_next = target_probs[num_accepted]  # [V]
  q_next = draft_probs[jnp.minimum(num_accepted, gamma - 1)]  # [V]
  residual = jnp.maximum(p_next - lenience * q_next, 0.0)
  # All guesses accepted: sample p_{γ+1}. Otherwise sample norm(max(0, p - l q)).
  weights = jnp.where(num_accepted < limit, residual, p_next)
  # If rounding left no residual mass (p ≈ l q), fall back to p itself.
  weights = jnp.where(jnp.any(weights > 0), weights, p_next)
  next_token = categorical(correction_keys[num_accepted], weights)
  return num_accepted, next_token


def speculative_step(key: jax.Array, draft_tokens: jax.Array, draft_probs: jax.Array,
                     target_probs: jax.Array, *, lenience=1.0
                     ) -> Tuple[jax.Array, jax.Array]:
  """Algorithm 1's accept/reject step for ONE row. vmap it over a batch.

  Accept x_i while r_i ≤ p_i(x_i) / (l·q_i(x_i)); at the first rejection draw the
  next token from norm(max(0, p_i − l·q_i)); if all γ are accepted draw it from
  p_{γ+1}. With l = 1 the emitted tokens are distributed exactly as the target.

  Args:
    key: PRNG key for this row and round.
    draft_tokens: int32 [γ].
    draft_probs: float32 [γ, V], the draft's standardized q_i.
    target_probs: float32 [γ+1, V], the target's standardized p_i.
    lenience: l in (0, 1].
  Returns:
    (num_accepted int32 [] in [0, γ], next_token int32 []).
  """
  if draft_tokens.ndim != 1:
    raise ValueError(f"draft_tokens must have shape [gamma] for one row (vmap over the batch), "
                     f"got {draft_tokens.shape}")
  check_step_args(draft_tokens.shape[0], draft_tokens.shape, draft_probs.shape,
                  target_probs.shape, lenience)
  gamma = draft_tokens.shape[0]
  accept_key, correction_key = jax.random.split(key)
  uniforms = jax.random.uniform(accept_key, (gamma,), dtype=jnp.float32)
  return verify(uniforms, jax.random.split(correction_key, gamma + 1), draft_tokens,
                draft_probs, target_probs, lenience=lenience)


def argmax_lenient_step(draft_tokens: jax.Array, target_probs: jax.Array, *, lenience=1.0,
                        num_guesses=None) -> Tuple[jax.Array, jax.Array]:
  """Paper A.5's lenience for temperature 0, for ONE row.

  Accept guess x while p(x) ≥ l·max(p), where p is the target's distribution
  before the argmax (temperature 1); the next token is the argmax of p after
  the accepted run. With l = 1 only x == argmax(p) (ties to the lowest id) is
  accepted, so this is exactly greedy decoding.

  Args:
    draft_tokens: int32 [γ].
    target_probs: float32 [γ+1, V], the target's temperature-1 probabilities.
    lenience: l in (0, 1].
    num_guesses: optional int32 scalar ≤ γ (see `verify`).
  Returns:
    (num_accepted int32 [], next_token int32 []).
  """
  check_lenience(lenience)
  gamma = draft_tokens.shape[0]
  head = target_probs[:gamma]
  best = argmax(head)
  p_x = at_guesses(head, draft_tokens)
  lenient = (p_x >= lenience * jnp.max(head, axis=-1)) & (lenience < 1)
  num_accepted, _ = count_accepted((draft_tokens == best) | lenient, num_guesses)
  next_token = argmax(target_probs[num_accepted])
  return num_accepted, next_token
