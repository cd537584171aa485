"""Verification of a batch of rows: the per-row verifier vmapped, with position-tied randomness.

Shared by the speculative loop and by drafters that are themselves speculative
(hierarchical drafting), so the verify-and-emit step exists once.
"""
from __future__ import annotations

from typing import Tuple

import jax
import jax.numpy as jnp

from specjax.sampling import ACCEPT_STREAM, CORRECTION_STREAM, Sampling, argmax, position_key
from specjax.verify.base import Verifier
from specjax.verify.step import argmax_lenient_step, count_accepted


def verify_batch(sampling: Sampling, verifier: Verifier, lenience: float, row_keys: jax.Array,
                 length: jax.Array, guesses: jax.Array, draft_probs: jax.Array,
                 logits: jax.Array, gamma: jax.Array
                 ) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """Verifies every row's guesses against the target's logits.

  Guess i of row b sits at absolute position length[b] + i; its accept uniform and
  the correction drawn after i accepted guesses use keys of that position.

  Args:
    sampling: the standardization of target (and draft) logits.
    verifier: the per-row verifier (`specjax.verify`).
    lenience: l in (0, 1].
    row_keys: one PRNG key per row [B].
    length: int32 [B]: the committed length (position of guess 0).
    guesses: int32 [B, G].
    draft_probs: float32 [B, G, V]: the standardized q of each guess.
    logits: float32 [B, G+1, V]: the target's raw logits at the γ+1 positions.
    gamma: int32 [B]: each row's γ ≤ G (guesses beyond it are ignored).
  Returns:
    (n int32 [B] accepted guesses, next int32 [B] the token after them,
     overlap float32 [B, G]: Σ_x min(p_i, q_i) at each guess position, for the α estimate).

  At temperature 0 with an exact verifier, Algorithm 1 on one-hot p and q is argmax
  matching, so no distribution over the vocabulary is materialized: the argmax of the raw
  logits decides (the autoregressive loop's own rule, ties to the lowest id), and the
  overlap is q_i at p_i's argmax (p_i is one-hot there).
  """
  max_gamma = guesses.shape[1]
  if sampling.greedy and verifier.exact and lenience == 1.0:
    # One argmax over the vocabulary per position decides everything: accept while the
    # guess is it, then emit the argmax after the accepted run (`argmax_lenient_step`
    # with l = 1, which takes three passes over [γ+1, V]).
    best = argmax(logits)  # [B, G+1]
    n = jax.vmap(lambda ok, g: count_accepted(ok, g)[0])(guesses == best[:, :max_gamma], gamma)
    token = jnp.take_along_axis(best, n[:, None], axis=1)[:, 0]
    overlap = jnp.take_along_axis(draft_probs, best[:, :max_gamma, None], axis=-1)[..., 0]
    return n, token, overlap
  if sampling.greedy and verifier.exact:
    # A.5's argmax lenience needs probabilities.
    n, token = jax.vmap(lambda x, s, g: argmax_lenient_step(x, s, lenience=lenience,
                                                            num_guesses=g))(
                                                                guesses,
                                                                jax.nn.softmax(logits, -1),
                                                                gamma)
    best = argmax(logits[:, :max_gamma])  # [B, G]
    overlap = jnp.take_along_axis(draft_probs, best[..., None], axis=-1)[..., 0]
    return n, token, overlap
  target_probs = sampling.probs(logits)  # [B, G+1, V]

  def one(key, start, x, q, p, raw, gamma):
    offsets = jnp.arange(max_gamma + 1)
    keys = jax.vmap(position_key, in_axes=(None, 0, None))(key, start + offsets, ACCEPT_STREAM)
    uniforms = jax.vmap(lambda k: jax.random.uniform(k, dtype=jnp.float32))(keys[:max_gamma])
    correction = jax.vmap(position_key, in_axes=(None, 0, None))(key, start + offsets,
                                                                 CORRECTION_STREAM)
    return verifier(uniforms, correction, x, q, p, raw, None, lenience=lenience,
                    num_guesses=gamma)

  n, token = jax.vmap(one)(row_keys, length, guesses, draft_probs, target_probs, logits, gamma)
  overlap = jnp.minimum(target_probs[:, :max_gamma], draft_probs).sum(-1)  # [B, G]
  return n, token, overlap


def emitted_tokens(guesses: jax.Array, n: jax.Array, token: jax.Array) -> jax.Array:
  """The tokens a round emits: guesses[:, :n] then `token`.

  guesses int32 [B, G]; n int32 [B]; token int32 [B] -> int32 [B, G+1] (entries past n are
  filled with `token`; the caller takes the first n + 1).
  """
  slots = jnp.arange(guesses.shape[1] + 1)[None, :]
  padded = jnp.concatenate([guesses, jnp.zeros_like(guesses[:, :1])], axis=1)
  return jnp.where(slots < n[:, None], padded, token[:, None])
