"""The cost-aware 'auto' γ policy: decisions, exactness with γ = 0 rounds, drafter catch-up.

Timing is never asserted: every decision test injects a cost table. One compiled loop
(TableModel, max_gamma 2: the narrow round and buckets 1, 2) serves most tests; rounds are
forced through the loop's schedule where a test needs a given mix of γ.
"""
import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.decode import auto
from specjax.decode.auto import calibration
from specjax.decode.auto import rounds as auto_rounds
from specjax.decode import runner
from specjax.decode import speculative as decoding
from specjax.draft import HierarchicalDrafter, ModelDrafter
from specjax.models.decoder_only import DecoderOnlyConfig, DecoderOnlyModel
from specjax.models.t5 import T5Config, T5Model
from specjax.sampling import Sampling
from specjax.testing import TableModel, exact_joint, joint_tv, random_table

V = 4
NO_EOS = -1
AUTO = DecodeConfig(eos_id=NO_EOS, cache_len=16, gamma_policy="auto")
GREEDY_AUTO = DecodeConfig(sampling=Sampling(temperature=0.0), cache_len=64, gamma_policy="auto",
                           trace=True, auto_buckets=(1,))  # buckets (1, 3): fewer to compile
# Power as in test_decoding.py: 3 tokens over V = 4 (64 outcomes), 400,000 rows, the TV of
# a correct sampler ≈ 0.004 < 0.01; a γ = 0 row drawing from the draft or the residual
# instead of p moves the joint by more than 0.05 (the draft's own law is that far away).
N = 400_000
STEPS = 3


@dataclasses.dataclass(frozen=True)
class HistoryModel:
  """A decoder-only fake whose logits at slot t read EVERY earlier slot of its cache:
  log_table[(Σ_{s<t} token at s) mod V, token at t]. A stale or missing slot anywhere in a
  row's history changes its logits (a `TableModel` reads only the previous slot)."""

  vocab: int
  is_encoder_decoder = False

  @property
  def vocab_size(self):
    return self.vocab

  def encode(self, params, inputs):
    return None

  def init_cache(self, batch, max_len):
    return jnp.zeros((batch, max_len), jnp.int32)

  def decode(self, params, cache, tokens, positions, encoded, **unused):
    cache = jax.vmap(lambda c, t, p: jax.lax.dynamic_update_slice(c, t, (p,)))(
        cache, tokens, positions)
    slots = positions[:, None] + jnp.arange(tokens.shape[1])[None, :]  # [B, k]
    earlier = jnp.arange(cache.shape[1])[None, None, :] < slots[:, :, None]  # [B, k, T]
    history = jnp.where(earlier, cache[:, None, :], 0).sum(-1) % self.vocab
    return params[history, tokens], cache


@pytest.fixture(scope="module")
def tables():
  return random_table(1, V), random_table(2, V, sharpness=1.0)


def _table(seconds, batch, max_gamma=2, cache_len=16, drafter=None, buckets=None, alpha=None):
  drafter = drafter or ModelDrafter(TableModel(V), max_gamma=max_gamma)
  return auto.CostTable(batch=batch, cache_len=cache_len, max_gamma=max_gamma,
                        buckets=buckets or auto.default_buckets(max_gamma), seconds=seconds,
                        models=f"target {auto.describe(TableModel(V))}; "
                               f"drafter {auto.describe(drafter)}", alpha=alpha)


def _joint_tv(tokens, law):
  return joint_tv(tokens, law, STEPS)


def _run(config, target_table, drafter, draft_params, prompts, budget, rng, control, lengths=None):
  """The compiled loop with an explicit control (forced schedule and cost table)."""
  call = decoding.prepare_decode(TableModel(V), target_table, drafter, draft_params, prompts,
                                max_new_tokens=budget, config=config, prompt_lengths=lengths,
                                rng=rng)
  result, _ = call.run(budget, drafter.max_gamma, control)
  return result


# ---------------------------------------------------------------------- the decision rule


