"""Pieces shared by `beam_search` and `speculative_beam_search`: beams, one beam step, inputs.

See `specjax.decode.beam` for the semantics (T5X's beam search).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specjax.decode.inputs import (cache_length, check_count, check_inputs, initial_seq,
                                   prefix_lengths)
from specjax.models import DecodingModel, start_model

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
  fin_flag: jax.Array  # bool [w]: the entry holds a finished beam (not filler)
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
    prefix_len: int32 []: decoder prefix length (the new token goes to position prefix_len + step).
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


def gather_rows(tree: Any, index: jax.Array) -> Any:
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
  """Batched beams -> (each live beam's last token int32 [B, w], its position int32 [B])."""
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


@dataclasses.dataclass(frozen=True)
class Prepared:
  """Validated host-side inputs of one generation."""

  inputs: np.ndarray  # int32 [B, L]: encoder inputs or prompts
  prefix_len: np.ndarray  # int32 [B]: decoder prefix (1 for T5's start token, else the prompt)
  seq: np.ndarray  # int32 [B, T]: decoder prefix, zero-padded to the buffer length T
  alpha: float


def prepare(model: DecodingModel, inputs: Any, prompt_lengths: Any, max_new_tokens: Any,
            alpha: Any, extra_positions: int) -> Prepared:
  """Validates inputs and sizes the buffers (prefix + max_new_tokens + extra_positions, to 128)."""
  max_new_tokens = check_count("max_new_tokens", max_new_tokens)
  if isinstance(alpha, bool) or not np.isfinite(alpha) or alpha < 0:
    raise ValueError(f"alpha must be a finite number >= 0 (the brevity-penalty exponent), "
                     f"got {alpha!r}")
  inputs = check_inputs(model, inputs)
  prefix = prefix_lengths(model, inputs, prompt_lengths)
  prefix_width = 1 if model.is_encoder_decoder else inputs.shape[1]  # prefill writes L positions
  width = cache_length(None, prefix_width, max_new_tokens, extra_positions)
  return Prepared(inputs=inputs, prefix_len=prefix, seq=initial_seq(model, inputs, width),
                  alpha=float(alpha))
