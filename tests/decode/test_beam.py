"""Tests for beam search (T5X semantics) and speculative beam search (paper A.4)."""
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.app import gin_config
from specjax.decode import NEG_INF, beam_search, speculative_beam_search
from specjax.models import T5Config, T5Model
from specjax.testing import TableModel, random_table

V = 12
MAX_NEW = 10
GAMMA = 3
REAL = NEG_INF / 2  # scores above this belong to real beams, below to T5X's filler slots


# ------------------------------------------------------- T5X semantics, worked by hand

# A bigram table over 4 tokens: 0 = start/pad, 1 = EOS, 2 = "a", 3 = "b".
# P(next | prev) does not depend on the token before prev.
TOY = {0: [0.05, 0.15, 0.50, 0.30],   # after the start token
       1: [0.25, 0.25, 0.25, 0.25],   # after EOS (never extended)
       2: [0.02, 0.90, 0.04, 0.04],   # after "a": EOS is likely
       3: [0.02, 0.10, 0.50, 0.38]}   # after "b"


def _toy_model():
  table = np.zeros((4, 4, 4), np.float32)
  for prev, probs in TOY.items():
    table[:, prev, :] = np.log(probs)
  return TableModel(4, encoder_decoder=True), jnp.asarray(table)


def _bp(length, alpha=0.6):
  return ((5.0 + length) / 6.0) ** alpha


def test_beam_search_follows_t5x_on_a_hand_worked_example():
  """w = 2, alpha = 0.6, max_new_tokens = 4; log p written L(x) below.

  Step 1 (live: the start token, log p 0). The 2w = 4 best extensions are
  a (L.5), b (L.3), EOS (L.15), pad (L.05). The live beams are a, b (EOS is
  masked out of the live set); "EOS" alone is finished with score L.15 / bp(1)
  = -1.897 (bp(1) = 1). One finished slot is still filler: no stop.
  Step 2. Extensions: a EOS (L.5 + L.9 = -0.799), b a (-1.897), b b (-2.172),
  b EOS (-3.507), then a a = a b = -3.912. Live: b a, b b. New finished:
  a EOS -0.799 / bp(2) = -0.728, b EOS -3.197. Finished: {a EOS, EOS}.
  Stop test: worst finished -1.897 vs best live -1.897 / bp(4 + 1) = -1.396:
  a live beam could still win, continue.
  Step 3. Extensions: b a EOS (-2.002), b b a (-2.865), b b b (-3.140),
  b b EOS (-4.474). Finished candidates: b a EOS -2.002 / bp(3) = -1.685, which
  now beats EOS (-1.897) although its raw log p is lower (the brevity
  penalty), and b b EOS. Finished: {a EOS, b a EOS}.
  Stop test: worst finished -1.685 > best live -2.865 / bp(5) = -2.108: stop
  after 3 target calls although the budget allows 4.
  Output: finished beams best first, with their penalized scores.
  """
  model, table = _toy_model()
  result = beam_search(model, table, np.array([[3]], np.int32), beam_size=2,
                       max_new_tokens=4, alpha=0.6, eos_id=1)
  lp = np.log
  np.testing.assert_array_equal(result.sequences[0], [[2, 1, 0, 0], [3, 2, 1, 0]])
  np.testing.assert_allclose(result.scores[0], [(lp(.5) + lp(.9)) / _bp(2),
                                                (lp(.3) + lp(.5) + lp(.9)) / _bp(3)], rtol=1e-5)
  np.testing.assert_array_equal(result.lengths[0], [2, 3])
  assert int(result.target_calls[0]) == 3
  # With a budget of 2 steps the search ends before "b a EOS" exists: {a EOS, EOS}.
  short = beam_search(model, table, np.array([[1]], np.int32), beam_size=2, max_new_tokens=2)
  np.testing.assert_array_equal(short.sequences[0], [[2, 1], [1, 0]])
  np.testing.assert_allclose(short.scores[0], [(lp(.5) + lp(.9)) / _bp(2), lp(.15)], rtol=1e-5)
  assert int(short.target_calls[0]) == 2


# ------------------------------------------------- a plain-Python T5X reference