def _reference_choice(costs, alpha_sum, alpha_count, active, room, cap,
                      prior=auto.PRIOR_ALPHA, weight=1.0):
  """The module docstring's rule, written out with Python floats."""
  best, best_time = 0, float("inf")
  for g in range(min(cap, len(costs) - 1) + 1):
    slowest = 0.0
    for s, c, a, r in zip(alpha_sum, alpha_count, active, room):
      if a:
        alpha = min(max((s + weight * prior) / (c + weight), 0.0), 1.0)
        tokens = sum(alpha ** i for i in range(min(g, r - 1) + 1))
        slowest = max(slowest, r / tokens)
    if costs[g] * slowest < best_time * (1 - 1e-6):
      best, best_time = g, costs[g] * slowest
  return [min(best, r - 1) if a else 0 for a, r in zip(active, room)]


def test_choose_gamma_follows_the_rule_and_switches_speculation_off():
  rng = np.random.default_rng(0)
  choose = jax.jit(auto.choose_gamma)
  for _ in range(200):
    batch = int(rng.integers(1, 6))
    costs = np.sort(rng.uniform(0.5, 4.0, 8)).astype(np.float32)
    costs[0] = 1.0
    count = rng.integers(0, 30, batch)
    alpha_sum = (rng.uniform(0, 1, batch) * count).astype(np.float32)
    active = rng.uniform(size=batch) < 0.8
    room = rng.integers(1, 20, batch)
    cap = int(rng.integers(0, 8))
    prior, weight = float(rng.uniform(0, 1)), float(rng.choice([1.0, auto.PRIOR_POSITIONS]))
    got = choose(costs, alpha_sum, count.astype(np.int32), active, room.astype(np.int32),
                 jnp.int32(cap), jnp.float32(prior), jnp.float32(weight))
    assert got.tolist() == _reference_choice(costs.tolist(), alpha_sum.tolist(), count.tolist(),
                                             active.tolist(), room.tolist(), cap, prior, weight)
  # Speculation that cannot pay even at α = 1 is never chosen.
  costs = jnp.array([1.0, 2.5, 3.5, 5.0], jnp.float32)
  one = lambda s, c, r: choose(costs, jnp.array(s, jnp.float32), jnp.array(c, jnp.int32),
                               jnp.ones(len(s), bool), jnp.array(r, jnp.int32), jnp.int32(3))
  assert one([99.0], [99], [50]).tolist() == [0]
  # Batch-aware: a row that pays alone (α ≈ 0.9) is switched to γ = 0 beside a row with
  # α ≈ 0 that makes the batch's wider call a loss; the same row alone speculates.
  costs = jnp.array([1.0, 1.3, 1.5, 1.9], jnp.float32)
  alone = choose(costs, jnp.array([90.0]), jnp.array([100]), jnp.ones(1, bool),
                 jnp.array([40]), jnp.int32(3))
  assert alone.tolist() == [3]
  both = choose(costs, jnp.array([90.0, 0.0]), jnp.array([100, 100]), jnp.ones(2, bool),
                jnp.array([40, 40]), jnp.int32(3))
  assert both.tolist() == [0, 0]
  # In a wide round a row never guesses past its budget, and finished rows offer none.
  mixed = choose(costs, jnp.array([90.0, 90.0, 90.0]), jnp.array([100, 100, 100]),
                 jnp.array([True, True, False]), jnp.array([40, 2, 9]), jnp.int32(3))
  assert mixed.tolist() == [3, 1, 0]


def test_a_narrow_decision_stands_while_the_busy_rows_rooms_are_equal():
  """The claim `auto_rounds.narrow_stands` rests on: narrow rounds keep α and shrink every
  busy row's room by one, and with equal rooms γ = 0 stays the choice all the way down.
  400 random batches; each γ = 0 decision re-checked at every smaller room."""
  rng = np.random.default_rng(1)
  choose = jax.jit(auto.choose_gamma)
  checked = 0
  for _ in range(400):
    batch = int(rng.integers(1, 6))
    costs = np.sort(rng.uniform(0.8, 3.0, 8)).astype(np.float32)
    costs[0] = 1.0
    count = rng.integers(0, 30, batch).astype(np.int32)
    alpha_sum = (rng.uniform(0, 1, batch) * count).astype(np.float32)
    active = rng.uniform(size=batch) < 0.8
    room = int(rng.integers(2, 40))
    decide = lambda r: choose(costs, alpha_sum, count, active, np.full(batch, r, np.int32),
                              jnp.int32(7))
    if np.any(np.asarray(decide(room))):
      continue
    checked += 1
    for smaller in range(room - 1, 0, -1):
      assert not np.any(np.asarray(decide(smaller))), (room, smaller)
  assert checked > 100
  # With unequal rooms it can flip: a row with α ≈ 0 and 2 tokens fewer to go than a row
  # with α ≈ 0.9 makes a wide round a loss at rooms (10, 8) but a gain at (8, 6).
  costs = jnp.array([1.0, 1.3, 1.3, 1.3, 1.3], jnp.float32)
  pair = lambda r: choose(costs, jnp.array([90.0, 0.0]), jnp.array([100, 100]),
                          jnp.ones(2, bool), jnp.array(r, jnp.int32), jnp.int32(4)).tolist()
  assert pair([10, 8]) == [0, 0] and pair([8, 6]) != [0, 0]


