"""Hostile inputs for checkpoints (docs/results/hostile_probe.md): parameters of the
right shape but a non-float dtype, NaN/inf weights, arguments of the wrong type, a file
where a model folder should be, and damaged msgpack at any byte. Nothing here runs a model.
"""
import logging
import os
import shutil

import jax
import numpy as np
import pytest

from specjax import checkpoints
from specjax.models import DecoderOnlyConfig, DecoderOnlyModel
from specjax.params import flatten, unflatten

EMB = "decoder/token_embedder/embedding"


@pytest.fixture(scope="module")
def model():
  return DecoderOnlyModel(DecoderOnlyConfig(vocab_size=16, emb_dim=8, num_heads=2, num_layers=1,
                                            head_dim=4, mlp_dim=8))


@pytest.fixture(scope="module")
def flat(model):
  """{name: float32 numpy array} of the model's shapes (random; nothing compiled)."""
  rng = np.random.default_rng(0)
  return {name: rng.normal(size=leaf.shape).astype(np.float32)
          for name, leaf in flatten(model.param_shapes())}


@pytest.fixture(scope="module")
def good(tmp_path_factory, flat):
  path = str(tmp_path_factory.mktemp("good") / "model")
  checkpoints.save_t5x(unflatten(flat), path, step=5, dtype="float32")
  return path


def _saved(tmp_path, flat, edit, name="model"):
  params = {k: v.copy() for k, v in flat.items()}
  edit(params)
  path = str(tmp_path / name)
  checkpoints.save_t5x(unflatten(params), path, dtype=None)
  return path


@pytest.mark.parametrize("dtype", [np.int32, np.complex64, np.bool_])
def test_a_non_float_parameter_of_the_right_shape_is_refused(tmp_path, model, flat, dtype):
  # Right names and shapes used to be enough: int embeddings decoded into silent garbage.
  path = _saved(tmp_path, flat, lambda p: p.__setitem__(EMB, (p[EMB] * 10).astype(dtype)))
  message = (f"parameter '{EMB}' has dtype {np.dtype(dtype).name} but the model expects "
             "floating-point values")
  with pytest.raises(ValueError, match=message):
    checkpoints.load_t5x_for_model(path, model, dtype="float32")
  in_memory = unflatten({k: v.astype(dtype) if k == EMB else v for k, v in flat.items()})
  with pytest.raises(ValueError, match=message):  # params handed to a model directly
    model.check_params(in_memory)


def test_bfloat16_and_float16_parameters_are_still_floats(model, flat):
  import ml_dtypes
  for dtype in (ml_dtypes.bfloat16, np.float16):
    model.check_params(unflatten({k: v.astype(dtype) for k, v in flat.items()}))


def test_nan_and_inf_weights_are_named_when_loaded(tmp_path, model, flat, caplog):
  def poison(p):
    p[EMB][0, 0] = np.nan
    p["decoder/decoder_norm/scale"][:3] = np.inf
  path = _saved(tmp_path, flat, poison)
  with caplog.at_level(logging.WARNING):
    checkpoints.load_t5x_for_model(path, model)
  text = caplog.text
  assert "2 parameter(s) hold NaN or inf values" in text
  assert f"'decoder/decoder_norm/scale' (3 of 8)" in text and f"'{EMB}' (1 of 128)" in text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    checkpoints.load_t5x_for_model(_saved(tmp_path, flat, lambda p: None, "clean"), model)
  assert "NaN" not in caplog.text


def test_the_sharded_load_of_the_main_job_names_them_too(tmp_path, model, flat, caplog):
  from specjax.runtime.sharding import Partitioner
  path = _saved(tmp_path, flat, lambda p: p[EMB].__setitem__((1, 2), -np.inf))
  with caplog.at_level(logging.WARNING):
    checkpoints.load_sharded(path, model, Partitioner(num_partitions=1), dtype="float32")
  assert f"1 parameter(s) hold NaN or inf values: '{EMB}' (1 of 128)" in caplog.text


@pytest.mark.parametrize("path", [None, 3, ""])
def test_a_path_that_is_not_a_path_is_named(path, model):
  with pytest.raises(ValueError, match="load_t5x: the checkpoint path must be a non-empty str"):
    checkpoints.load_t5x(path)
  with pytest.raises(ValueError, match="save_t5x: the checkpoint path must be a non-empty str"):
    checkpoints.save_t5x({"w": np.ones(2, np.float32)}, path)


def test_a_model_that_is_not_a_model_is_named(good):
  with pytest.raises(ValueError, match=r"model must be a specjax model \(with param_shapes"):
    checkpoints.load_t5x_for_model(good, "models/t5_1_1_small.gin")


def test_saving_onto_a_file_says_so(tmp_path):
  target = tmp_path / "weights.bin"
  target.write_bytes(b"precious")
  with pytest.raises(FileExistsError, match=r"weights.bin is a file, not a model folder"):
    checkpoints.save_t5x({"w": np.ones(2, np.float32)}, str(target))
  assert target.read_bytes() == b"precious"


# ------------------------------------------------------------------ damaged msgpack (guards)


@pytest.fixture
def damage(good, tmp_path):
  """Writes a damaged msgpack into a copy of the good checkpoint; returns the folder."""
  folder = tmp_path / "checkpoint_5"
  shutil.copytree(os.path.join(good, "checkpoint_5"), folder)

  def write(blob):
    (folder / "checkpoint").write_bytes(blob)
    return str(folder)
  return write


def test_a_msgpack_cut_at_any_byte_is_a_value_error_naming_it(good, damage, model):
  blob = open(os.path.join(good, "checkpoint_5", "checkpoint"), "rb").read()
  for cut in list(range(0, len(blob), 7)) + [len(blob) - 1]:
    path = damage(blob[:cut])
    with pytest.raises(ValueError, match=r"corrupt msgpack in .*checkpoint_5/checkpoint: "
                                         r"the file is truncated"):
      checkpoints.load_t5x_for_model(path, model)


def test_a_flipped_byte_is_refused_or_changes_nothing(good, damage, model):
  # No checksum in T5X's format: a flip inside a key or number may go unnoticed, but then
  # the params must be the saved ones; anything else is a ValueError, never another type.
  blob = open(os.path.join(good, "checkpoint_5", "checkpoint"), "rb").read()
  want = dict(flatten(checkpoints.load_t5x_for_model(good, model)))
  rng = np.random.default_rng(0)
  refused = 0
  for _ in range(120):
    damaged = bytearray(blob)
    damaged[rng.integers(len(blob))] = rng.integers(256)
    try:
      got = dict(flatten(checkpoints.load_t5x_for_model(damage(bytes(damaged)), model)))
    except ValueError:
      refused += 1
      continue
    for name, value in want.items():
      np.testing.assert_array_equal(got[name], value)
      assert got[name].dtype == value.dtype
  assert refused > 60  # most flips land in structure the reader checks
