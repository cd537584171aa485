"""Tests for specjax.models: T5X parameter trees, the multi-token KV cache, errors.

The networks are checked three ways: against a float64 numpy re-derivation of
T5X's forward pass (architecture), against their own teacher-forced logits
when decoded 1..8 tokens at a time, at per-row positions and after rollbacks
(cache), and against T5X's parameter names and the published T5 1.1 sizes.
"""
import math
import os
import re
import types

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import (DecoderOnlyConfig, DecoderOnlyModel, DecodingModel, KVCache,
                            T5Config, T5Model)
from specjax.models.layers import bfloat16_dot, int8_dot, relative_position_bucket
from specjax.models.protocol import decode_logits_at
from specjax.params import cast_kernels, count_params, flatten, quantize, quantize_kernels

# The networks' float32 logits are compared with float64 numpy and with other call shapes:
# tests of the architecture and the cache, at full float32 matmul precision on any backend.
pytestmark = pytest.mark.usefixtures("float32_matmuls")

GIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "gin")
VOCAB = 61
ATOL = 1e-5
# H * D != E on purpose, so a wrong reshape cannot pass.
T5_CFG = T5Config(vocab_size=VOCAB, emb_dim=16, num_heads=2, num_encoder_layers=2,
                  num_decoder_layers=2, head_dim=6, mlp_dim=24)
DEC_CFG = DecoderOnlyConfig(vocab_size=VOCAB, emb_dim=16, num_heads=3, num_layers=2,
                            head_dim=5, mlp_dim=24)


def max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# ----------------------------------------------------------------------------
# Fixtures: one model, parameter set and teacher-forced reference per family.
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def t5():
  model = T5Model(T5_CFG)
  params = model.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  inputs = rng.integers(2, VOCAB, (3, 7))
  inputs[0, 5:] = 0  # rows of different true lengths
  inputs[1, 3:] = 0
  dec = rng.integers(1, VOCAB, (3, 12))
  dec[:, 0] = 0  # T5X start token
  encoded = model.encode(params, inputs)
  teacher = np.asarray(model.logits(params, inputs, dec))
  return types.SimpleNamespace(model=model, params=params, inputs=inputs, dec=dec,
                               encoded=encoded, teacher=teacher)


@pytest.fixture(scope="module")
def lm():
  model = DecoderOnlyModel(DEC_CFG)
  prefix_model = DecoderOnlyModel(DEC_CFG, prefix_lm=True)
  params = model.init(jax.random.PRNGKey(1))
  tokens = np.random.default_rng(1).integers(1, VOCAB, (3, 14))
  teacher = np.asarray(model.logits(params, tokens))
  return types.SimpleNamespace(model=model, prefix_model=prefix_model, params=params,
                               tokens=tokens, teacher=teacher)


def decode_in_chunks(model, params, tokens, k, max_len, encoded=None):
  """Feeds tokens [B, L] k at a time from position 0; returns logits [B, L, V]."""
  batch, length = tokens.shape
  cache = model.init_cache(batch, max_len)
  out = []
  for start in range(0, length, k):
    chunk = tokens[:, start:start + k]
    logits, cache = model.decode(params, cache, chunk, np.full(batch, start, np.int32),
                                 encoded)
    out.append(np.asarray(logits))
  return np.concatenate(out, axis=1)


# ----------------------------------------------------------------------------
# Relative position buckets.
# ----------------------------------------------------------------------------
def exact_bucket(rel, bidirectional, num_buckets=32, max_distance=128):
  """T5's bucket in exact integer arithmetic (no floating-point log)."""
  n = -rel
  offset = 0
  if bidirectional:
    num_buckets //= 2
    offset = num_buckets if n < 0 else 0
    n = abs(n)
  else:
    n = max(n, 0)
  exact = num_buckets // 2
  if n < exact:
    return offset + n
  # Largest m with exact * (max_distance / exact) ** (m / (num_buckets - exact)) <= n.
  span, ratio = num_buckets - exact, max_distance // exact
  m = 0
  while m + 1 < span and exact ** span * ratio ** (m + 1) <= n ** span:
    m += 1
  return offset + exact + m


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_bucket_matches_exact_formula(bidirectional):
  rel = np.arange(-300, 301)
  got = np.asarray(relative_position_bucket(jnp.asarray(rel), bidirectional))
  want = np.array([exact_bucket(int(r), bidirectional) for r in rel])
  np.testing.assert_array_equal(got, want)
  assert got.min() == 0 and got.max() == 31


def test_relative_position_bucket_known_values():
  # Bidirectional: keys before the query use buckets 0..15, after it 16..31.
  pairs = {0: 0, -1: 1, -7: 7, -8: 8, -16: 10, -32: 12, -64: 14, -127: 15, -500: 15,
           1: 17, 8: 24, 16: 26, 127: 31}
  for rel, bucket in pairs.items():
    assert int(relative_position_bucket(jnp.int32(rel), True)) == bucket, rel
  # Causal: keys after the query all share bucket 0.
  pairs = {0: 0, 5: 0, -15: 15, -16: 16, -32: 21, -64: 26, -128: 31, -1000: 31}
  for rel, bucket in pairs.items():
    assert int(relative_position_bucket(jnp.int32(rel), False)) == bucket, rel


# ----------------------------------------------------------------------------
# A float64 numpy re-derivation of T5X's forward pass (t5x/examples/t5).
# ----------------------------------------------------------------------------
def np_rms(x, scale):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


NP_ACTS = {
    "linear": lambda x: x,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
}


def np_attention(p, xq, xkv, bias, heads, head_dim):
  q = (xq @ p["query"]["kernel"]).reshape(len(xq), heads, head_dim)
  k = (xkv @ p["key"]["kernel"]).reshape(len(xkv), heads, head_dim)
  v = (xkv @ p["value"]["kernel"]).reshape(len(xkv), heads, head_dim)
  logits = np.einsum("qhd,khd->hqk", q, k) + bias  # no 1/sqrt(d) in T5
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  return np.einsum("hqk,khd->qhd", w, v).reshape(len(xq), -1) @ p["out"]["kernel"]


def np_mlp(p, x, acts):
  names = ["wi"] if len(acts) == 1 else [f"wi_{i}" for i in range(len(acts))]
  h = np.prod([NP_ACTS[a](x @ p[n]["kernel"]) for n, a in zip(names, acts)], axis=0)
  return h @ p["wo"]["kernel"]


