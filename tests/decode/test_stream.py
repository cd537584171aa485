"""Streaming decode (in-flight batching, `specjax.decode.stream`): B slots over N inputs.

- Each example's tokens and statistics equal its batch-1 decode with the same key, greedy
  and seeded sampling, both model families (table models; tiny T5 and decoder-only networks),
  the drafter kinds with state (model, hierarchical) and without (bigram), the block verifier
  (which folds each round's start into the keys), adaptive γ and the trace, autoregressive
  too; N not a multiple of B, N < B, mixed prompt lengths, rows ending at EOS, refills of 1
  and of B rows per pass, the tail shrink.
- Exactness through the stream: the joint law of the first three tokens (the sequence test
  of tests/decode/test_decoding.py) for two interleaved prompts of different lengths, so
  slots are refilled with prompts of another length than their previous example's.
- The 'auto' γ policy through the stream (an injected cost table): greedy tokens equal the
  autoregressive ones, each example's tokens its batch-1 decode's, γ = 0 and γ > 0 rounds
  both taken, and the round count matches the slot schedule.
- One compile per static config; progress chunks change nothing; slot utilization.
(Streaming on a device mesh: tests/runtime/test_sharding.py.)
"""

import jax
import numpy as np
import pytest

from specjax.decode import DecodeConfig, Streaming, autoregressive_decode, speculative_decode
from specjax.decode import auto
from specjax.decode import stream as stream_module
from specjax.draft import BigramDrafter, HierarchicalDrafter, ModelDrafter
from specjax.models.decoder_only import DecoderOnlyConfig, DecoderOnlyModel
from specjax.models.t5 import T5Config, T5Model
from specjax.sampling import Sampling
from specjax.testing import TableModel, exact_joint, joint_tv, random_table
from specjax.verify import BlockVerifier

V = 4
GREEDY, SAMPLED = Sampling(temperature=0.0), Sampling(temperature=1.0)
STATS = ("tokens", "lengths", "target_calls", "draft_calls", "accepted_hist", "alpha_sum",
         "alpha_count")


@pytest.fixture(scope="module")
def tables():
  return {"target": random_table(1, V), "draft": random_table(2, V, sharpness=1.0),
          "small": random_table(3, V, sharpness=0.5)}


