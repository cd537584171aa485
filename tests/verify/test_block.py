"""Tests for block verification (Sun et al., ICLR 2025, Algorithm 2).

- The algorithm's math, exactly (no sampling): `_step_law` enumerates one step's
  output law (the backward pass with h_i) for per-position tables; it equals the
  target's law to float64 rounding, and its E[τ] equals the forward formula of
  `analysis.expected_accepted_block`.
- Never worse, computed: block E[τ] ≥ token E[n] on 1,200 random blocks; 11/9 vs 10/9
  on the paper's binary example.
- Exactness of the jitted verifier, sampled: one step over 15 (p, q, γ) cases and the
  whole loop's first three tokens with table models, against exact enumerations. The
  loop test also guards `fresh_round_keys`: with keys tied only to (row, position,
  stream) the joint of model_T1_g2 measured TV 0.027 from the target (bound 0.013).

Power. Each sampled law is checked against a bound from the multinomial null: for N
draws from a law P, E[TV(empirical, P)] ≤ ½ Σ_k sqrt(P_k (1 − P_k) / N) (Jensen), and
TV moves by at most 1/N per draw, so by McDiarmid P(TV > E + t) ≤ exp(−2 N t²); with
t = sqrt(ln(10⁶) / 2N) a correct sampler fails a check with probability < 10⁻⁶. A
sampler whose law R is d away from P is at least d − bound(R) away from it, so it fails
once d > bound(P) + bound(R) ≈ 2·bound; at N = 200,000 that is d ≈ 0.02 for a
first-token law over V = 8 and ≈ 0.03 for the 64-outcome joints. The tests check that
plausible wrong answers (the draft's own law; block verification with Algorithm 1's
residual max(0, P − Q) instead of max(0, w P − Q)) lie beyond that distance.
"""
import functools
import itertools
import pathlib

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import analysis
from specjax.app import gin_config  # noqa: F401  (gin_config registers BlockVerifier)
from specjax.verify import BlockVerifier
from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.draft import (BigramDrafter, ModelDrafter, PromptLookupDrafter,
                              UnigramDrafter)
from specjax.sampling import Sampling, categorical
from specjax.testing import TableModel, exact_joint, random_table
from specjax.verify import ReferenceVerifier, describe, get_verifier
from tests.conftest import SAMPLER_OPTIONS

GIN_FILE = pathlib.Path(__file__).resolve().parents[2] / "gin" / "decoding" / "verifier_block.gin"
N = 200_000
DELTA = 1e-6


def tv_bound(law, n: int = N, delta: float = DELTA) -> float:
  """A (1 − delta)-quantile bound of TV(empirical of n draws, law) (module docstring)."""
  law = np.asarray(list(law.values()) if isinstance(law, dict) else law, np.float64).ravel()
  return 0.5 * np.sqrt(law * (1 - law) / n).sum() + np.sqrt(np.log(1 / delta) / (2 * n))


def _tv(a, b) -> float:
  return 0.5 * float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).sum())


# --------------------------------------------------------- the math, enumerated in numpy


def _step_law(p, q, limit=None, residual="block"):
  """Exact law of one block-verification step for per-position tables, by enumeration.

  p [L+1, V], q [L, V] (float64). Each drafted block x ~ Π q_i gets the backward
  pass's law of τ, P(τ = i | x) = h_i Π_{j>i} (1 − h_j) (h_0 = 1), then y from the
  correction. The emitted tokens are completed to L+1 tokens with the target's own
  per-position laws (what the following rounds draw when the tables are
  context-free). residual='token' is a deliberately wrong variant (Algorithm 1's
  residual max(0, P − Q)) for the power check.
  Returns (law of the completed block [V]*(L+1), E[τ]).
  """
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  limit = q.shape[0] if limit is None else limit
  vocab = p.shape[1]
  law = np.zeros((vocab,) * (limit + 1))
  mean_tau = 0.0
  for x in itertools.product(range(vocab), repeat=limit):
    prob_x = np.prod([q[i, x[i]] for i in range(limit)])
    if prob_x == 0:
      continue
    w = [1.0]
    for i in range(limit):
      w.append(min(1.0, w[-1] * p[i, x[i]] / q[i, x[i]]))
    rows, h = [], [1.0]
    for i in range(limit):  # residual row after i accepted guesses
      scale = w[i] if residual == "block" else 1.0
      rows.append(np.maximum(scale * p[i] - q[i], 0.0))
      if i > 0:
        r = rows[i].sum()
        h.append(r / (r + 1 - w[i]) if r + 1 - w[i] > 0 else 0.0)
    h.append(w[limit])
    for tau in range(limit + 1):
      p_tau = h[tau] * np.prod([1 - h[j] for j in range(tau + 1, limit + 1)])
      if p_tau == 0:
        continue
      mean_tau += prob_x * p_tau * tau
      mass = rows[tau].sum() if tau < limit else 0.0
      y_law = rows[tau] / mass if mass > 0 else p[tau]
      rest = [p[j] for j in range(tau + 1, limit + 1)]  # the target's continuation
      tail = functools.reduce(np.multiply.outer, [y_law] + rest)
      law[x[:tau]] += prob_x * p_tau * tail
  return law, mean_tau


