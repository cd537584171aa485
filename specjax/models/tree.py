"""Tree attention: one model call over a token tree, and moving a path's cache slots.

A tree call writes its k tokens at slots `positions[b] .. positions[b] + k - 1`, as any
`decode` call, but a token's sequence position is not its slot and it attends only to
what `TreeAttention` makes visible: the committed cache and its own ancestors. After the
tree is verified, `move_slots` copies the accepted path's keys and values to the slots
right after the committed tokens, so the cache is the one a chain of calls would have
written (slots past a row's length are masked by every later call).
"""
from __future__ import annotations

from typing import Optional

import flax
import jax
import jax.numpy as jnp
from jax import lax


@flax.struct.dataclass
class TreeAttention:
  """Who each token of a tree call attends to, and where it sits in its sequence."""

  token_pos: jax.Array  # int32 [B, k]: each token's position in the sequence (relative bias)
  visible: jax.Array  # bool [B, k, k]: token i attends to token j of this call (i to itself)
  cache_visible: Optional[jax.Array] = None  # bool [B, k, S]: over the cache before the call;
  # None: the slots before the call's first slot (`positions`), as a chain call
  cache_pos: Optional[jax.Array] = None  # int32 [B, S]: the positions of the keys the cache
  # slots hold; None: a slot's position is its index


def ancestors(parent: jax.Array) -> jax.Array:
  """parent int32 [N] (index of the parent node, -1 for a child of the root) -> bool [N, N]:
  node i descends from node j or is j.

  Pointer doubling, ceil(log2 N) static steps and no loop: after step k, reach[i] holds i's
  ancestors at distance below 2^k and up[i] its ancestor at distance 2^k (-1 past the root).
  A loop over the N nodes would cost a GPU a host round trip per node (XLA:GPU copies a
  `while` loop's predicate to the host each iteration). O(N^2) memory per step.
  """
  size = parent.shape[0]
  index = jnp.arange(size)
  reach, up = index[:, None] == index[None, :], parent.astype(jnp.int32)
  span = 1
  while span < size:  # distances below `span` are covered; the deepest is at most N - 1
    above = up >= 0
    safe = jnp.maximum(up, 0)
    reach = reach | (above[:, None] & reach[safe])
    up = jnp.where(above, up[safe], -1)
    span *= 2
  return reach


def tree_call(parent: jax.Array, depth: jax.Array, length: jax.Array) -> TreeAttention:
  """The target's call over [root, node_0 .. node_{N-1}] written from slot length - 1.

  parent int32 [B, N] (-1: child of the root), depth int32 [B, N] (1-based), length
  int32 [B] (the root, the last committed token, sits at position length - 1).
  Returns a TreeAttention over k = N + 1 tokens (the cache before length - 1 visible).
  """
  batch, size = parent.shape
  anc = jax.vmap(ancestors)(parent)  # [B, N, N]
  visible = jnp.ones((batch, size + 1, size + 1), jnp.bool_)
  visible = visible.at[:, 0, 1:].set(False).at[:, 1:, 1:].set(anc)
  token_pos = (length - 1)[:, None] + jnp.concatenate(
      [jnp.zeros((batch, 1), jnp.int32), depth.astype(jnp.int32)], axis=1)
  return TreeAttention(token_pos=token_pos, visible=visible)


def level_call(parent: jax.Array, depth: jax.Array, length: jax.Array, start: int, stop: int,
               max_len: int) -> TreeAttention:
  """A draft call over nodes start..stop-1 (one level) of a tree whose node j sits at slot
  length + j and whose earlier levels are already in the cache.

  parent, depth: int32 [B, N]; length int32 [B]. Node i sees the committed slots (< length)
  and its ancestors' slots, and itself among the call's tokens.
  """
  return nodes_call(jax.vmap(ancestors)(parent), depth, length, start, stop - start, max_len)


def nodes_call(anc: jax.Array, depth: jax.Array, length: jax.Array, start, count: int,
               max_len: int) -> TreeAttention:
  """`level_call` over the `count` nodes from node `start` (traced or static), given the
  tree's ancestor relation anc bool [B, N, N] (`ancestors` per row)."""
  size = anc.shape[1]
  own = lax.dynamic_slice_in_dim(anc, start, count, axis=1)  # [B, k, N]
  slots = jnp.arange(max_len, dtype=jnp.int32)
  node = slots[None, :] - length[:, None]  # [B, S]: the node a slot holds (if in range)
  in_tree = (node >= 0) & (node < start)
  held = jnp.take_along_axis(own, jnp.clip(node, 0, size - 1)[:, None, :].repeat(
      count, axis=1), axis=2)  # [B, k, S]
  cache_visible = (slots[None, None, :] < length[:, None, None]) | (in_tree[:, None, :] & held)
  node_depth = jnp.take_along_axis(depth, jnp.clip(node, 0, size - 1), axis=1)
  cache_pos = jnp.where(in_tree, length[:, None] - 1 + node_depth, slots[None, :])
  return TreeAttention(token_pos=length[:, None] - 1 + lax.dynamic_slice_in_dim(
      depth, start, count, axis=1),
                       visible=lax.dynamic_slice_in_dim(own, start, count, axis=2),
                       cache_visible=cache_visible, cache_pos=cache_pos.astype(jnp.int32))


def gather_slots(buffer: jax.Array, src: jax.Array, axis: int) -> jax.Array:
  """buffer [B, ..., S (at axis), ...], src int32 [B, n] -> the n slots src[b] of each row."""
  shape = [1] * buffer.ndim
  shape[0], shape[axis] = src.shape[0], src.shape[1]
  return jnp.take_along_axis(buffer, src.reshape(shape), axis=axis)
