"""A specjax model as the draft, with its own KV cache: `ModelDrafter` guesses a chain,
`TreeModelDrafter` a token tree (one draft call per level); `ModelDrafter.as_tree` turns the
first into the second."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Tuple

import flax
import jax
import jax.numpy as jnp

from specjax.draft.base import (Accepted, DrafterDefaults, Proposal, catch_up_loop, check_flags,
                                check_sizes, draft_calls, guess_chain)
from specjax.draft.tree import (TreeProposal, cache_positions, check_shape, grow_tree,
                                level_attention, move_path)
from specjax.models import DecodingModel, start_model
from specjax.models.protocol import decode_logits_at
from specjax.models.tree import nodes_call
from specjax.rows import take_rows
from specjax.sampling import Sampling


@flax.struct.dataclass
class ModelDrafterState:
  """A `ModelDrafter`'s per-decode state: its KV cache and how far each row has fed it."""
  cache: Any  # the draft model's KV cache
  encoded: Any  # the draft's encoder output (None for decoder-only)
  fed: jax.Array  # int32 [B]: cache positions 0..fed-1 hold the row's committed tokens
  start: jax.Array  # int32 [B]: the row's length at the last `propose`


@dataclasses.dataclass(frozen=True)
class ModelDrafter(DrafterDefaults):
  """Any specjax model as the draft, with its own KV cache.

  The cache holds the committed tokens at positions 0..fed-1. A round needs positions up
  to length-2 (the last token is fed again), so its first call feeds a short
  catch-up window [x_{L-1-lag} .. x_{L-1}] with lag = L-1-fed: after a rejection
  lag is 0 (stale positions are overwritten), after a round that accepted all γ it is
  1 (x_γ was drafted but never fed), so no extra full draft pass is needed.
  Rounds the drafter did not see (γ = 0 rounds of the 'auto' policy: a plain target
  step, no draft call) leave a longer lag; `propose` first feeds the missed tokens
  in chunks of `catch_up` (`catch_up_cache`), so any lag is caught up exactly.
  """

  model: DecodingModel
  max_gamma: int
  window: int = 2
  """Static catch-up window: lags up to window-1 (2 suffices alone; 3 inside a hierarchy)."""
  catch_up: int = 8
  """Static chunk width that feeds longer lags (after rounds without a draft call)."""
  unroll: bool = False
  """Draft all max_gamma guesses in straight-line code, no loop per guess (`guess_chain`): for
  GPUs and TPUs at a fixed γ = max_gamma. A smaller γ still drafts max_gamma guesses."""

  tree: ClassVar[None] = None  # a chain drafter
  deterministic: ClassVar[bool] = False

  def __post_init__(self):
    check_sizes(self, max_gamma=1, window=2)
    check_flags(self, "unroll")

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  @property
  def lookahead(self) -> int:
    """Cache positions a round writes past the committed tokens: the guesses."""
    return self.max_gamma

  @property
  def models(self) -> Tuple[DecodingModel, ...]:
    return (self.model,)

  def init(self, params, inputs, seq, length, cache_len):
    cache, encoded, fed = start_model(self.model, params, inputs, length, cache_len)
    return ModelDrafterState(cache=cache, encoded=encoded, fed=fed, start=length)

  def propose(self, params, state, seq, length, gamma, row_keys, sampling):
    cache, fed = catch_up_cache(self.model, params, state.cache, state.encoded, seq, length,
                                state.fed, self.window, self.catch_up)
    state = state.replace(cache=cache, fed=fed)
    lag = jnp.clip(length - 1 - state.fed, 0, self.window - 1)
    # First call: the catch-up window x_{L-1-lag} .. x_{L-1} (+ junk positions that
    # later calls overwrite); the distribution of x_1 is read at index lag.
    begin = length - 1 - lag
    window = take_rows(seq, begin[:, None] + jnp.arange(self.window)[None, :])
    logits, cache = decode_logits_at(self.model, params, state.cache, window, begin,
                                     state.encoded, lag)  # [B, V]

    def step(cache, prev, i):  # the model on guess i - 1
      logits, cache = self.model.decode(params, cache, prev, length + i - 1, state.encoded)
      return logits[:, 0], cache

    tokens, all_probs, cache = guess_chain(logits, step, cache, row_keys, length, gamma,
                                           self.max_gamma, sampling, self.unroll)
    # Fed: the committed tokens, then x_1 .. x_{G-1} (G guesses drafted: the batch's largest
    # γ, or max_gamma unrolled).
    drafted = self.max_gamma if self.unroll else jnp.max(gamma)
    state = state.replace(cache=cache, fed=length + drafted - 1, start=length)
    return Proposal(tokens=tokens, probs=all_probs, calls=draft_calls(gamma, self)), state

  def update(self, state, accepted: Accepted):
    return self.truncate(state, state.start + accepted.n)

  def as_tree(self, tree: Any) -> "TreeModelDrafter":
    """The same model drafting `tree` (a StaticTree or DynamicTree), with this drafter's
    catch-up and unroll settings."""
    return TreeModelDrafter(self.model, tree, window=self.window, catch_up=self.catch_up,
                            unroll=self.unroll)

  def truncate(self, state, valid):
    """Only positions 0..valid-1 still hold committed tokens (valid int32 [B])."""
    return state.replace(fed=jnp.minimum(state.fed, valid))