def _target_law(p):
  return functools.reduce(np.multiply.outer, list(np.asarray(p, np.float64)))


def _random_block(rng, vocab, gamma):
  """Per-position (p [γ+1, V], q [γ, V]) with mixed sharpness and sparse supports."""
  def rows(k):
    out = rng.dirichlet(np.full(vocab, rng.choice([0.1, 0.5, 1.0, 5.0])), size=k)
    if rng.random() < 0.3:  # top-k-like: zero out part of the vocabulary
      out = out * (rng.random(out.shape) < 0.6)
      out[:, rng.integers(vocab)] += 1e-3
      out /= out.sum(-1, keepdims=True)
    return out
  return rows(gamma + 1), rows(gamma)


def test_paper_binary_example():
  # Sun et al. §1: context-free target (1/3, 2/3), draft (2/3, 1/3), γ = 2.
  p = np.array([[1 / 3, 2 / 3]] * 3)
  q = np.array([[2 / 3, 1 / 3]] * 2)
  assert analysis.expected_accepted_token(p, q) == pytest.approx(10 / 9, abs=1e-12)
  assert analysis.expected_accepted_block(p, q) == pytest.approx(11 / 9, abs=1e-12)
  law, mean_tau = _step_law(p, q)
  assert mean_tau == pytest.approx(11 / 9, abs=1e-12)
  np.testing.assert_allclose(law, _target_law(p), atol=1e-12)


def test_step_law_is_the_target_law_and_matches_the_forward_formula():
  rng = np.random.default_rng(1)
  for case in range(60):
    vocab, gamma = [(2, 4), (3, 3), (4, 2), (5, 2), (3, 1)][case % 5]
    p, q = _random_block(rng, vocab, gamma)
    law, mean_tau = _step_law(p, q)
    assert _tv(law, _target_law(p)) < 1e-9, case
    assert mean_tau == pytest.approx(analysis.expected_accepted_block(p, q), abs=1e-9)
  # The wrong residual is not exact: the enumeration can tell.
  p, q = _random_block(np.random.default_rng(3), 3, 3)
  assert _tv(_step_law(p, q, residual="token")[0], _target_law(p)) > 0.01


def test_block_is_never_worse_than_token_verification():
  rng = np.random.default_rng(0)
  gains = []
  for case in range(1200):
    vocab, gamma = int(rng.integers(2, 9)), int(rng.integers(1, 6))
    p, q = _random_block(rng, vocab, gamma)
    block, token = analysis.expected_accepted_block(p, q), analysis.expected_accepted_token(p, q)
    assert block >= token - 1e-12, (case, block, token)
    assert block <= gamma + 1e-12
    if gamma == 1:  # one guess: the two verifiers coincide
      assert block == pytest.approx(token, abs=1e-12)
    gains.append(block - token)
  assert np.mean(np.asarray(gains) > 1e-9) > 0.5  # usually strictly better


