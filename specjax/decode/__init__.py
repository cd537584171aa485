"""The decode loops: autoregressive, speculative (chain), tree, beam and speculative beam.

Every loop but beam search is a `Loop` (`runner`): static configuration whose `start`,
`rounds` (draft -> score -> verify -> commit -> record) and `going` run in ONE jitted
`lax.while_loop` (`runner.run_loop`) over a typed loop state; rows advance independently and
draw randomness tied to (row, absolute position, stream). With `slots=B` the loops stream
their inputs through B slots (in-flight batching, `specjax.decode.stream`).

γ goes by four names, one meaning each:
  gamma       a row's guesses in a round (data, int32 [B] in the loop state). The `gamma=`
              argument of `speculative_decode` is every row's first γ; under the 'auto'
              policy it is the largest γ the policy may pick instead (its γ cap).
  gamma_cap   'auto' only: that largest γ (`auto.AutoControl.gamma_cap`).
  max_gamma   the static bound every γ stays within (`drafter.max_gamma`; a tree's depth):
              buffers are [B, max_gamma] and the widest chain call scores max_gamma + 1.
  bucket      'auto' only: the γ of one compiled round variant, whose target call scores
              bucket + 1 positions for every row of γ ≤ bucket (`DecodeConfig.auto_buckets`).

Slots and positions:
  slots       streaming only: the B rows a streaming decode keeps busy (`slots=`,
              `Streaming.slots`); a finished row's slot takes the next input.
  positions   a row's places in its token buffer and KV caches (`cache_len` of them, the
              prefix, the budget and one round's lookahead).
  lookahead   the positions one round writes past a row's committed tokens
              (`drafter.lookahead`: max_gamma for a chain, the grown nodes for a tree).
  grown/nodes a tree's nodes drafted per round / the nodes the target scores (`keep` cuts).

Calibration (the 'auto' policy's cost table), one name per step:
  calibrate_costs      the public call: measures the table for a decode's models and shapes
  calibration.measure  runs that measurement on a prepared decode and keeps the table
                       (`calibration.CALIBRATED`)
  auto.time_rounds     the measurement itself: every round variant timed in the compiled loop
  calibration.decide   a table -> the loop's control, or the autoregressive loop instead

Modules, top down: `speculative` / `tree` / `autoregressive` (the entries: checks, then the
runner), `runner` (the `Loop` protocol, 'auto' decided once, padded or streamed), `stream`
(slots), `round` (the loop skeleton the chain and tree share, and the chain's draft -> score ->
verify -> commit -> record), `auto/` (the 'auto' policy's room: `auto.policy` the rule and its
cost table, `auto.rounds` the variant choice inside the loop, `auto.calibration` cost tables,
`auto.fallback` the autoregressive result as γ = 0 rounds), `loop` / `state` (shared
pieces), `inputs` (the one validation preamble), `tree_checks` (the one tree validation),
`chain_checks` (a chain round's working set).
"""
from specjax.decode.autoregressive import AutoregressiveLoop, autoregressive_decode
from specjax.decode.beam import beam_search
from specjax.decode.beam_core import NEG_INF, BeamResult
from specjax.decode.beam_speculative import speculative_beam_search
from specjax.decode.chain_checks import check_chain
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
           "stream_decode", "tree_decode", "TreeLoop", "check_tree", "check_chain", "Loop"]
