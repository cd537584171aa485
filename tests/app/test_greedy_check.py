"""The greedy-difference verdict: near-ties of the target's logits vs a defect."""
import types

import jax
import numpy as np
import pytest

from specjax.app import bundled, greedy_check
from specjax.app.greedy_check import (RowDifference, compute_precision, first_difference,
                                      rounding, row_differences, verdict)
from specjax.app.scoring import teacher_forced_logits
from specjax.decode import DecodeConfig, autoregressive_decode
from specjax.sampling import Sampling

V, N = 50, 8


def _planted(position, second_gap, spec_rank=1, magnitude=12.0, seed=0):
  """A row whose autoregressive tokens are the argmax of `logits` at every position, and a
  speculative row that takes the token of rank `spec_rank` at `position` (then goes its own
  way). The top two logits at `position` are `second_gap` apart, the rest 3 or more below.
  Returns (ar [1, N], spec [1, N], logits [1, N, V])."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(1, N, V)).astype(np.float32)
  order = rng.permutation(V)
  logits[0, position] = magnitude - 3.0 - rng.uniform(size=V)
  logits[0, position, order[0]] = magnitude
  logits[0, position, order[1]] = magnitude - second_gap
  ar = logits.argmax(-1)
  spec = ar.copy()
  spec[0, position] = order[spec_rank]
  spec[0, position + 1:] = (ar[0, position + 1:] + 1) % V
  return ar, spec, logits


def _diffs(ar, spec, logits, spec_length=N):
  return row_differences(ar, [N], spec, [spec_length], logits)


def test_a_planted_near_tie_is_labelled_a_tie():
  # At |logit| 12 a bfloat16 step is 2^-7 * 8 = 0.0625: a gap of 0.03 is within one step.
  ar, spec, logits = _planted(position=3, second_gap=0.03)
  (diff,) = _diffs(ar, spec, logits)
  assert (diff.row, diff.position, diff.ar_token, diff.spec_token) == (0, 3, ar[0, 3], spec[0, 3])
  assert diff.margin == pytest.approx(0.03, abs=1e-6) and diff.gap == diff.margin
  assert diff.magnitude == pytest.approx(12.0)
  line = verdict([diff], "bfloat16")
  assert line.startswith("differs only at near-ties (largest margin 0.03, within bfloat16 "
                         "rounding at that magnitude")
  # The same gap in float32 arithmetic is far beyond rounding.
  assert verdict([diff], "float32") == "differs at a clear margin: a defect"


def test_a_planted_real_divergence_is_labelled_a_defect():
  ar, spec, logits = _planted(position=5, second_gap=1.5)
  (diff,) = _diffs(ar, spec, logits)
  assert diff.position == 5 and diff.margin == pytest.approx(1.5)
  assert verdict([diff], "bfloat16") == "differs at a clear margin: a defect"


def test_a_tied_top_two_do_not_excuse_a_third_token():
  # The top two are tied, but the speculative token is the third, 3 or more below the top.
  ar, spec, logits = _planted(position=2, second_gap=0.0, spec_rank=2)
  (diff,) = _diffs(ar, spec, logits)
  assert diff.margin == 0.0 and diff.gap >= 3.0
  assert verdict([diff], "bfloat16") == "differs at a clear margin: a defect"
  assert "below the top" in greedy_check.describe(diff)


def test_one_defect_among_ties_makes_the_verdict_a_defect():
  tie, defect = (_diffs(*_planted(position=1, second_gap=g, seed=s))[0]
                 for g, s in ((0.01, 1), (0.9, 2)))
  assert verdict([tie], "bfloat16").startswith("differs only at near-ties")
  assert verdict([tie, defect], "bfloat16") == "differs at a clear margin: a defect"


def test_the_ulp_bound_follows_the_magnitude():
  assert rounding("bfloat16", 1.0) == 2.0 ** -7
  assert rounding("bfloat16", 12.0) == 2.0 ** -4
  assert rounding("bfloat16", 0.3) == 2.0 ** -9
  assert rounding("float32", 12.0) == 2.0 ** -20
  # gap 0.1 at |logit| 12 (step 0.0625): 1.6 steps, a tie; at |logit| 3 (step 0.0156): 6.4.
  near = RowDifference(0, 0, 1, 2, 0.1, 0.1, 12.0)
  assert verdict([near], "bfloat16").startswith("differs only at near-ties (largest margin 0.1,")
  far = RowDifference(0, 0, 1, 2, 0.1, 0.1, 3.0)
  assert verdict([far], "bfloat16") == "differs at a clear margin: a defect"
  # The bound is NEAR_TIE_ULPS steps: just inside is a tie, just outside a defect.
  bound = greedy_check.NEAR_TIE_ULPS * 2.0 ** -4  # steps at |logit| 12
  inside, outside = (RowDifference(0, 0, 1, 2, g, g, 12.0) for g in (0.99 * bound, 1.01 * bound))
  assert verdict([inside], "bfloat16").startswith("differs only at near-ties")
  assert verdict([outside], "bfloat16") == "differs at a clear margin: a defect"
  with pytest.raises(ValueError, match="precision must be one of"):
    rounding("int8", 1.0)


def test_first_difference_counts_an_end_as_a_difference():
  assert first_difference([1, 2, 3], [1, 2, 3]) is None
  assert first_difference([1, 2, 3], [1, 5, 3]) == 1
  assert first_difference([1, 2], [1, 2, 3]) == 2
  ar, spec, logits = _planted(position=4, second_gap=1.0)
  spec = ar.copy()
  (diff,) = _diffs(ar, spec, logits, spec_length=4)  # the speculative output ended at 4
  assert (diff.position, diff.spec_token) == (4, None) and diff.margin is not None
  assert verdict([], "bfloat16") == "identical"
  assert _diffs(ar, ar, logits) == []


def test_compute_precision_follows_weights_backend_and_matmul_precision():
  assert compute_precision("bfloat16", "cpu", None) == "bfloat16"
  assert compute_precision("bfloat16", "gpu", "highest") == "bfloat16"
  assert compute_precision("float32", "cpu", None) == "float32"
  assert compute_precision("float32", "gpu", None) == "tensorfloat32"
  assert compute_precision("float32", "tpu", "default") == "bfloat16"
  assert compute_precision("float32", "tpu", "highest") == "float32"


def test_greedy_difference_scores_the_autoregressive_sequence_with_the_target():
  # The bundled tiny LM decodes greedily; a planted speculative output takes the target's
  # second-best token at position 5 of example 1 (a real divergence in float32: the tiny
  # model's margins there are far above float32 rounding); example 0 is left identical.
  model, params = bundled.load("lm", "tiny")
  inputs = np.zeros((2, 6), np.int32)
  inputs[0, :4], inputs[1, :6] = [5, 17, 33, 9], [8, 41, 12, 77, 3, 19]
  ar = autoregressive_decode(model, params, inputs, max_new_tokens=10, rng=jax.random.PRNGKey(0),
                             config=DecodeConfig(sampling=Sampling(temperature=0.0)))
  tokens, lengths = np.asarray(ar.tokens), np.asarray(ar.lengths)
  assert lengths[1] > 5
  logits = np.asarray(teacher_forced_logits(model, params, inputs, None, tokens))  # [2, 10, V]
  # Teacher forcing lines up with the decode: its argmax is the decode's token everywhere.
  for b in range(2):
    np.testing.assert_array_equal(logits[b, :lengths[b]].argmax(-1), tokens[b, :lengths[b]])
  second = int(np.argsort(logits[1, 5])[-2])
  spec_tokens = tokens.copy()
  spec_tokens[1, 5] = second
  spec = types.SimpleNamespace(tokens=spec_tokens, lengths=lengths)
  out = greedy_check.greedy_difference(model, params, inputs, None, ar, spec, "float32")
  top2 = np.sort(logits[1, 5])[-2:]
  assert out["greedy_difference"] == (
      f"example 1: first differs at position 5 (autoregressive token {tokens[1, 5]}, speculative "
      f"token {second}); target top-2 logit margin {top2[1] - top2[0]:.3g} at |logit| "
      f"{abs(top2[1]):.3g}")
  assert out["greedy_verdict"] == "differs at a clear margin: a defect"
  same = greedy_check.greedy_difference(model, params, inputs, None, ar, ar, "float32")
  assert same == {"greedy_verdict": "identical"}
  # The main job's summary gains the two entries only when it reports a difference.
  plan = types.SimpleNamespace(target=model, inputs=inputs, prompt_lengths=None,
                               settings=types.SimpleNamespace(weights_dtype="float32"))
  loaded, measured = types.SimpleNamespace(target_params=params), types.SimpleNamespace(
      ar=ar, spec=spec)
  summary = greedy_check.explained({"greedy_identical": False}, plan, loaded, measured)
  assert summary == {"greedy_identical": False, **out}
  for kept in (True, "n/a (sampling or not exact)"):
    assert greedy_check.explained({"greedy_identical": kept}, plan, loaded, measured) == {
        "greedy_identical": kept}
