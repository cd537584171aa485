"""Drafts from the target's own features through a feature head (EAGLE-style): `FeatureDrafter`
guesses a chain, `FeatureTreeDrafter` a token tree (`FeatureDrafter.as_tree`).

The head (`specjax.models.feature_head`) runs over the target's positions: at position p it
reads [f_{p-1}, embedding(x_p)] and predicts f_p, whose logits through the target's own
output projection give the draft q of x_{p+1}. Its cache holds positions 0..fed-1 fed with
the target's TRUE features; a round's later positions hold its own predictions. A head with
`feature_layers` (EAGLE-3) is fed the fusion (`FeatureHead.fuse_layers`) of the target's
hidden states at those layers where an EAGLE-1 head reads f: the loops ask the target for
them (`Drafter.feature_layers`) and the state keeps them, n * E wide.

  propose at committed length L: the head is fed positions fed .. L-1 in one window (true
    features f_{fed-1} .. f_{L-2}), the last of which gives q(x_L); each further guess feeds
    (its own predicted feature, the previous guess). `fed` becomes L.
  update: the loop hands the target's features at the positions the round scored
    (`Accepted.features`, positions L-1 .. L-1+bucket); they are kept in the state, so the
    next window re-feeds the accepted positions with true features. The correction token's
    feature is not known yet: the next round's target call scores it first.

Params: `FeatureDrafter.params(head_params, target_params, token_ranking=None)` -> {'head',
'target'} (+ 'ids' and 'rows' with `vocab_limit`): the head's own parameters and
the target's (frozen: its embedding and output projection are read; a decoder-only target's
prompt features come from the loop's prefill, or one pass over the prompt in `init`).
Verification is unchanged, so the output is exactly the target's distribution.

Trees (`FeatureTreeDrafter`: EAGLE's trees, EAGLE-2's with a `DynamicTree`), a round:

  window  one head call feeds the committed positions not yet fed true features (as
          `FeatureDrafter`); its prediction at the last committed token gives the root's q.
  levels  the root's children are drawn from it (`specjax.draft.tree.draw_level`); then ONE
          head call per level feeds that level's nodes, each with its parent's PREDICTED
          feature and its own token, at slot length + j under tree attention (each node sees
          the committed positions and its ancestors), and their predictions give the q of
          their children. A `DynamicTree` expands the nodes of highest path probability
          (EAGLE-2); its `keep` cut is exact at temperature 0 only, as for any tree drafter.

The tree loop scores the tree with the target's features and hands the drafter those of the
root and the accepted path (`Accepted.features`); the next window re-feeds those positions
with them, so the head's tree slots never need moving. Verification is the tree loop's
(`specjax.verify.tree`), so the output is exactly the target's distribution.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specjax.draft.base import (Accepted, DrafterDefaults, Proposal, catch_up_loop, check_flags,
                                check_sizes, draft_calls, guess_chain)
from specjax.draft.tree import (TreeProposal, cache_positions, check_shape, grow_tree,
                                level_attention)
from specjax.models import FeatureModel
from specjax.models.feature_head import FeatureHead, shift_features
from specjax.models.layers import EncodedInputs
from specjax.models.protocol import layers_kwargs
from specjax.models.tree import nodes_call
from specjax.rows import take_rows, update_rows
from specjax.sampling import Sampling


@flax.struct.dataclass
class FeatureDrafterState:
  """A `FeatureDrafter`'s per-decode state."""
  cache: Any  # the head's KV cache (KVCache, one layer)
  features: jax.Array  # float32 [B, T, F]: the target's features by position (F = the
  # head's feature_width: E, or n * E with feature_layers; valid below each row's length - 1;
  # later positions are stale and rewritten before they are read)
  fed: jax.Array  # int32 [B]: head positions 0..fed-1 were fed true features
  start: jax.Array  # int32 [B]: the row's length at the last `propose`
  encoded: Any = None  # a head with cross_attention: the target's last decoder layer's
  # cross-attention keys and values of the rows' source (an EncodedInputs of one layer)


