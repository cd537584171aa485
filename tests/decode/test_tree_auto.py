"""The 'auto' policy over a token tree: each round the narrow round (a plain target step) or
the tree, priced by a cost table; greedy output is the target's argmax path whatever the
decisions, sampled output keeps the target's exact joint law, and a tree that never pays
runs the autoregressive loop."""

import jax
import numpy as np
import pytest

from specjax.decode import DecodeConfig, autoregressive_decode, tree_decode
from specjax.decode.auto import CostTable
from specjax.draft import StaticTree, TreeModelDrafter
from specjax.sampling import Sampling
from specjax.testing import TableModel, exact_joint, joint_tv, random_table

V = 4
GREEDY = Sampling(temperature=0.0)
TREE = StaticTree.from_branching((2, 2))
DEPTH = TREE.max_depth
PROMPTS = np.array([[2, 3, 1], [1, 0, 0], [3, 3, 2], [2, 0, 0]], np.int32)
LENGTHS = np.array([3, 1, 3, 1])


@pytest.fixture(scope="module")
def tables():
  return random_table(1, V), random_table(2, V, sharpness=1.0)


def _table(batch: int, seconds, cache_len: int = 128) -> CostTable:
  """A cost table for TREE on the table models: narrow and tree round costs, prior α 0.6."""
  drafter = repr(TreeModelDrafter(TableModel(V), TREE))  # as the loop names its drafter
  return CostTable(batch=batch, cache_len=cache_len, max_gamma=DEPTH, buckets=(DEPTH,),
                   seconds=seconds, alpha=0.6,
                   models=f"target TableModel(vocab={V}, encoder_decoder=False); "
                          f"drafter {drafter}")


def _decode(tables, config, **kw):
  target_table, draft_table = tables
  return tree_decode(TableModel(V), target_table, TableModel(V), draft_table,
                     kw.pop("prompts", PROMPTS), max_new_tokens=kw.pop("max_new_tokens", 20),
                     rng=jax.random.PRNGKey(0), config=config, tree=TREE, **kw)


@pytest.fixture(scope="module")
def autoregressive(tables):
  return autoregressive_decode(TableModel(V), tables[0], PROMPTS, max_new_tokens=20,
                               rng=jax.random.PRNGKey(0),
                               config=DecodeConfig(sampling=GREEDY, eos_id=1),
                               prompt_lengths=LENGTHS)


AUTO = DecodeConfig(sampling=GREEDY, eos_id=1, gamma_policy="auto", trace=True)


@pytest.mark.parametrize("slots", [None, 2], ids=["batch", "streamed"])
def test_greedy_auto_tree_mixes_rounds_and_equals_autoregressive(tables, autoregressive, slots):
  # Tree rounds at 1.5 narrow rounds each: rows that meet rejections go narrow, probes bring
  # the tree back; both kinds must occur (asserted) and the tokens stay the argmax path.
  got = _decode(tables, AUTO, prompt_lengths=LENGTHS, slots=slots,
                costs=_table(PROMPTS.shape[0] if slots is None else slots, (1.0, 1.5)))
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(autoregressive.tokens))
  np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(autoregressive.lengths))
  hist = np.asarray(got.gamma_hist)
  assert hist.shape == (4, DEPTH + 1) and hist[:, 0].sum() > 0 and hist[:, DEPTH].sum() > 0
  assert hist[:, 1:DEPTH].sum() == 0
  np.testing.assert_array_equal(hist.sum(1), np.asarray(got.target_calls))
  assert np.all(np.asarray(got.draft_calls) == DEPTH * hist[:, DEPTH])
  assert got.cost_table.seconds == (1.0, 1.5)
  # The Figure-1 trace replays every row: each round's accepted guesses, then its correction;
  # a shown rejected child (accepted < shown) is never the target's argmax at T = 0.
  trace = jax.tree.map(np.asarray, got.trace)
  for row in range(PROMPTS.shape[0]):
    replay = []
    for r in range(int(got.target_calls[row])):
      n, shown = trace.accepted[row, r], trace.gamma[row, r]
      replay += list(trace.guesses[row, r, :n]) + [trace.correction[row, r]]
      if n < shown:
        assert trace.guesses[row, r, n] != trace.correction[row, r]
    length = int(got.lengths[row])
    assert replay[:length] == list(np.asarray(got.tokens)[row, :length])
  assert (trace.gamma > trace.accepted).any() and (trace.gamma == 0).any()