def reference_beam_search(log_table, prefix, beam_size, max_new, alpha, eos_id):
  """T5X's beam search on a TableModel, one example, in float64 Python lists.

  Returns the best-first list of (score, generated tokens, finished flag) and
  the number of steps (target calls).
  """
  log_table = np.asarray(log_table, np.float64)
  log_table = log_table - np.log(np.exp(log_table).sum(-1, keepdims=True))
  live = [(0.0, list(prefix))] + [(NEG_INF, list(prefix))] * (beam_size - 1)
  finished = [(NEG_INF, [], False)] * beam_size
  steps = 0
  while steps < max_new:
    best_live = max(lp for lp, _ in live) / _bp(max_new + 1, alpha)
    if all(flag for _, _, flag in finished) and min(s for s, _, _ in finished) > best_live:
      break
    candidates = []
    for lp, seq in live:
      prev2 = seq[-2] if len(seq) >= 2 else 0
      for token in range(log_table.shape[-1]):
        candidates.append((lp + log_table[prev2, seq[-1], token], seq + [token]))
    top = sorted(candidates, key=lambda c: -c[0])[:2 * beam_size]
    live = sorted([(lp + NEG_INF * (seq[-1] == eos_id), seq) for lp, seq in top],
                  key=lambda c: -c[0])[:beam_size]
    steps += 1
    new = [(lp / _bp(steps, alpha) + NEG_INF * (seq[-1] != eos_id), seq, seq[-1] == eos_id)
           for lp, seq in top]
    finished = sorted(finished + new, key=lambda c: -c[0])[:beam_size]
  if not any(flag for _, _, flag in finished):
    finished = [(lp, seq, False) for lp, seq in live]
  return [(s, seq[len(prefix):], flag) for s, seq, flag in finished], steps


def _check_against_reference(result, table, prefixes, beam_size, alpha, eos_id):
  for row, prefix in enumerate(prefixes):
    expected, steps = reference_beam_search(table, prefix, beam_size, MAX_NEW, alpha, eos_id)
    assert int(result.target_calls[row]) == steps
    for slot, (score, tokens, _) in enumerate(expected):
      if score < REAL:  # filler slot: T5X's content there is float32 noise
        assert float(result.scores[row, slot]) < REAL
        continue
      np.testing.assert_allclose(float(result.scores[row, slot]), score, rtol=1e-5, atol=1e-5)
      length = int(result.lengths[row, slot])
      assert np.asarray(result.sequences[row, slot, :length]).tolist() == tokens
      assert not np.any(result.sequences[row, slot, length:])


@pytest.fixture(scope="module")
def tables():
  target = random_table(0, V, sharpness=2.0)
  noise = np.random.default_rng(1).normal(size=target.shape) * 0.3
  return target, jax.nn.log_softmax(target + noise, axis=-1)  # a draft close to the target


@pytest.fixture(scope="module")
def prompts():
  rng = np.random.default_rng(0)
  prompts = rng.integers(2, V, size=(16, 4)).astype(np.int32)
  lengths = rng.integers(1, 5, size=16).astype(np.int32)
  return np.where(np.arange(4)[None] < lengths[:, None], prompts, 0), lengths


@pytest.mark.parametrize("beam_size,alpha,eos_id", [(1, 0.6, 1), (3, 0.6, 1), (3, 0.0, 1),
                                                    (2, 0.6, -1)],
                         ids=["greedy", "w3", "no_penalty", "never_finishes"])
def test_beam_search_matches_t5x_reference(tables, prompts, beam_size, alpha, eos_id):
  """Decoder-only prompts of 1-4 tokens; eos_id -1 exercises the live-beam fallback."""
  inputs, lengths = prompts
  result = beam_search(TableModel(V), tables[0], inputs, beam_size=beam_size,
                       max_new_tokens=MAX_NEW, alpha=alpha, eos_id=eos_id,
                       prompt_lengths=lengths)
  assert result.sequences.shape == (16, beam_size, MAX_NEW)
  assert np.all(np.diff(np.asarray(result.scores), axis=1) <= 0)  # best first
  prefixes = [list(inputs[i, :lengths[i]]) for i in range(16)]
  _check_against_reference(result, tables[0], prefixes, beam_size, alpha, eos_id)


