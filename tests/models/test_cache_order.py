"""The cached self-attention's two orders (`decoder_only.cached_self_attention`) compute the same
thing: attend, then write (what the CPU runs) and write, then attend (what a GPU or TPU runs).

On this CPU the decode functions take the first; the second is forced here by taking the
accelerators' branch (`jax.lax.platform_dependent` patched to pick its default), so what an
accelerator computes is checked on the CPU: logits and caches of chain calls (batch 2,
rows at different positions, prefill then guesses then one token) and of a tree call, for the
tiny decoder-only and T5 pairs, equal within float32 rounding.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import decoder_only
from specjax.models.tree import tree_call

pytestmark = pytest.mark.usefixtures("float32_matmuls")


def _accelerators_branch(*args, default, **kwargs):  # pylint: disable=unused-argument
  """`lax.platform_dependent` as lowered for a GPU or TPU other than an NVIDIA GPU (the
  `cuda` branches, `specjax.models.fused`'s kernel, are tested in tests/models/test_fused.py)."""
  return default(*args)


def _calls(model, params, encoded):
  """Logits and caches of three chain calls and a tree call from the same start, per row; run
  op by op (`jax.disable_jit`), so neither order reuses the other's compiled call."""
  with jax.disable_jit():
    return _chain_and_tree(model, params, encoded)


def _chain_and_tree(model, params, encoded):
  cache = model.init_cache(2, 16)
  out = []
  calls = [(jnp.array([[5, 6, 7, 8, 9], [9, 8, 7, 6, 5]]), jnp.array([0, 0])),
           (jnp.array([[3, 4, 5], [7, 2, 3]]), jnp.array([5, 3])),
           (jnp.array([[11], [12]]), jnp.array([8, 6]))]
  for tokens, positions in calls:
    logits, cache = model.decode(params, cache, tokens, positions, encoded)
    out += [logits, cache]
  parent = jnp.array([[-1, -1, 0], [-1, 0, 1]])
  depth = jnp.array([[1, 1, 2], [1, 2, 3]])
  length = jnp.array([9, 7])
  tree = tree_call(parent, depth, length)
  logits, cache = model.decode(params, cache, jnp.array([[11, 4, 5, 6], [12, 3, 3, 2]]),
                               length - 1, encoded, tree=tree)
  return out + [logits, cache]


@pytest.mark.parametrize("family", ["lm", "t5"])
def test_write_first_equals_attend_first(family, tiny_lm_pair, tiny_t5_pair, monkeypatch):
  pair = tiny_lm_pair if family == "lm" else tiny_t5_pair
  model, params = pair.target, pair.target_params
  encoded = None
  if model.is_encoder_decoder:
    encoded = model.encode(params, jnp.array([[4, 5, 6, 1, 0], [7, 8, 1, 0, 0]]))
  cpu = _calls(model, params, encoded)
  monkeypatch.setattr(decoder_only.lax, "platform_dependent", _accelerators_branch)
  accelerators = _calls(model, params, encoded)
  assert len(cpu) == len(accelerators) == 8
  for a, b in zip(cpu, accelerators):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-5)


def test_the_accelerators_branch_is_the_one_patched_in(tiny_lm_pair, monkeypatch):
  """The comparison above can fail: a write-first order that forgot the call's own keys
  (its bias over the new slots left masked) gives other logits."""
  model, params = tiny_lm_pair.target, tiny_lm_pair.target_params
  cpu = _calls(model, params, None)
  monkeypatch.setattr(decoder_only.lax, "platform_dependent", _accelerators_branch)
  monkeypatch.setattr(decoder_only, "join_bias", lambda old, new, starts: old)
  wrong = _calls(model, params, None)
  assert not np.allclose(np.asarray(cpu[2]), np.asarray(wrong[2]), atol=1e-3)