def catch_up_cache(model: DecodingModel, params, cache, encoded, seq, length, fed, window: int,
                   chunk: int):
  """Feeds the committed tokens a model's cache missed until every row lags < `window`.

  seq: int32 [B, T]; length, fed: int32 [B] (positions 0..fed-1 hold committed tokens).
  While some row lags by window or more (lag = length-1-fed), every row is fed the
  `chunk` tokens from its position min(fed, length-1, T-chunk): committed positions are only
  ever rewritten with the same tokens, and junk written past a row's length is
  overwritten by later calls before any query reads it (keys past a row's position are
  masked). Returns (cache, fed int32 [B]); no call at all when no row lags that far.
  """
  chunk = min(chunk, seq.shape[1])
  offsets = jnp.arange(chunk)[None, :]
  call = lambda cache, start: model.decode(params, cache, take_rows(seq, start[:, None] + offsets),
                                           start, encoded)[1]
  return catch_up_loop(call, cache, fed, length, window,
                       begin=lambda fed: jnp.minimum(jnp.minimum(fed, length - 1),
                                                     seq.shape[1] - chunk),
                       end=lambda start: jnp.minimum(start + chunk, length))


@flax.struct.dataclass
class TreeDrafterState:
  cache: Any  # the draft model's KV cache
  encoded: Any  # the draft's encoder output (None for decoder-only)
  fed: jax.Array  # int32 [B]: cache positions 0..fed-1 hold the row's committed tokens
  source: jax.Array  # int32 [B, N]: the grown node (draft cache position length + j) of node j


@dataclasses.dataclass(frozen=True)
class TreeModelDrafter(DrafterDefaults):
  """A specjax model drafts a token tree, ONE draft call per level (static shapes).

  The first call feeds the catch-up window ending at the last committed token (as
  `ModelDrafter`) and yields the root's q; the call for level d feeds all level-d nodes
  at positions length + j (each sees the committed cache and its ancestors), yielding the q
  of their children. After verification `update` moves the accepted path's draft cache
  positions into place, as the target's.
  """

  model: DecodingModel
  tree: Any  # StaticTree or DynamicTree
  window: int = 2
  catch_up: int = 8
  unroll: bool = False
  """The spine tail's levels as straight-line code, no loop per level (`grow_tree`): for GPUs
  and TPUs; the tree's depth is static, so nothing is drafted that a loop would not."""

  deterministic: ClassVar[bool] = False

  def __post_init__(self):
    check_sizes(self, window=2, catch_up=1)
    check_flags(self, "unroll")
    check_shape(self.tree)

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  @property
  def max_gamma(self) -> int:
    """The tree's depth: the most guesses a round can accept."""
    return self.tree.max_depth

  @property
  def lookahead(self) -> int:
    """Cache positions a round writes past the committed tokens: every grown node."""
    return self.tree.grown

  @property
  def models(self) -> Tuple[DecodingModel, ...]:
    return (self.model,)

  def init(self, params, inputs, seq, length, cache_len):
    cache, encoded, fed = start_model(self.model, params, inputs, length, cache_len)
    nodes = self.tree.nodes
    source = jnp.broadcast_to(jnp.arange(nodes, dtype=jnp.int32), (seq.shape[0], nodes))
    return TreeDrafterState(cache=cache, encoded=encoded, fed=fed, source=source)

  def propose(self, params, state: TreeDrafterState, seq, length, gamma, row_keys,
              sampling: Sampling) -> Tuple[TreeProposal, TreeDrafterState]:
    """seq [B, T], length [B], row_keys [B] -> (TreeProposal, state); gamma unused (the
    tree's shape is static)."""
    del gamma
    tree = self.tree
    cache, fed = catch_up_cache(self.model, params, state.cache, state.encoded, seq, length,
                                state.fed, self.window, self.catch_up)
    lag = jnp.clip(length - 1 - fed, 0, self.window - 1)
    begin = length - 1 - lag
    window = take_rows(seq, begin[:, None] + jnp.arange(self.window)[None, :])
    logits, cache = decode_logits_at(self.model, params, cache, window, begin, state.encoded,
                                     lag)  # [B, V]

    def level(cache, tokens, parent, depth, plo, phi):  # one call over nodes plo .. phi - 1
      attention = level_attention(tree, parent, depth, length, plo, phi, cache_positions(cache))
      return self.model.decode(params, cache, tokens[:, plo:phi], length + plo, state.encoded,
                               tree=attention)

    def spine(cache, tokens, parent, depth, anc, above):  # one call over node `above`
      attention = nodes_call(anc, depth, length, above, 1, cache_positions(cache))
      feed = jax.lax.dynamic_slice_in_dim(tokens, above, 1, axis=1)
      logits, cache = self.model.decode(params, cache, feed, length + above, state.encoded,
                                        tree=attention)  # [B, 1, V]
      return logits[:, 0], cache

    proposal, source, cache = grow_tree(tree, logits, level, spine, cache, row_keys, length,
                                        sampling, self.unroll)
    # fed: positions < length hold the committed tokens; the tree's are junk.
    return proposal, state.replace(cache=cache, fed=length,
                                   source=state.source if source is None else source)

  def update(self, state: TreeDrafterState, accepted: Accepted) -> TreeDrafterState:
    """After verification (`Accepted`: the round's start, the path of n accepted nodes): the
    path's positions move to start.. and the fed count covers the path nodes that were fed (all
    but a deepest-level node)."""
    length, path, n = accepted.start, accepted.path, accepted.n
    grown = jnp.where(path >= 0, jnp.take_along_axis(state.source, jnp.maximum(path, 0), axis=1),
                      -1)
    cache = move_path(self.model, state.cache, length, grown, n)
    return state.replace(cache=cache, fed=length + jnp.minimum(n, self.tree.max_depth - 1))