def test_narrow_stands_until_a_row_finishes_rooms_differ_or_a_schedule_forces():
  control = auto.AutoControl.make(np.ones(3, np.float32), 2)
  forced = auto.AutoControl.make(np.ones(3, np.float32), 2, schedule=[0, 0, 0])
  prefix = jnp.array([2, 5, 3], jnp.int32)
  state = lambda length, done, calls=4: types.SimpleNamespace(
      length=jnp.array(length, jnp.int32), done=jnp.array(done),
      target_calls=jnp.full(3, calls, jnp.int32))
  mark = jnp.array([False, False, True])
  stands = lambda c, s: bool(auto_rounds.narrow_stands(c, prefix, mark, s))
  assert stands(control, state([9, 12, 4], [False, False, True]))  # 7 made each; row 2 done
  assert not stands(control, state([9, 12, 4], [True, False, True]))  # a row finished
  assert not stands(control, state([9, 13, 4], [False, False, True]))  # rooms differ
  assert not stands(forced, state([9, 12, 4], [False, False, True], calls=2))  # forced round
  assert stands(forced, state([9, 12, 4], [False, False, True], calls=3))  # schedule over
  probe_next = auto.PROBE_EVERY - 1  # the next decision may be a probe: recompute it
  assert not stands(control, state([9, 12, 4], [False, False, True], calls=probe_next))
  assert stands(control, state([9, 12, 4], [False, False, True], calls=probe_next + 1))


def test_branch_index_and_per_gamma_costs():
  buckets = (1, 2, 4, 7)
  for most, want in ((0, 0), (1, 1), (2, 2), (3, 3), (4, 3), (5, 4), (7, 4)):
    assert int(auto.branch_index(jnp.array([0, most]), buckets)) == want
  table = auto.CostTable(batch=1, cache_len=16, max_gamma=7, buckets=buckets,
                         seconds=(1.0, 2.0, 3.0, 4.0, 5.0))
  np.testing.assert_array_equal(table.per_gamma(), [1, 2, 3, 4, 4, 5, 5, 5])
  assert auto.default_buckets(7) == (1, 2, 4, 7) and auto.default_buckets(1) == (1,)


# -------------------------------------------------------------------------- exactness


def test_gamma_zero_rounds_and_mixed_rows_keep_the_joint_exact(tables):
  target_table, draft_table = tables
  prompt = np.array([[2, 3]] * N, np.int32)
  drafter = ModelDrafter(TableModel(V), max_gamma=2)
  # Round 1 forced wide (γ = 2), round 2 forced narrow (γ = 0 for every row: no draft
  # call), then the policy with equal costs: the widest γ each row's budget (4) allows, so
  # in round 3 rows with 1 token left take γ = 0 inside the wide call beside rows with γ = 1.
  control = auto.AutoControl.make(np.ones(3, np.float32), 2, schedule=[2, 0])
  result = _run(AUTO, target_table, drafter, draft_table, prompt, STEPS + 1,
                jax.random.PRNGKey(3), control)
  hist = np.asarray(result.gamma_hist).sum(0)
  assert hist[0] > 1.1 * N and hist[1] > 0.1 * N and hist[2] == N, hist  # every kind ran
  assert _joint_tv(result.tokens, exact_joint(np.asarray(target_table), Sampling(), [2, 3],
                                              STEPS)) < 0.01
  assert _joint_tv(result.tokens, exact_joint(np.asarray(draft_table), Sampling(), [2, 3],
                                              STEPS)) > 0.05


def _mixed_prompts(batch=12, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, 7, size=batch)
  prompts = np.zeros((batch, 6), np.int32)
  for b, n in enumerate(lengths):
    prompts[b, :n] = rng.integers(1, V, size=n)
  return prompts, lengths


