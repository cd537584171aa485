"""Drafters: who guesses the tokens that the target verifies.

One protocol for every drafter, chain or tree. A drafter is stateless Python configuration
(hashable, passed to `jax.jit` as static) plus a `params` pytree of arrays and a
per-generation `state` pytree, so the decode loop stays a pure function:

  state = drafter.init(params, inputs, seq, length, cache_len)
  proposal, state = drafter.propose(params, state, seq, length, gamma, row_keys, sampling)
  state = drafter.update(state, Accepted(start=..., n=..., gamma=..., path=...))

A chain drafter (`tree` None) proposes up to `max_gamma` guesses in a `Proposal`; a tree
drafter (`tree` a `StaticTree` / `DynamicTree`) proposes the tree's nodes in a
`TreeProposal` (`specjax.draft.tree`) and ignores γ. `proposal.probs` are the standardized
q (same `Sampling` as the target) the tokens were drawn from, so verification stays exact
whatever the drafter. Randomness: the guess at absolute position j of a row uses
`fold_in(fold_in(row_key, j), DRAFT_STREAM)`.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional, Protocol, Tuple, runtime_checkable

import flax
import jax
import jax.numpy as jnp

from specjax.checks import check_bool, check_int
from specjax.sampling import DRAFT_STREAM, Sampling, argmax, categorical, position_key


@flax.struct.dataclass
class Proposal:
  """What a drafter hands the target for one round."""

  tokens: jax.Array  # int32 [B, G]: the guesses x_1..x_G (beyond a row's γ: ignored)
  probs: jax.Array  # float32 [B, G, V]: the standardized q each guess was drawn from
  calls: jax.Array  # int32 [B]: draft model calls spent (0 for table drafters)


@flax.struct.dataclass
class Accepted:
  """What verification decided in one round, handed to `Drafter.update`."""

  start: jax.Array  # int32 [B]: each row's committed length when the round began
  n: jax.Array  # int32 [B]: guesses (chain) or path nodes (tree) accepted
  gamma: jax.Array  # int32 [B]: guesses offered (chain: the row's γ; tree: max_depth)
  path: Optional[jax.Array] = None  # int32 [B, D]: a tree's accepted nodes (-1 pad); chain None
  features: Optional[jax.Array] = None  # float32 [B, k, E]: the target's features at the k
  # positions the round scored (start - 1 ..), for a drafter that `wants_features`; else None


@runtime_checkable
class Drafter(Protocol):
  """What every decode loop needs from a drafter, chain or tree (module docstring)."""

  tree: Any
  """None for a chain drafter; the `StaticTree` / `DynamicTree` a tree drafter proposes."""

  deterministic: bool
  """Whether every q is a point mass at its guess (prompt lookup): a tree is then verified by
  the deterministic rule of `specjax.verify.tree`, which needs no q."""

  wants_features: bool
  """Whether `update` needs the target's features at the scored positions (`Accepted.features`,
  a `specjax.models.FeatureModel` target): the chain loop then scores with `decode_features`,
  and its `init` also takes `features=` (a decoder-only target's prompt features) and
  `encoded=` (a T5 target's `encode` of the inputs). False (`DrafterDefaults`) for every
  drafter but the feature drafters."""

  feature_layers: Any
  """With `wants_features`: None (the target's final features), or the target's layers whose
  hidden states the loops ask `decode_features` for (`feature_layers`,
  `specjax.models.protocol.FEATURE_LAYERS`); None (`DrafterDefaults`) for the others."""

  @property
  def max_gamma(self) -> int:
    """Static bound of γ (data): guess buffers are [B, max_gamma]; a tree's `max_depth`."""

  @property
  def lookahead(self) -> int:
    """Cache positions one round writes past a row's committed tokens (the target's and the
    draft's): max_gamma for a chain, every grown node for a tree."""

  @property
  def models(self) -> Tuple[Any, ...]:
    """The draft `DecodingModel`s whose caches the drafter keeps (() for tables)."""

  @property
  def vocab_size(self) -> Optional[int]:
    """The draft vocabulary, checked against the target's; None if it adapts."""

  def init(self, params: Any, inputs: jax.Array, seq: jax.Array, length: jax.Array,
           cache_len: int) -> Any:
    """inputs: int32 [B, L_in] (encoder inputs or prompts); seq: int32 [B, T]; length: int32 [B]."""

  def propose(self, params: Any, state: Any, seq: jax.Array, length: jax.Array,
              gamma: jax.Array, row_keys: jax.Array, sampling: Sampling) -> Tuple[Any, Any]:
    """gamma: int32 [B] (each row's γ; a tree drafter ignores it) -> (Proposal or
    TreeProposal, state); guesses beyond a row's γ are ignored by the verifier."""

  def update(self, state: Any, accepted: Accepted) -> Any:
    """The state after verification (`Accepted`)."""

  def as_tree(self, tree: Any) -> "Drafter":
    """The tree drafter that drafts `tree` (a StaticTree or DynamicTree) the way this chain
    drafter drafts its chains (`tree_decode(..., drafter, tree=...)`); ValueError for a
    drafter that cannot (`DrafterDefaults`)."""


class DrafterDefaults:
  """The protocol's attributes that only some drafters change, with their defaults, in one
  place: every shipped drafter inherits them and overrides what it needs."""

  wants_features: ClassVar[bool] = False
  feature_layers: ClassVar[None] = None

  def as_tree(self, tree: Any) -> "Drafter":
    """No tree of its own: ValueError naming the drafter."""
    raise ValueError(f"{type(self).__name__} cannot draft a given tree: tree_decode takes a "
                     "tree drafter with tree=None, or a draft model, ModelDrafter, n-gram "
                     f"table or FeatureDrafter with tree=..., got tree={tree!r}")


class TableDrafter(DrafterDefaults):
  """A drafter without a draft model (n-gram tables, prompt lookup): no model to cache, its
  vocabulary its `vocab` field; a chain's round writes its guesses past the committed tokens.
  A tree drafter overrides `tree` and `lookahead`."""

  tree: ClassVar[Any] = None  # a chain drafter
  models: ClassVar[Tuple] = ()  # no draft model: nothing to cache

  @property
  def vocab_size(self) -> int:
    return self.vocab

  @property
  def lookahead(self) -> int:
    """Cache positions a round writes past the committed tokens: the guesses."""
    return self.max_gamma


def check_sizes(drafter: Any, **minimums: int) -> None:
  """ValueError unless each named field of `drafter` is an integer >= its minimum (bools
  refused), e.g. `check_sizes(self, max_gamma=1)`."""
  for field, low in minimums.items():
    check_int(f"{type(drafter).__name__}.{field}", getattr(drafter, field), low=low)


def check_flags(drafter: Any, *fields: str) -> None:
  """ValueError unless each named field of `drafter` is a bool."""
  for field in fields:
    check_bool(f"{type(drafter).__name__}.{field}", getattr(drafter, field))


def sample_guess(row_keys, length, i, probs, greedy: bool):
  """Draws guess i (absolute position length + i) from probs [B, V] per row."""
  if greedy:  # probs are one-hot: no randomness needed
    return argmax(probs)
  keys = jax.vmap(position_key, in_axes=(0, 0, None))(row_keys, length + i, DRAFT_STREAM)
  return jax.vmap(categorical)(keys, probs)


def guess_chain(first_logits, step: Callable, carry: Any, row_keys, length, gamma,
                max_gamma: int, sampling: Sampling, unroll: bool = False):
  """A chain drafter's guesses, one draft call each: guess 0 from `first_logits` [B, V] (the
  drafter's first call, which caught its state up), guess i from `step(carry, prev, i) ->
  (logits [B, V], carry)` with prev int32 [B, 1] guess i - 1. Rows with a smaller γ (gamma
  int32 [B]) ride along to the batch's largest; only their own count.

  unroll: draft all max_gamma guesses in straight-line code (no loop: on a GPU each trip of a
  while loop copies its predicate to the host), whatever the rows' γ; guesses past a row's γ
  are drawn and ignored, so the output is the same.
  -> (tokens int32 [B, max_gamma], probs float32 [B, max_gamma, V] (the standardized q of
  `draft_step`), the last carry)."""
  batch = first_logits.shape[0]
  guess0, probs0 = draft_step(row_keys, length, 0, first_logits, sampling)
  tokens = jnp.zeros((batch, max_gamma), jnp.int32).at[:, 0].set(guess0)
  all_probs = jnp.zeros((batch, max_gamma, probs0.shape[-1]), jnp.float32).at[:, 0].set(probs0)

  def body(i, loop):  # one draft call; runs γ - 1 times per round
    tokens, all_probs, carry = loop
    prev = jax.lax.dynamic_slice_in_dim(tokens, i - 1, 1, axis=1)  # [B, 1]
    logits, carry = step(carry, prev, i)
    guess, probs = draft_step(row_keys, length, i, logits, sampling)
    tokens = jax.lax.dynamic_update_slice_in_dim(tokens, guess[:, None], i, axis=1)
    all_probs = jax.lax.dynamic_update_slice_in_dim(all_probs, probs[:, None], i, axis=1)
    return tokens, all_probs, carry

  loop = (tokens, all_probs, carry)
  if not unroll:
    return jax.lax.fori_loop(1, jnp.max(gamma), body, loop)
  for i in range(1, max_gamma):
    loop = body(i, loop)
  return loop


def draft_calls(gamma, drafter: Any):
  """A chain round's draft calls per row (int32 [B]): the row's γ (gamma int32 [B]), or
  max_gamma for a drafter that unrolls its guesses."""
  return jnp.full_like(gamma, drafter.max_gamma) if drafter.unroll else gamma


def catch_up_loop(call: Callable[[Any, jax.Array], Any], state: Any, fed, length, window: int,
                  begin: Callable[[jax.Array], jax.Array], end: Callable[[jax.Array], jax.Array]):
  """The catch-up of a drafter with a cache of its own: while some row lags `window` or more
  behind its last committed position (length - 1 - fed >= window; fed, length int32 [B]),
  every row is fed one window from start = begin(fed) (`state = call(state, start)`; a row
  already close enough re-feeds positions it holds, with the same values) and fed becomes
  end(start). -> (state, fed int32 [B]); no call when no row lags that far."""
  def behind(carry):
    return jnp.any(length - 1 - carry[1] >= window)

  def feed(carry):
    state, fed = carry
    start = begin(fed)
    return call(state, start), end(start)

  return jax.lax.while_loop(behind, feed, (state, fed))


def draft_step(row_keys, length, i, logits, sampling: Sampling):
  """Guess i and its standardized q from a draft's logits [B, V] -> (int32 [B], float32 [B, V]).

  Greedy: the guess is the argmax of the logits and q its one-hot, which is
  `sampling.probs` (argmax, ties to the lowest id) with one pass over the
  vocabulary instead of two (an argmax to build q, another to read it back).
  """
  if sampling.greedy:
    guess = argmax(logits)
    return guess, jax.nn.one_hot(guess, logits.shape[-1], dtype=jnp.float32)
  probs = sampling.probs(logits)
  return sample_guess(row_keys, length, i, probs, False), probs


