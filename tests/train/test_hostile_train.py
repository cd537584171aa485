"""Hostile inputs for training (docs/results/hostile_probe.md): settings of the wrong
type or range are refused when the configs are built; data that cannot make a batch is
refused before anything compiles; a run that diverges stops before it checkpoints NaN
weights, so the older checkpoints it would have pruned survive. One tiny compile."""
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import checkpoints
from specjax import train as T
from specjax.data import splits
from specjax.params import flatten
from specjax.testing import TINY_CONFIGS
from specjax.train import batches as td

TINY = TINY_CONFIGS["lm"][0]  # the tiny LM target of specjax.testing


@pytest.mark.parametrize("kwargs, message", [
    (dict(learning_rate=math.inf), "learning_rate must be a finite number > 0, got inf"),
    (dict(learning_rate="1e-3"), "learning_rate must be a finite number > 0, got '1e-3'"),
    (dict(learning_rate=None), "learning_rate must be a finite number > 0, got None"),
    (dict(b1=1.5), r"b1 must be a finite number in \[0, 1\), got 1.5"),
    (dict(b2=-0.1), r"b2 must be a finite number in \[0, 1\), got -0.1"),
    (dict(eps=-1.0), "eps must be a finite number >= 0"),
    (dict(end_learning_rate=-1.0), "end_learning_rate must be a finite number >= 0"),
    (dict(warmup_steps=2.5), "warmup_steps must be an integer >= 0, got 2.5"),
    (dict(clip_norm=math.inf), "clip_norm must be a finite number > 0 or None, got inf"),
])
def test_optimizer_settings(kwargs, message):
  with pytest.raises(ValueError, match="OptimizerConfig." + message):
    T.OptimizerConfig(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_steps=2.5), "num_steps must be an integer >= 1, got 2.5"),
    (dict(num_steps=True), "num_steps must be an integer >= 1, got True"),
    (dict(checkpoint_every=1.5), "checkpoint_every must be an integer >= 1, got 1.5"),
    (dict(keep_checkpoints=0.5), "keep_checkpoints must be an integer >= 1, got 0.5"),
    # eval_batches=0 used to fail only at the final evaluation, after the last step and
    # before the final checkpoint: the work since the last checkpoint was lost.
    (dict(eval_batches=0), "eval_batches must be an integer >= 1 or None, got 0"),
    (dict(z_loss=math.inf), "z_loss must be a finite number >= 0, got inf"),
    (dict(model_dir=3), "model_dir must be a directory path, got 3"),
])
def test_loop_settings(kwargs, message):
  args = dict(model_dir="x", num_steps=4)
  args.update(kwargs)
  with pytest.raises(ValueError, match="TrainConfig." + message):
    T.TrainConfig(**args)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=2.5), "batch_size must be an integer >= 1, got 2.5"),
    (dict(seq_len="16"), "seq_len must be an integer >= 1, got '16'"),
    (dict(seed=-1), "seed must be an integer >= 0, got -1"),
])
def test_data_settings(kwargs, message):
  with pytest.raises(ValueError, match="DataConfig." + message):
    T.DataConfig(**kwargs)


def _data_dir(tmp_path, train_bytes):
  folder = tmp_path / "data" / "lm_ddtp_en"
  folder.mkdir(parents=True)
  (folder / "train.txt").write_bytes(train_bytes)
  (folder / "validation.txt").write_text("A validation document.\n")
  return str(tmp_path / "data")


def test_a_split_of_blank_lines_is_refused(tmp_path):
  # Each blank line packed into a lone EOS: the run trained on EOS alone, in silence.
  with pytest.raises(ValueError, match="lm: the train split holds 3 examples, all blank"):
    td.load_split("lm", "train", _data_dir(tmp_path, b"\n  \n\t\n"))


