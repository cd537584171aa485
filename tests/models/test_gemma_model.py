"""The Gemma model without the gemma package: against a hand-written NumPy reference of the
architecture, its multi-token cache against its own teacher-forced pass, decode loops, and
its parameters through an Orbax checkpoint in the library's layout.

The conformance tests against the gemma library itself (Python 3.12): test_gemma.py.
"""
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.checkpoints.gemma import gemma_name
from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode, tree_decode
from specjax.draft import FeatureDrafter, ModelDrafter, StaticTree
from specjax.models import FeatureHead, FeatureHeadConfig, FeatureModel, LayerFeatureModel
from specjax.models.protocol import eagle3_feature_layers
from specjax.models.gemma import GemmaModel, load_gemma
from specjax.models.gemma_config import GEMMA_SIZES, GemmaConfig
from specjax.params import cast_kernels, flatten, unflatten
from specjax.runtime.sharding import param_logical_axes
from specjax.sampling import Sampling
from specjax.testing import TINY_GEMMA_VOCAB, TINY_GEMMA_WINDOW, tiny_gemma_configs

FAMILIES = ("gemma3", "gemma2")


def _params(model, seed):
  """Random params with nonzero norm scales (the init's zeros would hide a missing 1 + s)."""
  params = model.init(seed)
  rng = np.random.default_rng(seed)
  return unflatten({name: np.asarray(v) + (0.3 * rng.standard_normal(v.shape).astype(np.float32)
                                           if name.endswith("scale") else 0)
                    for name, v in flatten(params)})


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
  target_config, draft_config = tiny_gemma_configs(request.param)
  target, draft = GemmaModel(target_config), GemmaModel(draft_config)
  return target, _params(target, 0), draft, _params(draft, 1)


# ------------------------------------------------------------------ the NumPy reference
def _norm(x, scale):
  x = x.astype(np.float64)
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * (1 + scale)


