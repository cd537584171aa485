"""The streaming decode's round at batch B, beside its parts: is it the loop or the arithmetic?

    python -m experiments.bench.stream_round [--slots 8] [--inputs 64] [--gammas 1 2]
        [--new_tokens 128] [--repeats 5] [--weights_dtype bfloat16] [--output_dir DIR]

What it runs, its columns and settings: docs/experiments.md, section "bench.stream_round".
"""
from __future__ import annotations

import functools
import statistics
from typing import Dict, List, Optional, Sequence

import jax
import numpy as np

from experiments.common.checks import check_counts
from experiments.common.cli import parse_cli
from experiments.common.decoding import Decoders, decode_config
from experiments.common.inputs import load_examples
from experiments.common.output import Output, markdown_table
from experiments.common.timed import decode_loop, ms_per_call, propose_loop, verify_loop
from specjax.checks import check_int
from specjax.command import run_cli
from specjax.decode.stream import Streaming
from specjax.draft import ModelDrafter

PROMPT_LEN = 48


def measure(pair, *, slots: int, inputs: int, gammas: Sequence[int], new_tokens: int,
            repeats: int) -> List[Dict]:
  """One row per γ (see the module docstring); all runs of the pair interleaved."""
  ex = load_examples(pair, inputs, PROMPT_LEN)
  keys = jax.random.split(jax.random.PRNGKey(0), inputs)
  cache_len = PROMPT_LEN + new_tokens + max(gammas) + 1
  config = decode_config(0.0, cache_len)
  short = max(new_tokens // 8, 1)
  streaming = Streaming(slots)
  target, tparams = pair.target, pair.target_params

  d = Decoders(pair, new_tokens, config, keys)
  runs = {}
  for budget in (new_tokens, short):
    same = dict(max_new_tokens=budget, slots=streaming)
    runs[f"ar@{budget}"] = (functools.partial(d.autoregressive(), ex.inputs, **same), 1)
    for gamma in gammas:  # max_gamma = γ: (γ+1)-token calls
      runs[f"{gamma}@{budget}"] = (functools.partial(d.model_chain(gamma), ex.inputs, **same), 1)
  prompts = np.asarray(ex.inputs)[:slots]
  runs["t1"] = decode_loop(target, tparams, slots, cache_len, 1)
  for gamma in gammas:
    runs[f"t{gamma + 1}"] = decode_loop(target, tparams, slots, cache_len, gamma + 1)
    runs[f"propose{gamma}"] = propose_loop(ModelDrafter(pair.draft, gamma),
                                                  pair.draft_params, prompts, cache_len, gamma)
    runs[f"verify{gamma}"] = verify_loop(config, slots, gamma, target.vocab_size)
  ms, t = ms_per_call(runs, repeats)
  rounds = {name: int(out.rounds) for name, out in t.outputs.items() if "@" in name}

  def slope(name):
    return ((ms[f"{name}@{new_tokens}"] - ms[f"{name}@{short}"])
            / max(rounds[f"{name}@{new_tokens}"] - rounds[f"{name}@{short}"], 1))

  ar_step, t1 = slope("ar"), ms["t1"]
  weights = sum(x.size for x in jax.tree_util.tree_leaves(tparams))
  rows = []
  for gamma in gammas:
    round_ms = slope(gamma)
    tk, propose, verify = ms[f"t{gamma + 1}"], ms[f"propose{gamma}"], ms[f"verify{gamma}"]
    parts = tk + propose + verify
    tokens = inputs * new_tokens / slots / rounds[f"{gamma}@{new_tokens}"]  # per row and round
    r = tk / t1
    extra_gflops = 2 * weights * slots * gamma / max(tk - t1, 1e-9) / 1e6
    rows.append({
        "B": slots, "γ": gamma, "AR step ms": ar_step, "t_1 ms": t1, "t_γ+1 ms": tk,
        "proposal ms": propose, "verification ms": verify, "round ms": round_ms,
        "parts ms": parts, "gap %": 100 * (round_ms - parts) / round_ms,
        "r": r, "c": propose / (gamma * t1), "tokens / round": tokens,
        "measured speedup": tokens * ar_step / round_ms,
        "speedup at parts": tokens * ar_step / parts,
        "free-draft bound": tokens / r,
        "extra tokens GFLOP/s": extra_gflops})
  return rows


FLAGS = {"--slots": dict(type=int, default=8), "--inputs": dict(type=int, default=64),
         "--gammas": dict(type=int, nargs="+", default=[1, 2]),
         "--new_tokens": dict(type=int, default=128), "--repeats": dict(type=int, default=5)}


def main(argv: Optional[Sequence[str]] = None) -> None:
  cli = parse_cli(argv, __doc__, "stream_round", default_pairs=("lm",), flags=FLAGS)
  args = cli.args
  check_counts(gammas=args.gammas, slots=args.slots, inputs=args.inputs,
                      repeats=args.repeats)
  check_int("new_tokens (the slope's short run is new_tokens // 8)", args.new_tokens,
                   low=8)
  pair = cli.pairs[0]
  rows = measure(pair, slots=args.slots, inputs=args.inputs, gammas=args.gammas,
                 new_tokens=args.new_tokens, repeats=args.repeats)
  text = (f"{pair.label}; {args.inputs} inputs through {args.slots} slots, greedy, "
          f"{args.new_tokens} tokens each (EOS ignored); medians of {args.repeats}, "
          "interleaved.\n\n" + markdown_table(rows) + "\n")
  print(text)
  out = Output(cli.output_dir, "stream_round")
  out.markdown(text)
  print(f"wrote {out.written[0]}")
  print("median measured speedup:",
        f"{statistics.median(row['measured speedup'] for row in rows):.3f}")


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
