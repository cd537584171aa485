"""Token trees: their static shapes, how a drafter draws one (`grow_tree`), and the cache move
after verification. The tree drafters live beside their chain drafters (`specjax.draft.model`,
`.ngram`, `.feature`; prompt lookup in `.lookup_tree`).

A tree of N nodes lies in level order: the nodes of depth 1, then those of depth 2, ...;
the children of one node are contiguous and in the order they were drawn. Shapes are
static (`StaticTree`: branching per depth or an explicit path list, as Medusa's and
EAGLE's "choices"; `DynamicTree`: nodes per level fixed, parents chosen by the draft).
At temperature > 0 a node's children are an ordered draw WITHOUT replacement from its q
(Gumbel-top-k), or i.i.d. draws from it (`iid=True`); at temperature 0 they are the top
tokens of the draft's logits. `specjax.verify.tree` verifies them exactly; its docstring
says why a dynamic tree chooses which nodes to expand but never prunes drawn children.

Randomness: the children of a node at depth d - 1 (the root at depth 0) are drawn from
`fold_in(position_key(row_key, length - 1 + d, DRAFT_STREAM), node)` (node 0 the root,
j + 1 node j), so a row's tree does not depend on its batch.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specjax.draft.base import check_sizes
from specjax.models import DecodingModel
from specjax.models.tree import level_call, nodes_call
from specjax.sampling import DRAFT_STREAM, Sampling, argmax, position_key


MAX_TREE_NODES = 2048
"""Most nodes a token tree may have: the target scores every node in one call, so a larger tree
costs more than any accepted length could repay (EAGLE's and Medusa's trees have about 60)."""


def _check_node_count(count: int, what: str, at_least: bool = False) -> None:
  """ValueError when a tree described by `what` would have more than MAX_TREE_NODES nodes
  (counted before the tree is built; `at_least`: the count stopped early)."""
  if count > MAX_TREE_NODES:
    count_text = f"at least {count}" if at_least else str(count)
    raise ValueError(f"{what} makes a tree of {count_text} nodes, more than {MAX_TREE_NODES} (the "
                     "target scores every node in one call): use a smaller tree")


def _short(values: Sequence[int]) -> str:
  """A tuple for a message: whole when short, else its first entries and the count."""
  values = tuple(values)
  if len(values) <= 8:
    return repr(values)
  return "(" + ", ".join(map(str, values[:4])) + f", ... ({len(values)} in all)"


def level_starts(levels: Sequence[int]) -> Tuple[int, ...]:
  """Node count per depth -> the index each depth's nodes start at, the total last:
  (3, 2) -> (0, 3, 5)."""
  return tuple(int(x) for x in np.concatenate([[0], np.cumsum(levels)]))


@dataclasses.dataclass(frozen=True)
class StaticTree:
  """A fixed tree: node j is child number `ranks[j]` (in draw order) of node `parents[j]`.

  Build it with `StaticTree.from_branching((3, 2, 1))` (every depth-d node has that many
  children), `StaticTree.from_paths([(0,), (1,), (0, 0), ...])` (each path the ranks
  from the root, Medusa / EAGLE "choices"; a node's children must be ranks 0..c-1) or
  `StaticTree.from_spines((22, 5, 2, 1, 1))` (a deep top-1 spine plus short alternatives).
  """

  parents: Tuple[int, ...]
  """Parent node of each node (-1: the root), in level order."""
  ranks: Tuple[int, ...]
  """Each node's place among its parent's children (0 first drawn)."""
  iid: bool = False
  """Children drawn i.i.d. from the parent's q (may repeat a token) instead of without
  replacement."""

  def __post_init__(self):
    if not self.parents or len(self.parents) != len(self.ranks):
      raise ValueError(f"a tree needs one rank per node and at least one node, got "
                       f"{len(self.parents)} parents and {len(self.ranks)} ranks")
    _check_node_count(len(self.parents), "StaticTree")
    depth = []
    for j, (p, r) in enumerate(zip(self.parents, self.ranks)):
      if not -1 <= p < j:
        raise ValueError(f"node {j}'s parent {p} must be -1 or an earlier node")
      depth.append(1 if p < 0 else depth[p] + 1)
    if depth != sorted(depth):
      raise ValueError("nodes must be in level order (every depth-d node before depth d+1)")
    children = {}  # parent -> its children's ranks, in node order (one pass: O(nodes))
    for p, r in zip(self.parents, self.ranks):
      children.setdefault(p, []).append(r)
    for p, got in children.items():
      if got != list(range(len(got))):
        raise ValueError(f"the children of node {p} must have ranks 0..{len(got) - 1} in "
                         f"order, got {got}")

  @classmethod
  def from_branching(cls, branching: Sequence[int], iid: bool = False) -> "StaticTree":
    """Every node of depth d - 1 (the root at 0) gets branching[d - 1] children."""
    if not branching or any(not isinstance(b, (int, np.integer)) or isinstance(b, bool)
                            or b < 1 for b in branching):
      raise ValueError(f"branching must be positive integers, got {branching!r}")
    count, width = 0, 1
    for b in branching:  # stops at the first level past the limit
      width *= int(b)
      count += width
      if count > MAX_TREE_NODES:
        _check_node_count(count, f"branching {_short(branching)}", at_least=True)
    parents, ranks, frontier = [], [], [-1]
    for b in branching:
      level = []
      for p in frontier:
        for r in range(int(b)):
          level.append(len(parents))
          parents.append(p)
          ranks.append(r)
      frontier = level
    return cls(tuple(parents), tuple(ranks), iid)

  @classmethod
  def from_paths(cls, paths: Sequence[Sequence[int]], iid: bool = False) -> "StaticTree":
    """One node per path of child ranks from the root; every prefix must be a path too."""
    _check_node_count(len(paths), f"a list of {len(paths)} paths")
    paths = sorted({tuple(int(r) for r in p) for p in paths}, key=lambda p: (len(p), p))
    if not paths or not paths[0]:
      raise ValueError(f"paths must be non-empty rank tuples, got {paths!r}")
    index = {p: j for j, p in enumerate(paths)}
    missing = [p for p in paths if len(p) > 1 and p[:-1] not in index]
    if missing:
      raise ValueError(f"path {missing[0]} has no parent path {missing[0][:-1]}")
    return cls(tuple(index[p[:-1]] if len(p) > 1 else -1 for p in paths),
               tuple(p[-1] for p in paths), iid)

  @classmethod
  def from_spines(cls, lengths: Sequence[int], iid: bool = False) -> "StaticTree":
    """The root's child of rank r heads a spine of lengths[r] nodes (each node's first drawn
    child under it): one deep guess plus shorter alternatives for the first token, e.g.
    (22, 5, 2, 1, 1). Lengths must not increase (a later-drawn child is less likely)."""
    if (not lengths or any(not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1
                           for n in lengths) or list(lengths) != sorted(lengths, reverse=True)):
      raise ValueError(f"spine lengths must be positive, non-increasing integers, got "
                       f"{lengths!r}")
    _check_node_count(sum(int(n) for n in lengths), f"spine lengths {_short(lengths)}")
    return cls.from_paths([(r,) + (0,) * i for r, n in enumerate(lengths) for i in range(n)],
                          iid)

  @property
  def depth(self) -> np.ndarray:
    """int32 [N]: each node's depth (1-based)."""
    out = []
    for p in self.parents:
      out.append(1 if p < 0 else out[p] + 1)
    return np.asarray(out, np.int32)

  @property
  def levels(self) -> Tuple[int, ...]:
    """Nodes per depth."""
    return tuple(int(c) for c in np.bincount(self.depth)[1:])

  @property
  def grown(self) -> int:
    """Nodes drafted per round: all of them."""
    return len(self.parents)

  @property
  def max_depth(self) -> int:
    return len(self.levels)

  @property
  def nodes(self) -> int:
    """Nodes the target scores: all of them."""
    return self.grown

  @property
  def max_children(self) -> int:
    """The most children of one node (the root included): drawn from one q of V tokens."""
    return max(self.ranks) + 1

  @property
  def greedy_only(self) -> bool:
    """Whether the tree is exact at temperature 0 only: never for a static tree."""
    return False


