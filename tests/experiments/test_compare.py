"""`experiments.common.compare`: the standard columns from decodes timed side by side; and
`experiments.common.timed.paired_loop`, the round's two models in one timed loop."""
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common.compare import batched, compare


def _decoder(tokens_per_call, alpha, seconds, tokens=8, differ_on=()):
  """A fake decoder of one row: `tokens` tokens in tokens / tokens_per_call target calls,
  α estimate `alpha` (over 4 positions), `seconds` of work per call, and other tokens on the
  examples listed in `differ_on` (found by the example's first input token); alpha None: no
  speculative round (the autoregressive loop's count of α positions is 0)."""
  def decode(row):
    time.sleep(seconds)
    out = np.arange(tokens)[None] + (100 if int(row[0, 0]) in differ_on else 0)
    calls = tokens / tokens_per_call
    return types.SimpleNamespace(tokens=out, lengths=np.array([tokens]),
                                 target_calls=np.array([calls]),
                                 alpha_sum=np.array([4 * (alpha or 0.0)]),
                                 alpha_count=np.array([0 if alpha is None else 4]))
  return decode


def test_columns_against_the_reference():
  inputs = np.array([[1, 0], [2, 0], [3, 0]], np.int32)
  result = compare({"ar": _decoder(1.0, None, 0.02), "chain γ=3": _decoder(2.0, 0.5, 0.01),
                    "wrong": _decoder(2.0, 0.5, 0.01, differ_on=(2,)),
                    "first differs": _decoder(1.0, None, 0.0, differ_on=(1,))},
                   inputs, repeats=3, reference="ar", gammas={"chain γ=3": 3})
  rows = {row["decoder"]: row for row in result.rows()}
  assert rows["ar"]["alpha"] is None and rows["ar"]["speedup"] == pytest.approx(1.0)
  chain = rows["chain γ=3"]
  assert chain["alpha"] == pytest.approx(0.5) and chain["tokens_per_call"] == pytest.approx(2.0)
  assert chain["E_tokens"] == pytest.approx((1 - 0.5 ** 4) / (1 - 0.5))  # Eq. 1
  assert 1.5 < chain["speedup"] < 2.5  # 20 ms against 10 ms per example (sleep's jitter)
  assert chain["ms_per_token"] == pytest.approx(10 / 8, rel=0.3)
  low, high = map(float, chain["speedup_range"].split("-"))
  assert low - 0.005 <= chain["speedup"] <= high + 0.005  # the range is rounded to 0.01
  assert chain["greedy"] == "3 of 3 identical"
  assert rows["wrong"]["greedy"] == "2 of 3 identical; example 1 differs"
  assert rows["wrong"]["E_tokens"] is None  # no γ given
  # Example 0's results are kept (inputs 1: only "first differs" draws other tokens there).
  assert list(result.first) == list(rows)
  np.testing.assert_array_equal(result.first["wrong"].tokens, np.arange(8)[None])
  np.testing.assert_array_equal(result.first["first differs"].tokens, 100 + np.arange(8)[None])


def test_batched_rows_price_each_run_per_emitted_token():
  # Two-row batches: "half" emits half the tokens in the same time, so per emitted token it
  # is half as fast; "spec" emits as many in half the time (twice as fast) with α 0.25 pooled
  # over its rows' positions (1 of 4 and 0 of 0: a rows' mean would give 0.125).
  def run(tokens, seconds, alpha_sum=(0.0, 0.0), alpha_count=(0, 0)):
    def call():
      time.sleep(seconds)
      return types.SimpleNamespace(lengths=np.array(tokens), target_calls=np.array([4, 4]),
                                   alpha_sum=np.array(alpha_sum),
                                   alpha_count=np.array(alpha_count))
    return call
  rows, t = batched({"ar": run([8, 8], 0.02), "half": run([4, 4], 0.02),
                     "spec": run([8, 8], 0.01, (1.0, 0.0), (4, 0))}, 3, reference="ar",
                    pair="p", batch=2)
  by = {r["decoder"]: r for r in rows}
  assert list(by) == ["ar", "half", "spec"] and set(t.samples) == set(by)
  assert rows[0]["pair"] == "p" and list(rows[0])[:3] == ["pair", "batch", "decoder"]
  assert by["ar"]["alpha"] is None and by["ar"]["speedup"] == pytest.approx(1.0)
  assert by["half"]["speedup"] == pytest.approx(0.5, rel=0.3)
  assert by["spec"]["speedup"] == pytest.approx(2.0, rel=0.3)
  assert by["spec"]["alpha"] == pytest.approx(0.25)
  assert by["spec"]["tokens"] == 16 and by["spec"]["tokens_per_call"] == pytest.approx(2.0)
  low, high = map(float, by["spec"]["speedup_range"].split("-"))
  assert 1.2 < low <= high < 3.0  # per pass: 20 ms against 10 ms


def test_a_check_may_fail_the_run():
  def never(name, i, row, reference, out):
    raise AssertionError(f"{name}, example {i}")
  with pytest.raises(AssertionError, match="bad, example 0"):
    compare({"ar": _decoder(1.0, 0.0, 0.0), "bad": _decoder(1.0, 0.0, 0.0, differ_on=(1,))},
            np.array([[1]], np.int32), repeats=1, reference="ar", check=never)


class _CountingModel:
  """A stand-in model whose decode records each call's token count and whose argmax is 2 + the
  first token fed (so each call's input shows what came before it)."""

  def __init__(self, name, calls):
    self.name, self.calls = name, calls

  def init_cache(self, batch, cache_len):
    return jnp.zeros((batch,), jnp.float32)

  def decode(self, params, cache, tokens, positions, encoded):
    self.calls.append((self.name, tokens.shape[1]))
    logits = jax.nn.one_hot(tokens[:, :1] + 2, 16) * params  # [B, 1, 16]
    return logits, cache + 1.0


def test_paired_loop_makes_one_target_call_then_gamma_draft_calls_in_turn():
  from experiments.common.timed import c_in_round, paired_loop  # pylint: disable=import-outside-toplevel
  calls = []
  target, draft = _CountingModel("target", calls), _CountingModel("draft", calls)
  run, n = paired_loop(target, 1.0, draft, 1.0, 1, 16, k=3, draft_steps=2, calls=4)
  acc = float(run())
  # Traced once: per iteration the 3-token target call, then two 1-token draft calls.
  assert calls == [("target", 3), ("draft", 1), ("draft", 1)] and n == 4
  # Each call is fed 5 + acc % 2 and adds its argmax (fed + 2, odd or even in turn): the sum
  # follows the chain only when every call reads the result of the one before it.
  want = 0.0
  for _ in range(4 * 3):
    want += 5 + int(want) % 2 + 2
  assert acc == want
  assert c_in_round(5.0, 3.0, 2, 2.0) == 0.5  # (5 - 3) / 2 steps / 2
