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
from specjax.draft.tree import (TreeProposal, cache_positions, check_shape, grow_tree,
                                level_attention)
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
    check_shape(self.tree)
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
    # predicted[:, 0] is the root's predicted feature, predicted[:, j + 1] node j's.
    predicted = jnp.zeros((batch, tree.grown + 1, root.shape[-1]),
                          jnp.float32).at[:, 0].set(root)

    def level(carry, tokens, parent, depth, plo, phi):  # one head call over a level's nodes
      cache, predicted = carry  # each node reads its parent's predicted feature
      inputs = jnp.take_along_axis(predicted, (parent[:, plo:phi] + 1)[:, :, None], axis=1)
      attention = level_attention(tree, parent, depth, length, plo, phi, cache_positions(cache))
      out, cache = self.head.decode(head, cache, inputs,
                                    target.embed(target_params, tokens[:, plo:phi]),
                                    length + plo, tree=attention)
      predicted = predicted.at[:, plo + 1:phi + 1].set(out)
      return self.draft_logits(params, out), (cache, predicted)  # [B, m, V]

    def spine(carry, tokens, parent, depth, anc, above):  # one head call over node `above`
      cache, predicted = carry
      attention = nodes_call(anc, depth, length, above, 1, cache_positions(cache))
      # The node's parent is looked up: at the loop's first depth it lies in a level of
      # several nodes (spines (4, 1): node 2's parent is node 0).
      up = jax.lax.dynamic_slice_in_dim(parent, above, 1, axis=1) + 1  # [B, 1]
      inputs = jnp.take_along_axis(predicted, up[:, :, None], axis=1)  # [B, 1, E]
      feed = jax.lax.dynamic_slice_in_dim(tokens, above, 1, axis=1)
      out, cache = self.head.decode(head, cache, inputs, target.embed(target_params, feed),
                                    length + above, tree=attention)
      predicted = jax.lax.dynamic_update_slice_in_dim(predicted, out, above + 1, axis=1)
      return self.draft_logits(params, out)[:, 0], (cache, predicted)

    proposal, _, (cache, _) = grow_tree(tree, self.draft_logits(params, root), level, spine,
                                        (cache, predicted), row_keys, length, sampling)
    return proposal, state.replace(cache=cache, fed=length, start=length)
