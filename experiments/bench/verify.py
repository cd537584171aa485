"""Time per verification step: reference vs fused vs block (exact) vs sigmoid (NOT exact); with
--pair, each verifier's decodes on the pairs: time, acceptance and output quality.

  python -m experiments.bench.verify                 # V ∈ {8k, 32k, 128k}, γ ∈ {3, 5, 10}, B ∈ {1, 8}
  python -m experiments.bench.verify --vocab 8192 --gamma 5 --batch 8 --output_dir out/bv

What it runs, its columns and settings: docs/experiments.md, section "bench.verify".
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from typing import Any, Callable, Dict, List, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.checks import check_counts
from experiments.common.cli import parse_cli
from experiments.common.compare import batched
from experiments.common.decoding import (Decoders, decode_config, in_batches, join,
                                         verifier_label)
from experiments.common.inputs import bleu, load_examples, output_ids, perplexity
from experiments.common.output import fmt, write
from experiments.common.pairs import Pair
from experiments.common.timed import passes_for
from specjax import timing
from specjax.command import run_cli
from specjax.data import load_vocab
from specjax.verify import FusedVerifier, Verifier, describe, get_verifier


def make_inputs(batch: int, gamma: int, vocab: int, seed: int = 0) -> Dict[str, jax.Array]:
  """Random verification inputs with drafts sampled from q (realistic accept counts).

  Returns a dict of: uniforms f32 [B, γ]; keys uint32 [B, γ+1, 2]; tokens i32 [B, γ];
  target_logits f32 [B, γ+1, V]; draft_logits f32 [B, γ, V]; p f32 [B, γ+1, V]; q f32 [B, γ, V].
  """
  k = jax.random.split(jax.random.PRNGKey(seed), 5)
  target_logits = 3.0 * jax.random.normal(k[0], (batch, gamma + 1, vocab), jnp.float32)
  draft_logits = target_logits[:, :gamma] + 1.5 * jax.random.normal(k[1], (batch, gamma, vocab))
  tokens = jax.random.categorical(k[2], draft_logits).astype(jnp.int32)
  inputs = dict(uniforms=jax.random.uniform(k[3], (batch, gamma)),
                keys=jax.random.split(k[4], (batch, gamma + 1)), tokens=tokens,
                target_logits=target_logits, draft_logits=draft_logits,
                p=jax.nn.softmax(target_logits, -1), q=jax.nn.softmax(draft_logits, -1))
  return jax.block_until_ready(inputs)


def step_fn(verifier: Verifier, from_logits: bool) -> Callable[..., Any]:
  """jit(vmap(one verification step)) over the dict of `make_inputs`."""

  def one(u, keys, x, zp, zq, p, q):
    if from_logits:
      p, q = jax.nn.softmax(zp, -1), jax.nn.softmax(zq, -1)
    return verifier(u, keys, x, q, p, zp, zq, num_guesses=x.shape[0])

  batched = jax.vmap(one)
  return jax.jit(lambda d: batched(d["uniforms"], d["keys"], d["tokens"], d["target_logits"],
                                   d["draft_logits"], d["p"], d["q"]))


def device_note() -> str:
  """Which device the timings are from; says so loudly when no accelerator is present."""
  dev = jax.devices()[0]
  if dev.platform == "cpu":
    return (f"device: CPU ({os.cpu_count()} cores visible). No GPU/TPU is available on this "
            "machine: CPU timings only; the Pallas kernel is not timed here (on CPU it runs "
            "only in interpret mode). GPU/TPU numbers are still to be measured.")
  return f"device: {dev.platform} ({dev.device_kind})"


def candidates() -> Dict[str, Verifier]:
  """Verifiers to time: reference, fused (the backend this device uses), block, sigmoid (NOT
  exact)."""
  out = {"reference": get_verifier("reference")}
  if jax.default_backend() == "cpu":
    out["fused"] = FusedVerifier(backend="xla")
  else:
    out["fused[pallas]"] = FusedVerifier(backend="pallas")
    out["fused[xla]"] = FusedVerifier(backend="xla")
  out["block"] = get_verifier("block")
  out["sigmoid"] = get_verifier("sigmoid")
  return out


MAX_REPEATS = 100
"""The most timed calls of one verification step."""


def bench(vocabs: Sequence[int], gammas: Sequence[int], batches: Sequence[int],
          settings: Sequence[str] = ("verify", "from logits"), min_repeats: int = 5,
          min_total_s: float = 0.5) -> List[Dict[str, Any]]:
  """One row per (setting, V, γ, B) with the median milliseconds per step of each verifier,
  the verifiers interleaved (`specjax.timing`), compile excluded."""
  rows = []
  verifiers = candidates()
  for vocab in vocabs:
    for gamma in gammas:
      for batch in batches:
        inputs = make_inputs(batch, gamma, vocab)
        for setting in settings:
          row: Dict[str, Any] = dict(setting=setting, V=vocab, gamma=gamma, B=batch)
          fns = {name: functools.partial(step_fn(verifier, setting == "from logits"), inputs)
                 for name, verifier in verifiers.items()}
          # A warm-up (compile) and one pass, then enough passes that the fastest verifier's
          # calls hold min_total_s (between min_repeats and MAX_REPEATS).
          probe = timing.interleaved(fns, 1)
          passes = passes_for(min(t[0] for t in probe.samples.values()), min_total_s,
                                     low=min_repeats, high=MAX_REPEATS)
          t = timing.interleaved(fns, passes, warmup=False)
          row.update({f"{name} ms": 1e3 * t.median(name) for name in fns})
          rows.append(row)
          row.update({f"{name} speedup": row["reference ms"] / row[f"{name} ms"]
                      for name in verifiers if name != "reference"})
          print({k: fmt(v) for k, v in row.items()}, flush=True)
        del inputs
  return rows


AR = "target alone (autoregressive)"


def on_pairs(pairs: Sequence[Pair], batches: Sequence[int] = (1, 8), examples: int = 64,
             temperatures: Sequence[float] = (1.0, 0.0), gamma: int = 4,
             max_new_tokens: int = 48, repeats: int = 5,
             verifiers: Sequence[str] = ("reference", "fused", "sigmoid")
             ) -> List[Dict[str, Any]]:
  """Per pair, batch B and temperature: the target alone and speculative decoding with each
  verifier on the same `examples` bundled inputs in batches of B (EOS ignored: every decoder
  makes the same tokens per row), interleaved (`experiments.common.compare.batched`: speedup
  per emitted token over the target alone); beside the time, the share of guesses accepted and
  the outputs' quality up to their first EOS: BLEU against the references (encoder-decoder),
  the target's perplexity of the tokens (decoder-only)."""
  vocab, rows = load_vocab(), []
  for pair in pairs:
    ex = load_examples(pair, examples, 48)
    for batch in batches:
      for temp in temperatures:
        config = decode_config(temp, 48 + max_new_tokens + gamma + 1)
        d = Decoders(pair, max_new_tokens, config)
        decoders, exact = {AR: d.autoregressive()}, {AR: True}
        chain = d.model_chain(gamma)
        for v in map(get_verifier, verifiers):
          name = verifier_label(v)
          exact[name] = v.exact
          decoders[name] = functools.partial(chain, config=dataclasses.replace(config, verifier=v))
        runs = {name: functools.partial(in_batches, lambda x, start, fn=fn: fn(
            x, rng=jax.random.PRNGKey(start)), ex.inputs, batch) for name, fn in decoders.items()}
        table, t = batched(runs, repeats, reference=AR, pair=pair.name, batch=batch,
                           temperature=temp)
        for row in table:
          out = t.outputs[row["decoder"]]
          hist = np.asarray(out.accepted_hist).sum(0)  # rounds that accepted k guesses
          outputs = [output_ids(x, int(n)) for x, n in zip(np.asarray(out.tokens),
                                                           np.asarray(out.lengths))]
          row["exact"] = exact[row["decoder"]]
          row["accept_rate"] = ("" if row["decoder"] == AR
                                else (hist * np.arange(len(hist))).sum() / (gamma * hist.sum()))
          if pair.target.is_encoder_decoder:
            row["bleu"] = bleu(ex.references, [vocab.decode(o) for o in outputs])
          else:
            row["target_ppl"] = perplexity(pair, ex.inputs, outputs)
          print({k: fmt(v) for k, v in row.items()}, flush=True)
        rows += table
  return rows


