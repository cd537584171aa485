"""Prompt lookup as a token tree: several earlier matches of the row's last n-gram, each
continuation one spine of the tree.

`PromptLookupDrafter` copies the continuation of the best match; this drafter keeps the
`branches` best matches whose continuations start with different tokens (longest match
first, then the most recent) and proposes each as a spine of `depth` nodes under the root
(`StaticTree.from_spines((depth,) * branches)`). Its candidates are a function of the
committed tokens, so each node's q is δ at its own token and the tree is verified with
`specjax.verify.tree`'s deterministic rule (exact at every temperature). No model call.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Tuple

import jax.numpy as jnp
import numpy as np

from specjax.draft.base import Accepted, TableDrafter, check_sizes
from specjax.draft.ngram import NoState
from specjax.draft.prompt_lookup import continuation, match_scores
from specjax.draft.tree import StaticTree, TreeProposal
from specjax.rows import take_rows
from specjax.sampling import Sampling


@dataclasses.dataclass(frozen=True)
class PromptLookupTreeDrafter(TableDrafter):
  """`branches` prompt-lookup continuations of `depth` tokens each, as one tree (module
  docstring). A branch with no match of its own is invalid (never accepted); with no match
  at all the first branch repeats the last token, as `PromptLookupDrafter` does."""

  vocab: int
  branches: int = 2
  depth: int = 4
  max_ngram: int = 3

  deterministic: ClassVar[bool] = True  # each node's q is δ at its token (`specjax.verify.tree`)

  def __post_init__(self):
    check_sizes(self, vocab=1, branches=1, depth=1, max_ngram=1)

  @property
  def tree(self) -> StaticTree:
    return StaticTree.from_spines((self.depth,) * self.branches)

  @property
  def max_gamma(self) -> int:
    """The tree's depth: the most guesses a round can accept."""
    return self.depth

  @property
  def lookahead(self) -> int:
    """Cache positions a round writes past the committed tokens: every node."""
    return self.branches * self.depth

  def init(self, params, inputs, seq, length, cache_len):
    del params, inputs, seq, length, cache_len
    return NoState()

  def propose(self, params, state, seq, length, gamma, row_keys, sampling: Sampling
              ) -> Tuple[TreeProposal, NoState]:
    """seq [B, T], length [B] -> (TreeProposal with q unused [B, N + 1, 1], state)."""
    del params, gamma, row_keys, sampling
    nodes = self.branches * self.depth
    batch, total = seq.shape
    score = match_scores(seq, length, self.max_ngram)  # [B, T]
    after = take_rows(seq, jnp.minimum(jnp.arange(total) + 1, total - 1)[None, :]
                      .repeat(batch, axis=0))  # [B, T]: the token after each end
    spines, found = [], []
    for branch in range(self.branches):
      end, hit = jnp.argmax(score, axis=1), jnp.max(score, axis=1) >= 0
      tokens = continuation(seq, length, end, hit, self.depth)  # [B, depth]
      spines.append(tokens)
      found.append(hit if branch else jnp.ones_like(hit))
      score = jnp.where(after == tokens[:, :1], -1, score)  # later branches start elsewhere
    # Level order of from_spines((depth,) * branches): depth-major, branch-minor.
    tokens = jnp.stack(spines, axis=2).reshape(batch, nodes)
    valid = jnp.broadcast_to(jnp.stack(found, axis=1)[:, None, :],
                             (batch, self.depth, self.branches)).reshape(batch, nodes)
    tree = self.tree
    shape = (batch, nodes)
    proposal = TreeProposal(
        tokens=tokens.astype(jnp.int32),
        parent=jnp.broadcast_to(jnp.asarray(np.asarray(tree.parents, np.int32)), shape),
        depth=jnp.broadcast_to(jnp.asarray(tree.depth), shape), valid=valid,
        probs=jnp.zeros((batch, nodes + 1, 1), jnp.float32),
        calls=jnp.zeros((batch,), jnp.int32))
    return proposal, state

  def update(self, state, accepted: Accepted):
    del accepted
    return state
