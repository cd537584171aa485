"""What the 'auto' policy's decode reports when it never speculates: the autoregressive
loop's result, as the speculative loop reports rounds at γ = 0 (`runner.decode` runs it)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specjax.decode.state import DecodeResult, empty_trace


@functools.partial(jax.jit, static_argnums=(1, 2))
def as_narrow_rounds(result: DecodeResult, max_gamma: int, trace_width: int) -> DecodeResult:
  """An autoregressive result as the speculative loop reports all-γ = 0 rounds (one call;
  trace_width > 0: with a trace of that many rounds, round r having emitted token r): the
  same tokens as its narrow rounds, no draft call, nothing verified."""
  calls = result.target_calls
  batch = calls.shape[0]
  hist = jnp.zeros((batch, max_gamma + 1), jnp.int32).at[:, 0].set(calls)
  trace = None
  if trace_width:
    correction = jnp.zeros((batch, trace_width), jnp.int32).at[:, :result.tokens.shape[1]].set(
        result.tokens)
    trace = empty_trace(batch, trace_width, max_gamma).replace(correction=correction)
  return result.replace(
      draft_calls=jnp.zeros_like(calls), accepted_hist=hist, gamma_hist=hist,
      alpha_sum=jnp.zeros(batch, jnp.float32), alpha_count=jnp.zeros_like(calls), trace=trace)
