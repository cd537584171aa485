"""Speculative sampling's correction draw with ONE pass over the vocabulary.

After the accept test (which needs only the 2γ scalars p_i(x_i), q_i(x_i)),
Algorithm 1 draws the next token from max(0, p_n − s·q_n) (s = l after a
rejection; s = 0, i.e. from p_n, when every guess was accepted), falling back
to p_n when rounding left no residual mass. `specjax.sampling.categorical`
draws from weights w in two exponential races: over the masses of blocks of
128 consecutive ids, then inside the winning block.

Here the pass over the vocabulary reads p_n and q_n once, tile by tile, and
writes each block's mass of the residual and of p_n (the fallback): 2V / 128
floats. The races then read only those masses and the 128 ids of the winning
block. The masses are `sampling.block_masses` of the same blocks (pairwise
sums in a fixed order, the same bits in any tiling) and the races use the
same keys, so the token equals the reference step's for the same key, bit for
bit (Wagner et al.'s tiled verification, exact).

Two backends compute the same function:
- ``xla``: the weights formed over row n and `categorical` (CPU default); only
  row n is touched.
- ``pallas``: a Pallas kernel with a grid over vocabulary tiles (GPU/TPU;
  ``interpret=True`` runs it on CPU). The last tile may be ragged: ids ≥ V are masked.
  Written for the Triton (GPU) and Mosaic (TPU) lowerings but, so far, run only in
  interpret mode: no accelerator was available where it was developed.

Only row n is read, unlike Wagner et al.'s kernel, which scores all γ+1 rows:
there the probabilities are computed in the same kernel, whereas here p and q
already exist, and the accept test needs only 2γ gathered scalars.
"""
from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from specjax.sampling import CATEGORICAL_BLOCK, block_masses, categorical, draw_by_blocks

_S = CATEGORICAL_BLOCK


def _weights(p: jax.Array, q: jax.Array, scale: jax.Array, valid: Optional[jax.Array] = None
             ) -> Tuple[jax.Array, jax.Array]:
  """The residual max(0, p − s q) and p itself (the fallback), zero where not `valid`."""
  resid = jnp.maximum(p - scale * q, 0.0)
  if valid is not None:
    resid, p = jnp.where(valid, resid, 0.0), jnp.where(valid, p, 0.0)
  return resid, p


def draw_from_rows(p: jax.Array, q: jax.Array, scale: jax.Array, key: jax.Array) -> jax.Array:
  """XLA path on explicit rows: `categorical` over max(0, p − scale·q), else over p.

  Args:
    p: float32 [V] (need not be normalized); q: float32 [V]; scale: float32 [].
    key: the correction key (any PRNG key).
  Returns:
    int32 [], equal to ``categorical(key, w)`` for the weights described above.
  """
  resid, p = _weights(p, q, scale)
  return categorical(key, jnp.where(jnp.any(resid > 0), resid, p))


def _kernel(scalars_ref, p_ref, q_ref, masses_ref, *, tile: int, vocab: int, gamma: int):
  """One vocabulary tile. scalars: int32 [2] = (row, bits of the scale s).

  Writes masses [2, tile / S]: the tile's block masses of the residual and of p."""
  j = pl.program_id(0)
  row = scalars_ref[0]
  scale = jax.lax.bitcast_convert_type(scalars_ref[1], jnp.float32)
  p = p_ref[row, :]  # float32 [tile]: only row n is read
  q = q_ref[jnp.minimum(row, gamma - 1), :]
  ids = j * tile + jax.lax.broadcasted_iota(jnp.int32, (tile,), 0)
  resid, p = _weights(p, q, scale, ids < vocab)  # ids >= V (the ragged last tile) weigh 0
  masses_ref[0, :] = block_masses(resid.reshape(tile // _S, _S))
  masses_ref[1, :] = block_masses(p.reshape(tile // _S, _S))


def _scalar_spec():
  if jax.default_backend() == "tpu":
    from jax.experimental.pallas import tpu as pltpu  # pylint: disable=import-outside-toplevel
    return pl.BlockSpec(memory_space=pltpu.SMEM)
  return pl.BlockSpec((2,), lambda j: (0,))


def _draw_pallas(target_probs, draft_probs, row, scale, key, tile: int, interpret: bool,
                 vocab: Optional[int] = None):
  """The pallas backend; `vocab` < the arrays' width ignores the columns beyond it (tests use
  this to put garbage where a ragged tile reads out of bounds)."""
  gamma, width = draft_probs.shape
  vocab = width if vocab is None else vocab
  q_row = lambda: draft_probs[jnp.minimum(row, gamma - 1), :vocab]
  if vocab <= _S:  # one block: categorical is a single race, no pass to tile
    return draw_from_rows(target_probs[row, :vocab], q_row(), scale, key)
  scale = jnp.asarray(scale, jnp.float32)
  scalars = jnp.stack([jnp.asarray(row, jnp.int32),
                       jax.lax.bitcast_convert_type(scale, jnp.int32)])
  tiles = pl.cdiv(width, tile)
  kernel = lambda *refs: _kernel(*refs, tile=tile, vocab=vocab, gamma=gamma)
  masses = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((tiles, 2, tile // _S), jnp.float32),
      grid=(tiles,),
      in_specs=[_scalar_spec(),
                pl.BlockSpec((gamma + 1, tile), lambda j: (0, j)),
                pl.BlockSpec((gamma, tile), lambda j: (0, j))],
      out_specs=pl.BlockSpec((None, 2, tile // _S), lambda j: (j, 0, 0)),
      interpret=interpret,
      name="specjax_fused_verify",
  )(scalars, target_probs, draft_probs)
  num_blocks = -(-vocab // _S)  # the reference's blocks; the tiles' extra ones weigh 0
  resid_masses = masses[:, 0].reshape(-1)[:num_blocks]
  has_resid = jnp.any(resid_masses > 0)  # a block's mass is > 0 iff one of its weights is

  def block_weights(block):
    ids = block * _S + jnp.arange(_S, dtype=jnp.int32)
    valid = ids < vocab
    take = lambda x: jnp.take(x, jnp.minimum(ids, vocab - 1))
    resid, p = _weights(take(target_probs[row]), take(q_row()), scale, valid)
    return jnp.where(has_resid, resid, p)

  masses = jnp.where(has_resid, resid_masses, masses[:, 1].reshape(-1)[:num_blocks])
  return draw_by_blocks(key, masses, block_weights)


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
