"""The device check's CPU path: the tiny model's steps timed and predicted, written side by side
(the figures are the machinery's, not a device's: a CPU has no entry in the model)."""
import json

from experiments.bench import device_check


def test_the_device_check_writes_measured_beside_predicted(tmp_path):
  result = device_check.main(["--models", "tiny", "--repeats", "1", "--target", "h200",
                              "--output_dir", str(tmp_path)])
  written = json.loads((tmp_path / "device_check.json").read_text())
  assert written["steps"] == result["steps"] and len(result["steps"]) == 2
  for row in result["steps"]:
    assert row["measured_ms"] > 0 and row["predicted_ms"] > 0 and row["launches"] > 0
  (pair,) = result["pairs"]
  assert pair["c_measured"] > 0 and pair["speedup_predicted"] > 0
  assert "predicted_ms" in (tmp_path / "device_check.md").read_text()


def test_device_kinds_map_to_the_models_names():
  assert device_check.model_name("NVIDIA H200") == "h200"
  assert device_check.model_name("NVIDIA H100 PCIe") == "h100-pcie"
  assert device_check.model_name("NVIDIA H100 80GB HBM3") == "h100"
  assert device_check.model_name("TPU v5 lite") == "tpu-v5e"
  assert device_check.model_name("cpu") is None
