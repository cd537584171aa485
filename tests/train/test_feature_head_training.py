"""Training a feature head from a frozen tiny target: a few steps, a resume that continues
exactly, the head loaded back and decoding; a head folder without its model.gin refused."""
import collections
import dataclasses

import jax
import numpy as np
import pytest

from specjax import checkpoints
from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.draft import FeatureDrafter
from specjax.models import FeatureHeadConfig, model_gin_text
from specjax.sampling import Sampling
from specjax.testing import tiny_pair
from specjax.train import (DataConfig, FeatureHeadTraining, OptimizerConfig, TrainConfig,
                           load_head, load_token_ranking, make_batches, train)

HEAD = FeatureHeadConfig(vocab_size=8192, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32)
DATA = DataConfig(task="lm", batch_size=4, seq_len=32)
# Constant decay: the schedule does not depend on num_steps, so a run cut short and resumed
# is the same run as one that went through.
OPTIMIZER = OptimizerConfig(learning_rate=1e-2, warmup_steps=2, decay="constant")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
  """The tiny LM target as a trained model folder (model.gin + checkpoint_0)."""
  folder = tmp_path_factory.mktemp("target")
  pair = tiny_pair("lm")
  checkpoints.save_t5x(jax.device_get(pair.target_params), str(folder), step=0)
  (folder / "model.gin").write_text(model_gin_text(pair.target.config))
  return str(folder)


def _train(model_dir, target_dir, num_steps):
  config = TrainConfig(model_dir=str(model_dir), num_steps=num_steps, checkpoint_every=2,
                       log_every=1, progress=False)
  return train(HEAD, DATA, OPTIMIZER, config, feature=FeatureHeadTraining(target=target_dir))