class FeatureHeadDrafter(DrafterDefaults):
  """What the chain and tree feature drafters share (both hold `target` and `head`): the
  params, the start, the state kept between rounds."""

  wants_features: ClassVar[bool] = True

  @property
  def vocab_size(self) -> int:
    return self.head.config.vocab_size

  @property
  def feature_layers(self):
    """The target layers the head reads (`FeatureHeadConfig.feature_layers`; None: the final
    features), which the loops ask `decode_features` for."""
    return self.head.config.feature_layers

  @property
  def models(self) -> Tuple[Any, ...]:
    return (self.head,)  # its one-layer cache (the target's is the loop's)

  def params(self, head_params: Any, target_params: Any, token_ranking: Any = None) -> dict:
    """The drafter's params {'head', 'target'}: ValueError naming the first parameter of
    either that does not fit the head's or the target's config.

    With `vocab_limit` K the params also hold the K token ids drafted over ('ids' [K]) and
    their rows of the target's output projection ('rows', `output_rows`): the first K of
    `token_ranking` (token ids int [>= K], most frequent first: the head's
    `token_ranking.npy`, `specjax.train.load_token_ranking`), else ids 0..K-1.
    `token_ranking` is ignored without `vocab_limit`. With int8 head kernels
    (`specjax.params.quantize_kernels`) the rows are int8 too, their scales in
    'rows_scale'."""
    self.head.check_params(head_params)
    self.target.check_params(target_params, "target parameters")
    params = {"head": head_params, "target": target_params}
    limit = self.vocab_limit
    if limit is None:
      return params
    ranking = np.arange(limit) if token_ranking is None else np.asarray(token_ranking)
    if ranking.ndim != 1 or ranking.shape[0] < limit:
      raise ValueError(f"token_ranking must list at least vocab_limit = {limit} token ids, "
                       f"got shape {ranking.shape}")
    ids = ranking[:limit]
    rows = self.target.output_rows(target_params, ids)
    if any(getattr(leaf, "dtype", None) == jnp.int8 for leaf in jax.tree.leaves(head_params)):
      rows, scales = self.target.quantize_rows(rows)  # an int8 head drafts in int8 throughout
      params["rows_scale"] = scales
    return dict(params, ids=jnp.asarray(ids, jnp.int32), rows=rows)

  def init(self, params, inputs, seq, length, cache_len, features=None, encoded=None):
    """The state at the start of a decode; `features`: a decoder-only target's prompt
    features float32 [B, P, E] from the loop's prefill (None: computed here); `encoded`: a T5
    target's `encode` of `inputs` from the loop's start (None: computed here when the head
    has cross_attention)."""
    return start_state(self.target, self.head, params, inputs, seq, length, cache_len,
                       features, encoded)

  def draft_logits(self, params: dict, features: jax.Array) -> jax.Array:
    """The head's predicted features [..., E] -> the draft's logits [..., V] through the
    target's output projection (`params`: the drafter's). With `vocab_limit` only the logits
    of params['ids'] are computed; the others get -inf: q is 0 there, and verification stays
    exact."""
    if self.vocab_limit is None:
      return self.target.feature_logits(params["target"], features)
    logits = self.target.rows_logits(params["rows"], features,
                                     params.get("rows_scale"))  # [..., K]
    full = jnp.full(features.shape[:-1] + (self.target.vocab_size,), -jnp.inf, jnp.float32)
    return full.at[..., params["ids"]].set(logits)

  def update(self, state: FeatureDrafterState, accepted: Accepted) -> FeatureDrafterState:
    """Keeps the target's features at the positions the round scored that were committed
    (`Accepted.features` from position start - 1: a chain's, or a tree's root and accepted
    path); the next `propose` re-feeds the head from `start` with them."""
    if accepted.features is None:
      raise ValueError(f"{type(self).__name__} needs the target's features of every round; "
                       "this loop does not supply them")
    features = update_rows(state.features, accepted.features.astype(jnp.float32),
                           accepted.start - 1)
    return state.replace(features=features, fed=jnp.minimum(state.fed, accepted.start))


