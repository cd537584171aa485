"""Unigram and bigram drafters from sparse count tables (c ≈ 0), no model call.

`NGramDrafter` guesses a chain from its table; `NGramTreeDrafter` grows a `StaticTree` or
`DynamicTree` from the same table: a node's children are drawn from q(· | the node's
token) (bigram) or the unigram q, at temperature 0 its most frequent followers, at
temperature > 0 an ordered draw without replacement (or i.i.d., `iid=True`), exactly as
`TreeModelDrafter` draws from a model's logits. The q of every node is a real
distribution, so the tree is verified by `specjax.verify.tree`'s multi-candidate rule
and the output follows the target exactly. A level costs one table lookup per node, O(V).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specjax.draft.base import (Accepted, DrafterDefaults, Proposal, TableDrafter, check_flags,
                                check_sizes, guess_chain)
from specjax.draft.tree import TreeProposal, check_shape, grow_tree
from specjax.rows import take_rows
from specjax.sampling import Sampling


def table_probs(params, prev: jax.Array) -> jax.Array:
  """Add-k smoothed q(· | prev) from a sparse table. prev: int32 [B] -> float32 [B, V]."""
  ids = params["ids"][prev]  # int32 [B, M]
  counts = params["counts"][prev]  # float32 [B, M]
  total = params["totals"][prev]  # float32 [B]
  vocab = params["smoothing"].shape[0]
  k = params["smoothing"][0]
  base = jnp.full((prev.shape[0], vocab), k, jnp.float32)
  dense = jax.vmap(lambda b, i, c: b.at[i].add(c))(base, ids, counts)
  return dense / (total + k * vocab)[:, None]


@flax.struct.dataclass
class NoState:
  """The state of a stateless drafter."""
  pass


@dataclasses.dataclass(frozen=True)
class NGramDrafter(TableDrafter):
  """Unigram (order 1) or bigram (order 2) drafter with add-k smoothing; c ≈ 0.

  `params` (from `from_corpus`) is a sparse count table: for each context token
  the `max_followers` most frequent next tokens and their counts (the rest
  count as 0), and the total count, so a row of q costs O(V) and the table
  O(V · max_followers) memory instead of O(V²).
  """

  order: int
  vocab: int
  max_gamma: int
  unroll: bool = False
  """All max_gamma guesses in straight-line code, no loop per guess (`guess_chain`)."""

  deterministic: ClassVar[bool] = False

  def __post_init__(self):
    if self.order not in (1, 2):
      raise ValueError(f"order must be 1 (unigram) or 2 (bigram), got {self.order!r}")
    check_sizes(self, vocab=1, max_gamma=1)
    check_flags(self, "unroll")

  @staticmethod
  def from_corpus(token_lists: Sequence[Sequence[int]], vocab_size: int, *, order: int,
                  max_gamma: int, k: float = 0.01, max_followers: int = 64
                  ) -> Tuple["NGramDrafter", dict]:
    """Counts n-grams in a token corpus. Returns (drafter, params)."""
    if order not in (1, 2):
      raise ValueError(f"order must be 1 (unigram) or 2 (bigram), got {order}")
    if k <= 0:
      raise ValueError(f"add-k smoothing needs k > 0, got {k}")
    contexts = vocab_size if order == 2 else 1
    counts = np.zeros((contexts, vocab_size), np.float64)
    for tokens in token_lists:
      tokens = np.asarray(tokens, np.int64)
      if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"corpus token ids must be in [0, {vocab_size})")
      if order == 1:
        np.add.at(counts[0], tokens, 1)
      elif tokens.size > 1:
        np.add.at(counts, (tokens[:-1], tokens[1:]), 1)
    m = min(max_followers, vocab_size)
    ids = np.argsort(-counts, axis=1, kind="stable")[:, :m]
    top = np.take_along_axis(counts, ids, axis=1)
    params = {
        "ids": jnp.asarray(ids, jnp.int32),
        "counts": jnp.asarray(top, jnp.float32),
        "totals": jnp.asarray(top.sum(1), jnp.float32),
        "smoothing": jnp.full((vocab_size,), k, jnp.float32),
    }
    return NGramDrafter(order=order, vocab=vocab_size, max_gamma=max_gamma), params

  def init(self, params, inputs, seq, length, cache_len):
    return NoState()

  def logits(self, params, context: jax.Array) -> jax.Array:
    """int32 [...] context tokens -> float32 [..., V]: log q(· | token) (bigram) or the
    unigram log q (the context unread)."""
    flat = context.reshape(-1)
    if self.order == 1:
      flat = jnp.zeros_like(flat)
    return jnp.log(table_probs(params, flat)).reshape(*context.shape, self.vocab)

  def propose(self, params, state, seq, length, gamma, row_keys, sampling):
    last = take_rows(seq, (length - 1)[:, None])[:, 0]  # [B]
    step = lambda carry, prev, i: (self.logits(params, prev[:, 0]), carry)  # a table lookup
    tokens, all_probs, _ = guess_chain(self.logits(params, last), step, (), row_keys, length,
                                       gamma, self.max_gamma, sampling, self.unroll)
    return Proposal(tokens=tokens, probs=all_probs, calls=jnp.zeros_like(length)), state

  def update(self, state, accepted: Accepted):
    return state

  def as_tree(self, tree: Any) -> "NGramTreeDrafter":
    """A tree drafter growing `tree` (a StaticTree or DynamicTree) from this table."""
    return NGramTreeDrafter(self, tree)


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

  def propose(self, params, state, seq, length, gamma, row_keys, sampling: Sampling
              ) -> Tuple[TreeProposal, NoState]:
    """seq [B, T], length [B], row_keys [B] -> (TreeProposal, state); gamma unused."""
    del gamma
    last = take_rows(seq, (length - 1)[:, None])[:, 0]  # [B]
    logits = lambda context: self.table.logits(params, context)

    def level(carry, tokens, parent, depth, plo, phi):  # q(· | each node's token)
      return logits(tokens[:, plo:phi]), carry

    def spine(carry, tokens, parent, depth, anc, above):  # q(· | node `above`'s token)
      return logits(jax.lax.dynamic_index_in_dim(tokens, above, axis=1, keepdims=False)), carry

    proposal, _, _ = grow_tree(self.tree, logits(last), level, spine, None, row_keys, length,
                               sampling, self.table.unroll)
    return proposal.replace(calls=jnp.zeros_like(proposal.calls)), state  # no model call

  def update(self, state, accepted: Accepted):
    del accepted
    return state


def UnigramDrafter(token_lists, vocab_size, *, max_gamma, k=0.01):  # pylint: disable=invalid-name
  """A unigram `NGramDrafter` from a token corpus -> (drafter, params)."""
  return NGramDrafter.from_corpus(token_lists, vocab_size, order=1, max_gamma=max_gamma, k=k)


def BigramDrafter(token_lists, vocab_size, *, max_gamma, k=0.01, max_followers=64):  # pylint: disable=invalid-name
  """A bigram `NGramDrafter` from a token corpus -> (drafter, params)."""
  return NGramDrafter.from_corpus(token_lists, vocab_size, order=2, max_gamma=max_gamma, k=k,
                                  max_followers=max_followers)
