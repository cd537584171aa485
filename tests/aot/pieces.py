"""What the deviceless tests share: whether the compilers are installed, and the tiny model's
pieces (`specjax.aot.report.model_pieces`)."""
import dataclasses
import importlib.util

import pytest

from specjax.aot import report

GPU, TPU = "h200", "tpu-v5e"


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ImportError:
    return False


NEEDS_COMPILERS = pytest.mark.skipif(
    not (_installed("jax_plugins.xla_cuda13") or _installed("jax_plugins.xla_cuda12"))
    or not _installed("libtpu"),
    reason="the deviceless compilers are not installed (pip install '.[aot]'); the suite's "
           "second environment runs this module")


def tiny_pieces(**options):
  """The pieces of a tiny decoder-only model (2 layers) verifying with bfloat16 weights and the
  same sizes drafting in float32: shapes only."""
  from specjax.app.gin_config import model_config_from_file  # pylint: disable=import-outside-toplevel
  from specjax.models import build_model  # pylint: disable=import-outside-toplevel
  # Widths no activation of a round shares with a weight matrix, so the shape test is sharp.
  config = dataclasses.replace(model_config_from_file("models/decoder_only_tiny.gin"),
                               emb_dim=24, num_heads=2, head_dim=16, mlp_dim=40)
  target = build_model(dataclasses.replace(config, dtype="bfloat16"))
  draft = build_model(config)
  # γ = 4: the tree (spines (4, 1)) has a spine tail (depths 3-4), drafted in a loop unless
  # unrolled.
  return {p.name: p for p in report.model_pieces(target, draft, input_len=4, max_new_tokens=8,
                                                  gamma=4, **options)}
