"""Decoding compiled for an H200 and a TPU v5e on this CPU (`specjax.aot`), and read.

Needs the compilers of the `aot` extra (JAX's CUDA plugin and libtpu: `pip install
'.[aot]'`); where they are not installed this module is skipped as a whole, and the suite's
second environment (Python 3.12, the newest JAX, `.ci/run`) runs it. The process's own JAX
backend must be the CPU (JAX_PLATFORMS=cpu, or `targets.cpu_host()` before any JAX work).
The decode loops' compiles: tests/aot/test_deviceless_loops.py.
"""
import dataclasses
import re

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from specjax.aot import cost, hlo, report, targets
from tests.aot.pieces import GPU, NEEDS_COMPILERS, TPU

pytestmark = NEEDS_COMPILERS
TRITON_CALL = "__gpu$xla.gpu.triton"  # a Pallas kernel lowered through Triton

KERNELS_PER_LAYER = {"decoder_only": 8, "t5_1_1": 11}
"""The budget of a large model's decoder layer's kernels in a batch-1 bfloat16 step on the
H200. Decoder-only: each sublayer's residual add, norm and input products in one kernel
(`specjax.models.fused`) 2, the cache writes 2, attention 1, the out GEMM 1, the wo GEMM split
along its inputs 1 and its partial sums added with the residual 1; T5 1.1 adds the
cross-attention's entry kernel, attention and out GEMM (23 per decoder-only layer when
one-row products ran as multiply-and-reduce and attention read two parts, 12 with XLA's
fusions alone, 17 for T5's)."""
TINY_KERNELS_PER_LAYER = 10
"""The same for the tiny model's layers, too narrow for some of XLA's fusions (14 with XLA's
fusions alone)."""


def test_the_plugin_carries_the_gpus_named():
  carried = set(targets.embedded_gpus())
  assert {t.spec for t in targets.GPUS.values()} <= carried


@pytest.mark.parametrize("piece", ["target step", "draft step", "head step"])
def test_steps_compile_for_a_gpu_without_weight_shaped_float32_temporaries(lm_pieces, piece):
  rep, text = report.compile_piece(lm_pieces[piece], GPU)
  assert "sm_90" in text or "__triton" in text  # XLA:GPU's program, not the host's
  assert rep.f32_temps == 0, [k for k in hlo.body_kernels(text) if k.opcode == "fusion"][:8]
  assert 0 < rep.per_layer <= TINY_KERNELS_PER_LAYER
  assert rep.custom_calls.get(TRITON_CALL, 0) >= 2  # the sublayer entries' kernel
  assert rep.whiles == 0 and rep.floor_bytes > 0


@pytest.mark.parametrize("family", sorted(KERNELS_PER_LAYER))
def test_a_large_step_fits_its_kernel_budget_on_an_h200(family):
  """The large sizes (gin/models/<family>_large.gin: 341M decoder-only, T5 1.1 large),
  bfloat16, batch 1: shapes only, compiled for the H200 as it would run there. Each sublayer
  entry is one Pallas kernel (a Triton custom call), and no weight-shaped temporary."""
  from specjax.app.gin_config import model_config_from_file  # pylint: disable=import-outside-toplevel
  from specjax.models import build_model  # pylint: disable=import-outside-toplevel
  model = build_model(dataclasses.replace(
      model_config_from_file(f"models/{family}_large.gin"), dtype="bfloat16"))
  piece = report.step_piece("target step", model, report.abstract_params(model, "bfloat16"),
                            batch=1, cache_len=128)
  rep, _ = report.compile_piece(piece, GPU)
  assert rep.f32_temps == 0
  assert rep.per_layer <= KERNELS_PER_LAYER[family], rep.row()
  entries = 2 if family == "decoder_only" else 3
  assert rep.custom_calls.get(TRITON_CALL, 0) == entries * piece.layers, rep.row()


def test_the_temporary_check_sees_a_one_row_product_that_is_not_padded():
  """The check can fail: the product `bfloat16_dot` pads, written without the padding, writes
  an f32 temporary of the weight's shape on the GPU (XLA:TPU does the same inside a whole
  model's step, not in this one-product loop)."""
  def steps(x, w):
    return lax.fori_loop(0, 2, lambda i, x: lax.dot_general(
        x.astype(jnp.bfloat16), w, (((1,), (0,)), ((), ())),
        preferred_element_type=jnp.float32), x)
  weights = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
  piece = report.Piece("raw", jax.jit(steps), (jax.ShapeDtypeStruct((1, 1024), jnp.float32),
                                                weights), 0, weights)
  assert report.compile_piece(piece, GPU)[0].f32_temps >= 1


@pytest.mark.parametrize("name", [GPU, TPU])
def test_the_target_step_compiles_for_a_tpu_too(lm_pieces, name):
  rep, text = report.compile_piece(lm_pieces["target step"], name)
  assert rep.f32_temps == 0
  assert (TRITON_CALL in rep.custom_calls) == (name == GPU)  # a TPU runs XLA's own fusions
  if name == TPU:
    assert "xla_bytes_accessed" in rep.row() and "TPU" in text.upper()


def test_a_shared_trace_and_the_gpu_options_leave_the_program_as_it_was(lm_pieces):
  """`compile_piece(..., traces=)`: the TPU lowers the GPU's trace again (`report.retraced`)
  and gets the program of its own trace; the GPU's compile options (machine-code
  optimizations off) leave the optimized HLO as XLA's defaults make it."""
  piece = lm_pieces["target step"]
  traces = {}
  _, gpu_text = report.compile_piece(piece, GPU, traces=traces)
  assert set(traces) == {piece.name}
  _, shared = report.compile_piece(piece, TPU, traces=traces)
  _, fresh = report.compile_piece(piece, TPU)
  assert _program(shared) == _program(fresh)
  assert cost.estimate(shared, TPU) == cost.estimate(fresh, TPU)
  device = targets.devices(GPU)[0]
  with targets.kernels_for(device):
    lowered = piece.fn.lower(*report.place(piece.args, device))
  assert lowered.compile().as_text() == gpu_text


def _program(text):
  """The HLO text without where each op was traced from (the Python lines and stack frames
  differ between a trace and its `retraced` copy; nothing else may)."""
  text = re.sub(r"FileNames\n.*?\n\n(?=HloModule|ENTRY|%|$)", "", text, flags=re.S)
  return re.sub(r", metadata=\{[^}]*\}", "", text.split("\nFileNames")[0])
