"""Tests for specjax.train: both model families train on the bundled split and the
loss falls; checkpoints, model.gin and an exact resume; schedules, the loss and
the batching checked against direct re-derivations.

The two training runs go through the CLI entry point with tiny models layered
over the shipped run files (runs/train_lm.gin, runs/train_translate.gin), so
the gin files are exercised too. They are module fixtures shared by the tests.
"""
import dataclasses
import json
import math
import os
import shutil
import types

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.train import batches as td
from specjax import checkpoints
from specjax import train as T
from specjax.app import train_main
from specjax.models import build_model
from specjax.models.decoder_only import DecoderOnlyConfig
from specjax.models.t5 import T5Config
from specjax.params import flatten

STEPS = 20
LM_GIN = """
include 'runs/train_lm.gin'
DecoderOnlyConfig.emb_dim = 32
DecoderOnlyConfig.num_heads = 2
DecoderOnlyConfig.num_layers = 2
DecoderOnlyConfig.head_dim = 16
DecoderOnlyConfig.mlp_dim = 64
NUM_STEPS = 20
BATCH_SIZE = 8
SEQ_LEN = 64
LEARNING_RATE = 0.1
WARMUP_STEPS = 2
EVAL_EVERY = 10
CHECKPOINT_EVERY = 5
OptimizerConfig.weight_decay = 0.0
TrainConfig.eval_batches = 4
TrainConfig.log_every = 1
TrainConfig.progress = False
"""
T5_GIN = """
include 'runs/train_translate.gin'
T5Config.emb_dim = 32
T5Config.num_heads = 2
T5Config.num_encoder_layers = 2
T5Config.num_decoder_layers = 2
T5Config.head_dim = 16
T5Config.mlp_dim = 64
NUM_STEPS = 20
BATCH_SIZE = 8
INPUTS_LENGTH = 32
TARGETS_LENGTH = 32
LENGTH_BUCKETS = (12,)
LEARNING_RATE = 0.05
WARMUP_STEPS = 2
EVAL_EVERY = 0
CHECKPOINT_EVERY = 100
TrainConfig.eval_batches = 4
TrainConfig.log_every = 4
TrainConfig.progress = False
"""


def run_cli(gin_text, model_dir, tmp_dir):
  path = os.path.join(tmp_dir, "run.gin")
  with open(path, "w") as f:
    f.write(gin_text)
  gin.clear_config()
  try:
    return train_main.main([f"--gin_file={path}", f"--gin.MODEL_DIR='{model_dir}'"])
  finally:
    gin.clear_config()


def initial_eval(result):
  """Validation metrics of the run's initial parameters (same compiled eval step)."""
  trainer = T.get_trainer(result.model_config, result.optimizer, result.config.num_steps,
                          result.config.z_loss)
  params = trainer.model.init(jax.random.PRNGKey(result.config.seed))
  _, val = T.make_batches(result.data, result.model_config)
  return trainer.evaluate(params, val.eval_batches(result.config.eval_batches))


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("lm")
  result = run_cli(LM_GIN, str(tmp / "model"), str(tmp))
  return types.SimpleNamespace(result=result, dir=str(tmp / "model"), tmp=tmp,
                               init=initial_eval(result))


@pytest.fixture(scope="module")
def t5_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("t5")
  result = run_cli(T5_GIN, str(tmp / "model"), str(tmp))
  return types.SimpleNamespace(result=result, dir=str(tmp / "model"), init=initial_eval(result))


def assert_learned(run, margin):
  r = run.result
  assert r.start_step == 0 and r.step == STEPS
  ce = [h["cross_entropy"] for h in r.history]
  assert all(np.isfinite(ce))
  assert np.mean(ce[-2:]) < ce[0] - margin, ce
  final = r.evals[-1]
  assert final["step"] == STEPS
  assert final["cross_entropy"] < run.init["cross_entropy"] - margin
  assert final["accuracy"] > run.init["accuracy"]
  assert final["perplexity"] == pytest.approx(math.exp(final["cross_entropy"]))
  assert final["loss"] > final["cross_entropy"]  # the z-loss term is on
  assert r.tokens_per_second > 0


