"""The tree loop: many guesses per round, verified exactly in ONE target call per round.

A round over the loop state:
  draft   the tree drafter proposes N nodes (one draft call per level)   (`TreeProposal`)
  score   the target scores the root and every node in ONE tree call    (logits [B, N+1, V])
  verify  `specjax.verify.tree` per row accepts a path of n nodes and draws one more token
  commit  the path's cache slots move into place (target and draft); the row advances n + 1
  record  per-row statistics

Rows advance independently and finish at their own EOS or budget, as in the chain loop.
Randomness is tied to (row, absolute position, stream): node j of depth d is tested with
`fold_in(position_key(row, length - 1 + d, ACCEPT_STREAM), j)`, the token after n accepted
nodes is drawn with `position_key(row, length + n, CORRECTION_STREAM)` (the key a plain
target step at that position uses), and the drafter's keys are in `specjax.draft.tree`.
`alpha_sum` / `alpha_count` stay 0 (no per-position α for a tree).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional, Union

import jax
import jax.numpy as jnp

from specjax.decode.config import DecodeConfig
from specjax.decode.inputs import (cache_length, check_cache_size, check_config, check_count,
                                   check_inputs, check_nan, initial_seq, prefix_lengths)
from specjax.decode.loop import advance, bad_logits, finish, last_tokens, start_loop
from specjax.decode.state import DecodeResult, LoopState
from specjax.decode.stream import Streaming, as_streaming, decode_streaming
from specjax.draft.tree import DynamicTree, StaticTree, TreeModelDrafter, TreeProposal, move_path
from specjax.models import DecodingModel, check_same_vocab
from specjax.models.tree import tree_call
from specjax.sampling import ACCEPT_STREAM, CORRECTION_STREAM, position_key, row_keys
from specjax.verify import ReferenceVerifier
from specjax.verify.tree import path_tokens, tree_verify


def _node_uniforms(keys, length, depth):
  """float32 [B, N]: node j's accept uniform (keys [B], length [B], depth int32 [B, N])."""
  def row(key, l, depth):
    def node(j, d):
      return jax.random.uniform(jax.random.fold_in(position_key(key, l - 1 + d, ACCEPT_STREAM),
                                                   j), dtype=jnp.float32)
    return jax.vmap(node)(jnp.arange(depth.shape[0]), depth)
  return jax.vmap(row)(keys, length, depth)


def _correction_keys(keys, length, max_depth: int):
  """Keys [B, D + 1]: key n draws the token at position length + n."""
  offsets = jnp.arange(max_depth + 1)
  return jax.vmap(lambda k, l: jax.vmap(
      lambda o: position_key(k, l + o, CORRECTION_STREAM))(offsets))(keys, length)


@dataclasses.dataclass(frozen=True)
class TreeLoop:
  """The tree loop's start and round (static, hashable); params = (target, drafter)."""

  target: DecodingModel
  drafter: TreeModelDrafter
  config: DecodeConfig

  def start(self, params, inputs, seq, length, gamma=None):
    """-> (LoopState, encoded): the target encoded / prefilled, the drafter started
    (`gamma`: the streaming interface's, unused: the tree's shape replaces it)."""
    del gamma
    target_params, drafter_params = params
    tree = self.drafter.tree
    state, encoded = start_loop(self.target, target_params, inputs, seq, length, seq.shape[1],
                                tree.max_depth + 1)
    return state.replace(drafter_state=self.drafter.init(drafter_params, inputs, seq, length,
                                                         seq.shape[1])), encoded

  def round(self, params, state: LoopState, keys, encoded, prefix_len, max_new_tokens
            ) -> LoopState:
    target_params, drafter_params = params
    config, tree = self.config, self.drafter.tree
    proposal, drafter_state = self.drafter.propose(drafter_params, state.drafter_state,
                                                   state.seq, state.length, keys, config.sampling)
    logits, cache = self._score(target_params, state, proposal, encoded)
    n, path, token = self._verify(keys, state, proposal, logits)
    cache = move_path(self.target, cache, state.length, path, n)
    drafter_state = self.drafter.update(drafter_state, state.length, path, n)
    emitted = jax.vmap(path_tokens)(proposal.tokens, path, n, token)  # [B, D + 1]
    seq, length, done = advance(state, emitted, n + 1, prefix_len, max_new_tokens,
                                config.eos_id)
    active = ~state.done
    bad = bad_logits(logits) | jnp.any(jnp.isnan(proposal.probs), axis=(1, 2))
    return state.replace(
        seq=seq, length=length, done=done, cache=cache, drafter_state=drafter_state,
        target_calls=state.target_calls + active,
        draft_calls=state.draft_calls + jnp.where(active, proposal.calls, 0),
        accepted_hist=state.accepted_hist + (
            jax.nn.one_hot(n, tree.max_depth + 1, dtype=jnp.int32) * active[:, None]),
        nan=state.nan | (active & bad))

  def rounds(self, params, state: LoopState, keys, encoded, prefix_len, max_new_tokens,
             running=lambda s: True, place=lambda s: s) -> LoopState:
    """One round (the streaming interface of `SpeculativeLoop.rounds`)."""
    del running
    return place(self.round(params, state, keys, encoded, prefix_len, max_new_tokens))

  def _score(self, target_params, state: LoopState, proposal: TreeProposal, encoded):
    """The target's logits [B, N + 1, V] at the root and every node, in one call."""
    tokens = jnp.concatenate([last_tokens(state), proposal.tokens], axis=1)
    return self.target.decode(target_params, state.cache, tokens, state.length - 1, encoded,
                              tree=tree_call(proposal.parent, proposal.depth, state.length))

  def _verify(self, keys, state: LoopState, proposal: TreeProposal, logits):
    tree, sampling = self.drafter.tree, self.config.sampling
    uniforms = _node_uniforms(keys, state.length, proposal.depth)
    lenient_argmax = sampling.greedy and self.config.lenience < 1  # needs p itself
    target_probs = jax.nn.softmax(logits, -1) if lenient_argmax else sampling.probs(logits)
    correction = _correction_keys(keys, state.length, tree.max_depth)
    verify = functools.partial(tree_verify, iid=tree.iid, greedy=sampling.greedy,
                               max_depth=tree.max_depth, lenience=self.config.lenience)
    return jax.vmap(verify)(
        uniforms, correction, proposal.tokens, proposal.parent, proposal.depth, proposal.valid,
        proposal.probs, target_probs)


