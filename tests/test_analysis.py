"""Tests for specjax.analysis against the paper's printed numbers."""
import numpy as np
import pytest

from specjax import analysis


# Paper Table 1 (c = ĉ = 0): α, γ, OPERATIONS, SPEED, printed to 2 decimals.
TABLE1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]

# Paper Table 4 (EnDe, T5-XXL target): draft, TEMP, γ, α, c, EXP (printed to 1 decimal),
# with the cost coefficients the paper measured (T5-small 0.02, T5-base 0.04).
TABLE4_ROWS = [
    ("T5-small", 0, 7, 0.75, 0.02, 3.2),
    ("T5-base", 0, 7, 0.80, 0.04, 3.3),
    ("T5-small", 1, 7, 0.62, 0.02, 2.3),
]


@pytest.mark.parametrize("alpha, gamma, ops, speed", TABLE1)
def test_table1(alpha, gamma, ops, speed):
  assert round(float(analysis.walltime_improvement(alpha, gamma, 0.0)), 2) == speed
  assert round(float(analysis.operations_factor(alpha, gamma, 0.0)), 2) == ops


@pytest.mark.parametrize("draft, temp, gamma, alpha, c, exp", TABLE4_ROWS)
def test_table4_exp_column(draft, temp, gamma, alpha, c, exp):
  assert round(float(analysis.walltime_improvement(alpha, gamma, c)), 1) == exp


def test_expected_tokens_limits_and_vectorization():
  np.testing.assert_allclose(analysis.expected_tokens([0.0, 1.0, 0.5], 3), [1.0, 4.0, 1.875])
  out = analysis.expected_tokens(np.full((2, 3), 0.8), np.array([1, 2, 3]))
  assert out.shape == (2, 3)
  np.testing.assert_allclose(out[0], [1.8, 2.44, 2.952])


def test_optimal_gamma_matches_brute_force_and_grows_with_alpha():
  alphas = np.linspace(0.05, 0.99, 40)
  for c in (0.01, 0.05, 0.2):
    best = analysis.optimal_gamma(alphas, c, max_gamma=30)
    for a, g in zip(alphas, best):
      scores = [analysis.walltime_improvement(a, k, c) for k in range(1, 31)]
      assert g == 1 + int(np.argmax(scores))
    assert np.all(np.diff(best) >= 0)


def test_acceptance_rate_and_divergence():
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.ones(10), size=5)
  q = rng.dirichlet(np.ones(10), size=5)
  alpha = analysis.acceptance_rate(p, q)
  np.testing.assert_allclose(analysis.divergence_lk(p, q), 1 - alpha)
  np.testing.assert_allclose(analysis.acceptance_rate(p, p), 1.0)
  np.testing.assert_allclose(analysis.lenient_acceptance_rate(p, q, 1.0), alpha)
  lenient = analysis.lenient_acceptance_rate(p, q, 0.5)
  assert np.all(lenient >= alpha) and np.all(lenient <= 1.0 + 1e-12)
  # Disjoint supports: nothing is ever accepted.
  assert analysis.acceptance_rate([1.0, 0.0], [0.0, 1.0]) == 0.0


@pytest.mark.parametrize("fn, args, name", [
    (analysis.expected_tokens, (0.5, 0), "gamma"),
    (analysis.expected_tokens, (1.5, 3), "alpha"),
    (analysis.walltime_improvement, (0.5, 3, -1.0), "c must"),
    (analysis.operations_factor, (0.5, 3, -1.0), "c_hat"),
    (analysis.optimal_gamma, (0.5, 0.1, 0), "max_gamma"),
    (analysis.lenient_acceptance_rate, ([1.0], [1.0], 0.0), "lenience"),
    (analysis.acceptance_rate, ([1.0, 0.0], [1.0]), "vocabulary"),
])
def test_bad_arguments(fn, args, name):
  with pytest.raises(ValueError, match=name):
    fn(*args)
