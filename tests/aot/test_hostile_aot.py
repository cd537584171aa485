"""`python -m specjax.aot` against bad input, without any compiler installed: an incomplete GPU
target config (XLA crashed with SIGFPE on one), a program that does not fit the device's memory
(XLA's RESOURCE_EXHAUSTED traceback), an --output_dir that is a file, a γ past the budget."""
import pytest

from specjax.aot import targets
from specjax.app import aot

H100 = """gpu_device_info {
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
  device_memory_size: 84942979072
  cuda_compute_capability {
    major: 9
  }
}
platform_name: "CUDA"
"""


@pytest.mark.parametrize("field", [*targets.GPU_FIELDS, "major"])
def test_an_incomplete_gpu_config_names_its_missing_field(tmp_path, field):
  targets.check_gpu_config(H100, "h100.txtpb")  # complete: accepted
  for text in (H100.replace(f"  {field}:", f"  no_{field}:"),
               H100.replace(f"  {field}: ", f"  {field}: 0 # ")):
    path = tmp_path / "gpu.txtpb"
    path.write_text(text)
    with pytest.raises(targets.TargetUnavailable, match=f"no positive .*{field} \\(XLA needs"):
      targets.gpu_config_text(str(path))


class _Exhausted:
  """A report whose compile fails as XLA:TPU's does when the program does not fit."""

  @staticmethod
  def compile_piece(piece, name):
    raise RuntimeError("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory "
                       "in memory space hbm. Used 41.2G of 15.75G hbm. Exceeded hbm capacity "
                       "by 25.4G.\n\nTotal hbm usage >= 41.2G: ...")


class _Piece:
  name = "decoder_only_xxl target step"


def test_a_program_too_large_for_the_device_is_one_line():
  with pytest.raises(ValueError, match="decoder_only_xxl target step does not fit one tpu-v5e "
                     "device's memory .*Used 41.2G of 15.75G hbm") as e:
    aot.compile_row(_Exhausted, _Piece, "tpu-v5e")
  assert "\n" not in str(e.value)


def test_bad_arguments_are_one_line(tmp_path, capsys):
  (tmp_path / "file").write_text("x")
  for argv, message in ((["--output_dir", str(tmp_path / "file")], "is a file, not a folder"),
                        (["--gamma", "100000"], "--gamma 100000 exceeds --max_new_tokens 64")):
    with pytest.raises(SystemExit) as e:
      aot.parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