# One compiled loop for the tests below: 12 prompts of width 6, budget <= 30.
SMALL = DecodeConfig(eos_id=NO_EOS, cache_len=40, gamma_policy="auto")


def _small(target_table, draft_params, budget, key, seconds=None, control=None, seed=0,
           alpha=None):
  prompts, lengths = _mixed_prompts(seed=seed)
  drafter = ModelDrafter(TableModel(V), max_gamma=2)
  if control is not None:
    return _run(SMALL, target_table, drafter, draft_params, prompts, budget, key, control, lengths)
  return speculative_decode(TableModel(V), target_table, drafter, draft_params, prompts,
                            max_new_tokens=budget, rng=key, config=SMALL, prompt_lengths=lengths,
                            costs=None if seconds is None else _table(seconds, 12, cache_len=40,
                                                                      alpha=alpha))


def test_a_table_that_never_pays_reproduces_autoregressive_tokens_at_t1(tables):
  target_table, draft_table = tables
  prompts, lengths = _mixed_prompts(seed=1)
  key = jax.random.PRNGKey(5)
  reference = autoregressive_decode(TableModel(V), target_table, prompts, max_new_tokens=20,
                                    rng=key, config=DecodeConfig(eos_id=NO_EOS, cache_len=40),
                                    prompt_lengths=lengths)
  table = _table((1.0, 5.0, 9.0), 12, cache_len=40)
  assert auto.never_speculates(table, 2, 20)
  # In the loop (the control given directly, as calibration does): γ = 0 rounds draw with
  # the autoregressive loop's own keys, the same tokens at T = 1.
  in_loop = _small(target_table, draft_table, 20, key, seed=1,
                   control=calibration.decode_control(table, 2))
  # Through the API the policy's decision is known before the first round, and the
  # autoregressive loop runs instead: the same tokens again, reported as γ = 0 rounds.
  instead = _small(target_table, draft_table, 20, key, seconds=(1.0, 5.0, 9.0), seed=1)
  assert instead.cost_table == table
  for result in (in_loop, instead):
    np.testing.assert_array_equal(np.asarray(result.tokens)[:, :20], reference.tokens)
    np.testing.assert_array_equal(np.asarray(result.gamma_hist)[:, 0], 20)
    assert np.asarray(result.gamma_hist)[:, 1:].sum() == 0
    assert np.asarray(result.draft_calls).sum() == 0
    np.testing.assert_array_equal(result.target_calls, 20)
    np.testing.assert_array_equal(result.alpha_count, 0)


def test_never_speculates_is_the_policys_first_decision():
  # α = 0.5 (calibrated), a γ = 1 round at 1.6 steps: E(1) = 1.5 tokens < 1.6: never.
  table = lambda alpha, seconds=(1.0, 1.6, 2.0): _table(seconds, 1, alpha=alpha)
  assert auto.never_speculates(table(0.5), 2, 64)
  assert not auto.never_speculates(table(0.9), 2, 64)  # E(2) = 2.71 > 2.0
  assert not auto.never_speculates(table(None), 2, 64)  # no α: the prior 1 probes
  assert auto.never_speculates(table(0.9), 2, 1)  # one token left: nothing to guess
  # Its claim, checked in the loop: a table that never speculates at the full budget
  # never picks γ > 0 at any smaller room, for any batch of rows at the prior α.
  for alpha in np.linspace(0.0, 1.0, 11):
    for seconds in ((1.0, 1.2, 1.5), (1.0, 1.6, 2.0), (1.0, 1.9, 2.4), (1.0, 2.0, 3.0)):
      if not auto.never_speculates(table(float(alpha), seconds), 2, 30):
        continue
      costs = jnp.asarray(table(float(alpha), seconds).per_gamma())
      for room in range(1, 31):
        rows = jnp.array([room, max(room - 3, 1), 30], jnp.int32)
        got = auto.choose_gamma(costs, jnp.zeros(3), jnp.zeros(3, jnp.int32), jnp.ones(3, bool),
                                rows, jnp.int32(2), jnp.float32(alpha))
        assert not np.any(np.asarray(got)), (alpha, seconds, room)


