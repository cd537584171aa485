"""Where one speculative round's time goes (bundled LM pair, batch 1, greedy).

    python -m experiments.profile_round [--gamma 4] [--new_tokens 128]

Times, each inside its own jitted `fori_loop` so that per-call dispatch is not
counted (results are folded into the loop carry so XLA cannot drop them):
the target's 1-token and (γ+1)-token decode calls, one drafter proposal of γ
guesses, and one verification step; then the whole speculative decode, per round.
The rest of a round (the unaccounted line) is what the loop adds around those parts.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import bundled
from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.verify import verify_batch
from specjax.draft import ModelDrafter
from specjax.sampling import Sampling

CACHE_LEN = 256
PROMPT = np.arange(2, 18, dtype=np.int32)[None]  # [1, 16]


def _median_s(fn: Callable, *args, repeats: int = 7) -> float:
  jax.block_until_ready(fn(*args))  # compile
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def decode_ms(model, params, k: int, n: int = 50) -> float:
  """ms per k-token decode call of `model` at batch 1, in a loop."""
  cache = model.init_cache(1, CACHE_LEN)

  @jax.jit
  def loop(params, cache):
    def body(i, carry):
      cache, acc = carry
      logits, cache = model.decode(params, cache, jnp.full((1, k), 5, jnp.int32),
                                   jnp.array([20 + i % 8], jnp.int32), None)
      return cache, acc + jnp.argmax(logits[0, -1]).astype(jnp.float32)
    return jax.lax.fori_loop(0, n, body, (cache, 0.0))[1]
  return 1e3 * _median_s(loop, params, cache) / n


def propose_ms(drafter: ModelDrafter, params, gamma: int, n: int = 30) -> float:
  """ms per drafter proposal of `gamma` guesses (its catch-up window included)."""
  seq = np.zeros((1, CACHE_LEN), np.int32)
  seq[0, :PROMPT.shape[1]] = PROMPT[0]
  length = jnp.array([PROMPT.shape[1]], jnp.int32)
  gammas = jnp.full((1,), gamma, jnp.int32)

  @jax.jit
  def loop(params, seq, length):
    state = drafter.init(params, PROMPT, seq, length, CACHE_LEN)
    keys = jax.random.split(jax.random.PRNGKey(0), 1)

    def body(i, carry):
      state, acc = carry
      proposal, state = drafter.propose(params, state, seq, length + i, gammas, keys,
                                       Sampling(temperature=0.0))
      state = drafter.update(state, jnp.full((1,), 2, jnp.int32), gammas)
      return state, acc + proposal.probs[0, 0, 0] + proposal.tokens[0, 0]
    return jax.lax.fori_loop(0, n, body, (state, 0.0))[1]
  return 1e3 * _median_s(loop, params, seq, length) / n


def verify_ms(config: DecodeConfig, gamma: int, vocab: int, n: int = 50) -> float:
  """ms per verification step (Algorithm 1 on γ+1 target and γ draft distributions)."""
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(1, gamma + 1, vocab)).astype(np.float32))
  q = jax.nn.softmax(jnp.asarray(rng.normal(size=(1, gamma, vocab)).astype(np.float32)), -1)
  guesses = jnp.zeros((1, gamma), jnp.int32)
  keys = jax.random.split(jax.random.PRNGKey(0), 1)

  @jax.jit
  def loop(logits, q):
    def body(i, acc):
      n_acc, _, overlap = verify_batch(config.sampling, config.verifier, config.lenience, keys,
                                       jnp.full((1,), 10 + i, jnp.int32), guesses, q,
                                       logits + acc, jnp.full((1,), gamma, jnp.int32))
      return acc + 1e-6 * n_acc[0].astype(jnp.float32) + overlap[0, 0]
    return jax.lax.fori_loop(0, n, body, 0.0)
  return 1e3 * _median_s(loop, logits, q) / n


def main(argv: Optional[Sequence[str]] = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--gamma", type=int, default=4)
  parser.add_argument("--new_tokens", type=int, default=128)
  args = parser.parse_args(argv)
  gamma = args.gamma
  target, tparams = bundled.load("lm", "target")
  draft, dparams = bundled.load("lm", "draft")
  drafter = ModelDrafter(draft, gamma)
  config = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=-1, cache_len=CACHE_LEN)

  t1, tk = decode_ms(target, tparams, 1), decode_ms(target, tparams, gamma + 1)
  d1 = decode_ms(draft, dparams, 1)
  prop, ver = propose_ms(drafter, dparams, gamma), verify_ms(config, gamma,
                                                             target.config.vocab_size)
  key = jax.random.PRNGKey(0)
  ar_s = _median_s(lambda: autoregressive_decode(
      target, tparams, PROMPT, max_new_tokens=args.new_tokens, rng=key, config=config).tokens)
  spec = lambda: speculative_decode(target, tparams, drafter, dparams, PROMPT,
                                    max_new_tokens=args.new_tokens, gamma=gamma, rng=key,
                                    config=config)
  sp_s = _median_s(lambda: spec().tokens)
  rounds = int(np.asarray(spec().target_calls)[0])
  round_ms = 1e3 * sp_s / rounds
  print(f"bundled LM pair, batch 1, greedy, γ = {gamma}, {args.new_tokens} new tokens, "
        f"{rounds} rounds; c = {d1 / t1:.3f}, r = {tk / t1:.2f}")
  print("| part | ms |\n|---|---|")
  print(f"| autoregressive decode, per token | {1e3 * ar_s / args.new_tokens:.3f} |")
  print(f"| target call, 1 token (in a loop) | {t1:.3f} |")
  print(f"| target call, γ+1 = {gamma + 1} tokens | {tk:.3f} |")
  print(f"| drafter proposal of γ guesses | {prop:.3f} |")
  print(f"| verification step | {ver:.3f} |")
  print(f"| speculative round, measured | {round_ms:.3f} |")
  print(f"| unaccounted per round | {round_ms - tk - prop - ver:.3f} |")


if __name__ == "__main__":
  main()
