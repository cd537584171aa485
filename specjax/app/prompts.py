"""Token rows -> the decode loops' inputs, under each model's prompt convention.

  encoder-decoder (T5)        encoder inputs: the text's tokens + EOS (T5X).
  decoder-only, 'lm'          the prompt's tokens from position 0, no BOS, no EOS: the
                              convention of `specjax.train` and the bundled LM pair.
  decoder-only, 't5x'         T5X's DecoderOnlyModel: BOS 0, then the example's `inputs`
                              (a text prompt's tokens + EOS, as seqio's default `inputs`
                              feature adds it). seqio's DecoderFeatureConverter makes the
                              decoder sequence shift_right(inputs ++ targets), whose first
                              len(inputs) + 1 positions ([BOS, inputs]) are the prompt T5X
                              prefills; with `inputs_bidirectional_attention` they attend to
                              each other bidirectionally (`DecoderOnlyConfig`).
  Gemma, 'gemma'              `<bos>` (id 2), then the prompt's tokens, no EOS (the gemma
                              library's tokenizer with add_bos).

Rows from a seqio task come with the task's own EOS and are used as they are.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from specjax.data.inputs import cut_rows as cut
from specjax.models import DecodingModel

BOS_ID = 0
"""T5X's decoder start token (the shift-right fill), also PAD."""
BOS_IDS = {"t5x": BOS_ID, "gemma": 2}
"""The token a convention puts before every prompt: T5X's BOS 0, Gemma's `<bos>` 2."""


def convention(model: DecodingModel) -> str:
  """'encoder' (T5), or a decoder-only model's prompt_convention ('lm' or 't5x')."""
  if model.is_encoder_decoder:
    return "encoder"
  return getattr(getattr(model, "config", None), "prompt_convention", "lm")


def text_ids(vocab: Any, text: str, model: DecodingModel) -> List[int]:
  """A text's token ids as `model`'s convention frames an input: + EOS unless 'lm' or
  'gemma'."""
  ids = list(vocab.encode(text))
  return ids if convention(model) in ("lm", "gemma") else ids + [vocab.eos_id]


def frame(model: DecodingModel, rows: Sequence[Sequence[int]], *, max_len: int, eos_id: int,
          round_to: int = 1) -> Tuple[np.ndarray, Optional[np.ndarray]]:
  """Rows of token ids -> (inputs int32 [B, W] 0-padded, prompt_lengths int32 [B] or None).

  Args:
    model: the target (its convention frames the rows; see the module doc).
    rows: per example, its input ids (text_ids, or a task's ids).
    max_len: max_input_len: rows are cut to it (`cut`); a BOS comes on top.
    eos_id: the vocabulary's EOS.
    round_to: W is rounded up to a multiple of it (at most the longest possible row), so
      runs with similar inputs share compiled loops.
  Returns:
    The encoder inputs (prompt_lengths None), or the prompts and their lengths (BOS
    included under 't5x': BOS is 0, so lengths cannot be counted from the padding).
  """
  if not rows:
    raise ValueError("no inputs to frame")
  rows = cut(rows, max_len, eos_id)
  bos = convention(model) in BOS_IDS
  if bos:
    rows = [[BOS_IDS[convention(model)]] + row for row in rows]
  limit = max_len + bos
  width = max(1, max(len(r) for r in rows))
  width = min(max(limit, width), -(-width // round_to) * round_to)
  inputs = np.zeros((len(rows), width), np.int32)
  for i, row in enumerate(rows):
    inputs[i, :len(row)] = row
  if model.is_encoder_decoder:
    return inputs, None
  return inputs, np.array([len(r) for r in rows], np.int32)