# ----------------------------------------------------------------------------
# Training lowers the loss (both families).
# ----------------------------------------------------------------------------
def test_lm_training_lowers_loss(lm_run):
  assert isinstance(lm_run.result.model_config, DecoderOnlyConfig)
  assert lm_run.result.optimizer.name == "adamw"
  assert_learned(lm_run, margin=1.5)
  assert [e["step"] for e in lm_run.result.evals] == [10, 20]
  assert [h["step"] for h in lm_run.result.history] == list(range(1, STEPS + 1))


def test_t5_training_lowers_loss(t5_run):
  r = t5_run.result
  assert isinstance(r.model_config, T5Config) and r.data.task == "translate"
  assert r.optimizer.name == "adafactor" and r.optimizer.decay == "rsqrt"
  assert_learned(t5_run, margin=1.0)
  assert [h["step"] for h in r.history] == [1, 4, 8, 12, 16, 20]
  assert [e["step"] for e in r.evals] == [20]
  assert checkpoints.find_checkpoint(t5_run.dir).step == STEPS


# ----------------------------------------------------------------------------
# Checkpoints, model.gin, metrics and resuming.
# ----------------------------------------------------------------------------
def test_checkpoints_model_gin_and_metrics(lm_run):
  r = lm_run.result
  assert T.list_checkpoints(lm_run.dir) == [15, 20]  # every 5 steps, 2 kept
  assert r.checkpoint == os.path.join(lm_run.dir, "checkpoint_20")
  saved = dict(flatten(checkpoints.load_t5x(lm_run.dir)))
  final = dict(flatten(r.params))
  assert sorted(saved) == sorted(final)
  for name, value in final.items():
    assert saved[name].dtype == np.float32
    np.testing.assert_array_equal(saved[name], value, err_msg=name)
  for step in (15, 20):
    assert os.path.isfile(os.path.join(lm_run.dir, f"checkpoint_{step}", T.OPT_STATE_FILE))
  gin.clear_config()
  try:  # model.gin alone rebuilds the config
    gin.parse_config_file(os.path.join(lm_run.dir, T.MODEL_GIN))
    config = gin.get_configurable("DecoderOnlyConfig")()
  finally:
    gin.clear_config()
  assert config == r.model_config
  with open(os.path.join(lm_run.dir, T.METRICS_FILE)) as f:
    records = [json.loads(line) for line in f]
  assert [x["step"] for x in records if x["split"] == "train"] == list(range(1, STEPS + 1))
  assert [x["step"] for x in records if x["split"] == "validation"] == [10, 20]


def copy_checkpoint(run, step, dest):
  os.makedirs(dest)
  shutil.copy(os.path.join(run.dir, T.MODEL_GIN), dest)
  shutil.copytree(os.path.join(run.dir, f"checkpoint_{step}"),
                  os.path.join(dest, f"checkpoint_{step}"))


def test_resume_continues_exactly(lm_run):
  dest = str(lm_run.tmp / "resumed")
  copy_checkpoint(lm_run, 15, dest)
  resumed = run_cli(LM_GIN, dest, str(lm_run.tmp))
  assert resumed.start_step == 15 and resumed.step == STEPS
  assert [h["step"] for h in resumed.history] == list(range(16, STEPS + 1))
  # Same params, optimizer state and batches: the losses of steps 16..20 and the
  # final params match the uninterrupted run's.
  np.testing.assert_allclose([h["loss"] for h in resumed.history],
                             [h["loss"] for h in lm_run.result.history[15:]], rtol=1e-6)
  want = dict(flatten(lm_run.result.params))
  for name, value in flatten(resumed.params):
    np.testing.assert_allclose(value, want[name], rtol=0, atol=1e-6, err_msg=name)
  assert T.list_checkpoints(dest) == [15, 20]


