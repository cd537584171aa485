"""The paper's theory as vectorized functions (numpy; broadcast over leading axes).

Notation (Leviathan et al. 2023): α is the acceptance rate E[β], γ the number of
guesses per round, c the cost of one draft step relative to one target step
(walltime), ĉ the same ratio in arithmetic operations.
"""
from __future__ import annotations

import numpy as np


def _alpha(alpha) -> np.ndarray:
  alpha = np.asarray(alpha, dtype=np.float64)
  if np.any((alpha < 0) | (alpha > 1)) or np.any(np.isnan(alpha)):
    raise ValueError(f"alpha must be in [0, 1], got {alpha}")
  return alpha


def _gamma(gamma) -> np.ndarray:
  gamma = np.asarray(gamma)
  if np.any(gamma < 1):
    raise ValueError(f"gamma must be >= 1, got {gamma}")
  return gamma.astype(np.float64)


def expected_tokens(alpha, gamma) -> np.ndarray:
  """Eq. 1: expected tokens per round, (1 − α^{γ+1}) / (1 − α); γ+1 at α = 1."""
  alpha, gamma = np.broadcast_arrays(_alpha(alpha), _gamma(gamma))
  one = alpha >= 1.0
  safe = np.where(one, 0.5, alpha)
  return np.where(one, gamma + 1, (1 - safe ** (gamma + 1)) / (1 - safe))


def walltime_improvement(alpha, gamma, c) -> np.ndarray:
  """Thm 3.8: expected speedup, (1 − α^{γ+1}) / ((1 − α)(γc + 1))."""
  c = np.asarray(c, dtype=np.float64)
  if np.any(c < 0):
    raise ValueError(f"c must be >= 0, got {c}")
  return expected_tokens(alpha, gamma) / (_gamma(gamma) * c + 1)


def operations_factor(alpha, gamma, c_hat) -> np.ndarray:
  """Thm 3.11: expected factor of arithmetic operations, (1 − α)(γĉ + γ + 1) / (1 − α^{γ+1})."""
  c_hat = np.asarray(c_hat, dtype=np.float64)
  if np.any(c_hat < 0):
    raise ValueError(f"c_hat must be >= 0, got {c_hat}")
  gamma = _gamma(gamma)
  return (gamma * c_hat + gamma + 1) / expected_tokens(alpha, gamma)


def optimal_gamma(alpha, c, max_gamma: int = 32) -> np.ndarray:
  """§3.5: the integer γ in [1, max_gamma] maximizing `walltime_improvement`."""
  if max_gamma < 1:
    raise ValueError(f"max_gamma must be >= 1, got {max_gamma}")
  alpha = _alpha(alpha)[..., None]
  c = np.asarray(c, dtype=np.float64)[..., None]
  gammas = np.arange(1, max_gamma + 1)
  return gammas[np.argmax(walltime_improvement(alpha, gammas, c), axis=-1)]


def acceptance_rate(p, q) -> np.ndarray:
  """Cor. 3.6 / Thm 3.5: α = Σ_x min(p(x), q(x)). p, q: [..., V] -> [...]."""
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  _check_dists(p, q)
  return np.minimum(p, q).sum(-1)


def lenient_acceptance_rate(p, q, lenience) -> np.ndarray:
  """A.5: α with lenience l, Σ_x min(p(x)/l, q(x)). p, q: [..., V] -> [...]."""
  if not 0 < lenience <= 1:
    raise ValueError(f"lenience must be in (0, 1], got {lenience}")
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  _check_dists(p, q)
  return np.minimum(p / lenience, q).sum(-1)


def divergence_lk(p, q) -> np.ndarray:
  """Def. 3.2: D_LK(p, q) = Σ_x |p(x) − M(x)| with M = (p + q)/2; equals 1 − α."""
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  _check_dists(p, q)
  return np.abs(p - (p + q) / 2).sum(-1)


def _check_dists(p: np.ndarray, q: np.ndarray) -> None:
  if p.shape[-1] != q.shape[-1]:
    raise ValueError(f"p and q must share the vocabulary axis, got shapes {p.shape} and {q.shape}")