@functools.partial(jax.jit, static_argnames=("loop",))
def _tree_decode(loop: TreeLoop, params, inputs, seq, length, keys, max_new_tokens):
  prefix_len = length
  state, encoded = loop.start(params, inputs, seq, length)
  body = lambda s: loop.round(params, s, keys, encoded, prefix_len, max_new_tokens)
  state = jax.lax.while_loop(lambda s: jnp.any(~s.done), body, state)
  return finish(state, prefix_len)


def tree_decode(target: DecodingModel, target_params: Any, drafter: Any, drafter_params: Any,
                inputs, *, max_new_tokens: int, rng: jax.Array,
                config: DecodeConfig = DecodeConfig(), tree: Any = None,
                prompt_lengths=None, slots: Union[int, Streaming, None] = None,
                on_progress: Optional[Callable[[int, int], None]] = None) -> DecodeResult:
  """Speculative decoding with token trees, exact for the target's distribution.

  Each round the drafter proposes a tree of N nodes, the target scores the root and all
  nodes in ONE tree-masked `decode` call, `specjax.verify.tree` accepts a root-to-node
  path of n nodes and draws one more token, and the row advances by n + 1.

  Args:
    target: the target `DecodingModel`.
    target_params: its parameters.
    drafter: a `specjax.draft.tree.TreeModelDrafter`, or a draft `DecodingModel` with `tree`.
    drafter_params: the draft model's parameters.
    inputs: int32 [B, L]: encoder inputs (T5) or left-aligned prompts (decoder-only), 0-padded.
    max_new_tokens: generation budget per row (data).
    rng: one PRNG key, or one key per row [B].
    config: static settings: sampling, eos_id, cache_len, lenience (< 1 is NOT exact, as in
      the chain); the reference verifier and the constant γ policy only (the tree rule
      replaces the verifiers, and the tree's shape replaces γ).
    tree: a `StaticTree` or `DynamicTree` when `drafter` is a model.
    prompt_lengths: optional int [B] for decoder-only prompts.
    slots: stream the B inputs through this many slots (in-flight batching, as
      `speculative_decode`); a `specjax.decode.Streaming` sets refill rows and the tail
      shrink too. An example's tokens do not depend on its slot.
    on_progress: streaming: called as on_progress(done, B) after every `slots` finished inputs.
  Returns:
    A `DecodeResult`: tokens [B, max_new_tokens]; accepted_hist [B, D + 1] counts rounds by
    accepted nodes; draft_calls counts one call per tree level.
  """
  if tree is not None:
    if not isinstance(tree, (StaticTree, DynamicTree)):
      raise ValueError(f"tree must be a StaticTree or DynamicTree, got {tree!r}")
    drafter = TreeModelDrafter(drafter, tree)
  if not isinstance(drafter, TreeModelDrafter):
    raise ValueError("tree_decode needs a TreeModelDrafter, or a draft model with tree=..., "
                     f"got {type(drafter).__name__}")
  if config.gamma_policy != "constant" or not isinstance(config.verifier, ReferenceVerifier):
    raise ValueError("tree_decode verifies with the tree rule (specjax.verify.tree): it takes "
                     "gamma_policy='constant' and the reference verifier only")
  if drafter.tree.greedy_only and not config.sampling.greedy:
    raise ValueError("DynamicTree(keep=...) prunes drawn children by their own probability, "
                     "which is exact at temperature 0 only (specjax.verify.tree)")
  check_config(target, config)
  check_same_vocab(target, drafter.vocab_size)
  max_new_tokens = check_count("max_new_tokens", max_new_tokens)
  inputs = check_inputs(target, inputs)
  length = prefix_lengths(target, inputs, prompt_lengths)
  cache_len = cache_length(config.cache_len, int(length.max()), max_new_tokens,
                           drafter.slots + 1)
  streaming = as_streaming(slots)
  rows = inputs.shape[0] if streaming is None else (streaming.sizes()[0] + streaming.refill_rows)
  check_cache_size([target, drafter.model], rows, cache_len, None)
  loop = TreeLoop(target, drafter, config)
  if streaming is not None:
    return decode_streaming(loop, (target_params, drafter_params), inputs, length, rng,
                            streaming=streaming, width=cache_len, max_new_tokens=max_new_tokens,
                            on_progress=on_progress)
  seq = initial_seq(target, inputs, cache_len)
  result, nan = _tree_decode(loop, (target_params, drafter_params), jnp.asarray(inputs),
                             jnp.asarray(seq), jnp.asarray(length),
                             row_keys(rng, inputs.shape[0]), jnp.int32(max_new_tokens))
  check_nan(nan)
  return result.replace(tokens=result.tokens[:, :max_new_tokens])