def test_resume_without_optimizer_state_restarts_it(lm_run, caplog):
  # A checkpoint written elsewhere (no train_state.json, no optimizer state):
  # its params are fine-tuned with a fresh optimizer state.
  dest = str(lm_run.tmp / "no_opt_state")
  copy_checkpoint(lm_run, 15, dest)
  os.remove(os.path.join(dest, "checkpoint_15", T.OPT_STATE_FILE))
  os.remove(os.path.join(dest, "checkpoint_15", T.TRAIN_STATE_FILE))
  r = lm_run.result
  trainer = T.get_trainer(r.model_config, r.optimizer, STEPS, r.config.z_loss)
  with caplog.at_level("WARNING"):
    state = T.restore(dest, trainer)
  assert "optimizer state starts from scratch" in caplog.text
  assert int(state.step) == 15
  saved = dict(flatten(checkpoints.load_t5x(dest)))
  for name, value in flatten(jax.device_get(state.params)):
    np.testing.assert_array_equal(value, saved[name])
  fresh = jax.tree_util.tree_leaves(trainer.init_state(state.params).opt_state)
  for a, b in zip(jax.tree_util.tree_leaves(state.opt_state), fresh):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_finished_run_returns_without_training(lm_run):
  r = lm_run.result
  again = T.train(r.model_config, r.data, r.optimizer, r.config)
  assert again.start_step == again.step == STEPS and again.history == []
  for name, value in flatten(again.params):
    np.testing.assert_array_equal(value, dict(flatten(r.params))[name])


def test_model_dir_of_another_model_is_refused(lm_run):
  r = lm_run.result
  other = DecoderOnlyConfig(**{**r.model_config.__dict__, "mlp_dim": 48})
  with pytest.raises(ValueError, match="different model.*mlp_dim"):
    T.train(other, r.data, r.optimizer, r.config)


def test_opt_state_roundtrip_rejects_other_optimizer(tmp_path):
  params = {"w": jnp.ones((3, 4)), "b": jnp.zeros((4,))}
  adam = T.make_optimizer(T.OptimizerConfig(), 10)
  state = jax.jit(adam.update)(params, jax.jit(adam.init)(params), params)[1]
  T.save_opt_state(str(tmp_path), state)
  back = T.load_opt_state(str(tmp_path), jax.eval_shape(adam.init, params))
  for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ada = T.make_optimizer(T.OptimizerConfig(name="adafactor"), 10)
  assert T.load_opt_state(str(tmp_path), jax.eval_shape(ada.init, params)) is None


def read_metrics(model_dir):
  with open(os.path.join(model_dir, T.METRICS_FILE)) as f:
    return [json.loads(line) for line in f]


def assert_same_params(got, want):
  want = dict(flatten(want))
  got = dict(flatten(got))
  assert sorted(got) == sorted(want)
  for name, value in want.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)  # bit-identical


