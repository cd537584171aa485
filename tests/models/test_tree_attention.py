"""Tree calls (`specjax.models.tree`): one call over a token tree gives every node the
logits a chain call along its path gives, for T5, decoder-only and table models; a draft
level call over a tree already partly in the cache does too; after `move_slots` the cache
continues exactly as the chain's."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.draft.tree import StaticTree, move_path
from specjax.models import DecoderOnlyModel, T5Model
from specjax.models.tree import level_call, tree_call
from specjax.testing import TableModel, random_table
from tests.models.test_models import DEC_CFG, T5_CFG, VOCAB

# Tree calls against chain calls (other shapes): at full float32 matmul precision anywhere.
pytestmark = pytest.mark.usefixtures("float32_matmuls")

TREE = StaticTree.from_branching((3, 2))
PREFIX = 5  # committed tokens; the root is the last
CACHE = 24
ATOL = 2e-5


@pytest.fixture(scope="module", params=["t5", "lm", "table"])
def family(request):
  rng = np.random.default_rng(1)
  if request.param == "t5":
    model = T5Model(T5_CFG)
    params = model.init(jax.random.PRNGKey(0))
    encoded = model.encode(params, rng.integers(2, VOCAB, (2, 6)))
    vocab = VOCAB
  elif request.param == "lm":
    model = DecoderOnlyModel(DEC_CFG)
    params, encoded, vocab = model.init(jax.random.PRNGKey(0)), None, VOCAB
  else:
    model, vocab = TableModel(7), 7
    params, encoded = random_table(0, vocab), None
  prefix = rng.integers(1, vocab, (2, PREFIX)).astype(np.int32)
  nodes = rng.integers(1, vocab, (2, TREE.grown)).astype(np.int32)
  cache = model.init_cache(2, CACHE)
  _, cache = model.decode(params, cache, prefix[:, :-1], jnp.zeros(2, jnp.int32), encoded)
  return types.SimpleNamespace(model=model, params=params, encoded=encoded, prefix=prefix,
                               nodes=nodes, cache=cache)


def _path(j):
  out = []
  while j >= 0:
    out.append(j)
    j = TREE.parents[j]
  return out[::-1]


def _chain(f, path, cache=None):
  """Logits [2, len(path) + 1, V] of the chain root, path tokens from slot PREFIX - 1."""
  tokens = np.concatenate([f.prefix[:, -1:], f.nodes[:, path]], axis=1)
  logits, cache = f.model.decode(f.params, f.cache if cache is None else cache, tokens,
                                 jnp.full(2, PREFIX - 1, jnp.int32), f.encoded)
  return np.asarray(logits), cache


def test_tree_call_matches_chains(family):
  f = family
  length = jnp.full(2, PREFIX, jnp.int32)
  parent = jnp.broadcast_to(jnp.asarray(TREE.parents), (2, TREE.grown))
  depth = jnp.broadcast_to(jnp.asarray(TREE.depth), (2, TREE.grown))
  tokens = np.concatenate([f.prefix[:, -1:], f.nodes], axis=1)
  logits, tree_cache = f.model.decode(f.params, f.cache, tokens, length - 1, f.encoded,
                                      tree=tree_call(parent, depth, length))
  logits = np.asarray(logits)
  for j in range(TREE.grown):
    path = _path(j)
    chain, _ = _chain(f, path)
    np.testing.assert_allclose(logits[:, j + 1], chain[:, -1], atol=ATOL)
    np.testing.assert_allclose(logits[:, 0], chain[:, 0], atol=ATOL)
  # Move the path to node 4 (depth 2) into place; the next token then sees the chain cache.
  path = _path(4)
  n = jnp.full(2, len(path), jnp.int32)
  moved = move_path(f.model, tree_cache, length, jnp.asarray([path, path], jnp.int32), n)
  _, chain_cache = _chain(f, path)
  nxt = jnp.asarray([[3], [2]], jnp.int32)
  at = length + len(path)
  want, _ = f.model.decode(f.params, chain_cache, nxt, at, f.encoded)
  got, _ = f.model.decode(f.params, moved, nxt, at, f.encoded)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=ATOL)


def test_level_calls_match_chains(family):
  """The drafter's way: root first, then one call per level with earlier levels cached."""
  f = family
  length = jnp.full(2, PREFIX, jnp.int32)
  parent = jnp.broadcast_to(jnp.asarray(TREE.parents), (2, TREE.grown))
  depth = jnp.broadcast_to(jnp.asarray(TREE.depth), (2, TREE.grown))
  _, cache = f.model.decode(f.params, f.cache, f.prefix[:, -1:], length - 1, f.encoded)
  start = 0
  for level in TREE.levels:
    stop = start + level
    attention = level_call(parent, depth, length, start, stop, CACHE)
    logits, cache = f.model.decode(f.params, cache, f.nodes[:, start:stop], length + start,
                                   f.encoded, tree=attention)
    for i, j in enumerate(range(start, stop)):
      chain, _ = _chain(f, _path(j))
      np.testing.assert_allclose(np.asarray(logits)[:, i], chain[:, -1], atol=ATOL)
    start = stop


def test_bad_tree_argument_is_refused():
  model = DecoderOnlyModel(DEC_CFG)
  params = model.init(jax.random.PRNGKey(0))
  cache = model.init_cache(1, 8)
  bad = tree_call(jnp.asarray([[-1, 0]]), jnp.asarray([[1, 2]]), jnp.asarray([2]))
  with pytest.raises(ValueError, match="tree.token_pos"):
    model.decode(params, cache, jnp.ones((1, 2), jnp.int32), jnp.asarray([1]), tree=bad)
  with pytest.raises(ValueError, match="TreeAttention"):
    model.decode(params, cache, jnp.ones((1, 2), jnp.int32), jnp.asarray([1]), tree="x")
