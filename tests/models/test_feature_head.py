"""Target features (the opt-in `decode_features` of both model families) and the feature head.

Features are checked two ways: the cached decode's equal the teacher-forced pass's, and the
logits equal the features times the output projection (with the model's scaling), computed
here in float64 numpy at the highest matmul precision.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import FeatureHead, FeatureHeadConfig, FeatureModel
from specjax.models.feature_head import shift_features
from specjax.models.tree import tree_call
from specjax.params import flatten
from specjax.testing import tiny_pair

TOKENS = np.array([[5, 7, 9, 11, 13, 2], [3, 4, 8, 1, 6, 9]], np.int32)


def _teacher_forced(pair, tokens):
  if pair.target.is_encoder_decoder:
    return pair.target.features(pair.target_params, tokens, tokens)
  return pair.target.features(pair.target_params, tokens)


@pytest.mark.parametrize("family", ["lm", "t5"])
def test_cached_features_equal_teacher_forced_and_give_the_logits(family):
  pair = tiny_pair(family)
  target, params = pair.target, pair.target_params
  assert isinstance(target, FeatureModel)
  with jax.default_matmul_precision("highest"):
    logits, features = _teacher_forced(pair, TOKENS)
    encoded = target.encode(params, TOKENS)
    cache = target.init_cache(2, 8)
    # Two chain calls of 4 and 2 tokens at per-row positions.
    first = target.decode_features(params, cache, TOKENS[:, :4], jnp.zeros(2, jnp.int32),
                                   encoded)
    second = target.decode_features(params, first[2], TOKENS[:, 4:], jnp.full(2, 4, jnp.int32),
                                    encoded)
    plain, _ = target.decode(params, cache, TOKENS[:, :4], jnp.zeros(2, jnp.int32), encoded)
  cached = np.concatenate([first[1], second[1]], axis=1)
  assert cached.shape == (2, 6, target.feature_dim)
  np.testing.assert_allclose(cached, features, atol=1e-5)
  np.testing.assert_array_equal(plain, first[0])  # the opt-in changes no logit
  f = np.asarray(features, np.float64)
  if target.config.logits_via_embedding:
    table = np.asarray(dict(flatten(params))["decoder/token_embedder/embedding"], np.float64)
    expected = f @ table.T / np.sqrt(target.config.emb_dim)
  else:
    name = "decoder/logits_dense/kernel"
    expected = f @ np.asarray(dict(flatten(params))[name], np.float64)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(target.feature_logits(params, features), expected, rtol=1e-5,
                             atol=1e-5)
  # Logits of the first K token ids only (a feature drafter's vocab_limit without a ranking),
  # and of chosen token ids (with a token ranking), in their order.
  for ids in (np.arange(100), np.array([700, 3, 8191, 42, 100])):
    np.testing.assert_allclose(target.rows_logits(target.output_rows(params, ids), features),
                               expected[..., ids], rtol=1e-5, atol=1e-5)
  for bad in ([3, 3], [-1], [target.vocab_size], [], [[1, 2]], [1.5]):
    with pytest.raises(ValueError, match="token_ids must be distinct token ids"):
      target.output_rows(params, np.array(bad))
  # A tree call returns the features of its nodes: the plain tree call's logits come from them.
  attention = tree_call(jnp.asarray([[-1, -1, 0]] * 2), jnp.asarray([[1, 1, 2]] * 2),
                        jnp.full(2, 2, jnp.int32))
  with jax.default_matmul_precision("highest"):
    start = target.decode(params, cache, TOKENS[:, :1], jnp.zeros(2, jnp.int32), encoded)[1]
    tree_logits, tree_features, _ = target.decode_features(
        params, start, TOKENS[:, 1:5], jnp.ones(2, jnp.int32), encoded, tree=attention)
    plain_tree, _ = target.decode(params, start, TOKENS[:, 1:5], jnp.ones(2, jnp.int32),
                                  encoded, tree=attention)
    np.testing.assert_array_equal(tree_logits, plain_tree)
    np.testing.assert_allclose(target.feature_logits(params, tree_features), tree_logits,
                               rtol=1e-5, atol=1e-5)


def _head(vocab=61, emb_dim=16, num_layers=1):
  return FeatureHead(FeatureHeadConfig(vocab_size=vocab, emb_dim=emb_dim, num_heads=2,
                                       head_dim=6, mlp_dim=24, num_layers=num_layers))


def test_head_params_hold_no_vocabulary_matrix_and_use_t5x_names():
  names = dict(flatten(_head(vocab=1000).init(0)))
  assert "input_projection/kernel" in names and "decoder_norm/scale" in names
  assert "layers_0/self_attention/query/kernel" in names
  assert all(1000 not in np.shape(v) for v in names.values())
  assert names["input_projection/kernel"].shape == (32, 16)
  assert not any(name.startswith("layers_1/") for name in names)
  deeper = dict(flatten(_head(vocab=1000, num_layers=2).init(0)))
  assert set(deeper) == set(names) | {name.replace("layers_0/", "layers_1/")
                                      for name in names if name.startswith("layers_0/")}


# With two layers the cache holds one key and value block per layer; a decode that read
# layer 0's cache in layer 1 (or wrote one block only) moves these values by far more than 1e-5.
@pytest.mark.parametrize("num_layers", [1, 2])
def test_head_cached_decode_equals_teacher_forced(num_layers):
  head = _head(num_layers=num_layers)
  params = head.init(1)
  features = jax.random.normal(jax.random.PRNGKey(2), (2, 7, 16))
  embedded = jax.random.normal(jax.random.PRNGKey(3), (2, 7, 16))
  whole = head.forward(params, shift_features(features), embedded)
  cache = head.init_cache(2, 12)
  assert len(cache.keys) == len(cache.values) == num_layers
  parts = []
  for begin, end in ((0, 3), (3, 4), (4, 7)):
    out, cache = head.decode(params, cache, shift_features(features)[:, begin:end],
                             embedded[:, begin:end], jnp.full(2, begin, jnp.int32))
    parts.append(out)
  np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, atol=1e-5)
  # A rolled-back position is overwritten before it is read.
  junk, stale = head.decode(params, cache, features[:, 5:7], embedded[:, 5:7] + 1.0,
                            jnp.full(2, 5, jnp.int32))
  again, _ = head.decode(params, stale, shift_features(features)[:, 5:7], embedded[:, 5:7],
                         jnp.full(2, 5, jnp.int32))
  np.testing.assert_allclose(again, whole[:, 5:7], atol=1e-5)
  assert not np.allclose(junk, whole[:, 5:7])


@pytest.mark.parametrize("field, value", [("emb_dim", 32), ("vocab_size", 100)])
def test_head_refuses_a_target_it_was_not_built_for(field, value):
  pair = tiny_pair("lm")
  sizes = {"vocab_size": pair.target.vocab_size, "emb_dim": pair.target.feature_dim}
  sizes[field] = value
  head = _head(vocab=sizes["vocab_size"], emb_dim=sizes["emb_dim"])
  with pytest.raises(ValueError, match=(f"emb_dim {sizes['emb_dim']} and vocab_size "
                                        f"{sizes['vocab_size']}.*emb_dim 16 and vocab_size "
                                        "8192")):
    head.check_target(pair.target)


def test_head_config_refuses_bad_sizes():
  with pytest.raises(ValueError, match="FeatureHeadConfig.num_heads"):
    FeatureHeadConfig(vocab_size=8, emb_dim=8, num_heads=0, head_dim=4, mlp_dim=8)
  with pytest.raises(ValueError, match="mlp_activations"):
    FeatureHeadConfig(vocab_size=8, emb_dim=8, num_heads=1, head_dim=4, mlp_dim=8,
                      mlp_activations="gelu")
