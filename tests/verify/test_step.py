"""Exactness tests for the accept/reject step (Algorithm 1) and lenience (A.5).

Power: with V = 8 and N = 200,000 vmapped samples the sampling error of the
empirical distribution is about 0.0025 in total variation at worst (uniform p),
so the 0.006 bound passes for a correct step and fails for a step whose output
distribution is off by 0.01 or more in total variation.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import analysis
from specjax.sampling import Sampling
from specjax.verify import argmax_lenient_step, speculative_step
from tests.conftest import SAMPLER_OPTIONS

V = 8
GAMMA = 3
N = 200_000
TV_BOUND = 0.006
NEG = -1e4  # a logit whose probability is exactly 0 in float32


def _logits(probs):
  probs = np.asarray(probs, np.float64)
  return np.where(probs > 0, np.log(np.maximum(probs, 1e-300)), NEG).astype(np.float32)


def _pairs():
  """(name, p logits [V], q logits [V]) including adversarial pairs."""
  rng = np.random.default_rng(0)
  rand = lambda: rng.normal(size=V).astype(np.float32) * 1.5
  first_half = np.array([1, 1, 1, 1, 0, 0, 0, 0]) / 4
  second_half = np.array([0, 0, 0, 0, 1, 1, 1, 1]) / 4
  one_hot = lambda i: np.eye(V)[i]
  p_rand = rand()
  near_zero_q = np.full(V, 1 / V)
  near_zero_q[2] = 1e-7  # q nearly never proposes token 2 ...
  p_peaked = np.full(V, 0.02)
  p_peaked[2] = 1 - 0.02 * (V - 1)  # ... which the target loves
  return [
      ("random", rand(), rand()),
      ("disjoint_supports", _logits(first_half), _logits(second_half)),
      ("q_one_hot", rand(), _logits(one_hot(5))),
      ("q_one_hot_outside_p", _logits(first_half), _logits(one_hot(6))),
      ("p_one_hot", _logits(one_hot(3)), rand()),
      ("q_equals_p", p_rand, p_rand),
      ("near_zero_q", _logits(p_peaked), _logits(near_zero_q)),
      ("both_one_hot_same", _logits(one_hot(1)), _logits(one_hot(1))),
      ("uniform_p_peaked_q", np.zeros(V, np.float32), rand() * 4),
  ]


SAMPLINGS = {
    "argmax": Sampling(temperature=0.0),
    "temperature": Sampling(temperature=0.7),
    "top_k": Sampling(top_k=3),
    "top_p": Sampling(top_p=0.8),
}


@functools.partial(jax.jit, static_argnames=("lenience",), compiler_options=SAMPLER_OPTIONS)
def _first_tokens(key, target_probs, draft_probs, lenience=1.0):
  """N rows: draft γ tokens from q, verify, return (first emitted token, n accepted)."""
  keys = jax.random.split(key, N)

  def row(k):
    draft_key, step_key = jax.random.split(k)
    draft_keys = jax.random.split(draft_key, GAMMA)
    tokens = jax.vmap(lambda dk, q: jax.random.categorical(dk, jnp.log(q)))(
        draft_keys, draft_probs).astype(jnp.int32)
    n, nxt = speculative_step(step_key, tokens, draft_probs, target_probs, lenience=lenience)
    return jnp.where(n > 0, tokens[0], nxt), n

  return jax.vmap(row)(keys)


def _tv(samples, probs):
  freq = np.bincount(np.asarray(samples), minlength=V) / len(samples)
  return 0.5 * np.abs(freq - np.asarray(probs, np.float64)).sum()


def _tables(p_logits, q_logits, sampling, seed):
  """Target [γ+1, V] and draft [γ, V] tables: position 1 is the pair, the rest random."""
  rng = np.random.default_rng(seed)
  p = np.stack([p_logits] + [rng.normal(size=V).astype(np.float32) for _ in range(GAMMA)])
  q = np.stack([q_logits] + [rng.normal(size=V).astype(np.float32) for _ in range(GAMMA - 1)])
  return sampling.probs(jnp.asarray(p)), sampling.probs(jnp.asarray(q))


@pytest.mark.parametrize("sampling_name", list(SAMPLINGS))
def test_first_token_is_distributed_as_target(sampling_name):
  sampling = SAMPLINGS[sampling_name]
  for i, (name, p_logits, q_logits) in enumerate(_pairs()):
    target, draft = _tables(p_logits, q_logits, sampling, seed=i)
    tokens, _ = _first_tokens(jax.random.PRNGKey(100 + i), target, draft)
    tv = _tv(tokens, target[0])
    assert tv < TV_BOUND, f"{sampling_name}/{name}: TV {tv:.4f} from the target"


def test_a_biased_step_would_fail_the_bound():
  # The power claim, checked: the draft's own distribution is ≥ 0.01 away in TV
  # from the target for the random pair, and the same statistic sees it.
  name, p_logits, q_logits = _pairs()[0]
  target, draft = _tables(p_logits, q_logits, Sampling(), seed=0)
  keys = jax.random.split(jax.random.PRNGKey(7), N)
  drafted = jax.vmap(lambda k: jax.random.categorical(k, jnp.log(draft[0])))(keys)
  assert _tv(drafted, target[0]) > 0.01


def test_accepted_count_follows_capped_geometric_law():
  gamma = 4
  rng = np.random.default_rng(3)
  p = jax.nn.softmax(jnp.asarray(rng.normal(size=V), jnp.float32))
  q = jax.nn.softmax(jnp.asarray(rng.normal(size=V), jnp.float32))
  alpha = float(analysis.acceptance_rate(p, q))
  target = jnp.tile(p, (gamma + 1, 1))
  draft = jnp.tile(q, (gamma, 1))
  keys = jax.random.split(jax.random.PRNGKey(11), N)

  def row(k):
    dk, sk = jax.random.split(k)
    tokens = jax.random.categorical(dk, jnp.log(draft)).astype(jnp.int32)
    return speculative_step(sk, tokens, draft, target)[0]

  sample = jax.jit(jax.vmap(row), compiler_options=SAMPLER_OPTIONS)
  counts = np.bincount(np.asarray(sample(keys)), minlength=gamma + 1) / N
  law = np.array([alpha ** k * (1 - alpha) for k in range(gamma)] + [alpha ** gamma])
  assert 0.5 * np.abs(counts - law).sum() < TV_BOUND
  mean_tokens = (counts * np.arange(1, gamma + 2)).sum()
  np.testing.assert_allclose(mean_tokens, analysis.expected_tokens(alpha, gamma), rtol=0.01)


def test_lenience_bounds_each_token_and_raises_alpha():
  lenience = 0.5
  p = np.array([0.1, 0.3, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05])
  q = np.array([0.9, 0.02, 0.02, 0.02, 0.01, 0.01, 0.01, 0.01])
  target = jnp.asarray(np.tile(p, (GAMMA + 1, 1)), jnp.float32)
  draft = jnp.asarray(np.tile(q, (GAMMA, 1)), jnp.float32)
  tokens, n = _first_tokens(jax.random.PRNGKey(5), target, draft, lenience=lenience)
  freq = np.bincount(np.asarray(tokens), minlength=V) / N
  assert np.all(freq <= p / lenience + 0.005), (freq, p / lenience)
  # The exact lenient law: accepted part q·min(1, p/(l q)) plus the residual's share.
  alpha_l = float(analysis.lenient_acceptance_rate(p, q, lenience))
  residual = np.maximum(p - lenience * q, 0)
  law = q * np.minimum(1, p / (lenience * q)) + (1 - alpha_l) * residual / residual.sum()
  assert 0.5 * np.abs(freq - law).sum() < TV_BOUND
  accept_rate = float(np.mean(np.asarray(n) > 0))
  np.testing.assert_allclose(accept_rate, alpha_l, atol=0.005)
  assert alpha_l > float(analysis.acceptance_rate(p, q)) + 0.05


def test_lenience_one_is_algorithm_one():
  target, draft = _tables(*_pairs()[0][1:], Sampling(), seed=0)
  a = _first_tokens(jax.random.PRNGKey(9), target, draft, lenience=1.0)
  b = _first_tokens(jax.random.PRNGKey(9), target, draft)
  np.testing.assert_array_equal(a[0], b[0])
  assert _tv(a[0], target[0]) < TV_BOUND


def test_argmax_lenience():
  probs = jnp.array([[0.5, 0.4, 0.1], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4], [0.1, 0.1, 0.8]])
  guesses = jnp.array([1, 2, 0], jnp.int32)
  n, nxt = argmax_lenient_step(guesses, probs, lenience=1.0)  # greedy: 1 != argmax 0
  assert (int(n), int(nxt)) == (0, 0)
  n, nxt = argmax_lenient_step(guesses, probs, lenience=0.8)  # 0.4 >= 0.8*0.5; 0.6 top; 0.3 < 0.32
  assert (int(n), int(nxt)) == (2, 2)
  n, nxt = argmax_lenient_step(guesses, probs, lenience=0.5)  # all three pass
  assert (int(n), int(nxt)) == (3, 2)
  # Ties at l = 1 follow argmax's lowest id, so only an exact greedy guess is kept.
  tie = jnp.array([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
  assert int(argmax_lenient_step(jnp.array([1]), tie)[0]) == 0
  assert int(argmax_lenient_step(jnp.array([0]), tie)[0]) == 1


def test_no_nan_on_degenerate_inputs():
  one_hot = jnp.eye(V)
  cases = [
      (jnp.array([2, 2, 2]), jnp.tile(one_hot[2], (3, 1)), jnp.tile(one_hot[2], (4, 1))),  # p == q one-hot
      (jnp.array([5, 1, 1]), jnp.tile(one_hot[1], (3, 1)), jnp.tile(one_hot[4], (4, 1))),  # q(x)=0, p(x)=0
      (jnp.array([0, 0, 0]), jnp.full((3, V), 1 / V), jnp.full((4, V), 1 / V)),  # p == q uniform
  ]
  with jax.debug_nans(True):
    for tokens, q, p in cases:
      n, nxt = speculative_step(jax.random.PRNGKey(0), tokens.astype(jnp.int32), q, p)
      assert 0 <= int(n) <= GAMMA and 0 <= int(nxt) < V
  tokens, q, p = cases[0]
  assert int(speculative_step(jax.random.PRNGKey(0), tokens.astype(jnp.int32), q, p)[0]) == 3
  tokens, q, p = cases[1]
  n, nxt = speculative_step(jax.random.PRNGKey(0), tokens.astype(jnp.int32), q, p)
  assert (int(n), int(nxt)) == (0, 4)


@pytest.mark.parametrize("tokens, q, p, kwargs, name", [
    (np.zeros(0, np.int32), np.zeros((0, V)), np.zeros((1, V)), {}, "gamma"),
    (np.zeros(3, np.int32), np.zeros((2, V)), np.zeros((4, V)), {}, "draft_probs"),
    (np.zeros(3, np.int32), np.zeros((3, V)), np.zeros((3, V)), {}, "target_probs"),
    (np.zeros(3, np.int32), np.zeros((3, V)), np.zeros((4, V + 1)), {}, "target_probs"),
    (np.zeros((2, 3), np.int32), np.zeros((3, V)), np.zeros((4, V)), {}, "draft_tokens"),
    (np.zeros(3, np.int32), np.zeros((3, V)), np.zeros((4, V)), {"lenience": 0.0}, "lenience"),
    (np.zeros(3, np.int32), np.zeros((3, V)), np.zeros((4, V)), {"lenience": 1.5}, "lenience"),
])
def test_bad_arguments(tokens, q, p, kwargs, name):
  with pytest.raises(ValueError, match=name):
    speculative_step(jax.random.PRNGKey(0), jnp.asarray(tokens), jnp.asarray(q), jnp.asarray(p),
                     **kwargs)


def test_first_token_is_distributed_as_target_over_several_blocks():
  """The same law with V = 300, where `categorical` draws the correction in two races (blocks
  0-127, 128-255 and a ragged 256-299). p and q put their mass on 12 ids across the three
  blocks, with all of the residual max(0, p − q) in the ragged block. 200k rows, 12
  outcomes: the expected TV sampling error is 0.0027; drawing the correction from p instead
  of the residual (which is what a sampler blind to the ragged block would fall back to) is
  off by 0.196, against the 0.006 bound."""
  vocab, ids = 300, np.array([3, 60, 127, 128, 130, 200, 255, 256, 270, 290, 299, 17])
  p_mass = np.array([0.05, 0.05, 0.02, 0.1, 0.05, 0.03, 0.02, 0.2, 0.15, 0.13, 0.15, 0.05])
  q_mass = np.array([0.2, 0.15, 0.1, 0.2, 0.1, 0.05, 0.05, 0.02, 0.03, 0.02, 0.03, 0.05])
  p, q = np.zeros(vocab), np.zeros(vocab)
  p[ids], q[ids] = p_mass, q_mass
  rng = np.random.default_rng(3)
  rest = lambda n: np.array(jax.nn.softmax(rng.normal(size=(n, vocab)), -1))
  target = jnp.asarray(np.concatenate([p[None], rest(GAMMA)]), jnp.float32)  # [γ+1, V]
  draft = jnp.asarray(np.concatenate([q[None], rest(GAMMA - 1)]), jnp.float32)  # [γ, V]

  @functools.partial(jax.jit, compiler_options=SAMPLER_OPTIONS)
  def first(key):
    def row(k):
      draft_key, step_key = jax.random.split(k)
      tokens = jax.vmap(lambda dk, qi: jax.random.categorical(dk, jnp.log(qi)))(
          jax.random.split(draft_key, GAMMA), draft).astype(jnp.int32)
      n, nxt = speculative_step(step_key, tokens, draft, target)
      return jnp.where(n > 0, tokens[0], nxt)
    return jax.vmap(row)(jax.random.split(key, N))

  freq = np.bincount(np.asarray(first(jax.random.PRNGKey(11))), minlength=vocab) / N
  assert freq[p == 0].sum() == 0
  assert 0.5 * np.abs(freq - p).sum() < TV_BOUND
