"""Benchmark: autoregressive vs speculative decoding walltime on a random-init pair (CPU).

  python -m experiments.bench_decode [--batch 1] [--new 64] [--gamma 4] [--repeats 5]

Prints compile time apart from steady-state time, ms per generated token, α
and the ratio to autoregressive, for
- a draft equal to the target: every guess is accepted, but c = 1;
- a small random draft with tied embeddings: at random init both models mostly
  predict "repeat the last token", so they agree (α ≈ 1) at c ≈ 0.1: the upper
  bound of the speedup for this pair;
- a small random draft with untied logits: α ≈ 0, the lower bound (the pure
  overhead of speculation).
Runs are interleaved and the median of `--repeats` is reported.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.draft import ModelDrafter
from specjax.models.decoder_only import DecoderOnlyConfig, DecoderOnlyModel
from specjax.params import count_params
from specjax.sampling import Sampling


def lm(emb, layers, heads, mlp, vocab, seed, tied=True):
  """A random-init decoder-only LM and its params."""
  model = DecoderOnlyModel(DecoderOnlyConfig(vocab_size=vocab, emb_dim=emb, num_heads=heads,
                                             num_layers=layers, head_dim=64, mlp_dim=mlp,
                                             logits_via_embedding=tied))
  return model, model.init(jax.random.PRNGKey(seed))


def timed(fn):
  """(result, seconds) with the device work finished."""
  start = time.perf_counter()
  out = fn()
  jax.block_until_ready(out.tokens)
  return out, time.perf_counter() - start


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--new", type=int, default=64, help="new tokens per row")
  parser.add_argument("--gamma", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--vocab", type=int, default=8192)
  args = parser.parse_args(argv)

  target, target_params = lm(384, 6, 6, 1024, args.vocab, 0)
  draft, draft_params = lm(128, 2, 2, 256, args.vocab, 1)
  untied, untied_params = lm(128, 2, 2, 256, args.vocab, 2, tied=False)
  prompts = np.random.default_rng(0).integers(2, args.vocab, size=(args.batch, 16)).astype(np.int32)
  config = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=-1,
                        cache_len=16 + args.new + args.gamma + 1)
  key = jax.random.PRNGKey(0)
  runs = {
      "autoregressive": lambda: autoregressive_decode(target, target_params, prompts,
                                                      max_new_tokens=args.new, rng=key,
                                                      config=config),
      "speculative, draft = target (upper bound)": lambda: speculative_decode(
          target, target_params, ModelDrafter(target, args.gamma), target_params, prompts,
          max_new_tokens=args.new, gamma=args.gamma, rng=key, config=config),
      "speculative, small agreeing draft (upper bound)": lambda: speculative_decode(
          target, target_params, ModelDrafter(draft, args.gamma), draft_params, prompts,
          max_new_tokens=args.new, gamma=args.gamma, rng=key, config=config),
      "speculative, small disagreeing draft (lower bound)": lambda: speculative_decode(
          target, target_params, ModelDrafter(untied, args.gamma), untied_params, prompts,
          max_new_tokens=args.new, gamma=args.gamma, rng=key, config=config),
  }
  compile_s, times, outs = {}, {name: [] for name in runs}, {}
  for name, fn in runs.items():
    outs[name], compile_s[name] = timed(fn)  # first call: compile + one run
  for _ in range(args.repeats):  # interleaved
    for name, fn in runs.items():
      times[name].append(timed(fn)[1])

  tokens = args.batch * args.new
  base = statistics.median(times["autoregressive"])
  print(f"target {count_params(target_params) / 1e6:.1f}M params, draft "
        f"{count_params(draft_params) / 1e6:.1f}M, batch {args.batch}, {args.new} new tokens, "
        f"γ={args.gamma}, greedy, median of {args.repeats}, CPU ({jax.devices()[0].platform})\n")
  print("| decoder | compile+first s | steady s | ms/token | α | tokens/target call | vs AR |")
  print("|---|---|---|---|---|---|---|")
  for name in runs:
    steady = statistics.median(times[name])
    per_call = float(np.mean(outs[name].tokens_per_call))
    alpha = (f"{float(np.mean(outs[name].alpha)):.2f}" if name != "autoregressive" else "-")
    print(f"| {name} | {compile_s[name]:.2f} | {steady:.3f} | {1e3 * steady / tokens:.2f} | "
          f"{alpha} | {per_call:.2f} | {base / steady:.2f}x |")


if __name__ == "__main__":
  main()
