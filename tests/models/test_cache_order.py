"""The cached self-attention's two orders (`decoder_only.cached_self_attention`) compute the same
thing: attend, then write (what the CPU runs) and write, then attend (what a GPU or TPU runs).

On this CPU the decode functions take the first; the second is forced here by taking the
accelerators' branch (`jax.lax.platform_dependent` patched to pick its default), so what an
accelerator computes is checked on the CPU: logits and caches of chain calls (batch 2,
rows at different positions, prefill then guesses then one token) and of a tree call, for the
tiny decoder-only and T5 pairs and the tiny Gemma targets (grouped queries, sliding windows
crossed; Gemma 2's soft-capped scores), equal within float32 rounding.
"""
import jax
import numpy as np
import pytest

from specjax.models import GemmaModel, decoder_only
from specjax.testing import tiny_gemma_configs
from tests.models.calls import chain_and_tree_calls, encoded_inputs
from tests.models.test_gemma_model import _params as gemma_params

pytestmark = pytest.mark.usefixtures("float32_matmuls")


def _accelerators_branch(*args, default, **kwargs):  # pylint: disable=unused-argument
  """`lax.platform_dependent` as lowered for a GPU or TPU other than an NVIDIA GPU (the
  `cuda` branches, `specjax.models.fused`'s kernel, are tested in tests/models/test_fused.py)."""
  return default(*args)


@pytest.mark.parametrize("family", ["lm", "t5"])
def test_write_first_equals_attend_first(family, tiny_lm_pair, tiny_t5_pair, monkeypatch):
  pair = tiny_lm_pair if family == "lm" else tiny_t5_pair
  model, params = pair.target, pair.target_params
  encoded = encoded_inputs(model, params)
  cpu = chain_and_tree_calls(model, params, encoded)
  monkeypatch.setattr(decoder_only.lax, "platform_dependent", _accelerators_branch)
  accelerators = chain_and_tree_calls(model, params, encoded)
  assert len(cpu) == len(accelerators) == 8
  for a, b in zip(cpu, accelerators):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-5)


def test_the_accelerators_branch_is_the_one_patched_in(tiny_lm_pair, monkeypatch):
  """The comparison above can fail: a write-first order that forgot the call's own keys
  (its bias over the new slots left masked) gives other logits."""
  model, params = tiny_lm_pair.target, tiny_lm_pair.target_params
  cpu = chain_and_tree_calls(model, params, None)
  monkeypatch.setattr(decoder_only.lax, "platform_dependent", _accelerators_branch)
  monkeypatch.setattr(decoder_only, "join_bias", lambda old, new, starts: old)
  wrong = chain_and_tree_calls(model, params, None)
  assert not np.allclose(np.asarray(cpu[2]), np.asarray(wrong[2]), atol=1e-3)


@pytest.mark.parametrize("family", ["gemma3", "gemma2"])
def test_gemmas_write_first_equals_attend_first(family, monkeypatch):
  model = GemmaModel(tiny_gemma_configs(family)[0])
  params = gemma_params(model, 0)
  cpu = chain_and_tree_calls(model, params, None)
  monkeypatch.setattr(decoder_only.lax, "platform_dependent", _accelerators_branch)
  accelerators = chain_and_tree_calls(model, params, None)
  for a, b in zip(cpu, accelerators):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-5)
  if family == "gemma3":  # the comparison can fail: the call's own keys left masked
    monkeypatch.setattr(decoder_only, "join_bias", lambda old, new, starts: old)
    wrong = chain_and_tree_calls(model, params, None)
    assert not np.allclose(np.asarray(cpu[2]), np.asarray(wrong[2]), atol=1e-3)
