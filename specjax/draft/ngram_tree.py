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
from specjax.draft.tree import TreeProposal, check_shape, grow_tree
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
    last = take_rows(seq, (length - 1)[:, None])  # [B, 1]

    def level(carry, tokens, parent, depth, plo, phi):  # q(· | each node's token)
      return self._logits(params, tokens[:, plo:phi]), carry

    def spine(carry, tokens, parent, depth, anc, above):
      return self._logits(params, jax.lax.dynamic_slice_in_dim(tokens, above, 1, axis=1))[:, 0], \
          carry

    proposal, _, _ = grow_tree(self.tree, self._logits(params, last)[:, 0], level, spine, None,
                               row_keys, length, sampling)
    return proposal.replace(calls=jnp.zeros_like(proposal.calls)), state  # no model call

  def update(self, state, accepted: Accepted):
    del accepted
    return state
