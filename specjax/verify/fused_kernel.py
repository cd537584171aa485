"""Speculative sampling's correction draw in ONE pass over the vocabulary.

After the accept test (which needs only the 2γ scalars p_i(x_i), q_i(x_i)),
Algorithm 1 draws the next token from max(0, p_n − s·q_n) (s = l after a
rejection; s = 0, i.e. from p_n, when every guess was accepted), falling back
to p_n when rounding left no residual mass. `specjax.sampling.categorical`
draws it with the exponential race argmax_i log w_i − log E_i, E ~ Exp(1).

Here that draw reads p_n and q_n once, tile by tile: each tile computes the
residual, generates its own E_i from the correction key (Threefry-2x32 on the
token ids, bit-identical to ``jax.random.exponential(key, (V,))``), and keeps
the best race score of the residual and of p_n (the fallback); one small
reduction across tiles picks the token. The token therefore equals the
reference step's for the same key, bit for bit (Wagner et al.'s tiled
verification, exact).

Two backends compute the same function:
- ``xla``: the same math as jnp over the row (CPU default). Threefry is written
  out unrolled, so XLA fuses it with the logs into loop fusions feeding two
  argmax reductions, where `jax.random` on CPU runs a rolled while loop; only
  row n is touched. (One variadic reduce for both races measured ~4x slower on
  XLA:CPU, so the two argmaxes stay separate.)
- ``pallas``: a Pallas kernel with a grid over vocabulary tiles (GPU/TPU;
  ``interpret=True`` runs it on CPU). The last tile may be ragged: ids ≥ V are masked.
  Written for the Triton (GPU) and Mosaic (TPU) lowerings but, so far, run only in
  interpret mode: no accelerator was available where it was developed.

Only row n is read, unlike Wagner et al.'s kernel, which scores all γ+1 rows:
there the probabilities are computed in the same kernel, whereas here p and q
already exist, the accept test needs only 2γ gathered scalars, and scoring every
row would cost (γ+1)× the reads and Exp(1) draws for one used row.
"""
from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

_KS_PARITY = np.uint32(0x1BD11BDA)  # Threefry's key-schedule constant
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_LANES = 128  # width of the per-tile result rows (one vector register row on TPU)
_TINY = 1e-38  # as in `specjax.sampling.categorical`


def _rotl(x: jax.Array, r: int) -> jax.Array:
  return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(k1: jax.Array, k2: jax.Array, x1: jax.Array, x2: jax.Array
                 ) -> Tuple[jax.Array, jax.Array]:
  """Threefry-2x32 with 20 rounds (Salmon et al. 2011), as JAX's PRNG defines it.

  Plain uint32 arithmetic, so it lowers inside Pallas kernels and fuses in XLA.

  Args:
    k1, k2: uint32 [] key words.
    x1, x2: uint32 [...] counter words.
  Returns:
    Two uint32 [...] arrays.
  """
  ks = (k1, k2, k1 ^ k2 ^ _KS_PARITY)
  x1 = x1 + ks[0]
  x2 = x2 + ks[1]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x1 = x1 + x2
      x2 = x1 ^ _rotl(x2, r)
    x1 = x1 + ks[(i + 1) % 3]
    x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
  return x1, x2


def exponential_at(k1: jax.Array, k2: jax.Array, ids: jax.Array) -> jax.Array:
  """E_i ~ Exp(1) equal bit for bit to ``jax.random.exponential(key, (V,))[ids]``.

  Valid for threefry2x32 keys with ``jax_threefry_partitionable`` on (the
  default), where element i's bits depend only on the key and i.

  Args:
    k1, k2: uint32 [] the key's two words (`key_words`).
    ids: int32 [...] flat indices into the length-V draw (0 ≤ id < 2**31).
  Returns:
    float32 [...].
  """
  counters = ids.astype(jnp.uint32)
  b1, b2 = threefry2x32(k1, k2, jnp.zeros_like(counters), counters)
  mantissa = ((b1 ^ b2) >> np.uint32(9)) | np.uint32(0x3F800000)  # a float in [1, 2)
  uniform = jax.lax.bitcast_convert_type(mantissa, jnp.float32) - np.float32(1.0)
  return -jnp.log1p(-uniform)


