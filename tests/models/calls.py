"""Cached calls that exercise a model's cache the way the decode loops do, for tests that
compare two ways of computing them (tests/models/test_cache_order.py, test_fused.py)."""
import jax
import jax.numpy as jnp

from specjax.models.tree import tree_call


def encoded_inputs(model, params):
  """Two rows of encoder inputs (padded differently) for a T5, None for a decoder-only."""
  if not model.is_encoder_decoder:
    return None
  return model.encode(params, jnp.array([[4, 5, 6, 1, 0], [7, 8, 1, 0, 0]]))


def chain_and_tree_calls(model, params, encoded):
  """Logits and caches of three chain calls (batch 2, rows at different positions: a prefill
  of 5, 3 guesses, 1 token) and a tree call of 4 tokens from there, per row; run op by op
  (`jax.disable_jit`), so neither of two compared runs reuses the other's compiled call."""
  with jax.disable_jit():
    cache = model.init_cache(2, 16)
    out = []
    calls = [(jnp.array([[5, 6, 7, 8, 9], [9, 8, 7, 6, 5]]), jnp.array([0, 0])),
             (jnp.array([[3, 4, 5], [7, 2, 3]]), jnp.array([5, 3])),
             (jnp.array([[11], [12]]), jnp.array([8, 6]))]
    for tokens, positions in calls:
      logits, cache = model.decode(params, cache, tokens, positions, encoded)
      out += [logits, cache]
    length = jnp.array([9, 7])
    tree = tree_call(jnp.array([[-1, -1, 0], [-1, 0, 1]]), jnp.array([[1, 1, 2], [1, 2, 3]]),
                     length)
    logits, cache = model.decode(params, cache, jnp.array([[11, 4, 5, 6], [12, 3, 3, 2]]),
                                 length - 1, encoded, tree=tree)
    return out + [logits, cache]
