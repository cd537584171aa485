"""Standardized sampling (paper §2.2): temperature, top-k, top-p, argmax.

The same `Sampling` is applied to the target's and the draft's logits, so that
speculative sampling reproduces exactly the *standardized* target distribution.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax.checks import check_int, check_real, is_real


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How logits become a distribution. Hashable: pass it as a static argument.

  Order of operations: temperature, then top-k, then top-p (nucleus).
  """

  temperature: float = 1.0
  """Divides the logits; 0 means argmax (greedy, ties to the lowest id)."""
  top_k: int = 0
  """Keep only the k most likely tokens (ties to the lowest ids); 0 turns it off."""
  top_p: float = 1.0
  """Keep the smallest set of most likely tokens whose mass reaches top_p; 1.0 turns it off."""

  def __post_init__(self):
    check_real("temperature", self.temperature, low=0.0)
    if 0 < self.temperature < np.finfo(np.float32).tiny:  # 0 on the device: 0 / 0 = NaN
      raise ValueError(f"temperature {self.temperature!r} is below float32's smallest normal "
                       f"number {np.finfo(np.float32).tiny:.3g}; use 0 for greedy decoding")
    check_int("top_k", self.top_k, low=0)
    if not is_real(self.top_p) or not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

  @property
  def greedy(self) -> bool:
    """True for temperature 0 (the distribution is one-hot at the argmax)."""
    return self.temperature == 0

  def probs(self, logits: jax.Array) -> jax.Array:
    """The standardized distribution.

    Args:
      logits: float [..., V].
    Returns:
      float32 [..., V], non-negative, summing to 1 along the last axis.
    """
    logits = jnp.asarray(logits, jnp.float32)
    vocab = logits.shape[-1]
    if self.greedy:
      return jax.nn.one_hot(argmax(logits), vocab, dtype=jnp.float32)
    # The row's maximum first: a tiny temperature then sends the other logits to -inf
    # (a one-hot at the argmax) instead of overflowing them all to inf (NaN after softmax).
    logits = (logits - jnp.max(logits, axis=-1, keepdims=True)) / self.temperature
    if self.top_k and self.top_k < vocab:
      # Keep exactly k tokens: lax.top_k breaks ties towards lower indices.
      _, keep = jax.lax.top_k(logits, self.top_k)  # int32 [..., k]
      mask = jnp.any(jax.nn.one_hot(keep, vocab, dtype=jnp.bool_), axis=-2)
      logits = jnp.where(mask, logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1)
    if self.top_p < 1.0:
      probs = _nucleus(probs, self.top_p)
    return probs

  def sample(self, key: jax.Array, logits: jax.Array) -> jax.Array:
    """Draws a token from `probs(logits)`.

    Args:
      key: a PRNG key (one draw per leading index, shared key).
      logits: float [..., V].
    Returns:
      int32 [...].
    """
    if self.greedy:
      return argmax(logits)
    return categorical(key, self.probs(logits))


def argmax(x: jax.Array) -> jax.Array:
  """The index of the largest entry along the last axis, as int32, the same on every backend.
  x: float [..., V] -> int32 [...].

  Its meaning, stated once: the FIRST (lowest) index holding the maximum; if the row holds
  any NaN, the first NaN (NaN outranks everything, +inf included); +inf and -inf are ordinary
  values (a row of all -inf gives 0); -0.0 equals +0.0. This is numpy's `np.argmax` and what
  `jnp.argmax` does on XLA:CPU; a GPU's fused (value, index) reduction has returned a later
  NaN than the first, so `jnp.argmax` is not used.

  Computed as three plain reductions whose results no reduction order can change (a float
  max, a boolean any and an integer min are exact): whether the row has a NaN, its maximum,
  then the smallest index holding the NaN or the maximum. XLA:CPU vectorizes them, where its
  single (value, index) reduction of `jnp.argmax` took 4-7x longer over a vocabulary (8192
  entries: 37 vs 5.5 µs per row at batch 1; [8, 5, 8192]: 824 vs 228 µs), a visible share of
  a decode step taken once per drafted, verified and sampled token.
  """
  nan = jnp.isnan(x)
  has_nan = jnp.any(nan, axis=-1, keepdims=True)  # bool [..., 1]
  top = jnp.max(x, axis=-1, keepdims=True)  # float [..., 1]; its NaN handling is not relied on
  hit = jnp.where(has_nan, nan, x == top)  # bool [..., V]
  index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  return jnp.min(jnp.where(hit, index, x.shape[-1]), axis=-1)