@dataclasses.dataclass(frozen=True)
class DynamicTree:
  """A tree grown by the draft's own probabilities: the root gets `branch` children; at
  each later depth the `expand` nodes of the level above with the highest path
  probability (product of q along the path; at temperature 0 of the draft's
  temperature-1 softmax) get `branch` children each (EAGLE-2's expansion). Drawn
  children are never pruned by their own probability (`specjax.verify.tree`), except
  with `keep`: the grown tree is cut to its `keep` nodes of highest path probability
  (EAGLE-2's rerank), which the target then scores. That cut prunes drawn children by
  their own probability, so `keep` is exact at temperature 0 only (where any tree is)."""

  branch: int
  """Children per expanded node."""
  expand: int
  """Nodes expanded per level (at most the level's size)."""
  max_depth: int
  """Levels."""
  iid: bool = False
  """Children drawn i.i.d. instead of without replacement."""
  keep: Optional[int] = None
  """Nodes the target scores: the `keep` most probable of the grown tree (temperature 0
  only); None scores every grown node."""

  def __post_init__(self):
    check_sizes(self, branch=1, expand=1, max_depth=1)
    _check_node_count(self.branch + self.branch * self.expand * (self.max_depth - 1),
                      f"DynamicTree(branch={self.branch}, expand={self.expand}, "
                      f"max_depth={self.max_depth})")
    if self.max_depth > 1 and self.expand > self.branch:
      raise ValueError(f"DynamicTree.expand={self.expand} exceeds the first level's "
                       f"{self.branch} nodes")
    if self.keep is not None:
      check_sizes(self, keep=1)
      if self.keep > self.grown:
        raise ValueError(f"DynamicTree.keep={self.keep} exceeds the {self.grown} nodes grown")

  @property
  def levels(self) -> Tuple[int, ...]:
    """Grown nodes per depth."""
    return (self.branch,) + (self.branch * self.expand,) * (self.max_depth - 1)

  @property
  def depth(self) -> np.ndarray:
    """int32 [grown]: each grown node's depth (1-based)."""
    return np.repeat(np.arange(1, self.max_depth + 1), self.levels).astype(np.int32)

  @property
  def grown(self) -> int:
    """Nodes drafted per round (each fed to the draft)."""
    return sum(self.levels)

  @property
  def nodes(self) -> int:
    """Nodes the target scores: `keep`, or every grown node."""
    return self.grown if self.keep is None else self.keep

  @property
  def max_children(self) -> int:
    """The most children of one node: `branch` (drawn from one q of V tokens)."""
    return self.branch

  @property
  def greedy_only(self) -> bool:
    """Whether the tree is exact at temperature 0 only: when `keep` cuts it."""
    return self.keep is not None


