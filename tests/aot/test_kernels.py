"""The fused verifier's GPU kernels compiled for an H200 on this CPU (`specjax.aot`).

Lowering (tests/verify/test_verifiers.py) checks what JAX accepts; compiling goes on through
XLA:GPU and the kernel's own compiler for an sm_90 target, as a run on the GPU would. Needs the
CUDA plugin of the `aot` extra; skipped where it is not installed (the suite's second
environment, `.ci/run`, has it).
"""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.aot import report, targets
from specjax.verify import fused_kernel

GAMMA = 4


def _cuda_plugin() -> bool:
  try:
    return any(importlib.util.find_spec(m) for m in ("jax_plugins.xla_cuda13",
                                                     "jax_plugins.xla_cuda12"))
  except ImportError:  # no jax_plugins package at all
    return False


pytestmark = pytest.mark.skipif(not _cuda_plugin(), reason="JAX's CUDA plugin is not installed "
                                "(pip install '.[aot]'); the suite's second environment has it")


@pytest.fixture(scope="module", autouse=True)
def _cpu_host():
  targets.cpu_host()


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")
@pytest.mark.parametrize("platform", ["mosaic_gpu", "triton"])
@pytest.mark.parametrize("vocab", [8192, 32000])
def test_fused_verifier_kernel_compiles_for_an_h200(platform, vocab):
  device = targets.devices("h200")[0]
  abstract = lambda *shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype)
  args = report.place((abstract(GAMMA + 1, vocab), abstract(GAMMA, vocab),
                       abstract(dtype=jnp.int32), abstract(), abstract(2, dtype=jnp.uint32)),
                      device)
  draw = lambda p, q, row, s, k: fused_kernel._draw_pallas(p, q, row, s, k, tile=2048,
                                                           interpret=False, platform=platform)
  # The kernels ask the mesh which GPU they are compiled for (Triton: its compute capability).
  mesh = jax.sharding.Mesh(np.array([device]), ("x",))
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    lowered = jax.jit(draw).lower(*args)
  text = lowered.compile().as_text()
  assert "specjax_fused_verify" in text
  assert ("mosaic_gpu" in text) == (platform == "mosaic_gpu")