def test_analysis_bad_input():
  p, q = np.full((3, 4), 0.25), np.full((2, 4), 0.25)
  with pytest.raises(ValueError, match="p must have shape"):
    analysis.expected_accepted_block(p[:1], q)
  with pytest.raises(ValueError, match="q must have shape"):
    analysis.expected_accepted_token(p, q[0])
  with pytest.raises(ValueError, match="probability rows"):
    analysis.expected_accepted_block(p * 2, q)
  rng = np.random.default_rng(0)
  p, q = rng.dirichlet(np.ones(40), 7), rng.dirichlet(np.ones(40), 6)
  with pytest.raises(ValueError, match="max_states"):
    analysis.expected_accepted_block(p, q, max_states=10_000)


# ------------------------------------------------------- one step of the jitted verifier

G, VMAX = 6, 8  # static max γ and vocabulary of the sampled one-step cases


def _softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _pad(x, rows, vocab=VMAX):
  out = np.zeros((rows, vocab))
  out[:x.shape[0], :x.shape[1]] = x
  return out


def _step_cases():
  """(name, p [G+1, VMAX], q [G, VMAX], L): L = num_guesses; rows beyond L are junk."""
  rng = np.random.default_rng(7)
  soft = lambda k, s=1.5: _softmax(rng.normal(size=(k, VMAX)) * s)
  std = lambda sampling, z: np.array(jax.jit(sampling.probs)(np.float32(z)), np.float64)
  cases = []

  def add(name, p, q, limit):
    p, q = _pad(p, G + 1), _pad(q, G)
    junk = soft(G + 1)
    p[limit + 1:] = junk[limit + 1:]  # the target's rows past the block: never read
    q[limit:] = 0.0  # the draft's rows past its γ are zeros in the loop
    cases.append((name, p, q, limit))

  add("random_L6", soft(7), soft(6), 6)
  add("random_L2", soft(3), soft(2), 2)
  add("random_L1", soft(2), soft(1), 1)
  half = np.repeat([[1.0, 0.0]], 4, axis=1).reshape(1, VMAX) / 4
  disjoint_p, disjoint_q = soft(5), soft(4)
  disjoint_p[0], disjoint_q[0] = half, half[:, ::-1]
  add("disjoint_first", disjoint_p, disjoint_q, 4)
  onehot_q = soft(3)
  onehot_q[0] = np.eye(VMAX)[6]
  first_half = soft(4)
  first_half[0] = half
  add("q_one_hot_outside_p", first_half, onehot_q, 3)
  peaked, near_zero = soft(5), soft(4)
  peaked[0] = 0.02
  peaked[0, 2] = 1 - 0.02 * (VMAX - 1)
  near_zero[0] = 1 / VMAX
  near_zero[0, 2] = 1e-7
  near_zero[0] /= near_zero[0].sum()
  add("near_zero_q", peaked, near_zero, 4)
  add("p_one_hot", np.eye(VMAX)[[3, 1, 5]], soft(2), 2)
  same = soft(7)
  add("q_equals_p", same, same[:6], 6)
  z_p = rng.normal(size=(6, VMAX)) * 1.5
  z_q = z_p[:5] + rng.normal(size=(5, VMAX))
  add("top_k3", std(Sampling(top_k=3), z_p), std(Sampling(top_k=3), z_q), 5)
  add("top_p0.8_temp0.7", std(Sampling(temperature=0.7, top_p=0.8), z_p),
      std(Sampling(temperature=0.7, top_p=0.8), z_q), 4)
  add("uniform_p_peaked_q", np.full((7, VMAX), 1 / VMAX), soft(6, 4.0), 6)
  add("peaked_p_uniform_q", soft(7, 4.0), np.full((6, VMAX), 1 / VMAX), 6)
  # Small vocabularies: the whole completed block's law is checked.
  binary_p, binary_q = np.array([[1 / 3, 2 / 3]] * 3), np.array([[2 / 3, 1 / 3]] * 2)
  add("paper_binary", binary_p, binary_q, 2)
  small = lambda k: rng.dirichlet(np.full(3, 0.7), size=k)
  add("v3_L3", small(4), small(3), 3)
  v3p, v3q = small(3), small(2)
  v3q[1, 0] = 0.0
  v3q[1] /= v3q[1].sum()
  add("v3_L2_sparse", v3p, v3q, 2)
  return cases


