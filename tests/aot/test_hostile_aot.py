"""`python -m specjax.aot` against bad input, without any compiler installed: an incomplete GPU
target config (XLA crashed with SIGFPE on one), a program that does not fit the device's memory
(XLA's RESOURCE_EXHAUSTED traceback), an --output_dir that is a file, a γ past the budget."""
import re

import pytest

from specjax.aot import targets
from specjax.app import aot
from tests.aot.pieces import H100_CONFIG


@pytest.mark.parametrize("field", [*targets.GPU_FIELDS, "major"])
def test_an_incomplete_gpu_config_names_its_missing_field(tmp_path, field):
  targets.check_gpu_config(H100_CONFIG, "h100.txtpb")  # complete: accepted
  found = re.compile(r"\{ major: 9" if field == "major" else rf"(?<![\w.]){field}: [\d.]+")
  assert found.search(H100_CONFIG), field
  missing = found.sub(lambda m: m.group(0).replace(field, "no_" + field, 1), H100_CONFIG, 1)
  zero = found.sub(lambda m: re.sub(r"[\d.]+$", "0", m.group(0)), H100_CONFIG, 1)
  for text in (missing, zero):
    path = tmp_path / "gpu.txtpb"
    path.write_text(text)
    with pytest.raises(targets.TargetUnavailable, match=f"no positive .*{field} \\(XLA needs"):
      targets.gpu_config_text(str(path))


class _Exhausted:
  """A report whose compile fails as XLA:TPU's does when the program does not fit."""

  @staticmethod
  def compile_piece(piece, name, devices=1, **_):
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
                        (["--gamma", "100000"], "--gamma 100000 exceeds --max_new_tokens 64"),
                        (["--devices", "0"], "--devices must be from 1 to 16, got 0"),
                        (["--devices", "17"], "--devices must be from 1 to 16, got 17")):
    with pytest.raises(SystemExit) as e:
      aot.parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