@flax.struct.dataclass
class TreeProposal:
  """What a tree drafter hands the target for one round."""

  tokens: jax.Array  # int32 [B, N]: the nodes' tokens, level order
  parent: jax.Array  # int32 [B, N]: each node's parent (-1: the root)
  depth: jax.Array  # int32 [B, N]: each node's depth (1-based)
  valid: jax.Array  # bool [B, N]: nodes that are real draws
  probs: jax.Array  # float32 [B, N + 1, V]: q at the root and at each node (0 at leaves)
  calls: jax.Array  # int32 [B]: draft model calls spent


def draw_children(key: jax.Array, logits: jax.Array, count: int, sampling: Sampling,
                  iid: bool) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """`count` children of one node from the draft's logits [V].

  Returns (tokens int32 [count], q float32 [V] they were drawn from, rank_q float32 [V]
  the probabilities that rank paths). Temperature 0: the top `count` tokens by logit
  (ties to the lowest id). Otherwise Gumbel-top-k (an ordered draw without replacement)
  or `count` i.i.d. draws from q.
  """
  if sampling.greedy:  # one child: an argmax (XLA:CPU sorts the whole row for a top_k)
    top = argmax(logits)[None] if count == 1 else jax.lax.top_k(logits, count)[1]
    return top.astype(jnp.int32), jnp.zeros_like(logits), \
        jax.nn.softmax(logits.astype(jnp.float32))
  q = sampling.probs(logits)
  if iid:
    tokens = jax.random.categorical(key, jnp.log(q), shape=(count,))
  else:
    gumbel = jax.random.gumbel(key, q.shape, jnp.float32)
    score = jnp.where(q > 0, jnp.log(jnp.maximum(q, 1e-38)) + gumbel, -jnp.inf)
    tokens = jax.lax.top_k(score, count)[1]
  return tokens.astype(jnp.int32), q, q


