"""Wagner et al.'s sigmoid approximation of verification. NOT EXACT."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from specjax.verify.base import check_row
from specjax.verify.fused_kernel import draw_from_rows
from specjax.verify.step import at_guesses, count_accepted


@dataclasses.dataclass(frozen=True)
class SigmoidApproxVerifierNotExact:
  """Wagner et al.'s sigmoid approximation. NOT EXACT: do not use it for exact sampling.

  Softmax is replaced by an element-wise sigmoid of scaled raw logits,
  p̂ = σ((z_p − α)/(β − α)) and q̂ = σ((z_q − α)/(β − α)); guess i is accepted iff
  u_i < p̂_i(x_i) / (l q̂_i(x_i)), and the next token is drawn from the unnormalized
  max(0, p̂ − l q̂) (from p̂_{γ+1} when all are accepted), as in the paper.
  Sampling settings (temperature, top-k, top-p) are not applied: it sees raw logits.

  With the paper's α = −β = −10⁴, (z − α)/(β − α) = 0.5 + z/(2·10⁴), so every
  realistic logit maps to σ(0.5) ≈ 0.6225 within ~10⁻³ relative: p̂/q̂ ≈ 1, nearly
  every guess is accepted, the output follows the DRAFT, and the token drawn
  after an all-accepted round is nearly uniform over the vocabulary.
  `experiments/bench/sigmoid_quality.py` measures the damage on exact laws and table models,
  `experiments/bench/verify.py --pair` on the bundled pairs.
  """

  alpha: float = -1e4
  """Lower end of the logit range mapped to σ's input [0, 1] (paper: −10⁴; ASR: −10³)."""
  beta: float = 1e4
  """Upper end of that range (paper: 10⁴; ASR: 10³)."""

  exact: ClassVar[bool] = False
  name: ClassVar[str] = "sigmoid"
  fresh_round_keys: ClassVar[bool] = False
  lenient: ClassVar[bool] = True

  def __post_init__(self):
    if not float(self.beta) > float(self.alpha):  # also catches NaN
      raise ValueError(f"SigmoidApproxVerifierNotExact needs beta > alpha, got "
                       f"alpha={self.alpha}, beta={self.beta}")

  def scores(self, logits: jax.Array) -> jax.Array:
    """σ((z − α)/(β − α)): float [..., V] logits -> float32 [..., V] in (0, 1), unnormalized."""
    logits = jnp.asarray(logits, jnp.float32)
    return jax.nn.sigmoid((logits - self.alpha) / (self.beta - self.alpha))

  def __call__(self, uniforms, correction_keys, draft_tokens, draft_probs, target_probs,
               target_logits=None, draft_logits=None, *, lenience=1.0, num_guesses=None):
    """See `Verifier.__call__`; the probabilities serve only for shape checks and,
    when draft_logits is None, as log(draft_probs). NOT EXACT."""
    check_row(draft_tokens, draft_probs, target_probs, lenience)
    if target_logits is None:
      raise ValueError("the sigmoid verifier needs target_logits [gamma+1, V] (raw logits)")
    if tuple(target_logits.shape) != tuple(target_probs.shape):
      raise ValueError(f"target_logits must have shape {tuple(target_probs.shape)}, "
                       f"got {tuple(target_logits.shape)}")
    if draft_logits is None:  # log(q), taken only where it is read
      draft_table, draft_score = draft_probs, lambda q: self.scores(jnp.log(q))
    elif tuple(draft_logits.shape) != tuple(draft_probs.shape):
      raise ValueError(f"draft_logits must have shape {tuple(draft_probs.shape)}, "
                       f"got {tuple(draft_logits.shape)}")
    else:
      draft_table, draft_score = draft_logits, self.scores
    # σ is element-wise, so only what the step reads is computed: the 2γ guessed
    # entries for the accept test, then row n for the correction draw.
    gamma = draft_tokens.shape[0]
    p_x = self.scores(at_guesses(target_logits, draft_tokens))
    q_x = draft_score(at_guesses(draft_table, draft_tokens))
    n, limit = count_accepted(uniforms * lenience * q_x < p_x, num_guesses)
    scale = jnp.where(n < limit, jnp.asarray(lenience, jnp.float32), jnp.float32(0.0))
    p_row = self.scores(target_logits[n])
    q_row = draft_score(draft_table[jnp.minimum(n, gamma - 1)])
    return n, draw_from_rows(p_row, q_row, scale, correction_keys[n])