def key_words(key: jax.Array) -> Optional[Tuple[jax.Array, jax.Array]]:
  """(k1, k2) uint32 [] of ONE threefry key, or None for keys `exponential_at` can't mirror.

  Args:
    key: a typed key [] or a raw uint32 key [2].
  """
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    if str(jax.random.key_impl(key)) != "threefry2x32":
      return None
    key = jax.random.key_data(key)
  elif key.dtype != jnp.uint32 or key.shape != (2,) or (
      jax.config.jax_default_prng_impl != "threefry2x32"):
    return None
  if not jax.config.jax_threefry_partitionable:
    return None
  return key[0], key[1]


def _race(p: jax.Array, q: jax.Array, scale: jax.Array, log_e: jax.Array, valid=None):
  """Race scores of the residual max(0, p − s q) and of p (the fallback). float32 [...] each."""
  resid = jnp.maximum(p - scale * q, 0.0)
  keep_r, keep_p = resid > 0, p > 0
  if valid is not None:
    keep_r, keep_p = keep_r & valid, keep_p & valid
  score_r = jnp.where(keep_r, jnp.log(jnp.maximum(resid, _TINY)) - log_e, -jnp.inf)
  score_p = jnp.where(keep_p, jnp.log(jnp.maximum(p, _TINY)) - log_e, -jnp.inf)
  return score_r, score_p


def _pick(best_r: jax.Array, token_r: jax.Array, token_p: jax.Array) -> jax.Array:
  """The residual's winner, or p's when the residual has no mass."""
  return jnp.where(best_r > -jnp.inf, token_r, token_p).astype(jnp.int32)


def draw_from_rows(p: jax.Array, q: jax.Array, scale: jax.Array, key: jax.Array) -> jax.Array:
  """XLA path on explicit rows: the race over max(0, p − scale·q), else over p.

  Args:
    p: float32 [V] (need not be normalized); q: float32 [V]; scale: float32 [].
    key: the correction key (typed [] or raw uint32 [2]).
  Returns:
    int32 [], equal to ``categorical(key, w)`` for the weights described above.
  """
  vocab = p.shape[-1]
  words = key_words(key)
  if words is None:  # another PRNG: the reference's own draw (still identical)
    e = jax.random.exponential(key, (vocab,), dtype=jnp.float32)
  else:
    e = exponential_at(*words, jnp.arange(vocab, dtype=jnp.int32))
  score_r, score_p = _race(p, q, scale, jnp.log(e))
  token_r, token_p = jnp.argmax(score_r), jnp.argmax(score_p)
  return _pick(score_r[token_r], token_r, token_p)


def _kernel(scalars_ref, p_ref, q_ref, scores_ref, ids_ref, *, tile: int, vocab: int,
            gamma: int):
  """One vocabulary tile. scalars: int32 [4] = (row, k1, k2, bits of the scale s)."""
  j = pl.program_id(0)
  row = scalars_ref[0]
  k1 = jax.lax.bitcast_convert_type(scalars_ref[1], jnp.uint32)
  k2 = jax.lax.bitcast_convert_type(scalars_ref[2], jnp.uint32)
  scale = jax.lax.bitcast_convert_type(scalars_ref[3], jnp.float32)
  p = p_ref[row, :]  # float32 [tile]: only row n is read
  q = q_ref[jnp.minimum(row, gamma - 1), :]
  ids = j * tile + jax.lax.broadcasted_iota(jnp.int32, (tile,), 0)
  valid = ids < vocab  # the ragged last tile
  log_e = jnp.log(exponential_at(k1, k2, ids))
  score_r, score_p = _race(p, q, scale, log_e, valid)
  best = (jnp.max(score_r), jnp.max(score_p))
  arg = (jnp.argmax(score_r).astype(jnp.int32) + j * tile,
         jnp.argmax(score_p).astype(jnp.int32) + j * tile)
  lane = jax.lax.broadcasted_iota(jnp.int32, (1, _LANES), 1)
  scores_ref[...] = jnp.where(lane == 0, best[0], jnp.where(lane == 1, best[1], -jnp.inf))
  ids_ref[...] = jnp.where(lane == 0, arg[0], jnp.where(lane == 1, arg[1], 0))