def _prompts(n, width, vocab, seed):
  """n left-aligned prompts of mixed lengths 1..width (ids >= 2: 0 pads, 1 is EOS)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, width + 1, size=n)
  prompts = np.zeros((n, width), np.int32)
  for b, k in enumerate(lengths):
    prompts[b, :k] = rng.integers(2, vocab, size=k)
  return prompts, lengths.astype(np.int32)


def _assert_each_equals_batch1(result, decode, n, trace=False):
  """decode(rows slice) is a batch-1 decode of those rows; compares every statistic."""
  for e in range(n):
    one = decode(slice(e, e + 1))
    for name in STATS:
      got, want = np.asarray(getattr(result, name))[e], np.asarray(getattr(one, name))[0]
      if name == "alpha_sum":  # float sums: a batch of another size may round differently
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{name} of {e}")
      else:
        np.testing.assert_array_equal(got, want, err_msg=f"{name} of {e}")
    if trace:
      for name in ("guesses", "accepted", "correction", "gamma"):
        np.testing.assert_array_equal(np.asarray(getattr(result.trace, name))[e],
                                      np.asarray(getattr(one.trace, name))[0],
                                      err_msg=f"trace.{name} of {e}")


N, SLOTS, WIDTH = 7, 3, 6  # N not a multiple of B
TABLE_CONFIG = DecodeConfig(sampling=SAMPLED, eos_id=1, cache_len=40, verifier=BlockVerifier(),
                            trace=True, gamma_policy="heuristic")


def _spec(tables, drafter, params, prompts, lengths, keys, config, gamma=3, budget=12):
  """decode(rows, **stream): speculative decoding of those rows (a slice) with their keys."""
  return lambda rows, **stream: speculative_decode(
      TableModel(V), tables["target"], drafter, params, prompts[rows], max_new_tokens=budget,
      gamma=gamma, rng=keys[rows], config=config, prompt_lengths=lengths[rows], **stream)


@pytest.fixture(scope="module")
def streamed(tables):
  """The model drafter, block verifier (round starts folded into the keys), heuristic γ and
  the trace at T = 1 over N = 7 prompts in 3 slots; shared by the tests below (one compile)."""
  prompts, lengths = _prompts(N, WIDTH, V, seed=0)
  keys = jax.random.split(jax.random.PRNGKey(5), N)
  decode = _spec(tables, ModelDrafter(TableModel(V), max_gamma=3), tables["draft"], prompts,
                 lengths, keys, TABLE_CONFIG)
  return decode, decode(slice(None), slots=SLOTS)


def test_each_example_equals_its_batch1_decode(streamed):
  decode, result = streamed
  lengths = np.asarray(result.lengths)
  assert np.any(lengths < 12) and len(set(lengths.tolist())) > 2, \
      "rows should end at EOS, at different times"
  _assert_each_equals_batch1(result, decode, N, trace=True)


@pytest.mark.parametrize("drafter_name", ["bigram", "hierarchical"])
def test_other_drafters_each_example_equals_its_batch1_decode(tables, drafter_name):
  """Bigram: stateless, T = 1, reference verifier; hierarchical: nested drafter state, greedy."""
  prompts, lengths = _prompts(N, WIDTH, V, seed=1)
  keys = jax.random.split(jax.random.PRNGKey(6), N)
  if drafter_name == "bigram":
    corpus = [np.random.default_rng(3).integers(0, V, size=200)]
    drafter, params = BigramDrafter(corpus, V, max_gamma=3)
    config = DecodeConfig(sampling=SAMPLED, eos_id=1, cache_len=40)
  else:
    drafter = HierarchicalDrafter(medium=TableModel(V), inner=ModelDrafter(TableModel(V), 3,
                                                                           window=3),
                                  max_gamma=3, inner_gamma=2)
    params = {"medium": tables["draft"], "inner": tables["small"]}
    config = DecodeConfig(sampling=GREEDY, eos_id=1, cache_len=40)
  decode = _spec(tables, drafter, params, prompts, lengths, keys, config)
  _assert_each_equals_batch1(decode(slice(None), slots=SLOTS), decode, N)


def test_autoregressive_refill_of_several_rows_fewer_inputs_than_slots_and_tail_shrink(tables):
  prompts, lengths = _prompts(N, WIDTH, V, seed=2)
  keys = jax.random.split(jax.random.PRNGKey(7), N)
  config = DecodeConfig(sampling=SAMPLED, eos_id=1, cache_len=40)
  decode = lambda rows, **stream: autoregressive_decode(
      TableModel(V), tables["target"], prompts[rows], max_new_tokens=12, rng=keys[rows],
      config=config, prompt_lengths=lengths[rows], **stream)
  several = Streaming(SLOTS, refill_rows=SLOTS)
  _assert_each_equals_batch1(decode(slice(None), slots=several), decode, N)
  _assert_each_equals_batch1(decode(slice(0, 2), slots=several), decode, 2)
  shrinking = Streaming(4, min_slots=1)  # 4 slots, then 2, then 1 as the queue runs dry
  assert shrinking.sizes() == (4, 2, 1)
  result = decode(slice(None), slots=shrinking)
  _assert_each_equals_batch1(result, decode, N)
  calls = np.asarray(result.target_calls).tolist()
  assert (int(result.rounds), int(result.slot_rounds)) == _schedule(calls, (4, 2, 1))
  assert int(result.slot_rounds) < 4 * _schedule(calls, (4,))[0], "the tail should shrink"


# ---------------------------------------------------------------- real networks

NET_V = 96


def _net(family, layers, emb, seed):
  if family == "t5":
    model = T5Model(T5Config(vocab_size=NET_V, emb_dim=emb, num_heads=2,
                             num_encoder_layers=layers, num_decoder_layers=layers, head_dim=8,
                             mlp_dim=2 * emb))
  else:
    model = DecoderOnlyModel(DecoderOnlyConfig(vocab_size=NET_V, emb_dim=emb, num_heads=2,
                                               num_layers=layers, head_dim=8, mlp_dim=2 * emb))
  return model, model.init(jax.random.PRNGKey(seed))


@pytest.fixture(scope="module", params=["t5", "decoder_only"])
def family(request):
  target, target_params = _net(request.param, 1, 32, 0)
  draft, draft_params = _net(request.param, 1, 16, 1)
  prompts, lengths = _prompts(N, 10, NET_V, seed=3)
  if target.is_encoder_decoder:  # encoder inputs end with EOS
    prompts[np.arange(N), lengths - 1] = 1
    lengths = None
  return target, target_params, ModelDrafter(draft, max_gamma=4), draft_params, prompts, lengths


# Batch-1 against batched calls of float32 networks: at full float32 matmul precision on any
# backend (TF32 or bfloat16 passes round the two batch shapes differently; at T = 1 a draw or
# an accept test near its boundary can then flip, and alpha_sum differs beyond rtol 1e-6).
@jax.default_matmul_precision("highest")
def test_real_networks_each_example_equals_its_batch1_decode(family):
  """Speculative at T = 1 and autoregressive greedy, T5 (encoder run per refill) and
  decoder-only (prompt prefilled per refill)."""
  target, target_params, drafter, draft_params, prompts, lengths = family
  keys = jax.random.split(jax.random.PRNGKey(7), N)
  rows_of = lambda rows: None if lengths is None else lengths[rows]
  spec = lambda rows, **stream: speculative_decode(
      target, target_params, drafter, draft_params, prompts[rows], max_new_tokens=12, gamma=3,
      rng=keys[rows], config=DecodeConfig(sampling=SAMPLED, eos_id=1, cache_len=32),
      prompt_lengths=rows_of(rows), **stream)
  ar = lambda rows, **stream: autoregressive_decode(
      target, target_params, prompts[rows], max_new_tokens=12, rng=keys[rows],
      config=DecodeConfig(sampling=GREEDY, eos_id=1, cache_len=32),
      prompt_lengths=rows_of(rows), **stream)
  streamed = spec(slice(None), slots=SLOTS)
  assert len(set(np.asarray(streamed.target_calls).tolist())) > 1, \
      "rows should need different numbers of rounds (refills at different times)"
  _assert_each_equals_batch1(streamed, spec, N)
  _assert_each_equals_batch1(ar(slice(None), slots=SLOTS), ar, N)


# ------------------------------------------------------------------ exactness

# Power as in tests/decode/test_decoding.py: 3 tokens over V = 4 give 64 outcomes; with
# 400,000 rows per prompt the empirical TV of a correct sampler is about 0.004 (≤ 0.005
# even for a uniform law), so the 0.01 bound passes, while a joint law off by 0.015 or more
# (a drafter or cache state left over from the slot's previous example, a key of another
# example, a correction drawn from p instead of the residual) fails. The two prompts are
# interleaved at random over 800,000 examples through 4,096 slots, so refills change the
# prompt length of a slot; the draft's own law is > 0.05 away (checked), so the test has power.
EXACT_ROWS, STEPS = 400_000, 3


def _joint_tv(tokens, law):
  return joint_tv(tokens, law, STEPS)


def test_joint_of_first_three_tokens_is_exact_through_the_stream(tables):
  order = np.random.default_rng(0).permutation(2 * EXACT_ROWS) < EXACT_ROWS  # True: [2, 3]
  prompts = np.where(order[:, None], np.array([[2, 3]]), np.array([[3, 0]])).astype(np.int32)
  lengths = np.where(order, 2, 1).astype(np.int32)
  config = DecodeConfig(sampling=SAMPLED, eos_id=-1, cache_len=16)
  result = speculative_decode(TableModel(V), tables["target"],
                              ModelDrafter(TableModel(V), max_gamma=2), tables["draft"], prompts,
                              max_new_tokens=STEPS, gamma=2, rng=jax.random.PRNGKey(0),
                              config=config, prompt_lengths=lengths,
                              slots=Streaming(4096, refill_rows=4096))
  tokens = np.asarray(result.tokens)
  for prefix, rows in (([2, 3], order), ([3], ~order)):
    assert _joint_tv(tokens[rows], exact_joint(np.asarray(tables["target"]), SAMPLED, prefix,
                                               STEPS)) < 0.01, prefix
    assert _joint_tv(tokens[rows], exact_joint(np.asarray(tables["draft"]), SAMPLED, prefix,
                                               STEPS)) > 0.05, prefix


# ------------------------------------------------------- compiles, progress, utilization


def test_one_compile_for_budgets_gammas_keys_inputs_and_progress_chunks(tables, streamed):
  streamed[0](slice(None), slots=SLOTS)  # compiled (by the fixture, or here)
  compiled = stream_module._run._cache_size()
  drafter = ModelDrafter(TableModel(V), max_gamma=3)
  progress = []
  for i, (gamma, budget) in enumerate([(1, 6), (3, 11), (2, 3)]):
    prompts, lengths = _prompts(N, WIDTH, V, seed=10 + i)
    decode = _spec(tables, drafter, tables["draft"], prompts, lengths,
                   jax.random.split(jax.random.PRNGKey(i), N), TABLE_CONFIG, gamma, budget)
    decode(slice(None), slots=SLOTS, on_progress=lambda d, n: progress.append((d, n)))
  assert stream_module._run._cache_size() == compiled
  assert progress[-1] == (N, N) and progress[0][0] >= SLOTS


def test_progress_chunks_report_every_slots_examples_and_change_nothing(streamed):
  decode, whole = streamed
  calls = []
  chunked = decode(slice(None), slots=SLOTS, on_progress=lambda d, n: calls.append((d, n)))
  for name in STATS:
    np.testing.assert_array_equal(getattr(chunked, name), getattr(whole, name), err_msg=name)
  assert int(chunked.rounds) == int(whole.rounds)
  done = [d for d, _ in calls]
  assert done[-1] == N and all(t == N for _, t in calls)
  assert all(b - a >= SLOTS for a, b in zip([0] + done[:-2], done[:-1])), calls


def _schedule(target_calls, sizes):
  """(rounds, row-rounds) of the slot schedule, simulated: before each round every free slot
  (lowest first) takes the next example, which leaves after its `target_calls` rounds; once the
  queue is empty and at most sizes[1] slots are busy, the busy ones move to sizes[1] slots."""
  queue, left, sizes = list(target_calls), [0] * sizes[0], list(sizes)
  rounds = slot_rounds = 0
  while queue or any(left):
    busy = [k for k in left if k]
    if not queue and len(sizes) > 1 and len(busy) <= sizes[1]:
      sizes.pop(0)
      left = busy + [0] * (sizes[0] - len(busy))
      continue
    for b, k in enumerate(left):
      if not k and queue:
        left[b] = queue.pop(0)
    rounds, slot_rounds = rounds + 1, slot_rounds + len(left)
    left = [max(k - 1, 0) for k in left]
  return rounds, slot_rounds


def test_slot_utilization_is_useful_over_run_rounds_of_the_schedule(streamed):
  _, result = streamed
  calls = np.asarray(result.target_calls)
  assert (int(result.rounds), int(result.slot_rounds)) == _schedule(calls.tolist(), (SLOTS,))
  assert int(result.slot_rounds) == SLOTS * int(result.rounds)
  assert result.slot_utilization == pytest.approx(calls.sum() / (SLOTS * int(result.rounds)))
  # One padded batch runs as many rounds as its slowest row, over all its rows.
  padded = result.replace(rounds=None, slot_rounds=None)
  assert padded.slot_utilization == pytest.approx(calls.sum() / (N * calls.max()))


def test_auto_gamma_policy_through_the_stream(tables):
  """Greedy with the 'auto' policy and a cost table that makes a draft step cost about a
  target call: rows with a high running α speculate, the others take γ = 0 steps."""
  prompts, lengths = _prompts(N, WIDTH, V, seed=4)
  keys = jax.random.split(jax.random.PRNGKey(8), N)
  drafter = ModelDrafter(TableModel(V), max_gamma=3)
  config = DecodeConfig(sampling=GREEDY, eos_id=1, cache_len=40, gamma_policy="auto")
  buckets = auto.resolve_buckets(config.auto_buckets, 3)
  costs = auto.CostTable(batch=SLOTS, cache_len=40, max_gamma=3, buckets=buckets,
                         seconds=(1.0, 0.6, 1.2, 1.9),
                         models=f"target {auto.describe(TableModel(V))}; "
                                f"drafter {auto.describe(drafter)}")
  spec = lambda rows, **kw: speculative_decode(
      TableModel(V), tables["target"], drafter, tables["draft"], prompts[rows], max_new_tokens=12,
      rng=keys[rows], config=config, prompt_lengths=lengths[rows], **kw)
  result = spec(slice(None), slots=SLOTS, costs=costs)
  hist = np.asarray(result.gamma_hist).sum(0)
  assert hist[0] > 0 and hist[1:].sum() > 0, hist
  ar = autoregressive_decode(TableModel(V), tables["target"], prompts, max_new_tokens=12,
                             rng=keys, config=DecodeConfig(sampling=GREEDY, eos_id=1, cache_len=40),
                             prompt_lengths=lengths)
  np.testing.assert_array_equal(result.tokens, ar.tokens)
  np.testing.assert_array_equal(result.lengths, ar.lengths)
  calls = np.asarray(result.target_calls)
  assert int(result.slot_rounds) == SLOTS * int(result.rounds)
  assert int(result.rounds) == _schedule(calls.tolist(), (SLOTS,))[0]
  assert result.cost_table is costs


@pytest.mark.parametrize("slots", [0, True, 2.0])
def test_bad_slot_count(tables, slots):
  with pytest.raises(ValueError, match="slots must be an integer >= 1"):
    autoregressive_decode(TableModel(V), tables["target"], np.array([[2, 3]], np.int32),
                          max_new_tokens=3, rng=jax.random.PRNGKey(0),
                          config=DecodeConfig(cache_len=16), slots=slots)


@pytest.mark.parametrize("kwargs, message", [
    (dict(refill_rows=3), r"refill_rows must be in \[1, slots=2\]"),
    (dict(refill_rows=0), "refill_rows must be an integer >= 1"),
    (dict(min_slots=3), r"min_slots must be in \[1, slots=2\]"),
    (dict(min_slots=0), "min_slots must be an integer >= 1"),
])
def test_bad_streaming_settings(kwargs, message):
  with pytest.raises(ValueError, match=message):
    Streaming(2, **kwargs)

