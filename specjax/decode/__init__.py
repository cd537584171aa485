"""The decode loops: autoregressive, speculative, beam search and speculative beam search.

Each is one `lax.while_loop` under `jax.jit` over a typed loop state; rows advance
independently and draw randomness tied to (row, absolute position, stream). With `slots=B`
the autoregressive and speculative loops stream their inputs through B slots (in-flight
batching, `specjax.decode.stream`): a finished row takes the next input.

γ goes by four names, one meaning each:
  gamma       a row's guesses in a round (data, int32 [B] in the loop state). The `gamma=`
              argument of `speculative_decode` is every row's first γ; under the 'auto'
              policy it is the largest γ the policy may pick instead (its γ cap).
  gamma_cap   'auto' only: that largest γ (`auto.AutoControl.gamma_cap`).
  max_gamma   the static bound every γ stays within (`drafter.max_gamma`): buffers are
              [B, max_gamma] and the widest target call scores max_gamma + 1 positions.
  bucket      'auto' only: the γ of one compiled round variant, whose target call scores
              bucket + 1 positions for every row of γ ≤ bucket (`DecodeConfig.auto_buckets`).

Modules, top down: `speculative` (the entry: checks, the 'auto' plan, padded or streamed
run), `calibration` (cost tables), `fallback` (the autoregressive loop when 'auto' never
speculates), `stream` (slots), `round` (draft -> score -> verify -> commit -> record),
`auto_rounds` (the policy's variant choice inside the loop), `auto` (the policy),
`autoregressive`, `loop` / `state` (shared pieces), `inputs` (the one validation preamble).
"""
from specjax.decode.autoregressive import AutoregressiveLoop, autoregressive_decode
from specjax.decode.beam import beam_search
from specjax.decode.beam_core import NEG_INF, BeamResult
from specjax.decode.beam_speculative import speculative_beam_search
from specjax.decode.auto import CostTable
from specjax.decode.config import GAMMA_POLICIES, DecodeConfig
from specjax.decode.round import SpeculativeLoop
from specjax.decode.runner import Loop
from specjax.decode.speculative import calibrate_costs, prepare_decode, speculative_decode
from specjax.decode.state import DecodeResult, LoopParams, LoopState, Trace
from specjax.decode.stream import Streaming, stream_decode
from specjax.decode.tree import TreeLoop, tree_decode
from specjax.decode.tree_checks import check_tree

__all__ = ["DecodeConfig", "DecodeResult", "Trace", "LoopState", "LoopParams", "GAMMA_POLICIES",
           "autoregressive_decode", "speculative_decode", "beam_search",
           "speculative_beam_search", "BeamResult", "NEG_INF", "CostTable", "calibrate_costs",
           "prepare_decode", "AutoregressiveLoop", "SpeculativeLoop", "Streaming",
           "stream_decode", "tree_decode", "TreeLoop", "check_tree", "Loop"]
