"""Speculative beam search (paper A.4), equal to `beam_search` by construction.

A round, for one example whose w live target beams (the round's *roots*) have
`step` generated tokens and end at position r = prefix + step - 1:

1. Draft. The draft runs one beam search of width u >= w for γ steps, started
   from the w roots scored with the target's log-probabilities (as the
   target's next step ranks them) and extended by the draft's log-probabilities;
   extensions by EOS are dropped (a finished target beam needs no more logits).
   Every node of this search is kept, not only the final beams: γ * u nodes,
   each a chain of 1..γ tokens after one root (the target may keep a beam that
   the draft's search dropped a step later). γ draft calls: the first over the
   w roots (a window that catches their caches up), the others over the u beams.
2. Score. ONE target `decode` call over w + γ * u rows per example, all at
   position r: each root's row feeds [root's last token, 0, ..., 0], each node's
   row [root's last token, its chain, 0, ...]. A row's logits at position s are
   the target's logits after its root and exactly the row's first s tokens.
3. Replay. The target's beam search runs from the roots with the same
   `beam_step` as `beam_search`, for s = 0, 1, ..., γ. Before step s every live
   beam is its root plus s tokens, and the step needs the target's logits
   after each of them, which a row of the beam's root holds iff the beam's s
   tokens after the root are the row's first s tokens (s = 0: every root has a row).
   Criterion: step s runs iff the example is not done (T5X's stop test and the
   budget, checked before every step exactly as in `beam_search`) and each of
   the w live beams, filler beams included, lies on a scored row of its root.
   The replay stops at the first step that fails it. A round therefore costs
   one target call and advances 1 to γ + 1 steps, each computed by the same code
   on the logits `beam_search` would compute: the beams and scores are equal,
   up to the float rounding between a (γ + 1)-token and a 1-token `decode`
   call (exactly equal for table models). When the draft equals the target and
   u = w, the draft's beams at every depth are the target's, so every round
   runs γ + 1 steps.
4. Caches. The loop keeps one target and one draft cache row per root. After
   n steps each new live beam extends a parent that lay on row p (the row whose
   logits the last step read); row p of the round's target cache holds every
   token of the new beam but its last, so the new root's target row is copied
   from p. The draft keeps the cache row of the new beam's old root, valid up
   to position r; the next round's first draft call feeds the new root's tokens from
   position r + 1 on (at most γ + 1 of them) before drafting.
"""
from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
from jax import lax

from specjax.decode.beam_core import (NEG_INF, BeamResult, Beams, beam_step, beams_done, finish,
                                      gather_rows, init_beams, last_tokens, prepare, repeat_rows,
                                      start_copies)
from specjax.decode.inputs import check_cache_size, check_count, check_eos, check_nan
from specjax.models import DecodingModel, check_same_vocab


@flax.struct.dataclass
class _SpecLoop:
  beams: Beams  # the target's beams, batched: [B, w, T] sequences, [B, w] scores, [B] steps
  cache: Any  # the target's cache of the roots: B * w rows (row b * w + i: live beam i)
  draft_cache: Any  # the draft's cache of the roots, the same rows, valid below `valid`
  valid: jax.Array  # int32 [B]: root position - γ <= valid <= root position
  done: jax.Array  # bool [B]
  target_calls: jax.Array  # int32 [B]
  draft_calls: jax.Array  # int32 [B]
  nan: jax.Array  # bool [B]: NaN seen in the target logits a step used


def _gather(tree: Any, index: jax.Array) -> Any:
  """Row index[b, j] of example b, for every batch-first leaf [B * k, ...] -> [B * J, ...]."""
  batch, k = index.shape[0], jax.tree.leaves(tree)[0].shape[0] // index.shape[0]
  return gather_rows(tree, (jnp.arange(batch)[:, None] * k + index).reshape(-1))