def _inverse_cdf(u, probs):
  """Draws from each row of probs [R, V] with uniforms u [n, R] -> int32 [n, R].

  Never returns a zero-probability token of a row with mass (float cumsums may end
  below 1: u beyond the end goes to the row's last token with mass).
  """
  cdf = jnp.cumsum(probs, -1)
  last = probs.shape[-1] - 1 - jnp.argmax(probs[:, ::-1] > 0, axis=-1)
  return jnp.minimum(jnp.sum(u[..., None] >= cdf, -1), last).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("verifier", "n"), compiler_options=SAMPLER_OPTIONS)
def _sample_steps(verifier, key, p, q, limits, n):
  """For each case: n rows of draft-from-q, verify, complete with the target's rows.

  p [C, G+1, V], q [C, G, V], limits int32 [C] -> (τ int32 [C, n], completed int8 [C, n, G+1]).
  One jit call: cases run under lax.map, rows under vmap.
  """

  def case(args):
    p, q, limit, key = args
    kd, ku, kc, kz = jax.random.split(key, 4)
    x = _inverse_cdf(jax.random.uniform(kd, (n, G)), q)  # the drafts, x_i ~ q_i
    z = _inverse_cdf(jax.random.uniform(kz, (n, G + 1)), p)  # the target's continuation
    step = lambda u, k, x: verifier(u, k, x, q, p, None, None, num_guesses=limit)
    tau, y = jax.vmap(step)(jax.random.uniform(ku, (n, G)), jax.random.split(kc, (n, G + 1)), x)
    j = jnp.arange(G + 1)[None, :]
    x = jnp.concatenate([x, jnp.zeros((n, 1), jnp.int32)], axis=1)
    seq = jnp.where(j < tau[:, None], x, jnp.where(j == tau[:, None], y[:, None], z))
    return tau, seq.astype(jnp.int8)

  keys = jax.random.split(key, p.shape[0])
  return jax.lax.map(case, (p, q, limits, keys))


def _marginal(samples, vocab, k):
  """Empirical law of the first k tokens: samples int [n, ≥k] -> [vocab]*k."""
  code = np.zeros(len(samples), np.int64)
  for j in range(k):
    code = code * vocab + samples[:, j]
  return (np.bincount(code, minlength=vocab ** k) / len(samples)).reshape((vocab,) * k)


@pytest.fixture(scope="module")
def step_samples():
  cases = _step_cases()
  p = jnp.asarray(np.stack([c[1] for c in cases]), jnp.float32)
  q = jnp.asarray(np.stack([c[2] for c in cases]), jnp.float32)
  limits = jnp.asarray([c[3] for c in cases], jnp.int32)
  tau, seq = _sample_steps(BlockVerifier(), jax.random.PRNGKey(0), p, q, limits, N)
  return cases, np.asarray(tau), np.asarray(seq)


def test_one_step_law_is_the_target_law(step_samples):
  cases, taus, seqs = step_samples
  for (name, p, q, limit), tau, seq in zip(cases, taus, seqs):
    vocab = int(np.max(np.nonzero(p[:limit + 1].sum(0) + q[:limit].sum(0))[0])) + 1
    assert np.all((tau >= 0) & (tau <= limit)), name
    # The first token's law (V ≤ 8 outcomes) ...
    first = np.bincount(seq[:, 0], minlength=VMAX)[:vocab] / N
    assert _tv(first, p[0, :vocab]) < tv_bound(p[0, :vocab]), name
    # ... and the joint of the first k tokens (all L+1 when V^(L+1) ≤ 100).
    k = max(j for j in range(1, limit + 2) if vocab ** j <= 100)
    target = _target_law(p[:k, :vocab])
    got = _marginal(seq, vocab, k)
    assert _tv(got, target) < tv_bound(target), f"{name}: joint of {k} tokens"
    # The mean accepted count is the analysis' exact value (5 standard errors: σ ≤ L/2).
    expected = analysis.expected_accepted_block(p[:limit + 1, :vocab], q[:limit, :vocab])
    assert abs(tau.mean() - expected) < 5 * tau.std() / np.sqrt(N) + 1e-4, name