@dataclasses.dataclass(frozen=True)
class FeatureDrafter(FeatureHeadDrafter):
  """A chain drafter whose guesses come from a feature head over the target's features.

  `target` is the `FeatureModel` being decoded (its features, embedding and output projection
  are read); `head` the `FeatureHead` trained for it (same emb_dim and vocabulary, checked
  here). Its params are `FeatureDrafter.params(head_params, target_params)`.
  """

  target: Any  # a specjax.models.FeatureModel
  head: FeatureHead
  max_gamma: int
  vocab_limit: Optional[int] = None
  """Draft over vocab_limit token ids only (None: all): the first vocab_limit of the head's
  token ranking when `params` gets one (the ids most frequent in its training data, as
  FR-Spec restricts a draft's head), else ids 0 .. vocab_limit - 1 (SentencePiece numbers
  a unigram model's pieces by score). The head's logits cost vocab_limit / V of the full
  product; a guess outside the ids is never made (its q is 0), which costs acceptance,
  never exactness."""
  unroll: bool = False
  """Draft all max_gamma guesses in straight-line code, no loop per guess (`guess_chain`): for
  GPUs and TPUs at a fixed γ = max_gamma. A smaller γ still drafts max_gamma guesses."""

  tree: ClassVar[None] = None  # a chain drafter
  deterministic: ClassVar[bool] = False

  def __post_init__(self):
    check_sizes(self, max_gamma=1)
    check_flags(self, "unroll")
    check_head(self)

  @property
  def lookahead(self) -> int:
    """Cache positions a round writes past the committed tokens: the guesses."""
    return self.max_gamma

  def propose(self, params, state, seq, length, gamma, row_keys, sampling):
    head, target_params = params["head"], params["target"]
    feature, cache = catch_up(self.target, self.head, params, state, seq, length,
                              self.max_gamma + 1)

    def step(carry, prev, i):  # the head on its own last prediction and guess i - 1
      cache, feature = carry
      predicted, cache = self.head.decode(head, cache, feature[:, None],
                                          self.target.embed(target_params, prev),
                                          length + i - 1, encoded=state.encoded)
      return self.draft_logits(params, predicted[:, 0]), (cache, predicted[:, 0])

    tokens, all_probs, (cache, _) = guess_chain(self.draft_logits(params, feature), step,
                                                (cache, feature), row_keys, length, gamma,
                                                self.max_gamma, sampling, self.unroll)
    state = state.replace(cache=cache, fed=length, start=length)
    return Proposal(tokens=tokens, probs=all_probs, calls=draft_calls(gamma, self)), state

  def as_tree(self, tree: Any) -> "FeatureTreeDrafter":
    """The same head drafting `tree` (a StaticTree or DynamicTree), over the same ids."""
    return FeatureTreeDrafter(self.target, self.head, tree, self.vocab_limit, unroll=self.unroll)



def check_head(drafter: Any) -> None:
  """ValueError unless `drafter.head` is a FeatureHead and `drafter.target` a FeatureModel of
  the head's emb_dim and vocabulary (both shapes named), and `drafter.vocab_limit` None or in
  [1, V]."""
  name = type(drafter).__name__
  if not isinstance(drafter.head, FeatureHead):
    raise ValueError(f"{name}.head must be a FeatureHead, got {type(drafter.head).__name__}")
  if not isinstance(drafter.target, FeatureModel):
    raise ValueError(f"{name} needs a target that returns its features (a "
                     f"specjax.models.FeatureModel), got {type(drafter.target).__name__}")
  drafter.head.check_target(drafter.target)
  if drafter.vocab_limit is not None:
    check_sizes(drafter, vocab_limit=1)
    if drafter.vocab_limit > drafter.target.vocab_size:
      raise ValueError(f"{name}.vocab_limit {drafter.vocab_limit} exceeds the target's "
                       f"vocab_size {drafter.target.vocab_size}")


