"""In-flight (continuous) batching: B slots kept busy over a stream of N inputs.

A padded batch runs until its slowest row is done, so rows that finished early ride along
as waste. The streaming decode keeps B slots instead: each round runs the loop's round
(`AutoregressiveLoop` or `SpeculativeLoop`) on all B slots, and before it every slot whose
example finished (EOS or budget) takes the next input of the queue:

  refill  the finished example's tokens and statistics go to its row of the output (input
          order); the next example is encoded (T5) or prefilled (decoder-only) for the slot,
          its drafter state started (`drafter.init` on that row), its key, prefix, γ,
          statistics and trace reset, all written into the slot's rows of the state
  round   draft -> score -> verify -> commit -> record over the B slots, unchanged

Both run inside ONE `lax.while_loop` under `jax.jit` (no host round trip per finished
row). The refill is itself a small while_loop that starts `refill_rows` examples per pass
(batch-R encode / prefill) until no slot is free or the queue is empty.

Randomness stays tied to (example key, absolute position, stream): a slot carries its
example's key, so an example's tokens do not depend on its slot or on its neighbours, and
equal those of a batch-1 decode with the same key. Static per call: the loop, N, the input
width, B, the cache length, `refill_rows`; `max_new_tokens`, γ and the progress stop are
data, so one compile serves every budget and γ.

With a progress callback the host runs the same compiled loop in chunks that stop after
every `slots` further examples finished (state donated from chunk to chunk).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import flax
import jax
import jax.numpy as jnp

from specjax.decode.inputs import check_count, check_nan
from specjax.decode.loop import finish
from specjax.decode.state import DecodeResult, LoopState
from specjax.sampling import row_keys
from specjax.sharding import Partitioner, constrain


@flax.struct.dataclass
class Slots:
  """The B slots of a streaming decode; every field slot (batch) axis first."""

  loop: LoopState  # the slots' decode state (target cache, drafter state, statistics, ...)
  encoded: Any  # the target's encoder output per slot (T5), None for decoder-only
  keys: jax.Array  # [B] typed keys or uint32 [B, 2]: the key of each slot's example
  prefix_len: jax.Array  # int32 [B]: decoder prefix length of each slot's example
  example: jax.Array  # int32 [B]: the example in the slot, -1 before its first


@flax.struct.dataclass
class Stream:
  """A streaming decode between two chunks: the slots, the queue and the outputs."""

  slots: Slots
  out: DecodeResult  # [N, ...] per example, input order; written when it leaves its slot
  nan: jax.Array  # bool [N]: NaN seen in the example's logits
  next: jax.Array  # int32 []: the next example of the queue
  finished: jax.Array  # int32 []: examples finished so far
  rounds: jax.Array  # int32 []: rounds run, each over all B slots


def _take(tree: Any, index: jax.Array) -> Any:
  """Rows `index` (int32 [K], clamped) of every batch-first leaf."""
  return jax.tree.map(lambda x: jnp.take(x, index, axis=0, mode="clip"), tree)


def _put(tree: Any, rows: Any, index: jax.Array) -> Any:
  """`tree` with rows[k] written at row index[k] of every leaf; rows at index >= B dropped."""
  return jax.tree.map(lambda x, r: x.at[index].set(r.astype(x.dtype), mode="drop"), tree, rows)


def _initial_seq(loop, inputs: jax.Array, width: int) -> jax.Array:
  """int32 [K, width]: the decoder prefix (T5: the start token 0; decoder-only: the prompt)."""
  seq = jnp.zeros((inputs.shape[0], width), jnp.int32)
  if loop.target.is_encoder_decoder:
    return seq
  return jax.lax.dynamic_update_slice(seq, inputs, (0, 0))


def _flush(stream: Stream, which: jax.Array) -> Stream:
  """Writes the results of slots `which` (int32 [K]; >= B: none) to their examples' rows."""
  slots = stream.slots
  batch, total = slots.example.shape[0], stream.nan.shape[0]
  index = jnp.minimum(which, batch - 1)
  example = jnp.where(which < batch, slots.example[index], -1)
  example = jnp.where(example >= 0, example, total)  # dropped
  kept = _take(slots.loop.replace(cache=None, drafter_state=None), index)
  result, nan = finish(kept, slots.prefix_len[index])
  return stream.replace(out=_put(stream.out, result, example),
                        nan=stream.nan.at[example].set(nan, mode="drop"))


def _refill(loop, rows: int, params, inputs, length, keys, stream: Stream, gamma) -> Stream:
  """Starts queued examples in finished slots, `rows` per pass, until none is free or the
  queue is empty."""
  total = inputs.shape[0]
  batch, width = stream.slots.loop.seq.shape

  def pending(s: Stream):
    return jnp.any(s.slots.loop.done) & (s.next < total)

  def one_pass(s: Stream) -> Stream:
    free = jnp.nonzero(s.slots.loop.done, size=rows, fill_value=batch)[0]  # int32 [R]
    example = s.next + jnp.arange(rows)
    take = (free < batch) & (example < total)
    free = jnp.where(take, free, batch)
    s = _flush(s, free)
    example = jnp.minimum(example, total - 1)
    new_inputs, new_length = inputs[example], length[example]
    state, encoded = loop.start(params, new_inputs, _initial_seq(loop, new_inputs, width),
                                new_length, gamma)
    fresh = Slots(loop=state, encoded=encoded, keys=keys[example], prefix_len=new_length,
                  example=example)
    return s.replace(slots=_put(s.slots, fresh, free), next=s.next + jnp.sum(take))

  return jax.lax.while_loop(pending, one_pass, stream)


@functools.partial(jax.jit, static_argnames=("loop", "rows", "partitioner"),
                   donate_argnames=("stream",))
