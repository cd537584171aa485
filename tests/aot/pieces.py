"""What the deviceless tests share: whether the compilers are installed, and the tiny model's
pieces (`specjax.aot.report.model_pieces`)."""
import dataclasses
import importlib.util

import pytest

from specjax.aot import report

GPU, TPU = "h200", "tpu-v5e"

# An H100-class GPU written from its public figures, with fields no XLA defines (a scalar and
# a nested block) as a newer XLA's config would have: an older plugin refuses the text whole.
H100_CONFIG = """platform_name: "CUDA"
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 84929347584
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 minor: 0 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  specjax_future_scalar: 7
  specjax_future_block {
    depth: 1
    inner { width: 2 }
  }
}
dnn_version_info { major: 9 minor: 8 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""


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


def tiny_gemma_pieces():
  """The steps and loops of the tiny Gemma 3 pair of `specjax.testing` (local and global
  layers, QK norm, GQA 4:1), the target's weights in bfloat16, the draft's float32: shapes only.

  A vocabulary of 56, so that no activation of a round shares a weight matrix's shape and the
  float32 test is sharp: with 48, the draft's query and key/value products of one input
  ([16, 32 + 16], joined by XLA:GPU at these tiny sizes) read as its embedding's shape. Every
  axis a split divides (8 query heads, 2 key/value heads, MLP 64, vocabulary 56) divides by 2.
  """
  from specjax.models import GemmaConfig, GemmaModel  # pylint: disable=import-outside-toplevel
  from specjax.testing import tiny_gemma_configs  # pylint: disable=import-outside-toplevel
  target_config, draft_config = (GemmaConfig.of(c, num_embed=56)
                                 for c in tiny_gemma_configs("gemma3"))
  target = GemmaModel(dataclasses.replace(target_config, dtype="bfloat16"))
  return {p.name: p for p in report.model_pieces(target, GemmaModel(draft_config), input_len=4,
                                                  max_new_tokens=8, gamma=4,
                                                  include=("steps", "loops"))}