def np_relpos(table, length, bidirectional):
  rel = np.arange(length)[None, :] - np.arange(length)[:, None]
  by_rel = np.array([exact_bucket(r, bidirectional) for r in range(-length, length + 1)])
  return table[:, by_rel[rel + length]]  # [H, q, k]


def np_t5_logits(p, cfg, inputs, dec):
  """One example: inputs [L_in] (0 = pad), dec [L] -> logits [L, V]."""
  heads, hd, acts = cfg.num_heads, cfg.head_dim, cfg.mlp_activations
  emb = p["token_embedder"]["embedding"]
  real = inputs > 0
  bias = (np_relpos(p["encoder"]["relpos_bias"]["rel_embedding"], len(inputs), True)
          + np.where(real[:, None] & real[None, :], 0, -1e10))
  x = emb[inputs]
  for i in range(cfg.num_encoder_layers):
    lp = p["encoder"][f"layers_{i}"]
    h = np_rms(x, lp["pre_attention_layer_norm"]["scale"])
    x = x + np_attention(lp["attention"], h, h, bias, heads, hd)
    x = x + np_mlp(lp["mlp"], np_rms(x, lp["pre_mlp_layer_norm"]["scale"]), acts)
  enc = np_rms(x, p["encoder"]["encoder_norm"]["scale"])
  causal = np.tril(np.ones((len(dec), len(dec)), bool))
  bias = (np_relpos(p["decoder"]["relpos_bias"]["rel_embedding"], len(dec), False)
          + np.where(causal, 0, -1e10))
  cross_bias = np.where(real, 0, -1e10)[None, None, :]
  y = emb[dec]
  for i in range(cfg.num_decoder_layers):
    lp = p["decoder"][f"layers_{i}"]
    h = np_rms(y, lp["pre_self_attention_layer_norm"]["scale"])
    y = y + np_attention(lp["self_attention"], h, h, bias, heads, hd)
    h = np_rms(y, lp["pre_cross_attention_layer_norm"]["scale"])
    y = y + np_attention(lp["encoder_decoder_attention"], h, enc, cross_bias, heads, hd)
    y = y + np_mlp(lp["mlp"], np_rms(y, lp["pre_mlp_layer_norm"]["scale"]), acts)
  y = np_rms(y, p["decoder"]["decoder_norm"]["scale"])
  if cfg.logits_via_embedding:
    return y @ emb.T / np.sqrt(cfg.emb_dim)
  return y @ p["decoder"]["logits_dense"]["kernel"]


def np_decoder_only_logits(p, cfg, tokens, prefix_length=0):
  """One example: tokens [L] -> logits [L, V]; T5X prefix-LM mask when prefix_length > 0."""
  p = p["decoder"]
  pos = np.arange(len(tokens))
  visible = (pos[None, :] <= pos[:, None]) | (pos[None, :] < prefix_length)
  bias = (np_relpos(p["relpos_bias"]["rel_embedding"], len(tokens), False)
          + np.where(visible, 0, -1e10))
  emb = p["token_embedder"]["embedding"]
  y = emb[tokens]
  for i in range(cfg.num_layers):
    lp = p[f"layers_{i}"]
    h = np_rms(y, lp["pre_self_attention_layer_norm"]["scale"])
    y = y + np_attention(lp["self_attention"], h, h, bias, cfg.num_heads, cfg.head_dim)
    y = y + np_mlp(lp["mlp"], np_rms(y, lp["pre_mlp_layer_norm"]["scale"]),
                   cfg.mlp_activations)
  y = np_rms(y, p["decoder_norm"]["scale"])
  if cfg.logits_via_embedding:
    return y @ emb.T / np.sqrt(cfg.emb_dim)
  return y @ p["logits_dense"]["kernel"]


def to_f64(params):
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)


def copy_tree(params):
  return jax.tree_util.tree_map(np.asarray, params)


@pytest.mark.parametrize("t5_1_0", [False, True])
def test_t5_logits_match_numpy_reference(t5, t5_1_0):
  if t5_1_0:  # relu MLP with one `wi` kernel, logits via the embedding
    cfg = T5Config(**{**T5_CFG.__dict__, "mlp_activations": ("relu",),
                      "logits_via_embedding": True})
    params = copy_tree(t5.params)
    del params["decoder"]["logits_dense"]
    for stack in ("encoder", "decoder"):
      for i in range(2):
        mlp = params[stack][f"layers_{i}"]["mlp"]
        mlp["wi"] = mlp.pop("wi_0")
        del mlp["wi_1"]
    got = np.asarray(T5Model(cfg).logits(params, t5.inputs, t5.dec))
  else:
    cfg, params, got = T5_CFG, t5.params, t5.teacher
  ref = to_f64(params)
  for b in range(len(t5.inputs)):
    want = np_t5_logits(ref, cfg, t5.inputs[b], t5.dec[b])
    assert max_diff(got[b], want) < 1e-4
  assert np.std(got) > 0.1  # not a degenerate comparison


@pytest.mark.parametrize("logits_via_embedding", [True, False])
def test_decoder_only_logits_match_numpy_reference(lm, logits_via_embedding):
  # Length 150 > max_distance 128 exercises the saturated relative buckets.
  cfg = DecoderOnlyConfig(**{**DEC_CFG.__dict__, "logits_via_embedding": logits_via_embedding})
  params = copy_tree(lm.params)
  if not logits_via_embedding:
    params["decoder"]["logits_dense"] = {"kernel": np.random.default_rng(4).normal(
        0, 0.25, (DEC_CFG.emb_dim, VOCAB)).astype(np.float32)}
  tokens = np.random.default_rng(4).integers(1, VOCAB, (2, 150))
  ref = to_f64(params)
  causal = np.asarray(DecoderOnlyModel(cfg).logits(params, tokens))
  prefix = np.asarray(DecoderOnlyModel(cfg, prefix_lm=True).logits(
      params, tokens, prefix_lengths=np.array([5, 9])))
  for b, plen in enumerate([5, 9]):
    assert max_diff(causal[b], np_decoder_only_logits(ref, cfg, tokens[b])) < 1e-4
    assert max_diff(prefix[b], np_decoder_only_logits(ref, cfg, tokens[b], plen)) < 1e-4
  # The prefix is bidirectional: position 0 already sees the whole prefix.
  assert max_diff(causal[:, 0], prefix[:, 0]) > 1e-3