def _children_keys(row_keys, length, depth: int, nodes: jax.Array):
  """Keys [B, n] for the children at `depth` of node ids nodes int32 [B, n] (0 = root)."""
  def row(key, l, ids):
    base = position_key(key, l - 1 + depth, DRAFT_STREAM)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(ids)
  return jax.vmap(row)(row_keys, length, nodes)


def grow_tree(tree, root_logits, level_call: Callable, spine_call: Callable, carry: Any,
              row_keys, length, sampling: Sampling, unroll: bool = False):
  """What every tree drafter does with its draft calls: the tree of `tree` (a StaticTree or
  DynamicTree) drawn level by level, one draft call per level.

  root_logits [B, V]: the drafter's first call (which caught it up), the q of the root's
  children. level_call(carry, tokens, parent, depth, plo, phi) -> (logits [B, phi - plo, V],
  carry): one call over the nodes plo .. phi - 1 (a level of several nodes), each at slot
  length + j under tree attention (`level_attention`). spine_call(carry, tokens, parent,
  depth, anc, above) -> (logits [B, V], carry): one call over the single node `above` (traced,
  or an int when unrolled) of the tree's spine tail, whose levels run as one loop
  (`spine_tail`), or as straight-line code with `unroll` (no loop: on a GPU each trip costs a
  host round trip). The draws are `draw_level` and `spine_child`'s, so every tree drafter
  draws the same tree from the same logits. -> (TreeProposal, `keep_most_probable`'s source
  map when the tree keeps fewer nodes than it grows (else None), the last carry).
  """
  batch = root_logits.shape[0]
  starts = level_starts(tree.levels)
  depth, (tokens, parent, valid, path_logq, probs) = empty_tree(tree, batch,
                                                                root_logits.shape[-1])
  # Level 1: the root's children.
  level_logits, level_ids = root_logits[:, None], jnp.zeros((batch, 1), jnp.int32)
  parent_logq, q_row = jnp.zeros((batch, 1), jnp.float32), 0
  tail, first = spine_tail(tree)  # node index of depth d >= tail: first + d
  for d in range(1, tail):
    lo, hi = starts[d - 1], starts[d]
    if d > 1:  # the level above's logits, from one call over its nodes
      plo, phi = starts[d - 2], starts[d - 1]
      level_logits, carry = level_call(carry, tokens, parent, depth, plo, phi)
      level_ids = jnp.broadcast_to(jnp.arange(plo, phi) + 1, (batch, phi - plo))
      parent_logq, q_row = path_logq[:, plo:phi], plo + 1
    tokens, parent, valid, path_logq, probs = put_level(
        (tokens, parent, valid, path_logq, probs), lo, q_row, draw_level(
            tree, d, row_keys, length, level_logits, level_ids, parent_logq, hi - lo, sampling))
  if tail <= tree.max_depth:  # single-node levels whose parent is single too: one loop (a
    # chain's steps; unrolled, XLA:CPU copied a head's whole cache at each level's write)
    anc = static_ancestors(tree, batch)

    def spine_level(d, arrays):  # node first + d (traced) at depth d under node first + d - 1
      carry, nodes = arrays[0], arrays[1:]
      node = first + d
      logits, carry = spine_call(carry, nodes[0], nodes[1], depth, anc, node - 1)
      return (carry,) + spine_child(tree, row_keys, length, node, d, logits, sampling, nodes)

    arrays = (carry, tokens, parent, valid, path_logq, probs)
    if unroll:
      for d in range(tail, tree.max_depth + 1):
        arrays = spine_level(d, arrays)
    else:
      arrays = jax.lax.fori_loop(tail, tree.max_depth + 1, spine_level, arrays)
    carry, tokens, parent, valid, path_logq, probs = arrays
  proposal = TreeProposal(tokens=tokens, parent=parent, depth=depth, valid=valid, probs=probs,
                          calls=jnp.full((batch,), tree.max_depth, jnp.int32))
  source = None
  if tree.nodes < tree.grown:
    proposal, source = keep_most_probable(proposal, path_logq, tree.nodes)
  return proposal, source, carry