def test_one_step_power(step_samples):
  cases, _, seqs = step_samples
  by_name = {c[0]: c for c in cases}
  # The draft's own first-token law is far beyond the bound on the random case ...
  _, p, q, _ = by_name["random_L6"]
  assert _tv(q[0], p[0]) > 2 * tv_bound(p[0])
  # ... and so is the wrong residual's law of the whole small block.
  name, p, q, limit = by_name["v3_L3"]
  law, _ = _step_law(p[:limit + 1, :3], q[:limit, :3])
  wrong, _ = _step_law(p[:limit + 1, :3], q[:limit, :3], residual="token")
  np.testing.assert_allclose(law, _target_law(p[:limit + 1, :3]), atol=1e-12)
  assert _tv(wrong, law) > 2 * tv_bound(law)


def test_block_accepts_more_than_reference_on_the_sampled_cases(step_samples):
  cases, taus, _ = step_samples
  for (name, p, q, limit), tau in zip(cases, taus):
    token = analysis.expected_accepted_token(p[:limit + 1], q[:limit])
    assert tau.mean() > token - 5 * tau.std() / np.sqrt(N) - 1e-4, name
  binary = [t for c, t in zip(cases, taus) if c[0] == "paper_binary"][0]
  assert abs(binary.mean() - 11 / 9) < 0.01 and binary.mean() > 10 / 9 + 0.08


def _rows(seed, count=3000, gamma=4, vocab=50):
  """Random one-row verifier inputs [count, ...] with drafts sampled from q."""
  rng = np.random.default_rng(seed)
  z_p = rng.normal(size=(count, gamma + 1, vocab)).astype(np.float32) * 2
  z_q = z_p[:, :gamma] + rng.normal(size=(count, gamma, vocab)).astype(np.float32)
  return _make_rows(jax.random.PRNGKey(seed), z_p, z_q)


@jax.jit
def _make_rows(key, z_p, z_q):
  k = jax.random.split(key, 3)
  count, gamma = z_q.shape[:2]
  return dict(u=jax.random.uniform(k[1], (count, gamma)),
              keys=jax.random.split(k[2], (count, gamma + 1)),
              x=jax.random.categorical(k[0], z_q).astype(jnp.int32),
              q=jax.nn.softmax(z_q, -1), p=jax.nn.softmax(z_p, -1))


@functools.partial(jax.jit, static_argnames=("verifier",))
def _verify_rows(verifier, rows, limit):
  fn = lambda u, k, x, q, p: verifier(u, k, x, q, p, None, None, num_guesses=limit)
  return jax.vmap(fn)(rows["u"], rows["keys"], rows["x"], rows["q"], rows["p"])


def test_one_guess_is_algorithm_one_bit_for_bit():
  rows = _rows(0)
  n, token = _verify_rows(BlockVerifier(), rows, 1)
  ref_n, ref_token = _verify_rows(ReferenceVerifier(), rows, 1)
  np.testing.assert_array_equal(n, ref_n)
  np.testing.assert_array_equal(token, ref_token)
  assert 0 < np.mean(np.asarray(n)) < 1
  # With longer blocks the two differ (they agree in law, not draw by draw), and block
  # verification accepts more on average.
  n4, _ = _verify_rows(BlockVerifier(), rows, 4)
  ref4, _ = _verify_rows(ReferenceVerifier(), rows, 4)
  assert np.mean(np.asarray(n4)) > np.mean(np.asarray(ref4))


def test_ignores_guesses_past_num_guesses():
  rows = _rows(1)
  n, token = _verify_rows(BlockVerifier(), rows, 2)
  junk = dict(rows, x=rows["x"].at[:, 2:].set(7), q=rows["q"].at[:, 2:].set(0.0),
              p=rows["p"].at[:, 3:].set(jnp.nan))
  n_junk, token_junk = _verify_rows(BlockVerifier(), junk, 2)
  np.testing.assert_array_equal(n, n_junk)
  np.testing.assert_array_equal(token, token_junk)
  assert np.all(np.asarray(n) <= 2)


# ------------------------------------------------------------- the whole decode loop

VL, STEPS, NO_EOS = 4, 3, -1  # the loop tests' vocabulary, tokens checked, no EOS


@pytest.fixture(scope="module")
def tables():
  return random_table(1, VL), random_table(2, VL, sharpness=1.0)


def _joint_tv(tokens, law):
  """TV between the empirical law of the first STEPS tokens [N, ≥STEPS] and law {tuple: p}."""
  got = _marginal(np.asarray(tokens)[:, :STEPS], VL, STEPS)
  return 0.5 * sum(abs(got[k] - p) for k, p in law.items())