# ----------------------------------------------------------------------------
# The multi-token cache: chunked == teacher forced, per-row positions, rollback.
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("k", range(1, 9))
def test_t5_chunked_decoding_matches_teacher_forcing(t5, k):
  got = decode_in_chunks(t5.model, t5.params, t5.dec, k, max_len=16, encoded=t5.encoded)
  assert max_diff(got, t5.teacher) <= ATOL


@pytest.mark.parametrize("k", range(1, 9))
def test_decoder_only_chunked_decoding_matches_teacher_forcing(lm, k):
  got = decode_in_chunks(lm.model, lm.params, lm.tokens, k, max_len=16)
  assert max_diff(got, lm.teacher) <= ATOL


def test_decoder_only_long_cache_matches_teacher_forcing(lm):
  # Past max_distance = 128: every query sees keys in the saturated bucket.
  tokens = np.random.default_rng(5).integers(1, VOCAB, (2, 150))
  teacher = np.asarray(lm.model.logits(lm.params, tokens))
  cache = lm.model.init_cache(2, 150)
  logits, cache = lm.model.decode(lm.params, cache, tokens[:, :130], np.zeros(2, np.int32))
  assert max_diff(logits, teacher[:, :130]) <= ATOL
  for start in range(130, 150, 5):
    logits, cache = lm.model.decode(lm.params, cache, tokens[:, start:start + 5],
                                    np.full(2, start, np.int32))
    assert max_diff(logits, teacher[:, start:start + 5]) <= ATOL


def test_t5_rows_at_different_positions(t5):
  model, params = t5.model, t5.params
  cache = model.init_cache(3, 16)
  _, cache = model.decode(params, cache, t5.dec[:, :7], np.zeros(3, np.int32), t5.encoded)
  pos = np.array([3, 7, 5], np.int32)
  chunk = np.stack([t5.dec[b, p:p + 3] for b, p in enumerate(pos)])
  logits, _ = model.decode(params, cache, chunk, pos, t5.encoded)
  for b, p in enumerate(pos):
    assert max_diff(logits[b], t5.teacher[b, p:p + 3]) <= ATOL


def _check_rollback(decode, init_cache, teacher, true_seqs):
  """Guess, reject, move each row's length back, and compare with a fresh run."""
  rng = np.random.default_rng(7)
  batch = len(true_seqs)
  cache = init_cache(batch, 16)
  _, cache = decode(cache, true_seqs[:, :4], np.zeros(batch, np.int32))
  # Four guesses per row; row b's first `accepted[b]` guesses are right.
  accepted = np.arange(batch) % 3
  # Wrong guesses: any id in [1, VOCAB) other than the true token.
  guesses = 1 + (true_seqs[:, 4:8] - 1 + rng.integers(1, VOCAB - 1, (batch, 4))) % (VOCAB - 1)
  for b in range(batch):
    guesses[b, :accepted[b]] = true_seqs[b, 4:4 + accepted[b]]
  _, cache = decode(cache, guesses, np.full(batch, 4, np.int32))
  # Roll back: each row continues after its accepted prefix, with one token
  # first so that rejected guesses stay in later slots and must be masked.
  pos = 4 + accepted
  for k in (1, 2):
    chunk = np.stack([true_seqs[b, p:p + k] for b, p in enumerate(pos)])
    logits, cache = decode(cache, chunk, pos.astype(np.int32))
    for b, p in enumerate(pos):
      assert max_diff(logits[b], teacher[b, p:p + k]) <= ATOL
    pos = pos + k


def test_t5_rollback_after_rejection(t5):
  model, params = t5.model, t5.params
  _check_rollback(lambda c, t, p: model.decode(params, c, t, p, t5.encoded),
                  model.init_cache, t5.teacher, t5.dec)


def test_decoder_only_rollback_after_rejection(lm):
  model, params = lm.model, lm.params
  _check_rollback(lambda c, t, p: model.decode(params, c, t, p, None), model.init_cache,
                  lm.teacher, lm.tokens)


@pytest.mark.parametrize("prefix_lm", [False, True])
def test_decoder_only_padded_prefill_then_decode(lm, prefix_lm):
  """The decode loop's use: prefill padded prompts at 0, go on per row."""
  model = lm.prefix_model if prefix_lm else lm.model
  lengths = np.array([3, 6, 5], np.int32)
  kwargs = {"prefix_lengths": lengths} if prefix_lm else {}
  teacher = np.asarray(model.logits(lm.params, lm.tokens, **kwargs))
  prompts = lm.tokens[:, :6].copy()
  prompts[0, 3:] = 0
  prompts[2, 5:] = 0
  cache = model.init_cache(3, 16)
  logits, cache = model.decode(lm.params, cache, prompts, np.zeros(3, np.int32), **kwargs)
  for b, n in enumerate(lengths):
    assert max_diff(logits[b, :n], teacher[b, :n]) <= ATOL
  pos = lengths.copy()
  for k in (1, 3, 2):
    chunk = np.stack([lm.tokens[b, p:p + k] for b, p in enumerate(pos)])
    logits, cache = model.decode(lm.params, cache, chunk, pos)
    for b, p in enumerate(pos):
      assert max_diff(logits[b], teacher[b, p:p + k]) <= ATOL
    pos = pos + k
  if prefix_lm:  # the prompt really was attended bidirectionally
    assert max_diff(teacher[:, 0], lm.teacher[:, 0]) > 1e-3