def test_crash_before_the_optimizer_state_is_written_resumes_exactly(lm_run, monkeypatch):
  # The run dies while checkpoint_10's optimizer state is written (specjax used to
  # have the params in place by then): checkpoint_10 must not count, the resume
  # starts at 5 and ends where the uninterrupted run did.
  dest = str(lm_run.tmp / "crash_opt_state")
  real_savez, calls = np.savez, []

  def savez_then_die(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt("killed while writing the optimizer state")
    return real_savez(*args, **kwargs)
  monkeypatch.setattr(np, "savez", savez_then_die)
  with pytest.raises(KeyboardInterrupt):
    run_cli(LM_GIN, dest, str(lm_run.tmp))
  monkeypatch.setattr(np, "savez", real_savez)
  assert T.list_checkpoints(dest) == [5]
  resumed = run_cli(LM_GIN, dest, str(lm_run.tmp))
  assert resumed.start_step == 5 and resumed.step == STEPS
  assert_same_params(resumed.params, lm_run.result.params)


@pytest.mark.parametrize("change, message", [
    (lambda r: {"optimizer": dataclasses.replace(r.optimizer, learning_rate=0.2)},
     "optimizer.learning_rate: 0.1 -> 0.2"),
    (lambda r: {"data": dataclasses.replace(r.data, batch_size=4)}, "data.batch_size: 8 -> 4"),
    (lambda r: {"data": dataclasses.replace(r.data, seq_len=32)}, "data.seq_len: 64 -> 32"),
    (lambda r: {"config": dataclasses.replace(r.config, num_steps=30)},  # cosine ends there
     "num_steps: 20 -> 30"),
    (lambda r: {"config": dataclasses.replace(r.config, z_loss=0.0)}, "z_loss: 0.0001 -> 0.0"),
])
def test_resume_refuses_a_changed_training_setup(lm_run, change, message):
  r = lm_run.result
  dest = lm_run.tmp / f"changed_{message.split(':')[0]}"
  copy_checkpoint(lm_run, 15, str(dest))
  shutil.copy(os.path.join(lm_run.dir, T.METRICS_FILE), dest)
  before = {p: (dest / p).read_bytes() for p in (T.MODEL_GIN, T.METRICS_FILE)}
  kwargs = dict(model_config=r.model_config, data=r.data, optimizer=r.optimizer,
                config=dataclasses.replace(r.config, model_dir=str(dest)))
  kwargs.update(change(types.SimpleNamespace(**kwargs)))
  with pytest.raises(ValueError, match=f"another setup.*{message}.*ALLOW_CHANGED_TRAINING"):
    T.train(**kwargs)
  assert {p: (dest / p).read_bytes() for p in before} == before  # nothing rewritten
  assert sorted(os.listdir(dest)) == sorted([T.MODEL_GIN, T.METRICS_FILE, "checkpoint_15"])


def test_changed_training_setup_resumes_when_allowed(lm_run, caplog):
  r = lm_run.result
  dest = str(lm_run.tmp / "changed_allowed")
  copy_checkpoint(lm_run, 15, dest)
  data = dataclasses.replace(r.data, seed=1)  # other batches, same compiled step
  config = dataclasses.replace(r.config, model_dir=dest)
  with pytest.raises(ValueError, match="data.seed: 0 -> 1"):
    T.train(r.model_config, data, r.optimizer, config)
  with caplog.at_level("WARNING"):
    again = T.train(r.model_config, data, r.optimizer,
                    dataclasses.replace(config, allow_changed_training=True))
  assert "changed setup (allowed)" in caplog.text
  assert again.start_step == 15 and again.step == STEPS
  # Resuming from its own checkpoint later records the new setup: accepted as is.
  marker = json.load(open(os.path.join(dest, "checkpoint_20", T.TRAIN_STATE_FILE)))
  assert marker["fingerprint"]["data"]["seed"] == 1 and marker["optimizer_state"]
  assert T.train(r.model_config, data, r.optimizer, config).step == STEPS


def test_refused_model_change_writes_no_model_gin(lm_run):
  r = lm_run.result
  dest = lm_run.tmp / "no_model_gin"
  copy_checkpoint(lm_run, 15, str(dest))
  os.remove(dest / T.MODEL_GIN)
  other = dataclasses.replace(r.model_config, mlp_dim=48)
  with pytest.raises(ValueError, match="another model config.*mlp_dim"):
    T.train(other, r.data, r.optimizer, dataclasses.replace(r.config, model_dir=str(dest)))
  assert not (dest / T.MODEL_GIN).exists()


# A checkpoint written before a model-config field existed records no value for it: the run
# resumes while the field holds its default (the model that checkpoint trained), and is refused
# when the run sets another value.
def test_a_model_field_added_since_the_checkpoint_resumes_at_its_default(lm_run):
  r = lm_run.result
  dest = lm_run.tmp / "older_fingerprint"
  copy_checkpoint(lm_run, 15, str(dest))
  marker_path = dest / "checkpoint_15" / T.TRAIN_STATE_FILE
  marker = json.loads(marker_path.read_text())
  assert marker["fingerprint"]["model"].pop("logits_via_embedding") is True
  marker_path.write_text(json.dumps(marker))
  os.remove(dest / T.MODEL_GIN)  # the fingerprint alone decides (model.gin is checked apart)
  config = dataclasses.replace(r.config, model_dir=str(dest))
  other = dataclasses.replace(r.model_config, logits_via_embedding=False)
  with pytest.raises(ValueError, match="another model config.*logits_via_embedding"):
    T.train(other, r.data, r.optimizer, dataclasses.replace(config, allow_changed_training=True))
  resumed = T.train(r.model_config, r.data, r.optimizer, config)
  assert resumed.start_step == 15 and resumed.step == STEPS


def test_resume_drops_metrics_past_the_checkpoint(lm_run):
  dest = str(lm_run.tmp / "metrics_resume")
  copy_checkpoint(lm_run, 15, dest)
  with open(os.path.join(lm_run.dir, T.METRICS_FILE), "rb") as f:
    full = f.read()
  with open(os.path.join(dest, T.METRICS_FILE), "wb") as f:
    f.write(full + b'{"step": 21, "spl')  # and a line torn by a crash
  resumed = run_cli(LM_GIN, dest, str(lm_run.tmp))
  assert resumed.start_step == 15
  records = read_metrics(dest)
  assert [x["step"] for x in records if x["split"] == "train"] == list(range(1, STEPS + 1))
  assert [x["step"] for x in records if x["split"] == "validation"] == [10, 20]


def test_incomplete_newest_checkpoint_is_passed_over(lm_run, caplog):
  dest = str(lm_run.tmp / "incomplete_newest")
  copy_checkpoint(lm_run, 15, dest)
  shutil.copytree(os.path.join(lm_run.dir, "checkpoint_20"), os.path.join(dest, "checkpoint_20"))
  os.remove(os.path.join(dest, "checkpoint_20", T.OPT_STATE_FILE))  # says it has one
  r = lm_run.result
  trainer = T.get_trainer(r.model_config, r.optimizer, STEPS, r.config.z_loss)
  with caplog.at_level("WARNING"):
    state = T.restore(dest, trainer)
  assert int(state.step) == 15 and "checkpoint_20 (no optimizer_state.npz)" in caplog.text
  os.remove(os.path.join(dest, "checkpoint_15", T.OPT_STATE_FILE))
  with pytest.raises(ValueError, match="no complete checkpoint to resume from"):
    T.restore(dest, trainer)


@pytest.mark.parametrize("name", [T.OPT_STATE_FILE, T.TRAIN_STATE_FILE])
def test_training_files_symlinked_out_of_the_checkpoint_are_refused(lm_run, name):
  dest = lm_run.tmp / f"symlinked_{name}"
  copy_checkpoint(lm_run, 15, str(dest))
  outside = lm_run.tmp / f"outside_{name}"
  shutil.move(str(dest / "checkpoint_15" / name), str(outside))
  os.symlink(outside, dest / "checkpoint_15" / name)
  r = lm_run.result
  trainer = T.get_trainer(r.model_config, r.optimizer, STEPS, r.config.z_loss)
  with pytest.raises(ValueError, match="outside the checkpoint folder"):
    T.restore(str(dest), trainer)


# ----------------------------------------------------------------------------
# Schedule, loss, optimizer.
# ----------------------------------------------------------------------------
def test_schedules():
  base = dict(learning_rate=1.0, warmup_steps=4)
  cos = T.make_schedule(T.OptimizerConfig(**base, end_learning_rate=0.1), 14)
  # count c is the (c+1)-th update: warmup 0.25, 0.5, 0.75, 1.0, then cosine.
  np.testing.assert_allclose([float(cos(c)) for c in range(4)], [0.25, 0.5, 0.75, 1.0])
  for c in (4, 8, 13):
    frac = (c + 1 - 4) / 10
    assert float(cos(c)) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
  assert float(cos(13)) == pytest.approx(0.1)
  rsqrt = T.make_schedule(T.OptimizerConfig(**base, decay="rsqrt"), 100)
  assert float(rsqrt(15)) == pytest.approx(math.sqrt(4 / 16))
  const = T.make_schedule(T.OptimizerConfig(**base, decay="constant"), 100)
  assert float(const(50)) == 1.0


def test_cross_entropy_matches_numpy_and_ignores_padding():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 5)).astype(np.float32) * 3
  targets = rng.integers(0, 5, (2, 3)).astype(np.int32)
  weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
  xent = jax.jit(T.cross_entropy, static_argnums=3)
  got = xent(logits, targets, weights, 0.01)
  lse = np.log(np.exp(logits.astype(np.float64)).sum(-1))
  ce = lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
  assert float(got["ce_sum"]) == pytest.approx((ce * weights).sum(), rel=1e-5)
  assert float(got["loss_sum"]) == pytest.approx(((ce + 0.01 * lse**2) * weights).sum(), rel=1e-5)
  assert float(got["weight_sum"]) == 3.0
  correct = (logits.argmax(-1) == targets) * weights
  assert float(got["correct_sum"]) == correct.sum()
  changed = logits.copy()
  changed[weights == 0] = 100.0  # padded positions do not count
  again = xent(changed, targets, weights, 0.01)
  for k in got:
    assert float(again[k]) == pytest.approx(float(got[k]))
  means = T.summarize(jax.device_get(got))
  assert means["cross_entropy"] == pytest.approx((ce * weights).sum() / 3, rel=1e-5)


