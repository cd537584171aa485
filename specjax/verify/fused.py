"""The fused exact verifier (Wagner et al.'s tiled verification)."""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional

import jax
import jax.numpy as jnp

from specjax.verify.base import check_row
from specjax.verify.fused_kernel import draw_correction
from specjax.verify.step import at_guesses, count_accepted


@dataclasses.dataclass(frozen=True)
class FusedVerifier:
  """Algorithm 1 with the correction drawn in one pass over the vocabulary. Exact.

  The accept test reads only p_i(x_i) and q_i(x_i); then one tiled pass over
  row n of p and q computes the residual max(0, p − l q) and writes the masses
  of its blocks of 128 ids (and of p's, the fallback); `categorical`'s two
  races pick a block from the masses and the token inside it. Same tokens as
  `ReferenceVerifier` for the same randomness.
  """

  tile: int = 2048
  """Vocabulary tile of the Pallas kernel on TPU and with Triton (a positive multiple of 128;
  with Triton, 128 times a power of two); Mosaic GPU (Hopper and newer) always takes 8192 ids
  per thread block. Any V works: the last tile may be ragged."""
  interpret: Optional[bool] = None
  """Run the Pallas kernel in interpret mode; None: only on CPU."""
  backend: str = "auto"
  """'pallas', 'xla', or 'auto' (pallas on GPU/TPU, xla on CPU)."""

  exact: ClassVar[bool] = True
  name: ClassVar[str] = "fused"
  fresh_round_keys: ClassVar[bool] = False
  lenient: ClassVar[bool] = True

  def __post_init__(self):
    if self.backend not in ("auto", "pallas", "xla"):
      raise ValueError(f"FusedVerifier.backend must be 'auto', 'pallas' or 'xla', "
                       f"got {self.backend!r}")
    if int(self.tile) != self.tile or self.tile < 128 or self.tile % 128:
      raise ValueError(f"FusedVerifier.tile must be a positive multiple of 128, got {self.tile}")

  def resolved_backend(self) -> str:
    """'pallas' or 'xla', for the current default JAX backend."""
    if self.backend != "auto":
      return self.backend
    return "pallas" if jax.default_backend() in ("gpu", "tpu") else "xla"

  def __call__(self, uniforms, correction_keys, draft_tokens, draft_probs, target_probs,
               target_logits=None, draft_logits=None, *, lenience=1.0, num_guesses=None):
    """See `Verifier.__call__`; the logits are ignored."""
    check_row(draft_tokens, draft_probs, target_probs, lenience)
    p_x = at_guesses(target_probs, draft_tokens)
    q_x = at_guesses(draft_probs, draft_tokens)
    n, limit = count_accepted(uniforms * lenience * q_x < p_x, num_guesses)
    # After a rejection: the residual max(0, p_n − l q_n); all accepted: p_n (scale 0).
    scale = jnp.where(n < limit, jnp.asarray(lenience, jnp.float32), jnp.float32(0.0))
    interpret = (jax.default_backend() == "cpu") if self.interpret is None else self.interpret
    token = draw_correction(target_probs, draft_probs, n, scale, correction_keys[n],
                            backend=self.resolved_backend(), tile=self.tile,
                            interpret=interpret)
    return n, token