def test_same_table_same_decisions_and_tokens(tables):
  target_table, draft_table = tables
  run = lambda seconds: _small(target_table, draft_table, 16, jax.random.PRNGKey(9), seconds)
  first, again = run((1.0, 1.2, 1.3)), run((1.0, 1.2, 1.3))
  np.testing.assert_array_equal(first.tokens, again.tokens)
  np.testing.assert_array_equal(first.gamma_hist, again.gamma_hist)
  assert first.cost_table.seconds == (1.0, 1.2, 1.3)
  hist = np.asarray(first.gamma_hist).sum(0)
  assert hist[0] > 0 and hist[1:].sum() > 0  # this table both speculates and switches it off
  other = run((1.0, 5.0, 9.0))  # another table, other decisions
  assert not np.array_equal(first.gamma_hist, other.gamma_hist)


def test_greedy_auto_equals_autoregressive_and_compiles_once(tables):
  target_table, draft_table = tables
  prompts, lengths = _mixed_prompts(batch=16)
  greedy = Sampling(temperature=0.0)
  reference = autoregressive_decode(TableModel(V), target_table, prompts, max_new_tokens=20,
                                    rng=jax.random.PRNGKey(0),
                                    config=DecodeConfig(sampling=greedy, cache_len=64),
                                    prompt_lengths=lengths)
  drafter = ModelDrafter(TableModel(V), max_gamma=3)
  before = runner.run_loop._cache_size()
  gammas = []
  for seconds in ((1.0, 1.1, 1.3), (1.0, 1.4, 1.8), (1.0, 9.0, 9.0)):
    result = speculative_decode(TableModel(V), target_table, drafter, draft_table, prompts,
                                max_new_tokens=20, rng=jax.random.PRNGKey(0), config=GREEDY_AUTO,
                                prompt_lengths=lengths,
                                costs=_table(seconds, 16, 3, 64, drafter, (1, 3)))
    np.testing.assert_array_equal(result.tokens, reference.tokens)
    np.testing.assert_array_equal(result.lengths, reference.lengths)
    assert np.asarray(result.gamma_hist).sum() == np.asarray(result.target_calls).sum()
    rounds = np.asarray(result.trace.gamma)[:, :int(np.max(result.target_calls))]
    gammas.append(rounds)
  every = np.concatenate(gammas, axis=1)
  assert {0, 1, 3} <= set(np.unique(every))  # narrow rounds and every bucket ran
  mixed = [len(set(col) - {0}) > 0 and 0 in col for col in every.T]
  assert any(mixed)  # rows with γ = 0 inside a wide round
  assert runner.run_loop._cache_size() == before + 1  # tables are data


# ------------------------------------------------------------- drafters after γ = 0 rounds


@pytest.fixture(scope="module")
def networks():
  """Tiny random-init networks (vocabulary 32), params made once: a 2-layer decoder-only
  (layer 2's keys depend on every earlier slot) and a 1-layer T5 (the encoder path)."""
  lm = DecoderOnlyModel(DecoderOnlyConfig(vocab_size=32, emb_dim=16, num_heads=2, num_layers=2,
                                          head_dim=8, mlp_dim=32))
  t5 = T5Model(T5Config(vocab_size=32, emb_dim=16, num_heads=2, num_encoder_layers=1,
                        num_decoder_layers=1, head_dim=8, mlp_dim=32))
  return {"lm": (lm, jax.jit(lm.init)(jax.random.PRNGKey(0))),
          "t5": (t5, jax.jit(t5.init)(jax.random.PRNGKey(1)))}