def test_gradient_clipping_and_decay_mask():
  params = {"w": jnp.ones((2, 2)), "scale": jnp.ones((2,))}
  opt = T.make_optimizer(T.OptimizerConfig(learning_rate=1.0, warmup_steps=0, decay="constant",
                                           weight_decay=0.5, clip_norm=1e-3), 10)
  grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = jax.jit(opt.update)(grads, jax.jit(opt.init)(params), params)
  np.testing.assert_allclose(updates["w"], -0.5 * np.ones((2, 2)))  # decayed matrix
  np.testing.assert_allclose(updates["scale"], 0.0)  # norm scales are not decayed
  # Adam's first update is g / (|g| + eps): about 1 unless the gradients were
  # clipped far below eps first.
  big = {"w": jnp.full((2, 2), 1e3), "scale": jnp.full((2,), 1e3)}
  for clip_norm, size in ((None, 1.0), (1e-12, 0.0)):
    opt = T.make_optimizer(T.OptimizerConfig(learning_rate=1.0, warmup_steps=0,
                                             decay="constant", clip_norm=clip_norm), 10)
    updates, _ = jax.jit(opt.update)(big, jax.jit(opt.init)(params), params)
    np.testing.assert_allclose(updates["scale"], -size, atol=1e-3)


# ----------------------------------------------------------------------------
# Batching.
# ----------------------------------------------------------------------------
class CharVocab:
  """Characters as ids 3.. (eos 1, pad 0): enough to check the batching exactly."""
  eos_id, pad_id, vocab_size = 1, 0, 300

  def encode(self, text):
    return [3 + ord(c) % 290 for c in text]