def _scalar_spec():
  if jax.default_backend() == "tpu":
    from jax.experimental.pallas import tpu as pltpu  # pylint: disable=import-outside-toplevel
    return pl.BlockSpec(memory_space=pltpu.SMEM)
  return pl.BlockSpec((4,), lambda j: (0,))


def _draw_pallas(target_probs, draft_probs, row, scale, key, tile: int, interpret: bool,
                 vocab: Optional[int] = None):
  """The pallas backend; `vocab` < the arrays' width ignores the columns beyond it (tests use
  this to put garbage where a ragged tile reads out of bounds)."""
  gamma, width = draft_probs.shape
  vocab = width if vocab is None else vocab
  words = key_words(key)
  if words is None:
    raise ValueError("the pallas backend needs threefry2x32 keys with jax_threefry_partitionable "
                     f"on (it regenerates the reference's Exp(1) draws in the kernel); got a key "
                     f"of dtype {key.dtype}; use backend='xla'")
  as_int = lambda x: jax.lax.bitcast_convert_type(x, jnp.int32)
  scalars = jnp.stack([jnp.asarray(row, jnp.int32), as_int(words[0]), as_int(words[1]),
                       as_int(jnp.asarray(scale, jnp.float32))])
  tiles = pl.cdiv(width, tile)
  kernel = lambda *refs: _kernel(*refs, tile=tile, vocab=vocab, gamma=gamma)
  result_spec = pl.BlockSpec((None, 1, _LANES), lambda j: (j, 0, 0))
  scores, ids = pl.pallas_call(
      kernel,
      out_shape=(jax.ShapeDtypeStruct((tiles, 1, _LANES), jnp.float32),
                 jax.ShapeDtypeStruct((tiles, 1, _LANES), jnp.int32)),
      grid=(tiles,),
      in_specs=[_scalar_spec(),
                pl.BlockSpec((gamma + 1, tile), lambda j: (0, j)),
                pl.BlockSpec((gamma, tile), lambda j: (0, j))],
      out_specs=(result_spec, result_spec),
      interpret=interpret,
      name="specjax_fused_verify",
  )(scalars, target_probs, draft_probs)
  # Across tiles: the first tile holding the maximum, so ties go to the lowest id as in argmax.
  best_r_tile = jnp.argmax(scores[:, 0, 0])
  best_p_tile = jnp.argmax(scores[:, 0, 1])
  return _pick(scores[best_r_tile, 0, 0], ids[best_r_tile, 0, 0], ids[best_p_tile, 0, 1])


def draw_correction(target_probs: jax.Array, draft_probs: jax.Array, row: jax.Array,
                    scale: jax.Array, key: jax.Array, *, backend: str = "xla",
                    tile: int = 2048, interpret: bool = False) -> jax.Array:
  """The token drawn after `row` accepted guesses, for ONE row, in one vocabulary pass.

  Equals ``categorical(key, w)`` with w = max(0, p_row − scale·q_min(row, γ−1)), or
  w = p_row when that has no positive entry.

  Args:
    target_probs: float32 [γ+1, V], p_1..p_{γ+1}.
    draft_probs: float32 [γ, V], q_1..q_γ.
    row: int32 [] in [0, γ]: the number of accepted guesses n.
    scale: float32 []: l after a rejection, 0 when p_row itself is to be sampled.
    key: the correction key of position n (typed [] or raw uint32 [2]).
    backend: 'xla' or 'pallas'.
    tile: vocabulary tile of the pallas kernel (a multiple of 128).
    interpret: run the pallas kernel in interpret mode (CPU).
  Returns:
    int32 [].
  """
  if backend == "xla":
    q_row = draft_probs[jnp.minimum(row, draft_probs.shape[0] - 1)]
    return draw_from_rows(target_probs[row], q_row, scale, key)
  if backend == "pallas":
    return _draw_pallas(target_probs, draft_probs, row, scale, key, tile, interpret)
  raise ValueError(f"backend must be 'xla' or 'pallas', got {backend!r}")