def test_trains_resumes_exactly_and_decodes(tmp_path, target_dir):
  through = _train(tmp_path / "through", target_dir, 6)
  assert through.step == 6 and len(through.history) == 6
  losses = [r["loss"] for r in through.history]
  assert losses[-1] < losses[0], losses
  assert {"feature_loss", "accuracy", "teacher_tv"} <= set(through.history[-1])
  cut = _train(tmp_path / "cut", target_dir, 3)
  assert cut.step == 3
  resumed = _train(tmp_path / "cut", target_dir, 6)
  assert resumed.start_step == 3  # the cut run's final checkpoint (float32, with its optimizer)
  for a, b in zip(jax.tree.leaves(through.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(a, b)
  # The token ranking written beside model.gin: ids by their count among the trained-on
  # target tokens, most frequent first, ties by id (recounted here by hand).
  batches, _ = make_batches(DATA, tiny_pair("lm").target.config)
  feats = batches.features
  counted = collections.Counter(
      np.asarray(feats["decoder_target_tokens"])[np.asarray(feats["decoder_loss_weights"]) > 0]
      .tolist())
  expected = sorted(range(HEAD.vocab_size), key=lambda t: (-counted.get(t, 0), t))
  for folder in (tmp_path / "through", tmp_path / "cut" / "checkpoint_6"):
    np.testing.assert_array_equal(load_token_ranking(folder, HEAD.vocab_size), expected)
  assert load_token_ranking(target_dir, HEAD.vocab_size) is None
  np.save(tmp_path / "cut" / "token_ranking.npy", np.array(expected[:-1] + [expected[0]]))
  with pytest.raises(ValueError, match="must be a permutation of the token ids"):
    load_token_ranking(tmp_path / "cut", HEAD.vocab_size)
  # The head loads back (its model.gin) and drafts for the target it was trained for.
  head, params = load_head(tmp_path / "cut")
  assert head.config == HEAD
  pair = tiny_pair("lm")
  drafter = FeatureDrafter(pair.target, head, max_gamma=3)
  config = DecodeConfig(sampling=Sampling(temperature=0.0))
  prompts = np.array([[5, 7, 9, 11], [3, 4, 0, 0]], np.int32)
  result = speculative_decode(pair.target, pair.target_params, drafter,
                              drafter.params(params, pair.target_params), prompts,
                              max_new_tokens=8, gamma=3, rng=jax.random.PRNGKey(0), config=config)
  reference = autoregressive_decode(pair.target, pair.target_params, prompts, max_new_tokens=8,
                                    rng=jax.random.PRNGKey(0), config=config)
  np.testing.assert_array_equal(result.tokens, reference.tokens)


def test_a_head_folder_without_model_gin_is_refused(tmp_path, target_dir):
  _train(tmp_path / "head", target_dir, 1)
  (tmp_path / "head" / "model.gin").unlink()
  with pytest.raises(FileNotFoundError, match="feature head .*no model.gin"):
    load_head(tmp_path / "head")
  with pytest.raises(ValueError, match="describes a DecoderOnlyConfig, not a FeatureHeadConfig"):
    load_head(target_dir)


def test_a_target_of_another_size_is_refused_before_training(tmp_path, target_dir):
  wide = dataclasses.replace(HEAD, emb_dim=32)
  config = TrainConfig(model_dir=str(tmp_path / "wide"), num_steps=1, progress=False)
  with pytest.raises(ValueError, match="emb_dim 32 and vocab_size 8192.*emb_dim 16 and "
                                       "vocab_size 8192"):
    train(wide, DATA, OPTIMIZER, config, feature=FeatureHeadTraining(target=target_dir))
  assert not (tmp_path / "wide").exists()


def test_later_passes_read_the_heads_own_predicted_features():
  """passes = 2: the loss is the mean of pass 1 (true features in) and pass 2 (pass 1's
  predictions in), recomputed here from the head's forward directly."""
  from specjax.models import FeatureHead
  from specjax.models.feature_head import shift_features
  from specjax.train.feature_head import head_loss_sums, smooth_l1
  pair = tiny_pair("lm")
  head = FeatureHead(HEAD)
  params = head.init(jax.random.PRNGKey(1))
  tokens = np.array([[5, 7, 9, 11, 13, 2], [3, 4, 6, 8, 0, 0]], np.int32)
  batch = {"decoder_input_tokens": tokens, "decoder_loss_weights": (tokens > 0).astype(np.int32)}
  sums = {k: head_loss_sums(head, pair.target, params, pair.target_params, batch,
                            FeatureHeadTraining(target="t", passes=k)) for k in (1, 2)}
  logits, features = pair.target.features(pair.target_params, tokens)
  p = jax.nn.softmax(logits, axis=-1)
  embedded = pair.target.embed(pair.target_params, tokens)
  weights = batch["decoder_loss_weights"]

  def pass_loss(inputs):
    predicted = head.forward(params, shift_features(inputs), embedded)
    log_q = jax.nn.log_softmax(pair.target.feature_logits(pair.target_params, predicted), -1)
    loss = (smooth_l1(predicted - features).mean(-1) + 0.1 * -(p * log_q).sum(-1))
    return float((loss * weights).sum()), predicted, log_q

  first, predicted, _ = pass_loss(features)
  second, _, log_q = pass_loss(predicted)
  np.testing.assert_allclose(sums[1]["loss_sum"], first, rtol=1e-5)
  np.testing.assert_allclose(sums[2]["loss_sum"], (first + second) / 2, rtol=1e-5)
  assert abs(second - first) > 1e-3 * abs(first)  # pass 2 reads other inputs
  agree = (log_q.argmax(-1) == p.argmax(-1)) * weights
  np.testing.assert_allclose(sums[2]["fed_correct_sum"], float(agree.sum()))
  for name in ("ce_sum", "feature_sum", "correct_sum", "tv_sum"):  # pass 1's either way
    np.testing.assert_allclose(sums[2][name], sums[1][name], rtol=1e-6)
  assert "fed_correct_sum" not in sums[1]


@pytest.mark.parametrize("passes", [0, 1.0, True])
def test_bad_passes_are_named(passes):
  with pytest.raises(ValueError, match="passes must be an int >= 1"):
    FeatureHeadTraining(target="t", passes=passes)


def test_a_cross_attention_head_reads_the_targets_source():
  """A T5 target's head with cross_attention: the training loss is the head's forward over
  the target's last decoder layer's keys and values of the batch's source (recomputed here
  from `encode` directly), and another source gives another loss; a decoder-only target, or
  heads of another shape, are refused."""
  from specjax.models import FeatureHead
  from specjax.models.feature_head import shift_features
  from specjax.train.feature_head import head_loss_sums, smooth_l1
  pair = tiny_pair("t5")
  cfg = pair.target.config
  head = FeatureHead(FeatureHeadConfig(vocab_size=8192, emb_dim=cfg.emb_dim,
                                       num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                                       mlp_dim=32, cross_attention=True))
  head.check_target(pair.target)
  params = head.init(jax.random.PRNGKey(1))
  assert set(params["layers_0"]["encoder_decoder_attention"]) == {"query", "out"}
  source = np.array([[5, 7, 9, 1, 0], [3, 4, 1, 0, 0]], np.int32)
  tokens = np.array([[0, 11, 13, 2], [0, 6, 8, 0]], np.int32)
  batch = {"encoder_input_tokens": source, "decoder_input_tokens": tokens,
           "decoder_loss_weights": (tokens > 0).astype(np.int32)}
  training = FeatureHeadTraining(target="t")
  sums = head_loss_sums(head, pair.target, params, pair.target_params, batch, training)
  tp = pair.target_params
  logits, features = pair.target.features(tp, source, tokens)
  predicted = head.forward(params, shift_features(features), pair.target.embed(tp, tokens),
                           pair.target.encode(tp, source))
  log_q = jax.nn.log_softmax(pair.target.feature_logits(tp, predicted), -1)
  loss = (smooth_l1(predicted - features).mean(-1)
          + 0.1 * -(jax.nn.softmax(logits, -1) * log_q).sum(-1))
  np.testing.assert_allclose(sums["loss_sum"], float((loss * batch["decoder_loss_weights"]).sum()),
                             rtol=1e-5)
  # The same decoder tokens under another source: other keys and values, another loss.
  other = dict(batch, encoder_input_tokens=np.array([[8, 1, 0, 0, 0], [9, 9, 9, 1, 0]],
                                                    np.int32))
  moved = head_loss_sums(head, pair.target, params, pair.target_params, other, training)
  assert abs(float(moved["loss_sum"]) - float(sums["loss_sum"])) > 1e-4
  with pytest.raises(ValueError, match="needs encoded"):
    head.forward(params, shift_features(features), pair.target.embed(tp, tokens))
  lm = tiny_pair("lm").target
  with pytest.raises(ValueError, match="has none"):
    FeatureHead(dataclasses.replace(head.config, emb_dim=lm.feature_dim)).check_target(lm)
  narrow = FeatureHead(dataclasses.replace(head.config, num_heads=2))
  with pytest.raises(ValueError, match=f"num_heads {cfg.num_heads} and head_dim"):
    narrow.check_target(pair.target)
  with pytest.raises(ValueError, match="cross_attention must be True or False"):
    dataclasses.replace(head.config, cross_attention="yes")
