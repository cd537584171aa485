"""One runner for every decode loop: the autoregressive, chain and tree loops are `Loop`s.

A loop is static, hashable configuration (its models, drafter and `DecodeConfig`) with three
traced methods over the typed `LoopState`: `start` (encode / prefill, the drafter started),
`rounds` (at least one round: draft -> score -> verify -> commit -> record) and `going`
(whether the decode goes on). This module runs any of them the same way:

  decode    after the entry's checks: the 'auto' policy decided once (`calibration.decide`:
            a cost table and the loop's control, or the autoregressive loop instead when the
            policy would never speculate, `fallback`), then one padded batch or the inputs
            streamed through slots (`specjax.decode.stream`)
  prepare   one padded batch, placed on first use, whose `run(budget, gamma, control)`
            calibration also runs (the same compiled loop: no extra compile)
  run_loop  THE whole-loop function: start, then one `lax.while_loop` of `rounds` while
            `going`, under one `jax.jit` (the loop and partitioner static, the rest data)
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional, Protocol, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decode import auto
from specjax.decode.auto import calibration
from specjax.decode.config import DecodeConfig
from specjax.decode.auto.fallback import as_narrow_rounds
from specjax.decode.inputs import Checked, check_decode, check_nan, initial_seq
from specjax.decode.loop import finish
from specjax.decode.state import DecodeResult, LoopParams, LoopState
from specjax.decode.stream import Streaming, as_streaming, stream_decode
from specjax.models import DecodingModel, fused
from specjax.sampling import row_keys
from specjax.runtime.sharding import Partitioner, constrain, place, unpad


class Loop(Protocol):
  """What the runner drives (`AutoregressiveLoop`, `SpeculativeLoop`, `TreeLoop`): a loop
  built from its `target`, `config` and `drafter` (None: the autoregressive loop) implements
  γ's bound, `start`, `rounds` and `going`. A loop that the 'auto' policy can drive also has
  an `auto` member (`auto_spec`)."""

  target: DecodingModel
  config: DecodeConfig
  drafter: Any

  @property
  def max_gamma(self) -> int:
    """The γ bound of its buffers (a tree's depth); 0 without a drafter."""

  def start(self, params: LoopParams, inputs, seq, length, gamma) -> Tuple[LoopState, Any]:
    """inputs [B, L], seq [B, T], length [B], gamma int32 [] (each row's first γ; a loop
    that does not read it ignores it, and jit drops the unused argument) -> (LoopState,
    encoded)."""

  def rounds(self, params: LoopParams, state: LoopState, keys, encoded, prefix_len,
             max_new_tokens, running: Callable = lambda s: True,
             place: Callable = lambda s: s) -> LoopState:
    """At least one round; 'auto': rounds while `running(state)` (the streaming decode stops
    them when a slot is free); `place` constrains each round's state (sharding)."""

  def going(self, params: LoopParams, state: LoopState) -> jax.Array:
    """bool []: whether the decode goes on."""


def auto_spec(loop: Loop) -> Optional[auto.AutoSpec]:
  """The loop's optional 'auto' member: an `auto.AutoSpec` when the 'auto' policy drives it,
  else None (also for a loop without the member)."""
  return getattr(loop, "auto", None)


class Entry(NamedTuple):
  """What every decode entry has once its inputs are checked (`enter`)."""

  streaming: Optional[Streaming]  # the stream's settings (None: one padded batch)
  checked: Checked  # the inputs, prefix lengths, budget, cache length and γ, checked
  config: DecodeConfig  # the entry's config with the checked cache length
  rows: int  # rows decoded at once (streaming: slots plus refill rows; else the batch)


def enter(target: DecodingModel, config: DecodeConfig, inputs, max_new_tokens, prompt_lengths,
          slots: Any, partitioner: Optional[Partitioner], **checks: Any) -> Entry:
  """The decode entries' shared preamble: the streaming settings (`as_streaming(slots)`), the
  inputs checked for the rows decoded at once (`check_decode`, with `checks`: the drafter
  and γ), and the config's cache length fixed to the checked one (so a streaming
  calibration's padded batch sees the stream's)."""
  streaming = as_streaming(slots)
  rows = None if streaming is None else streaming.rows(partitioner)
  checked = check_decode(target, config, inputs, max_new_tokens, prompt_lengths, rows=rows,
                         partitioner=partitioner, **checks)
  return Entry(streaming=streaming, checked=checked,
               config=dataclasses.replace(config, cache_len=checked.cache_len),
               rows=rows or checked.inputs.shape[0])


@functools.partial(jax.jit, static_argnames=("loop", "partitioner"))
def run_loop(loop: Loop, partitioner, params: LoopParams, inputs, seq, length, keys,
             max_new_tokens, gamma):
  """The whole decode of one padded batch: (DecodeResult with tokens [B, T], nan bool [B])."""
  prefix_len = length
  with fused.placed_by(partitioner):
    state, encoded = constrain(partitioner, loop.start(params, inputs, seq, length, gamma))
    place_state = functools.partial(constrain, partitioner)
    body = lambda s: loop.rounds(params, s, keys, encoded, prefix_len, max_new_tokens,
                                 place=place_state)
    state = jax.lax.while_loop(functools.partial(loop.going, params), body, state)
  return finish(state, prefix_len)


def decode(loop: Loop, params: LoopParams, checked: Checked, rng, *,
           streaming: Optional[Streaming] = None, partitioner: Optional[Partitioner] = None,
           on_progress: Optional[Callable[[int, int], None]] = None,
           costs: Optional[auto.CostTable] = None) -> DecodeResult:
  """Runs `loop` over the checked inputs (`loop.config.cache_len` = checked.cache_len).

  'auto' loops decide once from `costs` (None: calibrated on these inputs, streaming on a
  padded batch of the first `slots`) and run the autoregressive loop instead when the
  policy would never speculate. Returns the `DecodeResult` (tokens [B, max_new_tokens]; the
  cost table under 'auto'); ValueError naming rows whose logits held NaN.
  """
  rows = None if streaming is None else streaming.rows(partitioner)
  prepared, spec = None, auto_spec(loop)
  if streaming is None or spec is not None:
    some = (slice(None) if streaming is None
            else np.arange(rows - streaming.refill_rows) % checked.inputs.shape[0])
    prepared = prepare(loop, params, checked, some,
                       rng if streaming is None else jax.random.PRNGKey(0), partitioner)
  if spec is not None:
    costs, control = calibration.decide(prepared, costs, checked.gamma, checked.max_new_tokens)
    if control is None:  # the autoregressive loop, reported as rounds at γ = 0
      result = decode(spec.fallback, LoopParams(target=params.target), checked, rng,
                      streaming=streaming, partitioner=partitioner, on_progress=on_progress)
      trace_width = checked.cache_len if loop.config.trace else 0
      return as_narrow_rounds(result, loop.max_gamma, trace_width).replace(cost_table=costs)
    params = params.replace(control=control)
  if streaming is None:
    result, nan = prepared.run(checked.max_new_tokens, checked.gamma, params.control)
    check_nan(nan)
    return result.replace(tokens=result.tokens[:, :checked.max_new_tokens], cost_table=costs)
  if partitioner is not None:
    params = params.replace(target=partitioner.shard_params(params.target),
                            drafter=partitioner.shard_params(params.drafter))
  result, nan = stream_decode(loop, params, jnp.asarray(checked.inputs),
                              jnp.asarray(checked.length), row_keys(rng, checked.inputs.shape[0]),
                              streaming=streaming, width=checked.cache_len,
                              max_new_tokens=checked.max_new_tokens,
                              gamma=1 if checked.gamma is None else checked.gamma,
                              partitioner=partitioner, on_progress=on_progress)
  check_nan(nan)
  return result.replace(tokens=result.tokens[:, :checked.max_new_tokens], cost_table=costs)


def prepare(loop: Loop, params: LoopParams, checked: Checked, rows, rng,
            partitioner: Optional[Partitioner] = None) -> calibration.PreparedDecode:
  """The padded-batch decode of checked.inputs[rows] (placed on the first run only: a decode
  that runs the autoregressive loop instead never places them)."""
  inputs, length = checked.inputs[rows], checked.length[rows]
  batch = inputs.shape[0]

  @functools.lru_cache(maxsize=1)
  def placed():
    seq = initial_seq(loop.target, inputs, checked.cache_len)
    return place(partitioner, [params.target, params.drafter], [
        jnp.asarray(inputs), jnp.asarray(seq), jnp.asarray(length), row_keys(rng, batch)])

  def run(budget: int, gamma: Optional[int], control):
    (target_params, draft_params), arrays = placed()
    loop_params = LoopParams(target=target_params, drafter=draft_params, control=control)
    return unpad(partitioner, run_loop(loop, partitioner, loop_params, *arrays,
                                       jnp.int32(budget),
                                       jnp.int32(1 if gamma is None else gamma)), batch)

  spec = auto_spec(loop)
  return calibration.PreparedDecode(
      key=(loop, partitioner, inputs.shape, checked.cache_len),
      models=f"target {auto.describe(loop.target)}; drafter {auto.describe(loop.drafter)}",
      batch=batch, cache_len=checked.cache_len, max_gamma=loop.max_gamma,
      buckets=spec.buckets if spec else (), max_new_tokens=checked.max_new_tokens, run=run,
      alpha_rounds=spec.alpha_rounds if spec else None)
