"""The attention_impl option: jax.nn.dot_product_attention computes what specjax's attention does.

Float32 numbers are compared at the 'highest' matmul precision (exact float32 products on every
backend); the two implementations then differ only in the order of float sums, far below 1e-5,
and greedy tokens are equal. The HLO checks read XLA's optimized text of a compiled step loop.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.aot import hlo as hlo_stats
from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.draft import ModelDrafter
from specjax.models import (DecoderOnlyConfig, DecoderOnlyModel, T5Config, T5Model,
                            model_gin_text)
from specjax.models.layers import ATTENTION_IMPLEMENTATIONS
from specjax.models.tree import level_call, tree_call
from specjax.sampling import Sampling

VOCAB = 97
ATOL = 1e-5
DEC = DecoderOnlyConfig(vocab_size=VOCAB, emb_dim=24, num_heads=3, num_layers=2, head_dim=5,
                        mlp_dim=32, logits_via_embedding=False)
T5 = T5Config(vocab_size=VOCAB, emb_dim=16, num_heads=2, num_encoder_layers=2,
              num_decoder_layers=2, head_dim=6, mlp_dim=24)


@pytest.fixture(autouse=True)
def highest_precision():
  with jax.default_matmul_precision("highest"):
    yield


def pair(config, impl):
  """(default model, model with attention_impl=impl, shared params)."""
  build = T5Model if isinstance(config, T5Config) else DecoderOnlyModel
  base = build(config)
  return base, build(dataclasses.replace(config, attention_impl=impl)), base.init(5)


def max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def test_default_is_specjax_and_bad_values_are_named():
  assert DEC.attention_impl == T5.attention_impl == "specjax"
  assert set(ATTENTION_IMPLEMENTATIONS) == {"specjax", "xla", "cudnn"}
  with pytest.raises(ValueError, match="attention_impl must be one of .*'flash'"):
    dataclasses.replace(DEC, attention_impl="flash")
  # model.gin files written before the option stay unchanged; a set option is written.
  assert "attention_impl" not in model_gin_text(DEC)
  assert "DecoderOnlyConfig.attention_impl = 'xla'" in model_gin_text(
      dataclasses.replace(DEC, attention_impl="xla"))


def test_decoder_only_logits_match_teacher_forced_and_cached():
  base, fused, params = pair(DEC, "xla")
  tokens = np.random.default_rng(0).integers(1, VOCAB, (3, 11))
  assert max_diff(fused.logits(params, tokens), base.logits(params, tokens)) <= ATOL
  # cached calls of 4, 1 and 3 tokens at per-row positions, then a rollback of row 0
  caches = [m.init_cache(3, 16) for m in (base, fused)]
  for chunk, pos in ((tokens[:, :4], [0, 0, 0]), (tokens[:, 4:5], [4, 3, 2]),
                     (tokens[:, 5:8], [5, 4, 3]), (tokens[:, 8:9], [2, 7, 6])):
    pos = np.asarray(pos, np.int32)
    (want, caches[0]), (got, caches[1]) = (m.decode(params, c, chunk, pos)
                                           for m, c in zip((base, fused), caches))
    assert got.shape == want.shape and max_diff(got, want) <= ATOL
  for a, b in zip(caches[0].keys + caches[0].values, caches[1].keys + caches[1].values):
    assert max_diff(a, b) <= ATOL


def test_t5_logits_match_teacher_forced_and_cached():
  base, fused, params = pair(T5, "xla")
  rng = np.random.default_rng(1)
  inputs = rng.integers(2, VOCAB, (2, 7))
  inputs[1, 4:] = 0  # padding masks the encoder and cross-attention
  dec = rng.integers(1, VOCAB, (2, 6))
  assert max_diff(fused.logits(params, inputs, dec), base.logits(params, inputs, dec)) <= ATOL
  encoded = [m.encode(params, inputs) for m in (base, fused)]
  assert max_diff(encoded[1].keys[0], encoded[0].keys[0]) <= ATOL
  want, _ = base.decode(params, base.init_cache(2, 8), dec[:, :3], np.zeros(2, np.int32),
                        encoded[0])
  got, _ = fused.decode(params, fused.init_cache(2, 8), dec[:, :3], np.zeros(2, np.int32),
                        encoded[1])
  assert max_diff(got, want) <= ATOL


@pytest.mark.parametrize("family", ["decoder_only", "t5"])
def test_tree_calls_match(family):
  # a token tree of 5 nodes (two roots' children, three grandchildren) after a 4-token prefix:
  # the target's call over the whole tree, then a draft-style call over its second level
  base, fused, params = pair(DEC if family == "decoder_only" else T5, "xla")
  rng = np.random.default_rng(3)
  inputs = rng.integers(2, VOCAB, (2, 5))
  encoded = [m.encode(params, inputs) if family == "t5" else None for m in (base, fused)]
  parent = jnp.asarray([[-1, -1, 0, 0, 1]] * 2, jnp.int32)
  depth = jnp.asarray([[1, 1, 2, 2, 2]] * 2, jnp.int32)
  length = jnp.full(2, 4, jnp.int32)
  prefix = rng.integers(1, VOCAB, (2, 3)).astype(np.int32)
  nodes = rng.integers(1, VOCAB, (2, 6)).astype(np.int32)
  out = []
  for model, enc in zip((base, fused), encoded):
    _, cache = model.decode(params, model.init_cache(2, 16), prefix, np.zeros(2, np.int32), enc)
    full, _ = model.decode(params, cache, nodes, length - 1, enc,
                           tree=tree_call(parent, depth, length))
    _, cache = model.decode(params, cache, nodes[:, 1:3], length, enc,
                            tree=level_call(parent, depth, length, 0, 2, 16))
    level, _ = model.decode(params, cache, nodes[:, 3:], length + 2, enc,
                            tree=level_call(parent, depth, length, 2, 5, 16))
    out.append((full, level))
  for got, want in zip(out[1], out[0]):
    assert got.shape == want.shape and max_diff(got, want) <= ATOL


@pytest.mark.parametrize("family", ["decoder_only", "t5"])
def test_greedy_tokens_are_equal(family, tmp_path):
  # Untied logits: a random model's greedy continuation then varies from token to token, so
  # 2 rows x 12 tokens of argmax over 97 entries compare many distinct decisions.
  config = DEC if family == "decoder_only" else dataclasses.replace(T5,
                                                                   logits_via_embedding=False)
  base, fused, params = pair(config, "xla")
  inputs = np.random.default_rng(2).integers(2, VOCAB, (2, 6)).astype(np.int32)
  config = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=-1, cache_len=32)
  key = jax.random.PRNGKey(0)
  want = autoregressive_decode(base, params, inputs, max_new_tokens=12, rng=key, config=config)
  assert len(set(np.asarray(want.tokens).ravel().tolist())) > 4  # not one repeated token
  got = autoregressive_decode(fused, params, inputs, max_new_tokens=12, rng=key, config=config)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  jax.config.update("jax_dump_ir_to", str(tmp_path))  # the StableHLO of what compiles now
  try:
    spec = speculative_decode(fused, params, ModelDrafter(base, 3), params, inputs,
                              max_new_tokens=12, gamma=3, rng=key, config=config)
  finally:
    jax.config.update("jax_dump_ir_to", "")
  np.testing.assert_array_equal(spec.tokens, want.tokens)
  # the draft is the target's own network, computed the other way: every guess is accepted
  assert float(np.mean(spec.tokens_per_call)) > 3.5
  # the speculative loop with the fused target: rounds and the draft's steps are loops on
  # the device, and nothing in the module reaches the host
  (module,) = tmp_path.glob("*jit_run_loop*.mlir")
  stats = hlo_stats.stablehlo_stats(module.read_text())
  assert stats["whiles"] >= 2 and stats["host_transfers"] == 0, stats


@pytest.mark.usefixtures("default_cpu_emitters")  # the program XLA:CPU compiles for a user
@pytest.mark.parametrize("impl", ["specjax", "xla"])
def test_compiled_step_loop_has_no_host_transfer(impl):
  base, fused, params = pair(DEC, impl)
  stats = hlo_stats.decode_step_stats(fused, params, batch=2, cache_len=16)
  compiled = stats["compiled"]
  assert compiled["whiles"] == 1 and compiled["body_kernels"] > 0
  assert compiled["body_host_transfers"] == 0 and compiled["entry_host_transfers"] == 0
  assert compiled["body_custom_calls"] == {}  # XLA:CPU: plain ops, no library calls
  cuda = stats["cuda_stablehlo"]  # lowered for CUDA on this machine (no GPU needed)
  assert cuda["whiles"] == 1 and cuda["host_transfers"] == 0, cuda
  # The sublayer entries' Pallas kernel, lowered for the GPU that `kernels_for` names.
  assert "__gpu$xla.gpu.triton" in cuda["custom_calls"], cuda


def test_cudnn_needs_half_precision_and_is_refused_clearly_without_cudnn():
  with pytest.raises(ValueError, match="'cudnn' needs dtype 'bfloat16' or 'float16'"):
    dataclasses.replace(DEC, attention_impl="cudnn")
  if jax.default_backend() == "gpu":
    pytest.skip("this machine may have cuDNN")
  # head_dim 8: JAX 0.12 checks the head size (a multiple of 8) first. Without cuDNN, JAX up to
  # 0.11 names cuDNN; 0.12 says the cuDNN primitive has no CPU lowering.
  _, fused, params = pair(dataclasses.replace(DEC, dtype="bfloat16", head_dim=8), "cudnn")
  with pytest.raises((RuntimeError, NotImplementedError),
                     match="cuDNN|'dot_product_attention_fwd' not found for platform cpu"):
    fused.logits(params, np.ones((1, 4), np.int32))


def test_a_cost_table_saved_before_the_option_still_names_the_same_models():
  """A cost table names the models it was measured on (`auto.describe`); the option left at its
  default adds nothing to that name, so a table saved before the option existed still matches,
  and a model that computes attention another way is told apart."""
  from specjax.decode.auto import describe  # pylint: disable=import-outside-toplevel
  default = describe(DecoderOnlyModel(DEC))
  assert "attention_impl" not in default
  assert default.endswith("inputs_bidirectional_attention=False))")
  fused = describe(DecoderOnlyModel(dataclasses.replace(DEC, attention_impl="xla")))
  assert fused != default and "attention_impl='xla'" in fused