def test_beam_search_encoder_decoder_matches_reference(tables):
  inputs = np.random.default_rng(3).integers(1, V, size=(4, 6)).astype(np.int32)
  result = beam_search(TableModel(V, encoder_decoder=True), tables[0], inputs, beam_size=2,
                       max_new_tokens=MAX_NEW)
  _check_against_reference(result, tables[0], [[0]] * 4, 2, 0.6, 1)


# ------------------------------------------------------ speculative == plain

@pytest.fixture(scope="module")
def plain():
  """beam_search results, computed once per (model, params, width) for the cases below."""
  results = {}

  def run(model, params, inputs, beam_size, **kwargs):
    key = (model, id(params), beam_size)
    if key not in results:
      results[key] = beam_search(model, params, inputs, beam_size=beam_size,
                                 max_new_tokens=MAX_NEW, **kwargs)
    return results[key]
  return run


def _assert_same_beams_fewer_calls(plain, spec):
  np.testing.assert_array_equal(spec.sequences, plain.sequences)
  np.testing.assert_allclose(spec.scores, plain.scores, atol=1e-5, rtol=0)
  np.testing.assert_array_equal(spec.lengths, plain.lengths)
  assert np.all(spec.target_calls <= plain.target_calls)  # each round runs >= 1 step
  assert int(spec.target_calls.sum()) < int(plain.target_calls.sum())
  assert np.all(spec.draft_calls == GAMMA * spec.target_calls)


@pytest.mark.parametrize("beam_size,draft_beam_size", [(2, 2), (2, 4), (4, 4), (4, 8)])
def test_speculative_beam_search_equals_beam_search(tables, prompts, plain, beam_size,
                                                    draft_beam_size):
  target, draft = tables
  inputs, lengths = prompts
  expected = plain(TableModel(V), target, inputs, beam_size, prompt_lengths=lengths)
  spec = speculative_beam_search(TableModel(V), target, TableModel(V), draft, inputs,
                                 beam_size=beam_size, draft_beam_size=draft_beam_size,
                                 gamma=GAMMA, max_new_tokens=MAX_NEW, prompt_lengths=lengths)
  _assert_same_beams_fewer_calls(expected, spec)


def test_speculative_with_a_poor_draft_is_still_exact(tables, prompts, plain):
  """An unrelated draft: the replay stops early in most rounds, the beams stay the target's."""
  inputs, lengths = prompts
  poor = random_table(7, V, sharpness=2.0)
  expected = plain(TableModel(V), tables[0], inputs, 2, prompt_lengths=lengths)
  spec = speculative_beam_search(TableModel(V), tables[0], TableModel(V), poor, inputs,
                                 beam_size=2, draft_beam_size=2, gamma=1,
                                 max_new_tokens=MAX_NEW, prompt_lengths=lengths)
  np.testing.assert_array_equal(spec.sequences, expected.sequences)
  np.testing.assert_allclose(spec.scores, expected.scores, atol=1e-5, rtol=0)
  assert np.all(spec.target_calls <= expected.target_calls)


