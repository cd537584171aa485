"""In-flight (continuous) batching: B slots kept busy over a stream of N inputs.

A padded batch runs until its slowest row is done, so rows that finished early ride along
as waste. The streaming decode keeps B slots instead: each round runs the loop's round
(`AutoregressiveLoop`, `SpeculativeLoop` or `TreeLoop`) on all B slots, and before it every slot whose
example finished (EOS or budget) takes the next input of the queue:

  refill  the finished example's tokens and statistics go to its row of the output (input
          order); the next example is encoded (T5) or prefilled (decoder-only) for the slot,
          its drafter state started (`drafter.init` on that row), its key, prefix, γ,
          statistics and trace reset, all written into the slot's rows of the state
  round   draft -> score -> verify -> commit -> record over the B slots, unchanged (under
          the 'auto' γ policy: its phases of rounds, until a slot is free and the queue
          still holds an input)

Both run inside ONE `lax.while_loop` under `jax.jit` (no host round trip per finished
row). The refill is itself a small while_loop that starts `refill_rows` examples per pass
(batch-R encode / prefill) until no slot is free or the queue is empty.

Randomness stays tied to (example key, absolute position, stream): a slot carries its
example's key, so an example's tokens do not depend on its slot or on its neighbours, and
equal those of a batch-1 decode with the same key. Static per call: the loop, the input
width, B, the cache length, `refill_rows` and N's bucket (a power of two, at least 16);
N, `max_new_tokens`, γ and the progress stop are data, so one compile serves every budget
and γ.

With a progress callback the host runs the same compiled loop in chunks that stop after
every B further examples finished (state donated from chunk to chunk). Tail shrink
(`Streaming.min_slots`): once the queue is empty and at most half the slots are busy, the
chunk ends, the busy rows move to a state of B/2 slots (a gather, `_shrink`) and the loop
goes on there (one more compile per size), so the drain runs fewer idle rows.
Utilization is counted in row-rounds: Σ target calls / Σ over rounds of the slots run.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional, Tuple

import flax
import jax
import jax.numpy as jnp

from specjax.decode.inputs import check_count
from specjax.decode.loop import finish
from specjax.decode.state import DecodeResult, LoopState
from specjax.models import fused
from specjax.runtime.sharding import Partitioner, constrain, unpad


MIN_BUCKET = 16
"""The smallest queue the compiled loop is shaped for (see `stream_decode`)."""


@dataclasses.dataclass(frozen=True)
class Streaming:
  """How a decode streams its inputs through slots (`slots=` of the decode functions)."""

  slots: int
  """B: rows decoded per round; a finished row's slot takes the next input."""
  refill_rows: int = 1
  """Inputs started per refill pass (1 ≤ R ≤ B): a pass encodes / prefills R rows at once, so
  R = 1 suits few rows finishing per round (large models), R = B many (tiny ones)."""
  min_slots: Optional[int] = None
  """Tail shrink: once the queue is empty and at most half the slots are busy, the busy rows
  move to B/2 slots (then B/4, ... down to min_slots), so the drain does not run idle rows;
  each size is one more compile. None: B throughout."""

  def __post_init__(self):
    check_count("slots", self.slots)
    check_count("refill_rows", self.refill_rows)
    if self.refill_rows > self.slots:
      raise ValueError(f"refill_rows must be in [1, slots={self.slots}], got {self.refill_rows}")
    if self.min_slots is not None and check_count("min_slots", self.min_slots) > self.slots:
      raise ValueError(f"min_slots must be in [1, slots={self.slots}], got {self.min_slots}")

  def sizes(self, partitioner: Optional[Partitioner] = None) -> Tuple[int, ...]:
    """The slot counts the stream runs with: B (rounded up to a multiple of the partitioner's
    'data' axis), then its halvings down to min_slots that the 'data' axis still divides."""
    data = 1 if partitioner is None else partitioner.data_size
    first = -(-self.slots // data) * data
    sizes = [first]
    while (self.min_slots is not None and sizes[-1] // 2 >= self.min_slots
           and sizes[-1] % 2 == 0 and (sizes[-1] // 2) % data == 0):
      sizes.append(sizes[-1] // 2)
    return tuple(sizes)

  def rows(self, partitioner: Optional[Partitioner] = None) -> int:
    """Rows the stream holds at once: its first slot count and a refill pass's rows."""
    return self.sizes(partitioner)[0] + self.refill_rows


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
  rounds: jax.Array  # int32 []: rounds run
  slot_rounds: jax.Array  # int32 []: Σ over the rounds run of the slots each ran


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


def _refill(loop, rows: int, params, inputs, length, keys, total, stream: Stream,
            gamma) -> Stream:
  """Starts queued examples (0..total-1) in finished slots, `rows` per pass, until none is
  free or the queue is empty."""
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
def _run(loop, rows, partitioner, params, inputs, length, keys, total, stream: Stream,
         max_new_tokens, gamma, stop_after, shrink_at) -> Stream:
  """Rounds (each after a refill) until the `total` examples are done, `stop_after` are, or
  the queue is empty with at most `shrink_at` rows busy (0: never)."""
  batch = stream.slots.example.shape[0]

  def more(s: Stream):
    busy = jnp.sum(~s.slots.loop.done)
    shrink = (s.next >= total) & (busy <= shrink_at)
    return ((busy > 0) | (s.next < total)) & (s.finished < stop_after) & ~shrink

  def body(s: Stream) -> Stream:
    s = _refill(loop, rows, params, inputs, length, keys, total, s, gamma)
    slots = s.slots
    # Rounds until a slot is free while the queue still holds an input (one round for fixed
    # γ policies; the 'auto' policy's phases run several).
    queue_empty = s.next >= total
    after = loop.rounds(params, slots.loop, slots.keys, slots.encoded, slots.prefix_len,
                        max_new_tokens, running=lambda st: queue_empty | jnp.all(~st.done),
                        place=functools.partial(constrain, partitioner))
    newly = jnp.sum(after.done & ~slots.loop.done)
    # A row busy in the last round was busy in all of them (nothing restarts inside).
    ran = jnp.maximum(jnp.max(after.target_calls - slots.loop.target_calls), 1)
    return s.replace(slots=constrain(partitioner, slots.replace(loop=after)),
                     finished=s.finished + newly, rounds=s.rounds + ran,
                     slot_rounds=s.slot_rounds + batch * ran)

  with fused.placed_by(partitioner):
    stream = jax.lax.while_loop(more, body, stream)
  ended = stream.slots.loop.done & (stream.slots.example >= 0)
  # Out as in (`_placed`): the next chunk's call hits the same compiled loop.
  return constrain(partitioner, _flush(stream, jnp.where(ended, jnp.arange(batch), batch)))


def _placed(stream: Stream, partitioner: Optional[Partitioner]) -> Stream:
  """The stream in the shardings `_run` returns it in (nothing to do without a partitioner)."""
  if partitioner is None:
    return stream
  return jax.device_put(stream, partitioner.state_shardings(stream))


def _shrink(stream: Stream, size: int) -> Stream:
  """The busy slots (at most `size`; finished ones are flushed already) moved to `size` slots
  (eager: one gather per slot field; the outputs are passed on as they are)."""
  order = jnp.argsort(stream.slots.loop.done, stable=True)[:size]  # busy first
  return stream.replace(slots=_take(stream.slots, order))


def _zeros(shapes: Any) -> Any:
  return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _empty(loop, batch: int, width: int, params, inputs, length, keys, gamma) -> Stream:
  """A stream with B empty (done) slots and zeroed outputs, shaped by `loop.start`.
  Jitted: the shapes are traced once per static config, not on every decode call (on the
  host, tracing `loop.start` and the ~50 eager zeros cost ~30 ms per call)."""
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
  zero = lambda: jnp.zeros((), jnp.int32)  # one buffer each: the stream is donated
  return Stream(slots=slots, out=result, nan=nan, next=zero(), finished=zero(), rounds=zero(),
                slot_rounds=zero())


def chunk_program(loop, params: Any, inputs: Any, length: Any, keys: Any, *, slots: int,
                  refill_rows: int, width: int) -> Tuple[Callable, Tuple]:
  """(a jitted function, its arguments): one chunk of a streamed decode through `slots` slots,
  the program `stream_decode` runs, for compiling it elsewhere (`specjax.aot` compiles it for
  an accelerator). Arguments may be abstract (`jax.ShapeDtypeStruct`): params, inputs int32
  [N, L], length int32 [N], keys [N]; the stream and the scalars come back abstract."""
  scalar = jax.ShapeDtypeStruct((), jnp.int32)
  stream = jax.eval_shape(lambda p, i, n, k: _empty(loop, slots, width, p, i, n, k, jnp.int32(1)),
                          params, inputs, length, keys)
  program = jax.jit(lambda *args: _run(loop, refill_rows, None, *args))
  return program, (params, inputs, length, keys, scalar, stream, scalar, scalar, scalar, scalar)


def stream_decode(loop, params: Any, inputs: jax.Array, length: jax.Array, keys: jax.Array, *,
                  streaming: Streaming, width: int, max_new_tokens: int, gamma: int = 1,
                  partitioner: Optional[Partitioner] = None,
                  on_progress: Optional[Callable[[int, int], None]] = None):
  """Decodes N examples through `streaming.slots` slots (inputs checked and sized by the caller).

  Args:
    loop: an `AutoregressiveLoop`, `SpeculativeLoop` or `TreeLoop` (static).
    params: the loop's params (placed already when a partitioner is given).
    inputs: int32 [N, L]; length: int32 [N] decoder prefix lengths; keys: [N] example keys
      (padded here to a bucket of rows: N itself is data).
    streaming: slots, refill rows and tail shrink (static).
    width: decoder slots per row (the cache length).
    max_new_tokens, gamma: data (no recompile).
    partitioner: slot state constrained to its mesh (slot counts: multiples of its 'data' axis).
    on_progress: called as on_progress(examples done, N) after every B further examples
      finished (each call ends one jitted chunk); None: one call per slot count runs all.
  Returns:
    (DecodeResult [N, width] in input order with `rounds` and `slot_rounds` set, nan bool [N]).
  """
  total = inputs.shape[0]
  # The queue's arrays are padded to a bucket (a power of two, >= MIN_BUCKET rows; the count is
  # data), so streams of other lengths in the same bucket reuse the compiled loop.
  bucket = max(MIN_BUCKET, 1 << (total - 1).bit_length())
  pad = lambda x: jnp.concatenate([x, jnp.repeat(x[:1], bucket - total, axis=0)])
  inputs, length, keys = pad(inputs), pad(length), pad(keys)
  sizes = list(streaming.sizes(partitioner))
  stream = _placed(_empty(loop, sizes[0], width, params, inputs, length, keys, jnp.int32(gamma)),
                   partitioner)
  done = 0
  while True:
    shrink_at = sizes[1] if len(sizes) > 1 else 0
    stop = total if on_progress is None else min(done + sizes[0], total)
    stream = _run(loop, streaming.refill_rows, partitioner, params, inputs, length, keys,
                  jnp.int32(total), stream, jnp.int32(max_new_tokens), jnp.int32(gamma),
                  jnp.int32(stop), jnp.int32(shrink_at))
    if on_progress is not None and int(stream.finished) > done:
      on_progress(int(stream.finished), total)
    done = int(stream.finished)
    if done >= total:
      break
    busy = int(jnp.sum(~stream.slots.loop.done))
    if shrink_at and int(stream.next) >= total and busy <= shrink_at:
      sizes.pop(0)
      stream = _placed(_shrink(stream, sizes[0]), partitioner)
  if partitioner is not None and partitioner.spans_processes:  # cut and replicated to all
    out, nan = unpad(partitioner, (stream.out, stream.nan), total)
  else:
    out, nan = _first_rows(total, stream.out, stream.nan)
  return out.replace(rounds=stream.rounds, slot_rounds=stream.slot_rounds), nan


@functools.partial(jax.jit, static_argnums=0)
def _first_rows(total: int, out, nan):
  """The stream's outputs cut from the queue's bucket to its N examples (one call)."""
  return jax.tree.map(lambda x: x[:total], (out, nan))


def as_streaming(slots: Any) -> Optional[Streaming]:
  """`slots=` of the decode functions: None, a slot count B, or a `Streaming`."""
  if slots is None or isinstance(slots, Streaming):
    return slots
  return Streaming(slots=slots)