def _ngram(kind, max_gamma):
  corpus = [np.random.default_rng(3).integers(0, VL, size=200)]
  make = UnigramDrafter if kind == "unigram" else BigramDrafter
  return make(corpus, VL, max_gamma=max_gamma)


LOOP_CASES = {
    # name: (sampling, drafter kind, γ, gamma_policy)
    "model_T1_g2": (Sampling(), "model", 2, "constant"),
    "model_topk2_adaptive": (Sampling(top_k=2), "model", 1, "heuristic"),
    "bigram_topp0.8_T0.7_g3": (Sampling(temperature=0.7, top_p=0.8), "bigram", 3, "constant"),
    "prompt_lookup_encdec_g3": (Sampling(), "prompt_lookup", 3, "constant"),
}


def _loop(tables, name):
  """Runs LOOP_CASES[name] over N rows -> (DecodeResult, exact law of 3 tokens, draft law)."""
  target_table, draft_table = tables
  sampling, kind, gamma, policy = LOOP_CASES[name]
  config = DecodeConfig(sampling=sampling, eos_id=NO_EOS, cache_len=16, gamma_policy=policy,
                        verifier=BlockVerifier())
  if kind == "prompt_lookup":
    model, prefix = TableModel(VL, encoder_decoder=True), [0]
    inputs = np.tile(np.array([[1, 2, 1, 3]], np.int32), (N, 1))
    drafter, params = PromptLookupDrafter(vocab=VL, max_gamma=3, max_ngram=2), None
  else:
    model, prefix = TableModel(VL), [2, 3]
    inputs = np.array([[2, 3]] * N, np.int32)
    if kind == "model":
      drafter, params = ModelDrafter(TableModel(VL), max_gamma=3), draft_table
    else:
      drafter, params = _ngram(kind, 3)
  result = speculative_decode(model, target_table, drafter, params, inputs,
                              max_new_tokens=STEPS, gamma=gamma, rng=jax.random.PRNGKey(11),
                              config=config)
  law = exact_joint(np.asarray(target_table), sampling, prefix, STEPS)
  draft_law = exact_joint(np.asarray(draft_table), sampling, prefix, STEPS)
  return result, law, draft_law


@pytest.mark.parametrize("name", list(LOOP_CASES))
def test_loop_joint_of_first_three_tokens_is_the_target(tables, name):
  result, law, draft_law = _loop(tables, name)
  assert _joint_tv(result.tokens, law) < tv_bound(law), name
  assert np.asarray(result.accepted_hist)[:, 2:].sum() > N // 20  # blocks of 2+ accepted
  if LOOP_CASES[name][1] == "model":  # power: the draft's own law is beyond twice the bound
    assert 0.5 * sum(abs(draft_law[k] - law[k]) for k in law) > 2 * tv_bound(law)


def _prompts(batch=16, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, 9, size=batch)
  prompts = np.zeros((batch, 8), np.int32)
  for b, n in enumerate(lengths):
    prompts[b, :n] = rng.integers(1, VL, size=n)
  return prompts, lengths


def test_greedy_with_block_equals_autoregressive(tables):
  # At temperature 0 the loop takes exact argmax matching for every exact verifier
  # (tests/decode/test_decoding.py runs it with every drafter); this checks block is routed there.
  target_table, draft_table = tables
  prompts, lengths = _prompts()
  greedy = Sampling(temperature=0.0)
  reference = autoregressive_decode(TableModel(VL), target_table, prompts, max_new_tokens=20,
                                    rng=jax.random.PRNGKey(0),
                                    config=DecodeConfig(sampling=greedy, eos_id=1, cache_len=64),
                                    prompt_lengths=lengths)
  assert np.any(np.asarray(reference.lengths) < 20), "some row should stop at EOS"
  drafter = ModelDrafter(TableModel(VL), max_gamma=7)
  config = DecodeConfig(sampling=greedy, eos_id=1, cache_len=64, verifier=BlockVerifier())
  for gamma in (1, 3, 7):
    result = speculative_decode(TableModel(VL), target_table, drafter, draft_table, prompts,
                                max_new_tokens=20, gamma=gamma, rng=jax.random.PRNGKey(0),
                                config=config, prompt_lengths=lengths)
    np.testing.assert_array_equal(result.tokens, reference.tokens, err_msg=f"γ={gamma}")
    np.testing.assert_array_equal(result.lengths, reference.lengths)
    assert np.asarray(result.accepted_hist)[:, 1:].sum() > 0


