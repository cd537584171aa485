"""The target's hidden states of chosen layers (`feature_layers`) and the EAGLE-3 head that
fuses them: what the models return, the head's fusion, and its training-time-test rollout
equal to the cached chain a drafter runs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import FeatureHead, FeatureHeadConfig
from specjax.models.feature_head import shift_features
from specjax.models.protocol import check_feature_layers, eagle3_feature_layers
from specjax.testing import tiny_pair


def _teacher_forced(pair, tokens, **kwargs):
  target, params = pair.target, pair.target_params
  if target.is_encoder_decoder:
    source = np.array([[5, 7, 9, 1]] * tokens.shape[0], np.int32)
    return target.features(params, source, tokens, **kwargs), target.encode(params, source)
  return target.features(params, tokens, **kwargs), None


@pytest.mark.parametrize("family", ["lm", "t5"])
def test_layer_features_are_the_hidden_states_teacher_forced_and_cached(family):
  pair = tiny_pair(family)
  target, params = pair.target, pair.target_params
  depth = target.num_feature_layers
  width = target.feature_dim
  tokens = np.array([[0, 5, 7, 9, 11, 13]], np.int32)
  (logits, final), encoded = _teacher_forced(pair, tokens)
  layers = tuple(range(depth, -1, -1))  # the final hidden state first, then layers L-1 .. 0
  (same_logits, hidden), _ = _teacher_forced(pair, tokens, feature_layers=layers)
  assert hidden.shape == (1, tokens.shape[1], (depth + 1) * width)
  np.testing.assert_array_equal(same_logits, logits)
  np.testing.assert_array_equal(hidden[..., :width], final)
  # Each layer's output differs from the others' (the blocks are not one state repeated).
  blocks = [hidden[..., i * width:(i + 1) * width] for i in range(depth + 1)]
  assert all(float(jnp.abs(a - b).max()) > 1e-3 for a, b in zip(blocks, blocks[1:]))
  # A cached chain call returns the same hidden states, over two calls.
  cache = target.init_cache(1, 8)
  first, second = tokens[:, :4], tokens[:, 4:]
  outs = []
  for chunk, start in ((first, 0), (second, 4)):
    _, feats, cache = target.decode_features(params, cache, chunk,
                                             jnp.full((1,), start, jnp.int32), encoded,
                                             feature_layers=layers)
    outs.append(feats)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), hidden, atol=2e-5)


class _FinalFeaturesOnly:
  """A `FeatureModel` that returns its final features only (no `num_feature_layers`)."""

  def __init__(self, model):
    self._model = model
    self.vocab_size, self.feature_dim = model.vocab_size, model.feature_dim
    self.is_encoder_decoder = model.is_encoder_decoder
    self.encode, self.init_cache, self.decode = model.encode, model.init_cache, model.decode
    self.embed, self.feature_logits = model.embed, model.feature_logits

  def decode_features(self, params, cache, tokens, positions, encoded, *, tree=None):
    return self._model.decode_features(params, cache, tokens, positions, encoded, tree=tree)


def test_feature_layers_are_checked_and_eagle3_picks_low_middle_and_final():
  assert eagle3_feature_layers(6) == (1, 2, 6)
  assert eagle3_feature_layers(3) == (0, 1, 3)
  assert eagle3_feature_layers(32) == (1, 15, 32)
  assert eagle3_feature_layers(1) == (0, 1)
  for bad in ((), (0, 0), (0, 3), (-1,), "12", (1.0,), (True,)):
    with pytest.raises(ValueError, match="feature_layers must be"):
      check_feature_layers(bad, 2)
  pair = tiny_pair("lm")
  tokens = np.array([[5, 7]], np.int32)
  with pytest.raises(ValueError, match=r"distinct layer indices in \[0, 1\]"):
    pair.target.features(pair.target_params, tokens, feature_layers=(0, 2))
  head = FeatureHead(FeatureHeadConfig(vocab_size=pair.target.vocab_size, emb_dim=16,
                                       num_heads=2, head_dim=8, mlp_dim=32,
                                       feature_layers=(0, 2)))
  with pytest.raises(ValueError, match=r"layers \(0, 2\).*has 1 decoder layers"):
    head.check_target(pair.target)
  with pytest.raises(ValueError, match="returns its final features only"):
    head.check_target(_FinalFeaturesOnly(pair.target))
  with pytest.raises(ValueError, match="FeatureHeadConfig.feature_layers must be"):
    FeatureHeadConfig(vocab_size=8, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                      feature_layers=(1, 1))


def _head(pair, layers, cross=False, seed=2, num_layers=1):
  cfg = pair.target.config
  heads = (cfg.num_heads, cfg.head_dim) if cross else (2, 8)
  head = FeatureHead(FeatureHeadConfig(vocab_size=pair.target.vocab_size,
                                       emb_dim=pair.target.feature_dim, num_heads=heads[0],
                                       head_dim=heads[1], mlp_dim=32, cross_attention=cross,
                                       feature_layers=layers, num_layers=num_layers))
  return head, head.init(seed)


def test_head_fuses_its_layers_with_one_projection_and_eagle1_heads_keep_their_tree():
  pair = tiny_pair("lm")
  head, params = _head(pair, (0, 1))
  assert params["feature_fusion"]["kernel"].shape == (2 * 16, 16)
  hidden = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 32))
  np.testing.assert_allclose(head.fuse_layers(params, hidden),
                             hidden @ params["feature_fusion"]["kernel"], rtol=1e-5, atol=1e-6)
  plain, plain_params = _head(pair, None)
  assert "feature_fusion" not in plain_params and plain.config.feature_width == 16
  np.testing.assert_array_equal(plain.fuse_layers(plain_params, hidden[..., :16]),
                                hidden[..., :16])
  # Without feature_layers the parameters are those of a head built before they existed.
  same = {k: v for k, v in params.items() if k != "feature_fusion"}
  assert jax.tree.structure(same) == jax.tree.structure(plain_params)


# The rollout (training-time test) against what a drafter computes: a committed prefix fed
# with the target's true fused features through the head's cache, then k guesses each fed the
# head's previous prediction. Step k at position p of the rollout must equal the k-th guess
# after the prefix 0 .. p - k, for every p >= k (a mask that let step k see its own
# step-(k-1) keys at other positions, or the true features past p - k, moves these values by
# about 0.1-1, measured while writing this test). The cross-attending head has two layers:
# each keeps its own cache in the rollout as in a decode.
@pytest.mark.parametrize("family", ["lm", "t5_cross"])
def test_rollout_step_k_is_the_chains_kth_guess_on_its_own_predictions(family):
  pair = tiny_pair("lm" if family == "lm" else "t5")
  depth = pair.target.num_feature_layers
  head, params = _head(pair, tuple(range(depth + 1)), cross=family == "t5_cross",
                       num_layers=2 if family == "t5_cross" else 1)
  tokens = np.array([[0, 5, 7, 9, 11, 13, 4]], np.int32)
  (_, hidden), encoded = _teacher_forced(pair, tokens,
                                         feature_layers=head.config.feature_layers)
  fused = head.fuse_layers(params, hidden)
  embedded = pair.target.embed(pair.target_params, tokens)
  steps = 3
  e_src = encoded if head.config.cross_attention else None
  rolled = jax.jit(head.rollout, static_argnums=3)(params, shift_features(fused), embedded,
                                                   steps, e_src)
  forward = head.forward(params, shift_features(fused), embedded, e_src)
  np.testing.assert_allclose(rolled[0], forward, atol=2e-5)
  length = tokens.shape[1]
  for k in range(1, steps):
    for p in range(k, length):
      cache = head.init_cache(1, 16)
      committed = p - k + 1
      out, cache = head.decode(params, cache, shift_features(fused)[:, :committed],
                               embedded[:, :committed], jnp.zeros((1,), jnp.int32),
                               encoded=e_src)
      guess = out[:, -1:]
      for j in range(1, k + 1):
        at = p - k + j
        guess, cache = head.decode(params, cache, guess, embedded[:, at:at + 1],
                                   jnp.full((1,), at, jnp.int32), encoded=e_src)
      np.testing.assert_allclose(rolled[k, 0, p], guess[0, 0], atol=2e-5,
                                 err_msg=f"step {k} position {p}")
    # Power: the k-th guess differs from the teacher-forced prediction there.
    assert float(jnp.abs(rolled[k, 0, k:] - rolled[0, 0, k:]).max()) > 1e-2