def test_pack_lm_is_the_document_stream_shifted():
  vocab = CharVocab()
  docs = ["abc", "de", "fghij"]
  stream = []
  for d in docs:
    stream += vocab.encode(d) + [vocab.eos_id]
  feats = td.pack_lm(docs, vocab, seq_len=4)
  n = len(stream) - 1  # 12 next-token pairs in rows of 4
  assert feats["decoder_input_tokens"].shape == (3, 4)
  np.testing.assert_array_equal(feats["decoder_input_tokens"].ravel()[:n], stream[:-1])
  np.testing.assert_array_equal(feats["decoder_target_tokens"].ravel()[:n], stream[1:])
  assert feats["decoder_loss_weights"].sum() == n
  assert (feats["decoder_target_tokens"].ravel()[n:] == 0).all()
  with pytest.raises(ValueError, match="fewer than 2 tokens"):
    td.pack_lm([""], vocab, 4)


def test_encode_pairs_keeps_eos_and_shifts_right():
  vocab = CharVocab()
  feats = td.encode_pairs([("abcdef", "xy"), ("a", "uvwxyz")], vocab, 4, 5)
  enc, dec, tgt = (feats[k] for k in ("encoder_input_tokens", "decoder_input_tokens",
                                      "decoder_target_tokens"))
  np.testing.assert_array_equal(enc[0], vocab.encode("abc") + [1])  # trimmed, EOS kept
  np.testing.assert_array_equal(enc[1], vocab.encode("a") + [1, 0, 0])
  np.testing.assert_array_equal(tgt[1], vocab.encode("uvwx") + [1])
  np.testing.assert_array_equal(tgt[0], vocab.encode("xy") + [1, 0, 0])
  np.testing.assert_array_equal(dec[:, 0], 0)
  np.testing.assert_array_equal(dec[:, 1:], tgt[:, :-1])
  np.testing.assert_array_equal(feats["decoder_loss_weights"], tgt != 0)


def test_batches_are_deterministic_epochs_and_eval_covers_all():
  feats = {"x": np.arange(10)[:, None] + 100, "decoder_loss_weights": np.ones((10, 1))}
  a, b = td.Batches(feats, 4, seed=3), td.Batches(feats, 4, seed=3)
  for step in (7, 0, 3):  # any order: batch(step) depends on (seed, step) only
    np.testing.assert_array_equal(a.batch(step)["x"], b.batch(step)["x"])
  first_epochs = np.concatenate([a.batch(s)["x"][:, 0] for s in range(5)])  # 20 rows
  assert sorted(first_epochs[:10]) == list(range(100, 110))
  assert sorted(first_epochs[10:]) == list(range(100, 110))
  assert not np.array_equal(first_epochs[:10], first_epochs[10:])
  evals = list(a.eval_batches())
  assert len(evals) == 3
  rows = np.concatenate([e["x"][:, 0] for e in evals])
  np.testing.assert_array_equal(rows[:10], np.arange(100, 110))
  np.testing.assert_array_equal(evals[-1]["decoder_loss_weights"][:, 0], [1, 1, 0, 0])
  assert len(list(a.eval_batches(max_batches=2))) == 2


