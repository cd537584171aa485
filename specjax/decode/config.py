"""The static configuration of a decode loop (hashable; part of the jit cache key)."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from specjax.checks import (check_bool, check_choice, check_int, check_int_sequence, check_real,
                            is_int)
from specjax.sampling import Sampling
from specjax.verify import ReferenceVerifier, Verifier, check_lenience

GAMMA_POLICIES = ("constant", "heuristic", "optimal", "auto")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Static decoding settings (hashable; part of the jit cache key)."""

  sampling: Sampling = Sampling()
  """Standardization applied to target and draft logits alike."""
  eos_id: int = 1
  """Generation of a row stops after it emits this token (T5 convention: 1); -1: never
  (every row runs its whole budget). The loops refuse an id outside the vocabulary."""
  lenience: float = 1.0
  """l in (0, 1]; 1 is exact. At temperature 0 and l < 1 the argmax lenience of A.5 is used."""
  cache_len: Optional[int] = None
  """Cache positions per row (prefix + new tokens + max_gamma + 1). None: rounded up to 128."""
  trace: bool = False
  """Record every round's guesses, accepted count and correction (for Figure-1 traces)."""
  gamma_policy: str = "constant"
  """How each row's γ evolves: 'constant'; 'heuristic' (+2 after a round that accepted all,
  −1 otherwise, within [1, max_gamma]); 'optimal' (the γ maximizing Thm 3.8 for the row's
  running α estimate and `cost_coefficient`); 'auto' (`specjax.decode.auto`: each round the
  γ in [0, max_gamma] that minimizes the batch's expected remaining walltime under a measured
  cost table, where γ = 0 is a plain target step with no draft call, so speculation switches
  off where it does not pay). γ is data: policies never recompile per γ."""
  cost_coefficient: float = 0.0
  """c, the draft/target cost ratio the 'optimal' policy plugs into Thm 3.8."""
  auto_buckets: Tuple[int, ...] = ()
  """'auto' only: the γ values whose target call gets its own compiled width γ+1 (a round's
  width is the smallest bucket ≥ the batch's largest γ); () means `auto.default_buckets`
  (1, 2, 4, ... and max_gamma). Each bucket is one more branch in the one compiled loop."""
  verifier: Verifier = ReferenceVerifier()
  """The accept/reject step (`specjax.verify`): 'reference' and 'fused' are exact;
  'sigmoid' (SigmoidApproxVerifierNotExact) is NOT exact: its output follows the draft."""

  def __post_init__(self):
    if not isinstance(self.sampling, Sampling):
      raise ValueError(f"sampling must be a specjax Sampling, got {self.sampling!r}")
    if not is_int(self.eos_id) or self.eos_id < -1:
      raise ValueError(f"eos_id must be a token id (an integer >= 0) or -1 for none, "
                       f"got {self.eos_id!r}")
    check_lenience(self.lenience)
    if not (callable(self.verifier) and all(hasattr(self.verifier, a) for a in
                                            ("exact", "name", "fresh_round_keys"))):
      raise ValueError(f"verifier must be a specjax.verify verifier such as ReferenceVerifier() "
                       f"or get_verifier('fused'), got {self.verifier!r}")
    if self.lenience != 1.0 and not getattr(self.verifier, "lenient", True):
      raise ValueError(f"the {getattr(self.verifier, 'name', type(self.verifier).__name__)} "
                       f"verifier supports lenience = 1 only, got lenience={self.lenience}; "
                       "lenient decoding (paper A.5) is defined for Algorithm 1: use the "
                       "reference or fused verifier")
    check_int("cache_len", self.cache_len, low=1, allow_none=True,
              expected="None or an integer >= 1")
    check_bool("trace", self.trace)
    check_choice("gamma_policy", self.gamma_policy, GAMMA_POLICIES)
    check_real("cost_coefficient", self.cost_coefficient, low=0.0)
    buckets = check_int_sequence("auto_buckets", self.auto_buckets, low=1, increasing=True,
                                 expected="a tuple of increasing integers >= 1 (() for the "
                                 "default buckets)")
    object.__setattr__(self, "auto_buckets", buckets)
