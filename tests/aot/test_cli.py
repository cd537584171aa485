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


@NEEDS_COMPILERS
def test_a_trained_head_s_step_and_tokens_per_call_give_its_predicted_speedup(tmp_path, capsys):
  from specjax.app.gin_config import model_config_from_file  # pylint: disable=import-outside-toplevel
  from specjax.models import FeatureHeadConfig, model_gin_text  # pylint: disable=import-outside-toplevel
  tiny = "models/decoder_only_tiny.gin"
  cfg = model_config_from_file(tiny)
  head_dir = tmp_path / "head"  # a head folder as specjax.train writes it: model.gin is read
  head_dir.mkdir()
  (head_dir / "model.gin").write_text(model_gin_text(FeatureHeadConfig(
      vocab_size=cfg.vocab_size, emb_dim=cfg.emb_dim, num_heads=2, head_dim=4, mlp_dim=12)))
  out = tmp_path / "out"
  assert aot.cli(["--target", TPU, "--model", tiny, "--draft", tiny, "--pieces", "steps",
                  "--head", str(head_dir), "--tokens_per_call", "2:2.5,5:3.5",
                  "--head_vocab", "16", "--output_dir", str(out)]) == 0
  written = json.loads((out / "aot.json").read_text())
  steps = {r["piece"]: r for r in written["rows"]}
  p = written["prediction"]["feature_head"][TPU]
  assert p["head_step_ms"] == steps["head step"]["pred_ms"] > 0
  assert p["c"] == pytest.approx(p["head_step_ms"] / p["target_step_ms"], abs=1e-4)
  assert p["speedup_by_gamma"]["5"] == pytest.approx(3.5 / (5 * p["c"] + 1), abs=2e-3)
  assert written["arguments"]["head_tokens"] == [[2, 2.5], [5, 3.5]]
  assert f"feature head {head_dir}: head step" in capsys.readouterr().out


@pytest.mark.parametrize("argv, error", [
    (["--draft", "bundled:lm/draft", "--tokens_per_call", "3:2"], "describe a --head"),
    (["--draft", "bundled:lm/draft", "--head", "h", "--tokens_per_call", "3"],
     "give 'GAMMA:TOKENS,...'"),
    (["--draft", "bundled:lm/draft", "--head", "h", "--tokens_per_call", "3:4.5"],
     "emits from 1 to 4 tokens"),
    (["--head", "h"], "need --model or --draft")])
def test_a_bad_head_argument_is_one_error_line(argv, error, capsys):
  with pytest.raises(SystemExit) as info:
    aot.parse_args(argv)
  assert info.value.code == 2
  assert error in capsys.readouterr().err.strip().splitlines()[-1]