# ----------------------------------------------------------------------------
# Pure functions: jit, vmap, grad, no hidden state, cache allocated once.
# ----------------------------------------------------------------------------
def test_t5_decode_under_jit_and_vmap(t5):
  model, params, encoded = t5.model, t5.params, t5.encoded
  assert isinstance(model, DecodingModel) and model.is_encoder_decoder
  assert model.vocab_size == VOCAB
  tokens, pos = t5.dec[:, :3], np.zeros(3, np.int32)
  cache = model.init_cache(3, 16)
  want, want_cache = model.decode(params, cache, tokens, pos, encoded)
  got, _ = jax.jit(model.decode)(params, cache, tokens, pos, encoded)
  assert max_diff(got, want) <= ATOL
  # vmap over groups of rows: [3 groups, 1 row, ...].
  split = lambda x: x[:, None]
  vm = jax.vmap(model.decode, in_axes=(None, 0, 0, 0, 0))
  got_v, cache_v = vm(params, jax.tree_util.tree_map(split, cache), split(tokens),
                      split(pos), jax.tree_util.tree_map(split, encoded))
  assert max_diff(np.asarray(got_v)[:, 0], want) <= ATOL
  assert max_diff(np.asarray(cache_v.keys[1])[:, 0], want_cache.keys[1]) <= ATOL
  # Equal configs give equal, hashable models (usable as static jit arguments).
  assert T5Model(T5_CFG) == model and hash(T5Model(T5_CFG)) == hash(model)
  assert DecoderOnlyModel(DEC_CFG) != DecoderOnlyModel(DEC_CFG, prefix_lm=True)
  # The same call twice gives the same answer, and the input cache is untouched.
  again, _ = model.decode(params, cache, tokens, pos, encoded)
  np.testing.assert_array_equal(np.asarray(again), np.asarray(want))
  assert all(not np.any(np.asarray(b)) for b in cache.keys + cache.values)


def test_decoder_only_decode_under_jit_and_vmap(lm):
  model, params = lm.model, lm.params
  assert isinstance(model, DecodingModel) and not model.is_encoder_decoder
  assert model.encode(params, lm.tokens) is None
  cache = model.init_cache(3, 16)
  tokens, pos = lm.tokens[:, :4], np.array([0, 2, 5], np.int32)
  want, _ = model.decode(params, cache, tokens, pos)
  got, _ = jax.jit(model.decode)(params, cache, tokens, pos, None)
  assert max_diff(got, want) <= ATOL
  # One row per vmapped call: the cache's row axis becomes the mapped axis.
  per_row = jax.vmap(lambda c, t, p: model.decode(params, c, t[None], p[None]))
  got_v, _ = per_row(jax.tree_util.tree_map(lambda x: x[:, None], cache), tokens, pos)
  assert max_diff(np.asarray(got_v)[:, 0], want) <= ATOL


def test_cache_is_allocated_once_and_keeps_its_shape(t5, lm):
  for model, cfg, layers, encoded in ((t5.model, T5_CFG, T5_CFG.num_decoder_layers, t5.encoded),
                                      (lm.model, DEC_CFG, DEC_CFG.num_layers, None)):
    cache = model.init_cache(3, 16)
    assert isinstance(cache, KVCache) and (cache.batch, cache.max_len) == (3, 16)
    assert {tuple(b.shape) for b in cache.keys} == {(3, cfg.num_heads, cfg.head_dim, 16)}
    assert {tuple(b.shape) for b in cache.values} == {(3, cfg.num_heads, 16, cfg.head_dim)}
    assert len(cache.keys) == len(cache.values) == layers
    nbytes = sum(b.nbytes for b in cache.keys + cache.values)
    assert nbytes == 2 * layers * 3 * 16 * cfg.num_heads * cfg.head_dim * 4
    params = t5.params if encoded is not None else lm.params
    _, new = model.decode(params, cache, np.ones((3, 4), np.int32), np.zeros(3, np.int32),
                          encoded)
    assert jax.tree_util.tree_map(jnp.shape, new) == jax.tree_util.tree_map(jnp.shape, cache)


def _cache_sized_ops(text, numel):
  """Ops of the compiled while body whose result has one cache buffer's element count."""
  body = re.search(r"body=%([\w.\-]+)", text).group(1)
  block = text[text.index(f"\n%{body} ("):]
  block = block[:block.index("\n}")]
  ops = []
  for shape, op in re.findall(r"= \w+\[([\d,]*)\]\S* ([\w\-]+)\(", block):
    if op not in ("parameter", "get-tuple-element", "bitcast", "tuple") and \
        math.prod(int(d) for d in shape.split(",") if d) == numel:
      ops.append(op)
  return ops


@pytest.mark.usefixtures("default_cpu_emitters")  # the program XLA:CPU compiles for a user
@pytest.mark.parametrize("family", ["t5", "lm"])
@pytest.mark.parametrize("batch,k", [(1, 1), (2, 1), (2, 3)])
def test_decode_writes_each_cache_buffer_once_and_copies_none(t5, lm, family, batch, k):
  # The compiled decode loop touches each [B, H, L, D] buffer once per call: its
  # in-place update. No transposed copy for the attention einsums, no copy to
  # keep the old buffer alive across the write (the layout note in layers.py).
  # XLA:CPU's program is read on every host (the arguments placed on the CPU device): another
  # backend's HLO text has other fusions and layouts.
  fam = t5 if family == "t5" else lm
  model, cfg = fam.model, fam.model.config
  on_cpu = lambda tree: jax.device_put(tree, jax.devices("cpu")[0])
  encoded = (on_cpu(jax.tree_util.tree_map(lambda x: x[:batch], fam.encoded))
             if family == "t5" else None)
  cache = on_cpu(model.init_cache(batch, 32))

  def loop(params, cache, encoded, n):
    def body(i, carry):
      cache, acc = carry
      tokens = jnp.full((batch, k), 3, jnp.int32)
      logits, cache = model.decode(params, cache, tokens, i + jnp.arange(batch), encoded)
      return cache, acc + logits[:, -1, 0].sum()
    return jax.lax.fori_loop(0, n, body, (cache, 0.0))

  text = jax.jit(loop).lower(on_cpu(fam.params), cache, encoded, 4).compile().as_text()
  layers = len(cache.keys)
  ops = _cache_sized_ops(text, batch * cfg.num_heads * 32 * cfg.head_dim)
  assert len(ops) == 2 * layers, (f"{len(ops)} cache-sized ops per call, want {2 * layers} "
                                  f"(one in-place write per buffer): {ops}")


def test_logits_are_differentiable(lm):
  def loss(params):
    logp = jax.nn.log_softmax(lm.model.logits(params, lm.tokens[:, :-1]))
    return -jnp.mean(jnp.take_along_axis(logp, lm.tokens[:, 1:, None], -1))
  grads = jax.grad(loss)(lm.params)
  norms = [float(jnp.linalg.norm(g)) for _, g in flatten(grads)]
  assert all(np.isfinite(norms)) and min(norms) > 0