def test_auto_tree_calibrates_once_and_falls_back_when_the_tree_never_pays(tables,
                                                                          autoregressive):
  got = _decode(tables, AUTO, prompt_lengths=LENGTHS)
  table = got.cost_table
  assert table.buckets == (DEPTH,) and table.max_gamma == DEPTH and table.batch == 4
  assert table.alpha is not None and 0.0 <= table.alpha <= 1.0
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(autoregressive.tokens))
  assert _decode(tables, AUTO, prompt_lengths=LENGTHS).cost_table is table  # kept, reused
  # A tree round at 5 narrow rounds never pays at α 0.6: the autoregressive loop runs.
  never = _decode(tables, AUTO, prompt_lengths=LENGTHS, costs=_table(4, (1.0, 5.0)))
  np.testing.assert_array_equal(np.asarray(never.tokens), np.asarray(autoregressive.tokens))
  assert int(np.asarray(never.draft_calls).sum()) == 0
  np.testing.assert_array_equal(np.asarray(never.gamma_hist)[:, 0],
                                np.asarray(autoregressive.target_calls))


# Power: 3 tokens over V = 4 give 64 outcomes; with N = 100,000 rows a correct sampler's TV is
# about 0.007; the bound is 0.018, and the draft's own law is > 0.05 away (asserted). The first
# round is a tree for every row, later rounds narrow for the rows still going (asserted).
N = 100_000
STEPS = 3


def _joint_tv(tokens, law):
  return joint_tv(tokens, law, STEPS)


def test_sampled_auto_tree_joint_of_first_three_tokens_matches_target(tables):
  sampling = Sampling()
  config = DecodeConfig(sampling=sampling, eos_id=-1, gamma_policy="auto", cache_len=128)
  got = _decode(tables, config, prompts=np.array([[2, 3]] * N, np.int32), max_new_tokens=STEPS,
                costs=_table(N, (1.0, 1.2)))
  hist = np.asarray(got.gamma_hist)
  assert hist[:, DEPTH].sum() == N and hist[:, 0].sum() > N // 4
  target_table, draft_table = tables
  assert _joint_tv(got.tokens, exact_joint(np.asarray(target_table), sampling, [2, 3],
                                           STEPS)) < 0.018
  assert _joint_tv(got.tokens, exact_joint(np.asarray(draft_table), sampling, [2, 3],
                                           STEPS)) > 0.05


def test_auto_tree_refuses_what_does_not_apply(tables):
  with pytest.raises(ValueError, match="auto_buckets"):
    _decode(tables, DecodeConfig(sampling=GREEDY, gamma_policy="auto", auto_buckets=(1,)))
  with pytest.raises(ValueError, match="cost table is for gamma_policy='auto'"):
    _decode(tables, DecodeConfig(sampling=GREEDY), costs=_table(4, (1.0, 1.5)))
  with pytest.raises(ValueError, match="calibrated for batch size 8"):
    _decode(tables, AUTO, prompt_lengths=LENGTHS, costs=_table(8, (1.0, 1.5)))


def test_seconds_per_token_prices_each_choice_at_the_tables_alpha():
  # α 0.6, depth 2: a tree round brings 1 + 0.6 + 0.36 = 1.96 tokens (Eq. 1).
  gamma, seconds = _table(4, (1.0, 1.5)).seconds_per_token()
  assert gamma == DEPTH and seconds == pytest.approx(1.5 / 1.96)
  assert _table(4, (1.0, 5.0)).seconds_per_token() == (0, 1.0)
