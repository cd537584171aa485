"""A tiny Gemma's decode loops compiled for an H200 and a TPU v5e on this CPU (`specjax.aot`):
the Gemma 3 pair of `specjax.testing` (local and global layers, QK norm, GQA), the target's
weights in bfloat16, the draft's float32. Needs the `aot` extra, as test_deviceless.py."""

import pytest

from specjax.aot import report
from tests.aot.pieces import GPU, NEEDS_COMPILERS, TPU, tiny_gemma_pieces

pytestmark = NEEDS_COMPILERS


@pytest.fixture(scope="module")
def gemma_pieces():
  return tiny_gemma_pieces()


@pytest.mark.parametrize("piece", ["target step", "autoregressive loop", "chain loop",
                                   "tree loop"])
@pytest.mark.parametrize("name", [GPU, TPU])
def test_a_tiny_gemmas_decode_loops_compile_without_a_device(gemma_pieces, piece, name):
  rep, text = report.compile_piece(gemma_pieces[piece], name)
  assert rep.kernels > 0
  assert rep.f32_temps == 0
  if piece.endswith("loop"):
    assert "while" in text
  if piece in ("chain loop", "feature chain loop", "tree loop"):  # the catch-up, the guesses
    assert rep.whiles == 2


def test_a_tpu_gathers_the_bfloat16_embeddings_rows_as_they_lie(gemma_pieces):
  # A 16-bit view of the [56, 32] table (the CPU's way to gather bfloat16 rows) is a copy of
  # the whole table on a TPU, hoisted out of the loop: 704 MB more per chip for Gemma 3 27B's
  # embedding split over four v5e chips.
  _, text = report.compile_piece(gemma_pieces["target step"], TPU)
  assert "bf16[56,32]" in text and "u16[56,32]" not in text