def _rope(x, base, scale):
  """x [T, n, H] at positions 0..T-1."""
  t, _, h = x.shape
  out = np.empty_like(x)
  for p in range(t):
    for i in range(h // 2):
      angle = p / base ** (2 * i / h) / scale
      a, b = x[p, :, i], x[p, :, i + h // 2]
      out[p, :, i] = a * math.cos(angle) - b * math.sin(angle)
      out[p, :, i + h // 2] = b * math.cos(angle) + a * math.sin(angle)
  return out


def _gelu(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def reference_logits(cfg: GemmaConfig, params, tokens):
  """float64 logits [T, V] of one sequence, head by head and query by query."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  table = p["embedder"]["input_embedding"]
  x = table[tokens] * math.sqrt(cfg.embed_dim)
  groups = cfg.num_heads // cfg.num_kv_heads
  for i, kind in enumerate(cfg.attention_types):
    layer = p[f"layer_{i}"]
    att = layer["attn"]
    h = _norm(x, layer["pre_attention_norm"]["scale"])
    if "qkv_einsum" in att:
      q, k, v = (np.einsum("te,neh->tnh", h, w) for w in att["qkv_einsum"]["w"])
    else:
      q = np.einsum("te,neh->tnh", h, att["q_einsum"]["w"])
      k, v = (np.einsum("te,keh->tkh", h, w) for w in att["kv_einsum"]["w"])
    if cfg.use_qk_norm:
      q, k = _norm(q, att["_query_norm"]["scale"]), _norm(k, att["_key_norm"]["scale"])
    base, scale = cfg.rope(i)
    q, k = _rope(q, base, scale) * cfg.query_pre_attn_scalar(), _rope(k, base, scale)
    heads = np.zeros_like(q)
    for n in range(cfg.num_heads):
      for t in range(len(tokens)):
        lo = max(0, t - cfg.sliding_window_size + 1) if kind == "local_sliding" else 0
        scores = k[lo:t + 1, n // groups] @ q[t, n]
        if cfg.attn_logits_soft_cap:
          scores = cfg.attn_logits_soft_cap * np.tanh(scores / cfg.attn_logits_soft_cap)
        weights = np.exp(scores - scores.max())
        heads[t, n] = (weights / weights.sum()) @ v[lo:t + 1, n // groups]
    out = np.einsum("tnh,nhe->te", heads, att["attn_vec_einsum"]["w"])
    if cfg.use_post_attn_norm:
      out = _norm(out, layer["post_attention_norm"]["scale"])
    x = x + out
    h = _norm(x, layer["pre_ffw_norm"]["scale"])
    gating = layer["mlp"]["gating_einsum"]
    if cfg.transpose_gating_einsum:
      gating = np.swapaxes(gating, 1, 2)
    out = (_gelu(h @ gating[0]) * (h @ gating[1])) @ layer["mlp"]["linear"]
    if cfg.use_post_ffw_norm:
      out = _norm(out, layer["post_ffw_norm"]["scale"])
    x = x + out
  logits = _norm(x, p["final_norm"]["scale"]) @ table.T
  if cfg.final_logit_softcap:
    logits = cfg.final_logit_softcap * np.tanh(logits / cfg.final_logit_softcap)
  return logits


def test_logits_equal_the_reference(pair):
  # 20 tokens over a window of 8: local layers differ from global ones past position 7.
  target, params, _, _ = pair
  tokens = np.random.default_rng(3).integers(0, TINY_GEMMA_VOCAB, size=(2, 20))
  logits = np.asarray(target.logits(params, tokens))
  for row in range(2):
    np.testing.assert_allclose(logits[row], reference_logits(target.config, params, tokens[row]),
                               atol=1e-4, rtol=0)


def test_multi_token_calls_mask_each_query_window(pair):
  # Calls of 1, 3 and 5 tokens (γ + 1 for γ = 0, 2, 4) across the window: each query sees its own
  # window among the cache and the call's earlier tokens, so the cached logits equal the
  # teacher-forced ones; then a rollback (a call at an earlier position) and the same again.
  target, params, _, _ = pair
  tokens = np.random.default_rng(4).integers(0, TINY_GEMMA_VOCAB, size=(2, 30))
  full = np.asarray(target.logits(params, tokens))
  cache = target.init_cache(2, 32)
  pos, widths, got = 0, [1, 3, 5] * 4, []
  while pos < 30:
    k = min(widths.pop(0), 30 - pos)
    logits, cache = target.decode(params, cache, tokens[:, pos:pos + k], jnp.full(2, pos))
    got.append(np.asarray(logits))
    pos += k
  np.testing.assert_allclose(np.concatenate(got, 1), full, atol=1e-5, rtol=0)
  other = (tokens[:, 12:17] + 1) % TINY_GEMMA_VOCAB  # guesses written, then rolled back
  _, cache = target.decode(params, cache, other, jnp.full(2, 12))
  logits, _ = target.decode(params, cache, tokens[:, 12:17], jnp.full(2, 12))
  np.testing.assert_allclose(np.asarray(logits), full[:, 12:17], atol=1e-5, rtol=0)


def test_features_and_logits_at(pair):
  target, params, _, _ = pair
  assert isinstance(target, FeatureModel)
  tokens = np.random.default_rng(5).integers(0, TINY_GEMMA_VOCAB, size=(2, 6))
  cache = target.init_cache(2, 8)
  logits, features, _ = target.decode_features(params, cache, tokens, jnp.zeros(2, jnp.int32))
  assert features.shape == (2, 6, target.feature_dim)
  np.testing.assert_allclose(np.asarray(target.feature_logits(params, features)),
                             np.asarray(logits), atol=1e-5, rtol=0)
  one, _ = target.decode(params, cache, tokens, jnp.zeros(2, jnp.int32),
                         logits_at=jnp.array([5, 2]))
  np.testing.assert_allclose(np.asarray(one)[:, 0], np.asarray(logits)[[0, 1], [5, 2]],
                             atol=1e-5, rtol=0)
  ids = np.array([3, 0, 7])
  np.testing.assert_allclose(
      np.asarray(target.rows_logits(target.output_rows(params, ids), features)),
      np.asarray(logits)[..., ids], atol=1e-5, rtol=0)


def test_greedy_speculative_decode_is_the_argmax_of_the_forward():
  # 72 new tokens after 4-token prompts (64 past the window of 8), γ = 1..5 with the tiny
  # Gemma draft: every emitted token is the argmax of the teacher-forced logits of the
  # sequence so far, as the autoregressive decode's. (Gemma 3 here; both families against
  # the gemma library in test_gemma.py.)
  target, draft = (GemmaModel(c) for c in tiny_gemma_configs("gemma3"))
  params, draft_params = _params(target, 0), _params(draft, 1)
  new = 64 + TINY_GEMMA_WINDOW
  prompts = np.random.default_rng(6).integers(0, TINY_GEMMA_VOCAB, size=(2, 4)).astype(np.int32)
  config = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=-1, cache_len=4 + new + 6)
  kw = dict(max_new_tokens=new, rng=jax.random.PRNGKey(0), config=config)
  reference = autoregressive_decode(target, params, prompts, **kw)
  sequence = np.concatenate([prompts, np.asarray(reference.tokens)], axis=1)
  argmax = np.asarray(target.logits(params, sequence[:, :-1])).argmax(-1)[:, 3:]
  np.testing.assert_array_equal(np.asarray(reference.tokens), argmax)
  drafter = ModelDrafter(draft, max_gamma=5)
  for gamma in range(1, 6):
    result = speculative_decode(target, params, drafter, draft_params, prompts, gamma=gamma, **kw)
    np.testing.assert_array_equal(np.asarray(result.tokens), np.asarray(reference.tokens),
                                  err_msg=f"γ={gamma}")


def test_layer_features_are_the_blocks_outputs_teacher_forced_and_cached(pair):
  target, params, _, _ = pair
  assert isinstance(target, LayerFeatureModel)
  assert target.num_feature_layers == target.config.num_layers
  depth, width = target.num_feature_layers, target.feature_dim
  tokens = np.random.default_rng(8).integers(0, TINY_GEMMA_VOCAB, size=(2, 12)).astype(np.int32)
  logits, final = target.features(params, tokens)
  layers = tuple(range(depth, -1, -1))  # the final hidden state first, then layers L-1 .. 0
  same_logits, hidden = target.features(params, tokens, feature_layers=layers)
  assert hidden.shape == (2, 12, (depth + 1) * width)
  np.testing.assert_array_equal(np.asarray(same_logits), np.asarray(logits))
  np.testing.assert_array_equal(np.asarray(hidden[..., :width]), np.asarray(final))
  # Each block's output as Flax records it (the module's own return value, outside the
  # features code): layer_i returns (x, cache).
  _, state = target._net.apply({"params": params}, jnp.asarray(tokens), method="forward",  # pylint: disable=protected-access
                               capture_intermediates=True, mutable=["intermediates"])
  for i in range(depth):
    block = hidden[..., (depth - i) * width:(depth - i + 1) * width]
    recorded = state["intermediates"][f"layer_{i}"]["__call__"][0][0]
    np.testing.assert_allclose(np.asarray(block), np.asarray(recorded), atol=1e-5, rtol=0)
  # Cached chain calls (a window of 8 crossed) return the same hidden states.
  cache, outs = target.init_cache(2, 12), []
  for start, stop in ((0, 5), (5, 12)):
    _, feats, cache = target.decode_features(params, cache, tokens[:, start:stop],
                                             jnp.full(2, start, jnp.int32),
                                             feature_layers=layers)
    outs.append(feats)
  np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1)), np.asarray(hidden),
                             atol=2e-5, rtol=0)


def test_an_eagle3_head_over_gemma_layers_decodes_greedy_as_autoregressive():
  # The Gemma 3 target's low, middle and final hidden states (eagle3_feature_layers(3):
  # 0, 1, 3) fused by a head that starts near a copy of the final one: greedy chain and tree
  # decodes past the window emit the autoregressive tokens, with rounds that accept guesses.
  target = GemmaModel(tiny_gemma_configs("gemma3")[0])
  params = _params(target, 0)
  layers = eagle3_feature_layers(target.num_feature_layers)
  width = target.feature_dim
  head = FeatureHead(FeatureHeadConfig(vocab_size=TINY_GEMMA_VOCAB, emb_dim=width,
                                       num_heads=2, head_dim=8, mlp_dim=32,
                                       feature_layers=layers))
  head_params = head.init(3)
  fusion = np.asarray(head_params["feature_fusion"]["kernel"]) * 0.05
  fusion[layers.index(target.num_feature_layers) * width:][:width] += np.eye(width,
                                                                             dtype=np.float32)
  head_params["feature_fusion"]["kernel"] = jnp.asarray(fusion)
  head_params["input_projection"]["kernel"] = jnp.concatenate([jnp.eye(width),
                                                               jnp.zeros((width, width))])
  block = head_params["layers_0"]
  block["self_attention"]["out"]["kernel"] = block["self_attention"]["out"]["kernel"] * 0.1
  block["mlp"]["wo"]["kernel"] = block["mlp"]["wo"]["kernel"] * 0.1
  prompts = np.random.default_rng(9).integers(0, TINY_GEMMA_VOCAB, size=(2, 4)).astype(np.int32)
  new = 2 * TINY_GEMMA_WINDOW
  config = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=-1, cache_len=4 + new + 6)
  kw = dict(max_new_tokens=new, rng=jax.random.PRNGKey(0), config=config)
  reference = autoregressive_decode(target, params, prompts, **kw)
  drafter = FeatureDrafter(target, head, max_gamma=3)
  fparams = drafter.params(head_params, params)
  chain = speculative_decode(target, params, drafter, fparams, prompts, gamma=3, **kw)
  np.testing.assert_array_equal(np.asarray(chain.tokens), np.asarray(reference.tokens))
  tree = tree_decode(target, params, drafter, fparams, prompts, tree=StaticTree.from_spines((3, 1)),
                     **kw)
  np.testing.assert_array_equal(np.asarray(tree.tokens), np.asarray(reference.tokens))
  assert np.asarray(chain.accepted_hist).sum(0)[1:].sum() > 0  # guesses were accepted


# ------------------------------------------------------------------ checkpoints
def _save_orbax(params, path):
  ocp = pytest.importorskip("orbax.checkpoint")
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(path, params)
  checkpointer.wait_until_finished()


def test_load_gemma_reads_what_orbax_wrote_and_names_a_mismatch(pair, tmp_path):
  target, params, draft, _ = pair
  path = os.path.join(tmp_path, "ckpt")
  _save_orbax(params, path)
  model, loaded = load_gemma(path, target.config)
  assert model == target
  for (name, a), (name2, b) in zip(flatten(params), flatten(loaded)):
    assert name == name2
    np.testing.assert_array_equal(np.asarray(a), b)
  with pytest.raises(ValueError, match=r"parameter 'layer_0/mlp/gating_einsum' has shape .* "
                                       "but the model config expects") as err:
    load_gemma(path, GemmaConfig.of(target.config, hidden_dim=40))
  assert "\n" not in str(err.value)
  layers = target.config.num_layers
  with pytest.raises(ValueError, match=f"missing parameter 'layer_{layers}/") as err:
    load_gemma(path, GemmaConfig.of(target.config, num_layers=layers + 1))  # one layer more
  assert "\n" not in str(err.value)
  with pytest.raises(FileNotFoundError, match="no Orbax _METADATA"):
    load_gemma(tmp_path, target.config)


def test_published_layouts_are_renamed():
  where = "ckpt"
  assert gemma_name(("transformer/layer_3/attn/q_einsum", "w"), where) == \
      "layer_3/attn/q_einsum/w"
  assert gemma_name(("transformer/layer_0/mlp/gating_einsum", "w"), where) == \
      "layer_0/mlp/gating_einsum"
  assert gemma_name(("transformer/embedder", "input_embedding"), where) == \
      "embedder/input_embedding"
  assert gemma_name(("params", "final_norm", "scale"), where) == "final_norm/scale"
  for skipped in (("SigLiPFromPatches_0/siglip_encoder", "w"), ("vision_encoder", "x"),
                  ("embedder", "mm_input_projection", "w"), ("opt_state", "0", "mu")):
    assert gemma_name(skipped, where) is None


def test_configs_of_published_sizes():
  assert set(GEMMA_SIZES) == {"gemma3_270m", "gemma3_1b", "gemma3_4b", "gemma3_12b",
                              "gemma3_27b", "gemma2_2b", "gemma2_9b", "gemma2_27b"}
  big = GEMMA_SIZES["gemma3_27b"]
  assert big.num_layers == 62 and big.attention_types[5::6] == ("global",) * 10
  assert big.query_pre_attn_scalar() == pytest.approx(168 ** -0.5)
  shapes = dict(flatten(GemmaModel(GEMMA_SIZES["gemma3_270m"]).param_shapes()))
  total = sum(math.prod(s.shape) for s in shapes.values())
  assert 260e6 < total < 280e6  # 270M (of which 168M the 262k-row embedding)
  with pytest.raises(ValueError, match="num_heads=6 is not a multiple of num_kv_heads=4"):
    GemmaConfig.of(big, num_heads=6, num_kv_heads=4)
  with pytest.raises(ValueError, match="sliding_window_size"):
    GemmaConfig.of(big, sliding_window_size=None)


def test_every_gemma_weight_has_logical_axes():
  # The Partitioner splits Gemma's weights as T5X's (heads, MLP, vocabulary over 'model').
  shapes = GemmaModel(GEMMA_SIZES["gemma3_1b"]).param_shapes()
  axes = dict(flatten(param_logical_axes(shapes)))
  assert all(axes[name] is not None for name, _ in flatten(shapes)), \
      [n for n, a in axes.items() if a is None]
  assert axes["embedder/input_embedding"] == ("vocab", "embed")
  assert axes["layer_0/attn/kv_einsum/w"] == (None, "heads", "embed", "kv")


def test_bfloat16_weights_are_cast_and_decode(pair):
  # cast_kernels casts Gemma's einsums and embedding (not its norm scales); a bfloat16 model
  # over them stays near the float32 logits.
  target, params, _, _ = pair
  cast = cast_kernels(params, jnp.bfloat16)
  dtypes = {name: v.dtype for name, v in flatten(cast)}
  assert dtypes["embedder/input_embedding"] == jnp.bfloat16
  assert dtypes["layer_0/mlp/gating_einsum"] == jnp.bfloat16
  assert dtypes["final_norm/scale"] == jnp.float32
  half = GemmaModel(GemmaConfig.of(target.config, dtype="bfloat16"))
  tokens = np.random.default_rng(7).integers(0, TINY_GEMMA_VOCAB, size=(1, 12))
  full, low = np.asarray(target.logits(params, tokens)), np.asarray(half.logits(cast, tokens))
  assert np.abs(full - low).max() < 0.1 * np.abs(full).max()
