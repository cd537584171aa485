"""The feature head's step as `specjax.aot` compiles it (`report.head_step_piece`) and its
predicted speedup (`cost.head_prediction`): a trained head's own config, its cross-attention
reading a T5 target's encoded source, the drafted rows' logits, and tokens per call over the
round's cost. Runs on this host's CPU (no accelerator compiler needed)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.aot import cost, report
from specjax.models import FeatureHead, FeatureHeadConfig
from specjax.testing import tiny_pair


def _head_config(pair, **kw):
  """A head of other sizes than the target's layers (with cross-attention: the target's
  heads, which it reads the keys and values of)."""
  cfg = pair.target.config
  heads = (cfg.num_heads, cfg.head_dim) if kw.get("cross_attention") else (2, 4)
  return FeatureHeadConfig(vocab_size=cfg.vocab_size, emb_dim=pair.target.feature_dim,
                           num_heads=heads[0], head_dim=heads[1], mlp_dim=12, **kw)


def _concrete(tree):
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)


@pytest.mark.parametrize("family", ["t5", "lm"])
def test_a_trained_heads_config_makes_the_head_step_and_its_guesses_run(family):
  pair = tiny_pair(family)
  cross = family == "t5"
  config = _head_config(pair, cross_attention=cross, feature_layers=(0, 1) if cross else None)
  pieces = {p.name: p for p in report.model_pieces(
      pair.target, pair.draft, input_len=4, max_new_tokens=8, gamma=3, include=("steps",),
      head_config=config, vocab_rows=5)}
  piece = pieces["head step"]
  params, rows, cache, encoded, features, embedded = piece.args
  assert rows.shape == (5, pair.target.feature_dim)  # the drafted ids' output rows
  assert (encoded is not None) == cross  # the T5 target's encoded source, for cross-attention
  head = FeatureHead(dataclasses.replace(config, dtype=pair.target.config.dtype))
  assert jax.tree.structure(params) == jax.tree.structure(jax.eval_shape(lambda: head.init(0)))
  # It runs: each guess's next embedding is the argmax row of the drafted ids' logits.
  rng = np.random.default_rng(0)
  real = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.3, s.dtype), params)
  table = jnp.asarray(rng.normal(size=rows.shape), rows.dtype)
  enc = None
  if cross:
    enc = pair.target.encode(pair.target_params, jnp.array([[3, 4, 5, 1]], jnp.int32))
    enc = jax.tree.map(lambda a, s: a.astype(s.dtype), enc, encoded)
  start = jnp.asarray(rng.normal(size=features.shape), jnp.float32)
  _, predicted, next_embedded = piece.fn(real, table, _concrete(cache), enc, start, start)
  logits = np.asarray(predicted[0, 0]) @ np.asarray(table, np.float32).T
  np.testing.assert_allclose(np.asarray(next_embedded[0, 0]),
                             np.asarray(table[int(np.argmax(logits))], np.float32))
  # Its floor counts the rows with the head's weights.
  assert report._nbytes(piece.weights) == report._nbytes(params) + report._nbytes(rows)  # pylint: disable=protected-access


def test_a_head_for_another_target_or_a_source_it_lacks_is_one_error():
  lm = tiny_pair("lm")
  wide = dataclasses.replace(_head_config(lm), emb_dim=lm.target.feature_dim + 1)
  with pytest.raises(ValueError, match="features of width"):
    report.model_pieces(lm.target, lm.draft, include=("steps",), head_config=wide)
  with pytest.raises(ValueError, match="cross_attention.*decoder-only"):
    report.model_pieces(lm.target, lm.draft, include=("steps",),
                        head_config=_head_config(lm, cross_attention=True))


def test_the_head_prediction_divides_the_measured_tokens_by_the_rounds_cost():
  p = cost.head_prediction(10.0, 1.0, {7: 4.5, 3: 3.0})
  assert p["c"] == 0.1
  # A round: γ head steps and one target call (one step at batch 1).
  assert p["speedup_by_gamma"] == {3: round(3.0 / 1.3, 3), 7: round(4.5 / 1.7, 3)}
  assert (p["gamma"], p["speedup"]) == (7, round(4.5 / 1.7, 3))
  assert p["round_ms"] == 7 * 1.0 + 10.0
  with pytest.raises(ValueError, match="at least one"):
    cost.head_prediction(10.0, 1.0, {})