def test_loop_rows_do_not_depend_on_their_batch(tables):
  target_table, draft_table = tables
  prompts, lengths = _prompts()
  drafter = ModelDrafter(TableModel(VL), max_gamma=3)
  config = DecodeConfig(eos_id=NO_EOS, cache_len=64, verifier=BlockVerifier())
  keys = jax.random.split(jax.random.PRNGKey(5), len(prompts))
  run = lambda rows: speculative_decode(TableModel(VL), target_table, drafter, draft_table,
                                        prompts[rows], max_new_tokens=12, gamma=3,
                                        rng=keys[rows], config=config,
                                        prompt_lengths=lengths[rows])
  full = run(np.arange(16))
  # Another batch of the same shape (one compile): rows moved, repeated and neighbours changed.
  rows = np.array([9, 4, 4, 0, 15, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13])
  np.testing.assert_array_equal(run(rows).tokens, np.asarray(full.tokens)[rows])
  assert len({tuple(t) for t in np.asarray(full.tokens).tolist()}) > 8


# ------------------------------------------------------------- errors, registry, gin


def test_lenience_other_than_one_is_refused(tables):
  args = (jnp.zeros(2), jax.random.split(jax.random.PRNGKey(0), 3), jnp.zeros(2, jnp.int32),
          jnp.full((2, 4), 0.25), jnp.full((3, 4), 0.25), None, None)
  for lenience in (0.5, jnp.float32(0.9)):
    with pytest.raises(ValueError, match="lenience = 1 only"):
      BlockVerifier()(*args, lenience=lenience)
  with pytest.raises(ValueError, match="traced"):
    jax.jit(lambda l: BlockVerifier()(*args, lenience=l))(1.0)
  n, _ = BlockVerifier()(*args, lenience=1.0)
  assert 0 <= int(n) <= 2
  target_table, draft_table = tables
  with pytest.raises(ValueError, match="lenience = 1 only"):
    speculative_decode(TableModel(VL), target_table, ModelDrafter(TableModel(VL), 2), draft_table,
                       np.array([[2, 3]], np.int32), max_new_tokens=4, gamma=2,
                       rng=jax.random.PRNGKey(0),
                       config=DecodeConfig(lenience=0.5, cache_len=16, verifier=BlockVerifier()))
  # At T = 0 the loop's argmax lenience would bypass the verifier: refused up front too.
  for temperature in (0.0, 1.0):
    with pytest.raises(ValueError, match="block verifier supports lenience = 1 only"):
      DecodeConfig(sampling=Sampling(temperature=temperature), lenience=0.5,
                   verifier=BlockVerifier())


def _probe(verifier=None):
  return verifier


def test_registry_and_gin_file():
  assert isinstance(get_verifier("block"), BlockVerifier)
  assert describe(get_verifier("block")) == "block (exact)"
  try:
    probe = gin.external_configurable(_probe, "specjax_test_block_verifier_probe")
  except ValueError:
    probe = gin.get_configurable("specjax_test_block_verifier_probe")
  gin.clear_config()
  try:
    gin.parse_config(GIN_FILE.read_text() + "\nspecjax_test_block_verifier_probe.verifier = "
                     "%VERIFIER\n")
    assert isinstance(probe(), BlockVerifier)
  finally:
    gin.clear_config()



def test_default_verifier_is_block_at_positive_temperature_only():
  from specjax.verify import ReferenceVerifier, default_verifier  # pylint: disable=import-outside-toplevel
  assert isinstance(default_verifier(Sampling(temperature=1.0)), BlockVerifier)
  assert isinstance(default_verifier(Sampling(temperature=0.7, top_k=5)), BlockVerifier)
  assert isinstance(default_verifier(Sampling(temperature=0.0)), ReferenceVerifier)
  assert isinstance(default_verifier(Sampling(temperature=1.0), lenience=0.5), ReferenceVerifier)
