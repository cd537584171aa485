"""The one validation of tree settings (`specjax.decode.check_tree`), through the public API."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode import DecodeConfig, TreeLoop, check_tree, inputs, tree_decode
from specjax.draft import DynamicTree, StaticTree
from specjax.draft.tree import _static_ancestors
from specjax.models.tree import ancestors
from specjax.sampling import Sampling
from specjax.testing import TableModel, random_table
from specjax.verify import BlockVerifier
from specjax.verify.tree import greedy_walk

V = 6


def _decode(tree, **kw):
  table = random_table(0, V)
  return tree_decode(TableModel(V), table, TableModel(V), table, np.ones((1, 2), np.int32),
                     max_new_tokens=4, rng=jax.random.PRNGKey(0), tree=tree, **kw)


def test_a_tree_wider_than_the_vocabulary_is_one_clear_error():
  with pytest.raises(ValueError, match="gives a node 7 children, more than the vocabulary's 6"):
    _decode(StaticTree.from_branching((7,)))
  with pytest.raises(ValueError, match="gives a node 9 children"):
    _decode(DynamicTree(branch=9, expand=1, max_depth=2))
  assert _decode(StaticTree.from_branching((V,))).tokens.shape == (1, 4)  # V children: fine


def test_a_tree_too_big_for_the_device_is_refused_before_compiling(monkeypatch):
  monkeypatch.setattr(inputs, "device_memory", lambda partitioner=None: 2**20)
  def fail(*args, **kwargs):
    raise AssertionError("the tree loop was traced: its arrays would have been allocated")
  monkeypatch.setattr(TreeLoop, "start", fail)
  huge = DynamicTree(branch=5, expand=1, max_depth=400)  # within MAX_TREE_NODES
  assert huge.grown == 2000
  with pytest.raises(ValueError, match=r"a tree of 2000 nodes needs about [\d.]+ GiB per round "
                                       r".* above the limit of 0\.00 GiB"):
    _decode(huge, config=DecodeConfig(sampling=Sampling(temperature=0.0)))


def test_the_rules_need_no_model():
  tree, greedy = StaticTree.from_spines((3, 1)), Sampling(temperature=0.0)
  check_tree(tree, DecodeConfig(sampling=greedy))  # fine
  for bad, config, message in (
      (3, DecodeConfig(), "TREE must be a StaticTree or DynamicTree"),
      (tree, DecodeConfig(gamma_policy="heuristic"),
       "TREE takes GAMMA_POLICY 'constant' or 'auto'"),
      (tree, DecodeConfig(verifier=BlockVerifier()), "TREE verifies with the tree rule"),
      (tree, DecodeConfig(gamma_policy="auto", auto_buckets=(2,)), "auto_buckets"),
      (DynamicTree(2, 2, 3, keep=5), DecodeConfig(), "exact at temperature 0 only")):
    with pytest.raises(ValueError, match=message):
      check_tree(bad, config)


def test_tree_ancestors_match_the_static_table():
  # Static trees, random level-order trees and chains (a chain of N nodes needs every one
  # of the ceil(log2 N) doubling steps: one step fewer leaves its deepest pairs out).
  rng = np.random.default_rng(0)
  random = [[-1 if i == 0 else int(rng.integers(-1, i)) for i in range(n)]
            for n in (3, 17, 44) for _ in range(5)]
  chains = [list(range(-1, n - 1)) for n in (1, 2, 5, 16, 33)]
  for parents in [StaticTree.from_spines((5, 3, 2, 1)).parents,
                  StaticTree.from_branching((3, 2, 2)).parents, *random, *chains]:
    got = ancestors(jnp.asarray(parents, jnp.int32))
    np.testing.assert_array_equal(np.asarray(got), _static_ancestors(parents))


def test_tree_ancestors_and_the_greedy_walk_run_no_loop():
  # XLA:GPU copies a while loop's predicate to the host on every iteration: the per-round
  # tree computations that grow with the node count must not loop over the nodes.
  parent = jnp.asarray([-1, -1, 0, 0, 2, 4], jnp.int32)
  assert "while" not in jax.jit(ancestors).lower(parent).as_text()
  walk = jax.jit(lambda t, p, d, v, probs: greedy_walk(t, p, d, v, probs, max_depth=4))
  text = walk.lower(parent, parent, jnp.asarray([1, 1, 2, 2, 3, 4], jnp.int32),
                    jnp.ones(6, jnp.bool_), jnp.ones((7, 5))).as_text()
  assert "while" not in text


def test_a_chain_drafter_with_a_tree_shape_becomes_its_tree_drafter():
  from specjax.decode.tree import _tree_drafter  # pylint: disable=import-outside-toplevel
  from specjax.draft import (FeatureDrafter, FeatureTreeDrafter, ModelDrafter,  # pylint: disable=import-outside-toplevel
                             NGramTreeDrafter, PromptLookupDrafter, TreeModelDrafter,
                             UnigramDrafter)
  from specjax.models import FeatureHead, FeatureHeadConfig  # pylint: disable=import-outside-toplevel
  from specjax.testing import tiny_pair  # pylint: disable=import-outside-toplevel
  tree = StaticTree.from_spines((2, 1))
  pair = tiny_pair("lm")
  assert _tree_drafter(ModelDrafter(pair.draft, max_gamma=2, catch_up=4), tree) == (
      TreeModelDrafter(pair.draft, tree, catch_up=4))
  assert _tree_drafter(pair.draft, tree) == TreeModelDrafter(pair.draft, tree)
  head = FeatureHead(FeatureHeadConfig(vocab_size=pair.target.vocab_size,
                                       emb_dim=pair.target.feature_dim, num_heads=2, head_dim=8,
                                       mlp_dim=16))
  assert _tree_drafter(FeatureDrafter(pair.target, head, max_gamma=2, vocab_limit=5), tree) == (
      FeatureTreeDrafter(pair.target, head, tree, 5))
  unigram, _ = UnigramDrafter([np.arange(4)], 4, max_gamma=2)
  assert _tree_drafter(unigram, tree) == NGramTreeDrafter(unigram, tree)
  # One that cannot says so in one line, before anything compiles.
  with pytest.raises(ValueError, match=r"^PromptLookupDrafter cannot draft a given tree: "):
    tree_decode(TableModel(4), random_table(1, 4), PromptLookupDrafter(4, max_gamma=2), None,
                np.array([[2, 3]], np.int32), max_new_tokens=2, rng=jax.random.PRNGKey(0),
                tree=tree)
  with pytest.raises(ValueError, match=r"^tree must be a StaticTree or DynamicTree, got 3$"):
    tree_decode(TableModel(4), random_table(1, 4), unigram, None, np.array([[2, 3]], np.int32),
                max_new_tokens=2, rng=jax.random.PRNGKey(0), tree=3)
