"""Beam search with T5X's semantics, and exact speculative beam search (paper A.4).

`beam_search` follows t5x/decoding.py::beam_search step for step:

- w live beams, scored by their log-probability, and w finished beams, scored
  by log-probability / brevity penalty, where the penalty is
  ((5 + length) / 6) ** alpha and length counts the generated tokens, EOS included.
- Each step feeds every live beam's last token (one target call), adds the
  log-softmax of its logits to the beam's log-probability and keeps the top 2w
  of all w * V extensions, so that w live beams remain even if w of them end in
  EOS. Extensions ending in EOS get NEG_INF added to their live score and the
  top w of the 2w become the live beams; the EOS ones, scored with the penalty
  of their length, compete with the old finished beams for the w finished slots.
- Before each step, a row stops when every finished slot is filled and the
  worst finished score beats the best live log-probability divided by the
  penalty of length max_new_tokens + 1 (T5X's `max_decode_len` after it adds
  the start token): log-probabilities only fall and the penalty only grows, so
  no live beam can still enter the finished set. It also stops after
  max_new_tokens steps.
- The result is the finished beams, or, for a row where none finished, the live
  beams with their raw log-probabilities. Finished slots never filled hold
  filler with a score near NEG_INF (T5X returns the same).

Where specjax differs from T5X: beams are kept in T5X's order (ascending,
best last) but returned best first, with 0 after each beam's length; a
decoder-only prompt is prefilled rather than forced token by token, so its
tokens count in neither the score nor the brevity penalty's length; rows stop
independently (T5X runs a batch until every row may stop, which changes no
result). Log-probabilities are those of the model at temperature 1.

`speculative_beam_search` (`specjax._beam_spec`) returns the same beams and
scores with fewer target calls. Its criterion is documented there.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Tuple

import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specjax.drafters import start_model
from specjax.models.protocol import DecodingModel
from specjax.sharding import Partitioner, constrain, place, unpad

NEG_INF = -1.0e7
"""T5X's beam-search "minus infinity": finite, so masked scores stay ordered."""


def brevity_penalty(alpha: Any, length: Any) -> jax.Array:
  """T5X's length normalization ((5 + length) / 6) ** alpha as float32."""
  return jnp.power((5.0 + jnp.asarray(length, jnp.float32)) / 6.0,
                   jnp.asarray(alpha, jnp.float32))


@flax.struct.dataclass
class BeamResult:
  """Beams best first, and per-row call counts."""

  sequences: jax.Array  # int32 [B, beam, max_new_tokens]: generated tokens, 0 after `lengths`
  scores: jax.Array  # float32 [B, beam]: finished: log p / brevity penalty; else raw log p
  lengths: jax.Array  # int32 [B, beam]: generated tokens, a final EOS included
  target_calls: jax.Array  # int32 [B]: target `decode` calls (steps or rounds), prefill excluded
  draft_calls: jax.Array  # int32 [B]: draft `decode` calls (0 for `beam_search`)


@flax.struct.dataclass
class Beams:
  """One example's beam state (T5X `BeamState` without the cache).

  The shapes are per example; loops hold a leading batch axis and vmap over it.
  """

  live_seq: jax.Array  # int32 [w, T]: decoder prefix then generated tokens of each live beam
  live_lp: jax.Array  # float32 [w]: log-probabilities, ascending (best last)
  fin_seq: jax.Array  # int32 [w, T]: finished beams (EOS included)
  fin_score: jax.Array  # float32 [w]: log-probability / brevity penalty, ascending
  fin_flag: jax.Array  # bool [w]: the slot holds a finished beam (not filler)
  step: jax.Array  # int32 []: tokens generated so far (T5X `cur_index`)


