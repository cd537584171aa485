"""Resuming after the data changed in place, and a final bfloat16 export with
keep_checkpoints=1 (docs/results/hostile_probe.md, second part). Tiny runs of 2-4 steps."""
import os

import pytest

from specjax import train as T
from specjax.testing import TINY_CONFIGS

TINY = TINY_CONFIGS["lm"][0]  # the tiny LM target of specjax.testing
DOCS = "".join(f"Document {i} describes a package for the command line.\n" for i in range(60))


def _data(tmp_path):
  folder = tmp_path / "data" / "lm_ddtp_en"
  folder.mkdir(parents=True)
  (folder / "train.txt").write_text(DOCS)
  (folder / "validation.txt").write_text("A validation document.\n")
  return T.DataConfig(task="lm", data_dir=str(tmp_path / "data"), batch_size=4, seq_len=16)


def _config(model_dir, num_steps, **kw):
  return T.TrainConfig(model_dir=model_dir, num_steps=num_steps, checkpoint_every=2,
                       progress=False, **kw)


def test_a_split_file_edited_in_place_is_changed_data_on_resume(tmp_path):
  # The README says a resume with changed data is refused; a train.txt edited in place (same
  # name, same settings) was accepted.
  data, model_dir = _data(tmp_path), str(tmp_path / "model")
  T.train(TINY, data, T.OptimizerConfig(warmup_steps=1), _config(model_dir, 2))
  train = tmp_path / "data" / "lm_ddtp_en" / "train.txt"
  train.write_text(DOCS.replace("package", "library"))
  with pytest.raises(ValueError, match=r"another setup.*data_sha256.*train.txt"):
    T.train(TINY, data, T.OptimizerConfig(warmup_steps=1), _config(model_dir, 4))
  assert T.list_checkpoints(model_dir) == [2]


def test_a_bfloat16_final_export_keeps_the_checkpoint_a_run_resumes_from(tmp_path):
  # keep_checkpoints=1 with final_dtype='bfloat16' pruned checkpoint_2, the only one with an
  # optimizer state; it was said only at the next resume.
  data, model_dir = _data(tmp_path), str(tmp_path / "model")
  T.train(TINY, data, T.OptimizerConfig(warmup_steps=1),
          _config(model_dir, 4, keep_checkpoints=1, final_dtype="bfloat16"))
  assert T.list_checkpoints(model_dir) == [2, 4]
  assert os.path.exists(os.path.join(model_dir, "checkpoint_2", "optimizer_state.npz"))
