"""Exact verification of a token tree for ONE row (vmap it over a batch).

A row's tree has N nodes in level order (every parent before its children, every
node of depth d before every node of depth d + 1, siblings in the order they were
drawn): tokens [N], parent [N] (-1: a child of the root, the last committed token),
depth [N] (1-based), valid [N]. Beside them the draft's distributions q [N + 1, V]
(row 0 at the root, row j + 1 at node j: what that node's children were drawn from)
and the target's p [N + 1, V] at the same places, all from ONE target call.

Temperature 0: the accepted path is the longest root-to-node path whose every token is
the target's argmax at its parent; the target's argmax after it is emitted too.

Temperature > 0, the rule (recursive rejection, children in draw order). Standing at
node v with the target's p_v and the draft's q_v:

  p <- p_v; q <- q_v
  for each child x_i of v, in order:
    accept x_i with probability min(1, p(x_i) / q(x_i))
      -> descend into x_i (p <- p_{x_i}, q <- q_{x_i}, fresh) and repeat there
    else p <- norm(max(p - q, 0))
         q <- q with x_i's mass removed, renormalized   (children drawn WITHOUT replacement)
         q unchanged                                     (children drawn i.i.d. from q_v)
  no child accepted: emit a draw from p (the final residual; p_v itself if v has no child)

Why it is exact (sketch). Claim: standing at a child slot with current (p, q), where the
slot's child x is distributed as q given everything the verifier has seen, the token
emitted at v's position is distributed as p. The last slot: x ~ q is accepted with
probability min(1, p/q), otherwise the residual is drawn: P(y) = min(q(y), p(y)) +
(1 - Σ min(p, q)) · max(p(y) - q(y), 0) / Σ max(p - q, 0) = p(y) (Leviathan et al.,
Thm 3.5; the two normalizers are equal). An earlier slot: the same computation with
"draw from the residual" replaced by "go on with the next slot", which by induction
emits a draw from that residual, because the next child is distributed as the updated q
given the history: without replacement the next draw is q with the earlier draws
removed and renormalized; i.i.d. it is q again. A rejected x_i had p(x_i) < q(x_i), so
the residual holds no mass at x_i and a later child equal to x_i (i.i.d.) is rejected.
No child (or no slot left): the emitted token is a draw from the current p. Descending
into an accepted x_i restarts the claim one position later with the target's p at x_i,
whose draws are the draft's at x_i: by the chain rule every emitted prefix, and the
token after it, follow the target. Because each step keeps "the emitted token's
distribution given the history is the current p", stopping after any number of children
is exact, PROVIDED that whether child slot i exists is independent of x_i and of the
later siblings' draws given the history (a count fixed before the draws, or one chosen
from other branches' draws). A count that looks at the child itself is NOT exact:
trying x_1 only when x_1 = a, with p(a) < q(a), emits a with probability
p(a) (2 - q(a)) > p(a). So a dynamic tree may choose which nodes to expand from their
path probabilities, but not prune the drawn children by their own probabilities.

Deterministic children (`deterministic=True`: a drafter that picks its candidates as a
function of the committed tokens, such as prompt lookup's several matches): child x_i's q
is δ(x_i) given the history, so it is accepted with probability p(x_i) and a rejection
leaves norm(max(p - δ(x_i), 0)), p with x_i removed; the claim above holds slot by slot
with q = δ(x_i) (the candidates and their count are fixed by the history). A candidate
equal to a rejected sibling has p = 0 there and is rejected.

A child whose q is 0 (no mass left to draw from: every token of q's support was tried)
is no draw at all and is skipped. Acceptance is tested as `u q(x) < p(x)`.

Lenience l < 1 (paper A.5; NOT exact): a child is accepted when `u l q(x) < p(x)` and a
rejection leaves norm(max(p - l q, 0)), the chain's lenient step at every slot; at
temperature 0 (p then the temperature-1 softmax) when x is the argmax or p(x) >= l max(p).
"""
from __future__ import annotations

from typing import Tuple

import jax
import jax.numpy as jnp
from jax import lax

from specjax.sampling import argmax, categorical


def _normalized(weights: jax.Array, fallback: jax.Array) -> jax.Array:
  """weights [V] / their sum, or `fallback` [V] where they hold no mass."""
  total = jnp.sum(weights)
  return jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), fallback)


