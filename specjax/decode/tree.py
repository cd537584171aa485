"""The tree loop: many guesses per round, verified exactly in ONE target call per round.

A round over the loop state:
  draft   the tree drafter proposes N nodes (one draft call per level)   (`TreeProposal`)
  score   the target scores the root and every node in ONE tree call    (logits [B, N+1, V])
  verify  `specjax.verify.tree` per row accepts a path of n nodes and draws one more token
  commit  the path's cache positions move into place (target and draft); the row advances n + 1
  record  per-row statistics

Rows advance independently and finish at their own EOS or budget, as in the chain loop.
Under the 'auto' policy (`DecodeConfig.gamma_policy='auto'`) the tree is one more candidate
shape: each round is either the narrow round (every row one plain target step, no draft
call) or a tree round, chosen by `specjax.decode.auto` from a cost table measured inside this
compiled loop (`seconds` = the narrow round's and the tree round's, as a chain's γ = 0 and
bucket γ = max_depth) and each row's running α, so the tree is played only where its
measured call cost pays for the tokens it brings.

The α of a tree round is its depth-equivalent acceptance: a round that accepted n of its
max_depth levels counts n accepted positions and, when n < max_depth, one rejected one
(`alpha_sum` += n, `alpha_count` += n + [n < max_depth]), the estimate under which a chain as
deep as the tree brings the tokens per round the tree brought (Eq. 1), which is how the
policy prices it.
Randomness is tied to (row, absolute position, stream): node j of depth d is tested with
`fold_in(position_key(row, length - 1 + d, ACCEPT_STREAM), j)`, the token after n accepted
nodes is drawn with `position_key(row, length + n, CORRECTION_STREAM)` (the key a plain
target step at that position uses), and the drafter's keys are in `specjax.draft.tree`.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp

from specjax.decode import auto, runner
from specjax.decode.config import DecodeConfig
from specjax.decode.loop import advance, bad_logits, last_tokens
from specjax.decode.round import DraftingLoop, draft, record_trace
from specjax.decode.state import DecodeResult, LoopParams, LoopState
from specjax.decode.stream import Streaming
from specjax.decode.tree_checks import check_tree
from specjax.draft import Accepted, Drafter, TreeModelDrafter
from specjax.draft.tree import TreeProposal, check_shape, move_path
from specjax.models import DecodingModel
from specjax.models.protocol import layers_kwargs
from specjax.models.tree import tree_call
from specjax.sampling import ACCEPT_STREAM, CORRECTION_STREAM, position_key
from specjax.runtime.sharding import Partitioner
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


@flax.struct.dataclass
class TreeVerdict:
  """The outcome of verifying one tree round."""

  n: jax.Array  # int32 [B]: path nodes accepted
  path: jax.Array  # int32 [B, D]: the accepted nodes, root to leaf (-1 past n)
  emitted: jax.Array  # int32 [B, D + 1]: the path's tokens, then the drawn one
  bad: jax.Array  # bool [B]: NaN in the row's target logits or draft q


@dataclasses.dataclass(frozen=True)
class TreeLoop(DraftingLoop):
  """The tree loop as a `runner.Loop` (static, hashable; params is a `LoopParams`): the
  `DraftingLoop` skeleton (start, the narrow round, rounds) with the tree's round, whose one
  width is the tree's depth."""

  target: DecodingModel
  drafter: Drafter  # a tree drafter (`drafter.tree` is its StaticTree or DynamicTree)
  config: DecodeConfig

  takes_gamma: ClassVar[bool] = False  # the tree's shape replaces γ
  alpha_rounds: ClassVar[int] = auto.SCHEDULE_ROUNDS  # α: one indicator per round, so many
  # rounds (on the bundled LM pair at T = 0, 6 rounds of the first prompt gave α 0.6 where 64
  # give 0.83: the policy then never played a tree that decodes 1.6x autoregressive)

  @property
  def buckets(self) -> Tuple[int, ...]:
    """'auto': the one wide round, the tree, as the bucket γ = max_depth."""
    return (self.max_gamma,)

  def round(self, bucket: int, params: LoopParams, state: LoopState, keys, encoded, prefix_len,
            max_new_tokens) -> LoopState:
    """One tree round: draft -> score -> verify -> commit -> record (`bucket`: the tree's
    depth, its one width)."""
    del bucket
    proposal, drafter_state = draft(self.drafter, params, state, keys, self.config)
    logits, features, cache = self._score(params.target, state, proposal, encoded)
    verdict = self._verify(keys, state, proposal, logits)
    after = self._commit(state, verdict, cache, drafter_state, prefix_len, max_new_tokens,
                         features)
    return self._record(state, after, proposal, verdict)

  def _score(self, target_params, state: LoopState, proposal: TreeProposal, encoded):
    """The target's logits [B, N + 1, V] at the root and every node, in one call, its
    features there (float32 [B, N + 1, E]) when the drafter `wants_features` (else None), and
    its cache."""
    tokens = jnp.concatenate([last_tokens(state), proposal.tokens], axis=1)
    attention = tree_call(proposal.parent, proposal.depth, state.length)
    if self.drafter.wants_features:
      return self.target.decode_features(target_params, state.cache, tokens, state.length - 1,
                                         encoded, tree=attention,
                                         **layers_kwargs(self.drafter.feature_layers))
    logits, cache = self.target.decode(target_params, state.cache, tokens, state.length - 1,
                                       encoded, tree=attention)
    return logits, None, cache

  def _verify(self, keys, state: LoopState, proposal: TreeProposal, logits) -> TreeVerdict:
    """`specjax.verify.tree` per row: the accepted path and the token drawn after it."""
    tree, sampling = self.drafter.tree, self.config.sampling
    uniforms = _node_uniforms(keys, state.length, proposal.depth)
    lenient_argmax = sampling.greedy and self.config.lenience < 1  # needs p itself
    target_probs = jax.nn.softmax(logits, -1) if lenient_argmax else sampling.probs(logits)
    correction = _correction_keys(keys, state.length, tree.max_depth)
    verify = functools.partial(tree_verify, iid=tree.iid, greedy=sampling.greedy,
                               max_depth=tree.max_depth, lenience=self.config.lenience,
                               deterministic=self.drafter.deterministic)
    n, path, token = jax.vmap(verify)(
        uniforms, correction, proposal.tokens, proposal.parent, proposal.depth, proposal.valid,
        proposal.probs, target_probs)
    return TreeVerdict(n=n, path=path, emitted=jax.vmap(path_tokens)(proposal.tokens, path, n,
                                                                     token),
                       bad=bad_logits(logits) | jnp.any(jnp.isnan(proposal.probs), axis=(1, 2)))

  def _commit(self, state: LoopState, verdict: TreeVerdict, cache, drafter_state, prefix_len,
              max_new_tokens, features=None) -> LoopState:
    """The path's cache positions move into place (target and draft); each active row advances
    by n + 1, stopping at EOS and its budget. `features` [B, N + 1, E] (the scored root and
    nodes): the drafter gets those of the root and the path, at positions start - 1 .."""
    n, path = verdict.n, verdict.path
    cache = move_path(self.target, cache, state.length, path, n)
    if features is not None:  # index 0 the root, j + 1 node j; past n: the root (not read)
      along = jnp.concatenate([jnp.zeros_like(path[:, :1]), path + 1], axis=1)
      features = jnp.take_along_axis(features, along[:, :, None], axis=1)  # [B, D + 1, E]
    drafter_state = self.drafter.update(drafter_state, Accepted(
        start=state.length, n=n, gamma=jnp.full_like(n, self.max_gamma), path=path,
        features=features))
    seq, length, done = advance(state, verdict.emitted, n + 1, prefix_len, max_new_tokens,
                                self.config.eos_id)
    return state.replace(seq=seq, length=length, done=done, cache=cache,
                         drafter_state=drafter_state)

  def _record(self, before: LoopState, after: LoopState, proposal: TreeProposal,
              verdict: TreeVerdict) -> LoopState:
    """`after` with the round's statistics: calls, histograms, the depth-equivalent α (module
    docstring), NaN flags and the trace."""
    depth, n = self.max_gamma, verdict.n
    active = ~before.done
    level = lambda i: jax.nn.one_hot(i, depth + 1, dtype=jnp.int32) * active[:, None]
    seen = jnp.where(active, n + (n < depth), 0)  # depth-equivalent α (module docstring)
    after = after.replace(
        target_calls=before.target_calls + active,
        draft_calls=before.draft_calls + jnp.where(active, proposal.calls, 0),
        accepted_hist=before.accepted_hist + level(n),
        alpha_sum=before.alpha_sum + jnp.where(active, n, 0).astype(jnp.float32),
        alpha_count=before.alpha_count + seen,
        nan=before.nan | (active & verdict.bad))
    after = after.replace(gamma_hist=before.gamma_hist + level(jnp.full_like(n, depth)))
    if before.trace is None:
      return after
    guesses, offered = jax.vmap(functools.partial(trace_guesses, max_depth=depth))(
        proposal.tokens, proposal.parent, proposal.depth, proposal.valid, verdict.path, n)
    token = jnp.take_along_axis(verdict.emitted, n[:, None], 1)[:, 0]
    return after.replace(trace=record_trace(before.trace, active, before.target_calls, guesses,
                                            n, token, offered))