def _nucleus(probs: jax.Array, top_p: float) -> jax.Array:
  """Zeroes the tail outside the top_p nucleus and renormalizes. probs: [..., V]."""
  order = jnp.argsort(-probs, axis=-1, stable=True)  # most likely first, ties to low ids
  sorted_probs = jnp.take_along_axis(probs, order, axis=-1)
  mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
  keep_sorted = mass_before < top_p  # always keeps the most likely token
  keep = jnp.zeros_like(keep_sorted)
  keep = jnp.put_along_axis(keep, order, keep_sorted, axis=-1, inplace=False)
  kept = jnp.where(keep, probs, 0.0)
  return kept / jnp.sum(kept, axis=-1, keepdims=True)


CATEGORICAL_BLOCK = 128
"""Tokens per block of `categorical`'s two-stage draw (a power of two)."""


def categorical(key: jax.Array, probs: jax.Array) -> jax.Array:
  """Samples from unnormalized non-negative weights with no normalizing sum.

  Two exponential races (argmax_i log w_i − log E_i with E_i ~ Exp(1) is distributed as
  w / sum(w)): first over the masses of blocks of `CATEGORICAL_BLOCK` consecutive ids, then
  within the winning block. P(block j) · P(i | j) = (W_j / W) (w_i / W_j) = w_i / W, so the
  draw is exact, and it needs V / 128 + 128 Exp(1) variates (one Threefry call) instead of
  V: over 8192 ids 5.5 against 53 µs at batch 1 and 35 against 215 µs at batch 8 on the
  2-core CPU; a batch-1 T = 1 decode of the bundled LM pair is 8-11% faster autoregressive
  and 3.5-11.5% speculative (`experiments.bench.sampler`).
  A tiled pass that sums the same blocks with `block_masses` (`specjax.verify.fused_kernel`)
  gets the same masses, bit for bit on XLA:CPU (tested).
  Zero weights are never drawn (when all are zero it returns 0).

  Args:
    key: PRNG key (one draw per leading index, shared key).
    probs: float [..., V] non-negative weights.
  Returns:
    int32 [...].
  """
  probs = jnp.asarray(probs, jnp.float32)
  if probs.shape[-1] <= CATEGORICAL_BLOCK:
    return race(key, probs)
  blocks = to_blocks(probs)  # [..., nb, S]
  return draw_by_blocks(
      key, block_masses(blocks),
      lambda block: jnp.take_along_axis(blocks, block[..., None, None], axis=-2)[..., 0, :])


def draw_by_blocks(key: jax.Array, masses: jax.Array,
                   block_weights: Callable[[jax.Array], jax.Array]) -> jax.Array:
  """`categorical`'s two races, given its block masses (V > `CATEGORICAL_BLOCK`).

  Args:
    key: the draw's PRNG key.
    masses: float32 [..., nb], `block_masses(to_blocks(w))`.
    block_weights: block int32 [...] -> float32 [..., S], that block's weights (zero past V).
  Returns:
    int32 [...], the id drawn.
  """
  num_blocks = masses.shape[-1]
  # One draw of Exp(1) variates for both races (independent entries; one Threefry pass).
  exp = jax.random.exponential(key, masses.shape[:-1] + (num_blocks + CATEGORICAL_BLOCK,),
                               dtype=jnp.float32)
  block = _race(masses, exp[..., :num_blocks])
  return block * CATEGORICAL_BLOCK + _race(block_weights(block), exp[..., num_blocks:])


