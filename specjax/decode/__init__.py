"""The decode loops: autoregressive, speculative, beam search and speculative beam search.

Each is one `lax.while_loop` under `jax.jit` over a typed loop state; rows advance
independently and draw randomness tied to (row, absolute position, stream). With `slots=B`
the autoregressive and speculative loops stream their inputs through B slots (in-flight
batching, `specjax.decode.stream`): a finished row takes the next input.
"""
from specjax.decode.autoregressive import AutoregressiveLoop, autoregressive_decode
from specjax.decode.beam import beam_search
from specjax.decode.beam_core import NEG_INF, BeamResult
from specjax.decode.beam_speculative import speculative_beam_search
from specjax.decode.auto import CostTable
from specjax.decode.config import GAMMA_POLICIES, DecodeConfig
from specjax.decode.speculative import SpeculativeLoop, calibrate_costs, speculative_decode
from specjax.decode.state import DecodeResult, LoopState, Trace
from specjax.decode.stream import Streaming, stream_decode
from specjax.decode.tree import TreeLoop, tree_decode

__all__ = ["DecodeConfig", "DecodeResult", "Trace", "LoopState", "GAMMA_POLICIES",
           "autoregressive_decode", "speculative_decode", "beam_search",
           "speculative_beam_search", "BeamResult", "NEG_INF", "CostTable", "calibrate_costs",
           "AutoregressiveLoop", "SpeculativeLoop", "Streaming", "stream_decode",
           "tree_decode", "TreeLoop"]
