"""The log-likelihood of generated tokens under a model (T5X's `score_batch`)."""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import DecodingModel


def teacher_forced_logits(model: DecodingModel, params: Any, inputs: Any,
                          prompt_lengths: Optional[Any], tokens: Any) -> jax.Array:
  """The model's logits along generated tokens, by teacher forcing: out[b, j] predicts
  tokens[b, j] from the input and tokens[b, :j].

  Args:
    model: a T5Model or DecoderOnlyModel (anything with `logits`).
    params: its parameters.
    inputs: int32 [B, L]: encoder inputs, or the prompts (decoder-only).
    prompt_lengths: int32 [B] prompt lengths (decoder-only; None: non-zero count).
    tokens: int32 [B, N] generated tokens.
  Returns:
    float [B, N, V].
  """
  inputs, tokens = np.asarray(inputs, np.int32), np.asarray(tokens, np.int32)
  batch, n = tokens.shape
  if model.is_encoder_decoder:
    decoder_in = np.concatenate([np.zeros((batch, 1), np.int32), tokens[:, :-1]], axis=1)
    logits = model.logits(params, inputs, decoder_in)  # [B, N, V]
    offsets = np.zeros(batch, np.int32)
  else:
    plen = (np.asarray(prompt_lengths, np.int32) if prompt_lengths is not None
            else (inputs != 0).sum(1).astype(np.int32))
    seq = np.zeros((batch, int(plen.max()) + n), np.int32)
    for b in range(batch):
      seq[b, :plen[b]] = inputs[b, :plen[b]]
      seq[b, plen[b]:plen[b] + n] = tokens[b]
    kwargs = {"prefix_lengths": plen} if getattr(model, "prefix_lm", False) else {}
    logits = model.logits(params, seq, **kwargs)  # [B, P + N, V]
    offsets = plen - 1  # logits[:, plen - 1 + j] predicts tokens[:, j]
  index = jnp.asarray(offsets[:, None] + np.arange(n)[None, :])  # [B, N]
  return jnp.take_along_axis(logits, index[:, :, None], axis=1)  # [B, N, V]


def sequence_scores(model: DecodingModel, params: Any, inputs: Any, prompt_lengths: Optional[Any],
                    tokens: Any, lengths: Any) -> np.ndarray:
  """Σ_j log p(tokens[b, j] | everything before) for j < lengths[b], by teacher forcing.

  Raw logits (temperature 1, no top-k/top-p), as T5X's `score` mode of infer.py computes a
  target's log-likelihood; a final EOS counts like any token.

  Args:
    model, params, inputs, prompt_lengths, tokens: as for `teacher_forced_logits`.
    lengths: int32 [B] generated tokens per row (<= N).
  Returns:
    float32 [B].
  """
  tokens, lengths = np.asarray(tokens, np.int32), np.asarray(lengths, np.int32)
  rows = teacher_forced_logits(model, params, inputs, prompt_lengths, tokens)  # [B, N, V]
  log_p = jnp.take_along_axis(jax.nn.log_softmax(rows, axis=-1),
                              jnp.asarray(tokens)[:, :, None], axis=-1)[:, :, 0]  # [B, N]
  mask = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
  return np.asarray(jnp.sum(jnp.where(mask, log_p, 0.0), axis=1), np.float32)