def race(key: jax.Array, weights: jax.Array) -> jax.Array:
  """The exponential race over the last axis: argmax_i log w_i − log E_i, E_i ~ Exp(1)
  drawn from `key`; zero weights never win (all zero: 0). weights [..., n] -> int32 [...]."""
  return _race(weights, jax.random.exponential(key, weights.shape, dtype=jnp.float32))


def _race(weights: jax.Array, exp: jax.Array) -> jax.Array:
  score = jnp.where(weights > 0, jnp.log(jnp.maximum(weights, 1e-38)) - jnp.log(exp), -jnp.inf)
  return argmax(score)


def to_blocks(weights: jax.Array) -> jax.Array:
  """[..., V] -> [..., ceil(V / S), S] with S = `CATEGORICAL_BLOCK`, zero-padded."""
  vocab = weights.shape[-1]
  num_blocks = -(-vocab // CATEGORICAL_BLOCK)
  pad = num_blocks * CATEGORICAL_BLOCK - vocab
  if pad:
    weights = jnp.pad(weights, [(0, 0)] * (weights.ndim - 1) + [(0, pad)])
  return weights.reshape(weights.shape[:-1] + (num_blocks, CATEGORICAL_BLOCK))


def block_masses(blocks: jax.Array) -> jax.Array:
  """[..., S] -> [...]: each block's sum (float32). One function for `categorical` and the
  fused verifier's tiles, so both sum a block the same way."""
  return jnp.sum(blocks, axis=-1)


# ------------------------------------------------------------ randomness discipline
# Every random draw of a generation is tied to (row key, absolute position, stream),
# so a row's tokens do not depend on its batch, its slot or earlier acceptance counts.

DRAFT_STREAM = 0
"""Stream of the drafter's guess at a position."""
ACCEPT_STREAM = 1
"""Stream of the accept/reject uniform of the guess at a position."""
CORRECTION_STREAM = 2
"""Stream of the token the target draws at a position (correction or plain step)."""


def position_key(row_key: jax.Array, position: jax.Array, stream: int) -> jax.Array:
  """The key of one (row, absolute position, stream); row_key is one row's key."""
  return jax.random.fold_in(jax.random.fold_in(row_key, position), stream)


def row_keys(rng: jax.Array, batch: int) -> jax.Array:
  """One key per row: a single key is folded with the row index; [B] keys pass through.

  Args:
    rng: one PRNG key (raw uint32 [2] or typed []), or one key per row ([B, 2] or typed [B]).
    batch: B.
  Returns:
    The per-row keys, [B, 2] (raw) or [B] (typed).
  """
  typed = hasattr(rng, "dtype") and jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
  if np.ndim(rng) == 0 and not typed:
    raise ValueError(f"rng must be a PRNG key, got {rng!r}: pass jax.random.PRNGKey(seed) "
                     "(or one key per row)")
  rng = jnp.asarray(rng)
  typed = jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
  if not typed and (rng.dtype != jnp.uint32 or rng.shape[-1:] != (2,)):
    raise ValueError(f"rng must be a PRNG key (uint32 [2], or [B, 2] for one key per row), got "
                     f"{rng.dtype} {tuple(rng.shape)}: pass jax.random.PRNGKey(seed)")
  if rng.ndim == (0 if typed else 1):
    return _fold_rows(rng, batch)
  if rng.ndim != (1 if typed else 2):
    raise ValueError(f"rng must be one PRNG key or one key per row, got shape {rng.shape}: "
                     "pass jax.random.PRNGKey(seed)")
  if rng.shape[0] != batch:
    raise ValueError(f"rng has {rng.shape[0]} row keys but the batch has {batch} rows")
  return rng


@functools.partial(jax.jit, static_argnums=1)
def _fold_rows(rng: jax.Array, batch: int) -> jax.Array:
  return jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(batch))