def start_state(target: Any, head: FeatureHead, params: dict, inputs, seq, length,
                cache_len: int, prompt_features=None, encoded=None) -> FeatureDrafterState:
  """A feature drafter's state at the start of a decode: a decoder-only target's prompt
  features (`prompt_features` float32 [B, P, E], the loop's prefill gives them; None: one
  pass over the prompt here) fed to the head; nothing fed for a T5 decoder, whose head with
  cross_attention keeps the target's last decoder layer's keys and values of the source
  (from `encoded`, the target's `encode` of `inputs`; None: encoded here)."""
  batch, width = seq.shape
  features = jnp.zeros((batch, width, head.config.feature_width), jnp.float32)
  cache = head.init_cache(batch, cache_len)
  if target.is_encoder_decoder:  # the decoder starts at token 0: nothing fed yet
    zeros = jnp.zeros((batch,), jnp.int32)
    source = None
    if head.config.cross_attention:
      encoded = target.encode(params["target"], inputs) if encoded is None else encoded
      source = EncodedInputs(keys=encoded.keys[-1:], values=encoded.values[-1:],
                             mask=encoded.mask)
    return FeatureDrafterState(cache=cache, features=features, fed=zeros, start=length,
                               encoded=source)
  if prompt_features is None:
    prompt_features = _prompt_features(target, params["target"], inputs, length,
                                       head.config.feature_layers)
  features = jax.lax.dynamic_update_slice_in_dim(features, prompt_features, 0, axis=1)
  fused = head.fuse_layers(params["head"], prompt_features)
  _, cache = head.decode(params["head"], cache, shift_features(fused),
                         target.embed(params["target"], inputs), jnp.zeros((batch,), jnp.int32))
  return FeatureDrafterState(cache=cache, features=features, fed=jnp.maximum(length - 1, 0),
                             start=length)


def catch_up(target: Any, head: FeatureHead, params: dict, state: FeatureDrafterState, seq,
             length, width: int) -> Tuple[jax.Array, Any]:
  """Feeds the head the committed positions it has not been fed their true features, the last
  `width` of them in one call ending at the last committed one (earlier ones first, `width` at
  a time, when a row lags further: after rounds in which the drafter did not draft).
  -> (the head's predicted feature at L-1, float32 [B, E], whose logits are q(x_L); the
  head's cache)."""
  def window(cache, begin):  # positions begin .. begin + width - 1 with true features
    at = begin[:, None] + jnp.arange(width)[None, :]  # [B, W]
    before = jnp.take_along_axis(state.features, jnp.clip(at - 1, 0)[:, :, None], axis=1)
    before = head.fuse_layers(params["head"], before)  # [B, W, E]
    before = jnp.where((at >= 1)[:, :, None], before, 0.0)  # f_{-1} = 0
    return head.decode(params["head"], cache, before,
                       target.embed(params["target"], take_rows(seq, at)), begin,
                       encoded=state.encoded)

  cache, fed = catch_up_loop(lambda cache, begin: window(cache, begin)[1], state.cache,
                             state.fed, length, width,
                             begin=lambda fed: jnp.minimum(fed, jnp.maximum(length - width, 0)),
                             end=lambda begin: jnp.minimum(begin + width, length - 1))
  lag = jnp.clip(length - 1 - fed, 0, width - 1)
  predicted, cache = window(cache, length - 1 - lag)
  return jnp.take_along_axis(predicted, lag[:, None, None], axis=1)[:, 0], cache


def _prompt_features(target: Any, params: Any, prompts: jax.Array, length: jax.Array,
                     feature_layers=None):
  """The target's features float32 [B, P, E] ([B, P, n * E] with `feature_layers`) over
  decoder-only prompts [B, P] (a pass on a scratch cache of P slots, as the loop's prefill:
  prefix-LM targets see their prefix)."""
  batch, width = prompts.shape
  kwargs = {"prefix_lengths": length} if getattr(target, "prefix_lm", False) else {}
  kwargs.update(layers_kwargs(feature_layers))
  _, features, _ = target.decode_features(params, target.init_cache(batch, width), prompts,
                                          jnp.zeros((batch,), jnp.int32), None, **kwargs)
  return features


