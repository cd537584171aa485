"""Hierarchical drafting: three models, still exact for the target."""
import collections

import jax
import numpy as np

from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.draft import ModelDrafter
from specjax.draft import HierarchicalDrafter
from specjax.sampling import Sampling
from specjax.testing import TableModel, exact_joint, random_table

V = 4


def _drafter(max_gamma=4):
  return HierarchicalDrafter(medium=TableModel(V), inner=ModelDrafter(TableModel(V), 3, window=3),
                             max_gamma=max_gamma, inner_gamma=2)


def test_hierarchical_joint_is_exact():
  # Power as in tests/decode/test_decoding.py: 64 outcomes, 400k rows, sampling TV ≈ 0.004.
  target, medium, small = random_table(1, V), random_table(2, V, 1.0), random_table(3, V, 0.5)
  rows = 400_000
  result = speculative_decode(TableModel(V), target, _drafter(), {"medium": medium, "inner": small},
                              np.array([[2, 3]] * rows, np.int32), max_new_tokens=3, gamma=3,
                              rng=jax.random.PRNGKey(0), config=DecodeConfig(eos_id=-1, cache_len=24))
  counts = collections.Counter(map(tuple, np.asarray(result.tokens).tolist()))
  law = exact_joint(np.asarray(target), Sampling(), [2, 3], 3)
  assert 0.5 * sum(abs(counts.get(k, 0) / rows - p) for k, p in law.items()) < 0.01


def test_hierarchical_greedy_equals_autoregressive():
  target, medium, small = random_table(1, V), random_table(2, V, 1.0), random_table(3, V, 0.5)
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 7, size=16)
  prompts = np.zeros((16, 6), np.int32)
  for b, n in enumerate(lengths):
    prompts[b, :n] = rng.integers(1, V, size=n)
  config = DecodeConfig(sampling=Sampling(temperature=0.0), cache_len=64)
  reference = autoregressive_decode(TableModel(V), target, prompts, max_new_tokens=25,
                                    rng=jax.random.PRNGKey(0), config=config, prompt_lengths=lengths)
  for gamma in (1, 3, 4):
    result = speculative_decode(TableModel(V), target, _drafter(), {"medium": medium, "inner": small},
                                prompts, max_new_tokens=25, gamma=gamma, rng=jax.random.PRNGKey(0),
                                config=config, prompt_lengths=lengths)
    np.testing.assert_array_equal(result.tokens, reference.tokens)
    np.testing.assert_array_equal(result.lengths, reference.lengths)
