"""Block verification (Sun, Mendlovic, Leviathan et al., ICLR 2025, Algorithm 2), for ONE row.

Algorithm 1 accepts guess i with probability min(1, p_i(x_i) / q_i(x_i)) on its
own. Block verification decides on the drafted block jointly: a guess that the
target likes more than the draft did leaves credit that later guesses may use.
With the same draft, the same target call and the same inputs as Algorithm 1,
its output is distributed exactly as the target's, and its expected number of
accepted guesses is never smaller (the paper proves it optimal among all exact
verifiers that see only these inputs).

Notation for one row: guesses x_1..x_L (L = num_guesses ≤ γ); P_i = target_probs[i-1]
and Q_i = draft_probs[i-1] are the target's and the draft's (standardized) laws of
token i after x_1..x_{i-1}; η_1..η_L are the uniforms. Then

    w_0 = 1,   w_i = min(1, w_{i-1} · P_i(x_i) / Q_i(x_i))              i = 1..L
    r_i = Σ_v max(0, w_i P_{i+1}(v) − Q_{i+1}(v))                         i = 0..L-1
    h_i = r_i / (r_i + 1 − w_i)   (i < L),        h_L = w_L
    τ   = max{i ∈ 1..L : η_i < h_i}   (0 when there is none)
    y   ~ P_{L+1}                                     if τ = L
        ~ max(0, w_τ P_{τ+1} − Q_{τ+1}) / r_τ          otherwise

and the row emits x_1..x_τ, y. (The paper scans i = L, L−1, .. and stops at the first
η_i ≤ h_i: the same τ.)

Why it is exact. Backward induction on i shows P(τ ≥ i | x_1..x_i) = w_i: for i = L
it is h_L; and given x_1..x_i, τ ≤ i has probability 1 − E[w_{i+1}] = 1 − w_i + r_i
(because Σ_v min(w_i P_{i+1}(v), Q_{i+1}(v)) = w_i − r_i), and η_i is independent of
it, so P(τ = i | x_1..x_i) = h_i (1 − w_i + r_i) = r_i and P(τ ≥ i) = (w_i − r_i) + r_i.
Write a(s) = Q(s) w_i(s) for the probability that the accepted run covers the prefix
s = s_1..s_i, and c(s) for the probability that the run stopped before i and the
emitted tokens followed by the target's own continuation start with s. If
a(s) + c(s) = P(s) (true at i = 0), then for s·v:
a(s·v) = Q(s) min(w_i P_{i+1}(v), Q_{i+1}(v)),
c(s·v) = c(s) P_{i+1}(v) + Q(s) max(0, w_i P_{i+1}(v) − Q_{i+1}(v)),
whose sum is (Q(s) w_i + c(s)) P_{i+1}(v) = P(s·v); at τ = L, y ~ P_{L+1} continues it.

Never worse. Algorithm 1 accepts at least i guesses with probability
Π_{j≤i} min(1, P_j(x_j)/Q_j(x_j)) ≤ w_i, so E[τ] = Σ_i E[w_i] ≥ E[n] for every draft.
`specjax.analysis.expected_accepted_block` / `expected_accepted_token` compute both.

Randomness. η_i is the accept uniform of guess i and correction key τ draws y, as for
Algorithm 1; with num_guesses = 1 this is Algorithm 1 and draws the reference's tokens
bit for bit. Unlike Algorithm 1, τ depends on guesses and uniforms PAST the accepted
prefix, and the next round draws at those positions again: with keys tied only to
(row, position, stream) that reuse biases the output (TV ≈ 0.027 on the 3-token joint
of the table models in tests/verify/test_block.py). Hence `fresh_round_keys`: the decode
loop folds each round's start position into the row keys for this verifier. A row's
output still does not depend on its batch; unlike the token verifiers', it depends on
where its rounds start. Lenience is not defined for block verification: only l = 1.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Tuple

import jax
import jax.numpy as jnp

from specjax.sampling import categorical
from specjax.verify.step import check_step_args


def check_block_lenience(lenience) -> None:
  """Raises ValueError unless lenience is 1 (block verification has no lenient variant)."""
  if isinstance(lenience, jax.core.Tracer):
    raise ValueError("the block verifier needs lenience = 1 as a concrete number, got a traced "
                     "value; lenient decoding (paper A.5) is defined for Algorithm 1 only: use "
                     "the 'reference' or 'fused' verifier")
  if lenience is None or float(lenience) != 1.0:
    raise ValueError(f"the block verifier supports lenience = 1 only, got lenience={lenience}; "
                     "lenient decoding (paper A.5) is defined for Algorithm 1 only: use the "
                     "'reference' or 'fused' verifier")


def block_weights(draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array
                  ) -> Tuple[jax.Array, jax.Array]:
  """w_i and the rows of max(0, w_i P_{i+1} − Q_{i+1}), for ONE row.

  Args:
    draft_tokens: int32 [γ].
    draft_probs: float32 [γ, V], the Q_i.
    target_probs: float32 [γ+1, V], the P_i.
  Returns:
    (w float32 [γ+1] with w[0] = 1, residual float32 [γ, V] whose row i is
    max(0, w_i P_{i+1} − Q_{i+1})). Never NaN: a guess with Q_i(x_i) = 0 gets w_i = 1.
  """
  gamma = draft_tokens.shape[0]
  p_x = jnp.take_along_axis(target_probs[:gamma], draft_tokens[:, None], axis=-1)[:, 0]
  q_x = jnp.take_along_axis(draft_probs, draft_tokens[:, None], axis=-1)[:, 0]
  w = [jnp.float32(1.0)]
  for i in range(gamma):  # γ is static and small: unrolled
    num = w[-1] * p_x[i]
    w.append(jnp.where(num >= q_x[i], 1.0, num / jnp.maximum(q_x[i], 1e-30)))
  w = jnp.stack(w).astype(jnp.float32)  # [γ+1]
  residual = jnp.maximum(w[:gamma, None] * target_probs[:gamma] - draft_probs, 0.0)  # [γ, V]
  return w, residual


def block_verify(uniforms: jax.Array, correction_keys: jax.Array, draft_tokens: jax.Array,
                 draft_probs: jax.Array, target_probs: jax.Array, *, num_guesses=None
                 ) -> Tuple[jax.Array, jax.Array]:
  """Block verification of ONE row with caller-supplied randomness (see the module doc).

  Args:
    uniforms: float32 [γ], η_i ~ U[0, 1) for guess i.
    correction_keys: PRNG keys [γ+1]; key τ draws the token after τ accepted guesses.
    draft_tokens: int32 [γ], the guesses.
    draft_probs: float32 [γ, V], the draft's standardized Q_i.
    target_probs: float32 [γ+1, V], the target's standardized P_i.
    num_guesses: optional int32 [] in [1, γ]: only the first L = num_guesses guesses
      form the block (the rest are ignored).
  Returns:
    (num_accepted τ int32 [], next_token int32 []).
  """
  gamma = draft_tokens.shape[0]
  limit = jnp.int32(gamma) if num_guesses is None else jnp.asarray(num_guesses, jnp.int32)
  w, residual = block_weights(draft_tokens, draft_probs, target_probs)
  mass = residual.sum(-1)  # r_i, i = 0..γ-1
  i = jnp.arange(1, gamma + 1)  # [γ]
  # η_i < h_i without dividing: η_i (r_i + 1 − w_i) < r_i for i < L. At i = L,
  # η_L < w_L = min(1, w_{L-1} P_L(x_L)/Q_L(x_L)) is η_L Q_L(x_L) < w_{L-1} P_L(x_L)
  # (η < 1), Algorithm 1's test when L = 1.
  p_x = jnp.take_along_axis(target_probs[:gamma], draft_tokens[:, None], axis=-1)[:, 0]
  q_x = jnp.take_along_axis(draft_probs, draft_tokens[:, None], axis=-1)[:, 0]
  r_i = jnp.concatenate([mass[1:], jnp.zeros((1,), jnp.float32)])  # r_i for i = 1..γ
  inner = uniforms * (r_i + 1.0 - w[1:]) < r_i
  last = uniforms * q_x < w[:gamma] * p_x
  stop = jnp.where(i < limit, inner, last) & (i <= limit)  # bool [γ]
  tau = jnp.max(jnp.where(stop, i, 0)).astype(jnp.int32)
  # The correction: P_{L+1} after the whole block, else the residual of row τ.
  weights = jnp.where(tau < limit, residual[jnp.minimum(tau, gamma - 1)], target_probs[tau])
  # If rounding left no residual mass, fall back to P_{τ+1} itself (as Algorithm 1 does).
  weights = jnp.where(jnp.any(weights > 0), weights, target_probs[tau])
  return tau, categorical(correction_keys[tau], weights)


@dataclasses.dataclass(frozen=True)
class BlockVerifier:
  """Block verification (Sun et al., ICLR 2025, Algorithm 2). Exact; lenience = 1 only.

  Same inputs as `ReferenceVerifier` (the uniforms are the η_i, the correction keys
  are indexed by the accepted count); accepts at least as many guesses in expectation.
  Needs randomness no later round reuses (`fresh_round_keys`, see the module doc). At temperature 0 the decode loop uses exact argmax
  matching for every exact verifier, this one included.
  """

  exact: ClassVar[bool] = True
  name: ClassVar[str] = "block"
  fresh_round_keys: ClassVar[bool] = True
  lenient: ClassVar[bool] = False
  """τ depends on the guesses and uniforms past it, so no later round may reuse them."""

  def __call__(self, uniforms, correction_keys, draft_tokens, draft_probs, target_probs,
               target_logits=None, draft_logits=None, *, lenience=1.0, num_guesses=None):
    """See `specjax.verifiers.Verifier.__call__`; the logits are ignored."""
    if draft_tokens.ndim != 1:
      raise ValueError(f"draft_tokens must have shape [gamma] for ONE row (vmap the verifier "
                       f"over the batch), got {draft_tokens.shape}")
    check_step_args(draft_tokens.shape[0], draft_tokens.shape, draft_probs.shape,
                    target_probs.shape, lenience)
    check_block_lenience(lenience)
    return block_verify(uniforms, correction_keys, draft_tokens, draft_probs, target_probs,
                        num_guesses=num_guesses)
