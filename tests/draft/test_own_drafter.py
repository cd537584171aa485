"""A drafter of one's own, in this file alone: one class (chain and tree) and its registration.

`LastTokenDrafter` guesses from a table q(next | last token) given as its params (logits
[V, V]). As a chain drafter (`tree` None) it hands `guess_chain` one step function; as a tree
drafter it hands `grow_tree` a level and a spine function. Nothing else of specjax changes:
the loops verify it exactly like the shipped drafters. docs/drafters_verifiers.md walks
through this class.
"""
import dataclasses
from typing import Any, ClassVar, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode, tree_decode
from specjax.draft import DRAFTERS, DrafterDefaults, Proposal, StaticTree, get_drafter
from specjax.draft import register_drafter
from specjax.draft.base import guess_chain
from specjax.draft.tree import grow_tree
from specjax.rows import take_rows
from specjax.sampling import Sampling
from specjax.testing import TableModel, exact_joint, joint_tv, random_table


@dataclasses.dataclass(frozen=True)
class LastTokenDrafter(DrafterDefaults):
  """Guesses from q(next | last token) = softmax(params[last token]), params float32 [V, V]."""

  vocab: int
  max_depth: int = 3  # a chain's γ bound (a tree's depth is its own)
  tree: Any = None  # None: a chain drafter; a StaticTree or DynamicTree: a tree drafter

  deterministic: ClassVar[bool] = False  # q is a real distribution
  models: ClassVar[Tuple] = ()  # no draft model cache to keep

  @property
  def vocab_size(self) -> int:
    return self.vocab

  @property
  def max_gamma(self) -> int:
    return self.max_depth if self.tree is None else self.tree.max_depth

  @property
  def lookahead(self) -> int:  # target cache slots a round writes past the committed tokens
    return self.max_depth if self.tree is None else self.tree.nodes

  def init(self, params, inputs, seq, length, cache_len):
    return ()  # nothing to carry between rounds

  def update(self, state, accepted):
    return state

  def propose(self, params, state, seq, length, gamma, row_keys, sampling):
    last = take_rows(seq, (length - 1)[:, None])[:, 0]  # [B]: each row's last token
    if self.tree is None:
      step = lambda carry, prev, i: (params[prev[:, 0]], carry)  # logits [B, V]
      tokens, probs, _ = guess_chain(params[last], step, (), row_keys, length, gamma,
                                     self.max_gamma, sampling)
      return Proposal(tokens=tokens, probs=probs, calls=jnp.zeros_like(length)), state
    level = lambda carry, tokens, parent, depth, lo, hi: (params[tokens[:, lo:hi]], carry)
    spine = lambda carry, tokens, parent, depth, anc, above: (
        params[jax.lax.dynamic_index_in_dim(tokens, above, axis=1, keepdims=False)], carry)
    proposal, _, _ = grow_tree(self.tree, params[last], level, spine, (), row_keys, length,
                               sampling)
    return proposal.replace(calls=jnp.zeros_like(proposal.calls)), state


@pytest.fixture
def registered():
  """`register_drafter("last_token", LastTokenDrafter)`, as a user's module would run it at
  import; taken back after the test, so the registry other tests see holds the shipped
  drafters only."""
  register_drafter("last_token", LastTokenDrafter)
  yield
  del DRAFTERS["last_token"]


V = 4
NO_EOS = -1
TREE = StaticTree.from_spines((3, 1))  # a 3-deep spine and one branch: levels and a spine loop


@pytest.fixture(scope="module")
def tables():
  """(the target's trigram table, the drafter's bigram logits [V, V])."""
  return random_table(1, V), jnp.asarray(np.random.default_rng(5).normal(size=(V, V)) * 1.5,
                                         jnp.float32)


def test_registered_by_name_with_its_fields(registered):
  assert DRAFTERS["last_token"] is LastTokenDrafter
  drafter = get_drafter("last_token", {"vocab": V, "max_gamma": 9}, max_depth=2)
  assert drafter == LastTokenDrafter(vocab=V, max_depth=2)
  register_drafter("last_token", LastTokenDrafter)  # again: the same class, accepted
  with pytest.raises(ValueError, match="taken by LastTokenDrafter"):
    register_drafter("last_token", type("Other", (LastTokenDrafter,), {}))
  with pytest.raises(ValueError, match="not a dataclass"):
    register_drafter("not_one", object)


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_greedy_equals_autoregressive(tables, tree):
  target_table, draft_logits = tables
  prompts = np.array([[2, 3, 1], [1, 0, 0], [3, 3, 2], [2, 0, 0]], np.int32)
  lengths = np.array([3, 1, 3, 1])
  config = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=1)
  kwargs = dict(max_new_tokens=16, rng=jax.random.PRNGKey(0), config=config,
                prompt_lengths=lengths)
  want = autoregressive_decode(TableModel(V), target_table, prompts, **kwargs)
  drafter = LastTokenDrafter(V, tree=tree)
  if tree is None:
    got = speculative_decode(TableModel(V), target_table, drafter, draft_logits, prompts,
                             gamma=3, **kwargs)
  else:
    got = tree_decode(TableModel(V), target_table, drafter, draft_logits, prompts, **kwargs)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
  np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(want.lengths))
  assert np.asarray(got.accepted_hist)[:, 1:].sum() > 0, "no guess was ever accepted"


# Power: 3 tokens over V = 4 give 64 outcomes; with N = 100,000 rows a correct sampler's TV is
# about 0.007 (at most 0.010 for a uniform law), the bound 0.018; the drafter's own law is
# more than 0.05 away (asserted), so a loop that emitted the guesses unverified, or verified
# them against the wrong q, fails.
N = 100_000
STEPS = 3


def _joint_tv(tokens, law):
  return joint_tv(tokens, law, STEPS)


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_sampled_joint_of_three_tokens_is_the_targets(tables, tree):
  target_table, draft_logits = tables
  prompt = np.array([[2, 3]] * N, np.int32)
  config = DecodeConfig(sampling=Sampling(), eos_id=NO_EOS, cache_len=12)
  drafter = LastTokenDrafter(V, tree=tree)
  kwargs = dict(max_new_tokens=STEPS, rng=jax.random.PRNGKey(0), config=config)
  if tree is None:
    result = speculative_decode(TableModel(V), target_table, drafter, draft_logits, prompt,
                                gamma=3, **kwargs)
  else:
    result = tree_decode(TableModel(V), target_table, drafter, draft_logits, prompt, **kwargs)
  law = exact_joint(np.asarray(target_table), Sampling(), [2, 3], STEPS)
  assert _joint_tv(result.tokens, law) < 0.018
  # The drafter's own law (q(next | last) alone) is far from the target's.
  own = jnp.broadcast_to(jax.nn.log_softmax(draft_logits, -1)[None], (V, V, V))
  assert _joint_tv(result.tokens, exact_joint(np.asarray(own), Sampling(), [2, 3], STEPS)) > 0.05
