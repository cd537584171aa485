"""Verifiers by name (gin and the main job select them this way)."""
from __future__ import annotations

from specjax.verify.base import Verifier
from specjax.verify.block import BlockVerifier
from specjax.verify.fused import FusedVerifier
from specjax.verify.reference import ReferenceVerifier
from specjax.verify.sigmoid import SigmoidApproxVerifierNotExact

VERIFIERS = {
    "reference": ReferenceVerifier,
    "fused": FusedVerifier,
    "block": BlockVerifier,
    "sigmoid": SigmoidApproxVerifierNotExact,
}


def get_verifier(name: str, **kwargs) -> Verifier:
  """The verifier registered under `name`: 'reference' | 'fused' | 'block' | 'sigmoid' (NOT exact).

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


def default_verifier(sampling, lenience: float = 1.0) -> Verifier:
  """The main job's verifier when none is chosen: block verification at temperature > 0
  and lenience 1 (exact, never fewer accepted guesses in expectation, measured on both
  bundled pairs in docs/results/bench_verify_block), the reference one otherwise (at
  T = 0 every exact verifier reduces to argmax matching; lenience < 1 is Algorithm 1's)."""
  if not sampling.greedy and lenience == 1.0:
    return BlockVerifier()
  return ReferenceVerifier()
