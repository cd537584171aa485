"""Acceptance rate and output quality of the sigmoid verifier (NOT exact) vs the exact one, on
laws computed exactly and on table models; on the bundled pairs: bench.verify --pair.

  python -m experiments.bench.sigmoid_quality                  # all three parts
  python -m experiments.bench.sigmoid_quality --samples 50000  # quicker

What it runs, its columns and settings: docs/experiments.md, section "bench.sigmoid_quality".
"""
from __future__ import annotations

import functools
from typing import Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.checks import check_counts
from experiments.common.cli import parse_cli
from experiments.common.decoding import verifier_label
from experiments.common.output import header, markdown_table, write
from specjax.command import run_cli
from specjax.sampling import Sampling
from specjax.testing import exact_joint, random_table
from specjax.verify import SigmoidApproxVerifierNotExact, Verifier, get_verifier

SCALES = (1e4, 1e3, 10.0, 1.0)  # β = −α: the paper's 10⁴, ASR's 10³, and two small ones


def analytic(beta: float, logit_range: float = 50.0) -> Dict[str, float]:
  """Range of σ((z + β)/(2β)) for |z| ≤ logit_range, and the worst accept probability."""
  sig = lambda z: 1 / (1 + np.exp(-(z + beta) / (2 * beta)))
  lo, hi = sig(-logit_range), sig(logit_range)
  return dict(beta=beta, sigma_mid=sig(0.0), sigma_lo=lo, sigma_hi=hi, worst_accept=lo / hi)


def first_token_law(p_logits: np.ndarray, q_logits: np.ndarray, verifier: Verifier,
                    lenience: float = 1.0) -> Dict[str, float]:
  """The exact law of the first emitted token of one step (float64 math).

  Args:
    p_logits, q_logits: float [V], the target's and draft's logits at the first position.
    verifier: 'sigmoid' (any α, β) or an exact verifier (p̂ = p, q̂ = q).
  Returns:
    acceptance rate of guess 1, TV of the emitted token from p, its mean target NLL,
    and the target's entropy (the exact NLL).
  """
  p = np.exp(p_logits - np.logaddexp.reduce(p_logits))
  q = np.exp(q_logits - np.logaddexp.reduce(q_logits))
  if verifier.exact:
    p_hat, q_hat = p, q
  else:
    scale = verifier.beta - verifier.alpha
    p_hat = 1 / (1 + np.exp(-(p_logits - verifier.alpha) / scale))
    q_hat = 1 / (1 + np.exp(-(q_logits - verifier.alpha) / scale))
  accept = np.minimum(1.0, p_hat / (lenience * np.maximum(q_hat, 1e-300)))
  alpha = float((q * accept).sum())
  resid = np.maximum(p_hat - lenience * q_hat, 0)
  resid = resid / resid.sum() if resid.sum() > 0 else p_hat / p_hat.sum()
  law = q * accept + (1 - alpha) * resid
  nll = -np.log(np.maximum(p, 1e-300))
  return dict(accept=alpha, tv=0.5 * float(np.abs(law - p).sum()), nll=float((law * nll).sum()),
              entropy=float((p * nll).sum()))


@functools.partial(jax.jit, static_argnames=("verifier", "gamma", "steps", "samples"))
def _generate(verifier, log_p, log_q, key, gamma: int, steps: int, samples: int):
  """`samples` rows of a speculative loop over trigram tables (prefix 0, 0).

  Returns (tokens int32 [N, steps], accepted guesses int32 [N], proposed guesses int32 [N]).
  """
  rounds = steps  # every round emits at least one token

  def row(key):
    seq = jnp.zeros(2 + rounds * (gamma + 1), jnp.int32)

    def one_round(carry, r):
      seq, length, accepted = carry
      kd, ku, kc = jax.random.split(jax.random.fold_in(key, r), 3)

      def draft(ctx, kk):
        z = log_q[ctx[0], ctx[1]]
        t = jax.random.categorical(kk, z).astype(jnp.int32)
        return (ctx[1], t), (t, z)

      start = (seq[length - 2], seq[length - 1])
      _, (tokens, z_q) = jax.lax.scan(draft, start, jax.random.split(kd, gamma))
      ctx = jnp.concatenate([jnp.stack(start), tokens])  # [γ + 2]
      z_p = log_p[ctx[:-1], ctx[1:]]  # [γ + 1, V]: the target at every drafted prefix
      n, nxt = verifier(jax.random.uniform(ku, (gamma,)), jax.random.split(kc, gamma + 1),
                        tokens, jax.nn.softmax(z_q, -1), jax.nn.softmax(z_p, -1), z_p, z_q)
      emitted = jnp.where(jnp.arange(gamma + 1) < n, jnp.append(tokens, 0), nxt)
      seq = jax.lax.dynamic_update_slice(seq, emitted, (length,))
      return (seq, length + n + 1, accepted + n), None

    (seq, _, accepted), _ = jax.lax.scan(one_round, (seq, jnp.int32(2), jnp.int32(0)),
                                         jnp.arange(rounds))
    return seq[2:2 + steps], accepted, jnp.int32(rounds * gamma)

  return jax.vmap(row)(jax.random.split(key, samples))