def test_a_non_utf8_split_names_file_line_and_byte(tmp_path):
  data = _data_dir(tmp_path, "fine\nfine too\n".encode() + b"caf\xe9\n")
  with pytest.raises(ValueError, match=r"train\.txt:3: not UTF-8: byte 17 \(b'\\xe9'\)"):
    td.load_split("lm", "train", data)


def test_read_split_keeps_line_semantics(tmp_path):
  path = tmp_path / "x.txt"
  path.write_bytes("one\r\ntwo\u2028still two\n\nfour".encode())
  assert [s for s, _ in splits.read_split(path)] == ["one", "two\u2028still two", "", "four"]


def test_a_batch_larger_than_the_training_rows_is_refused(tmp_path):
  # It used to repeat rows into one batch: 10**6 rows asked for 1.6 TB before failing.
  data = T.DataConfig(task="lm", data_dir=_data_dir(tmp_path, b"One short document.\n"),
                      batch_size=4, seq_len=16)
  with pytest.raises(ValueError, match=r"batch_size 4 is larger than the 1 rows of the train "
                                       r"split \(packed rows of seq_len=16\)"):
    T.make_batches(data, TINY)


def test_a_model_dir_that_is_a_file_is_named(tmp_path):
  path = tmp_path / "model"
  path.write_text("not a folder")
  config = T.TrainConfig(model_dir=str(path), num_steps=1, progress=False)
  with pytest.raises(ValueError, match="TrainConfig.model_dir .*model is a file, not a folder"):
    T.train(TINY, T.DataConfig(batch_size=4, seq_len=16), T.OptimizerConfig(), config)
  assert path.read_text() == "not a folder"


# ------------------------------------------------------------------ divergence (one compile)


@pytest.mark.parametrize("log_every", [1, 100])
def test_a_diverged_run_stops_before_saving_nan_weights(tmp_path, monkeypatch, log_every):
  # Fault injection: from update 3 on the parameters are NaN (as after an exploding step).
  # The run used to log NaN losses, write NaN checkpoint_4 and prune checkpoint_2
  # (keep_checkpoints=1): no usable weights were left. Now it stops at step 4, at the loss
  # (log_every=1) or at the checkpoint (log_every=100), and checkpoint_2 stays.
  real_step = T.Trainer.train_step

  def exploding(self, state, batch):
    state, sums = real_step(self, state, batch)
    if int(state.step) >= 3:
      state = state.replace(params=jax.tree.map(lambda x: x * jnp.nan, state.params))
    return state, sums

  monkeypatch.setattr(T.Trainer, "train_step", exploding)
  model_dir = str(tmp_path / "model")
  config = T.TrainConfig(model_dir=model_dir, num_steps=6, checkpoint_every=2,
                         keep_checkpoints=1, log_every=log_every, progress=False)
  what = "the training loss is nan" if log_every == 1 else "the parameters hold NaN or inf"
  with pytest.raises(FloatingPointError, match=f"diverged at step 4: {what}. Nothing was saved "
                                               "past checkpoint_2"):
    T.train(TINY, T.DataConfig(batch_size=4, seq_len=16),
            T.OptimizerConfig(warmup_steps=1), config)
  assert T.list_checkpoints(model_dir) == [2]
  params = checkpoints.load_t5x(os.path.join(model_dir, "checkpoint_2"))
  assert all(np.isfinite(v).all() for _, v in flatten(params))


@pytest.mark.parametrize("kwargs, message", [
    (dict(weight="0.5"), r"weight must be a finite number in \[0, 1\], got '0.5'"),
    (dict(weight=math.nan), r"weight must be a finite number in \[0, 1\], got nan"),
    (dict(temperature=math.inf), "temperature must be a finite number > 0, got inf"),
    (dict(temperature=None), "temperature must be a finite number > 0, got None"),
    (dict(teacher=None), "teacher must be a model folder path, got None"),
])
def test_distill_settings(kwargs, message):
  args = dict(teacher="/models/teacher")
  args.update(kwargs)
  with pytest.raises(ValueError, match="DistillConfig." + message):
    T.DistillConfig(**args)
