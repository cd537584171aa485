"""Token-tree shapes: the spine constructor, and trees given in gin."""
import gin
import pytest

from specjax.app import gin_config
from specjax.draft import DynamicTree, StaticTree
from specjax.draft.tree import spine_tail


def test_spines_are_one_deep_guess_plus_shorter_alternatives():
  tree = StaticTree.from_spines((3, 2, 1))
  assert tree.parents == (-1, -1, -1, 0, 1, 3)
  assert tree.ranks == (0, 1, 2, 0, 0, 0)
  assert tree.levels == (3, 2, 1) and tree.nodes == 6 and not tree.greedy_only
  for bad in ((1, 2), (), (2, 0), (2.0,), (True,)):
    with pytest.raises(ValueError, match="non-increasing"):
      StaticTree.from_spines(bad)


def test_dynamic_tree_keep_scores_fewer_nodes_than_it_grows():
  tree = DynamicTree(branch=2, expand=2, max_depth=3, keep=7)
  assert tree.grown == 10 and tree.nodes == 7 and tree.greedy_only
  uncut = DynamicTree(branch=2, expand=2, max_depth=3)
  assert uncut.nodes == 10 and not uncut.greedy_only


def test_trees_given_in_gin_build_the_same_shapes():
  from experiments.bench import trees as bench_trees  # pylint: disable=import-outside-toplevel
  gin.clear_config()
  try:
    gin_config.parse([str(gin_config.GIN_DIR / "experiments" / "trees.gin")], [
        "specjax.draft.DynamicTree.keep = 5"])
    trees = bench_trees.extra_trees()
  finally:
    gin.clear_config()
  assert trees["spines(11,2,1,1)"] == StaticTree.from_spines((11, 2, 1, 1))
  assert trees["paths(eagle-like)"].levels == (3, 3, 1, 1, 1)
  assert trees["dyn(b3,e1,d4)"] == DynamicTree(branch=3, expand=1, max_depth=4, keep=5)


def test_spine_tails_are_drafted_in_a_loop_only_where_levels_hold_one_node():
  assert spine_tail(StaticTree.from_spines((4, 1))) == (3, 0)  # levels (2, 1, 1, 1)
  assert spine_tail(StaticTree.from_spines((6,))) == (2, -1)  # a chain: all but the first level
  assert spine_tail(StaticTree.from_spines((3, 1)))[0] == 4  # one such level: unrolled
  assert spine_tail(StaticTree.from_branching((2, 1, 1)))[0] == 4  # levels (2, 2, 2)
  assert spine_tail(DynamicTree(branch=1, expand=1, max_depth=5))[0] == 6
