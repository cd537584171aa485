"""Pluggable verifiers: the step that accepts guesses and draws the next token.

Three verifiers share one call signature (`Verifier`), for ONE row (the decode
loop vmaps them):

- ``reference``: `specjax.speculative.verify`, Algorithm 1 as written. Exact.
- ``fused``: the same step with the correction draw done in one pass over the
  vocabulary (Wagner et al.'s tiled verification; a Pallas kernel on GPU/TPU,
  one XLA fusion on CPU). Exact: it draws the same tokens as ``reference`` for
  the same randomness, bit for bit.
- ``sigmoid``: Wagner et al.'s sigmoid approximation, which replaces softmax by
  σ((z − α)/(β − α)) of the raw logits. NOT EXACT: the output is not distributed
  as the target (see `SigmoidApproxVerifierNotExact`).

    verifier = get_verifier("fused")
    n, token = verifier(uniforms, correction_keys, draft_tokens, draft_probs,
                        target_probs, target_logits, draft_logits,
                        lenience=1.0, num_guesses=gamma)
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Optional, Protocol, Tuple

import jax
import jax.numpy as jnp

from specjax.kernels.fused_verify import draw_correction, draw_from_rows
from specjax.speculative import check_step_args, verify


class Verifier(Protocol):
  """Accepts a prefix of the γ guesses and draws one more token, for ONE row.

  Implementations are frozen dataclasses (hashable: they can sit in a static
  decode config).
  """

  exact: bool
  """True when the emitted tokens are distributed exactly as Algorithm 1's (at l = 1: the target's)."""
  name: str
  """The registry name (`get_verifier`)."""

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


def _check(draft_tokens, draft_probs, target_probs, lenience) -> None:
  if draft_tokens.ndim != 1:
    raise ValueError(f"draft_tokens must have shape [gamma] for ONE row (vmap the verifier over "
                     f"the batch), got {draft_tokens.shape}")
  check_step_args(draft_tokens.shape[0], draft_tokens.shape, draft_probs.shape,
                  target_probs.shape, lenience)


def _at_guesses(table: jax.Array, draft_tokens: jax.Array) -> jax.Array:
  """table [≥γ, V] -> float32 [γ]: row i's entry at guess x_i."""
  gamma = draft_tokens.shape[0]
  return jnp.take_along_axis(table[:gamma], draft_tokens[:, None], axis=-1)[:, 0]


def _num_accepted(uniforms, p_x, q_x, lenience, num_guesses):
  """Algorithm 1's accept test on p_i(x_i), q_i(x_i) (float32 [γ] each) -> (n, limit) int32 []."""
  gamma = p_x.shape[0]
  accepted = uniforms * lenience * q_x < p_x  # bool [γ]
  limit = jnp.int32(gamma) if num_guesses is None else jnp.asarray(num_guesses, jnp.int32)
  accepted &= jnp.arange(gamma) < limit
  num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32))).astype(jnp.int32)
  return num_accepted, limit


@dataclasses.dataclass(frozen=True)
class ReferenceVerifier:
  """Algorithm 1 as written (`specjax.speculative.verify`). Exact."""

  exact: ClassVar[bool] = True
  name: ClassVar[str] = "reference"

  def __call__(self, uniforms, correction_keys, draft_tokens, draft_probs, target_probs,
               target_logits=None, draft_logits=None, *, lenience=1.0, num_guesses=None):
    """See `Verifier.__call__`; the logits are ignored."""
    _check(draft_tokens, draft_probs, target_probs, lenience)
    return verify(uniforms, correction_keys, draft_tokens, draft_probs, target_probs,
                  lenience=lenience, num_guesses=num_guesses)


@dataclasses.dataclass(frozen=True)
class FusedVerifier:
  """Algorithm 1 with the correction drawn in one pass over the vocabulary. Exact.

  The accept test reads only p_i(x_i) and q_i(x_i); then one tiled pass over
  row n of p and q computes the residual max(0, p − l q), regenerates the
  reference's Exp(1) race draws per tile from the correction key, and keeps
  each tile's best candidate; a reduction across tiles picks the token. Same
  tokens as `ReferenceVerifier` for the same randomness.
  """

  tile: int = 2048
  """Vocabulary tile of the Pallas kernel (a positive multiple of 128). Any V works: the
  last tile may be ragged."""
  interpret: Optional[bool] = None
  """Run the Pallas kernel in interpret mode; None: only on CPU."""
  backend: str = "auto"
  """'pallas', 'xla', or 'auto' (pallas on GPU/TPU, xla on CPU)."""

  exact: ClassVar[bool] = True
  name: ClassVar[str] = "fused"

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
    _check(draft_tokens, draft_probs, target_probs, lenience)
    n, limit = _num_accepted(uniforms, _at_guesses(target_probs, draft_tokens),
                             _at_guesses(draft_probs, draft_tokens), lenience, num_guesses)
    # After a rejection: the residual max(0, p_n − l q_n); all accepted: p_n (scale 0).
    scale = jnp.where(n < limit, jnp.asarray(lenience, jnp.float32), jnp.float32(0.0))
    interpret = (jax.default_backend() == "cpu") if self.interpret is None else self.interpret
    token = draw_correction(target_probs, draft_probs, n, scale, correction_keys[n],
                            backend=self.resolved_backend(), tile=self.tile,
                            interpret=interpret)
    return n, token


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
  `experiments/sigmoid_quality.py` measures the damage.
  """

  alpha: float = -1e4
  """Lower end of the logit range mapped to σ's input [0, 1] (paper: −10⁴; ASR: −10³)."""
  beta: float = 1e4
  """Upper end of that range (paper: 10⁴; ASR: 10³)."""

  exact: ClassVar[bool] = False
  name: ClassVar[str] = "sigmoid"

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
    _check(draft_tokens, draft_probs, target_probs, lenience)
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
    p_x = self.scores(_at_guesses(target_logits, draft_tokens))
    q_x = draft_score(_at_guesses(draft_table, draft_tokens))
    n, limit = _num_accepted(uniforms, p_x, q_x, lenience, num_guesses)
    scale = jnp.where(n < limit, jnp.asarray(lenience, jnp.float32), jnp.float32(0.0))
    p_row = self.scores(target_logits[n])
    q_row = draft_score(draft_table[jnp.minimum(n, gamma - 1)])
    return n, draw_from_rows(p_row, q_row, scale, correction_keys[n])


VERIFIERS = {
    "reference": ReferenceVerifier,
    "fused": FusedVerifier,
    "sigmoid": SigmoidApproxVerifierNotExact,
}


def get_verifier(name: str, **kwargs) -> Verifier:
  """The verifier registered under `name`: 'reference' | 'fused' | 'sigmoid' (NOT exact).

  Args:
    name: the registry name.
    **kwargs: fields of its dataclass (e.g. tile=1024 for 'fused', alpha/beta for 'sigmoid').
  """
  if name not in VERIFIERS:
    raise ValueError(f"unknown verifier {name!r}; choose one of {sorted(VERIFIERS)} "
                     "('sigmoid' is the NOT-exact approximation)")
  return VERIFIERS[name](**kwargs)


def describe(verifier: Verifier) -> str:
  """A one-line label for reports: the name, and a loud NOT EXACT where it applies."""
  if verifier.exact:
    return f"{verifier.name} (exact)"
  return (f"{verifier.name} (NOT EXACT: Wagner et al.'s sigmoid approximation; the output is "
          "not distributed as the target)")