def init_beams(seq: jax.Array, beam_size: int) -> Beams:
  """seq: int32 [T] one example's decoder prefix -> its `Beams` before step 0."""
  live_lp = jnp.full((beam_size,), NEG_INF, jnp.float32).at[0].set(0.0)
  copies = jnp.broadcast_to(seq, (beam_size,) + seq.shape)
  return Beams(live_seq=copies, live_lp=live_lp, fin_seq=jnp.zeros_like(copies),
               fin_score=jnp.full((beam_size,), NEG_INF, jnp.float32),
               fin_flag=jnp.zeros((beam_size,), jnp.bool_), step=jnp.zeros((), jnp.int32))


def beam_step(beams: Beams, log_probs: jax.Array, prefix_len: jax.Array, alpha: jax.Array,
              eos_id: jax.Array) -> Tuple[Beams, jax.Array]:
  """One T5X beam-search step of one example.

  Args:
    beams: the example's state.
    log_probs: float32 [w, V], log-softmax of the target's logits at each live beam's end.
    prefix_len: int32 []: decoder prefix length (the new token goes to slot prefix_len + step).
    alpha: float32 [] brevity-penalty exponent.
    eos_id: int32 [].
  Returns:
    (new beams, parent int32 [w]: the old live beam each new live beam extends).
  """
  width, vocab = log_probs.shape
  flat = (log_probs + beams.live_lp[:, None]).reshape(-1)
  top_lp, top_index = lax.top_k(flat, 2 * width)  # ties: lowest flat index first, as T5X
  token = top_index % vocab
  parent = top_index // vocab
  seqs = beams.live_seq[parent].at[:, prefix_len + beams.step].set(token)  # [2w, T]
  is_eos = token == eos_id
  alive_lp = top_lp + is_eos * NEG_INF
  keep = jnp.flip(lax.top_k(alive_lp, width)[1])
  new_scores = top_lp / brevity_penalty(alpha, beams.step + 1) + (~is_eos) * NEG_INF
  scores = jnp.concatenate([beams.fin_score, new_scores])
  best = jnp.flip(lax.top_k(scores, width)[1])
  new = Beams(live_seq=seqs[keep], live_lp=alive_lp[keep],
              fin_seq=jnp.concatenate([beams.fin_seq, seqs])[best], fin_score=scores[best],
              fin_flag=jnp.concatenate([beams.fin_flag, is_eos])[best], step=beams.step + 1)
  return new, parent[keep]


def beams_done(beams: Beams, max_new_tokens: jax.Array, alpha: jax.Array) -> jax.Array:
  """bool []: T5X's stop test for one example (budget spent, or no live beam can win)."""
  best_live = beams.live_lp[-1] / brevity_penalty(alpha, max_new_tokens + 1)
  worst_finished = jnp.where(beams.fin_flag, jnp.min(beams.fin_score), NEG_INF)
  return jnp.all(worst_finished > best_live) | (beams.step >= max_new_tokens)


def select_rows(mask: jax.Array, new: Any, old: Any) -> Any:
  """Per batch row, `new` where mask (bool [B]) else `old`; leaves are batch-first."""
  return jax.tree.map(lambda n, o: jnp.where(mask.reshape((-1,) + (1,) * (n.ndim - 1)), n, o),
                      new, old)


def repeat_rows(tree: Any, copies: int) -> Any:
  """Repeats every batch-first leaf `copies` times along the batch (row b -> b*copies ...)."""
  return jax.tree.map(lambda x: jnp.repeat(x, copies, axis=0), tree)


def take_rows(tree: Any, index: jax.Array) -> Any:
  """Gathers rows `index` (int32 [R]) of every batch-first leaf (cache reordering)."""
  return jax.tree.map(lambda x: x[index], tree)


def start_copies(model: DecodingModel, params: Any, inputs: jax.Array, prefix_len: jax.Array,
                 cache_len: int, copies: int) -> Tuple[Any, Any]:
  """(cache with `copies` rows per example, encoded with one row per example).

  Encodes or prefills once per example (`drafters.start_model`); repeat
  `encoded` with `repeat_rows` to match the rows of a `decode` call.
  """
  cache, encoded, _ = start_model(model, params, inputs, prefix_len, cache_len)
  return repeat_rows(cache, copies), encoded


