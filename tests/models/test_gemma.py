"""Conformance with the gemma library (the reference), where its package installs (Python
3.12, `pip install .[gemma]`): tiny random Gemma 3 and Gemma 2 models built, initialized and
saved by the library (`gm.nn.Transformer`, `gm.ckpts.save_params`), loaded by `load_gemma`.

- specjax's logits over a prompt equal the library's forward (float32, within 1e-4);
- greedy autoregressive and speculative decodes (the second tiny Gemma as draft, γ 1..5,
  64 tokens past the sliding window) emit the argmax of the library's full-sequence forward;
- at T = 1 a speculative decode keeps the target's law (the joint of the first tokens
  against the law enumerated from the library's forward);
- the published sizes (`GEMMA_SIZES`, the models/*.gin files) are the library's classes'.
"""
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("gemma")
gm = pytest.importorskip("gemma.gm")

# pylint: disable=wrong-import-position
from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.draft import ModelDrafter
from specjax.models.gemma import load_gemma
from specjax.models.gemma_config import GEMMA_SIZES, GemmaConfig
from specjax.sampling import Sampling
from specjax.testing import TINY_GEMMA_VOCAB, TINY_GEMMA_WINDOW, joint_tv, tiny_gemma_configs

LIBRARY_CLASSES = {"gemma3_270m": "Gemma3_270M", "gemma3_1b": "Gemma3_1B",
                   "gemma3_4b": "Gemma3_4B", "gemma3_12b": "Gemma3_12B",
                   "gemma3_27b": "Gemma3_27B", "gemma2_2b": "Gemma2_2B",
                   "gemma2_9b": "Gemma2_9B", "gemma2_27b": "Gemma2_27B"}


def library_config(cfg: GemmaConfig):
  """The library's TransformerConfig of a GemmaConfig (its enums from their names)."""
  modules, config = gm.nn.config.AttentionType, gm.nn.config
  return config.TransformerConfig(
      num_embed=cfg.num_embed, embed_dim=cfg.embed_dim, hidden_dim=cfg.hidden_dim,
      num_heads=cfg.num_heads, head_dim=cfg.head_dim, num_kv_heads=cfg.num_kv_heads,
      final_logit_softcap=cfg.final_logit_softcap, use_post_attn_norm=cfg.use_post_attn_norm,
      use_post_ffw_norm=cfg.use_post_ffw_norm,
      attention_types=tuple(modules[t.upper()] for t in cfg.attention_types),
      query_pre_attn_norm=config.QueryPreAttentionNormalisation[cfg.query_pre_attn_norm.upper()],
      attn_logits_soft_cap=cfg.attn_logits_soft_cap, sliding_window_size=cfg.sliding_window_size,
      transpose_gating_einsum=cfg.transpose_gating_einsum, use_qk_norm=cfg.use_qk_norm,
      local_base_frequency=cfg.local_base_frequency,
      global_base_frequency=cfg.global_base_frequency,
      local_scale_factor=cfg.local_scale_factor, global_scale_factor=cfg.global_scale_factor)


class Library:
  """A tiny model as the library builds, initializes and saves it; `logits` its forward."""

  def __init__(self, cfg: GemmaConfig, seed: int, folder: str, embedding_scale: float = 100.0):
    self.config = library_config(cfg)
    self.module = gm.nn.Transformer(config=self.config, dtype=jnp.float32)
    params = self.module.init(jax.random.PRNGKey(seed), jnp.ones((1, 4), jnp.int32))["params"]
    # The library's init (normal, stddev 0.01; norm scales 0) makes near-uniform next-token
    # laws, where greedy ties at float32 rounding and a sampling test without power would
    # follow: weights are rescaled to unit-size activations and the norm scales drawn.
    rng = np.random.default_rng(seed)

    def rescale(path, w):
      name = jax.tree_util.keystr(path)
      w = np.asarray(w)
      if "scale" in name:
        return w + 0.3 * rng.standard_normal(w.shape).astype(np.float32)
      return w * (embedding_scale if "input_embedding" in name
                  else 100.0 / np.sqrt(cfg.embed_dim))

    self.params = jax.tree_util.tree_map_with_path(rescale, params)
    self.path = os.path.join(folder, f"gemma_{seed}")
    gm.ckpts.save_params(self.params, self.path, wait_until_finished=True)
    self._forward = jax.jit(self._apply)

  def _apply(self, params, tokens):
    length = tokens.shape[1]
    positions = jnp.broadcast_to(jnp.arange(length), tokens.shape)  # token 0 is no padding here
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), bool)),
                            (tokens.shape[0], length, length))
    return self.module.apply({"params": params}, tokens, positions=positions,
                             attention_mask=mask).logits

  def logits(self, tokens):
    """float32 [B, L, V] of tokens int32 [B, L] at positions 0..L-1."""
    return np.asarray(self._forward(self.params, jnp.asarray(tokens, jnp.int32)))


@pytest.fixture(scope="module", params=["gemma3", "gemma2"])
def pair(request, tmp_path_factory):
  folder = str(tmp_path_factory.mktemp(request.param))
  target_config, draft_config = tiny_gemma_configs(request.param)
  target_lib, draft_lib = Library(target_config, 0, folder), Library(draft_config, 1, folder)
  # load_gemma takes the library's own TransformerConfig (or its model class, or ours).
  target, target_params = load_gemma(target_lib.path, target_lib.config)
  draft, draft_params = load_gemma(draft_lib.path, draft_config)
  assert target.config == target_config
  return target_lib, target, target_params, draft, draft_params


