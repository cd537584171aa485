"""The fused verifier's vocabulary pass as a Mosaic GPU kernel (NVIDIA Hopper and newer).

Mosaic GPU is JAX's supported Pallas backend for NVIDIA GPUs (`plgpu.kernel`); Triton, the
older one, is deprecated and kept only where Mosaic GPU cannot run (before Hopper, ROCm).

The kernel computes what `fused_kernel._kernel` does, with explicit data movement: each
thread block copies one 8192-id tile of p_n and of s·q_n from global to shared memory (TMA,
one barrier), loads them into registers in the WGMMA layout (64 blocks of 128 ids, one block
per row), and sums each row of the residual max(0, p − s·q) and of p into two 64-entry
outputs, written back to global memory. The row n and the scale s are applied before the
kernel (one XLA fusion over row n), so the kernel reads no scalars; ids ≥ V are zero there.

`interpret=True` runs the same kernel in JAX's GPU interpreter on a CPU (simulated shared
memory, barriers and copies), with plain loads and no shared-memory tiling, which only the
compiled kernel needs (to avoid bank conflicts).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from specjax import compat
from specjax.sampling import CATEGORICAL_BLOCK

_S = CATEGORICAL_BLOCK
ROWS = 64
"""Blocks of 128 ids per thread block: the WGMMA register layout tiles rows by 64."""
TILE = ROWS * _S
"""Vocabulary ids per thread block (8192)."""


def available() -> bool:
  """Whether this JAX has Pallas's Mosaic GPU backend."""
  try:
    from jax.experimental.pallas import mosaic_gpu  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return False
  return True


def supports(device) -> bool:
  """Whether `device` runs Mosaic GPU kernels: an NVIDIA GPU of compute capability 9.0 or
  more (Hopper, Blackwell) and a JAX with the backend."""
  if device.platform not in ("gpu", "cuda") or not available():
    return False
  try:  # NVIDIA's "9.0"; AMD GPUs name an architecture ("gfx90a") or none
    return float(getattr(device, "compute_capability", None) or "") >= 9.0
  except ValueError:
    return False


def block_masses(p_row: jax.Array, q_scaled_row: jax.Array, interpret: bool = False
                 ) -> tuple[jax.Array, jax.Array]:
  """Each 128-id block's mass of max(0, p − s·q) and of p, in one pass over the row.

  Args:
    p_row: float32 [W]: p_n, zero beyond the vocabulary; W a multiple of `TILE`.
    q_scaled_row: float32 [W]: s·q_n, zero beyond the vocabulary.
    interpret: run in JAX's GPU interpreter (on a CPU).
  Returns:
    (residual masses, p masses): float32 [W / 128] each.
  """
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=import-outside-toplevel
  width = p_row.shape[0]
  if width % TILE:
    raise ValueError(f"the row's width must be a multiple of {TILE}, got {width}")
  transforms = () if interpret else (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
  load = ((lambda ref: ref[...]) if interpret
          else (lambda ref: compat.mgpu_load(ref, plgpu.Layout.WGMMA)))

  def specjax_fused_verify(p_gmem, q_gmem, resid_gmem, p_masses_gmem, p_smem, q_smem,
                           resid_out, p_out, barrier):
    rows = pl.ds(jax.lax.axis_index("tile") * ROWS, ROWS)
    plgpu.copy_gmem_to_smem(p_gmem.at[rows], p_smem, barrier)
    plgpu.copy_gmem_to_smem(q_gmem.at[rows], q_smem, barrier)
    plgpu.barrier_wait(barrier)
    p = load(p_smem)  # float32 [ROWS, 128]
    resid_out[...] = jnp.sum(jnp.maximum(p - load(q_smem), 0.0), axis=1)  # [ROWS]
    p_out[...] = jnp.sum(p, axis=1)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(resid_out, resid_gmem.at[rows])
    plgpu.copy_smem_to_gmem(p_out, p_masses_gmem.at[rows])
    plgpu.wait_smem_to_gmem(0)

  masses = jax.ShapeDtypeStruct((width // _S,), jnp.float32)
  tile_smem = lambda: plgpu.SMEM((ROWS, _S), jnp.float32, transforms=transforms)
  scratch = [tile_smem(), tile_smem(), plgpu.SMEM((ROWS,), jnp.float32),
             plgpu.SMEM((ROWS,), jnp.float32), plgpu.Barrier(num_arrivals=2)]
  kernel = compat.mgpu_kernel(  # named after its body in the lowered program
      specjax_fused_verify, out_type=(masses, masses), scratch_types=scratch,
      grid=(width // TILE,), grid_names=("tile",),
      interpret=compat.mgpu_interpret_params() if interpret else False)
  return kernel(p_row.reshape(-1, _S), q_scaled_row.reshape(-1, _S))

