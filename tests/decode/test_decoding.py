"""Tests for the decode loops with table models (fixed probability tables).

Real-network tests (both model families) live in tests/decode/test_decoding_models.py.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode import runner
from specjax.verify import ReferenceVerifier
from specjax.decode import DecodeConfig, DecodeResult, autoregressive_decode, speculative_decode
from specjax.draft import BigramDrafter, ModelDrafter, PromptLookupDrafter, UnigramDrafter
from specjax.sampling import Sampling
from specjax.testing import TableModel, exact_joint, joint_tv, random_table

V = 4
NO_EOS = -1


# ------------------------------------------------------------- sequence-level exactness

# Power: 3 tokens over V = 4 give 64 outcomes; with N = 400,000 rows the
# empirical TV of a correct sampler is about 0.004 (≤ 0.005 even for a uniform
# law), so the 0.01 bound passes, while a loop whose joint law is off by 0.015
# or more in TV (e.g. a stale draft cache after rollback, or a correction drawn
# from p instead of the residual) fails.
N = 400_000
STEPS = 3


@pytest.fixture(scope="module")
def tables():
  return random_table(1, V), random_table(2, V, sharpness=1.0)


def _joint_tv(tokens, law):
  return joint_tv(tokens, law, STEPS)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(top_k=2), Sampling(top_p=0.8)],
                         ids=["temperature", "top_k", "top_p"])
def test_joint_of_first_three_tokens_matches_target(tables, sampling):
  target_table, draft_table = tables
  prompt = np.array([[2, 3]] * N, np.int32)
  config = DecodeConfig(sampling=sampling, eos_id=NO_EOS, cache_len=16)
  drafter = ModelDrafter(TableModel(V), max_gamma=2)
  result = speculative_decode(TableModel(V), target_table, drafter, draft_table, prompt,
                              max_new_tokens=STEPS, gamma=2, rng=jax.random.PRNGKey(0),
                              config=config)
  law = exact_joint(np.asarray(target_table), sampling, [2, 3], STEPS)
  assert _joint_tv(result.tokens, law) < 0.01
  # The draft's own law is far from the target's: the test has power here.
  assert _joint_tv(result.tokens, exact_joint(np.asarray(draft_table), sampling, [2, 3],
                                              STEPS)) > 0.05


# Power as above (N = 400,000, 0.01 bound; the model drafter's run, while the bigram table's
# rows are checked against the loop's tokens only). γ = 2 under max_gamma = 3: the unrolled
# drafters draw a third guess each round that no row may use; a loop that verified it, or fed
# the model drafter's cache past what was drafted, moves the law or the tokens.
@pytest.mark.parametrize("name", ["model", "bigram"])
def test_unrolled_guesses_draw_the_loops_tokens_and_stay_exact(tables, name):
  target_table, draft_table = tables
  prompt = np.array([[2, 3]] * N, np.int32)
  config = DecodeConfig(eos_id=NO_EOS, cache_len=16)
  looped, params = _drafters(draft_table, max_gamma=3)[name]
  unrolled = dataclasses.replace(looped, unroll=True)
  decode = lambda drafter, rows: speculative_decode(
      TableModel(V), target_table, drafter, params, prompt[:rows], max_new_tokens=STEPS,
      gamma=2, rng=jax.random.PRNGKey(0), config=config)
  result = decode(unrolled, N if name == "model" else 2000)  # the law once: one guess loop
  if name == "model":
    assert _joint_tv(result.tokens, exact_joint(np.asarray(target_table), Sampling(), [2, 3],
                                                STEPS)) < 0.01
    assert _joint_tv(result.tokens, exact_joint(np.asarray(draft_table), Sampling(), [2, 3],
                                                STEPS)) > 0.05  # the draft's law is far
  # Keys are per row and position: the first rows are the looped drafter's tokens.
  reference = decode(looped, 2000)
  np.testing.assert_array_equal(result.tokens[:2000], reference.tokens)
  np.testing.assert_array_equal(result.target_calls[:2000], reference.target_calls)
  if name == "model":  # three draft calls a round, where the loop made two at most
    np.testing.assert_array_equal(result.draft_calls, 3 * result.target_calls)
    assert np.all(np.asarray(reference.draft_calls) <= 2 * np.asarray(reference.target_calls))


def test_joint_exact_with_prompt_lookup_and_encoder_decoder(tables):
  target_table, _ = tables
  model = TableModel(V, encoder_decoder=True)
  inputs = np.ones((N, 3), np.int32)
  config = DecodeConfig(eos_id=NO_EOS, cache_len=16)
  drafter = PromptLookupDrafter(vocab=V, max_gamma=3, max_ngram=2)
  result = speculative_decode(model, target_table, drafter, None, inputs, max_new_tokens=STEPS,
                              gamma=3, rng=jax.random.PRNGKey(1), config=config)
  assert _joint_tv(result.tokens, exact_joint(np.asarray(target_table), Sampling(), [0], STEPS)) < 0.01


# --------------------------------------------------------------------------- greedy


def _prompts(batch=16, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, 9, size=batch)
  prompts = np.zeros((batch, 8), np.int32)
  for b, n in enumerate(lengths):
    prompts[b, :n] = rng.integers(1, V, size=n)  # 0 is padding
  return prompts, lengths


def _drafters(draft_table, max_gamma):
  corpus = [np.random.default_rng(3).integers(0, V, size=200)]
  unigram = UnigramDrafter(corpus, V, max_gamma=max_gamma)
  bigram = BigramDrafter(corpus, V, max_gamma=max_gamma)
  return {
      "model": (ModelDrafter(TableModel(V), max_gamma=max_gamma), draft_table),
      "unigram": unigram,
      "bigram": bigram,
      "prompt_lookup": (PromptLookupDrafter(vocab=V, max_gamma=max_gamma), None),
  }


@pytest.mark.parametrize("name", ["model", "unigram", "bigram", "prompt_lookup"])
def test_greedy_speculative_equals_autoregressive(tables, name):
  target_table, draft_table = tables
  prompts, lengths = _prompts()
  config = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=1, cache_len=64)
  reference = autoregressive_decode(TableModel(V), target_table, prompts, max_new_tokens=20,
                                    rng=jax.random.PRNGKey(0), config=config,
                                    prompt_lengths=lengths)
  assert np.any(np.asarray(reference.lengths) < 20), "some row should stop at EOS"
  drafter, params = _drafters(draft_table, 7)[name]
  for gamma in (1, 3, 7):
    result = speculative_decode(TableModel(V), target_table, drafter, params, prompts,
                                max_new_tokens=20, gamma=gamma, rng=jax.random.PRNGKey(0),
                                config=config, prompt_lengths=lengths)
    np.testing.assert_array_equal(result.tokens, reference.tokens, err_msg=f"γ={gamma}")
    np.testing.assert_array_equal(result.lengths, reference.lengths)
    np.testing.assert_array_equal(np.asarray(result.accepted_hist).sum(1), result.target_calls)


def test_call_counts_with_draft_equal_to_target(tables):
  target_table, _ = tables
  prompts, lengths = _prompts()
  gamma = 3
  config = DecodeConfig(eos_id=NO_EOS, cache_len=64)
  result = speculative_decode(TableModel(V), target_table, ModelDrafter(TableModel(V), 3),
                              target_table, prompts, max_new_tokens=4 * (gamma + 1) * 3,
                              gamma=gamma, rng=jax.random.PRNGKey(4), config=config,
                              prompt_lengths=lengths)
  np.testing.assert_array_equal(result.lengths, 48)
  np.testing.assert_array_equal(result.target_calls, 12)  # 48 tokens / (γ + 1)
  np.testing.assert_array_equal(result.draft_calls, 12 * gamma)
  np.testing.assert_array_equal(np.asarray(result.accepted_hist)[:, gamma], 12)
  np.testing.assert_allclose(result.alpha, 1.0, rtol=1e-6)
  np.testing.assert_allclose(result.tokens_per_call, gamma + 1)


def test_budget_ends_a_row_mid_draft(tables):
  target_table, _ = tables
  prompts, lengths = _prompts(batch=4)
  config = DecodeConfig(eos_id=NO_EOS, cache_len=64)
  result = speculative_decode(TableModel(V), target_table, ModelDrafter(TableModel(V), 7),
                              target_table, prompts, max_new_tokens=10, gamma=7,
                              rng=jax.random.PRNGKey(4), config=config, prompt_lengths=lengths)
  np.testing.assert_array_equal(result.lengths, 10)  # 8 + 2 of the next 8
  np.testing.assert_array_equal(result.target_calls, 2)
  assert result.tokens.shape == (4, 10)


def test_same_seed_same_tokens_and_row_independent_of_batch(tables):
  target_table, draft_table = tables
  prompts, lengths = _prompts()
  drafter = ModelDrafter(TableModel(V), max_gamma=3)
  config = DecodeConfig(eos_id=1, cache_len=64)
  keys = jax.random.split(jax.random.PRNGKey(5), len(prompts))
  run = lambda p, l, k: speculative_decode(TableModel(V), target_table, drafter, draft_table, p,
                                           max_new_tokens=12, gamma=3, rng=k, config=config,
                                           prompt_lengths=l)
  first, second = run(prompts, lengths, keys), run(prompts, lengths, keys)
  np.testing.assert_array_equal(first.tokens, second.tokens)
  for b in (0, 7, 15):
    alone = run(prompts[b:b + 1], lengths[b:b + 1], keys[b:b + 1])
    np.testing.assert_array_equal(alone.tokens[0], first.tokens[b])
  other = run(prompts, lengths, jax.random.split(jax.random.PRNGKey(6), len(prompts)))
  assert not np.array_equal(other.tokens, first.tokens)


def test_gamma_and_budget_are_data_not_recompiled(tables):
  target_table, draft_table = tables
  prompts, lengths = _prompts(batch=2)
  drafter = ModelDrafter(TableModel(V), max_gamma=5)
  config = DecodeConfig(eos_id=NO_EOS, cache_len=32)
  before = runner.run_loop._cache_size()
  for gamma, budget in [(1, 5), (3, 9), (5, 7)]:
    speculative_decode(TableModel(V), target_table, drafter, draft_table, prompts,
                       max_new_tokens=budget, gamma=gamma, rng=jax.random.PRNGKey(0),
                       config=config, prompt_lengths=lengths)
  assert runner.run_loop._cache_size() == before + 1


def test_one_compile_per_static_config(tables):
  """γ, max_new_tokens, rng and new inputs of the same padded shape reuse the compiled loops."""
  target_table, draft_table = tables
  drafter = ModelDrafter(TableModel(V), max_gamma=4)
  config = DecodeConfig(eos_id=NO_EOS, cache_len=40)
  before = runner.run_loop._cache_size()  # the one whole-loop function of every loop
  rng = np.random.default_rng(3)
  for i, (gamma, budget) in enumerate([(1, 6), (4, 11), (2, 3)]):
    prompts = rng.integers(2, V, size=(3, 5)).astype(np.int32)
    lengths = np.array([5, 2 + i, 4], np.int32)
    speculative_decode(TableModel(V), target_table, drafter, draft_table, prompts,
                       max_new_tokens=budget, gamma=gamma, rng=jax.random.PRNGKey(i),
                       config=config, prompt_lengths=lengths)
    autoregressive_decode(TableModel(V), target_table, prompts, max_new_tokens=budget,
                          rng=jax.random.PRNGKey(i), config=config, prompt_lengths=lengths)
  assert runner.run_loop._cache_size() == before + 2  # one compile each: chain, autoregressive


def test_nan_logits_are_reported(tables):
  target_table, draft_table = tables
  bad = target_table.at[0, 3].set(np.nan)  # logits after token 3 at slot 0
  with pytest.raises(ValueError, match="NaN logits"):
    autoregressive_decode(TableModel(V), bad, np.array([[3]], np.int32), max_new_tokens=2,
                          rng=jax.random.PRNGKey(0), config=DecodeConfig(eos_id=NO_EOS),
                          prompt_lengths=[1])


@pytest.mark.parametrize("kwargs, message", [
    (dict(drafter=ModelDrafter(TableModel(V + 1), 3)), "vocabularies differ"),
    (dict(gamma=0), "gamma must be an integer in"),
    (dict(gamma=4), "gamma must be an integer in"),
    (dict(prompt_lengths=[2, 0]), "empty prompt"),
    (dict(max_new_tokens=60), "beyond the cache length"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(inputs=np.array([[9, 1], [1, 1]])), "outside"),
])
def test_bad_input(tables, kwargs, message):
  target_table, draft_table = tables
  args = dict(drafter=ModelDrafter(TableModel(V), 3), gamma=3, max_new_tokens=5,
              inputs=np.array([[1, 2], [3, 0]], np.int32), prompt_lengths=None)
  args.update(kwargs)
  with pytest.raises(ValueError, match=message):
    speculative_decode(TableModel(V), target_table, args["drafter"], draft_table, args["inputs"],
                       max_new_tokens=args["max_new_tokens"], gamma=args["gamma"],
                       rng=jax.random.PRNGKey(0), config=DecodeConfig(cache_len=32),
                       prompt_lengths=args["prompt_lengths"])


def test_trace_replays_the_output(tables):
  target_table, draft_table = tables
  prompts, lengths = _prompts(batch=3)
  config = DecodeConfig(eos_id=NO_EOS, cache_len=64, trace=True)
  result = speculative_decode(TableModel(V), target_table, ModelDrafter(TableModel(V), 4),
                              draft_table, prompts, max_new_tokens=15, gamma=3,
                              rng=jax.random.PRNGKey(2), config=config, prompt_lengths=lengths)
  trace = result.trace
  for b in range(3):
    replay = []
    for r in range(int(result.target_calls[b])):
      n = int(trace.accepted[b, r])
      replay += list(np.asarray(trace.guesses[b, r, :n])) + [int(trace.correction[b, r])]
    assert replay[:15] == list(np.asarray(result.tokens[b]))
    assert np.all(np.asarray(trace.accepted[b]) <= 3)


@pytest.mark.parametrize("policy", ["heuristic", "optimal"])
def test_adaptive_gamma_stays_exact_greedy_and_compiles_once(tables, policy):
  target_table, draft_table = tables
  prompts, lengths = _prompts()
  greedy = Sampling(temperature=0.0)
  reference = autoregressive_decode(TableModel(V), target_table, prompts, max_new_tokens=20,
                                    rng=jax.random.PRNGKey(0),
                                    config=DecodeConfig(sampling=greedy, cache_len=64),
                                    prompt_lengths=lengths)
  config = DecodeConfig(sampling=greedy, cache_len=64, gamma_policy=policy, trace=True,
                        cost_coefficient=0.05)
  drafter = ModelDrafter(TableModel(V), max_gamma=7)
  before = runner.run_loop._cache_size()
  for gamma in (1, 4):
    result = speculative_decode(TableModel(V), target_table, drafter, draft_table, prompts,
                                max_new_tokens=20, gamma=gamma, rng=jax.random.PRNGKey(0),
                                config=config, prompt_lengths=lengths)
    np.testing.assert_array_equal(result.tokens, reference.tokens)
  assert runner.run_loop._cache_size() == before + 1
  used = np.asarray(result.trace.gamma)[np.asarray(result.trace.gamma) > 0]
  assert len(set(used.tolist())) > 1, "γ should adapt"
  if policy == "heuristic":  # +2 after all-accepted rounds, −1 otherwise
    g, n = np.asarray(result.trace.gamma[0]), np.asarray(result.trace.accepted[0])
    for r in range(int(result.target_calls[0]) - 1):
      want = min(g[r] + 2, 7) if n[r] == g[r] else max(g[r] - 1, 1)
      assert g[r + 1] == want


def test_adaptive_gamma_joint_is_exact(tables):
  target_table, draft_table = tables
  prompt = np.array([[2, 3]] * N, np.int32)
  config = DecodeConfig(eos_id=NO_EOS, cache_len=16, gamma_policy="heuristic")
  result = speculative_decode(TableModel(V), target_table, ModelDrafter(TableModel(V), 3),
                              draft_table, prompt, max_new_tokens=STEPS, gamma=1,
                              rng=jax.random.PRNGKey(3), config=config)
  assert _joint_tv(result.tokens, exact_joint(np.asarray(target_table), Sampling(), [2, 3],
                                              STEPS)) < 0.01


def test_fused_verifier_in_the_loop_draws_the_reference_tokens(tables):
  from specjax.verify import FusedVerifier, SigmoidApproxVerifierNotExact
  target_table, draft_table = tables
  prompts, lengths = _prompts()
  run = lambda verifier: speculative_decode(
      TableModel(V), target_table, ModelDrafter(TableModel(V), 3), draft_table, prompts,
      max_new_tokens=12, gamma=3, rng=jax.random.PRNGKey(8), prompt_lengths=lengths,
      config=DecodeConfig(eos_id=NO_EOS, cache_len=64, verifier=verifier))
  reference = run(ReferenceVerifier())
  np.testing.assert_array_equal(run(FusedVerifier(tile=128)).tokens, reference.tokens)
  # The sigmoid approximation (NOT exact) accepts almost every guess.
  sigmoid = run(SigmoidApproxVerifierNotExact())
  assert np.mean(sigmoid.tokens_per_call) > np.mean(reference.tokens_per_call)


def test_pooled_alpha_weighs_rows_by_their_verified_positions():
  """Σ alpha_sum / Σ alpha_count over the rows (not the mean of the rows' α), 0 with none."""
  zeros = jnp.zeros((2,), jnp.int32)
  result = DecodeResult(tokens=jnp.zeros((2, 1), jnp.int32), lengths=zeros, target_calls=zeros,
                        draft_calls=zeros, accepted_hist=jnp.zeros((2, 2), jnp.int32),
                        alpha_sum=jnp.array([3.0, 0.5]), alpha_count=jnp.array([4, 1]))
  assert result.pooled_alpha == pytest.approx(3.5 / 5)  # the rows' mean α would be 0.625
  none = result.replace(alpha_sum=jnp.zeros((2,)), alpha_count=zeros)
  assert none.pooled_alpha == 0.0