def cap_depth(tree: Any, max_depth: int) -> Any:
  """`tree` cut to its first `max_depth` levels (a round emits at most the budget, so deeper
  guesses only cost draft calls and target width): a StaticTree keeps its nodes of depth <=
  max_depth (a prefix, in level order), a DynamicTree its levels (and `keep` at most what it
  then grows)."""
  if tree is None or tree.max_depth <= max_depth:
    return tree
  if isinstance(tree, StaticTree):
    count = level_starts(tree.levels)[max_depth]
    return dataclasses.replace(tree, parents=tree.parents[:count], ranks=tree.ranks[:count])
  capped = dataclasses.replace(tree, max_depth=max_depth, keep=None)
  keep = None if tree.keep is None else min(tree.keep, capped.grown)
  return dataclasses.replace(capped, keep=keep)


def check_shape(tree: Any) -> Any:
  """`tree` when it is a `StaticTree` or `DynamicTree`; ValueError naming what it got."""
  if not isinstance(tree, (StaticTree, DynamicTree)):
    raise ValueError(f"tree must be a StaticTree or DynamicTree, got {tree!r}")
  return tree


def draw_level(tree, d: int, row_keys, length, logits, ids, parent_logq, width: int,
               sampling: Sampling):
  """Draws level d (`width` nodes) of a StaticTree or DynamicTree from the level above:
  logits [B, m, V] at nodes ids [B, m] (0 = root), their path log-probabilities [B, m] ->
  (tokens, parent, valid, path log q) [B, width] and q [B, m, V]."""
  batch, m = logits.shape[:2]
  per = tree.branch if isinstance(tree, DynamicTree) else int(
      max(r for r, dd in zip(tree.ranks, tree.depth) if dd == d)) + 1
  keys = _children_keys(row_keys, length, d, ids)  # [B, m]
  draw = jax.vmap(jax.vmap(lambda k, l: draw_children(k, l, per, sampling, tree.iid)))
  children, q, rank_q = draw(keys, logits)  # [B, m, per], [B, m, V], [B, m, V]
  child_logq = parent_logq[:, :, None] + jnp.log(
      jnp.maximum(jnp.take_along_axis(rank_q, children, axis=2), 1e-38))
  valid = jnp.ones_like(children, jnp.bool_) if sampling.greedy else (
      jnp.take_along_axis(q, children, axis=2) > 0)
  if isinstance(tree, StaticTree):
    starts = level_starts(tree.levels)
    lo = starts[d - 1]
    parents = np.asarray(tree.parents[lo:lo + width])  # static, global node indices
    local = parents + 1 if d == 1 else parents - starts[d - 2]  # index in the level above
    pick = jnp.asarray(local * per + np.asarray(tree.ranks[lo:lo + width]))
    flat = lambda x: x.reshape(batch, -1)[:, pick]
    parent = jnp.broadcast_to(jnp.asarray(parents, jnp.int32), (batch, width))
    return flat(children), parent, flat(valid), flat(child_logq), q
  # Dynamic: the `expand` nodes of the level above with the highest path log q.
  _, top = jax.lax.top_k(parent_logq, min(tree.expand, m))
  top = jnp.sort(top, axis=1)  # keep level order among the expanded nodes
  gather = lambda x: jnp.take_along_axis(x, top[:, :, None], axis=1).reshape(batch, -1)
  parent = jnp.repeat(jnp.take_along_axis(ids, top, axis=1) - 1, per, axis=1)
  return gather(children), parent, gather(valid), gather(child_logq), q


