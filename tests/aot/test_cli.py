"""`python -m specjax.aot`'s prediction: per accelerator the steps, c and Thm 3.8's speedup in
the report and aot.json (the tiny model, compiled for a TPU v5e: the quickest compiles). Needs
the `aot` extra, as tests/aot/test_deviceless.py; the argument checks run everywhere."""
import json

import pytest

from specjax import analysis
from specjax.app import aot
from tests.aot.pieces import NEEDS_COMPILERS, TPU

@NEEDS_COMPILERS
def test_the_report_predicts_the_steps_c_and_the_speedup(tmp_path, capsys):
  tiny = "models/decoder_only_tiny.gin"
  assert aot.cli(["--target", TPU, "--model", tiny, "--draft", tiny, "--pieces", "steps",
                  "--alpha", "0.8", "--gamma", "3", "--output_dir", str(tmp_path)]) == 0
  written = json.loads((tmp_path / "aot.json").read_text())
  steps = {r["piece"]: r for r in written["rows"]}
  p = written["prediction"][TPU]
  assert p["target_step_ms"] == steps["target step"]["pred_ms"] > 0
  assert p["draft_step_ms"] == steps["draft step"]["pred_ms"] > 0
  assert p["c"] == pytest.approx(p["draft_step_ms"] / p["target_step_ms"], abs=1e-4)
  assert p["speedup"] == pytest.approx(float(analysis.walltime_improvement(0.8, 3, p["c"])),
                                       abs=2e-3)
  assert p["speedup_by_gamma"]["3"] == p["speedup"]
  assert written["model_constants"]["launch_us"] > 0
  assert f"speedup at alpha 0.8, gamma 3: {p['speedup']}x" in capsys.readouterr().out


@pytest.mark.parametrize("alpha", ["1.5", "-0.1"])
def test_an_alpha_outside_0_1_is_one_error_line_and_exit_2(alpha, capsys):
  with pytest.raises(SystemExit) as info:  # argparse's usage, then the error line
    aot.cli(["--alpha", alpha])
  assert info.value.code == 2
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
      f"specjax: error: --alpha must be in [0, 1], got {float(alpha)}")


def test_without_model_and_draft_the_command_takes_the_pairs_with_what_is_given(capsys):
  args = aot.parse_args(["--alpha", "0.6"])
  pairs = aot._pairs(args)  # pylint: disable=protected-access
  assert [p.label for p in pairs] == [p.label for p in aot.PAIRS]
  assert {p.alpha for p in pairs} == {0.6}
  assert [p.gamma for p in pairs] == [p.gamma for p in aot.PAIRS]  # not given: each its own
  one_pair = aot.parse_args(["--draft", "bundled:lm/draft"])
  (one,) = aot._pairs(one_pair)  # pylint: disable=protected-access
  assert (one.model, one.alpha, one.gamma, one.input_len) == ("bundled:lm/target", 0.75, 4, 16)
  with pytest.raises(SystemExit) as info:
    aot.parse_args(["--pieces", "loops"])
  assert info.value.code == 2
  assert "--pieces and --unroll need --model or --draft" in capsys.readouterr().err
