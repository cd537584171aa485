"""Decode loops on the real networks (random-init tiny T5 1.1 and decoder-only pairs).

Greedy speculative output must equal greedy autoregressive output token for
token, for every row of a batch of 16 prompts of mixed lengths, both families,
γ ∈ {1, 3, 7} and every drafter.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.draft import BigramDrafter, ModelDrafter, PromptLookupDrafter, UnigramDrafter
from specjax.models.decoder_only import DecoderOnlyConfig, DecoderOnlyModel
from specjax.models.t5 import T5Config, T5Model
from specjax.params import cast_kernels
from specjax.sampling import Sampling

V = 96
BATCH = 16
NEW = 16
GREEDY = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=1, cache_len=48)


def _t5(layers, emb, seed):
  model = T5Model(T5Config(vocab_size=V, emb_dim=emb, num_heads=2, num_encoder_layers=layers,
                           num_decoder_layers=layers, head_dim=8, mlp_dim=2 * emb))
  return model, model.init(jax.random.PRNGKey(seed))


def _lm(layers, emb, seed):
  model = DecoderOnlyModel(DecoderOnlyConfig(vocab_size=V, emb_dim=emb, num_heads=2,
                                             num_layers=layers, head_dim=8, mlp_dim=2 * emb))
  return model, model.init(jax.random.PRNGKey(seed))


def _prompts(seed):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, 12, size=BATCH)
  prompts = np.zeros((BATCH, 12), np.int32)
  for b, n in enumerate(lengths):
    prompts[b, :n] = rng.integers(2, V, size=n)
  return prompts, lengths


@pytest.fixture(scope="module", params=["t5", "decoder_only"])
def family(request):
  build = _t5 if request.param == "t5" else _lm
  target, target_params = build(2, 32, 0)
  draft, draft_params = build(1, 16, 1)
  prompts, lengths = _prompts(2)
  lengths = None if target.is_encoder_decoder else lengths
  reference = autoregressive_decode(target, target_params, prompts, max_new_tokens=NEW,
                                    rng=jax.random.PRNGKey(0), config=GREEDY,
                                    prompt_lengths=lengths)
  corpus = [np.random.default_rng(5).integers(0, V, size=500)]
  drafters = {
      "model": (ModelDrafter(draft, max_gamma=7), draft_params),
      "self": (ModelDrafter(target, max_gamma=7), target_params),
      "unigram": UnigramDrafter(corpus, V, max_gamma=7),
      "bigram": BigramDrafter(corpus, V, max_gamma=7),
      "prompt_lookup": (PromptLookupDrafter(vocab=V, max_gamma=7), None),
  }
  return target, target_params, prompts, lengths, reference, drafters


@pytest.mark.parametrize("drafter_name", ["model", "self", "unigram", "bigram", "prompt_lookup"])
def test_greedy_speculative_equals_autoregressive(family, drafter_name):
  target, target_params, prompts, lengths, reference, drafters = family
  drafter, params = drafters[drafter_name]
  for gamma in (1, 3, 7):
    result = speculative_decode(target, target_params, drafter, params, prompts,
                                max_new_tokens=NEW, gamma=gamma, rng=jax.random.PRNGKey(0),
                                config=GREEDY, prompt_lengths=lengths)
    np.testing.assert_array_equal(result.tokens, reference.tokens,
                                  err_msg=f"{drafter_name} γ={gamma}")
    np.testing.assert_array_equal(result.lengths, reference.lengths)
    if drafter_name == "self":  # a draft equal to the target accepts every guess
      full = np.asarray(result.lengths) == NEW
      calls = np.asarray(result.target_calls)[full]
      np.testing.assert_array_equal(calls, -(-NEW // (gamma + 1)))


def test_unrolled_model_drafter_accepts_what_the_loop_accepts(family):
  # The unrolled drafter drafts all 7 guesses each round and feeds its cache 6 of them: a
  # round that left a wrong guess in the cache, or fed it too few or too many positions,
  # drafts other guesses than the loop and accepts a different number of them. The target as
  # its own draft accepts every guess it offers, so at γ = 7 it accepts all 7 drafted (the one
  # case where the cache must then be fed the last guess); the rounds that reject:
  # tests/decode/test_decoding.py.
  target, target_params, prompts, lengths, reference, drafters = family
  looped, params = drafters["self"]
  unrolled = dataclasses.replace(looped, unroll=True)
  for gamma in (1, 3, 7):
    kw = dict(max_new_tokens=NEW, gamma=gamma, rng=jax.random.PRNGKey(0), config=GREEDY,
              prompt_lengths=lengths)
    loop_result = speculative_decode(target, target_params, looped, params, prompts, **kw)
    result = speculative_decode(target, target_params, unrolled, params, prompts, **kw)
    np.testing.assert_array_equal(result.tokens, reference.tokens, err_msg=f"γ={gamma}")
    np.testing.assert_array_equal(result.target_calls, loop_result.target_calls)
    np.testing.assert_array_equal(result.accepted_hist, loop_result.accepted_hist)
    np.testing.assert_array_equal(result.draft_calls, 7 * np.asarray(result.target_calls))


def test_greedy_identity_holds_with_bfloat16_kernels():
  # Kernels cast once to bfloat16 (`cast_kernels`): the dense dots round their inputs to
  # bfloat16 and sum in float32, at every call width; at batch 1 the 1-token calls take the
  # padded two-row path on the CPU. Speculative greedy output must still be the
  # autoregressive one, token for token, at batch 16 and batch 1.
  target, target_params = _lm(2, 32, 0)
  draft, draft_params = _lm(1, 16, 1)
  target_params = cast_kernels(target_params, jnp.bfloat16)
  draft_params = cast_kernels(draft_params, jnp.bfloat16)
  prompts, lengths = _prompts(3)
  for rows in (slice(0, BATCH), slice(0, 1), slice(5, 6)):
    kw = dict(max_new_tokens=NEW, rng=jax.random.PRNGKey(0), config=GREEDY,
              prompt_lengths=lengths[rows])
    reference = autoregressive_decode(target, target_params, prompts[rows], **kw)
    result = speculative_decode(target, target_params, ModelDrafter(draft, max_gamma=3),
                                draft_params, prompts[rows], gamma=3, **kw)
    np.testing.assert_array_equal(result.tokens, reference.tokens, err_msg=str(rows))
    np.testing.assert_array_equal(result.lengths, reference.lengths)
