"""`experiments.common.decoding`: the named decoders pass their entry's settings, and decodes in
padded batches come back as the real rows' results."""
import jax
import numpy as np
import pytest

from experiments.common.decoding import Decoders, decode_config, in_batches
from experiments.common.pairs import Pair
from specjax.decode import DecodeResult
from specjax.draft import ModelDrafter


def _result(rows, calls):
  n = len(rows)
  return DecodeResult(tokens=np.asarray(rows) * 10, lengths=np.full(n, 2),
                      target_calls=np.asarray(calls), draft_calls=np.zeros(n, np.int32),
                      accepted_hist=np.ones((n, 3), np.int32), alpha_sum=np.full(n, 0.5),
                      alpha_count=np.ones(n, np.int32))


def test_in_batches_joins_the_real_rows_and_counts_each_batch_by_its_slowest_row():
  inputs = np.arange(10).reshape(5, 2)  # 5 rows: batches of 2, 2 and 1 (+ 1 padding row)
  seen = []

  def decode(rows, start):
    seen.append((start, rows[:, 0].tolist()))
    calls = rows[:, 0] + 1  # row i (first token 2i) makes 2i + 1 calls
    return _result(rows, calls)

  out = in_batches(decode, inputs, 2)
  assert seen == [(0, [0, 2]), (2, [4, 6]), (4, [8, 8])]  # the last batch repeats its first row
  np.testing.assert_array_equal(out.tokens, inputs * 10)
  np.testing.assert_array_equal(out.target_calls, [1, 3, 5, 7, 9])
  assert int(out.rounds) == 3 + 7 + 9 and int(out.slot_rounds) == 2 * 19
  assert out.pooled_alpha == pytest.approx(0.5) and out.accepted_hist.shape == (5, 3)


def test_decoders_pass_the_entry_settings_and_let_a_call_override_them(monkeypatch):
  import specjax.decode as decode_lib
  calls = []
  for name in ("autoregressive_decode", "speculative_decode", "tree_decode"):
    monkeypatch.setattr(decode_lib, name,
                        lambda *args, _name=name, **kw: calls.append((_name, args, kw)))
  target, draft = object(), object()
  pair = Pair("p", "task", target, "tparams", draft, "dparams", "test")
  key, config = jax.random.PRNGKey(3), decode_config(0.0, 32)
  d = Decoders(pair, 7, config, key)
  x = np.zeros((1, 4), np.int32)
  d.autoregressive()(x)
  d.model_chain(3)(x, max_new_tokens=5)
  d.auto().tree("drafter", "params", tree="t")(x)
  (n0, a0, k0), (n1, a1, k1), (n2, a2, k2) = calls
  assert n0 == "autoregressive_decode" and a0[:2] == (target, "tparams") and a0[2] is x
  assert k0["max_new_tokens"] == 7 and k0["rng"] is key and k0["config"] is config
  assert n1 == "speculative_decode" and a1[2] == ModelDrafter(draft, max_gamma=3)
  assert a1[3] == "dparams" and k1["gamma"] == 3 and k1["max_new_tokens"] == 5  # the call wins
  assert n2 == "tree_decode" and a2[2:4] == ("drafter", "params") and k2["tree"] == "t"
  assert k2["config"].gamma_policy == "auto" and config.gamma_policy != "auto"