@pytest.mark.parametrize("beam_size", [1, 2])
def test_identical_draft_runs_full_rounds(tables, prompts, plain, beam_size):
  """draft == target and u = w: the draft's beams at every depth are the target's (the
  2w-candidate rule keeps the w best non-EOS extensions, as the draft does), and the target
  scores every node of the draft's tree, so every round but a row's last runs γ + 1 steps:
  rounds = ceil(steps / (γ + 1)) exactly. Scoring only the draft's final beams (not the
  branches that died), or a draft cache not caught up to the new roots, breaks this."""
  inputs, lengths = prompts
  expected = plain(TableModel(V), tables[0], inputs, beam_size, prompt_lengths=lengths)
  spec = speculative_beam_search(TableModel(V), tables[0], TableModel(V), tables[0], inputs,
                                 beam_size=beam_size, draft_beam_size=beam_size, gamma=GAMMA,
                                 max_new_tokens=MAX_NEW, prompt_lengths=lengths)
  np.testing.assert_array_equal(spec.sequences, expected.sequences)
  steps = np.asarray(expected.target_calls)
  assert steps.max() > GAMMA + 1  # some rows need several rounds
  np.testing.assert_array_equal(spec.target_calls, -(-steps // (GAMMA + 1)))


@pytest.fixture(scope="module")
def t5_pair():
  """A random-init tiny T5 and a draft close to it (its weights perturbed by 5%)."""
  model = T5Model(T5Config(vocab_size=32, emb_dim=16, num_heads=2, num_encoder_layers=1,
                           num_decoder_layers=1, head_dim=8, mlp_dim=32))
  params = model.init(0)
  rng = np.random.default_rng(1)
  draft = jax.tree.map(lambda x: x + 0.05 * np.std(x) * rng.normal(size=x.shape).astype(np.float32),
                       params)
  return model, params, draft


# γ+1-wide scoring calls against 1-wide ones: beams at near-tied scores can swap under TF32 or
# bfloat16 passes, so the float32 T5 pair runs at full float32 matmul precision on any backend.
@jax.default_matmul_precision("highest")
def test_speculative_beam_search_t5_pair(t5_pair, plain):
  model, params, draft = t5_pair
  inputs = np.random.default_rng(5).integers(2, 32, size=(16, 5)).astype(np.int32)
  expected = plain(model, params, inputs, 2)
  spec = speculative_beam_search(model, params, model, draft, inputs, beam_size=2,
                                 draft_beam_size=4, gamma=GAMMA, max_new_tokens=MAX_NEW)
  _assert_same_beams_fewer_calls(expected, spec)


# -------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs,name", [
    (dict(beam_size=0), "beam_size"),
    (dict(draft_beam_size=1), "draft_beam_size"),
    (dict(gamma=0), "gamma"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(alpha=-1.0), "alpha"),
])
def test_bad_arguments_raise(tables, kwargs, name):
  args = dict(beam_size=2, draft_beam_size=2, gamma=2, max_new_tokens=4)
  args.update(kwargs)
  with pytest.raises(ValueError, match=name):
    speculative_beam_search(TableModel(V), tables[0], TableModel(V), tables[1],
                            np.array([[3, 4]], np.int32), **args)
  if name in ("beam_size", "max_new_tokens", "alpha"):
    plain = {k: v for k, v in args.items() if k in ("beam_size", "max_new_tokens", "alpha")}
    with pytest.raises(ValueError, match=name):
      beam_search(TableModel(V), tables[0], np.array([[3, 4]], np.int32), **plain)


def test_bad_inputs_raise(tables):
  target = tables[0]
  with pytest.raises(ValueError, match="vocabularies differ"):
    speculative_beam_search(TableModel(V), target, TableModel(V + 1), random_table(0, V + 1),
                            np.array([[3]]), beam_size=1, draft_beam_size=1, gamma=1,
                            max_new_tokens=2)
  with pytest.raises(ValueError, match="outside"):
    beam_search(TableModel(V), target, np.array([[V]]), beam_size=1, max_new_tokens=2)
  with pytest.raises(ValueError, match="empty prompt"):
    beam_search(TableModel(V), target, np.array([[3], [0]]), beam_size=1, max_new_tokens=2)


def test_gin_files_configure_both_functions(tables, prompts):
  """decoding/beam_speculative.gin (which includes beam.gin) reaches the functions' arguments."""
  inputs, lengths = prompts
  gin.clear_config()
  try:
    gin_config.parse(["decoding/beam_speculative.gin"], ["BEAM_SIZE = 3", "DRAFT_BEAM_SIZE = 2"])
    configured = gin.get_configurable("specjax.decode.beam_search")
    result = configured(TableModel(V), tables[0], inputs, max_new_tokens=MAX_NEW,
                        prompt_lengths=lengths)
    assert result.sequences.shape == (16, 3, MAX_NEW)  # BEAM_SIZE = 3 from the binding
    with pytest.raises(ValueError, match="draft_beam_size"):  # u = 2 < w = 3: bound, checked
      gin.get_configurable("specjax.decode.speculative_beam_search")(
          TableModel(V), tables[0], TableModel(V), tables[1], inputs, max_new_tokens=MAX_NEW)
  finally:
    gin.clear_config()
