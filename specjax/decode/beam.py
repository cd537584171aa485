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
- Before each step, a row stops when every finished entry is filled and the
  worst finished score beats the best live log-probability divided by the
  penalty of length max_new_tokens + 1 (T5X's `max_decode_len` after it adds
  the start token): log-probabilities only fall and the penalty only grows, so
  no live beam can still enter the finished set. It also stops after
  max_new_tokens steps.
- The result is the finished beams, or, for a row where none finished, the live
  beams with their raw log-probabilities. Finished entries never filled hold
  filler with a score near NEG_INF (T5X returns the same).

Where specjax differs from T5X: beams are kept in T5X's order (ascending,
best last) but returned best first, with 0 after each beam's length; a
decoder-only prompt is prefilled rather than forced token by token, so its
tokens count in neither the score nor the brevity penalty's length; rows stop
independently (T5X runs a batch until every row may stop, which changes no
result). Log-probabilities are those of the model at temperature 1.

`speculative_beam_search` (`specjax.decode.beam_speculative`) returns the same beams and
scores with fewer target calls. Its criterion is documented there.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp
from jax import lax

from specjax.decode.beam_core import (BeamResult, Beams, beam_step, beams_done, finish,
                                      init_beams, last_tokens, prepare, repeat_rows,
                                      select_rows, start_copies, gather_rows)
from specjax.decode.inputs import check_cache_size, check_count, check_eos, check_nan
from specjax.models import DecodingModel, fused
from specjax.runtime.sharding import Partitioner, constrain, place, unpad


# ----------------------------------------------------------------------- the loop


@flax.struct.dataclass
class _Loop:
  beams: Beams  # batched: [B, w, T] sequences, [B, w] scores, [B] steps
  cache: Any  # the target's cache, B * w rows (row b * w + i: live beam i of example b)
  done: jax.Array  # bool [B]
  target_calls: jax.Array  # int32 [B]
  nan: jax.Array  # bool [B]: NaN seen in this row's logits


@functools.partial(jax.jit, static_argnames=("model", "beam_size", "partitioner"))
def _beam_search(model, beam_size, partitioner, *args):
  with fused.placed_by(partitioner):
    return _beam_loop(model, beam_size, partitioner, *args)


def _beam_loop(model, beam_size, partitioner, params, inputs, seq, prefix_len, max_new_tokens,
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
        beams=beams, cache=gather_rows(cache, rows), done=done,
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
    partitioner: a `specjax.runtime.sharding.Partitioner` to run on its mesh (params in their
      shardings; examples padded to and split over 'data', their beams kept together).
  Returns:
    A `BeamResult`; `target_calls` counts the steps each row ran.
  """
  check_eos(model, eos_id)
  beam_size = check_count("beam_size", beam_size)
  prep = prepare(model, inputs, prompt_lengths, max_new_tokens, alpha, extra_positions=2)
  batch = prep.seq.shape[0]
  check_cache_size([model], batch * beam_size, prep.seq.shape[1], partitioner)
  (params,), rows = place(partitioner, [params], [
      jnp.asarray(prep.inputs), jnp.asarray(prep.seq), jnp.asarray(prep.prefix_len)])
  result, nan = unpad(partitioner, _beam_search(
      model, beam_size, partitioner, params, *rows, jnp.int32(max_new_tokens),
      jnp.float32(prep.alpha), jnp.int32(eos_id)), batch)
  check_nan(nan)
  return result.replace(sequences=result.sequences[:, :, :max_new_tokens])