def tree_verify(uniforms: jax.Array, correction_keys: jax.Array, tokens: jax.Array,
                parent: jax.Array, depth: jax.Array, valid: jax.Array, draft_probs: jax.Array,
                target_probs: jax.Array, *, iid: bool = False, greedy: bool = False,
                max_depth: int, lenience=1.0, deterministic: bool = False) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """Verifies one row's token tree (module docstring) with caller-supplied randomness.

  Args:
    uniforms: float32 [N], u_j ~ U[0, 1) for node j.
    correction_keys: PRNG keys [D + 1]; key n draws the token after n accepted nodes.
    tokens: int32 [N]; parent int32 [N] (-1: child of the root); depth int32 [N] (1-based);
      valid bool [N] (invalid nodes are never accepted). Nodes in level order.
    draft_probs: float32 [N + 1, V]: q at the root (row 0) and at node j (row j + 1);
      unused when `deterministic`.
    target_probs: float32 [N + 1, V]: the target's standardized p at the same places.
    iid: the children of a node were drawn i.i.d. from its q (else without replacement).
    greedy: temperature 0 (argmax matching; q and the randomness are unused; with lenience
      < 1, target_probs must be the temperature-1 softmax).
    max_depth: static, the tree's depth D.
    lenience: l in (0, 1]; 1 is exact (module docstring).
    deterministic: every child's q is δ at its own token (module docstring).
  Returns:
    (n int32 [] accepted nodes, path int32 [D] node indices of the accepted path (-1 past n),
     next_token int32 []).
  """
  if greedy:
    return greedy_walk(tokens, parent, depth, valid, target_probs, max_depth=max_depth,
                       lenience=lenience)

  def body(j, carry):
    cur, p, q, path, n = carry
    x = tokens[j]
    child = valid[j] & (parent[j] + 1 == cur)
    if deterministic:
      child = child & (p[x] > 0)  # a rejected sibling's token: no mass left
      accept = child & (uniforms[j] * lenience < p[x])
      reject = child & ~accept
      p_next = _normalized(jnp.maximum(p - lenience * jax.nn.one_hot(x, p.shape[0]), 0.0), p)
    else:
      qx, px = q[x], p[x]
      child = child & (qx > 0)
      accept = child & (uniforms[j] * lenience * qx < px)
      reject = child & ~accept
    residual = p_next if deterministic and not greedy else _normalized(
        jnp.maximum(p - lenience * q, 0.0), p)
    if iid or deterministic:
      q_next = q
    else:
      q_next = _normalized(q.at[x].set(0.0), jnp.zeros_like(q))
    p = jnp.where(accept, target_probs[j + 1], jnp.where(reject, residual, p))
    q = jnp.where(accept, draft_probs[j + 1], jnp.where(reject, q_next, q))
    slot = depth[j] - 1
    path = path.at[slot].set(jnp.where(accept, j, path[slot]))
    return (jnp.where(accept, j + 1, cur), p, q, path, jnp.where(accept, depth[j], n))

  start = (jnp.int32(0), target_probs[0], draft_probs[0], jnp.full((max_depth,), -1, jnp.int32),
           jnp.int32(0))
  cur, p, _, path, n = lax.fori_loop(0, tokens.shape[0], body, start)
  path = jnp.where(jnp.arange(max_depth) < n, path, -1)
  return n, path, categorical(correction_keys[n], p)


def greedy_walk(tokens: jax.Array, parent: jax.Array, depth: jax.Array, valid: jax.Array,
                target_probs: jax.Array, *, max_depth: int, lenience=1.0
                ) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """`tree_verify` at temperature 0, with no loop over the nodes (a GPU pays a host round
  trip per iteration of a `while` loop).

  Node j matches when it is valid and its token is the target's argmax at its parent (or,
  with lenience l < 1, p(x) >= l max(p) there: A.5). The walk descends into the FIRST
  matching child of the node it stands on, so node j is on the accepted path when it matches,
  no earlier sibling matches, and its parent is on the path (a child of the root: always).
  Arguments and returns as `tree_verify`'s (tokens, parent, depth, valid [N]; target_probs
  [N + 1, V]; max_depth static).
  """
  size = tokens.shape[0]
  index = jnp.arange(size)
  best = jax.vmap(argmax)(target_probs)  # [N + 1]: the target's argmax at root and nodes
  row = parent + 1  # the target_probs row of each node's parent
  here = target_probs[row, tokens]  # [N]: p(x_j) at x_j's parent
  lenient = (lenience < 1) & (here >= lenience * jnp.max(target_probs, axis=-1)[row])
  match = valid & ((tokens == best[row]) | lenient)
  earlier = (parent[:, None] == parent[None, :]) & (index[None, :] < index[:, None])  # [j, k]
  first = match & ~jnp.any(earlier & match[None, :], axis=1)
  on = first & (parent < 0)
  for _ in range(max_depth - 1):  # depth d + 1's path node hangs under depth d's
    on = on | (first & (parent >= 0) & on[jnp.maximum(parent, 0)])
  n = jnp.max(jnp.where(on, depth, 0)).astype(jnp.int32)
  at = on[None, :] & (depth[None, :] == jnp.arange(1, max_depth + 1)[:, None])  # [D, N]
  path = jnp.max(jnp.where(at, index[None, :], -1), axis=1).astype(jnp.int32)
  cur = jnp.where(n > 0, path[jnp.maximum(n - 1, 0)] + 1, 0)
  return n, path, best[cur]


def path_tokens(tokens: jax.Array, path: jax.Array, n: jax.Array, next_token: jax.Array
                ) -> jax.Array:
  """The emitted tokens of one row: the accepted path's then the next token, 0-padded.

  tokens int32 [N]; path int32 [D]; n int32 [] -> int32 [D + 1].
  """
  along = jnp.concatenate([tokens[jnp.maximum(path, 0)], jnp.zeros((1,), jnp.int32)])
  slots = jnp.arange(path.shape[0] + 1)
  return jnp.where(slots < n, along, jnp.where(slots == n, next_token, 0)).astype(jnp.int32)
