"""The working set of a chain round, checked before any model loads (as `check_tree` checks a
tree's): the widest verification call scores max_gamma + 1 positions for every row, and its
attention and probability buffers grow with that width times the cache length and the
vocabulary, beside the models' KV caches.
"""
from __future__ import annotations

from typing import Any, Sequence

from specjax.decode import inputs
from specjax.decode.tree_checks import attention_heads

ATTENTION_COPIES = 8
"""Attention-sized buffers (heads × width × cache_len float32) a verification call holds at
once: the relative-position bias, the scores, the mask, their softmax, for the target's
decoder layers (measured: a γ = 10000 round of the tiny T5 pair, 4 heads over 10,041
positions, peaked at 18.5 GB, about ten of them beside the probabilities)."""

PROBABILITY_COPIES = 4
"""[width, vocab] float32 buffers of a round: the target's logits and probabilities, the
draft's q and the residual a rejection samples from."""


def chain_round_bytes(max_gamma: int, models: Sequence[Any], rows: int, cache_len: int,
                      vocab_size: int) -> int:
  """A lower bound on the bytes one chain round holds beside the weights and caches.

  Per row, with W = max_gamma + 1 (the widest verification call), S = cache_len and H the
  most attention heads of `models`: `PROBABILITY_COPIES` × W × V float32 and
  `ATTENTION_COPIES` × H × W × S float32.
  """
  width = int(max_gamma) + 1
  heads = max([attention_heads(m) for m in models] + [1])
  per_row = (PROBABILITY_COPIES * width * vocab_size * 4
             + ATTENTION_COPIES * heads * width * cache_len * 4)
  return int(rows) * per_row


def check_chain(max_gamma: int, models: Sequence[Any], rows: int, cache_len: int,
                vocab_size: int, cache_size: int = 0, partitioner: Any = None) -> int:
  """Refuses a chain round whose working set (`chain_round_bytes`) plus the KV caches
  (`cache_size` bytes) exceeds `inputs.MEMORY_FRACTION` of the device's memory, with one line
  naming GAMMA (and MAX_GAMMA) as the setting to lower. Returns the round's bytes.

  Args:
    max_gamma: the widest γ a round may play (its call scores max_gamma + 1 positions).
    models: the target and the drafter's models (a feature head included).
    rows: rows decoded at once.
    cache_len: cache positions per row.
    vocab_size: the target's vocabulary.
    cache_size: the bytes of every model's KV caches (`inputs.check_cache_size`).
    partitioner: the mesh the round runs on (its devices' memory).
  """
  need = chain_round_bytes(max_gamma, models, rows, cache_len, vocab_size)
  limit = int(inputs.MEMORY_FRACTION * inputs.device_memory(partitioner))
  if need + cache_size > limit:
    raise ValueError(
        f"a chain round of γ = {max_gamma} needs about {need / 2**30:.2f} GiB ({rows} rows × "
        f"the {max_gamma + 1}-wide verification's attention over {cache_len} positions and "
        f"[{max_gamma + 1}, {vocab_size}] probabilities) beside {cache_size / 2**30:.2f} GiB "
        f"of KV caches, above the limit of {limit / 2**30:.2f} GiB "
        f"({inputs.MEMORY_FRACTION:.0%} of the device's memory): lower GAMMA (and MAX_GAMMA), "
        "the batch or max_new_tokens")
  return need