def _draft_tree(draft, params, cache, encoded_roots, encoded_paths, beams, prefix_len, valid,
                gamma, u, eos_id):
  """The draft's width-u beam search of γ steps from the roots, every node kept.

  Args:
    cache: the draft's cache of the roots (B * w rows), valid below position `valid`.
    valid: int32 [B], root position - γ <= valid <= root position.
  Returns:
    (chains int32 [B, γ * u, γ]: node j of depth d (row d * u + j) as tokens after
     its root, 0 beyond d; node_root int32 [B, γ * u]; the draft's root cache,
     now valid up to the root position).
  """
  batch, width, _ = beams.live_seq.shape
  _, pos = last_tokens(beams, prefix_len)
  window = jnp.take_along_axis(beams.live_seq, valid[:, None, None] + jnp.arange(gamma + 1),
                               axis=2)  # catch up from `valid` to the root's last token
  logits, cache = draft.decode(params, cache, window.reshape(-1, gamma + 1),
                               jnp.repeat(valid, width), encoded_roots)
  logits = jnp.take_along_axis(logits, jnp.repeat(pos - valid, width)[:, None, None], axis=1)
  vocab = logits.shape[-1]
  no_eos = jnp.where(jnp.arange(vocab) == eos_id, NEG_INF, 0.0)

  def best(scores, logits):
    """scores [B, K], logits [B * K, V] -> the u best extensions (score, parent, token)."""
    log_probs = (jax.nn.log_softmax(logits) + no_eos).reshape(batch, -1, vocab)
    scores, index = lax.top_k((scores[:, :, None] + log_probs).reshape(batch, -1), u)
    return scores, index // vocab, index % vocab

  scores, root, token = best(beams.live_lp, logits[:, 0])  # roots ranked as the target would
  chain = jnp.zeros((batch, u, gamma), jnp.int32).at[:, :, 0].set(token)
  chains = jnp.zeros((batch, gamma, u, gamma), jnp.int32).at[:, 0].set(chain)
  node_root = jnp.zeros((batch, gamma, u), jnp.int32).at[:, 0].set(root)

  def body(i, carry):
    scores, chain, root, path_cache, token, chains, node_root = carry
    logits, path_cache = draft.decode(params, path_cache, token.reshape(-1, 1),
                                      jnp.repeat(pos + i, u), encoded_paths)
    scores, parent, token = best(scores, logits[:, 0])
    chain = jnp.take_along_axis(chain, parent[:, :, None], axis=1).at[:, :, i].set(token)
    root = jnp.take_along_axis(root, parent, axis=1)
    return (scores, chain, root, _gather(path_cache, parent), token, chains.at[:, i].set(chain),
            node_root.at[:, i].set(root))

  carry = (scores, chain, root, _gather(cache, root), token, chains, node_root)
  *_, chains, node_root = lax.fori_loop(1, gamma, body, carry)
  return chains.reshape(batch, gamma * u, gamma), node_root.reshape(batch, gamma * u), cache


