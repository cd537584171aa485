"""Training-time test (`specjax.train.rollout`): the loss of K guesses per position, each
guess weighted decay^k, over the head's own rollout; a head with feature_layers warm-started
from a head of the final features alone; a run that trains, logs the agreement by guess and
resumes exactly."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import checkpoints
from specjax.models import FeatureHead, FeatureHeadConfig, model_gin_text
from specjax.models.feature_head import shift_features
from specjax.testing import tiny_pair
from specjax.train import (DataConfig, FeatureHeadTraining, OptimizerConfig, TrainConfig,
                           load_head, train)
from specjax.app import head_eval as head_eval_cli
from specjax.train import head_eval
from specjax.train.feature_head import head_loss_sums
from specjax.train.rollout import smooth_l1, warm_start_params

HEAD = FeatureHeadConfig(vocab_size=8192, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                         feature_layers=(0, 1))
DATA = DataConfig(task="lm", batch_size=4, seq_len=32)
OPTIMIZER = OptimizerConfig(learning_rate=1e-2, warmup_steps=2, decay="constant")
TOKENS = np.array([[5, 7, 9, 11, 13, 2, 6], [3, 4, 6, 8, 0, 0, 0]], np.int32)
BATCH = {"decoder_input_tokens": TOKENS, "decoder_loss_weights": (TOKENS > 0).astype(np.int32)}


def test_rollout_loss_weights_each_guess_and_reads_the_heads_own_guesses():
  """The loss recomputed here from `FeatureHead.rollout` (whose step k is the chain's k-th
  guess: tests/models/test_feature_layers.py): guess k's cross-entropy and regression over
  the positions p >= k, weighted 0.5^k, divided by the weights' sum; over a limited
  vocabulary the head's q covers those ids only."""
  pair = tiny_pair("lm")
  head = FeatureHead(HEAD)
  params = head.init(jax.random.PRNGKey(1))
  target, tp = pair.target, pair.target_params
  logits, hidden = target.features(tp, TOKENS, feature_layers=(0, 1))
  final = hidden[..., 16:]
  p = jax.nn.softmax(logits, -1)
  steps, decay = 3, 0.5
  rolled = head.rollout(params, shift_features(head.fuse_layers(params, hidden)),
                        target.embed(tp, TOKENS), steps)
  ids = np.array([9, 3, 5, 7, 11, 13, 2, 4, 6, 8], np.int32)
  for limit in (None, ids):
    training = FeatureHeadTraining(target="t", rollout_steps=steps, rollout_decay=decay,
                                   feature_weight=0.3, token_weight=1.0,
                                   vocab_limit=None if limit is None else ids.size)
    sums = head_loss_sums(head, target, params, tp, BATCH, training,
                          None if limit is None else jnp.asarray(ids))
    expected, agree = 0.0, []
    for k in range(steps):
      full = target.feature_logits(tp, rolled[k])
      if limit is None:
        log_q, guess = jax.nn.log_softmax(full, -1), full.argmax(-1)
        ce = -(p * log_q).sum(-1)
      else:
        log_q = jax.nn.log_softmax(full[..., ids], -1)
        guess = ids[np.asarray(log_q.argmax(-1))]
        ce = -(p[..., ids] * log_q).sum(-1)
      w = BATCH["decoder_loss_weights"] * (np.arange(TOKENS.shape[1]) >= k)
      loss = 0.3 * smooth_l1(rolled[k] - final).mean(-1) + ce
      expected += decay ** k * float((loss * w).sum())
      agree.append(float(((guess == p.argmax(-1)) * w).sum()))
    np.testing.assert_allclose(sums["loss_sum"], expected / (1 + 0.5 + 0.25), rtol=1e-5)
    np.testing.assert_allclose(sums["correct_sum"], agree[0])
    np.testing.assert_allclose(sums["step2_correct_sum"], agree[2])
    np.testing.assert_allclose(sums["fed_correct_sum"], agree[2])
  # Power: the later guesses' predictions differ from the teacher-forced ones.
  assert float(jnp.abs(rolled[2] - rolled[0])[:, 2:].max()) > 1e-2