def compare_block(pairs: Sequence[Pair], batches: Sequence[int] = (1, 8),
                  gammas: Sequence[int] = (2, 4, 6), num_examples: int = 8,
                  max_new_tokens: int = 48, repeats: int = 3,
                  verifiers: Sequence[str] = ("reference", "block")) -> List[Dict[str, Any]]:
  """Block vs reference verification at temperature 1 on the bundled pairs.

  For each (pair, γ, B): the first `num_examples` examples, decoded in batches of B
  (the last batch padded by repeating a row; padded rows are not counted), no EOS, so
  every row makes `max_new_tokens` tokens. Each verifier is compiled once, then every
  repeat r runs all batches with seed r for each verifier in turn (interleaved).

  Returns one dict per (pair, γ, B, verifier): tokens_per_call (pooled over all repeats)
  and its standard error (from the accepted-count histogram), alpha, eq1_tokens_per_call (Eq. 1 at the measured α and γ; token verification's
  theory), decode_s (median over repeats of the summed batch times) with its min and max,
  ms_per_token, and the ratios to the first verifier (tokens per call; walltime speedup).
  """
  from specjax import analysis  # pylint: disable=import-outside-toplevel
  rows = []
  for pair in pairs:
    ex = load_examples(pair, num_examples, 48)
    for gamma in gammas:
      config = decode_config(1.0, 48 + max_new_tokens + gamma + 1)
      chain = Decoders(pair, max_new_tokens, config).model_chain(gamma)
      for batch in batches:
        # Each verifier's r-th timed run decodes with seed r (its warm-up with seed 10 000),
        # so the verifiers of one pass decode alike; every timed run's real rows are kept.
        kept = {n: [] for n in verifiers}

        def seeded(name, seeds, batch=batch):
          seed, cfg = next(seeds), dataclasses.replace(config, verifier=get_verifier(name))
          out = in_batches(lambda rows, start: chain(rows, config=cfg, rng=jax.random.PRNGKey(
              1000 * (10_000 if seed < 0 else seed) + start // batch)), ex.inputs, batch)
          if seed >= 0:
            kept[name].append(out)
          return out

        t = timing.interleaved({n: functools.partial(seeded, n, itertools.count(-1))
                                for n in verifiers}, repeats)
        pooled = {n: join(kept[n]) for n in verifiers}
        tpc = {n: int(np.sum(out.lengths)) / max(int(np.sum(out.target_calls)), 1)
               for n, out in pooled.items()}
        for name, out in pooled.items():
          alpha = out.pooled_alpha
          # Standard error of the mean of n + 1 over rounds (rounds taken as independent).
          counts = np.asarray(out.accepted_hist, np.float64).sum(0)
          made = np.arange(1, len(counts) + 1)
          mean = (counts * made).sum() / counts.sum()
          se = np.sqrt((counts * (made - mean) ** 2).sum() / counts.sum() / counts.sum())
          median = t.median(name)
          rows.append(dict(
              pair=pair.name, gamma=gamma, batch=batch, verifier=describe(get_verifier(name)),
              tokens_per_call=tpc[name], tokens_per_call_se=float(se), alpha=alpha,
              eq1_tokens_per_call=float(analysis.expected_tokens(min(alpha, 1.0), gamma)),
              tokens_per_call_vs_first=tpc[name] / tpc[verifiers[0]],
              decode_s=median, decode_s_min=t.spread(name)[0], decode_s_max=t.spread(name)[1],
              ms_per_token=1e3 * median / (num_examples * max_new_tokens),
              speedup_vs_first=t.median(verifiers[0]) / median,
              compile_s=t.compile_s[name]))
          print({k: fmt(v) for k, v in rows[-1].items()}, flush=True)
  return rows


FLAGS = {"--vocab": dict(type=int, nargs="+", default=[8192, 32768, 131072]),
         "--gamma": dict(type=int, nargs="+", default=None,
                         help="default: 3 5 10 (per step); 2 4 6 (--compare block)"),
         "--batch": dict(type=int, nargs="+", default=[1, 8]),
         "--repeats": dict(type=int, default=None,
                           help="minimum timed calls per cell (default 5; 3 with --compare "
                           "block)"),
         "--compare": dict(choices=("block",), default=None,
                           help="block vs reference verification end to end on the pairs"),
         "--examples": dict(type=int, default=None, help="bundled examples per cell (default "
                            "64 with --pair; 8 with --compare block)"),
         "--max_new_tokens": dict(type=int, default=48,
                                  help="--compare block: tokens generated per row")}
FAST = dict(vocab=[300], gamma=[2], batch=[1], repeats=1, examples=2, max_new_tokens=6)
PAIR_COLUMNS = ["pair", "batch", "temperature", "decoder", "exact", "ms_per_token", "speedup",
                "speedup_range", "compile_s", "tokens_per_call", "accept_rate", "bleu",
                "target_ppl"]


def main(argv=None) -> List[Dict[str, Any]]:
  cli = parse_cli(argv, __doc__, "bench_verify", flags=FLAGS, fast=FAST,
                  needs_pairs=lambda f: bool(f["pair"]) or f["compare"] == "block")
  args = cli.args
  check_counts(vocab=args.vocab, batch=args.batch, examples=args.examples or 1,
               max_new_tokens=args.max_new_tokens, gamma=args.gamma or [1],
               repeats=args.repeats or 1)
  print(device_note())
  if args.compare == "block":
    repeats, gammas = args.repeats or 3, args.gamma or [2, 4, 6]
    examples = args.examples or 8
    rows = compare_block(cli.pairs, batches=args.batch, gammas=gammas, num_examples=examples,
                         max_new_tokens=args.max_new_tokens, repeats=repeats)
    return write(cli, "bench_verify_block", rows,
                 "Block vs reference verification on the bundled pairs", [
        device_note(),
        f"temperature 1, {examples} examples per cell, {args.max_new_tokens} new tokens "
        f"per row (no EOS); γ ∈ {gammas}, batch ∈ {list(args.batch)}; {repeats} repeats, "
        "verifiers interleaved, a new seed per repeat",
        "tokens_per_call pools every repeat (± tokens_per_call_se); eq1_tokens_per_call is "
        "Eq. 1 at the measured α (token verification's theory); decode_s is the median over "
        "repeats (min and max beside it), speedup_vs_first the ratio of medians to the "
        "reference's"])
  if cli.pairs:
    examples, repeats = args.examples or 64, args.repeats or 5
    rows = on_pairs(cli.pairs, batches=args.batch, examples=examples,
                    max_new_tokens=args.max_new_tokens, repeats=repeats)
    return write(cli, "bench_verify_pairs", rows, "Each verifier on the bundled pairs", [
        device_note(), f"{examples} bundled examples in batches of B, γ = 4, "
        f"{args.max_new_tokens} new tokens per row (EOS ignored; quality up to the first EOS), "
        f"median of {repeats} interleaved passes; speedup: per emitted token over the target "
        "alone; accept_rate: guesses accepted / offered; sigmoid α = −β = 10⁴ is NOT exact"],
                 columns=PAIR_COLUMNS)
  rows = bench(args.vocab, args.gamma or [3, 5, 10], args.batch, min_repeats=args.repeats or 5)
  return write(cli, "bench_verify", rows, "Time per verification step", [
      device_note(), "sigmoid = " + describe(get_verifier("sigmoid")),
      "ms: median per step, the verifiers interleaved, compile excluded; speedup: "
      "reference's time over the verifier's"], pairs=[])


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