def _replay(beams, logits, paths, row_root, prefix_len, active, max_new_tokens, alpha, eos_id):
  """The target's beam steps of one round for one example (the criterion above).

  Args:
    beams: the example's beams (the roots).
    logits: float32 [R, γ + 1, V]: the target's logits along each row.
    paths: int32 [R, γ]: the tokens each row fed after its root's last token.
    row_root: int32 [R]: the root each row starts from (row i < w: root i's own row).
    prefix_len: int32 []; active: bool []; max_new_tokens: int32 []; alpha: float32 [];
    eos_id: int32 [].
  Returns:
    (beams, src int32 [w]: the row whose cache each new live beam takes,
     root int32 [w]: the root each new live beam descends from, n int32 []: steps run,
     nan bool []: NaN in the logits a step used).
  """
  width = beams.live_lp.shape[0]
  gamma = paths.shape[1]
  root_pos = prefix_len + beams.step - 1
  depth = jnp.arange(gamma)
  roots = jnp.arange(width)  # live beam i starts on root row i

  def body(s, carry):
    beams, root, row, src, go, n, nan = carry
    go = go & ~beams_done(beams, max_new_tokens, alpha)
    log_probs = jax.nn.log_softmax(logits[row, s])  # [w, V]: only the rows this step reads
    new, parent = beam_step(beams, log_probs, prefix_len, alpha, eos_id)
    new_root = root[parent]
    suffix = lax.dynamic_slice_in_dim(new.live_seq, root_pos + 1, gamma, axis=1)  # [w, γ]
    # New beams are at depth s + 1: their tokens 0..s after the root must match a row's.
    agree = (paths[None] == suffix[:, None]) | (depth > s)  # [w, R, γ]
    on_row = jnp.all(agree, axis=-1) & (row_root[None] == new_root[:, None])  # [w, R]
    beams = jax.tree.map(lambda a, b: jnp.where(go, a, b), new, beams)
    root = jnp.where(go, new_root, root)
    src = jnp.where(go, row[parent], src)
    row = jnp.where(go, jnp.argmax(on_row, axis=1), row)
    nan = nan | (go & jnp.any(jnp.isnan(log_probs)))
    return beams, root, row, src, go & jnp.all(jnp.any(on_row, axis=1)), n + go, nan

  init = (beams, roots, roots, roots, active, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.bool_))
  beams, root, _, src, _, n, nan = lax.fori_loop(0, gamma + 1, body, init)
  return beams, src, root, n, nan


@functools.partial(jax.jit, static_argnames=("target", "draft", "beam_size", "draft_beam_size",
                                             "gamma"))
def _speculative(target, draft, beam_size, draft_beam_size, gamma, target_params, draft_params,
                 inputs, seq, prefix_len, max_new_tokens, alpha, eos_id):
  batch, width = seq.shape
  w, u = beam_size, draft_beam_size
  rows = w + gamma * u  # root rows, then one row per node of the draft's tree
  cache, encoded = start_copies(target, target_params, inputs, prefix_len, width, w)
  encoded = repeat_rows(encoded, rows)
  draft_cache, draft_encoded = start_copies(draft, draft_params, inputs, prefix_len, width, w)
  draft_roots, draft_paths = repeat_rows(draft_encoded, w), repeat_rows(draft_encoded, u)
  zeros = jnp.zeros((batch,), jnp.int32)
  state = _SpecLoop(beams=jax.vmap(init_beams, in_axes=(0, None))(seq, w), cache=cache,
                    draft_cache=draft_cache, valid=prefix_len - 1,
                    done=jnp.zeros((batch,), jnp.bool_), target_calls=zeros, draft_calls=zeros,
                    nan=jnp.zeros((batch,), jnp.bool_))

  def body(state: _SpecLoop) -> _SpecLoop:
    active = ~state.done
    paths, path_root, draft_cache = _draft_tree(
        draft, draft_params, state.draft_cache, draft_roots, draft_paths, state.beams,
        prefix_len, state.valid, gamma, u, eos_id)
    last, pos = last_tokens(state.beams, prefix_len)
    own = jnp.broadcast_to(jnp.arange(w), (batch, w))
    row_root = jnp.concatenate([own, path_root], axis=1)  # [B, rows]
    drafted = jnp.concatenate([jnp.zeros((batch, w, gamma), jnp.int32), paths], axis=1)
    tokens = jnp.concatenate([jnp.take_along_axis(last, row_root, axis=1)[:, :, None], drafted],
                             axis=2)  # [B, rows, γ + 1]
    logits, cache = target.decode(target_params, _gather(state.cache, row_root),
                                  tokens.reshape(-1, gamma + 1), jnp.repeat(pos, rows),
                                  encoded)  # ONE call: every row starts from its root's cache
    beams, src, root, n, nan = jax.vmap(
        _replay, in_axes=(0, 0, 0, 0, 0, 0, None, None, None))(
            state.beams, logits.reshape(batch, rows, gamma + 1, -1), drafted, row_root,
            prefix_len, active, max_new_tokens, alpha, eos_id)
    done = state.done | jax.vmap(beams_done, in_axes=(0, None, None))(beams, max_new_tokens,
                                                                      alpha)
    return state.replace(
        beams=beams, cache=_gather(cache, src), draft_cache=_gather(draft_cache, root),
        valid=jnp.where(active, pos + 1, state.valid), done=done,
        target_calls=state.target_calls + active, draft_calls=state.draft_calls + gamma * active,
        nan=state.nan | nan)

  state = lax.while_loop(lambda s: jnp.any(~s.done), body, state)
  tokens, scores, lengths = finish(state.beams, prefix_len, eos_id)
  return BeamResult(sequences=tokens, scores=scores, lengths=lengths,
                    target_calls=state.target_calls, draft_calls=state.draft_calls), state.nan


