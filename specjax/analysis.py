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


# ------------------------------------------- token vs block verification (Sun et al., ICLR 2025)


def _block_tables(p, q):
  """Checks per-position p [γ+1, V] (or [γ, V]) and q [γ, V]; returns float64 (p[:γ], q)."""
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  if q.ndim != 2 or q.shape[0] < 1:
    raise ValueError(f"q must have shape [gamma >= 1, V], got {q.shape}")
  gamma, vocab = q.shape
  if p.ndim != 2 or p.shape[1] != vocab or p.shape[0] not in (gamma, gamma + 1):
    raise ValueError(f"p must have shape [gamma+1={gamma + 1}, V={vocab}] (or [gamma, V]), "
                     f"got {p.shape}")
  for name, x in (("p", p), ("q", q)):
    if np.any(~np.isfinite(x)) or np.any(x < 0) or not np.allclose(x.sum(-1), 1.0, atol=1e-6):
      raise ValueError(f"{name} must hold probability rows (non-negative, summing to 1)")
  return p[:gamma], q


def expected_accepted_token(p, q) -> float:
  """Expected guesses accepted per round by token verification (Algorithm 1), exactly.

  For per-position (context-independent) laws, guess i is drafted from q_i and the
  target's law at position i is p_i. Algorithm 1 accepts at least k guesses with
  probability Π_{i≤k} β_i, β_i = Σ_x min(p_i(x), q_i(x)) (Thm 3.5), so the expectation is
  Σ_{k=1}^{γ} Π_{i≤k} β_i (closed form; Eq. 1 minus one when all β_i = α).

  Args:
    p: [γ+1, V] the target's law per position (the last row does not affect the count;
      [γ, V] is accepted too).
    q: [γ, V] the draft's law per position.
  Returns:
    E[n] in [0, γ]; tokens per target call are E[n] + 1.
  """
  p, q = _block_tables(p, q)
  return float(np.cumprod(np.minimum(p, q).sum(-1)).sum())


def expected_accepted_block(p, q, max_states: int = 1 << 22) -> float:
  """Expected guesses accepted per round by block verification (`specjax.block_verify`), exactly.

  Same setting as `expected_accepted_token`. Block verification accepts at least i
  guesses with probability w_i(x_1..x_i) given the drafted prefix, where w_0 = 1,
  w_i = min(1, w_{i-1} p_i(x_i)/q_i(x_i)) (see `specjax.block_verify`), so
  E[τ] = Σ_{i=1}^{γ} E_{x ~ q}[w_i]. Computed by an exact forward pass over the
  distribution of w_i: w_{i+1} depends on the prefix only through w_i, so prefixes with
  equal w_i are merged (float64; the capped value 1 merges many of them). Step i
  handles (distinct w_{i-1} values) × V candidates, at most V^i; more than `max_states`
  raises ValueError (small V and γ: V^γ ≤ max_states always works).

  Args:
    p: [γ+1, V] (or [γ, V]) the target's law per position.
    q: [γ, V] the draft's law per position.
    max_states: the most candidates (distinct w values × drafted tokens) one step may handle.
  Returns:
    E[τ] in [0, γ]; never below `expected_accepted_token(p, q)`.
  """
  p, q = _block_tables(p, q)
  values, mass = np.ones(1), np.ones(1)  # the law of w_i: distinct values and their mass
  total = 0.0
  for p_i, q_i in zip(p, q):
    drafted = q_i > 0  # tokens the draft never proposes carry no mass
    if len(values) * int(drafted.sum()) > max_states:
      raise ValueError(f"expected_accepted_block: {len(values)} distinct w values times "
                       f"{int(drafted.sum())} drafted tokens exceed max_states={max_states}; "
                       "use a smaller vocabulary or gamma")
    ratio = p_i[drafted] / q_i[drafted]
    new = np.minimum(values[:, None] * ratio[None, :], 1.0).ravel()
    new_mass = (mass[:, None] * q_i[drafted][None, :]).ravel()
    values, inverse = np.unique(new, return_inverse=True)
    mass = np.bincount(inverse.ravel(), weights=new_mass, minlength=len(values))
    total += float(np.dot(values, mass))
  return total