def last_tokens(beams: Beams, prefix_len: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """Batched beams -> (each live beam's last token int32 [B, w], its slot int32 [B])."""
  pos = prefix_len + beams.step - 1
  last = jnp.take_along_axis(beams.live_seq, pos[:, None, None], axis=2)[..., 0]
  return last, pos


def finish(beams: Beams, prefix_len: jax.Array, eos_id: jax.Array
           ) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """Batched final beams -> (tokens int32 [B, w, T], scores [B, w], lengths [B, w]), best first."""
  any_finished = jnp.any(beams.fin_flag, axis=1)
  seq = jnp.flip(jnp.where(any_finished[:, None, None], beams.fin_seq, beams.live_seq), 1)
  scores = jnp.flip(jnp.where(any_finished[:, None], beams.fin_score, beams.live_lp), 1)
  width = seq.shape[2]
  offsets = jnp.arange(width)
  index = jnp.clip(prefix_len[:, None, None] + offsets, 0, width - 1)
  tokens = jnp.take_along_axis(seq, index, axis=2)
  generated = offsets < beams.step[:, None, None]
  is_eos = (tokens == eos_id) & generated
  lengths = jnp.where(jnp.any(is_eos, 2), jnp.argmax(is_eos, 2) + 1, beams.step[:, None])
  tokens = jnp.where(offsets < lengths[..., None], tokens, 0)
  return tokens, scores, lengths.astype(jnp.int32)


# ------------------------------------------------------------------ input handling


def check_positive(name: str, value: Any) -> int:
  """Returns value as int; ValueError naming `name` unless it is an integer >= 1."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
  return int(value)


@dataclasses.dataclass(frozen=True)
class Prepared:
  """Validated host-side inputs of one generation."""

  inputs: np.ndarray  # int32 [B, L]: encoder inputs or prompts
  prefix_len: np.ndarray  # int32 [B]: decoder prefix (1 for T5's start token, else the prompt)
  seq: np.ndarray  # int32 [B, T]: decoder prefix, zero-padded to the buffer length T
  alpha: float


def prepare(model: DecodingModel, inputs: Any, prompt_lengths: Any, max_new_tokens: Any,
            alpha: Any, extra_slots: int) -> Prepared:
  """Validates inputs and sizes the buffers (prefix + max_new_tokens + extra_slots, to 128)."""
  check_positive("max_new_tokens", max_new_tokens)
  if not np.isfinite(alpha) or alpha < 0:
    raise ValueError(f"alpha must be a finite number >= 0 (the brevity-penalty exponent), "
                     f"got {alpha!r}")
  inputs = np.asarray(inputs)
  if inputs.ndim != 2 or not np.issubdtype(inputs.dtype, np.integer) or inputs.shape[1] == 0:
    raise ValueError(f"inputs must be an int array [batch, length], got {inputs.dtype} "
                     f"{inputs.shape}")
  if inputs.size and (inputs.min() < 0 or inputs.max() >= model.vocab_size):
    raise ValueError(f"inputs contain token ids outside [0, {model.vocab_size})")
  batch = inputs.shape[0]
  if model.is_encoder_decoder:
    empty = np.where((inputs != 0).sum(1) == 0)[0]
    if empty.size:
      raise ValueError(f"empty input: encoder inputs of rows {empty.tolist()} are all padding")
    prefix = np.ones(batch, np.int32)
  else:
    prefix = (np.asarray(prompt_lengths) if prompt_lengths is not None
              else (inputs != 0).sum(1)).astype(np.int32)
    if prefix.shape != (batch,) or np.any(prefix > inputs.shape[1]):
      raise ValueError(f"prompt_lengths must be [batch={batch}] and <= {inputs.shape[1]}, "
                       f"got {prefix.tolist()}")
    if np.any(prefix < 1):
      raise ValueError(f"empty prompt in rows {np.where(prefix < 1)[0].tolist()}: a "
                       "decoder-only model needs at least one prompt token")
  prefix_width = 1 if model.is_encoder_decoder else inputs.shape[1]  # prefill writes L slots
  width = prefix_width + int(max_new_tokens) + extra_slots
  width = -(-width // 128) * 128
  seq = np.zeros((batch, width), np.int32)
  if not model.is_encoder_decoder:
    seq[:, :inputs.shape[1]] = inputs
  return Prepared(inputs=inputs.astype(np.int32), prefix_len=prefix, seq=seq,
                  alpha=float(alpha))


def check_nan(nan: Any) -> None:
  """ValueError naming the rows whose logits held NaN."""
  rows = np.where(np.asarray(nan))[0]
  if rows.size:
    raise ValueError(f"NaN logits from the target or draft model in rows {rows.tolist()}")


# ----------------------------------------------------------------------- the loop


@flax.struct.dataclass
class _Loop:
  beams: Beams  # batched: [B, w, T] sequences, [B, w] scores, [B] steps
  cache: Any  # the target's cache, B * w rows (row b * w + i: live beam i of example b)
  done: jax.Array  # bool [B]
  target_calls: jax.Array  # int32 [B]
  nan: jax.Array  # bool [B]: NaN seen in this row's logits


@functools.partial(jax.jit, static_argnames=("model", "beam_size", "partitioner"))
def _beam_search(model, beam_size, partitioner, params, inputs, seq, prefix_len, max_new_tokens,
                 alpha, eos_id):
  batch, width = seq.shape
  cache, encoded = start_copies(model, params, inputs, prefix_len, width, beam_size)
  encoded = repeat_rows(encoded, beam_size)
  beams = jax.vmap(init_beams, in_axes=(0, None))(seq, beam_size)
  state = _Loop(beams=beams, cache=cache, done=jnp.zeros((batch,), jnp.bool_),
                target_calls=jnp.zeros((batch,), jnp.int32), nan=jnp.zeros((batch,), jnp.bool_))
  state, encoded = constrain(partitioner, (state, encoded))

  def body(state: _Loop) -> _Loop:
    active = ~state.done
    last, pos = last_tokens(state.beams, prefix_len)
    logits, cache = model.decode(params, state.cache, last.reshape(-1, 1),
                                 jnp.repeat(pos, beam_size), encoded)
    log_probs = jax.nn.log_softmax(logits[:, 0]).reshape(batch, beam_size, -1)
    new, parent = jax.vmap(beam_step, in_axes=(0, 0, 0, None, None))(
        state.beams, log_probs, prefix_len, alpha, eos_id)
    rows = (jnp.arange(batch)[:, None] * beam_size + parent).reshape(-1)
    beams = select_rows(active, new, state.beams)
    done = state.done | jax.vmap(beams_done, in_axes=(0, None, None))(beams, max_new_tokens,
                                                                      alpha)
    return constrain(partitioner, state.replace(
        beams=beams, cache=take_rows(cache, rows), done=done,
        target_calls=state.target_calls + active,
        nan=state.nan | (active & jnp.any(jnp.isnan(log_probs), axis=(1, 2)))))

  state = lax.while_loop(lambda s: jnp.any(~s.done), body, state)
  tokens, scores, lengths = finish(state.beams, prefix_len, eos_id)
  return BeamResult(sequences=tokens, scores=scores, lengths=lengths,
                    target_calls=state.target_calls,
                    draft_calls=jnp.zeros_like(state.target_calls)), state.nan


def beam_search(model: DecodingModel, params: Any, inputs: Any, *, beam_size: int,
                max_new_tokens: int, alpha: float = 0.6, eos_id: int = 1,
                prompt_lengths: Optional[Any] = None,
                partitioner: Optional[Partitioner] = None) -> BeamResult:
  """Beam search on one model with T5X's semantics (see the module docstring).

  One `lax.while_loop` under `jax.jit`; each step is one `decode` call over
  batch * beam_size rows. `max_new_tokens`, `alpha` and `eos_id` are data (no
  recompile while the rounded buffer length stays the same); `beam_size` is static.

  Args:
    model: a `DecodingModel` (encoder-decoder: the decoder starts with token 0;
      decoder-only: generation continues after each row's prompt).
    params: its parameters.
    inputs: int [B, L]: encoder inputs (T5) or left-aligned prompts (decoder-only), 0-padded.
    beam_size: w >= 1, the beams kept and returned.
    max_new_tokens: the most tokens generated per beam (EOS included).
    alpha: brevity-penalty exponent (T5X default 0.6; 0 ranks by raw log-probability).
    eos_id: the token that finishes a beam.
    prompt_lengths: optional int [B] for decoder-only prompts (default: non-zero count).
    partitioner: a `specjax.sharding.Partitioner` to run on its mesh (params in their
      shardings; examples padded to and split over 'data', their beams kept together).
  Returns:
    A `BeamResult`; `target_calls` counts the steps each row ran.
  """
  beam_size = check_positive("beam_size", beam_size)
  prep = prepare(model, inputs, prompt_lengths, max_new_tokens, alpha, extra_slots=2)
  batch = prep.seq.shape[0]
  (params,), rows = place(partitioner, [params], [
      jnp.asarray(prep.inputs), jnp.asarray(prep.seq), jnp.asarray(prep.prefix_len)])
  result, nan = unpad(partitioner, _beam_search(
      model, beam_size, partitioner, params, *rows, jnp.int32(max_new_tokens),
      jnp.float32(prep.alpha), jnp.int32(eos_id)), batch)
  check_nan(nan)
  return result.replace(sequences=result.sequences[:, :, :max_new_tokens])


def speculative_beam_search(target: DecodingModel, target_params: Any, draft: DecodingModel,
                            draft_params: Any, inputs: Any, *, beam_size: int,
                            draft_beam_size: int, gamma: int, max_new_tokens: int,
                            alpha: float = 0.6, eos_id: int = 1,
                            prompt_lengths: Optional[Any] = None) -> BeamResult:
  """Speculative beam search (paper A.4): `beam_search(target, ...)`'s beams with fewer calls.

  Each round the draft runs a beam search of width u and γ steps from the
  target's w live beams (ranked by the target's log-probabilities), the target
  scores every node of that search tree in ONE `decode` call (w + γ * u rows of
  γ + 1 tokens per example), and the target's beam search is replayed on those
  logits for as many steps as the tree covers its live beams (at least 1, at
  most γ + 1). The beams and scores are `beam_search`'s with the target alone,
  up to the float rounding of the batched call. See `specjax._beam_spec` for
  the exact criterion.

  Args:
    target: the target `DecodingModel`.
    target_params: its parameters.
    draft: the draft `DecodingModel` (same vocabulary and architecture family).
    draft_params: its parameters.
    inputs: int [B, L]: encoder inputs (T5) or left-aligned prompts (decoder-only), 0-padded.
    beam_size: w >= 1, the target's beams.
    draft_beam_size: u, w <= u <= w * V: the draft's beam width.
    gamma: γ >= 1, draft steps per round (static: changing it recompiles).
    max_new_tokens: the most tokens generated per beam (EOS included).
    alpha: brevity-penalty exponent.
    eos_id: the token that finishes a beam.
    prompt_lengths: optional int [B] for decoder-only prompts.
  Returns:
    A `BeamResult`; `target_calls` counts rounds, `draft_calls` the draft's calls.
  """
  from specjax import _beam_spec  # pylint: disable=import-outside-toplevel
  return _beam_spec.speculative_beam_search(
      target, target_params, draft, draft_params, inputs, beam_size=beam_size,
      draft_beam_size=draft_beam_size, gamma=gamma, max_new_tokens=max_new_tokens,
      alpha=alpha, eos_id=eos_id, prompt_lengths=prompt_lengths)


for _fn in (beam_search, speculative_beam_search):
  try:  # so gin files can bind `beam_search.beam_size = 4` (gin/decoding/beam*.gin)
    gin.external_configurable(_fn, module="specjax.beam")
  except ValueError:  # already registered (module reloaded)
    pass