def test_bfloat16_compute(t5):
  cfg = T5Config(**{**T5_CFG.__dict__, "dtype": "bfloat16"})
  model = T5Model(cfg)
  encoded = model.encode(t5.params, t5.inputs)
  cache = model.init_cache(3, 16)
  assert cache.keys[0].dtype == jnp.bfloat16
  logits, _ = model.decode(t5.params, cache, t5.dec[:, :4], np.zeros(3, np.int32), encoded)
  assert logits.dtype == jnp.float32
  assert max_diff(logits, t5.teacher[:, :4]) < 0.25 * np.abs(t5.teacher).max()


# ----------------------------------------------------------------------------
# Parameter trees: T5X names and shapes, T5X initializers.
# ----------------------------------------------------------------------------
def t5x_attention(prefix, emb, inner):
  out = {f"{prefix}/{n}/kernel": (emb, inner) for n in ("query", "key", "value")}
  out[f"{prefix}/out/kernel"] = (inner, emb)
  return out


def t5x_mlp(prefix, emb, mlp, acts):
  names = ["wi"] if len(acts) == 1 else [f"wi_{i}" for i in range(len(acts))]
  out = {f"{prefix}/{n}/kernel": (emb, mlp) for n in names}
  out[f"{prefix}/wo/kernel"] = (mlp, emb)
  return out


def t5x_t5_tree(vocab, emb, heads, head_dim, mlp, n_enc, n_dec, acts=("gelu", "linear"),
                logits_via_embedding=False):
  """Names and shapes of t5x/examples/t5/network.py's Transformer."""
  inner = heads * head_dim
  tree = {"token_embedder/embedding": (vocab, emb),
          "encoder/relpos_bias/rel_embedding": (heads, 32),
          "encoder/encoder_norm/scale": (emb,),
          "decoder/relpos_bias/rel_embedding": (heads, 32),
          "decoder/decoder_norm/scale": (emb,)}
  if not logits_via_embedding:
    tree["decoder/logits_dense/kernel"] = (emb, vocab)
  for i in range(n_enc):
    p = f"encoder/layers_{i}"
    tree[f"{p}/pre_attention_layer_norm/scale"] = (emb,)
    tree[f"{p}/pre_mlp_layer_norm/scale"] = (emb,)
    tree.update(t5x_attention(f"{p}/attention", emb, inner))
    tree.update(t5x_mlp(f"{p}/mlp", emb, mlp, acts))
  for i in range(n_dec):
    p = f"decoder/layers_{i}"
    for norm in ("pre_self_attention_layer_norm", "pre_cross_attention_layer_norm",
                 "pre_mlp_layer_norm"):
      tree[f"{p}/{norm}/scale"] = (emb,)
    tree.update(t5x_attention(f"{p}/self_attention", emb, inner))
    tree.update(t5x_attention(f"{p}/encoder_decoder_attention", emb, inner))
    tree.update(t5x_mlp(f"{p}/mlp", emb, mlp, acts))
  return tree


def t5x_decoder_only_tree(vocab, emb, heads, head_dim, mlp, layers,
                          logits_via_embedding=True):
  """Names and shapes of t5x/examples/decoder_only/network.py's DecoderWrapper."""
  tree = {"decoder/token_embedder/embedding": (vocab, emb),
          "decoder/relpos_bias/rel_embedding": (heads, 32),
          "decoder/decoder_norm/scale": (emb,)}
  if not logits_via_embedding:
    tree["decoder/logits_dense/kernel"] = (emb, vocab)
  for i in range(layers):
    p = f"decoder/layers_{i}"
    tree[f"{p}/pre_self_attention_layer_norm/scale"] = (emb,)
    tree[f"{p}/pre_mlp_layer_norm/scale"] = (emb,)
    tree.update(t5x_attention(f"{p}/self_attention", emb, heads * head_dim))
    tree.update(t5x_mlp(f"{p}/mlp", emb, mlp, ("gelu", "linear")))
  return tree


def shapes_of(model):
  shapes = model.param_shapes()
  assert all(s.dtype == jnp.float32 for _, s in flatten(shapes))
  return {name: tuple(s.shape) for name, s in flatten(shapes)}


@pytest.mark.parametrize("name,sizes", [
    ("tiny", (32128, 8, 4, 3, 16, 2, 2)),  # t5x/examples/t5/t5_1_1/tiny.gin
    ("small", (32128, 512, 6, 64, 1024, 8, 8)),  # t5x/examples/t5/t5_1_1/small.gin
])
def test_t5_param_tree_has_t5x_names_and_shapes(name, sizes):
  vocab, emb, heads, head_dim, mlp, n_enc, n_dec = sizes
  model = T5Model(T5Config(vocab_size=vocab, emb_dim=emb, num_heads=heads,
                           num_encoder_layers=n_enc, num_decoder_layers=n_dec,
                           head_dim=head_dim, mlp_dim=mlp))
  assert shapes_of(model) == t5x_t5_tree(*sizes), name


def test_t5_1_0_style_tree_names_single_kernel_wi():
  model = T5Model(T5Config(vocab_size=100, emb_dim=8, num_heads=2, num_encoder_layers=1,
                           num_decoder_layers=1, head_dim=4, mlp_dim=16,
                           mlp_activations=("relu",), logits_via_embedding=True))
  assert shapes_of(model) == t5x_t5_tree(100, 8, 2, 4, 16, 1, 1, ("relu",), True)


@pytest.mark.parametrize("logits_via_embedding", [True, False])
def test_decoder_only_param_tree_has_t5x_names_and_shapes(logits_via_embedding):
  # T5X decoder-only base.gin sizes.
  model = DecoderOnlyModel(DecoderOnlyConfig(
      vocab_size=32128, emb_dim=768, num_heads=12, num_layers=12, head_dim=64,
      mlp_dim=2048, logits_via_embedding=logits_via_embedding))
  assert shapes_of(model) == t5x_decoder_only_tree(32128, 768, 12, 64, 2048, 12,
                                                   logits_via_embedding)


