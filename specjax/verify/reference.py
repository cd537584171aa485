"""The reference verifier: Algorithm 1 as written. Exact."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from specjax.verify.base import check_row
from specjax.verify.step import verify


@dataclasses.dataclass(frozen=True)
class ReferenceVerifier:
  """Algorithm 1 as written (`specjax.verify.step.verify`). Exact."""

  exact: ClassVar[bool] = True
  name: ClassVar[str] = "reference"
  fresh_round_keys: ClassVar[bool] = False
  lenient: ClassVar[bool] = True

  def __call__(self, uniforms, correction_keys, draft_tokens, draft_probs, target_probs,
               target_logits=None, draft_logits=None, *, lenience=1.0, num_guesses=None):
    """See `Verifier.__call__`; the logits are ignored."""
    check_row(draft_tokens, draft_probs, target_probs, lenience)
    return verify(uniforms, correction_keys, draft_tokens, draft_probs, target_probs,
                  lenience=lenience, num_guesses=num_guesses)