def speculative_beam_search(target: DecodingModel, target_params: Any, draft: DecodingModel,
                            draft_params: Any, inputs: Any, *, beam_size: int,
                            draft_beam_size: int, gamma: int, max_new_tokens: int,
                            alpha: float = 0.6, eos_id: int = 1,
                            prompt_lengths: Any = None) -> BeamResult:
  """Speculative beam search (paper A.4): `beam_search(target, ...)`'s beams with fewer calls.

  Each round the draft runs a beam search of width u and γ steps from the
  target's w live beams (ranked by the target's log-probabilities), the target
  scores every node of that search tree in ONE `decode` call (w + γ * u rows of
  γ + 1 tokens per example), and the target's beam search is replayed on those
  logits for as many steps as the tree covers its live beams (at least 1, at
  most γ + 1). The beams and scores are `beam_search`'s with the target alone,
  up to the float rounding of the batched call. See this module's docstring for
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
  if not isinstance(draft, DecodingModel):
    raise ValueError(f"speculative beam search drafts with a DecodingModel, got "
                     f"{type(draft).__name__}: it supplies no target features for a feature head")
  check_eos(target, eos_id)
  beam_size = check_count("beam_size", beam_size)
  draft_beam_size = check_count("draft_beam_size", draft_beam_size)
  if draft_beam_size < beam_size:
    raise ValueError(f"draft_beam_size must be >= beam_size (u >= w), got draft_beam_size="
                     f"{draft_beam_size} < beam_size={beam_size}")
  gamma = check_count("gamma", gamma)
  check_same_vocab(target, draft.vocab_size)
  if draft_beam_size > beam_size * target.vocab_size:
    raise ValueError(f"draft_beam_size must be <= beam_size * vocab_size = "
                     f"{beam_size * target.vocab_size} (the extensions of the beams), got "
                     f"{draft_beam_size}")
  if target.is_encoder_decoder != draft.is_encoder_decoder:
    raise ValueError("target and draft must both be encoder-decoder or both decoder-only; got "
                     f"target.is_encoder_decoder={target.is_encoder_decoder}, "
                     f"draft.is_encoder_decoder={draft.is_encoder_decoder}")
  prep = prepare(target, inputs, prompt_lengths, max_new_tokens, alpha, extra_positions=gamma + 2)
  batch = prep.seq.shape[0]  # the score call's target rows: w roots + γ·u nodes per example
  check_cache_size([target, draft], [batch * (beam_size + gamma * draft_beam_size),
                                     batch * draft_beam_size], prep.seq.shape[1])
  result, nan = _speculative(target, draft, beam_size, draft_beam_size, gamma, target_params,
                             draft_params, jnp.asarray(prep.inputs), jnp.asarray(prep.seq),
                             jnp.asarray(prep.prefix_len), jnp.int32(max_new_tokens),
                             jnp.float32(prep.alpha), jnp.int32(eos_id))
  check_nan(nan)
  return result.replace(sequences=result.sequences[:, :, :max_new_tokens])
