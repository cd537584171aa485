"""GPUs by name on every JAX the project admits: XLA's target configs where the CUDA plugin
carries them (JAX >= `targets.GPU_CONFIGS_SINCE`), one line saying so where it does not, and a
GPU described by a file from a newer XLA read by an older plugin (its unknown fields dropped).
Needs JAX's CUDA plugin (the `aot` extra, or `jax-cuda13-pjrt` at the installed JAX's version);
skipped where it is not installed."""
import jax
import pytest

from specjax.aot import report, targets
from tests.aot.pieces import H100_CONFIG as CONFIG, _installed

pytestmark = pytest.mark.skipif(
    not (_installed("jax_plugins.xla_cuda13") or _installed("jax_plugins.xla_cuda12")),
    reason="JAX's CUDA plugin is not installed (pip install '.[aot]')")

CARRIES_CONFIGS = (tuple(int(p) for p in jax.__version__.split(".")[:2])
                   >= tuple(int(p) for p in targets.GPU_CONFIGS_SINCE.split(".")[:2]))



def _compiles_the_tiny_step(lm_pieces, name):
  rep, text = report.compile_piece(lm_pieces["target step"], name)
  assert "sm_90" in text or "__triton" in text  # XLA:GPU's program for a Hopper GPU
  assert rep.f32_temps == 0 and rep.kernels > 0


def test_h200_by_name_compiles_the_tiny_pairs_step_or_says_which_jax_it_needs(lm_pieces):
  if CARRIES_CONFIGS:
    _compiles_the_tiny_step(lm_pieces, "h200")
    assert {t.spec for t in targets.GPUS.values()} <= set(targets.embedded_gpus())
    return
  assert targets.embedded_gpus() == []
  with pytest.raises(targets.TargetUnavailable) as info:
    targets.devices("h200")
  message = str(info.value)
  assert "\n" not in message and f"JAX >= {targets.GPU_CONFIGS_SINCE}" in message
  assert "gpu:FILE" in message


def test_a_config_with_fields_the_plugin_lacks_compiles_the_tiny_step(lm_pieces, tmp_path):
  path = tmp_path / "h100_newer.txtpb"
  path.write_text(CONFIG)
  read = targets.gpu_config_text(str(path))
  assert "specjax_future" not in read and "core_count: 132" in read
  assert "cuda_compute_capability { major: 9 minor: 0 }" in read
  _compiles_the_tiny_step(lm_pieces, f"gpu:{path}")


def test_the_step_time_model_reads_a_gpus_figures_from_its_target_config(tmp_path):
  from specjax.aot import cost  # pylint: disable=import-outside-toplevel
  h200 = cost.device("h200")
  assert h200.source == ("target config" if CARRIES_CONFIGS else "table")
  assert h200.hbm_gbps == 4800.0 and h200.cores == 132
  path = tmp_path / "h100.txtpb"
  path.write_text(CONFIG)
  mine = cost.device(f"gpu:{path}")  # SMs * clock * 4096 bf16 FLOPs per clock (sm_90)
  assert mine.source == "target config" and mine.hbm_gbps == 3352.32
  assert mine.peak_tflops == pytest.approx(132 * 1.98 * 4096 / 1e3)