def test_init_follows_t5x_initializers():
  emb, heads, head_dim, mlp = 128, 4, 32, 256
  model = T5Model(T5Config(vocab_size=512, emb_dim=emb, num_heads=heads,
                           num_encoder_layers=1, num_decoder_layers=1, head_dim=head_dim,
                           mlp_dim=mlp))
  params = model.init(jax.random.PRNGKey(0))
  flat = {n: np.asarray(v) for n, v in flatten(params)}
  want_std = {
      "token_embedder/embedding": 1.0,  # normal(1.0)
      "encoder/layers_0/attention/query/kernel": 1 / math.sqrt(emb * head_dim),
      "encoder/layers_0/attention/key/kernel": 1 / math.sqrt(emb),
      "decoder/layers_0/encoder_decoder_attention/value/kernel": 1 / math.sqrt(emb),
      "decoder/layers_0/self_attention/out/kernel": 1 / math.sqrt(heads * head_dim),
      "decoder/layers_0/mlp/wi_0/kernel": 1 / math.sqrt(emb),
      "encoder/layers_0/mlp/wo/kernel": 1 / math.sqrt(mlp),
      "decoder/logits_dense/kernel": 1 / math.sqrt(emb),
  }
  for name, std in want_std.items():
    assert abs(flat[name].std() / std - 1) < 0.05, name
    assert abs(flat[name].mean()) < 0.05 * std, name
  # Truncated normal (fan_in) in the MLP: nothing beyond 2 stddevs of the base normal.
  wi = flat["decoder/layers_0/mlp/wi_0/kernel"]
  assert np.abs(wi).max() < 2 * 1.14 / math.sqrt(emb)
  # Relative embeddings: uniform(+-sqrt(3 / fan_avg)), fan_avg = (H + 32) / 2.
  limit = math.sqrt(3 / ((heads + 32) / 2))
  rel = flat["encoder/relpos_bias/rel_embedding"]
  assert np.abs(rel).max() <= limit and np.abs(rel).max() > 0.8 * limit
  for name, value in flat.items():
    if name.endswith("/scale"):
      np.testing.assert_array_equal(value, np.ones_like(value))
  again = model.init(jax.random.PRNGKey(0))
  other = model.init(jax.random.PRNGKey(1))
  embedding = flat["token_embedder/embedding"]
  np.testing.assert_array_equal(again["token_embedder"]["embedding"], embedding)
  assert max_diff(other["token_embedder"]["embedding"], embedding) > 1


# ----------------------------------------------------------------------------
# Bad input.
# ----------------------------------------------------------------------------
def test_out_of_vocabulary_tokens_raise(t5, lm):
  bad = t5.dec[:, :2].copy()
  bad[1, 1] = VOCAB
  cache = t5.model.init_cache(3, 16)
  with pytest.raises(ValueError, match=r"token id 61 at \[1, 1\].*vocabulary \[0, 61\)"):
    t5.model.decode(t5.params, cache, bad, np.zeros(3, np.int32), t5.encoded)
  with pytest.raises(ValueError, match="encoder inputs: token id -1"):
    t5.model.encode(t5.params, np.array([[3, -1]]))
  with pytest.raises(ValueError, match="decoder_input_tokens: token id 99"):
    t5.model.logits(t5.params, t5.inputs, np.full((3, 2), 99))
  with pytest.raises(ValueError, match="logits tokens: token id 61"):
    lm.model.logits(lm.params, np.array([[1, VOCAB]]))
  with pytest.raises(ValueError, match=r"integer array \[batch, length\]"):
    lm.model.logits(lm.params, np.ones(4, np.int32))


def test_positions_past_the_cache_raise(t5, lm):
  cache = lm.model.init_cache(3, 16)
  tokens = np.ones((3, 3), np.int32)
  lm.model.decode(lm.params, cache, tokens, np.array([0, 13, 2], np.int32))  # fits exactly
  with pytest.raises(ValueError, match=r"positions\[1\]=14 with 3 tokens runs past the "
                                       r"cache length 16"):
    lm.model.decode(lm.params, cache, tokens, np.array([0, 14, 2], np.int32))
  with pytest.raises(ValueError, match=">= 0"):
    lm.model.decode(lm.params, cache, tokens, np.array([-1, 0, 0], np.int32))
  with pytest.raises(ValueError, match=r"positions must be an integer array \[batch=3\]"):
    lm.model.decode(lm.params, cache, tokens, np.zeros(2, np.int32))
  with pytest.raises(ValueError, match=r"cache key buffer shape \(2, .*batch=3"):
    lm.model.decode(lm.params, lm.model.init_cache(2, 16), tokens, np.zeros(3, np.int32))
  swapped = lm.model.init_cache(3, 16)
  swapped = KVCache(keys=swapped.values, values=swapped.keys)  # [B, H, L, D] keys: the old layout
  with pytest.raises(ValueError, match=r"cache key buffer shape .*head_dim, max_len"):
    lm.model.decode(lm.params, swapped, tokens, np.zeros(3, np.int32))
  with pytest.raises(ValueError, match="prefix_lengths"):  # past the tokens written
    lm.prefix_model.decode(lm.params, cache, tokens, np.zeros(3, np.int32),
                           prefix_lengths=np.array([2, 4, 1]))
  with pytest.raises(ValueError, match="needs prefix_lengths"):
    lm.prefix_model.logits(lm.params, tokens)
  with pytest.raises(ValueError, match="needs encoded"):
    t5.model.decode(t5.params, t5.model.init_cache(3, 16), np.zeros((3, 1), np.int32),
                    np.zeros(3, np.int32), None)
  with pytest.raises(ValueError, match="batch must be a positive integer"):
    lm.model.init_cache(0, 8)


def test_mismatched_params_name_the_first_offender(t5, lm):
  params = jax.tree_util.tree_map(lambda x: x, t5.params)
  del params["decoder"]["layers_1"]["mlp"]["wi_1"]
  with pytest.raises(ValueError, match="missing parameter 'decoder/layers_1/mlp/wi_1/kernel'"):
    t5.model.decode(params, t5.model.init_cache(3, 16), np.zeros((3, 1), np.int32),
                    np.zeros(3, np.int32), t5.encoded)
  params = jax.tree_util.tree_map(lambda x: x, lm.params)
  params["decoder"]["layers_0"]["self_attention"]["query"]["kernel"] = np.zeros((16, 14))
  with pytest.raises(ValueError, match=r"'decoder/layers_0/self_attention/query/kernel' has "
                                       r"shape \(16, 14\).*expects \(16, 15\)"):
    lm.model.logits(params, lm.tokens)
  params = jax.tree_util.tree_map(lambda x: x, lm.params)
  params["decoder"]["logits_dense"] = {"kernel": np.zeros((16, VOCAB))}
  with pytest.raises(ValueError, match="unexpected parameter 'decoder/logits_dense/kernel'"):
    lm.model.check_params(params, "my checkpoint")
  with pytest.raises(ValueError, match="wrapped in {'params': ...}"):
    lm.model.logits({"params": lm.params}, lm.tokens)
  # A T5 tree is not a decoder-only tree.
  with pytest.raises(ValueError, match="missing parameter 'decoder/token_embedder/embedding'"):
    lm.model.check_params(t5.params)