# The catch-up's window calls against one full call (other shapes) of float32 networks: at
# full float32 matmul precision on any backend.
@pytest.mark.parametrize("kind", ["lm", "t5", "hierarchical"])
@jax.default_matmul_precision("highest")
def test_drafters_catch_up_any_lag(request, kind):
  batch, total, gamma = 5, 40, 3
  if kind == "hierarchical":  # the medium's distribution is what the target sees
    model, params = HistoryModel(32), random_table(4, 32)
    inner = ModelDrafter(HistoryModel(32), 2, window=3, catch_up=4)
    drafter = HierarchicalDrafter(medium=model, inner=inner, max_gamma=gamma, inner_gamma=2)
    draft_params = {"medium": params, "inner": random_table(5, 32)}
  else:
    model, params = request.getfixturevalue("networks")[kind]
    drafter, draft_params = ModelDrafter(model, max_gamma=gamma, catch_up=4), params
  rng = np.random.default_rng(3)
  seq = rng.integers(2, 32, size=(batch, total)).astype(np.int32)
  if kind == "t5":
    seq[:, 0] = 0
  inputs = rng.integers(2, 32, size=(batch, 6)).astype(np.int32)
  start = np.ones(batch, np.int32) if kind == "t5" else np.array([3, 3, 4, 2, 5], np.int32)
  lag = np.array([0, 1, 2, 7, 19], np.int32)  # tokens committed without the drafter
  length = start + lag
  prompts = inputs if kind == "t5" else np.where(np.arange(6)[None] < start[:, None],
                                                 seq[:, :6], 0)

  @jax.jit
  def propose(draft_params, prompts, seq, start, length, keys):
    state = drafter.init(draft_params, prompts, seq, start, total)
    return drafter.propose(draft_params, state, seq, length,
                           jnp.full((batch,), gamma, jnp.int32), keys, Sampling())[0]

  proposal = propose(draft_params, prompts, seq, start, length,
                     jax.random.split(jax.random.PRNGKey(0), batch))
  # Reference without any cache history: one call over the committed tokens + the guesses.
  full = np.array(seq)
  for b in range(batch):
    full[b, length[b]:length[b] + gamma] = np.asarray(proposal.tokens[b])
  encoded = model.encode(params, jnp.asarray(inputs)) if kind == "t5" else None
  logits, _ = jax.jit(model.decode)(params, model.init_cache(batch, total), jnp.asarray(full),
                                    jnp.zeros((batch,), jnp.int32), encoded)
  for b in range(batch):
    want = jax.nn.softmax(logits[b, length[b] - 1:length[b] - 1 + gamma], -1)
    np.testing.assert_allclose(proposal.probs[b], want, atol=2e-5)


def test_draft_equal_to_target_accepts_every_guess_after_gamma_zero_rounds(tables):
  target_table, _ = tables
  # Stretches of γ = 0 rounds (no draft call) leave the drafter up to 7 tokens behind; a
  # draft identical to the target then accepts every guess at T = 1 (q = p) only if its
  # cache caught up exactly: every round accepts all the guesses it offered.
  schedule = [0, 0, 0, 0, 0, 2, 0, 0, 0, 2, 2, 0, 0, 0, 0, 0, 0, 0, 2, 1, 2]
  control = auto.AutoControl.make(np.ones(3, np.float32), 2, schedule=schedule)
  prompts, lengths = _mixed_prompts(seed=4)
  model = HistoryModel(V)  # the target and the draft: every slot of the history counts
  call = decoding.prepare_decode(model, target_table, ModelDrafter(model, max_gamma=2),
                                target_table, prompts, max_new_tokens=30, config=SMALL,
                                prompt_lengths=lengths, rng=jax.random.PRNGKey(1))
  result, _ = call.run(30, 2, control)
  np.testing.assert_array_equal(result.accepted_hist, result.gamma_hist)
  assert np.asarray(result.gamma_hist)[:, 1:].sum() >= 5 * 12


# ----------------------------------------------------------------------- tables and errors


def test_calibration_returns_a_table_that_fits_the_decode(tables, tmp_path):
  target_table, draft_table = tables
  prompts, lengths = _mixed_prompts()
  drafter = ModelDrafter(TableModel(V), max_gamma=2)
  table = decoding.calibrate_costs(TableModel(V), target_table, drafter, draft_table, prompts,
                                   max_new_tokens=20, config=SMALL, prompt_lengths=lengths,
                                   rounds=2, repeats=1)
  assert (table.batch, table.cache_len, table.max_gamma, table.buckets) == (12, 40, 2, (1, 2))
  assert len(table.seconds) == 3 and min(table.seconds) > 0 and table.calibration_s > 0
  path = str(tmp_path / "costs.json")
  table.save(path)
  loaded = auto.CostTable.load(path)
  assert loaded == table
  result = _small(target_table, draft_table, 20, jax.random.PRNGKey(0), seconds=loaded.seconds)
  assert result.cost_table.seconds == table.seconds
  # The table's α is measured on the calibration's rounds: a draft equal to its target
  # (q = p) gets exactly 1, a different one less.
  assert 0.0 < table.alpha < 1.0
  same = decoding.calibrate_costs(TableModel(V), target_table, drafter, target_table, prompts,
                                  max_new_tokens=20, config=SMALL, prompt_lengths=lengths,
                                  rounds=2, repeats=1)
  assert same.alpha == pytest.approx(1.0, abs=1e-5)


