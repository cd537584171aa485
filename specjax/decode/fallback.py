"""The decode of an 'auto' policy that never speculates: the autoregressive loop, reported as
the speculative loop reports rounds at γ = 0."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from specjax.decode.autoregressive import autoregressive_decode
from specjax.decode.round import empty_trace
from specjax.decode.state import DecodeResult


def autoregressive_instead(target, target_params, inputs, max_new_tokens, rng, config,
                           cache_len, max_gamma, costs, **kwargs) -> DecodeResult:
  """The decode of an 'auto' policy that never speculates (`auto.never_speculates`): the
  autoregressive loop, the same tokens as its narrow rounds, reported as every round at
  γ = 0 (no draft call, nothing verified; a trace has one correction per round).
  kwargs go to `autoregressive_decode` (prompt_lengths, partitioner, slots, on_progress)."""
  result = autoregressive_decode(
      target, target_params, inputs, max_new_tokens=max_new_tokens, rng=rng,
      config=dataclasses.replace(config, trace=False, cache_len=cache_len), **kwargs)
  return as_narrow_rounds(result, max_gamma, cache_len if config.trace else 0).replace(
      cost_table=costs)


@functools.partial(jax.jit, static_argnums=(1, 2))
def as_narrow_rounds(result: DecodeResult, max_gamma: int, trace_width: int) -> DecodeResult:
  """An autoregressive result as the speculative loop reports all-γ = 0 rounds (one call;
  trace_width > 0: with a trace of that many rounds, round r having emitted token r)."""
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