def test_logits_equal_the_librarys_forward(pair):
  library, model, params, _, _ = pair
  tokens = np.random.default_rng(1).integers(0, TINY_GEMMA_VOCAB, size=(3, 24))  # 3 windows
  np.testing.assert_allclose(np.asarray(model.logits(params, tokens)), library.logits(tokens),
                             atol=1e-4, rtol=0)
  cache = model.init_cache(3, 32)  # the cached prefill too
  logits, _ = model.decode(params, cache, tokens, jnp.zeros(3, jnp.int32))
  np.testing.assert_allclose(np.asarray(logits), library.logits(tokens), atol=1e-4, rtol=0)


def test_greedy_decodes_are_the_argmax_of_the_librarys_forward(pair):
  # 72 new tokens after 5-token prompts: 64 past the window of 8. Each emitted token must be
  # the argmax of the library's logits over the sequence before it (one full-sequence
  # forward per decode), for the autoregressive decode and for γ = 1..5.
  library, model, params, draft, draft_params = pair
  new = 64 + TINY_GEMMA_WINDOW
  prompts = np.random.default_rng(2).integers(0, TINY_GEMMA_VOCAB, size=(3, 5)).astype(np.int32)
  config = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=-1, cache_len=5 + new + 6)
  kw = dict(max_new_tokens=new, rng=jax.random.PRNGKey(0), config=config)

  def check(tokens, what):
    sequence = np.concatenate([prompts, np.asarray(tokens)], axis=1)
    argmax = library.logits(sequence[:, :-1]).argmax(-1)[:, 4:]
    np.testing.assert_array_equal(np.asarray(tokens), argmax, err_msg=what)

  check(autoregressive_decode(model, params, prompts, **kw).tokens, "autoregressive")
  drafter = ModelDrafter(draft, max_gamma=5)
  for gamma in range(1, 6):
    result = speculative_decode(model, params, drafter, draft_params, prompts, gamma=gamma, **kw)
    check(result.tokens, f"speculative γ={gamma}")


# Power: 2 tokens over V = 4 give 16 outcomes; with N = 60,000 rows the empirical TV of a
# correct sampler is about 0.0065 (mean; its spread about 0.002), so the 0.015 bound passes,
# while a loop whose joint law is off by 0.025 or more in TV fails; the draft's own law is
# checked to lie more than 0.05 away, so a loop that emitted the draft's law would fail. At
# γ = 2 the two tokens come from one round (both guesses accepted, or a correction) or two.
N = 60_000
STEPS = 2
LAW_VOCAB = 4


def _law(library, prompt):
  """{(t1, t2, t3): probability} of the library's model after `prompt`, enumerated."""
  sequences = np.array([list(prompt) + list(s) for s in
                        itertools.product(range(LAW_VOCAB), repeat=STEPS - 1)], np.int32)
  logits = library.logits(sequences).astype(np.float64)[:, len(prompt) - 1:]  # [V, 2, V]
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  law = {}
  for row, head in enumerate(itertools.product(range(LAW_VOCAB), repeat=STEPS - 1)):
    for last in range(LAW_VOCAB):
      seq = head + (last,)
      law[seq] = float(np.prod([probs[row, i, seq[i]] for i in range(STEPS)]))
  return law


def test_sampling_at_temperature_one_keeps_the_targets_law(tmp_path):
  # Target and draft: the tiny Gemma 3 draft's architecture (local and global layers, QK
  # norm), two random inits, logits of unit spread (the laws neither flat nor one-hot).
  config = GemmaConfig.of(tiny_gemma_configs("gemma3")[1], num_embed=LAW_VOCAB)
  scale = 100.0 / np.sqrt(config.embed_dim)
  target_lib = Library(config, 3, str(tmp_path), embedding_scale=scale)
  draft_lib = Library(config, 4, str(tmp_path), embedding_scale=scale)
  target_config = draft_config = config
  target, target_params = load_gemma(target_lib.path, target_config)
  draft, draft_params = load_gemma(draft_lib.path, draft_config)
  prompt = [1, 2]
  decode_config = DecodeConfig(sampling=Sampling(temperature=1.0), eos_id=-1, cache_len=8)
  result = speculative_decode(target, target_params, ModelDrafter(draft, max_gamma=2),
                              draft_params, np.array([prompt] * N, np.int32),
                              max_new_tokens=STEPS, gamma=2, rng=jax.random.PRNGKey(0),
                              config=decode_config)
  assert joint_tv(result.tokens, _law(target_lib, prompt), STEPS) < 0.015
  assert joint_tv(result.tokens, _law(draft_lib, prompt), STEPS) > 0.05


@pytest.mark.parametrize("name", sorted(LIBRARY_CLASSES))
def test_published_sizes_are_the_librarys(name):
  library_class = getattr(gm.nn, LIBRARY_CLASSES[name])
  assert GemmaConfig.of(library_class) == GEMMA_SIZES[name]
  assert GemmaConfig.of(library_class.config) == GEMMA_SIZES[name]


def test_the_walk_through_of_docs_gemma_runs(tmp_path):
  # The page's Python block (marked no-run for the suite's other Python) runs as written.
  from tests.test_docs import ROOT, run_snippet, code_blocks  # pylint: disable=import-outside-toplevel
  blocks = [code for language, _, code, _ in code_blocks((ROOT / "docs" / "gemma.md").read_text())
            if language == "python"]
  result = run_snippet("python", blocks[0], tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "tokens per target call:" in result.stdout
