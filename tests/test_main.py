"""The main job end to end: gin parsing, checkpoints, both decoders, the report."""
import json

import gin
import jax
import numpy as np
import pytest

from specjax import gin_config
from specjax.checkpoints import load_t5x_for_model, save_t5x
from specjax.main import build_model, run

TINY = "runs/random_tiny.gin"  # a random-init tiny pair: checkpoints can be made from it


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_default_run_writes_outputs_and_is_greedy_identical(tmp_path):
  summary = run(["--prompt", "The package provides a library.", "--prompt", "Hello world",
                 "--gin.MAX_NEW_TOKENS=6", "--gin.BATCH_SIZE=2", "--plain",
                 f"--gin.OUTPUT_DIR='{tmp_path}'"])
  assert summary["greedy_identical"] is True
  assert summary["examples"] == 2 and summary["tokens_per_target_call"] >= 1.0
  lines = (tmp_path / "results.jsonl").read_text().splitlines()
  assert len(lines) == 2 and json.loads(lines[0])["input"] == "The package provides a library."
  assert json.loads((tmp_path / "summary.json").read_text())["gamma"] == 4


def test_checkpoints_round_trip_through_the_job(tmp_path):
  gin_config.parse([TINY], [])
  target = build_model(gin_config.model_config("target"))
  params = target.init(jax.random.PRNGKey(0))
  save_t5x(params, str(tmp_path / "target"), step=3, dtype="float32")
  loaded = load_t5x_for_model(str(tmp_path / "target"), target)
  inputs = np.array([[5, 6, 7, 1]], np.int32)
  decoder_in = np.array([[0, 9, 10]], np.int32)
  np.testing.assert_allclose(target.logits(loaded, inputs, decoder_in),
                             target.logits(params, inputs, decoder_in), atol=1e-6)
  gin.clear_config()
  # The same weights from the checkpoint give the random-init run's outputs (seed 0).
  common = [f"--gin_file={TINY}", "--prompt", "Hello world", "--gin.MAX_NEW_TOKENS=5", "--plain",
            "--gin.BATCH_SIZE=1", f"--gin.OUTPUT_DIR='{tmp_path / 'a'}'"]
  run(common)
  gin.clear_config()
  run(common[:-1] + [f"--gin.OUTPUT_DIR='{tmp_path / 'b'}'",
                     f"--gin.TARGET_CHECKPOINT='{tmp_path / 'target'}'"])
  a = json.loads((tmp_path / "a" / "results.jsonl").read_text())
  b = json.loads((tmp_path / "b" / "results.jsonl").read_text())
  assert a["autoregressive"] == b["autoregressive"]


def test_required_macros_and_bad_checkpoint_are_named(tmp_path):
  with pytest.raises(ValueError, match="TARGET_MODEL"):
    run(["--gin_file=runs/decode.gin", "--prompt", "x"])
  gin.clear_config()
  with pytest.raises(FileNotFoundError, match="checkpoint path does not exist: .*nothing"):
    run(["--prompt", "x", f"--gin.TARGET_CHECKPOINT='{tmp_path / 'nothing'}'"])
  gin.clear_config()
  # A checkpoint whose shapes do not match the model config names the parameter.
  gin_config.parse([TINY], [])
  draft = build_model(gin_config.model_config("draft"))
  save_t5x(draft.init(jax.random.PRNGKey(0)), str(tmp_path / "draft"), dtype="float32")
  gin.clear_config()
  with pytest.raises(ValueError, match="missing parameter|unexpected parameter|has shape"):
    run([f"--gin_file={TINY}", "--prompt", "x",
         f"--gin.TARGET_CHECKPOINT='{tmp_path / 'draft'}'"])


def test_split_gin_args():
  files, bindings, paths, rest = gin_config.split_gin_args(
      ["--gin_file=a.gin", "--gin_file", "b.gin", "--gin.X=1", "--prompt", "hi",
       "--gin_search_paths=/x,/y"])
  assert files == ["a.gin", "b.gin"] and bindings == ["X=1"] and paths == ["/x", "/y"]
  assert rest == ["--prompt", "hi"]


def test_inputs_from_a_seqio_task_split(tmp_path):
  summary = run(["--task", "specjax_translate_en_de:validation", "--num_examples", "2",
                 "--gin.MAX_NEW_TOKENS=3", "--plain", f"--gin.OUTPUT_DIR='{tmp_path}'"])
  from specjax.data import load_bundled
  first = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[0])
  assert first["input"] == load_bundled("translate_en_de")[0][0]
  assert summary["examples"] == 2
