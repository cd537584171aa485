"""An n-gram table drafts a token tree: several continuations per round, no model call.

`NGramDrafter` guesses one chain from its table; this drafter grows a `StaticTree` or
`DynamicTree` from the same table: a node's children are drawn from q(· | the node's
token) (bigram) or the unigram q, at temperature 0 its most frequent followers, at
temperature > 0 an ordered draw without replacement (or i.i.d., `iid=True`), exactly as
`TreeModelDrafter` draws from a model's logits. The q of every node is a real
distribution, so the tree is verified by `specjax.verify.tree`'s multi-candidate rule
and the output follows the target exactly. A level costs one table lookup per node, O(V).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Tuple

import jax
import jax.numpy as jnp

from specjax.draft.base import Accepted, DrafterDefaults
from specjax.draft.ngram import NGramDrafter, NoState, table_probs
from specjax.draft.tree import (TreeProposal, check_shape, draw_level, keep_most_probable,
                                level_starts)
from specjax.rows import take_rows
from specjax.sampling import Sampling


@dataclasses.dataclass(frozen=True)
class NGramTreeDrafter(DrafterDefaults):
  """The tree `tree` drafted from the table of `table` (an `NGramDrafter`, whose params
  this drafter takes: `NGramDrafter.from_corpus`). Module docstring."""

  table: NGramDrafter
  tree: Any  # StaticTree or DynamicTree

  deterministic: ClassVar[bool] = False  # each node's q is the table's distribution
  models: ClassVar[Tuple] = ()  # no draft model: nothing to cache

  def __post_init__(self):
    if not isinstance(self.table, NGramDrafter):
      raise ValueError(f"table must be an NGramDrafter, got {self.table!r}")
    check_shape(self.tree)

  @property
  def vocab_size(self) -> int:
    return self.table.vocab

  @property
  def max_gamma(self) -> int:
    """The tree's depth: the most guesses a round can accept."""
    return self.tree.max_depth

  @property
  def lookahead(self) -> int:
    """Cache positions a round writes past the committed tokens (the target's only)."""
    return self.tree.nodes

  def init(self, params, inputs, seq, length, cache_len):
    del params, inputs, seq, length, cache_len
    return NoState()

  def _logits(self, params, context: jax.Array) -> jax.Array:
    """int32 [B, m] context tokens -> float32 [B, m, V] log q(· | token)."""
    flat = context.reshape(-1)
    if self.table.order == 1:
      flat = jnp.zeros_like(flat)
    return jnp.log(table_probs(params, flat)).reshape(*context.shape, self.vocab_size)

  def propose(self, params, state, seq, length, gamma, row_keys, sampling: Sampling
              ) -> Tuple[TreeProposal, NoState]:
    """seq [B, T], length [B], row_keys [B] -> (TreeProposal, state); gamma unused."""
    del gamma
    tree, batch, vocab = self.tree, seq.shape[0], self.vocab_size
    size, starts = tree.grown, level_starts(tree.levels)
    tokens = jnp.zeros((batch, size), jnp.int32)
    parent = jnp.full((batch, size), -1, jnp.int32)
    valid = jnp.zeros((batch, size), jnp.bool_)
    probs = jnp.zeros((batch, size + 1, vocab), jnp.float32)
    path_logq = jnp.zeros((batch, size), jnp.float32)
    last = take_rows(seq, (length - 1)[:, None])  # [B, 1]
    logits, ids = self._logits(params, last), jnp.zeros((batch, 1), jnp.int32)
    parent_logq, q_row = jnp.zeros((batch, 1), jnp.float32), 0
    for d in range(1, tree.max_depth + 1):
      lo, hi = starts[d - 1], starts[d]
      if d > 1:  # the children of the level above, drawn from q(· | its tokens)
        plo, phi = starts[d - 2], starts[d - 1]
        logits = self._logits(params, tokens[:, plo:phi])
        ids = jnp.broadcast_to(jnp.arange(plo, phi, dtype=jnp.int32) + 1, (batch, phi - plo))
        parent_logq, q_row = path_logq[:, plo:phi], plo + 1
      new = draw_level(tree, d, row_keys, length, logits, ids, parent_logq, hi - lo, sampling)
      tokens, parent, valid, path_logq = (x.at[:, lo:hi].set(v) for x, v in zip(
          (tokens, parent, valid, path_logq), new[:4]))
      probs = probs.at[:, q_row:q_row + new[4].shape[1]].set(new[4])
    proposal = TreeProposal(tokens=tokens, parent=parent,
                            depth=jnp.broadcast_to(jnp.asarray(tree.depth), (batch, size)),
                            valid=valid, probs=probs, calls=jnp.zeros((batch,), jnp.int32))
    if tree.nodes < size:
      proposal, _ = keep_most_probable(proposal, path_logq, tree.nodes)
    return proposal, state

  def update(self, state, accepted: Accepted):
    del accepted
    return state