@dataclasses.dataclass(frozen=True)
class FeatureTreeDrafter(FeatureHeadDrafter):
  """A tree drafter whose nodes come from a feature head over the target's features.

  `target` is the `FeatureModel` being decoded, `head` the `FeatureHead` trained for it (same
  emb_dim and vocabulary, checked here), `tree` a `StaticTree` or `DynamicTree`. Its params
  are `FeatureTreeDrafter.params(head_params, target_params)`, as `FeatureDrafter`'s.
  """

  target: Any  # a specjax.models.FeatureModel
  head: FeatureHead
  tree: Any  # StaticTree or DynamicTree
  vocab_limit: Optional[int] = None
  """As `FeatureDrafter.vocab_limit`: nodes are drawn from that many token ids only (the
  first of the token ranking given to `params`, else ids below it)."""
  unroll: bool = False
  """The spine tail's levels as straight-line code, no loop per level (`grow_tree`): for GPUs
  and TPUs; the tree's depth is static, so nothing is drafted that a loop would not."""

  deterministic: ClassVar[bool] = False

  def __post_init__(self):
    check_shape(self.tree)
    check_flags(self, "unroll")
    check_head(self)

  @property
  def max_gamma(self) -> int:
    """The tree's depth: the most guesses a round can accept."""
    return self.tree.max_depth

  @property
  def lookahead(self) -> int:
    """Cache positions a round writes past the committed tokens: every grown node (the
    window's re-fed positions lie below them)."""
    return self.tree.grown

  def propose(self, params, state: FeatureDrafterState, seq, length, gamma, row_keys,
              sampling: Sampling) -> Tuple[TreeProposal, FeatureDrafterState]:
    """seq [B, T], length [B], row_keys [B] -> (TreeProposal, state); gamma unused (the
    tree's shape is static)."""
    del gamma
    tree, target, batch = self.tree, self.target, seq.shape[0]
    head, target_params = params["head"], params["target"]
    root, cache = catch_up(target, self.head, params, state, seq, length, tree.max_depth + 1)
    # predicted[:, 0] is the root's predicted feature, predicted[:, j + 1] node j's.
    predicted = jnp.zeros((batch, tree.grown + 1, root.shape[-1]),
                          jnp.float32).at[:, 0].set(root)

    def level(carry, tokens, parent, depth, plo, phi):  # one head call over a level's nodes
      cache, predicted = carry  # each node reads its parent's predicted feature
      inputs = jnp.take_along_axis(predicted, (parent[:, plo:phi] + 1)[:, :, None], axis=1)
      attention = level_attention(tree, parent, depth, length, plo, phi, cache_positions(cache))
      out, cache = self.head.decode(head, cache, inputs,
                                    target.embed(target_params, tokens[:, plo:phi]),
                                    length + plo, tree=attention, encoded=state.encoded)
      predicted = predicted.at[:, plo + 1:phi + 1].set(out)
      return self.draft_logits(params, out), (cache, predicted)  # [B, m, V]

    def spine(carry, tokens, parent, depth, anc, above):  # one head call over node `above`
      cache, predicted = carry
      attention = nodes_call(anc, depth, length, above, 1, cache_positions(cache))
      # The node's parent is looked up: at the loop's first depth it lies in a level of
      # several nodes (spines (4, 1): node 2's parent is node 0).
      up = jax.lax.dynamic_slice_in_dim(parent, above, 1, axis=1) + 1  # [B, 1]
      inputs = jnp.take_along_axis(predicted, up[:, :, None], axis=1)  # [B, 1, E]
      feed = jax.lax.dynamic_slice_in_dim(tokens, above, 1, axis=1)
      out, cache = self.head.decode(head, cache, inputs, target.embed(target_params, feed),
                                    length + above, tree=attention, encoded=state.encoded)
      predicted = jax.lax.dynamic_update_slice_in_dim(predicted, out, above + 1, axis=1)
      return self.draft_logits(params, out)[:, 0], (cache, predicted)

    proposal, _, (cache, _) = grow_tree(tree, self.draft_logits(params, root), level, spine,
                                        (cache, predicted), row_keys, length, sampling,
                                        self.unroll)
    return proposal, state.replace(cache=cache, fed=length, start=length)