def test_length_buckets_cut_batches_without_losing_tokens():
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 9, 23)
  tokens = np.where(np.arange(8)[None] < lengths[:, None], rng.integers(2, 50, (23, 8)), 0)
  feats = {"decoder_target_tokens": tokens, "decoder_loss_weights": (tokens != 0) * 1.0,
           "row": np.arange(23)}
  a = td.Batches(feats, 4, seed=1, buckets=(2, 5))
  per_width = {w: -(-int(n) // 4) for w, n in
               zip((2, 5, 8), np.bincount(np.searchsorted([2, 5], lengths), minlength=3))}
  assert a.batches_per_epoch == sum(per_width.values())
  assert sorted({s["decoder_target_tokens"][0] for s in a.batch_shapes()}) == [(4, 2), (4, 5),
                                                                               (4, 8)]
  for epoch in range(2):
    seen = []
    for step in range(epoch * a.batches_per_epoch, (epoch + 1) * a.batches_per_epoch):
      b = a.batch(step)
      width = b["decoder_target_tokens"].shape[1]
      real = b["decoder_loss_weights"].sum(1) > 0
      for row, toks in zip(b["row"][real], b["decoder_target_tokens"][real]):
        np.testing.assert_array_equal(toks, tokens[row, :width])  # nothing cut off
        assert {2: 0, 5: 2, 8: 5}[width] < lengths[row] <= width  # the smallest bucket that fits
        seen.append(row)
      assert (b["decoder_target_tokens"][~real] == 0).all()
    assert sorted(seen) == list(range(23))  # an epoch holds every row once
  np.testing.assert_array_equal(a.batch(5)["row"], td.Batches(feats, 4, 1, (2, 5)).batch(5)["row"])
  with pytest.raises(ValueError, match="ascending"):
    td.Batches(feats, 4, buckets=(5, 2))


def test_bundled_split_is_partitioned():
  train = td.load_split("translate", "train")
  val = td.load_split("translate", "validation")
  assert len(val) == round(0.1 * (len(train) + len(val)))
  assert not set(train) & set(val)
  docs = td.load_split("lm", "train", bundled_eval_fraction=0.5)
  assert isinstance(docs[0], str)


# ----------------------------------------------------------------------------
# Errors.
# ----------------------------------------------------------------------------
def test_bad_configs_raise(tmp_path):
  with pytest.raises(ValueError, match="adamw.*adafactor"):
    T.OptimizerConfig(name="sgd")
  with pytest.raises(ValueError, match="decay"):
    T.OptimizerConfig(decay="linear")
  with pytest.raises(ValueError, match="training task must be one of"):
    T.DataConfig(task="qa")
  with pytest.raises(ValueError, match="final_dtype"):
    T.TrainConfig(model_dir="x", num_steps=1, final_dtype="float16")
  with pytest.raises(ValueError, match="num_steps"):
    T.TrainConfig(model_dir="x", num_steps=0)
  with pytest.raises(ValueError, match="bundled_eval_fraction"):
    td.load_split("lm", "train", bundled_eval_fraction=1.0)
  with pytest.raises(FileNotFoundError, match="train split missing"):
    td.load_split("lm", "train", data_dir=str(tmp_path))
  t5 = T5Config(vocab_size=8192, emb_dim=8, num_heads=1, num_encoder_layers=1,
                num_decoder_layers=1, head_dim=4, mlp_dim=8)
  with pytest.raises(ValueError, match="task 'lm' trains a DecoderOnlyConfig"):
    T.make_batches(T.DataConfig(task="lm"), t5)
  small = DecoderOnlyConfig(vocab_size=100, emb_dim=8, num_heads=1, num_layers=1,
                            head_dim=4, mlp_dim=8)
  with pytest.raises(ValueError, match="smaller than the vocabulary"):
    T.make_batches(T.DataConfig(task="lm"), small)
  with pytest.raises(ValueError, match="model config must be"):
    build_model(object())
  with pytest.raises(ValueError, match="unknown arguments"):
    train_main.main(["--gin_file=runs/train_lm.gin", "--steps=3"])
  with pytest.raises(ValueError, match="run file"):
    train_main.main([])
