"""Where a speculative round's time goes, and how close it is to its cost floor.

    python -m experiments.bench.profile_round [--cache_lens 256 512] [--gammas 2 4 6]
        [--batches 1 8] [--new_tokens 128] [--repeats 5] [--weights_dtype bfloat16]

What it runs, its columns and settings: docs/experiments.md, section "bench.profile_round".
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.cli import parse_cli
from experiments.common.decoding import Decoders, decode_config
from experiments.common.inputs import load_examples
from experiments.common.output import markdown_table
from experiments.common.timed import (c_in_round, decode_loop, ms_per_call, paired_loop,
                                      propose_loop, verify_loop)
from specjax import timing
from specjax.analysis import expected_tokens
from specjax.command import run_cli
from specjax.draft import ModelDrafter

PROMPT_LEN = 16


def memcpy_gbps(megabytes: int = 256, repeats: int = 5) -> float:
  """Measured bandwidth in GB/s: bytes read + written per second by a jitted pass over
  a large float32 array, updated in place (donated), so no fresh pages are faulted in."""
  step = jax.jit(lambda a: a + 1.0, donate_argnums=0)
  box = [jnp.zeros((megabytes * 2**20 // 4,), jnp.float32)]

  def run():
    box[0] = step(box[0])
    return box[0]
  seconds = timing.interleaved({"copy": run}, repeats).median("copy")
  return 2 * box[0].nbytes / seconds / 1e9


def read_gbps(megabytes: int = 256, repeats: int = 5) -> float:
  """Measured read bandwidth in GB/s: bytes per second of a jitted sum over a large float32
  array (what a weight-bound step does with its weights: read them once, write little)."""
  total = jax.jit(jnp.sum)
  x = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
  return x.nbytes / timing.interleaved({"sum": lambda: total(x)}, repeats).median("sum") / 1e9


FLAGS = {"--cache_lens": dict(type=int, nargs="+", default=[256, 512]),
         "--gammas": dict(type=int, nargs="+", default=[2, 4, 6]),
         "--batches": dict(type=int, nargs="+", default=[1, 8]),
         "--new_tokens": dict(type=int, default=128), "--repeats": dict(type=int, default=5)}


def main(argv: Optional[Sequence[str]] = None) -> None:
  cli = parse_cli(argv, __doc__, "profile_round", default_pairs=("lm",), flags=FLAGS)
  args = cli.args
  for length in args.cache_lens:
    if length < PROMPT_LEN + args.new_tokens + max(args.gammas) + 1:
      raise ValueError(f"cache length {length} cannot hold a {PROMPT_LEN}-token prompt, "
                       f"{args.new_tokens} new tokens and γ = {max(args.gammas)} (+1)")
  pair = cli.pairs[0]
  target, tparams, draft, dparams = pair.target, pair.target_params, pair.draft, pair.draft_params
  prompts_all = load_examples(pair, max(args.batches), max_input_len=PROMPT_LEN).inputs
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
    config = decode_config(0.0, cache_len)
    for batch in args.batches:
      prompts, plen = prompts_all[:batch], lengths_all[:batch]
      half = args.new_tokens // 2
      d = Decoders(pair, args.new_tokens, config)
      ar = lambda budget: (functools.partial(d.autoregressive(), prompts, max_new_tokens=budget,
                                             prompt_lengths=plen), 1)
      # Whole calls (1 "call" each): the budget is data, so both budgets share one compile.
      # An encoder-decoder's decoder calls read their model's encoder output (once per loop).
      t_enc = target.encode(tparams, jnp.asarray(prompts)) if target.is_encoder_decoder else None
      d_enc = draft.encode(dparams, jnp.asarray(prompts)) if draft.is_encoder_decoder else None
      runs = {"t1": decode_loop(target, tparams, batch, cache_len, 1, encoded=t_enc),
              "d1": decode_loop(draft, dparams, batch, cache_len, 1, encoded=d_enc),
              "ar": ar(args.new_tokens), "ar_half": ar(half)}
      for gamma in args.gammas:
        drafter = ModelDrafter(draft, gamma)  # max_gamma sizes the target call: γ + 1 tokens
        spec = lambda budget, g=gamma: (functools.partial(
            d.model_chain(g), prompts, max_new_tokens=budget, prompt_lengths=plen), 1)
        runs[f"tk{gamma}"] = decode_loop(target, tparams, batch, cache_len, gamma + 1,
                                         encoded=t_enc)
        runs[f"pair{gamma}"] = paired_loop(target, tparams, draft, dparams, batch, cache_len,
                                           gamma + 1, gamma, target_encoded=t_enc,
                                           draft_encoded=d_enc)
        runs[f"prop{gamma}"] = propose_loop(drafter, dparams, prompts, cache_len, gamma)
        runs[f"ver{gamma}"] = verify_loop(config, batch, gamma, target.vocab_size)
        runs[f"spec{gamma}"] = spec(args.new_tokens)
        runs[f"spechalf{gamma}"] = spec(half)
      ms, t = ms_per_call(runs, args.repeats)
      rounds = lambda name: int(np.asarray(t.outputs[name].target_calls).max())  # iterations
      stats = {g: (rounds(f"spec{g}"), rounds(f"spechalf{g}"),
                   float(np.asarray(t.outputs[f"spec{g}"].alpha).mean())) for g in args.gammas}
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
        apart = tk + gamma * ms["d1"]
        round_rows.append({
            "L": cache_len, "B": batch, "γ": gamma, "rounds": rounds,
            "target γ+1 call ms": tk, "draft proposal ms": prop, "verification ms": ver,
            "round ms": round_ms, "unaccounted %": 100 * (round_ms - tk - prop - ver) / round_ms,
            "calls apart ms": apart, "calls together ms": ms[f"pair{gamma}"],
            "together - apart ms": ms[f"pair{gamma}"] - apart,
            "c in a round": c_in_round(ms[f"pair{gamma}"], tk, gamma, t1),
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
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