def test_bad_configs_raise():
  base = dict(vocab_size=10, emb_dim=8, num_heads=2, num_layers=1, head_dim=4, mlp_dim=8)
  with pytest.raises(ValueError, match="unknown MLP activation 'gelux'"):
    DecoderOnlyConfig(**base, mlp_activations=("gelux", "linear"))
  with pytest.raises(ValueError, match="num_heads must be a positive integer"):
    DecoderOnlyConfig(**{**base, "num_heads": 0})
  with pytest.raises(ValueError, match="dtype must be one of"):
    DecoderOnlyConfig(**base, dtype="float8")
  with pytest.raises(ValueError, match="needs a T5Config"):
    T5Model(DecoderOnlyConfig(**base))
  cfg = DecoderOnlyConfig(**base, mlp_activations=["gelu", "linear"])  # gin may give a list
  assert cfg.mlp_activations == ("gelu", "linear") and hash(cfg)


# ----------------------------------------------------------------------------
# gin files.
# ----------------------------------------------------------------------------
def _configurable(cls):
  """The gin configurable of cls, registering it unless specjax already did."""
  try:
    return gin.get_configurable(cls.__name__)
  except ValueError:
    return gin.external_configurable(cls)  # registers 'specjax.models.<module>.<name>'


@pytest.fixture(scope="module")
def gin_factories():
  gin.add_config_file_search_path(GIN_DIR)
  return {"t5_1_1": _configurable(T5Config), "decoder_only": _configurable(DecoderOnlyConfig)}


T5_SIZES = {  # t5x/examples/t5/t5_1_1/*.gin: emb, heads, layers, head_dim, mlp; params
    "tiny": ((8, 4, 2, 3, 16), None),
    "small": ((512, 6, 8, 64, 1024), 76_961_152),  # published T5 1.1 parameter counts
    "base": ((768, 12, 12, 64, 2048), 247_577_856),
    "large": ((1024, 16, 24, 64, 2816), 783_150_080),
    "xl": ((2048, 32, 24, 64, 5120), 2_849_757_184),
    "xxl": ((4096, 64, 24, 64, 10240), 11_135_332_352),
}
DECODER_ONLY_SIZES = {  # t5x/examples/decoder_only/models/*.gin (+ specjax's tiny, small)
    "tiny": (8, 4, 2, 3, 16), "small": (512, 6, 8, 64, 1024), "base": (768, 12, 12, 64, 2048),
    "large": (1024, 16, 24, 64, 2816), "xl": (2048, 32, 24, 64, 5120),
    "xxl": (4096, 64, 24, 64, 10240),
}


@pytest.mark.parametrize("size", sorted(T5_SIZES))
def test_t5_gin_files(gin_factories, size):
  (emb, heads, layers, head_dim, mlp), n_params = T5_SIZES[size]
  gin.clear_config()
  try:
    gin.parse_config_file(os.path.join(GIN_DIR, "models", f"t5_1_1_{size}.gin"))
    cfg = gin_factories["t5_1_1"]()
  finally:
    gin.clear_config()
  assert cfg == T5Config(vocab_size=32128, emb_dim=emb, num_heads=heads,
                         num_encoder_layers=layers, num_decoder_layers=layers,
                         head_dim=head_dim, mlp_dim=mlp, mlp_activations=("gelu", "linear"),
                         logits_via_embedding=False, dtype="float32")
  if n_params is not None:
    assert count_params(T5Model(cfg).param_shapes()) == n_params


@pytest.mark.parametrize("size", sorted(DECODER_ONLY_SIZES))
def test_decoder_only_gin_files(gin_factories, size):
  emb, heads, layers, head_dim, mlp = DECODER_ONLY_SIZES[size]
  gin.clear_config()
  try:
    gin.parse_config_file(os.path.join(GIN_DIR, "models", f"decoder_only_{size}.gin"))
    cfg = gin_factories["decoder_only"]()
  finally:
    gin.clear_config()
  assert cfg == DecoderOnlyConfig(vocab_size=32128, emb_dim=emb, num_heads=heads,
                                  num_layers=layers, head_dim=head_dim, mlp_dim=mlp,
                                  mlp_activations=("gelu", "linear"),
                                  logits_via_embedding=True, dtype="float32",
                                  prompt_convention="t5x",  # T5X's DecoderOnlyModel: BOS
                                  inputs_bidirectional_attention=False)


def _round_bf16(x):
  return np.asarray(np.asarray(x, np.float32).astype(jnp.bfloat16), np.float64)


def test_bfloat16_kernels(lm):
  params16 = cast_kernels(lm.params, jnp.bfloat16)
  for name, value in flatten(params16):  # only the dense kernels and the embedding change
    cast = name.endswith("kernel") or name.endswith("token_embedder/embedding")
    assert (value.dtype == jnp.bfloat16) == cast, name
  # One dense dot: inputs rounded to bfloat16, float32 sums; M = 1 takes the padded path.
  rng = np.random.default_rng(3)
  x, kernel = rng.normal(size=(5, 16)), rng.normal(size=(16, 24))
  for m in (1, 2, 5):
    got = bfloat16_dot(jnp.asarray(x[:m], jnp.float32), jnp.asarray(kernel, jnp.bfloat16))
    assert got.dtype == jnp.float32 and got.shape == (m, 24)
    assert max_diff(got, _round_bf16(x[:m]) @ _round_bf16(kernel)) < 1e-4
    # An embedding table [out, in] as the output projection (Embed.attend).
    got = bfloat16_dot(jnp.asarray(x[:m], jnp.float32), jnp.asarray(kernel.T, jnp.bfloat16),
                       transposed=True)
    assert got.dtype == jnp.float32 and got.shape == (m, 24)
    assert max_diff(got, _round_bf16(x[:m]) @ _round_bf16(kernel)) < 1e-4
  # The whole model: logits move by bfloat16 rounding only, and the cached decode at any
  # width agrees with the same weights' teacher forcing.
  _check_whole_model(lm, params16, moved=0.05, decoded=0.02)


