"""Training-time test for a feature head (EAGLE-3): the loss of K guesses per position.

At a chain's k-th guess the head reads its own (k - 1)-th prediction, never the target's
feature; a head trained teacher-forced only has never seen such inputs. A rollout step
(`FeatureHead.rollout`) runs K guesses per position in one call: step 0 reads the target's
true (fused) features; step k at position p reads step k - 1's prediction at p - 1 and sees
the target's features only up to p - k, as the k-th guess after a committed prefix ending at
p - k does. Each step's loss is the cross-entropy from the target's distribution of x_{p+1}
to the head's (through the target's frozen output projection), plus, weighted by
`feature_weight`, the smooth-L1 regression to the target's final feature; step k's loss is
weighted decay^k (EAGLE-3 and SpecJAX weight 0.8^k) and the total divided by the weights'
sum. With `vocab_limit` K the head's distribution is over the K ids a drafter with that
limit drafts over (the run's token ranking, most frequent first), the target's restricted to
them: its logits then cost K / V of the full product.

`warm_start_params` starts a head with `feature_layers` from a trained head of the final
features alone: the layers and projections it shares are copied, and the fusion starts as
the selection of the final hidden state, so step 0 of training is that head exactly.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models.feature_head import FeatureHead, shift_features


def smooth_l1(x: jax.Array) -> jax.Array:
  """Huber loss with threshold 1, elementwise (EAGLE's feature regression)."""
  magnitude = jnp.abs(x)
  return jnp.where(magnitude < 1.0, 0.5 * jnp.square(x), magnitude - 0.5)


def target_features(head: FeatureHead, target: Any, target_params: Any,
                    batch: Dict[str, jax.Array]) -> Tuple[jax.Array, jax.Array, jax.Array, Any]:
  """The frozen target teacher-forced over a batch -> (logits float32 [B, L, V], what the
  head is fed float32 [B, L, F] (F = `feature_width`: the chosen layers' hidden states, or
  the final features), the final features float32 [B, L, E] (the regression's target),
  encoded (a T5 target's `encode` when the head has cross_attention, else None)), all
  without gradient."""
  tokens = batch["decoder_input_tokens"]  # [B, L]
  layers = head.config.feature_layers
  final_index = target.num_feature_layers if layers is not None else None
  asked = None
  if layers is not None:  # the final hidden state too, for the regression
    asked = layers if final_index in layers else layers + (final_index,)
  encoded = None
  if target.is_encoder_decoder:
    source = batch["encoder_input_tokens"]
    if head.config.cross_attention:
      encoded = jax.lax.stop_gradient(target.encode(target_params, source))
    logits, hidden = target.features(target_params, source, tokens, encoded,
                                     feature_layers=asked)
  else:
    logits, hidden = target.features(target_params, tokens, feature_layers=asked)
  hidden = jax.lax.stop_gradient(hidden)
  if layers is None:
    return jax.lax.stop_gradient(logits), hidden, hidden, encoded
  width = head.config.emb_dim
  at = asked.index(final_index) * width
  final = hidden[..., at:at + width]
  return (jax.lax.stop_gradient(logits), hidden[..., :len(layers) * width], final, encoded)


def restricted(target: Any, target_params: Any, predicted: jax.Array, p: jax.Array,
               ids: Optional[jax.Array]) -> Tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """The head's distribution against the target's at every position.

  predicted [..., E], p [..., V] (the target's probabilities), ids int32 [K] or None (all)
  -> (cross-entropy [...], argmax agreement float32 [...], total variation [...] between p
  and the head's q over the whole vocabulary (q is 0 outside `ids`), the head's argmax ids
  int32 [...])."""
  if ids is None:
    log_q = jax.nn.log_softmax(target.feature_logits(target_params, predicted), axis=-1)
    guess = jnp.argmax(log_q, -1)
    tv = 0.5 * jnp.sum(jnp.abs(p - jnp.exp(log_q)), axis=-1)
    ce = -jnp.sum(p * log_q, axis=-1)
  else:
    rows = jax.lax.stop_gradient(target.output_rows(target_params, ids))
    log_q = jax.nn.log_softmax(target.rows_logits(rows, predicted), axis=-1)  # [..., K]
    p_ids = jnp.take(p, ids, axis=-1)
    guess = ids[jnp.argmax(log_q, -1)]
    tv = 0.5 * (jnp.sum(jnp.abs(p_ids - jnp.exp(log_q)), axis=-1)
                + jnp.clip(1.0 - jnp.sum(p_ids, axis=-1), 0.0))
    ce = -jnp.sum(p_ids * log_q, axis=-1)
  agree = (guess == jnp.argmax(p, -1)).astype(jnp.float32)
  return ce, agree, tv, guess


def rollout_loss_sums(head: FeatureHead, target: Any, head_params: Any, target_params: Any,
                      batch: Dict[str, jax.Array], steps: int, decay: float,
                      feature_weight: float, token_weight: float,
                      ids: Optional[jax.Array] = None) -> Dict[str, jax.Array]:
  """Training-time test over a batch (module docstring) -> weighted sums (float32 scalars):
  loss_sum (the decay-weighted mean over steps), step 0's ce_sum, feature_sum, correct_sum,
  tv_sum and weight_sum (its non-padding positions), and per step k >= 1 step{k}_correct_sum
  and step{k}_weight_sum (positions p >= k), the last as fed_correct_sum / fed_weight_sum."""
  logits, fed, final, encoded = target_features(head, target, target_params, batch)
  p = jax.nn.softmax(logits, axis=-1)  # [B, L, V]
  tokens = batch["decoder_input_tokens"]
  weights = batch["decoder_loss_weights"].astype(jnp.float32)  # [B, L]
  embedded = jax.lax.stop_gradient(target.embed(target_params, tokens))
  fused = head.fuse_layers(head_params, fed)  # [B, L, E]
  predicted = head.rollout(head_params, shift_features(fused), embedded, steps, encoded)
  position = jnp.arange(tokens.shape[1])[None, :]
  loss, total, out = 0.0, 0.0, {}
  for k in range(steps):
    ce, agree, tv, _ = restricted(target, target_params, predicted[k], p, ids)
    regression = jnp.mean(smooth_l1(predicted[k] - final), axis=-1)  # [B, L]
    w = weights * (position >= k)  # the k-th guess needs a prefix up to p - k
    scale = float(decay) ** k
    loss = loss + scale * jnp.sum(w * (feature_weight * regression + token_weight * ce))
    total += scale
    if k == 0:
      out = {"ce_sum": jnp.sum(ce * w), "feature_sum": jnp.sum(regression * w),
             "correct_sum": jnp.sum(agree * w), "tv_sum": jnp.sum(tv * w),
             "weight_sum": jnp.sum(w)}
    else:
      out[f"step{k}_correct_sum"] = jnp.sum(agree * w)
      out[f"step{k}_weight_sum"] = jnp.sum(w)
  if steps > 1:
    out["fed_correct_sum"] = out[f"step{steps - 1}_correct_sum"]
    out["fed_weight_sum"] = out[f"step{steps - 1}_weight_sum"]
  return dict(out, loss_sum=loss / total)


def warm_start_params(head: FeatureHead, params: Any, source_params: Any,
                      num_layers: int) -> Any:
  """`params` (a fresh init of `head`) with every parameter that `source_params` (a trained
  head's, e.g. one of the final features alone) has under the same name and shape copied
  over; with `feature_layers` that include the final hidden state (index `num_layers`) and
  no `feature_fusion` in the source, the fusion kernel starts as its selection (identity on
  its block, zeros elsewhere). ValueError when a shared name has another shape."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  source = {jax.tree_util.keystr(path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(source_params)[0]}
  leaves = []
  for path, leaf in flat:
    name = jax.tree_util.keystr(path)
    if name in source:
      if np.shape(source[name]) != np.shape(leaf):
        raise ValueError(f"warm start: parameter {name} has shape {np.shape(source[name])} in "
                         f"the source head, {np.shape(leaf)} in this one")
      leaf = jnp.asarray(source[name], jnp.float32)
    leaves.append(leaf)
  out = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(params), leaves)
  layers = head.config.feature_layers
  if layers is not None and num_layers in layers and "feature_fusion" not in source_params:
    width = head.config.emb_dim
    kernel = np.zeros((len(layers) * width, width), np.float32)
    at = layers.index(num_layers) * width
    kernel[at:at + width] = np.eye(width, dtype=np.float32)
    out["feature_fusion"] = {"kernel": jnp.asarray(kernel)}
  return out