def test_a_limited_vocabulary_trains_teacher_forced_heads_too():
  """rollout_steps 1 with vocab_limit (the ablation of training-time test): the loss is the
  teacher-forced guess's cross-entropy over the limited ids alone, recomputed here from
  `FeatureHead.forward`; without vocab_limit the full-vocabulary loss of the same guess."""
  pair = tiny_pair("lm")
  head = FeatureHead(HEAD)
  params = head.init(jax.random.PRNGKey(1))
  target, tp = pair.target, pair.target_params
  logits, hidden = target.features(tp, TOKENS, feature_layers=(0, 1))
  p = jax.nn.softmax(logits, -1)
  predicted = head.forward(params, shift_features(head.fuse_layers(params, hidden)),
                           target.embed(tp, TOKENS))
  ids = np.array([9, 3, 5, 7, 11, 13, 2, 4, 6, 8], np.int32)
  w = BATCH["decoder_loss_weights"]
  full = target.feature_logits(tp, predicted)
  training = FeatureHeadTraining(target="t", feature_weight=0.0, token_weight=1.0,
                                 vocab_limit=ids.size)
  sums = head_loss_sums(head, target, params, tp, BATCH, training, jnp.asarray(ids))
  ce = -(p[..., ids] * jax.nn.log_softmax(full[..., ids], -1)).sum(-1)
  np.testing.assert_allclose(sums["loss_sum"], float((ce * w).sum()), rtol=1e-5)
  unlimited = head_loss_sums(head, target, params, tp, BATCH,
                             FeatureHeadTraining(target="t", feature_weight=0.0, token_weight=1.0))
  ce_full = -(p * jax.nn.log_softmax(full, -1)).sum(-1)
  np.testing.assert_allclose(unlimited["loss_sum"], float((ce_full * w).sum()), rtol=1e-5)
  # Power: the limited and full losses differ.
  assert abs(float(sums["loss_sum"]) - float(unlimited["loss_sum"])) > 1e-3


@pytest.mark.parametrize("bad, match", [
    ({"rollout_steps": 0}, "rollout_steps must be an int >= 1"),
    ({"rollout_steps": 2, "passes": 2}, "choose one"),
    ({"rollout_decay": 0.0}, "rollout_decay"),
    ({"vocab_limit": 4, "passes": 2}, "vocab_limit must be None or an int >= 1 with passes 1"),
    ({"vocab_limit": 0}, "vocab_limit must be None or an int >= 1"),
])
def test_bad_rollout_settings_are_named(bad, match):
  with pytest.raises(ValueError, match=match):
    FeatureHeadTraining(target="t", **bad)


def test_warm_start_copies_the_shared_layers_and_selects_the_final_state():
  pair = tiny_pair("lm")
  plain = FeatureHead(dataclasses.replace(HEAD, feature_layers=None))
  source = plain.init(jax.random.PRNGKey(4))
  head = FeatureHead(HEAD)
  params = warm_start_params(head, head.init(jax.random.PRNGKey(1)), source, 1)
  target, tp = pair.target, pair.target_params
  _, final = target.features(tp, TOKENS)
  _, hidden = target.features(tp, TOKENS, feature_layers=HEAD.feature_layers)
  embedded = target.embed(tp, TOKENS)
  np.testing.assert_allclose(
      head.forward(params, shift_features(head.fuse_layers(params, hidden)), embedded),
      plain.forward(source, shift_features(final), embedded), atol=1e-5)
  wide = FeatureHead(dataclasses.replace(HEAD, mlp_dim=64))
  with pytest.raises(ValueError, match="warm start: parameter .*wi_0.* has shape"):
    warm_start_params(wide, wide.init(0), source, 1)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """The tiny LM target and a head of its final features, as trained model folders."""
  root = tmp_path_factory.mktemp("rollout")
  pair = tiny_pair("lm")
  target = root / "target"
  checkpoints.save_t5x(jax.device_get(pair.target_params), str(target), step=0)
  (target / "model.gin").write_text(model_gin_text(pair.target.config))
  plain = dataclasses.replace(HEAD, feature_layers=None)
  source = root / "plain"
  checkpoints.save_t5x(jax.device_get(FeatureHead(plain).init(4)), str(source), step=0)
  (source / "model.gin").write_text(model_gin_text(plain))
  return str(target), str(source)


