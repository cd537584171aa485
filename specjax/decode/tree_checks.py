"""The one validation of a token tree's settings (host side, before any model loads).

`tree_decode` and the main job both call `check_tree`: a tree the loop cannot run is
refused with a one-line ValueError naming the setting, before weights load or anything
compiles.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax

from specjax.decode.config import DecodeConfig
from specjax.decode import inputs
from specjax.draft.tree import DynamicTree, StaticTree
from specjax.verify import ReferenceVerifier


def check_tree(tree: Any, config: DecodeConfig, *, vocab_size: Optional[int] = None,
               models: Sequence[Any] = (), rows: int = 1, cache_len: Optional[int] = None,
               costs: Any = None, partitioner: Any = None) -> None:
  """ValueError naming the first thing a tree decode cannot take.

  Args:
    tree: the `StaticTree` or `DynamicTree`.
    config: the decode's `DecodeConfig` (γ policy, verifier, buckets, sampling).
    vocab_size: the target's vocabulary (a node draws at most V distinct children); None
      skips that check and the memory check.
    models: the target and draft `DecodingModel`s (their attention heads size the round).
    rows: rows decoded at once (the batch, or the streaming slots).
    cache_len: cache positions per row; None skips the memory check.
    costs: a given 'auto' cost table (only with gamma_policy='auto').
    partitioner: the mesh the round runs on (its devices' memory).
  """
  if not isinstance(tree, (StaticTree, DynamicTree)):
    raise ValueError(f"TREE must be a StaticTree or DynamicTree (the `tree` argument; gin: "
                     f"@specjax.draft.tree_spines() ...), got {tree!r}")
  auto_policy = config.gamma_policy == "auto"
  if config.gamma_policy not in ("constant", "auto"):
    raise ValueError(f"TREE takes GAMMA_POLICY 'constant' or 'auto' (it verifies with the tree "
                     f"rule, not a chain's γ), got {config.gamma_policy!r}")
  if not isinstance(config.verifier, ReferenceVerifier):
    raise ValueError("TREE verifies with the tree rule (specjax.verify.tree): leave VERIFIER "
                     f"None or the reference verifier, got {type(config.verifier).__name__}")
  if auto_policy and config.auto_buckets:
    raise ValueError(f"auto_buckets {config.auto_buckets} do not apply to a tree (its one "
                     "wide round scores the whole tree): leave them empty")
  if costs is not None and not auto_policy:
    raise ValueError(f"a cost table is for gamma_policy='auto', not {config.gamma_policy!r}")
  if tree.greedy_only and not config.sampling.greedy:
    raise ValueError("DynamicTree(keep=...) is exact at temperature 0 only: it prunes drawn "
                     "children by their own probability (specjax.verify.tree)")
  if vocab_size is not None and tree.max_children > vocab_size:
    raise ValueError(f"the tree gives a node {tree.max_children} children, more than the "
                     f"vocabulary's {vocab_size} tokens: use at most {vocab_size} per node")
  if cache_len is None or vocab_size is None:
    return
  need = tree_round_bytes(tree, models, rows, cache_len, vocab_size)
  limit = int(inputs.MEMORY_FRACTION * inputs.device_memory(partitioner))
  if need > limit:
    raise ValueError(
        f"a tree of {tree.grown} nodes needs about {need / 2**30:.2f} GiB per round ({rows} "
        f"rows × its masks, attention scores over {cache_len} positions and [nodes, vocab] "
        f"probabilities), above the limit of {limit / 2**30:.2f} GiB "
        f"({inputs.MEMORY_FRACTION:.0%} of the device's memory): use a smaller tree or fewer rows")


def tree_round_bytes(tree: Any, models: Sequence[Any], rows: int, cache_len: int,
                     vocab_size: int) -> int:
  """A lower bound on the bytes one tree round holds beside the weights and caches.

  Per row, with G grown nodes, N scored nodes, S = cache_len and H the most attention heads
  of `models`: the target's logits, its probabilities and the drafts' q (3 × (N + 1) × V
  float32), the attention masks ((G + 1) × (G + 1 + S) bool) and one layer's attention
  scores (H × (G + 1) × S float32); and, once, the static ancestor table (G × G bool).
  """
  grown, nodes = tree.grown, tree.nodes
  heads = max([attention_heads(m) for m in models] + [1])
  per_row = (3 * (nodes + 1) * vocab_size * 4 + (grown + 1) * (grown + 1 + cache_len)
             + heads * (grown + 1) * cache_len * 4)
  return int(rows) * per_row + grown * grown


def attention_heads(model: Any) -> int:
  """The attention heads of a model's KV cache (`init_cache` shapes: [B, heads, ...] per
  layer); 1 for a cache of another shape (a table model's token buffer)."""
  shapes = jax.eval_shape(lambda: model.init_cache(1, 1))
  return max([int(x.shape[1]) for x in jax.tree.leaves(shapes) if len(x.shape) == 4] + [1])