def empty_tree(tree, batch: int, vocab: int):
  """(depth int32 [B, N], the arrays `put_level` fills: tokens 0, parent -1, valid False,
  path log q 0 [B, N], probs 0 [B, N + 1, V]) of a tree of N = tree.grown nodes."""
  size = tree.grown
  return jnp.broadcast_to(jnp.asarray(tree.depth), (batch, size)), (
      jnp.zeros((batch, size), jnp.int32), jnp.full((batch, size), -1, jnp.int32),
      jnp.zeros((batch, size), jnp.bool_), jnp.zeros((batch, size), jnp.float32),
      jnp.zeros((batch, size + 1, vocab), jnp.float32))


def put_level(arrays, lo: int, q_row, drawn):
  """Writes a level `draw_level` drew (`drawn`) into a tree's arrays (tokens, parent, valid,
  path log q [B, N]; probs [B, N + 1, V]): its nodes from node `lo`, the q of the level above
  from probs row `q_row` (0 the root's, j + 1 node j's)."""
  tokens, parent, valid, path_logq, probs = arrays
  new_tokens, new_parent, new_valid, new_logq, q = drawn
  hi = lo + new_tokens.shape[1]
  return (tokens.at[:, lo:hi].set(new_tokens), parent.at[:, lo:hi].set(new_parent),
          valid.at[:, lo:hi].set(new_valid), path_logq.at[:, lo:hi].set(new_logq),
          probs.at[:, q_row:q_row + q.shape[1]].set(q))


def spine_child(tree, row_keys, length, node, d, logits, sampling: Sampling, arrays):
  """Draws the single node `node` (traced) of depth d (traced) under node - 1 from that node's
  logits [B, V] (its first-ranked child) and writes it into the tree's arrays (tokens, parent,
  valid, path log q [B, N]; probs [B, N + 1, V], the q at row `node`) -> the arrays."""
  tokens, parent, valid, path_logq, probs = arrays
  above = node - 1
  keys = _children_keys(row_keys, length, d, jnp.full((tokens.shape[0], 1), node, jnp.int32))
  draw = jax.vmap(lambda k, l: draw_children(k, l, 1, sampling, tree.iid))
  child, q, rank_q = draw(keys[:, 0], logits)  # [B, 1], [B, V], [B, V]
  logq = jax.lax.dynamic_slice_in_dim(path_logq, above, 1, axis=1) + jnp.log(
      jnp.maximum(jnp.take_along_axis(rank_q, child, axis=1), 1e-38))
  ok = jnp.ones_like(child, jnp.bool_) if sampling.greedy else (
      jnp.take_along_axis(q, child, axis=1) > 0)
  put = lambda x, v: jax.lax.dynamic_update_slice_in_dim(x, v.astype(x.dtype), node, axis=1)
  return (put(tokens, child), put(parent, jnp.full_like(child, above)), put(valid, ok),
          put(path_logq, logq), jax.lax.dynamic_update_slice_in_dim(
              probs, q[:, None].astype(probs.dtype), node, axis=1))