def test_the_tables_alpha_is_each_rows_prior(tables):
  target_table, draft_table = tables
  # Speculation pays at these costs only for a row whose α̂ is high: E(2) = 3 tokens per
  # 1.9 at α = 1, 1 per 1.9 at α = 0. Without a measured α the prior is 1, so the first
  # round speculates; with α = 0 in the table no round ever does (no probe).
  key = jax.random.PRNGKey(0)
  probe = _small(target_table, draft_table, 20, key, seconds=(1.0, 1.5, 1.9))
  assert np.asarray(probe.gamma_hist)[:, 2].min() >= 1
  never = _small(target_table, draft_table, 20, key, seconds=(1.0, 1.5, 1.9), alpha=0.0)
  hist = np.asarray(never.gamma_hist)
  assert hist[:, 1:].sum() == 0 and hist[:, 0].sum() == 12 * 20


@pytest.mark.parametrize("change, message", [
    (dict(batch=3), "batch size 3"),
    (dict(cache_len=32), "cache length 32"),
    (dict(models="target other"), "models"),
])
def test_a_table_for_another_decode_is_refused(tables, change, message):
  target_table, draft_table = tables
  good = _table((1.0, 2.0, 3.0), 12, cache_len=40)
  bad = auto.CostTable(**{**good.__dict__, **change})
  prompts, lengths = _mixed_prompts()
  with pytest.raises(ValueError, match=message):
    speculative_decode(TableModel(V), target_table, ModelDrafter(TableModel(V), max_gamma=2),
                       draft_table, prompts, max_new_tokens=4, prompt_lengths=lengths,
                       rng=jax.random.PRNGKey(0), config=SMALL, costs=bad)


def test_bad_tables_and_settings(tmp_path):
  with pytest.raises(ValueError, match="positive"):
    auto.CostTable(batch=1, cache_len=8, max_gamma=1, buckets=(1,), seconds=(1.0, 0.0))
  with pytest.raises(ValueError, match="costs for"):
    auto.CostTable(batch=1, cache_len=8, max_gamma=1, buckets=(1,), seconds=(1.0,))
  with pytest.raises(ValueError, match="alpha"):
    auto.CostTable(batch=1, cache_len=8, max_gamma=1, buckets=(1,), seconds=(1.0, 2.0),
                   alpha=1.5)
  path = tmp_path / "broken.json"
  path.write_text("{not json")
  with pytest.raises(ValueError, match="cannot be read"):
    auto.CostTable.load(str(path))
  path.write_text('{"version": 1, "batch": 1}')
  with pytest.raises(ValueError, match="incomplete"):
    auto.CostTable.load(str(path))
  with pytest.raises(ValueError, match="auto_buckets"):
    DecodeConfig(gamma_policy="auto", auto_buckets=(2, 1))
  with pytest.raises(ValueError, match="past the drafter's max_gamma"):
    auto.resolve_buckets((1, 9), 7)
  target = TableModel(V)
  table = random_table(1, V)
  with pytest.raises(ValueError, match="gamma is required"):
    speculative_decode(target, table, ModelDrafter(target, 2), table, np.ones((1, 2), np.int32),
                       max_new_tokens=2, rng=jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="for gamma_policy='auto'"):
    speculative_decode(target, table, ModelDrafter(target, 2), table, np.ones((1, 2), np.int32),
                       max_new_tokens=2, gamma=1, rng=jax.random.PRNGKey(0),
                       costs=_table((1.0, 2.0, 3.0), 1))


