"""The device check's CPU path (--dry_run): the tiny model's steps and whole decodes timed and
predicted, written side by side (the figures are the machinery's, not a device's: a CPU has no
entry in the model)."""
import json

import pytest

from experiments.bench import device_check


def test_the_device_check_writes_measured_beside_predicted(tmp_path):
  result = device_check.main(["--dry_run", "--output_dir", str(tmp_path)])
  written = json.loads((tmp_path / "device_check.json").read_text())
  assert written["steps"] == result["steps"] and len(result["steps"]) == 2
  for row in result["steps"]:
    assert row["measured_ms"] > 0 and row["predicted_ms"] > 0 and row["launches"] > 0
  (pair,) = result["pairs"]
  assert pair["c_measured"] > 0 and pair["speedup_predicted"] > 0
  assert "predicted_ms" in (tmp_path / "device_check.md").read_text()
  ar, chain = result["decodes"]
  assert (ar["decode"], chain["decode"]) == ("autoregressive", "chain")
  assert ar["tokens"] == chain["tokens"] == 8  # no EOS: the whole budget
  assert ar["rounds"] == 8 and 1 <= chain["rounds"] <= 8  # a chain round emits 1 to γ + 1
  for row in (ar, chain):
    assert row["measured_ms"] > 0 and row["predicted_round_ms"] > 0
    assert row["predicted_ms"] == pytest.approx(row["rounds"] * row["predicted_round_ms"],
                                                rel=1e-3, abs=2e-3)
  assert chain["speedup_measured"] == pytest.approx(ar["measured_ms"] / chain["measured_ms"],
                                                    rel=1e-2)
  assert written["decodes"] == result["decodes"]


def test_the_dry_run_is_the_tiny_model_briefly_and_the_default_the_two_pairs():
  args = device_check.parse_args(["--dry_run"])
  assert (args.models, args.repeats, args.decode_tokens, args.target) == (["tiny"], 1, 8, "h200")
  assert device_check.parse_args([]).models == ["lm", "large"]


def test_device_kinds_map_to_the_models_names():
  assert device_check.model_name("NVIDIA H200") == "h200"
  assert device_check.model_name("NVIDIA H100 PCIe") == "h100-pcie"
  assert device_check.model_name("NVIDIA H100 80GB HBM3") == "h100"
  assert device_check.model_name("TPU v5 lite") == "tpu-v5e"
  assert device_check.model_name("cpu") is None