def trace_guesses(tokens, parent, depth, valid, path, n, *, max_depth: int):
  """One row's round for the Figure-1 trace: the accepted path's tokens, then the rejected
  first-ranked child of the path's last node (if it has one). tokens, parent, depth, valid
  [N]; path [D]; n [] -> (guesses int32 [D], shown int32 []: n, + 1 with a rejected child)."""
  last = jnp.where(n > 0, path[jnp.maximum(n - 1, 0)], -1)
  child = valid & (parent == last) & (depth == n + 1)  # [N]
  has = jnp.any(child)
  at = jnp.arange(max_depth)
  guesses = jnp.where(at < n, tokens[jnp.maximum(path, 0)],
                      jnp.where((at == n) & has, tokens[jnp.argmax(child)], 0))
  return guesses.astype(jnp.int32), (n + has).astype(jnp.int32)


def _tree_drafter(drafter: Any, tree: Any) -> Drafter:
  """The tree drafter of `tree_decode`'s arguments; ValueError naming what it cannot take."""
  if tree is not None:
    check_shape(tree)
    drafter = (drafter.as_tree(tree) if isinstance(drafter, Drafter)  # the drafter says how
               else TreeModelDrafter(drafter, tree))  # a bare draft model
  if not isinstance(drafter, Drafter) or drafter.tree is None:
    raise ValueError("tree_decode needs a tree drafter (TreeModelDrafter, NGramTreeDrafter, "
                     "PromptLookupTreeDrafter or FeatureTreeDrafter), or a draft model, n-gram "
                     f"table or FeatureDrafter with tree=..., got {type(drafter).__name__}")
  return drafter


