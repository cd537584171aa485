"""What Gemma 3's 262,144-token vocabulary costs a verification step, on this machine.

  python -m experiments.bench.gemma_vocab            # γ = 4, batch 1, 5 timed calls each

Times, per verification step (γ + 1 target positions): the whole (γ + 1)-token call of
Gemma 3 270M (random weights, float32), its tied output projection alone ([γ + 1, 640] times
the [262144, 640] embedding), and the fused exact verifier (`FusedVerifier`, its XLA form on a
CPU) over the step's probabilities at V = 262,144 and at V = 8,192 for scale. Median
milliseconds of interleaved calls, compile excluded. docs/gemma.md quotes the result.
"""
from __future__ import annotations

import argparse
import os
from typing import Dict

import jax
import jax.numpy as jnp

from specjax import timing
from specjax.models import GEMMA_SIZES, GemmaModel
from specjax.models.layers import project
from specjax.verify import FusedVerifier


def device_note() -> str:
  """Which device the timings are from."""
  dev = jax.devices()[0]
  return f"device: {dev.platform} ({dev.device_kind}), {os.cpu_count()} CPU cores visible"


def verifier_step(batch: int, gamma: int, vocab: int):
  """A jitted batch of fused verification steps over random p and q [B, γ(+1), V], and its
  zero-argument call (drafts drawn from q, so the accept counts are realistic)."""
  k = jax.random.split(jax.random.PRNGKey(0), 5)
  target = 3.0 * jax.random.normal(k[0], (batch, gamma + 1, vocab), jnp.float32)
  draft = target[:, :gamma] + 1.5 * jax.random.normal(k[1], (batch, gamma, vocab))
  tokens = jax.random.categorical(k[2], draft).astype(jnp.int32)
  uniforms = jax.random.uniform(k[3], (batch, gamma))
  keys = jax.random.split(k[4], (batch, gamma + 1))
  p, q = jax.nn.softmax(target, -1), jax.nn.softmax(draft, -1)
  verifier = FusedVerifier()
  step = jax.jit(jax.vmap(lambda u, c, x, q, p: verifier(u, c, x, q, p, num_guesses=gamma)))
  return lambda: step(uniforms, keys, tokens, q, p)


def measure(gamma: int, batch: int, passes: int) -> Dict[str, float]:
  """{name: median ms} of the step's parts (module docstring)."""
  model = GemmaModel(GEMMA_SIZES["gemma3_270m"])
  params = jax.block_until_ready(model.init(0))
  k = gamma + 1
  cache = model.init_cache(batch, 64)
  tokens = jnp.ones((batch, k), jnp.int32)
  positions = jnp.full((batch,), 32, jnp.int32)
  call = jax.jit(lambda p, c: model.decode(p, c, tokens, positions)[0])
  table = params["embedder"]["input_embedding"]
  features = jnp.ones((batch, k, table.shape[1]), jnp.float32)
  head = jax.jit(lambda t, y: project(y, t, transposed=True))
  fns = {"gemma3_270m call": lambda: call(params, cache),
         "output projection": lambda: head(table, features)}
  for vocab in (262_144, 8_192):
    fns[f"fused verifier V={vocab}"] = verifier_step(batch, gamma, vocab)
  times = timing.interleaved(fns, passes)  # one untimed warm-up call each (the compile)
  return {name: 1e3 * times.median(name) for name in fns}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--gamma", type=int, default=4)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--passes", type=int, default=5)
  args = parser.parse_args(argv)
  print(device_note())
  for name, ms in measure(args.gamma, args.batch, args.passes).items():
    print(f"{name:32s} {ms:9.2f} ms")


if __name__ == "__main__":
  main()
