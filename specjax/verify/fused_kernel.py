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
block. The masses are `sampling.block_masses` of the same blocks and the races
use the same keys, so the token equals the reference step's for the same key,
bit for bit on XLA:CPU (tested; Wagner et al.'s tiled verification, exact). A
GPU's or TPU's reduction may round a block's sum differently from XLA's; a token
can then differ only where two race scores tie to within that rounding, and the
law stays the target's.

Two backends compute the same function:
- ``xla``: the weights formed over row n and `categorical` (CPU default); only
  row n is touched.
- ``pallas``: a Pallas kernel with a grid over vocabulary tiles (GPU/TPU;
  ``interpret=True`` runs it on CPU). The last tile may be ragged: ids ≥ V are masked.
  Its compiler follows the device (`kernel_platform`): Mosaic TPU on a TPU; on an NVIDIA
  GPU of compute capability 9.0 or more (Hopper, Blackwell) Mosaic GPU, JAX's supported
  GPU backend (`specjax.verify.fused_mosaic_gpu`, 8192-id tiles); Triton, which JAX
  deprecates, only where Mosaic GPU cannot run (older NVIDIA GPUs, ROCm). Both GPU kernels
  lower for CUDA from a CPU host (tested: it catches primitives, layouts and shared-memory
  bank conflicts a backend refuses), and both run in interpret mode on CPU (tested: the
  reference's tokens).

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
from specjax.verify import fused_mosaic_gpu

_S = CATEGORICAL_BLOCK
PLATFORMS = ("cpu", "tpu", "mosaic_gpu", "triton")
"""The kernel's compilers (`kernel_platform`); 'cpu' runs only in interpret mode."""


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


def _kernel(scalars_ref, p_ref, q_ref, resid_masses_ref, p_masses_ref, *, tile: int, vocab: int,
            gamma: int):
  """One vocabulary tile of tile / S blocks. scalars: int32 [2] = (row, bits of the scale s).

  p_ref [γ+1, tile / S, S] and q_ref [γ, tile / S, S] hold the tile's blocks of every row;
  only row n is read. Writes the tile's block masses of the residual and of p_n [tile / S].
  No in-kernel reshape or slice (Triton lowers neither)."""
  j = pl.program_id(0)
  row = scalars_ref[0]
  scale = jax.lax.bitcast_convert_type(scalars_ref[1], jnp.float32)
  p = p_ref[row]  # float32 [tile / S, S]
  q = q_ref[jnp.minimum(row, gamma - 1)]
  shape = (tile // _S, _S)
  ids = (j * tile + jax.lax.broadcasted_iota(jnp.int32, shape, 0) * _S
         + jax.lax.broadcasted_iota(jnp.int32, shape, 1))
  resid, p = _weights(p, q, scale, ids < vocab)  # ids >= V (the ragged last tile) weigh 0
  resid_masses_ref[...] = block_masses(resid)
  p_masses_ref[...] = block_masses(p)


def _scalar_spec(platform: str):
  if platform == "tpu":
    from jax.experimental.pallas import tpu as pltpu  # pylint: disable=import-outside-toplevel
    return pl.BlockSpec(memory_space=pltpu.SMEM)
  return pl.BlockSpec((2,), lambda j: (0,))


def _compiler_params(platform: str):
  """Triton's, for the Triton fallback (`pl.pallas_call` would otherwise pick Mosaic GPU,
  which it supports only through `plgpu.kernel`); the platform's default elsewhere."""
  if platform == "triton":
    from jax.experimental.pallas import triton as pltriton  # pylint: disable=import-outside-toplevel
    return pltriton.CompilerParams()
  return None


def kernel_platform(device=None) -> str:
  """The kernel's compiler for `device` (default: JAX's first device), one of `PLATFORMS`:
  Mosaic GPU on NVIDIA GPUs that support it (compute capability ≥ 9.0), Triton on other
  GPUs, else the device's platform."""
  device = device or jax.devices()[0]
  if device.platform in ("gpu", "cuda", "rocm"):
    return "mosaic_gpu" if fused_mosaic_gpu.supports(device) else "triton"
  return device.platform


def _draw_pallas(target_probs, draft_probs, row, scale, key, tile: int, interpret: bool,
                 vocab: Optional[int] = None, platform: Optional[str] = None):
  """The pallas backend; `vocab` < the arrays' width ignores the columns beyond it (tests use
  this to put garbage where a ragged tile reads out of bounds); `platform` (one of
  `PLATFORMS`) picks the kernel's compiler (default: `kernel_platform()`; tests lower for
  'mosaic_gpu' and 'triton' on a CPU host)."""
  gamma, width = draft_probs.shape
  vocab = width if vocab is None else vocab
  q_row = lambda: draft_probs[jnp.minimum(row, gamma - 1), :vocab]
  if vocab <= _S:  # one block: categorical is a single race, no pass to tile
    return draw_from_rows(target_probs[row, :vocab], q_row(), scale, key)
  platform = platform or kernel_platform()
  if platform not in PLATFORMS:
    raise ValueError(f"the fused verifier's kernel platform must be one of {PLATFORMS}, "
                     f"got {platform!r}")
  scale = jnp.asarray(scale, jnp.float32)
  if platform == "mosaic_gpu":
    padded = lambda x: jnp.pad(x, (0, pl.cdiv(vocab, fused_mosaic_gpu.TILE)
                                   * fused_mosaic_gpu.TILE - vocab))
    resid_masses, p_masses = fused_mosaic_gpu.block_masses(
        padded(target_probs[row, :vocab]), padded(scale * q_row()), interpret)
  else:
    resid_masses, p_masses = _tiled_masses(target_probs, draft_probs, row, scale, tile,
                                           interpret, vocab, platform)
  num_blocks = -(-vocab // _S)  # the reference's blocks; the tiles' extra ones weigh 0
  resid_masses, p_masses = resid_masses[:num_blocks], p_masses[:num_blocks]
  has_resid = jnp.any(resid_masses > 0)  # a block's mass is > 0 iff one of its weights is

  def block_weights(block):
    ids = block * _S + jnp.arange(_S, dtype=jnp.int32)
    valid = ids < vocab
    take = lambda x: jnp.take(x, jnp.minimum(ids, vocab - 1))
    resid, p = _weights(take(target_probs[row]), take(q_row()), scale, valid)
    return jnp.where(has_resid, resid, p)

  return draw_by_blocks(key, jnp.where(has_resid, resid_masses, p_masses), block_weights)


def _tiled_masses(target_probs, draft_probs, row, scale, tile: int, interpret: bool, vocab: int,
                  platform: str) -> Tuple[jax.Array, jax.Array]:
  """The `pl.pallas_call` kernel (Mosaic TPU, Triton, or interpreted): block masses of the
  residual and of p_row, float32 [tiles · tile / 128] each."""
  gamma, width = draft_probs.shape
  blocks_per_tile = tile // _S
  if platform == "triton" and blocks_per_tile & (blocks_per_tile - 1):
    raise ValueError(f"the fused verifier's tile must be 128 times a power of two on GPU "
                     f"(Triton's blocks are powers of two), got {tile}")
  scalars = jnp.stack([jnp.asarray(row, jnp.int32),
                       jax.lax.bitcast_convert_type(scale, jnp.int32)])
  tiles = pl.cdiv(width, tile)
  # [rows, V] -> [rows, blocks, S]: a free reshape when the width is a whole number of tiles
  # (V = 8k, 32k, 128k with tile 2048); otherwise the tables are padded once.
  as_blocks = lambda x: jnp.pad(x, ((0, 0), (0, tiles * tile - width))).reshape(
      x.shape[0], tiles * tile // _S, _S)
  kernel = lambda *refs: _kernel(*refs, tile=tile, vocab=vocab, gamma=gamma)
  masses_spec = pl.BlockSpec((tile // _S,), lambda j: (j,))
  masses_shape = jax.ShapeDtypeStruct((tiles * tile // _S,), jnp.float32)
  return pl.pallas_call(
      kernel,
      out_shape=(masses_shape, masses_shape),
      grid=(tiles,),
      in_specs=[_scalar_spec(platform),
                pl.BlockSpec((gamma + 1, tile // _S, _S), lambda j: (0, j, 0)),
                pl.BlockSpec((gamma, tile // _S, _S), lambda j: (0, j, 0))],
      out_specs=(masses_spec, masses_spec),
      interpret=interpret,
      compiler_params=_compiler_params(platform),
      name="specjax_fused_verify",
  )(scalars, as_blocks(target_probs), as_blocks(draft_probs))


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
