"""Tests for specjax.sampling: standardized distributions and their properties."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.sampling import Sampling, categorical
from tests.conftest import SAMPLER_OPTIONS

LOGITS = jnp.array([[1.0, 3.0, 3.0, -2.0, 0.5, 2.0],
                    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])


def test_temperature_zero_is_one_hot_argmax_with_ties_to_lowest_id():
  probs = Sampling(temperature=0.0).probs(LOGITS)
  np.testing.assert_array_equal(np.argmax(probs, -1), [1, 0])
  np.testing.assert_allclose(probs.sum(-1), 1.0)
  assert set(np.unique(np.asarray(probs))) == {0.0, 1.0}
  tokens = Sampling(temperature=0.0).sample(jax.random.PRNGKey(0), LOGITS)
  np.testing.assert_array_equal(tokens, [1, 0])


def test_temperature_one_is_softmax_and_temperature_scales():
  np.testing.assert_allclose(Sampling().probs(LOGITS), jax.nn.softmax(LOGITS), rtol=1e-6)
  np.testing.assert_allclose(Sampling(temperature=0.5).probs(LOGITS),
                             jax.nn.softmax(LOGITS * 2), rtol=1e-6)


def test_top_k_keeps_exactly_k_and_top_one_equals_greedy():
  probs = Sampling(top_k=2).probs(LOGITS)
  assert list((np.asarray(probs) > 0).sum(-1)) == [2, 2]
  np.testing.assert_allclose(probs[0, [1, 2]], [0.5, 0.5], rtol=1e-6)
  np.testing.assert_allclose(probs[1, [0, 1]], [0.5, 0.5], rtol=1e-6)  # ties to low ids
  np.testing.assert_array_equal(Sampling(top_k=1).probs(LOGITS),
                                Sampling(temperature=0.0).probs(LOGITS))


def test_top_p_keeps_smallest_nucleus():
  logits = jnp.log(jnp.array([0.05, 0.5, 0.3, 0.15]))
  probs = Sampling(top_p=0.75).probs(logits)  # 0.5 + 0.3 reaches 0.75
  np.testing.assert_allclose(probs, [0, 0.5 / 0.8, 0.3 / 0.8, 0], rtol=1e-5)
  probs = Sampling(top_p=0.8).probs(logits)  # 0.5 + 0.3 = 0.8 is enough
  np.testing.assert_allclose(probs, [0, 0.5 / 0.8, 0.3 / 0.8, 0], rtol=1e-5)
  probs = Sampling(top_p=0.81).probs(logits)
  np.testing.assert_allclose(probs, [0, 0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95], rtol=1e-5)
  probs = Sampling(top_p=1e-6).probs(logits)  # tiny p keeps the argmax only
  np.testing.assert_allclose(probs, [0, 1, 0, 0])


def test_categorical_matches_weights():
  # 200k draws over 4 outcomes: sampling TV error ≈ 0.002; a wrong sampler
  # (e.g. one biased by 0.01 in TV) fails the 0.006 bound.
  weights = jnp.array([0.1, 0.0, 0.6, 0.3]) * 7.0  # unnormalized on purpose
  keys = jax.random.split(jax.random.PRNGKey(1), 200_000)
  draws = jax.vmap(categorical, in_axes=(0, None))(keys, weights)
  freq = np.bincount(np.asarray(draws), minlength=4) / draws.shape[0]
  assert freq[1] == 0
  assert 0.5 * np.abs(freq - np.array([0.1, 0, 0.6, 0.3])).sum() < 0.006


def test_categorical_over_blocks_matches_weights():
  """`categorical` draws a block of 128 ids by its mass, then an id inside it. Over V = 300
  (blocks 0-127, 128-255 and a ragged 256-299): 13 non-zero weights spread over the three
  blocks, one block with a single id, unnormalized, tiny and huge ones mixed. 400k draws:
  the expected TV sampling error is 0.0019 (13 outcomes); a sampler that chose blocks by
  their count of non-zero ids instead of their mass is off by 0.085, and one that skipped
  the ragged block by 0.18, both far past the 0.006 bound. Zero weights never come."""
  from specjax.sampling import CATEGORICAL_BLOCK
  assert CATEGORICAL_BLOCK == 128
  weights = np.zeros(300, np.float32)
  ids = [0, 5, 127, 128, 200, 201, 202, 203, 204, 255, 256, 299, 40]
  mass = np.array([3, 1e-3, 2, 5, 1, 1, 1, 1, 0.5, 4, 1.5, 2.5, 1e-30], np.float32)
  weights[ids] = mass * 1e3
  want = np.zeros(300)
  want[ids] = mass / mass.sum()
  keys = jax.random.split(jax.random.PRNGKey(2), 400_000)
  sample = jax.jit(jax.vmap(categorical, in_axes=(0, None)), compiler_options=SAMPLER_OPTIONS)
  draws = np.asarray(sample(keys, weights))
  freq = np.bincount(draws, minlength=300) / draws.shape[0]
  assert freq[weights == 0].sum() == 0
  assert 0.5 * np.abs(freq - want).sum() < 0.006
  # Batched weights with one key draw each row from its own weights; all-zero rows give 0.
  rows = np.stack([weights, np.zeros(300, np.float32), np.eye(300, dtype=np.float32)[299]])
  out = np.asarray(categorical(jax.random.PRNGKey(3), rows))
  assert weights[out[0]] > 0 and out[1] == 0 and out[2] == 299


@pytest.mark.parametrize("kwargs, name", [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=1.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
  with pytest.raises(ValueError, match=name):
    Sampling(**kwargs)


def test_argmax_is_first_max_or_first_nan_on_every_backend():
  """`sampling.argmax` has one meaning on every backend: the first maximum, the first NaN when
  there is one (before a +inf too), index 0 of an all -inf row. numpy's argmax is that meaning;
  `jnp.argmax` agrees where the backend's fused reduction does (rows without NaN)."""
  from specjax.sampling import argmax
  rng = np.random.default_rng(0)
  x = rng.normal(size=(4, 6, 300)).astype(np.float32)
  x[0, :, 7] = x[0, :, 3] = x[0].max(-1) + 1  # ties: the lower index wins
  x[1, 2, 5] = x[1, 2, 9] = np.nan  # NaN: the first NaN
  x[1, 3, 10], x[1, 3, 200] = np.inf, np.nan  # a NaN after a +inf still wins
  x[1, 4, 299] = np.nan  # a NaN in the last place
  x[2, 0] = -np.inf
  x[2, 1, [4, 8]] = np.inf
  x[2, 2, [6, 2]] = 0.0, -0.0  # -0.0 == +0.0: the first of the two
  x[2, 2, np.arange(300) > 6] = -1.0
  x[2, 2, :2] = x[2, 2, 3:6] = -1.0
  x[3] = np.round(x[3])  # many ties
  want = np.argmax(x, axis=-1)
  assert want[1, 2] == 5 and want[1, 3] == 200 and want[2, 0] == 0 and want[2, 2] == 2
  np.testing.assert_array_equal(np.asarray(argmax(jnp.asarray(x))), want)
  np.testing.assert_array_equal(np.asarray(jax.jit(argmax)(jnp.asarray(x))), want)
  np.testing.assert_array_equal(np.asarray(jax.jit(argmax)(jnp.asarray(x, jnp.bfloat16))),
                                np.argmax(np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32),
                                          axis=-1))
  no_nan = [0, 2, 3]
  np.testing.assert_array_equal(np.asarray(jax.jit(argmax)(jnp.asarray(x[no_nan]))),
                                np.asarray(jnp.argmax(jnp.asarray(x[no_nan]), axis=-1)))
  assert argmax(jnp.asarray(x)).dtype == jnp.int32
