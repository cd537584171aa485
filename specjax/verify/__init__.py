"""Verification: the step that accepts a prefix of the guesses and draws one more token.

Per-row verifiers behind one protocol (`Verifier`), vmapped by the loops:
`ReferenceVerifier` (Algorithm 1, exact), `FusedVerifier` (exact, one pass over
the vocabulary; Pallas on GPU/TPU), `BlockVerifier` (Sun et al.'s block verification, exact,
never fewer accepted guesses in expectation), `SigmoidApproxVerifierNotExact` (Wagner et
al.'s approximation, NOT exact). `verify_batch` runs one over a batch with
randomness tied to absolute positions; `speculative_step` is Algorithm 1 alone.
"""
from specjax.verify.base import Verifier, check_row
from specjax.verify.block import BlockVerifier
from specjax.verify.batch import emitted_tokens, verify_batch
from specjax.verify.fused import FusedVerifier
from specjax.verify.reference import ReferenceVerifier
from specjax.verify.registry import VERIFIERS, default_verifier, describe, get_verifier
from specjax.verify.sigmoid import SigmoidApproxVerifierNotExact
from specjax.verify.step import (argmax_lenient_step, at_guesses, check_lenience, check_step_args,
                                 count_accepted, speculative_step, verify)

__all__ = ["Verifier", "ReferenceVerifier", "FusedVerifier", "BlockVerifier", "SigmoidApproxVerifierNotExact",
           "VERIFIERS", "get_verifier", "default_verifier", "describe", "verify_batch", "emitted_tokens",
           "speculative_step", "verify", "argmax_lenient_step", "check_lenience",
           "check_step_args", "count_accepted", "at_guesses", "check_row"]
