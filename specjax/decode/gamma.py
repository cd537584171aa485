"""γ policies: each row's number of guesses for its next round (data, never recompiled)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decode.config import DecodeConfig


def next_gamma(config: DecodeConfig, gamma: jax.Array, n: jax.Array, alpha: jax.Array,
               max_gamma: int) -> jax.Array:
  """Each row's γ for its next round under `config.gamma_policy`.

  gamma, n: int32 [B] (this round's γ and accepted count); alpha: float32 [B] (the
  row's running α estimate) -> int32 [B] in [1, max_gamma]. Under 'auto' γ passes
  through: that policy decides at the start of each round (`auto.choose_gamma`).
  """
  if config.gamma_policy == "heuristic":
    return jnp.clip(jnp.where(n >= gamma, gamma + 2, gamma - 1), 1, max_gamma)
  if config.gamma_policy == "optimal":
    a = jnp.clip(alpha, 0.0, 0.999)[:, None]  # [B, 1]
    g = jnp.arange(1, max_gamma + 1, dtype=jnp.float32)[None, :]  # [1, G]
    speed = (1 - a ** (g + 1)) / ((1 - a) * (g * config.cost_coefficient + 1))  # Thm 3.8
    return (jnp.argmax(speed, axis=1) + 1).astype(jnp.int32)
  return gamma