def test_calibration_prior_comes_from_a_run_that_is_not_rolled_back():
  """The table's α is the acceptance rate of an untimed run of the widest bucket whose rows
  move through their text, not of the timed rolled-back runs (which see only the inputs'
  first positions): a fake loop reports α 0.2 for every rolled-back run and 0.9 otherwise."""
  seen = []

  def run(control):
    rollback = bool(control.rollback)
    forced = [int(g) for g in np.asarray(control.schedule) if g >= 0]
    seen.append((rollback, forced))
    if rollback:
      return np.array([0.2 * len(forced)]), np.array([len(forced)])
    # Rows with α 0.9 and 0.6, and one that was never verified (counted in no row's α).
    return np.array([0.9 * 3, 0.6 * 5, 0.0]), np.array([3, 5, 0])

  table = auto.time_rounds(run, batch=3, cache_len=32, max_gamma=4, buckets=(1, 2, 4),
                         models="fake", rounds=2, repeats=1)
  # The batch's slowest row sets the prior: its α, not the mean (0.71).
  assert table.alpha == pytest.approx(0.6)
  assert auto.prior_of(table) == (pytest.approx(0.6), auto.PRIOR_POSITIONS / 3)
  assert auto.prior_of(dataclasses.replace(table, alpha=None)) == (auto.PRIOR_ALPHA, 1.0)
  free = [forced for rollback, forced in seen if not rollback]
  # the check's real runs: fixed part (no round), narrow and the widest bucket, per pair
  assert sorted({tuple(set(f)) for f in free}) == [(), (0,), (4,)]


def test_a_measured_prior_outweighs_one_unlucky_round():
  """With the table's α as PRIOR_POSITIONS prior positions, one rejected first guess does
  not switch a row whose prior says speculation pays to γ = 0 (with one prior position it
  did, for good: narrow rounds verify nothing); a row whose own evidence is bad still stops."""
  costs = jnp.asarray(_table((1.0, 1.7, 2.0, 2.3), 1, max_gamma=3).per_gamma())
  choose = lambda s, c, w: int(auto.choose_gamma(
      costs, jnp.array([s], jnp.float32), jnp.array([c], jnp.int32), jnp.ones(1, bool),
      jnp.array([60], jnp.int32), jnp.int32(3), jnp.float32(0.94), jnp.float32(w))[0])
  assert choose(0.0, 0, auto.PRIOR_POSITIONS) == 3  # the prior alone: speculate
  assert choose(0.0, 1, 1.0) == 0  # one prior position: one rejection ends it
  assert choose(0.0, 1, auto.PRIOR_POSITIONS) == 3
  assert choose(2.0, 20, auto.PRIOR_POSITIONS) == 0  # α̂ = 9.5 / 28 ≈ 0.34: it stops


def test_narrow_rows_are_probed_every_probe_every_rounds(tables):
  """A draft that is always wrong (its argmax is the target's + 1): the rows' α̂ falls, the
  policy goes narrow, and from then on exactly the rounds r with r % PROBE_EVERY ==
  PROBE_EVERY - 1 play the prior's own choice (γ = 3 here: no measured α, one prior position
  at α = 1); greedy output stays the target's."""
  target_table, _ = tables
  argmax = jnp.argmax(target_table, axis=-1)  # [V, V]
  wrong = jax.nn.one_hot((argmax + 1) % V, V) * 5.0  # the draft's argmax: never the target's
  drafter = ModelDrafter(TableModel(V), max_gamma=3)
  prompts, lengths = _mixed_prompts(batch=2)
  budget = 3 * auto.PROBE_EVERY + 4
  result = speculative_decode(TableModel(V), target_table, drafter, wrong, prompts,
                              max_new_tokens=budget, rng=jax.random.PRNGKey(0),
                              config=GREEDY_AUTO, prompt_lengths=lengths,
                              costs=_table((1.0, 1.2, 1.3), 2, 3, 64, drafter, (1, 3)))
  reference = autoregressive_decode(TableModel(V), target_table, prompts, max_new_tokens=budget,
                                    rng=jax.random.PRNGKey(0),
                                    config=DecodeConfig(sampling=Sampling(temperature=0.0),
                                                        cache_len=64),
                                    prompt_lengths=lengths)
  np.testing.assert_array_equal(result.tokens, reference.tokens)
  assert float(np.asarray(result.alpha_sum).sum()) == 0.0  # no guess was ever accepted
  rounds = int(np.max(result.target_calls))
  played = np.asarray(result.trace.gamma)[0, :rounds]  # both rows decide alike
  first_narrow = int(np.argmax(played == 0))
  assert 0 < first_narrow < auto.PROBE_EVERY - 1  # it speculated, then stopped
  later = np.arange(first_narrow, rounds)
  probes = later[(later % auto.PROBE_EVERY) == auto.PROBE_EVERY - 1]
  assert len(probes) >= 3
  np.testing.assert_array_equal(np.flatnonzero(played[first_narrow:]) + first_narrow, probes)
  assert set(played[probes].tolist()) == {3}
