"""Where a speculative round's time goes, and how close it is to its cost floor; in one padded
batch, or with `--stream N` for N inputs streamed through the batch's slots.

    python -m experiments.bench.profile_round [--cache_lens 256 512] [--gammas 2 4 6]
        [--batches 1 8] [--new_tokens 128] [--repeats 5] [--weights_dtype bfloat16]
    python -m experiments.bench.profile_round --stream 64 --batches 8 --gammas 1 2

What it runs, its columns and settings: docs/experiments.md, section "bench.profile_round".
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.checks import check_counts
from experiments.common.cli import parse_cli
from experiments.common.decoding import Decoders, decode_config
from experiments.common.inputs import load_examples
from experiments.common.output import header, markdown_table, write
from experiments.common.timed import (c_in_round, decode_loop, ms_per_call, paired_loop,
                                      propose_loop, verify_loop)
from specjax import timing
from specjax.analysis import expected_tokens
from specjax.checks import check_int
from specjax.command import run_cli
from specjax.decode import Streaming
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
         "--new_tokens": dict(type=int, default=128), "--repeats": dict(type=int, default=5),
         "--stream": dict(type=int, default=0, help="N inputs streamed through B slots "
                          "(0: one padded batch of B inputs)")}


def main(argv: Optional[Sequence[str]] = None) -> None:
  cli = parse_cli(argv, __doc__, "profile_round", default_pairs=("lm",), flags=FLAGS)
  args = cli.args
  check_counts(cache_lens=args.cache_lens, gammas=args.gammas, batches=args.batches,
               repeats=args.repeats)
  check_int("new_tokens (the slopes' short run is half of it)", args.new_tokens, low=2)
  check_int("stream", args.stream, low=0)
  for length in args.cache_lens:
    if length < PROMPT_LEN + args.new_tokens + max(args.gammas) + 1:
      raise ValueError(f"cache length {length} cannot hold a {PROMPT_LEN}-token prompt, "
                       f"{args.new_tokens} new tokens and γ = {max(args.gammas)} (+1)")
  pair = cli.pairs[0]
  target, tparams, draft, dparams = pair.target, pair.target_params, pair.draft, pair.draft_params
  count = max(args.stream, *args.batches)
  prompts_all = load_examples(pair, count, max_input_len=PROMPT_LEN).inputs
  lengths_all = np.maximum((prompts_all != 0).sum(1), 1)
  keys = jax.random.split(jax.random.PRNGKey(0), count)

  gbps, read = memcpy_gbps(), read_gbps()
  weight_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(tparams))
  weights = sum(x.size for x in jax.tree_util.tree_leaves(tparams))
  floor_ms = 1e3 * weight_bytes / (gbps * 1e9)
  read_floor_ms = 1e3 * weight_bytes / (read * 1e9)
  notes = [f"greedy, {args.new_tokens} new tokens per row (EOS ignored); " + (
      f"{args.stream} inputs streamed through B slots" if args.stream else "one batch of B"),
      f"target weights {weight_bytes / 1e6:.1f} MB; measured copy bandwidth (bytes read + "
      f"written) {gbps:.1f} GB/s -> floor {floor_ms:.3f} ms per target step; measured read "
      f"bandwidth {read:.1f} GB/s -> read floor {read_floor_ms:.3f} ms",
      f"times are medians of {args.repeats}, the runs of one (L, B) interleaved (on a shared "
      "machine compare repeated runs, not one table)"]
  step_rows, round_rows = [], []
  for cache_len in args.cache_lens:
    config = decode_config(0.0, cache_len)
    for batch in args.batches:
      rows = args.stream or batch  # the decoded inputs; the calls apart run B rows
      prompts = prompts_all[:batch]
      half = args.new_tokens // 2
      d = Decoders(pair, args.new_tokens, config, keys[:rows])
      same = (dict(slots=Streaming(batch)) if args.stream
              else dict(prompt_lengths=lengths_all[:rows]))
      whole = lambda decode, budget: (functools.partial(
          decode, prompts_all[:rows], max_new_tokens=budget, **same), 1)
      # Whole calls (1 "call" each): the budget is data, so both budgets share one compile.
      # An encoder-decoder's decoder calls read their model's encoder output (once per loop).
      t_enc = target.encode(tparams, jnp.asarray(prompts)) if target.is_encoder_decoder else None
      d_enc = draft.encode(dparams, jnp.asarray(prompts)) if draft.is_encoder_decoder else None
      runs = {"t1": decode_loop(target, tparams, batch, cache_len, 1, encoded=t_enc),
              "d1": decode_loop(draft, dparams, batch, cache_len, 1, encoded=d_enc),
              "ar": whole(d.autoregressive(), args.new_tokens),
              "ar_half": whole(d.autoregressive(), half)}
      for gamma in args.gammas:
        drafter = ModelDrafter(draft, gamma)  # max_gamma sizes the target call: γ + 1 tokens
        runs[f"tk{gamma}"] = decode_loop(target, tparams, batch, cache_len, gamma + 1,
                                         encoded=t_enc)
        runs[f"pair{gamma}"] = paired_loop(target, tparams, draft, dparams, batch, cache_len,
                                           gamma + 1, gamma, target_encoded=t_enc,
                                           draft_encoded=d_enc)
        runs[f"prop{gamma}"] = propose_loop(drafter, dparams, prompts, cache_len, gamma)
        runs[f"ver{gamma}"] = verify_loop(config, batch, gamma, target.vocab_size)
        runs[f"spec{gamma}"] = whole(d.model_chain(gamma), args.new_tokens)
        runs[f"spechalf{gamma}"] = whole(d.model_chain(gamma), half)
      ms, t = ms_per_call(runs, args.repeats)

      def rounds(name):  # a stream's rounds; a batch's iterations: its slowest row's calls
        out = t.outputs[name]
        return int(out.rounds if out.rounds is not None else np.max(out.target_calls))
      # Per step / round: the slope between the two budgets, so the per-call fixed part
      # (prefill, refills, drafter start, dispatch, the NaN check's sync, the result's copy)
      # is reported apart instead of being spread over the rounds.
      slope = lambda n, h: (ms[n] - ms[h]) / max(rounds(n) - rounds(h), 1)
      t1, d1, c, ar_step = ms["t1"], ms["d1"], ms["d1"] / ms["t1"], slope("ar", "ar_half")
      step_rows.append({"L": cache_len, "B": batch, "target 1-token call ms": t1,
                        "draft 1-token call ms": d1, "AR step ms": ar_step,
                        "AR call fixed ms": ms["ar"] - rounds("ar") * ar_step,
                        "AR call / steps ms": ms["ar"] / rounds("ar"),
                        "floor ms": floor_ms, "AR step / floor": ar_step / floor_ms,
                        "read floor ms": read_floor_ms,
                        "AR step / read floor": ar_step / read_floor_ms})
      for gamma in args.gammas:
        spec, n = t.outputs[f"spec{gamma}"], rounds(f"spec{gamma}")
        alpha = spec.pooled_alpha
        tk, prop, ver = (ms[f"{p}{gamma}"] for p in ("tk", "prop", "ver"))
        round_ms, parts = slope(f"spec{gamma}", f"spechalf{gamma}"), tk + prop + ver
        r, expect = tk / t1, float(expected_tokens(alpha, gamma))  # Eq. 1
        tokens = float(np.sum(spec.lengths)) / batch / n  # per slot and round
        apart = tk + gamma * ms["d1"]
        round_rows.append({
            "L": cache_len, "B": batch, "γ": gamma, "rounds": n,
            "target γ+1 call ms": tk, "draft proposal ms": prop, "verification ms": ver,
            "round ms": round_ms, "unaccounted %": 100 * (round_ms - parts) / round_ms,
            "calls apart ms": apart, "calls together ms": ms[f"pair{gamma}"],
            "together - apart ms": ms[f"pair{gamma}"] - apart,
            "c in a round": c_in_round(ms[f"pair{gamma}"], tk, gamma, t1),
            "call fixed ms": ms[f"spec{gamma}"] - n * round_ms,
            "call / rounds ms": ms[f"spec{gamma}"] / n,
            "r": r, "c": c, "α": alpha, "E[tokens]": expect, "tokens / round": tokens,
            "predicted speedup": expect / (gamma * c + r),
            "measured speedup": ms["ar"] / ms[f"spec{gamma}"],
            "speedup at parts": tokens * ar_step / parts, "free-draft bound": tokens / r,
            # The target's FLOPs for the γ extra tokens per row over the time they add.
            "extra tokens GFLOP/s": 2 * weights * batch * gamma / max(tk - t1, 1e-9) / 1e6})
  md = (header(f"A speculative round's parts: {pair.label}", [pair], notes)
        + "\n## Autoregressive step (slope between two budgets) and its weight-bytes floor\n\n"
        + markdown_table(step_rows) + "\n\n## Speculative round: parts, measured, "
        "unaccounted; r, c and the theory's speedup\n\n" + markdown_table(round_rows))
  write(cli, "profile_round", [dict(table="step", **r) for r in step_rows]
        + [dict(table="round", **r) for r in round_rows], "", md=md, pairs=[pair])


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
