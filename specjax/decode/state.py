"""What the decode loops carry and return: loop state, per-round trace, result."""
from __future__ import annotations

from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specjax.decode.auto import AutoControl


@flax.struct.dataclass
class Trace:
  """Per-round record of a speculative generation (rounds beyond `target_calls` are 0)."""

  guesses: jax.Array  # int32 [B, R, max_gamma]: the drafted tokens of round r
  accepted: jax.Array  # int32 [B, R]: guesses accepted in round r
  correction: jax.Array  # int32 [B, R]: the token the target drew after them
  gamma: jax.Array  # int32 [B, R]: guesses offered in round r (a row's γ may adapt)


@flax.struct.dataclass
class DecodeResult:
  """Tokens and per-row statistics of one generation."""

  tokens: jax.Array  # int32 [B, max_new_tokens]; 0 after each row's end
  lengths: jax.Array  # int32 [B]: generated tokens, a final EOS included
  target_calls: jax.Array  # int32 [B]: target `decode` calls (rounds), prefill excluded
  draft_calls: jax.Array  # int32 [B]: draft model calls (0 for table drafters)
  accepted_hist: jax.Array  # int32 [B, max_gamma + 1]: rounds that accepted n guesses
  alpha_sum: jax.Array  # float32 [B]: Σ_x min(p, q) summed over verified positions
  alpha_count: jax.Array  # int32 [B]: verified positions in alpha_sum
  trace: Optional[Trace] = None  # per-round record when DecodeConfig.trace
  gamma_hist: Optional[jax.Array] = None  # int32 [B, max_gamma + 1]: rounds the row offered γ
  # guesses in (speculative loop; γ = 0: a plain target step, or one token from a wide call)
  cost_table: Any = flax.struct.field(pytree_node=False, default=None)
  """The `specjax.decode.auto.CostTable` the 'auto' γ policy decided with (None otherwise)."""
  rounds: Optional[jax.Array] = None  # int32 []: rounds a streaming decode ran
  slot_rounds: Optional[jax.Array] = None  # int32 []: Σ over those rounds of the slots each ran

  @property
  def alpha(self) -> jax.Array:
    """float32 [B]: the acceptance-rate estimate, mean of Σ min(p, q)."""
    return self.alpha_sum / jnp.maximum(self.alpha_count, 1)

  @property
  def pooled_alpha(self) -> float:
    """The acceptance-rate estimate over every row's verified positions together: Σ alpha_sum
    over Σ alpha_count (0 when no position was verified)."""
    return float(np.sum(np.asarray(self.alpha_sum))
                 / max(int(np.sum(np.asarray(self.alpha_count))), 1))

  @property
  def tokens_per_call(self) -> jax.Array:
    """float32 [B]: generated tokens per target call."""
    return self.lengths / jnp.maximum(self.target_calls, 1)

  @property
  def slot_utilization(self) -> float:
    """Useful rounds / rounds run, counted in row-rounds: Σ target calls / `slot_rounds`.

    A streaming decode (`slots=`) ran `slot_rounds` row-rounds; one padded batch ran as many
    rounds as its slowest row, over all B rows.
    """
    useful = float(jnp.sum(self.target_calls))
    if self.slot_rounds is None:
      return useful / max(self.target_calls.shape[0] * int(jnp.max(self.target_calls)), 1)
    return useful / max(int(self.slot_rounds), 1)


@flax.struct.dataclass
class LoopState:
  """The state of a decode loop (autoregressive or speculative), batch axis first."""

  seq: jax.Array  # int32 [B, T]: decoder prefix then generated tokens
  length: jax.Array  # int32 [B]: committed tokens in seq
  done: jax.Array  # bool [B]: the row emitted EOS or reached its budget
  cache: Any  # the target's KV cache (model-defined pytree, batch axis first)
  drafter_state: Any  # the drafter's own state (None when autoregressive)
  target_calls: jax.Array  # int32 [B]: target decode calls (rounds) so far
  draft_calls: jax.Array  # int32 [B]: draft model calls so far
  accepted_hist: jax.Array  # int32 [B, G + 1]: rounds that accepted n guesses
  alpha_sum: jax.Array  # float32 [B]: Σ min(p, q) over verified positions
  alpha_count: jax.Array  # int32 [B]: verified positions in alpha_sum
  nan: jax.Array  # bool [B]: NaN seen in this row's logits
  gamma: Optional[jax.Array] = None  # int32 [B]: each row's γ for the next round
  trace: Optional[Trace] = None  # filled when DecodeConfig.trace
  gamma_hist: Optional[jax.Array] = None  # int32 [B, G + 1]: rounds by the row's γ


@flax.struct.dataclass
class LoopParams:
  """What a loop reads besides its state (all data: changing it never recompiles)."""

  target: Any  # the target's parameters
  drafter: Any = None  # the drafter's parameters (model params, n-gram tables; None: none)
  control: Optional[AutoControl] = None  # the 'auto' policy's control; None otherwise


def empty_trace(batch: int, rounds: int, max_gamma: int) -> Trace:
  """A zeroed `Trace` of `rounds` rounds per row."""
  return Trace(guesses=jnp.zeros((batch, rounds, max_gamma), jnp.int32),
               accepted=jnp.zeros((batch, rounds), jnp.int32),
               correction=jnp.zeros((batch, rounds), jnp.int32),
               gamma=jnp.zeros((batch, rounds), jnp.int32))