def _run(loop, rows, partitioner, params, inputs, length, keys, stream: Stream, max_new_tokens,
         gamma, stop_after) -> Stream:
  """Rounds (each after a refill) until every example is done or `stop_after` finished."""
  total = inputs.shape[0]
  batch = stream.slots.example.shape[0]

  def more(s: Stream):
    return (jnp.any(~s.slots.loop.done) | (s.next < total)) & (s.finished < stop_after)

  def body(s: Stream) -> Stream:
    s = _refill(loop, rows, params, inputs, length, keys, s, gamma)
    slots = s.slots
    after = loop.round(params, slots.loop, slots.keys, slots.encoded, slots.prefix_len,
                       max_new_tokens)
    newly = jnp.sum(after.done & ~slots.loop.done)
    return s.replace(slots=constrain(partitioner, slots.replace(loop=after)),
                     finished=s.finished + newly, rounds=s.rounds + 1)

  stream = jax.lax.while_loop(more, body, stream)
  ended = stream.slots.loop.done & (stream.slots.example >= 0)
  return _flush(stream, jnp.where(ended, jnp.arange(batch), batch))


def _zeros(shapes: Any) -> Any:
  return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)


def _empty(loop, batch: int, width: int, params, inputs, length, keys, gamma) -> Stream:
  """A stream with B empty (done) slots and zeroed outputs, shaped by `loop.start`."""
  total = inputs.shape[0]
  some = jnp.arange(batch) % total

  def slot_shapes():
    first = inputs[some]
    return loop.start(params, first, _initial_seq(loop, first, width), length[some], gamma)

  state, encoded = _zeros(jax.eval_shape(slot_shapes))
  slots = Slots(loop=state.replace(done=jnp.ones((batch,), jnp.bool_)), encoded=encoded,
                keys=keys[some], prefix_len=jnp.ones((batch,), jnp.int32),
                example=jnp.full((batch,), -1, jnp.int32))
  kept = slots.loop.replace(cache=None, drafter_state=None)
  result, nan = _zeros(jax.eval_shape(
      lambda: finish(_take(kept, jnp.zeros((total,), jnp.int32)), jnp.ones((total,), jnp.int32))))
  zero = lambda: jnp.zeros((), jnp.int32)  # three buffers: the stream is donated
  return Stream(slots=slots, out=result, nan=nan, next=zero(), finished=zero(), rounds=zero())


def stream_decode(loop, params: Any, inputs: jax.Array, length: jax.Array, keys: jax.Array, *,
                  slots: int, width: int, max_new_tokens: int, gamma: int = 1,
                  refill_rows: int = 1, partitioner: Optional[Partitioner] = None,
                  on_progress: Optional[Callable[[int, int], None]] = None):
  """Decodes N examples through `slots` slots (inputs checked and sized by the caller).

  Args:
    loop: an `AutoregressiveLoop` or `SpeculativeLoop` (static).
    params: the loop's params (placed already when a partitioner is given).
    inputs: int32 [N, L]; length: int32 [N] decoder prefix lengths; keys: [N] example keys.
    slots: B, rows decoded per round.
    width: decoder slots per row (the cache length).
    max_new_tokens, gamma: data (no recompile).
    refill_rows: examples started per refill pass (static; 1 ≤ R ≤ B): a pass encodes /
      prefills R rows, so R = 1 suits few slots finishing per round, R = B many.
    partitioner: slot state constrained to its mesh (B a multiple of its 'data' axis).
    on_progress: called as on_progress(examples done, N) after every `slots` further
      examples finished (each call ends one jitted chunk); None: one call runs all.
  Returns:
    (DecodeResult [N, width] in input order with `rounds` and `slots` set, nan bool [N]).
  """
  total = inputs.shape[0]
  stream = _empty(loop, slots, width, params, inputs, length, keys, jnp.int32(gamma))
  done = 0
  while True:
    stop = total if on_progress is None else min(done + slots, total)
    stream = _run(loop, refill_rows, partitioner, params, inputs, length, keys, stream,
                  jnp.int32(max_new_tokens), jnp.int32(gamma), jnp.int32(stop))
    done = int(stream.finished)
    if on_progress is not None:
      on_progress(done, total)
    if done >= total:
      break
  return stream.out.replace(rounds=stream.rounds, slots=slots), stream.nan


def check_slots(slots: Any, refill_rows: Any, partitioner: Optional[Partitioner] = None) -> int:
  """The slot count B (rounded up to a multiple of the partitioner's 'data' axis); ValueError
  unless slots >= 1 and 1 <= refill_rows <= slots."""
  slots = check_count("slots", slots)
  refill_rows = check_count("refill_rows", refill_rows)
  if refill_rows > slots:
    raise ValueError(f"refill_rows must be in [1, slots={slots}], got {refill_rows}")
  return slots if partitioner is None else partitioner.pad_rows(slots)


def decode_streaming(loop, params, inputs, length, rng, *, slots: int, width: int,
                     max_new_tokens: int, gamma: int = 1, refill_rows: int = 1,
                     partitioner: Optional[Partitioner] = None,
                     on_progress: Optional[Callable[[int, int], None]] = None) -> DecodeResult:
  """`stream_decode` from host arrays: per-example keys from `rng` (as `row_keys`), NaN rows
  reported, tokens cut to max_new_tokens. Params must already sit on the partitioner's mesh."""
  keys = row_keys(rng, inputs.shape[0])
  result, nan = stream_decode(loop, params, jnp.asarray(inputs), jnp.asarray(length), keys,
                              slots=slots, width=width, max_new_tokens=max_new_tokens,
                              gamma=gamma, refill_rows=refill_rows, partitioner=partitioner,
                              on_progress=on_progress)
  check_nan(nan)
  return result.replace(tokens=result.tokens[:, :max_new_tokens])
