"""The baseline loop: one token per target call, one `lax.while_loop` under `jax.jit`."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Callable, Optional, Tuple, Union

import jax
import jax.numpy as jnp

from specjax.decode import runner
from specjax.decode.config import DecodeConfig
from specjax.decode.loop import advance, bad_logits, going, last_tokens, start_loop
from specjax.decode.state import DecodeResult, LoopParams, LoopState
from specjax.decode.stream import Streaming
from specjax.models import DecodingModel
from specjax.models.protocol import layers_kwargs
from specjax.sampling import CORRECTION_STREAM, Sampling, position_key
from specjax.runtime.sharding import Partitioner


def next_tokens(sampling: Sampling, keys: jax.Array, length: jax.Array,
                logits: jax.Array) -> jax.Array:
  """The token each row draws at position `length` from logits [B, V] -> int32 [B].

  Key: the row's (position, correction stream) key, shared by every loop that takes a
  plain target step (here, and the speculative loop's γ = 0 rounds).
  """
  step_keys = jax.vmap(position_key, in_axes=(0, 0, None))(keys, length, CORRECTION_STREAM)
  return jax.vmap(sampling.sample)(step_keys, logits)


@dataclasses.dataclass(frozen=True)
class AutoregressiveLoop:
  """The baseline as a `runner.Loop`: one target call per row per round (static, hashable).
  `params` is a `LoopParams` (the target's; no drafter)."""

  target: DecodingModel
  config: DecodeConfig

  drafter: ClassVar[None] = None
  max_gamma: ClassVar[int] = 0

  @classmethod
  def of(cls, target: DecodingModel, config: DecodeConfig) -> "AutoregressiveLoop":
    """The loop for `config`, keeping only what it reads (sampling, EOS, cache length), so
    every decode that runs it (an 'auto' fallback included) shares one compiled loop."""
    return cls(target, DecodeConfig(sampling=config.sampling, eos_id=config.eos_id,
                                    cache_len=config.cache_len))

  def start(self, params: LoopParams, inputs, seq, length, gamma) -> Tuple[LoopState, Any]:
    """inputs [B, L], seq [B, T], length [B] -> (LoopState, encoded) after encode / prefill."""
    del gamma  # one token per call
    return start_loop(self.target, params.target, inputs, seq, length, seq.shape[1], 1)

  def round(self, params: LoopParams, state: LoopState, keys, encoded, prefix_len,
            max_new_tokens) -> LoopState:
    """One target call per row: keys [B] row keys, prefix_len int32 [B]."""
    return self.step(params, state, keys, encoded, prefix_len, max_new_tokens)[0]

  def step(self, params: LoopParams, state: LoopState, keys, encoded, prefix_len,
           max_new_tokens, features: bool = False, feature_layers=None
           ) -> Tuple[LoopState, Any]:
    """`round`, and with `features` (static) the target's features at the scored position
    (float32 [B, 1, E], `decode_features`, or [B, 1, n * E] with static `feature_layers`;
    else None)."""
    tokens, positions = last_tokens(state), state.length - 1
    if features:
      logits, scored, cache = self.target.decode_features(params.target, state.cache, tokens,
                                                          positions, encoded,
                                                          **layers_kwargs(feature_layers))
    else:
      (logits, cache), scored = self.target.decode(params.target, state.cache, tokens,
                                                   positions, encoded), None
    token = next_tokens(self.config.sampling, keys, state.length, logits[:, 0])
    seq, length, done = advance(state, token[:, None], jnp.ones_like(state.length), prefix_len,
                                max_new_tokens, self.config.eos_id)
    active = ~state.done
    return state.replace(
        seq=seq, length=length, done=done, cache=cache, target_calls=state.target_calls + active,
        nan=state.nan | (active & bad_logits(logits))), scored

  def going(self, params: LoopParams, state: LoopState) -> jax.Array:
    """bool []: whether the decode goes on (a row is busy)."""
    del params
    return going(state)

  def rounds(self, params: LoopParams, state: LoopState, keys, encoded, prefix_len,
             max_new_tokens, running: Callable = lambda s: True,
             place: Callable = lambda s: s) -> LoopState:
    """One round (`running` is not needed)."""
    del running
    return place(self.round(params, state, keys, encoded, prefix_len, max_new_tokens))


def autoregressive_decode(model: DecodingModel, params: Any, inputs, *, max_new_tokens: int,
                          rng: jax.Array, config: DecodeConfig = DecodeConfig(),
                          prompt_lengths=None,
                          partitioner: Optional[Partitioner] = None,
                          slots: Union[int, Streaming, None] = None,
                          on_progress: Optional[Callable[[int, int], None]] = None
                          ) -> DecodeResult:
  """The baseline: one token per target call (T5X `temperature_sample` semantics).

  Args:
    model: a `DecodingModel` (encoder-decoder or decoder-only).
    params: its parameters.
    inputs: int32 [B, L]: encoder inputs (T5) or left-aligned prompts (decoder-only), 0-padded.
    max_new_tokens: generation budget per row (data: changing it does not recompile
      as long as `config.cache_len` is set or the rounded cache length is unchanged).
    rng: one PRNG key, or one key per row [B].
    config: static settings.
    prompt_lengths: optional int [B] for decoder-only prompts (default: non-zero count).
    partitioner: a `specjax.runtime.sharding.Partitioner` to run on its mesh (params placed
      in their shardings, the batch padded to and split over the 'data' axis).
    slots: stream the B inputs through this many slots (in-flight batching,
      `specjax.decode.stream`): a finished row takes the next input. None: one padded batch.
      A `specjax.decode.Streaming` sets refill rows and the tail shrink too.
    on_progress: streaming: called as on_progress(done, B) after every `slots` finished inputs.
  Returns:
    A `DecodeResult` with tokens [B, max_new_tokens], in input order (streaming: with
    `rounds` and `slot_rounds`, see `DecodeResult.slot_utilization`).
  """
  entry = runner.enter(model, config, inputs, max_new_tokens, prompt_lengths, slots,
                       partitioner)
  return runner.decode(AutoregressiveLoop.of(model, entry.config), LoopParams(target=params),
                       entry.checked, rng, streaming=entry.streaming, partitioner=partitioner,
                       on_progress=on_progress)
