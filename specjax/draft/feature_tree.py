"""`FeatureTreeDrafter`: a token tree drafted by a feature head (EAGLE's trees; EAGLE-2's with
a `DynamicTree`).

The head (`specjax.models.feature_head`) reads [f_{p-1}, embedding(x_p)] and predicts f_p,
whose logits through the target's own output projection are the draft q of x_{p+1}. A round:

  window  one head call feeds the committed positions not yet fed true features (as
          `FeatureDrafter`); its prediction at the last committed token gives the root's q.
  levels  the root's children are drawn from it (`specjax.draft.tree.draw_level`); then ONE
          head call per level feeds that level's nodes, each with its parent's PREDICTED
          feature and its own token, at slot length + j under tree attention (each node sees
          the committed positions and its ancestors), and their predictions give the q of
          their children. A `DynamicTree` expands the nodes of highest path probability
          (EAGLE-2); its `keep` cut is exact at temperature 0 only, as for any tree drafter.

The tree loop scores the tree with the target's features and hands the drafter those of the
root and the accepted path (`Accepted.features`); the next window re-feeds those positions
with them, so the head's tree slots never need moving. Verification is the tree loop's
(`specjax.verify.tree`), so the output is exactly the target's distribution.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional, Tuple

import jax
import jax.numpy as jnp

from specjax.draft.feature import (FeatureDrafterState, FeatureHeadDrafter, catch_up,
                                   check_head)
from specjax.draft.tree import (DynamicTree, StaticTree, TreeProposal, cache_positions,
                                draw_level, empty_tree, keep_most_probable, level_attention,
                                level_starts, put_level, spine_child, spine_tail,
                                static_ancestors)
from specjax.models.feature_head import FeatureHead
from specjax.models.tree import nodes_call
from specjax.sampling import Sampling


@dataclasses.dataclass(frozen=True)
class FeatureTreeDrafter(FeatureHeadDrafter):
  """A tree drafter whose nodes come from a feature head over the target's features.

  `target` is the `FeatureModel` being decoded, `head` the `FeatureHead` trained for it (same
  emb_dim and vocabulary, checked here), `tree` a `StaticTree` or `DynamicTree`. Its params
  are `FeatureTreeDrafter.params(head_params, target_params)`, as `FeatureDrafter`'s.
  """

  target: Any  # a specjax.models.FeatureModel
  head: FeatureHead
  tree: Any  # StaticTree or DynamicTree
  vocab_limit: Optional[int] = None
  """As `FeatureDrafter.vocab_limit`: nodes are drawn from that many token ids only (the
  first of the token ranking given to `params`, else ids below it)."""

  deterministic: ClassVar[bool] = False

  def __post_init__(self):
    if not isinstance(self.tree, (StaticTree, DynamicTree)):
      raise ValueError(f"tree must be a StaticTree or DynamicTree, got {self.tree!r}")
    check_head(self)

  @property
  def max_gamma(self) -> int:
    """The tree's depth: the most guesses a round can accept."""
    return self.tree.max_depth

  @property
  def lookahead(self) -> int:
    """Cache positions a round writes past the committed tokens: every grown node (the
    window's re-fed positions lie below them)."""
    return self.tree.grown

  def propose(self, params, state: FeatureDrafterState, seq, length, gamma, row_keys,
              sampling: Sampling) -> Tuple[TreeProposal, FeatureDrafterState]:
    """seq [B, T], length [B], row_keys [B] -> (TreeProposal, state); gamma unused (the
    tree's shape is static)."""
    del gamma
    tree, target, batch = self.tree, self.target, seq.shape[0]
    head, target_params = params["head"], params["target"]
    root, cache = catch_up(target, self.head, params, state, seq, length, tree.max_depth + 1)
    starts = level_starts(tree.levels)
    size = tree.grown
    # predicted[:, 0] is the root's predicted feature, predicted[:, j + 1] node j's.
    predicted = jnp.zeros((batch, size + 1, root.shape[-1]), jnp.float32).at[:, 0].set(root)
    level_logits = self.draft_logits(params, root)[:, None]  # [B, 1, V]
    depth, (tokens, parent, valid, path_logq, probs) = empty_tree(tree, batch,
                                                                  level_logits.shape[-1])
    level_ids, parent_logq, q_row = jnp.zeros((batch, 1), jnp.int32), \
        jnp.zeros((batch, 1), jnp.float32), 0
    tail, first = spine_tail(tree)  # node index of depth d >= tail: first + d
    for d in range(1, tail):
      lo, hi = starts[d - 1], starts[d]
      if d > 1:  # one head call over the level above: its nodes' predictions
        plo, phi = starts[d - 2], starts[d - 1]
        inputs = jnp.take_along_axis(predicted, (parent[:, plo:phi] + 1)[:, :, None], axis=1)
        attention = level_attention(tree, parent, depth, length, plo, phi,
                                    cache_positions(cache))
        out, cache = self.head.decode(head, cache, inputs,
                                      target.embed(target_params, tokens[:, plo:phi]),
                                      length + plo, tree=attention)
        predicted = predicted.at[:, plo + 1:phi + 1].set(out)
        level_logits = self.draft_logits(params, out)  # [B, m, V]
        level_ids = jnp.broadcast_to(jnp.arange(plo, phi) + 1, (batch, phi - plo))
        parent_logq, q_row = path_logq[:, plo:phi], plo + 1
      tokens, parent, valid, path_logq, probs = put_level(
          (tokens, parent, valid, path_logq, probs), lo, q_row, draw_level(
              tree, d, row_keys, length, level_logits, level_ids, parent_logq, hi - lo, sampling))
    if tail <= tree.max_depth:  # single-node levels under single nodes: one loop, as a chain's
      # steps (unrolled, XLA:CPU copied the head's whole cache at each level's write)
      anc = static_ancestors(tree, batch)
      step = lambda d, a: self._spine_level(params, row_keys, length, anc, depth, first + d, d,
                                            sampling, a)
      cache, predicted, tokens, parent, valid, path_logq, probs = jax.lax.fori_loop(
          tail, tree.max_depth + 1, step,
          (cache, predicted, tokens, parent, valid, path_logq, probs))
    proposal = TreeProposal(tokens=tokens, parent=parent, depth=depth, valid=valid, probs=probs,
                            calls=jnp.full((batch,), tree.max_depth, jnp.int32))
    if tree.nodes < size:
      proposal, _ = keep_most_probable(proposal, path_logq, tree.nodes)
    return proposal, state.replace(cache=cache, fed=length, start=length)

  def _spine_level(self, params, row_keys, length, anc, depth, node, d, sampling, arrays):
    """The single node `node` (traced) at depth d (traced) under the single node node - 1: one
    head call over node - 1 (its parent's predicted feature, its token), one child drawn."""
    cache, predicted, nodes = arrays[0], arrays[1], arrays[2:]
    tokens, parent = nodes[0], nodes[1]
    above = node - 1
    attention = nodes_call(anc, depth, length, above, 1, cache_positions(cache))
    # node - 1's parent is looked up: at the loop's first depth it lies in a level of several
    # nodes (spines (4, 1): node 2's parent is node 0).
    up = jax.lax.dynamic_slice_in_dim(parent, above, 1, axis=1) + 1  # [B, 1]
    inputs = jnp.take_along_axis(predicted, up[:, :, None], axis=1)  # [B, 1, E]
    feed = jax.lax.dynamic_slice_in_dim(tokens, above, 1, axis=1)
    out, cache = self.head.decode(params["head"], cache, inputs,
                                  self.target.embed(params["target"], feed), length + above,
                                  tree=attention)
    predicted = jax.lax.dynamic_update_slice_in_dim(predicted, out, above + 1, axis=1)
    return (cache, predicted) + spine_child(self.tree, row_keys, length, node, d,
                                            self.draft_logits(params, out)[:, 0], sampling, nodes)