def tree_decode(target: DecodingModel, target_params: Any, drafter: Any, draft_params: Any,
                inputs, *, max_new_tokens: int, rng: jax.Array,
                config: DecodeConfig = DecodeConfig(), tree: Any = None,
                prompt_lengths=None, slots: Union[int, Streaming, None] = None,
                on_progress: Optional[Callable[[int, int], None]] = None,
                costs: Optional[auto.CostTable] = None,
                partitioner: Optional[Partitioner] = None) -> DecodeResult:
  """Speculative decoding with token trees, exact for the target's distribution.

  Each round the drafter proposes a tree of N nodes, the target scores the root and all
  nodes in ONE tree-masked `decode` call, `specjax.verify.tree` accepts a root-to-node
  path of n nodes and draws one more token, and the row advances by n + 1.

  Args:
    target: the target `DecodingModel`.
    target_params: its parameters.
    drafter: a tree drafter (`drafter.tree` set, e.g. `specjax.draft.TreeModelDrafter`), a
      chain drafter with an `as_tree` (`ModelDrafter`, `NGramDrafter`, `FeatureDrafter`) and
      `tree`, or a draft `DecodingModel` with `tree`;
      a `specjax.draft.NGramTreeDrafter`, or an `NGramDrafter` with `tree` (the tree drawn
      from its table); a `specjax.draft.PromptLookupTreeDrafter` (several prompt-lookup
      continuations).
    draft_params: the draft model's or table's parameters (None for prompt lookup).
    inputs: int32 [B, L]: encoder inputs (T5) or left-aligned prompts (decoder-only), 0-padded.
    max_new_tokens: generation budget per row (data).
    rng: one PRNG key, or one key per row [B].
    config: static settings: sampling, eos_id, cache_len, lenience (< 1 is NOT exact, as in
      the chain), trace (the Figure-1 record: each round's accepted path, the rejected
      first-ranked child after it, the correction); the reference verifier only (the tree rule replaces the verifiers); the
      'constant' γ policy (every round a tree) or 'auto' (each round the narrow round or the
      tree, priced by a measured cost table: module docstring; `auto_buckets` must be empty,
      the tree's depth is its one width).
    tree: a `StaticTree` or `DynamicTree` when `drafter` is a model or an `NGramDrafter`.
    prompt_lengths: optional int [B] for decoder-only prompts.
    slots: stream the B inputs through this many slots (in-flight batching, as
      `speculative_decode`); a `specjax.decode.Streaming` sets refill rows and the tail
      shrink too. An example's tokens do not depend on its slot.
    on_progress: streaming: called as on_progress(done, B) after every `slots` finished inputs.
    costs: 'auto' only: the `auto.CostTable` to decide with (as `speculative_decode`'s); None:
      calibrated on these inputs (streaming: on the first `slots`) and kept for reuse.
    partitioner: a `specjax.runtime.sharding.Partitioner` (params and rows on its mesh), as for chains.
  Returns:
    A `DecodeResult`: tokens [B, max_new_tokens]; accepted_hist [B, D + 1] counts rounds by
    accepted nodes; draft_calls counts one call per tree level; alpha the depth-equivalent α;
    gamma_hist [B, D + 1] counts narrow rounds ('auto') at 0 and tree rounds at D; under
    'auto', cost_table is the table it decided with.
  """
  drafter = _tree_drafter(drafter, tree)
  check_tree(drafter.tree, config, costs=costs)
  entry = runner.enter(target, config, inputs, max_new_tokens, prompt_lengths, slots,
                       partitioner, drafter=drafter)
  check_tree(drafter.tree, config, vocab_size=target.vocab_size,
             models=[target, *drafter.models], rows=entry.rows,
             cache_len=entry.checked.cache_len, partitioner=partitioner)
  return runner.decode(TreeLoop(target, drafter, entry.config),
                       LoopParams(target=target_params, drafter=draft_params), entry.checked,
                       rng, streaming=entry.streaming, partitioner=partitioner,
                       on_progress=on_progress, costs=costs)
