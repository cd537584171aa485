"""Where a speculative round's time goes, and how close it is to its cost floor.

    python -m experiments.profile_round [--cache_lens 256 512] [--gammas 2 4 6]
        [--batches 1 8] [--new_tokens 128] [--repeats 5] [--weights_dtype bfloat16]

Bundled LM pair (`specjax.app.bundled`), greedy, prompts from the bundled evaluation
split. For every cache length L and batch B it builds, each inside its own
jitted `fori_loop` so that per-call dispatch is not counted (results are folded
into the loop carry so XLA cannot drop them): the target's 1-token call and the
draft's 1-token call, and per γ the target's (γ+1)-token call, one drafter
proposal of γ guesses and one verification step; plus whole autoregressive and
speculative generations. All of one (L, B) are compiled first and then timed in
turn, `repeats` times (medians), so a busy spell of a shared machine hits them
alike.

Rounds and steps are slopes: (a generation of `new_tokens` − one of half as many) / the
rounds (tokens) between them, so the per-call fixed part (prefill, the drafter's start,
dispatch, the NaN check's host sync, the result's copy) is printed apart ("call fixed ms")
and not spread over the rounds; "call / rounds ms" is the old whole-call measure.

Printed per (L, B): the autoregressive step beside its floor, the target's weight
bytes (as run: float32, or bfloat16 with --weights_dtype) over the memory
bandwidth measured here (a large jitted in-place pass: bytes read + written per second),
and beside its read floor (the same bytes over the read bandwidth of a jitted sum).
Printed per (L, B, γ): the parts, the measured round (the slope above), the
unaccounted share (what the loop adds around the parts), the in-loop
r = (γ+1)-token call / 1-token call and c = draft step / target step, and the
theory's speedup E[tokens] / (γ·c + r), E[tokens] = (1 - α^(γ+1)) / (1 - α)
with the α the run measured, beside the measured AR / speculative time.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import decode_loop as common_decode_loop
from experiments.common import examples, load_pair, markdown_table, with_weights
from specjax.analysis import expected_tokens
from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.draft import ModelDrafter
from specjax.params import WEIGHTS_DTYPES
from specjax.verify import verify_batch
from specjax.sampling import Sampling

PROMPT_LEN = 16
Run = Tuple[Callable[[], Any], int]  # (a compiled zero-argument call, model calls it makes)


def memcpy_gbps(megabytes: int = 256, repeats: int = 5) -> float:
  """Measured bandwidth in GB/s: bytes read + written per second by a jitted pass over
  a large float32 array, updated in place (donated), so no fresh pages are faulted in."""
  step = jax.jit(lambda a: a + 1.0, donate_argnums=0)
  x = jax.block_until_ready(step(jnp.zeros((megabytes * 2**20 // 4,), jnp.float32)))
  nbytes, times = x.nbytes, []
  for _ in range(repeats):
    start = time.perf_counter()
    x = jax.block_until_ready(step(x))
    times.append(time.perf_counter() - start)
  return 2 * nbytes / statistics.median(times) / 1e9


def read_gbps(megabytes: int = 256, repeats: int = 5) -> float:
  """Measured read bandwidth in GB/s: bytes per second of a jitted sum over a large float32
  array (what a weight-bound step does with its weights: read them once, write little)."""
  total = jax.jit(jnp.sum)
  x = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
  jax.block_until_ready(total(x))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(total(x))
    times.append(time.perf_counter() - start)
  return x.nbytes / statistics.median(times) / 1e9


def _compiled(fn: Callable, *args) -> Callable[[], Any]:
  jax.block_until_ready(fn(*args))  # compile
  return lambda: jax.block_until_ready(fn(*args))


def decode_loop(model, params, batch: int, cache_len: int, k: int, n: int = 40) -> Run:
  """n k-token decode calls of `model` at `batch` rows, in a jitted loop."""
  return common_decode_loop(model, params, batch, cache_len, k, calls=n), n


def propose_loop(drafter: ModelDrafter, params, prompts: np.ndarray, cache_len: int,
                 gamma: int, n: int = 30) -> Run:
  """n drafter proposals of `gamma` guesses per row (catch-up window included), jitted."""
  batch = prompts.shape[0]
  seq = np.zeros((batch, cache_len), np.int32)
  seq[:, :prompts.shape[1]] = prompts
  length = jnp.full((batch,), prompts.shape[1], jnp.int32)
  gammas = jnp.full((batch,), gamma, jnp.int32)

  @jax.jit
  def loop(params, seq, length):
    state = drafter.init(params, jnp.asarray(prompts), seq, length, cache_len)
    keys = jax.random.split(jax.random.PRNGKey(0), batch)

    def body(i, carry):
      state, acc = carry
      proposal, state = drafter.propose(params, state, seq, length + i, gammas, keys,
                                       Sampling(temperature=0.0))
      state = drafter.update(state, jnp.full((batch,), 2, jnp.int32), gammas)
      return state, acc + proposal.probs[:, 0, 0].sum() + proposal.tokens[:, 0].sum()
    return jax.lax.fori_loop(0, n, body, (state, 0.0))[1]
  return _compiled(loop, params, seq, length), n


def verify_loop(config: DecodeConfig, batch: int, gamma: int, vocab: int, n: int = 50) -> Run:
  """n verification steps (Algorithm 1 on γ+1 target and γ draft distributions per row)."""
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(batch, gamma + 1, vocab)).astype(np.float32))
  q = jax.nn.softmax(jnp.asarray(rng.normal(size=(batch, gamma, vocab)).astype(np.float32)), -1)
  guesses = jnp.zeros((batch, gamma), jnp.int32)
  keys = jax.random.split(jax.random.PRNGKey(0), batch)

  @jax.jit
  def loop(logits, q):
    def body(i, acc):
      n_acc, _, overlap = verify_batch(config.sampling, config.verifier, config.lenience, keys,
                                       jnp.full((batch,), 10 + i, jnp.int32), guesses, q,
                                       logits + acc, jnp.full((batch,), gamma, jnp.int32))
      return acc + 1e-6 * n_acc.sum().astype(jnp.float32) + overlap[0, 0]
    return jax.lax.fori_loop(0, n, body, 0.0)
  return _compiled(loop, logits, q), n


def interleaved_ms(runs: Dict[str, Run], repeats: int) -> Dict[str, float]:
  """Median ms per call of each (compiled) run, timed in turn `repeats` times."""
  times: Dict[str, list] = {name: [] for name in runs}
  for _ in range(repeats):
    for name, (fn, calls) in runs.items():
      start = time.perf_counter()
      fn()
      times[name].append(1e3 * (time.perf_counter() - start) / calls)
  return {name: statistics.median(t) for name, t in times.items()}


def main(argv: Optional[Sequence[str]] = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--cache_lens", type=int, nargs="+", default=[256, 512])
  parser.add_argument("--gammas", type=int, nargs="+", default=[2, 4, 6])
  parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
  parser.add_argument("--new_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--weights_dtype", choices=sorted(WEIGHTS_DTYPES), default="float32",
                      help="run the target's dense kernels and embedding in this dtype "
                      "(cast once)")
  parser.add_argument("--draft_weights_dtype", choices=sorted(WEIGHTS_DTYPES),
                      default="float32", help="the same for the draft model")
  args = parser.parse_args(argv)
  for length in args.cache_lens:
    if length < PROMPT_LEN + args.new_tokens + max(args.gammas) + 1:
      raise ValueError(f"cache length {length} cannot hold a {PROMPT_LEN}-token prompt, "
                       f"{args.new_tokens} new tokens and γ = {max(args.gammas)} (+1)")
  pair = with_weights(load_pair("lm"), args.weights_dtype, args.draft_weights_dtype)
  target, tparams, draft, dparams = pair.target, pair.target_params, pair.draft, pair.draft_params
  prompts_all = examples(pair, max(args.batches), max_input_len=PROMPT_LEN).inputs
  lengths_all = np.maximum((prompts_all != 0).sum(1), 1)

  gbps, read = memcpy_gbps(), read_gbps()
  weight_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(tparams))
  floor_ms = 1e3 * weight_bytes / (gbps * 1e9)
  read_floor_ms = 1e3 * weight_bytes / (read * 1e9)
  print(f"{pair.label}; greedy, {args.new_tokens} new tokens per row; target weights "
        f"{weight_bytes / 1e6:.1f} MB, measured copy bandwidth (bytes read + written) "
        f"{gbps:.1f} GB/s -> floor {floor_ms:.3f} ms per target step; measured read bandwidth "
        f"{read:.1f} GB/s -> read floor {read_floor_ms:.3f} ms. Times are medians of "
        f"{args.repeats}, the runs of one (L, B) interleaved (on a shared machine compare "
        "repeated runs, not one table).")
  step_rows, round_rows = [], []
  for cache_len in args.cache_lens:
    config = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=-1, cache_len=cache_len)
    for batch in args.batches:
      prompts, plen = prompts_all[:batch], lengths_all[:batch]
      key = jax.random.PRNGKey(0)
      half = args.new_tokens // 2
      ar = lambda budget: _compiled(lambda: autoregressive_decode(
          target, tparams, prompts, max_new_tokens=budget, rng=key, config=config,
          prompt_lengths=plen).tokens)
      # Whole calls (1 "call" each): the budget is data, so both budgets share one compile.
      runs = {"t1": decode_loop(target, tparams, batch, cache_len, 1),
              "d1": decode_loop(draft, dparams, batch, cache_len, 1),
              "ar": (ar(args.new_tokens), 1), "ar_half": (ar(half), 1)}
      stats = {}
      for gamma in args.gammas:
        drafter = ModelDrafter(draft, gamma)  # max_gamma sizes the target call: γ + 1 tokens
        spec = lambda budget, d=drafter, g=gamma: speculative_decode(
            target, tparams, d, dparams, prompts, max_new_tokens=budget, gamma=g,
            rng=key, config=config, prompt_lengths=plen)
        full, short = spec(args.new_tokens), spec(half)
        rounds = lambda result: int(np.asarray(result.target_calls).max())  # loop iterations
        stats[gamma] = rounds(full), rounds(short), float(np.asarray(full.alpha).mean())
        runs[f"tk{gamma}"] = decode_loop(target, tparams, batch, cache_len, gamma + 1)
        runs[f"prop{gamma}"] = propose_loop(drafter, dparams, prompts, cache_len, gamma)
        runs[f"ver{gamma}"] = verify_loop(config, batch, gamma, target.vocab_size)
        runs[f"spec{gamma}"] = (_compiled(lambda s=spec: s(args.new_tokens).tokens), 1)
        runs[f"spechalf{gamma}"] = (_compiled(lambda s=spec: s(half).tokens), 1)
      ms = interleaved_ms(runs, args.repeats)
      t1, d1, c = ms["t1"], ms["d1"], ms["d1"] / ms["t1"]
      # Per step / round: the slope between the two budgets, so the per-call fixed part
      # (prefill, drafter start, dispatch, the NaN check's sync, the result's copy) is
      # reported apart instead of being spread over the rounds.
      ar_step = (ms["ar"] - ms["ar_half"]) / (args.new_tokens - half)
      ar_fixed = ms["ar"] - args.new_tokens * ar_step
      step_rows.append({"L": cache_len, "B": batch, "target 1-token call ms": t1,
                        "draft 1-token call ms": d1, "AR step ms": ar_step,
                        "AR call fixed ms": ar_fixed,
                        "AR call / tokens ms": ms["ar"] / args.new_tokens,
                        "floor ms": floor_ms, "AR step / floor": ar_step / floor_ms,
                        "read floor ms": read_floor_ms,
                        "AR step / read floor": ar_step / read_floor_ms})
      for gamma in args.gammas:
        rounds, rounds_half, alpha = stats[gamma]
        tk, prop, ver = (ms[f"{p}{gamma}"] for p in ("tk", "prop", "ver"))
        round_ms = (ms[f"spec{gamma}"] - ms[f"spechalf{gamma}"]) / max(rounds - rounds_half, 1)
        r, expect = tk / t1, float(expected_tokens(alpha, gamma))  # Eq. 1
        round_rows.append({
            "L": cache_len, "B": batch, "γ": gamma, "rounds": rounds,
            "target γ+1 call ms": tk, "draft proposal ms": prop, "verification ms": ver,
            "round ms": round_ms, "unaccounted %": 100 * (round_ms - tk - prop - ver) / round_ms,
            "call fixed ms": ms[f"spec{gamma}"] - rounds * round_ms,
            "call / rounds ms": ms[f"spec{gamma}"] / rounds,
            "r": r, "c": c, "α": alpha, "E[tokens]": expect,
            "predicted speedup": expect / (gamma * c + r),
            "measured speedup": ms["ar"] / ms[f"spec{gamma}"]})
  print("\nAutoregressive step (slope between two budgets) and its weight-bytes floor\n")
  print(markdown_table(step_rows))
  print("\nSpeculative round: parts, measured, unaccounted; r, c and the theory's speedup\n")
  print(markdown_table(round_rows))


if __name__ == "__main__":
  main()
