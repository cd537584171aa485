"""Models split over several compile-only devices (`specjax.aot.report.compile_piece(...,
devices=N)`, `python -m specjax.aot --devices N`): a tiny Gemma's step and chain decode over a
TPU v5e slice's chips, a tiny decoder-only step over two GPUs. Needs the `aot` extra, as
test_deviceless.py."""

import jax
import pytest

from specjax.aot import report, targets
from tests.aot.pieces import GPU, NEEDS_COMPILERS, TPU, tiny_gemma_pieces, tiny_pieces
from tests.aot.test_deviceless import TRITON_CALL

pytestmark = NEEDS_COMPILERS


@pytest.fixture(scope="module")
def gemma_pieces():
  return tiny_gemma_pieces()


def test_a_slice_gives_its_chips_and_too_many_is_one_line():
  chips = targets.devices(TPU, 8)  # v5e 2x4
  assert len({d.id for d in chips}) == 8
  assert [d.id for d in targets.devices(TPU, 2)] == [d.id for d in targets.devices(TPU, 4)][:2]
  with pytest.raises(targets.TargetUnavailable, match="must be an integer from 1 to 16, got 17"):
    targets.devices(TPU, 17)


def test_a_split_step_is_one_devices_share(gemma_pieces):
  piece = gemma_pieces["target step"]
  whole, whole_text = report.compile_piece(piece, TPU)
  split, text = report.compile_piece(piece, TPU, devices=2)
  assert split.devices == 2 and whole.devices == 1
  assert "all-reduce" in text and "all-reduce" not in whole_text
  assert split.f32_temps == 0
  # Half of the split weights and cache, all of the norms' scales (a few hundred bytes).
  scales = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(piece.weights)
               if len(x.shape) == 1)
  assert split.floor_bytes == (whole.floor_bytes - scales) // 2 + scales
  assert split.per_layer > 0


def test_the_split_floor_is_what_xla_places_on_one_device(gemma_pieces):
  # On a GPU, whose buffers are dense (a TPU's pad each array to its tiles: 4x at these sizes).
  piece = gemma_pieces["target step"]
  args, _ = report.split(piece.args, targets.devices(GPU, 2))
  memory = piece.fn.lower(*args).compile().memory_analysis()
  # The arguments are the weights, the cache and one token per row (int32 [1, 1]).
  assert memory.argument_size_in_bytes == report.per_device_nbytes(args)
  assert report.per_device_nbytes(args) == report.per_device_nbytes(
      (args[0], args[1])) + 4


def test_a_chain_decode_splits_over_four_chips(gemma_pieces):
  rep, text = report.compile_piece(gemma_pieces["chain loop"], TPU, devices=4)
  assert rep.devices == 4 and rep.f32_temps == 0 and rep.whiles == 2
  assert "all-reduce" in text


def test_a_gpu_split_runs_xlas_own_kernels():
  piece = tiny_pieces(include=("steps",))["target step"]
  one, _ = report.compile_piece(piece, GPU)
  two, text = report.compile_piece(piece, GPU, devices=2)
  assert one.custom_calls.get(TRITON_CALL, 0) >= 2  # the sublayer entries' Pallas kernel
  # Split, the partitioner would gather a Pallas call's operands: XLA's fusions instead.
  assert TRITON_CALL not in two.custom_calls and "all-reduce" in text
  assert two.f32_temps == 0