def test_a_bfloat16_embedding_is_gathered_without_a_float32_copy(lm):
  # XLA:CPU gathers bfloat16 through float32, converting the WHOLE table first (and a decode
  # loop then carries that copy, twice the table's bytes, in its state); Embed gathers the
  # rows' 16-bit patterns instead.
  params16 = cast_kernels(lm.params, jnp.bfloat16)
  table = dict(flatten(params16))["decoder/token_embedder/embedding"]
  vocab, emb = table.shape
  tokens = jnp.asarray(lm.tokens[:, :3], jnp.int32)
  step = jax.jit(lambda p, c, t: lm.model.decode(p, c, t, jnp.zeros((3,), jnp.int32), None)[0])
  compiled = step.lower(params16, lm.model.init_cache(3, 8), tokens).compile().as_text()
  assert f"f32[{vocab},{emb}]" not in compiled
  embedded = lm.model.embed(params16, tokens)
  assert embedded.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(embedded),
                                np.asarray(table, np.float32)[np.asarray(tokens)])


def _check_whole_model(lm, params, *, moved, decoded):
  """The model on cast or quantized `params`: its logits differ from float32's, by less than
  `moved` × the largest |logit|, and its cached decode, 1 and 3 tokens a call, agrees with
  the same params' teacher forcing within `decoded` × that."""
  teacher = np.asarray(lm.model.logits(params, lm.tokens))
  scale = np.abs(lm.teacher).max()
  assert 0 < max_diff(teacher, lm.teacher) < moved * scale
  for k in (1, 3):
    got = decode_in_chunks(lm.model, params, lm.tokens, k, max_len=16)
    assert max_diff(got, teacher) < decoded * scale


def _int8_reference(x, values, scales):
  """int8_dot by hand in float64: rows quantized symmetrically (max |x| to 127), exact
  integer sums, both scales applied."""
  top = np.abs(x).max(axis=1, keepdims=True)
  row_scales = np.where(top > 0, top / 127.0, 1.0)
  rows = np.clip(np.rint(x / row_scales), -127, 127)
  return (rows @ values.astype(np.float64)) * row_scales * scales[None, :]


def test_int8_kernels(lm):
  params8 = quantize_kernels(lm.params)
  assert cast_kernels(lm.params, np.int8).keys() == params8.keys()
  names = dict(flatten(params8))
  for name, value in flatten(lm.params):  # the castable ones become int8 plus their scales
    cast = name.endswith("kernel") or name.endswith("token_embedder/embedding")
    assert (names[name].dtype == jnp.int8) == cast, name
    if cast:
      axis = 0 if name.endswith("embedding") else 1
      scales = np.asarray(names[name + "_scale"])
      assert scales.shape == (value.shape[axis],)
      back = np.asarray(names[name], np.float64) * (scales[None, :] if axis else scales[:, None])
      assert max_diff(back, value) <= 0.5 * scales.max() + 1e-7  # half a step at most
  # One dot: exactly the hand computation; M = 1 takes the padded path; [out, in] tables too.
  rng = np.random.default_rng(4)
  x, kernel = rng.normal(size=(5, 16)), rng.normal(size=(16, 24))
  x[4] = 0.0  # an all-zero row
  values, scales = quantize(kernel, 1)
  for m in (1, 2, 5):
    want = _int8_reference(x[:m], values, scales)
    got = int8_dot(jnp.asarray(x[:m], jnp.float32), jnp.asarray(values), jnp.asarray(scales))
    assert got.dtype == jnp.float32 and got.shape == (m, 24)
    assert max_diff(got, want) < 1e-4
    got = int8_dot(jnp.asarray(x[:m], jnp.float32), jnp.asarray(values.T), jnp.asarray(scales),
                   transposed=True)
    assert max_diff(got, want) < 1e-4
    assert max_diff(want, x[:m] @ kernel) < 0.05 * np.abs(x[:m] @ kernel).max() + 1e-9
  # The whole model runs on them (embedding lookup and logits too), its cached decode at any
  # width agreeing with the same weights' teacher forcing.
  lm.model.check_params(params8)
  _check_whole_model(lm, params8, moved=0.1, decoded=0.05)
  # Scales missing or of the wrong shape are named.
  broken = quantize_kernels(lm.params)
  del broken["decoder"]["layers_0"]["mlp"]["wo"]["kernel_scale"]
  with pytest.raises(ValueError, match="'decoder/layers_0/mlp/wo/kernel' is int8 without its "
                                       "scales 'decoder/layers_0/mlp/wo/kernel_scale'"):
    lm.model.check_params(broken)
  broken = quantize_kernels(lm.params)
  broken["decoder"]["token_embedder"]["embedding_scale"] = jnp.ones((16,))
  with pytest.raises(ValueError, match=r"'decoder/token_embedder/embedding_scale' has shape "
                                       rf"\(16,\), but the int8 .* needs \({VOCAB},\)"):
    lm.model.check_params(broken)


def test_logits_at_returns_one_tokens_logits(t5, lm):
  # decode(..., logits_at=i) equals row b's token i of the full call, and writes the same cache.
  index = np.array([2, 0, 3], np.int32)
  for model, params, tokens, encoded in ((t5.model, t5.params, t5.dec[:, :4], t5.encoded),
                                         (lm.model, lm.params, lm.tokens[:, :4], None)):
    assert model.accepts_logits_at
    cache = model.init_cache(3, 16)
    pos = np.array([0, 2, 1], np.int32)
    full, full_cache = model.decode(params, cache, tokens, pos, encoded)
    one, one_cache = model.decode(params, cache, tokens, pos, encoded, logits_at=index)
    assert one.shape == (3, 1, VOCAB)
    want = np.asarray(full)[np.arange(3), index]
    assert max_diff(one[:, 0], want) <= ATOL
    assert max_diff(jax.tree_util.tree_leaves(one_cache)[0],
                    jax.tree_util.tree_leaves(full_cache)[0]) == 0
    got, _ = decode_logits_at(model, params, cache, tokens, pos, encoded, index)
    assert max_diff(got, want) <= ATOL
    with pytest.raises(ValueError, match=r"logits_at \[2, 0, 4\] must index the call's 4"):
      model.decode(params, cache, tokens, pos, encoded, logits_at=np.array([2, 0, 4]))
    with pytest.raises(ValueError, match=r"logits_at must be an integer array \[batch=3\]"):
      model.decode(params, cache, tokens, pos, encoded, logits_at=np.zeros(2, np.int32))