def table_quality(verifier: Verifier, vocab: int = 8, gamma: int = 4, steps: int = 3,
                  samples: int = 200_000, seed: int = 0) -> Dict[str, float]:
  """TV of `steps`-token outputs from the exact joint, acceptance rate, mean target NLL."""
  log_p = np.asarray(random_table(seed, vocab, sharpness=2.0))
  log_q = np.asarray(random_table(seed + 1, vocab, sharpness=2.0))
  log_q = np.asarray(jax.nn.log_softmax(0.5 * log_p + 0.5 * log_q, -1))  # a related draft
  tokens, accepted, proposed = _generate(verifier, jnp.asarray(log_p), jnp.asarray(log_q),
                                         jax.random.PRNGKey(seed + 7), gamma, steps, samples)
  tokens = np.asarray(tokens)
  joint = exact_joint(log_p, Sampling(), [0, 0], steps)
  codes = (tokens * vocab ** np.arange(steps - 1, -1, -1)).sum(1)
  freq = np.bincount(codes, minlength=vocab ** steps) / samples
  exact = np.zeros(vocab ** steps)
  for seq, prob in joint.items():
    exact[int(np.dot(seq, vocab ** np.arange(steps - 1, -1, -1)))] = prob
  ctx = np.concatenate([np.zeros((samples, 2), np.int64), tokens], 1)
  nll = -log_p[ctx[:, :-2], ctx[:, 1:-1], ctx[:, 2:]].mean()
  exact_nll = -(exact * np.log(np.maximum(exact, 1e-300))).sum() / steps
  return dict(tv=0.5 * float(np.abs(freq - exact).sum()),
              accept=float(np.sum(accepted) / np.sum(proposed)), nll=float(nll),
              exact_nll=float(exact_nll))


def _verifiers() -> List[Verifier]:
  return [get_verifier("fused")] + [SigmoidApproxVerifierNotExact(alpha=-b, beta=b)
                                    for b in SCALES]


FLAGS = {"--samples": dict(type=int, default=200_000, help="sequences in part 3"),
         "--vocab": dict(type=int, default=32768, help="vocabulary of part 2"),
         "--steps": dict(type=int, default=3, help="tokens per sequence in part 3")}
FAST = dict(samples=2000, vocab=300)


def main(argv=None) -> Dict[str, list]:
  """The three parts; the bundled pairs: `python -m experiments.bench.verify --pair ...`."""
  cli = parse_cli(argv, __doc__, "sigmoid_quality", flags=FLAGS, fast=FAST, needs_pairs=False,
                  weights_dtype=None)
  args = cli.args
  check_counts(samples=args.samples, vocab=args.vocab, steps=args.steps)
  rng = np.random.default_rng(0)
  z_p = rng.normal(size=args.vocab) * 3
  z_q = z_p + rng.normal(size=args.vocab) * 1.5
  parts = {
      "analytic": [analytic(beta) for beta in SCALES],
      "first_token": [dict(verifier=verifier_label(v), **first_token_law(z_p, z_q, v))
                      for v in _verifiers()],
      "tables": [dict(verifier=verifier_label(v), **table_quality(v, steps=args.steps,
                                                          samples=args.samples))
                 for v in _verifiers()]}
  md = header("Sigmoid verifier (NOT exact): acceptance and quality", [], [
      "the tables' nll beside its exact value (entropy; exact_nll): the NLL of what an exact "
      "verifier emits"])
  md += "\n".join(f"\n## {title}\n\n{markdown_table(parts[name])}" for name, title in (
      ("analytic", "1. Analytic: σ((z − α)/(β − α)) for |z| ≤ 50 with α = −β (worst_accept: "
       "the worst p̂/q̂)"),
      ("first_token", f"2. First token, exact law: synthetic logits, V = {args.vocab} (target "
       "N(0, 3²), draft = target + N(0, 1.5²))"),
      ("tables", f"3. Table models (specjax.testing, V = 8, γ = 4): {args.samples} sequences "
       f"of {args.steps} tokens; the exact row's TV is the sampling-noise floor")))
  write(cli, "sigmoid_quality", [dict(part=name, **row) for name, rows in parts.items()
                            for row in rows], "", md=md, pairs=[])
  return parts


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
