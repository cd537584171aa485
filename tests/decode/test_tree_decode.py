"""`specjax.decode.tree_decode`: greedy equals autoregressive token for token (table models
and both bundled pairs); sampled tree decoding follows the target's exact joint law."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.app import bundled
from specjax.data import load_bundled, load_vocab
from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode, tree_decode
from specjax.draft import (BigramDrafter, DynamicTree, ModelDrafter, NGramTreeDrafter,
                           PromptLookupTreeDrafter, StaticTree, TreeModelDrafter, TreeProposal)
from specjax.draft.tree import keep_most_probable
from specjax.app import encode_inputs
from specjax.sampling import Sampling
from specjax.testing import TableModel, exact_joint, joint_tv, random_table

V = 4
NO_EOS = -1
GREEDY = Sampling(temperature=0.0)
TREES = {
    "static_3_2": StaticTree.from_branching((3, 2)),
    "paths": StaticTree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]),
    "dynamic": DynamicTree(branch=2, expand=2, max_depth=3),
    "dynamic_keep": DynamicTree(branch=2, expand=2, max_depth=3, keep=5),
    "iid": StaticTree.from_branching((2, 2), iid=True),
    "spines": StaticTree.from_spines((4, 1)),  # depths 3 and 4 drafted in a loop
}


@pytest.fixture(scope="module")
def tables():
  return random_table(1, V), random_table(2, V, sharpness=1.0)


@pytest.mark.parametrize("name", sorted(TREES))
@pytest.mark.parametrize("encoder_decoder", [False, True], ids=["decoder_only", "t5_like"])
def test_greedy_tree_equals_autoregressive_on_tables(tables, name, encoder_decoder):
  target_table, draft_table = tables
  model = TableModel(V, encoder_decoder=encoder_decoder)
  prompts = np.array([[2, 3, 1], [1, 0, 0], [3, 3, 2], [2, 0, 0]], np.int32)
  lengths = None if encoder_decoder else np.array([3, 1, 3, 1])
  config = DecodeConfig(sampling=GREEDY, eos_id=0 if encoder_decoder else 1)
  want = autoregressive_decode(model, target_table, prompts, max_new_tokens=20,
                               rng=jax.random.PRNGKey(0), config=config, prompt_lengths=lengths)
  got = tree_decode(model, target_table, TableModel(V), draft_table, prompts,
                    max_new_tokens=20, rng=jax.random.PRNGKey(0), config=config,
                    tree=TREES[name], prompt_lengths=lengths)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
  np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(want.lengths))
  assert np.all(np.asarray(got.target_calls) <= np.asarray(want.target_calls))


def test_greedy_draft_equal_to_target_accepts_whole_paths(tables):
  target_table, _ = tables
  tree = StaticTree.from_branching((2, 1, 1))
  config = DecodeConfig(sampling=GREEDY, eos_id=NO_EOS)
  got = tree_decode(TableModel(V), target_table, TableModel(V), target_table,
                    np.array([[2, 3]], np.int32), max_new_tokens=12, rng=jax.random.PRNGKey(0),
                    config=config, tree=tree)
  assert int(got.target_calls[0]) == 3  # 4 tokens per call: 3 accepted + 1
  assert int(got.draft_calls[0]) == 9


# Power: 3 tokens over V = 4 give 64 outcomes; with N = 100,000 rows a correct sampler's
# TV is about 0.007 (≤ 0.010 for a uniform law); the bound is 0.018. The draft's own law
# is > 0.05 away (asserted), and a verifier without the residual update is 0.44 away at
# the step (tests/verify/test_tree.py).
N = 100_000
STEPS = 3
SAMPLED = {"static": StaticTree.from_branching((2, 2)),
           "dynamic": DynamicTree(branch=2, expand=1, max_depth=2),
           "iid": StaticTree.from_branching((2, 1), iid=True),
           "spines_iid": StaticTree.from_spines((4, 1), iid=True)}


def _joint_tv(tokens, law):
  return joint_tv(tokens, law, STEPS)


@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_sampled_tree_joint_of_first_three_tokens_matches_target(tables, name):
  target_table, draft_table = tables
  sampling = Sampling()
  prompt = np.array([[2, 3]] * N, np.int32)
  config = DecodeConfig(sampling=sampling, eos_id=NO_EOS, cache_len=12)
  result = tree_decode(TableModel(V), target_table, TableModel(V), draft_table, prompt,
                       max_new_tokens=STEPS, rng=jax.random.PRNGKey(0), config=config,
                       tree=SAMPLED[name])
  law = exact_joint(np.asarray(target_table), sampling, [2, 3], STEPS)
  assert _joint_tv(result.tokens, law) < 0.018
  assert _joint_tv(result.tokens, exact_joint(np.asarray(draft_table), sampling, [2, 3],
                                              STEPS)) > 0.05


LOOKUP_PROMPTS = np.array([[2, 3, 1, 2, 3, 0, 2, 3], [1, 2, 1, 3, 1, 2, 0, 0],
                           [3, 3, 2, 3, 3, 1, 3, 0], [2, 1, 0, 0, 0, 0, 0, 0]], np.int32)


@pytest.mark.parametrize("sampling", [GREEDY, Sampling()], ids=["greedy", "sampled"])
def test_prompt_lookup_tree_is_exact_on_tables(tables, sampling):
  # Greedy: the argmax path token for token (3 continuations of 3 tokens; lookup must bring
  # more than one token per call, asserted). Sampled: the exact joint of 3 tokens over N rows
  # (power as above; the deterministic rule's step test is in tests/verify/test_tree.py).
  target_table, _ = tables
  drafter, key = PromptLookupTreeDrafter(V, branches=3, depth=3), jax.random.PRNGKey(0)
  if sampling.greedy:
    config, lengths = DecodeConfig(sampling=GREEDY, eos_id=NO_EOS), np.array([8, 6, 7, 2])
    want = autoregressive_decode(TableModel(V), target_table, LOOKUP_PROMPTS, max_new_tokens=24,
                                 rng=key, config=config, prompt_lengths=lengths)
    got = tree_decode(TableModel(V), target_table, drafter, None, LOOKUP_PROMPTS,
                      max_new_tokens=24, rng=key, config=config, prompt_lengths=lengths)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    assert float(np.mean(got.tokens_per_call)) > 2 and int(np.sum(got.draft_calls)) == 0
    return
  prefix = [2, 3, 1, 2, 3, 2]
  got = tree_decode(TableModel(V), target_table, drafter, None, np.array([prefix] * N, np.int32),
                    max_new_tokens=STEPS, rng=key, config=DecodeConfig(sampling=sampling,
                                                                      eos_id=NO_EOS))
  assert _joint_tv(got.tokens, exact_joint(np.asarray(target_table), sampling, prefix,
                                           STEPS)) < 0.018
  assert np.asarray(got.accepted_hist)[:, 1:].sum() > N // 10  # guesses were accepted


@pytest.fixture(scope="module")
def bigram(tables):
  """A bigram table counted on 256 tokens the target itself sampled: (drafter, params)."""
  target_table, _ = tables
  text = autoregressive_decode(TableModel(V), target_table, LOOKUP_PROMPTS, max_new_tokens=64,
                               rng=jax.random.PRNGKey(1), prompt_lengths=np.array([8, 6, 7, 2]),
                               config=DecodeConfig(sampling=Sampling(), eos_id=NO_EOS)).tokens
  return BigramDrafter(np.asarray(text).tolist(), V, max_gamma=1, k=0.5)


NGRAM_TREES = {"branching_2_1_1": StaticTree.from_branching((2, 1, 1)),
               "dynamic_keep": DynamicTree(branch=2, expand=2, max_depth=3, keep=5)}


@pytest.mark.parametrize("name", sorted(NGRAM_TREES))
def test_greedy_ngram_tree_equals_autoregressive(tables, bigram, name):
  # The table's most frequent followers as the tree, token for token the argmax path; the
  # table must bring more than one token per call (asserted) with no draft model call.
  target_table, _ = tables
  config, lengths = DecodeConfig(sampling=GREEDY, eos_id=NO_EOS), np.array([8, 6, 7, 2])
  key = jax.random.PRNGKey(0)
  want = autoregressive_decode(TableModel(V), target_table, LOOKUP_PROMPTS, max_new_tokens=24,
                               rng=key, config=config, prompt_lengths=lengths)
  got = tree_decode(TableModel(V), target_table, bigram[0], bigram[1], LOOKUP_PROMPTS,
                    max_new_tokens=24, rng=key, config=config, prompt_lengths=lengths,
                    tree=NGRAM_TREES[name])
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
  assert float(np.mean(got.tokens_per_call)) > 1.2 and int(np.sum(got.draft_calls)) == 0


@pytest.mark.parametrize("drafter", ["model", "bigram"])
def test_unrolled_spine_tail_draws_the_loops_trees(tables, bigram, drafter):
  # The spines tree's depths 3-4 drafted as straight-line code (`unroll=True`) instead of a
  # loop: sampled, keys per row and position, so the same trees are drawn and the same nodes
  # accepted, row for row; rounds accept into the tail (asserted), so a tail level fed the
  # wrong node, position or parent would show.
  target_table, draft_table = tables
  tree = TREES["spines"]
  if drafter == "model":
    looped, params = TreeModelDrafter(TableModel(V), tree), draft_table
    unrolled = dataclasses.replace(looped, unroll=True)
  else:
    looped, params = bigram[0].as_tree(tree), bigram[1]
    unrolled = dataclasses.replace(bigram[0], unroll=True).as_tree(tree)
  config = DecodeConfig(sampling=Sampling(), eos_id=NO_EOS, cache_len=24)
  results = [tree_decode(TableModel(V), target_table, d, params, np.array([[2, 3]] * 2000),
                         max_new_tokens=8, rng=jax.random.PRNGKey(3), config=config)
             for d in (looped, unrolled)]
  for field in ("tokens", "target_calls", "accepted_hist"):
    np.testing.assert_array_equal(getattr(results[1], field), getattr(results[0], field))
  assert np.asarray(results[0].accepted_hist)[:, 3:].sum() > 100


def test_sampled_ngram_tree_joint_of_first_three_tokens_matches_target(tables, bigram):
  # Power as for the model trees above (N rows, 64 outcomes, bound 0.018); the table's q is
  # not the target's law, so a drafter that handed the verifier the wrong q rows (or none)
  # would bias the joint. Both acceptances and rejections happen (asserted).
  target_table, _ = tables
  sampling, prefix = Sampling(), [2, 3, 1, 2]
  drafter = NGramTreeDrafter(bigram[0], StaticTree.from_branching((2, 2)))
  got = tree_decode(TableModel(V), target_table, drafter, bigram[1],
                    np.array([prefix] * N, np.int32), max_new_tokens=STEPS,
                    rng=jax.random.PRNGKey(2), config=DecodeConfig(sampling=sampling,
                                                                   eos_id=NO_EOS))
  assert _joint_tv(got.tokens, exact_joint(np.asarray(target_table), sampling, prefix,
                                           STEPS)) < 0.018
  hist = np.asarray(got.accepted_hist).sum(0)
  assert hist[0] > N // 20 and hist[1:].sum() > N // 10, hist
  with pytest.raises(ValueError, match="NGramDrafter"):
    NGramTreeDrafter(TableModel(V), StaticTree.from_branching((2,)))


def test_bad_arguments_are_refused(tables):
  target_table, draft_table = tables
  with pytest.raises(ValueError, match="TreeModelDrafter"):
    tree_decode(TableModel(V), target_table, TableModel(V), draft_table, np.ones((1, 2)),
                max_new_tokens=4, rng=jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="the tree rule"):
    tree_decode(TableModel(V), target_table, TableModel(V), draft_table, np.ones((1, 2)),
                max_new_tokens=4, rng=jax.random.PRNGKey(0), tree=TREES["iid"],
                config=DecodeConfig(gamma_policy="heuristic"))
  with pytest.raises(ValueError, match="ranks"):
    StaticTree(parents=(-1, -1), ranks=(1, 0))
  with pytest.raises(ValueError, match="temperature 0 only"):
    tree_decode(TableModel(V), target_table, TableModel(V), draft_table, np.ones((1, 2)),
                max_new_tokens=4, rng=jax.random.PRNGKey(0), tree=TREES["dynamic_keep"],
                config=DecodeConfig(sampling=Sampling()))
  with pytest.raises(ValueError, match="keep=11 exceeds the 10 nodes"):
    DynamicTree(branch=2, expand=2, max_depth=3, keep=11)


def test_greedy_lenient_spine_equals_the_lenient_chain(tables):
  # A.5's argmax lenience (NOT exact): a one-spine tree proposes the chain's greedy guesses,
  # so both accept the same tokens; lenience 0.3 must change the output (asserted).
  target_table, draft_table = tables
  prompts = np.array([[2, 3, 1], [1, 2, 0]], np.int32)
  lengths, key = np.array([3, 2]), jax.random.PRNGKey(0)
  out = {}
  for lenience in (1.0, 0.3):
    config = DecodeConfig(sampling=GREEDY, eos_id=NO_EOS, lenience=lenience)
    chain = speculative_decode(TableModel(V), target_table, ModelDrafter(TableModel(V), 3),
                               draft_table, prompts,
                               max_new_tokens=16, gamma=3, rng=key, config=config,
                               prompt_lengths=lengths)
    tree = tree_decode(TableModel(V), target_table, TableModel(V), draft_table, prompts,
                       max_new_tokens=16, rng=key, config=config, prompt_lengths=lengths,
                       tree=StaticTree.from_spines((3,)))
    np.testing.assert_array_equal(np.asarray(tree.tokens), np.asarray(chain.tokens))
    out[lenience] = np.asarray(tree.tokens)
  assert (out[1.0] != out[0.3]).any()


@pytest.mark.parametrize("sampling", [GREEDY, Sampling()], ids=["greedy", "sampled"])
def test_streamed_tree_decode_equals_the_padded_batch(tables, sampling):
  # Randomness is tied to (example key, position): 5 prompts through 2 slots (refilled as rows
  # finish at EOS or budget) give each example the tokens of the one padded batch.
  target_table, draft_table = tables
  prompts = np.array([[2, 3, 1], [1, 0, 0], [3, 3, 2], [2, 0, 0], [3, 1, 0]], np.int32)
  lengths, key = np.array([3, 1, 3, 1, 2]), jax.random.PRNGKey(3)
  config = DecodeConfig(sampling=sampling, eos_id=1)
  run = lambda **kw: tree_decode(TableModel(V), target_table, TableModel(V), draft_table, prompts,
                                 max_new_tokens=12, rng=key, config=config, prompt_lengths=lengths,
                                 tree=TREES["dynamic"], **kw)
  batch, done = run(), []
  streamed = run(slots=2, on_progress=lambda d, t: done.append(d))
  np.testing.assert_array_equal(np.asarray(streamed.tokens), np.asarray(batch.tokens))
  np.testing.assert_array_equal(np.asarray(streamed.lengths), np.asarray(batch.lengths))
  np.testing.assert_array_equal(np.asarray(streamed.target_calls), np.asarray(batch.target_calls))
  assert done[-1] == 5 and len(set(np.asarray(batch.lengths).tolist())) > 1


def test_keep_most_probable_keeps_parents_and_level_order():
  # Grown tree: root children 0, 1; node 2 under 0, node 3 under 1, node 4 under 2.
  parent = np.array([[-1, -1, 0, 1, 2]] * 2, np.int32)
  logq = np.array([[-0.1, -2.0, -0.1, -2.5, -0.3],   # ties between 0 and 2 (q = 1 at 2)
                   [-1.0, -0.2, -3.0, -0.4, -3.0]], np.float32)
  proposal = TreeProposal(tokens=jnp.arange(10).reshape(2, 5), parent=jnp.asarray(parent),
                          depth=jnp.asarray([[1, 1, 2, 2, 3]] * 2), valid=jnp.ones((2, 5), bool),
                          probs=jnp.arange(12.0).reshape(2, 6, 1), calls=jnp.ones(2, jnp.int32))
  cut, source = keep_most_probable(proposal, jnp.asarray(logq), 3)
  np.testing.assert_array_equal(np.asarray(source), [[0, 2, 4], [0, 1, 3]])
  np.testing.assert_array_equal(np.asarray(cut.parent), [[-1, 0, 1], [-1, -1, 1]])
  np.testing.assert_array_equal(np.asarray(cut.depth), [[1, 2, 3], [1, 1, 2]])
  np.testing.assert_array_equal(np.asarray(cut.tokens), [[0, 2, 4], [5, 6, 8]])
  np.testing.assert_array_equal(np.asarray(cut.probs)[:, :, 0], [[0, 1, 3, 5], [6, 7, 8, 10]])


@pytest.fixture(scope="module")
def pairs():
  return {name: bundled.load_pair(name) for name in bundled.PAIRS}


@pytest.mark.parametrize("name,tree,per_call", [
    ("lm", StaticTree.from_branching((3, 2, 1)), 1.3),
    ("translate", DynamicTree(branch=3, expand=2, max_depth=3, keep=10), 1.3),
    ("lm", "lookup", 1.05)], ids=["lm_static", "translate_dynamic", "lm_prompt_lookup"])
def test_greedy_tree_equals_autoregressive_on_bundled_pairs(pairs, name, tree, per_call):
  pair, vocab = pairs[name], load_vocab()
  data = load_bundled(pair.task)[:4]
  texts = [" ".join(d.split()[:8]) for d in data] if name == "lm" else [s for s, _ in data]
  inputs = encode_inputs(vocab, texts, pair.target.is_encoder_decoder, 32)
  config = DecodeConfig(sampling=GREEDY, eos_id=vocab.eos_id)
  key = jax.random.PRNGKey(0)
  want = autoregressive_decode(pair.target, pair.target_params, inputs, max_new_tokens=16,
                               rng=key, config=config)
  drafter, params = ((PromptLookupTreeDrafter(pair.target.vocab_size, 3, 4), None)
                     if tree == "lookup" else (TreeModelDrafter(pair.draft, tree),
                                               pair.draft_params))
  got = tree_decode(pair.target, pair.target_params, drafter, params, inputs,
                    max_new_tokens=16, rng=key, config=config)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
  np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(want.lengths))
  assert np.asarray(got.lengths).sum() / np.asarray(got.target_calls).sum() > per_call
