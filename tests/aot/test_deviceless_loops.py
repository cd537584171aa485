"""Every decode loop compiled for an H200 and a TPU v5e on this CPU (`specjax.aot`): no
weight-shaped float32 temporary, and the loops a round nests. Needs the `aot` extra, as
tests/aot/test_deviceless.py."""
import pytest

from specjax.aot import report
from tests.aot.pieces import GPU, NEEDS_COMPILERS, TPU, tiny_pieces

pytestmark = NEEDS_COMPILERS


@pytest.mark.parametrize("piece", ["autoregressive loop", "chain loop", "tree loop",
                                   "feature chain loop", "streamed chain loop"])
@pytest.mark.parametrize("name", [GPU, TPU])
def test_every_decode_loop_compiles_without_a_device(lm_pieces, piece, name):
  rep, text = report.compile_piece(lm_pieces[piece], name)
  assert rep.kernels > 0 and "while" in text
  assert rep.f32_temps == 0
  if piece in ("chain loop", "feature chain loop", "tree loop"):  # the catch-up, the guesses
    assert rep.whiles == 2


@pytest.mark.parametrize("piece", ["chain loop", "feature chain loop", "tree loop"])
def test_unrolled_guesses_leave_one_nested_loop_in_a_round(piece):
  """Drafters with `unroll=True`: the γ guesses (a tree's spine tail) in straight-line code;
  the catch-up (a loop that makes no trip unless rows lag, as after the 'auto' policy's γ = 0
  rounds) remains."""
  # On the TPU (its compiles are the quicker; the nesting is the same program's on a GPU, as
  # the chain loop above is checked there with its two loops).
  rep, _ = report.compile_piece(tiny_pieces(include=("loops",), unroll=True)[piece], TPU)
  assert rep.whiles == 1 and rep.f32_temps == 0
