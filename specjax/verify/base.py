"""Pluggable verifiers: the step that accepts guesses and draws the next token.

The verifiers share one call signature (`Verifier`), for ONE row (the decode
loop vmaps them):

- ``reference``: `specjax.verify.step.verify`, Algorithm 1 as written. Exact.
- ``fused``: the same step with the correction draw done in one pass over the
  vocabulary (Wagner et al.'s tiled verification; a Pallas kernel on GPU/TPU,
  one XLA fusion on CPU). Exact: it draws the same tokens as ``reference`` for
  the same randomness, bit for bit.
- ``block``: Sun et al.'s block verification (`specjax.verify.block`), which
  verifies the drafted block jointly. Exact; accepts at least as many guesses in
  expectation as ``reference``; lenience = 1 only.
- ``sigmoid``: Wagner et al.'s sigmoid approximation, which replaces softmax by
  σ((z − α)/(β − α)) of the raw logits. NOT EXACT: the output is not distributed
  as the target (see `SigmoidApproxVerifierNotExact`).

    verifier = get_verifier("fused")
    n, token = verifier(uniforms, correction_keys, draft_tokens, draft_probs,
                        target_probs, target_logits, draft_logits,
                        lenience=1.0, num_guesses=gamma)
"""
from __future__ import annotations

from typing import Optional, Protocol, Tuple

import jax

from specjax.verify.step import check_step_args


class Verifier(Protocol):
  """Accepts a prefix of the γ guesses and draws one more token, for ONE row.

  Implementations are frozen dataclasses (hashable: they can sit in a static
  decode config).
  """

  exact: bool
  """True when the emitted tokens are distributed exactly as Algorithm 1's (at l = 1: the target's)."""
  name: str
  """The registry name (`get_verifier`)."""
  fresh_round_keys: bool
  """True when the step reads guesses and uniforms past the prefix it accepts (block
  verification). Later rounds draw at those positions again, so the decode loop then folds
  each round's start position into the row keys; position-tied keys alone would bias it."""

  lenient: bool
  """True when the step accepts lenience l < 1 (paper A.5). A verifier without it is
  refused with l < 1 by `DecodeConfig`, at every temperature (at T = 0 the loop's argmax
  lenience would otherwise bypass the verifier silently)."""

  def __call__(self, uniforms: jax.Array, correction_keys: jax.Array,
               draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array,
               target_logits: jax.Array, draft_logits: Optional[jax.Array], *,
               lenience=1.0, num_guesses=None) -> Tuple[jax.Array, jax.Array]:
    """One row's verification.

    Args:
      uniforms: float32 [γ], r_i ~ U[0, 1) for guess i.
      correction_keys: PRNG keys [γ+1] (typed) or uint32 [γ+1, 2]; key n draws the
        token after n accepted guesses.
      draft_tokens: int32 [γ], the guesses.
      draft_probs: float32 [γ, V], the draft's standardized q_i.
      target_probs: float32 [γ+1, V], the target's standardized p_i.
      target_logits: float32 [γ+1, V], the target's raw logits (before standardization).
      draft_logits: float32 [γ, V] raw draft logits, or None (then log(draft_probs)).
      lenience: l in (0, 1]; 1 is exact.
      num_guesses: optional int32 [] ≤ γ: only the first num_guesses guesses count.
    Returns:
      (num_accepted int32 [], next_token int32 []).
    """


def check_row(draft_tokens, draft_probs, target_probs, lenience) -> None:
  """ValueError unless the arguments are ONE row's (draft_tokens [γ], ...) with a valid lenience."""
  if draft_tokens.ndim != 1:
    raise ValueError(f"draft_tokens must have shape [gamma] for ONE row (vmap the verifier over "
                     f"the batch), got {draft_tokens.shape}")
  check_step_args(draft_tokens.shape[0], draft_tokens.shape, draft_probs.shape,
                  target_probs.shape, lenience)