def spine_tail(tree) -> Tuple[int, int]:
  """(tail, first): from depth `tail` on, every level of a static tree, and the level above it,
  hold one node (drafted in a loop instead of one unrolled call per level; the node of depth d
  is node first + d, under node first + d - 1); tail = max_depth + 1 (first 0) when fewer than
  two such levels, or for a dynamic tree."""
  none = (tree.max_depth + 1, 0)
  if not isinstance(tree, StaticTree):
    return none
  levels, tail = tree.levels, tree.max_depth + 1
  while tail > 2 and levels[tail - 2] == 1 and levels[tail - 3] == 1:
    tail -= 1
  if tree.max_depth + 1 - tail < 2:
    return none
  return tail, level_starts(levels)[tail - 1] - tail


def static_ancestors(tree, batch: int) -> jax.Array:
  """bool [B, N, N] of a static tree (`_static_ancestors`), broadcast over the rows."""
  size = len(tree.parents)
  return jnp.broadcast_to(jnp.asarray(_static_ancestors(tree.parents)), (batch, size, size))


def level_attention(tree, parent, depth, length, start: int, stop: int, max_len: int):
  """`level_call` over nodes start..stop-1 of the tree being drafted (parent, depth int32
  [B, N]); a static tree's ancestor relation is a constant, not computed per call."""
  if isinstance(tree, StaticTree):
    anc = static_ancestors(tree, parent.shape[0])
    return nodes_call(anc, depth, length, start, stop - start, max_len)
  return level_call(parent, depth, length, start, stop, max_len)


def _static_ancestors(parents: Sequence[int]) -> np.ndarray:
  """bool [N, N]: node i descends from node j or is j (static parents)."""
  size = len(parents)
  out = np.eye(size, dtype=bool)
  for i, p in enumerate(parents):
    if p >= 0:
      out[i] |= out[p]
  return out


def keep_most_probable(proposal: TreeProposal, path_logq: jax.Array, keep: int
                       ) -> Tuple[TreeProposal, jax.Array]:
  """Cuts each row's grown tree to its `keep` nodes of highest path log q [B, G].

  A child's path log q is at most its parent's and `lax.top_k` puts the lower index (the
  parent, in level order) first among equals, so the kept nodes are closed under taking
  parents. Returns (the cut proposal, source int32 [B, keep]: each kept node's grown index,
  ascending, so level order holds).
  """
  score = jnp.where(proposal.valid, path_logq, -jnp.inf)
  source = jnp.sort(jax.lax.top_k(score, keep)[1], axis=1).astype(jnp.int32)  # [B, K]
  batch, grown = path_logq.shape
  new_index = jnp.full((batch, grown), -1, jnp.int32).at[
      jnp.arange(batch)[:, None], source].set(jnp.arange(keep, dtype=jnp.int32))
  take = lambda x: jnp.take_along_axis(x, source, axis=1)
  old_parent = take(proposal.parent)
  parent = jnp.where(old_parent >= 0, jnp.take_along_axis(new_index, jnp.maximum(old_parent, 0),
                                                          axis=1), -1)
  probs = jnp.concatenate([proposal.probs[:, :1], jnp.take_along_axis(
      proposal.probs[:, 1:], source[:, :, None], axis=1)], axis=1)
  return proposal.replace(tokens=take(proposal.tokens), parent=parent, depth=take(proposal.depth),
                          valid=take(proposal.valid), probs=probs), source


def cache_positions(cache) -> int:
  """The cache's positions per row (a KVCache or a table model's token buffer)."""
  return cache.max_len if hasattr(cache, "max_len") else cache.shape[1]


def move_path(model: DecodingModel, cache, length, path, n):
  """Moves each row's accepted path nodes' positions (node j at position length + j) to positions
  length .. length + n - 1; the positions past n are copied onto themselves (the model
  protocol's `move_slots`)."""
  offsets = jnp.arange(path.shape[1])[None, :]
  src = jnp.where(offsets < n[:, None], length[:, None] + jnp.maximum(path, 0),
                  length[:, None] + offsets)
  return model.move_slots(cache, src, length)
