"""A tiny Gemma's decode loops compiled for an H200 and a TPU v5e on this CPU (`specjax.aot`):
the Gemma 3 pair of `specjax.testing` (local and global layers, QK norm, GQA), the target's
weights in bfloat16, the draft's float32. Needs the `aot` extra, as test_deviceless.py."""
import dataclasses

import pytest

from specjax.aot import report
from specjax.models import GemmaConfig, GemmaModel
from specjax.testing import tiny_gemma_configs
from tests.aot.pieces import GPU, NEEDS_COMPILERS, TPU

pytestmark = NEEDS_COMPILERS


@pytest.fixture(scope="module")
def gemma_pieces():
  # A vocabulary of 56, so that no activation of a round shares a weight matrix's shape and the
  # float32 test is sharp: with 48, the draft's query and key/value products of one input
  # ([16, 32 + 16], joined by XLA:GPU at these tiny sizes) read as its embedding's shape.
  target_config, draft_config = (GemmaConfig.of(c, num_embed=56)
                                 for c in tiny_gemma_configs("gemma3"))
  target = GemmaModel(dataclasses.replace(target_config, dtype="bfloat16"))
  return {p.name: p for p in report.model_pieces(target, GemmaModel(draft_config), input_len=4,
                                                  max_new_tokens=8, gamma=4,
                                                  include=("steps", "loops"))}


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