def _train(model_dir, folders, num_steps):
  config = TrainConfig(model_dir=str(model_dir), num_steps=num_steps, checkpoint_every=2,
                       log_every=1, progress=False)
  feature = FeatureHeadTraining(target=folders[0], rollout_steps=3, vocab_limit=512,
                                feature_weight=0.0, token_weight=1.0, warm_start=folders[1])
  return train(HEAD, DATA, OPTIMIZER, config, feature=feature)


def test_a_rollout_run_trains_logs_each_guess_and_resumes_exactly(tmp_path, folders):
  through = _train(tmp_path / "through", folders, 4)
  losses = [r["loss"] for r in through.history]
  assert losses[-1] < losses[0], losses
  assert len(through.history[-1]["agreement_by_guess"]) == 3
  cut = _train(tmp_path / "cut", folders, 3)
  resumed = _train(tmp_path / "cut", folders, 4)
  assert (cut.step, resumed.start_step) == (3, 3)
  for a, b in zip(jax.tree.leaves(through.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(a, b)
  head, _ = load_head(tmp_path / "cut")
  assert head.config == HEAD


def test_held_out_evaluation_rolls_out_eval_guesses_and_matches_the_saved_head(tmp_path,
                                                                             folders):
  """With eval_every, a run evaluates on the validation split every eval_every steps and at
  the end: a rollout of eval_guesses (4 > the training's 3) guesses, recorded in
  metrics.jsonl; `head_eval.evaluate_heads` on the saved checkpoint (its ranking read from
  the folder) gives the same record, and the chain estimate is 1 + sum of the cumulative
  products of the agreement by guess."""
  config = TrainConfig(model_dir=str(tmp_path), num_steps=4, checkpoint_every=2, log_every=1,
                       eval_every=2, eval_batches=2, progress=False)
  feature = FeatureHeadTraining(target=folders[0], rollout_steps=3, vocab_limit=512,
                                feature_weight=0.0, token_weight=1.0, warm_start=folders[1])
  result = train(HEAD, DATA, OPTIMIZER, config, feature=feature)
  assert [r["step"] for r in result.evals] == [2, 4]
  last = result.evals[-1]
  by_guess = last["agreement_by_guess"]
  assert len(by_guess) == 4 and by_guess[0] == last["accuracy"]
  np.testing.assert_allclose(last["chain_tokens_estimate"], 1 + np.sum(np.cumprod(by_guess)))
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines if l.get("split") == "validation"] == [2, 4]
  # An evaluation changes no training step: the same run without one ends on the same params.
  plain = _train(tmp_path / "plain", folders, 4)
  for a, b in zip(jax.tree.leaves(result.params), jax.tree.leaves(plain.params)):
    np.testing.assert_array_equal(a, b)
  again = head_eval.evaluate_heads([("step 4", str(tmp_path / "checkpoint_4"))], DATA, feature,
                                   max_batches=2)
  for key in ("accuracy", "agreement_by_guess", "teacher_tv", "tokens"):
    np.testing.assert_allclose(again[0][key], last[key], rtol=1e-5)
  assert [h for h, _ in head_eval.checkpoint_heads(str(tmp_path))] == ["step 2", "step 4"]


def test_head_eval_without_heads_is_named():
  with pytest.raises(ValueError, match="give --heads NAME=HEAD"):
    head_eval_cli.main(["--gin_file=runs/train_lm_eagle3.gin"])
