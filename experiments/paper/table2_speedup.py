"""Paper Tables 2 and 4: measured walltime speedup of speculative vs autoregressive decoding.

  python -m experiments.paper.table2_speedup [--pair lm --pair translate] [--fast]
      [--gin_file=experiments/table2_speedup.gin]

What it runs, its columns and settings: docs/experiments.md, section "paper.table2_speedup".
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import gin
import jax

from experiments.common.checks import check_counts
from experiments.common.cli import Cli, cli_main
from experiments.common.decoding import Decoders, decode_config
from experiments.common.inputs import Examples, load_examples
from experiments.common.output import Output, write
from experiments.common.pairs import Pair
from experiments.common.compare import compare
from experiments.common.timed import cost_ratios
from specjax import analysis
from specjax.command import run_cli

FAST = dict(num_examples=1, max_new_tokens=8, gammas=(1, 3), temperatures=(0.0,), repeats=1,
            step_repeats=2)


def time_decoders(pair: Pair, ex: Examples, temperature: float,
                  gammas: Sequence[int], max_new_tokens: int, repeats: int, seed: int = 0):
  """Per-example batch-1 timings (`compare`, autoregressive the reference) -> the standard
  rows by decoder name ('ar', 'γ=G')."""
  width = ex.inputs.shape[1]
  d = Decoders(pair, max_new_tokens,
               decode_config(temperature, width + max_new_tokens + max(gammas) + 1),
               jax.random.PRNGKey(seed))
  runs = {"ar": d.autoregressive()}
  for g in gammas:
    # Each γ with its own drafter of max_gamma = γ: the loop's target call is max_gamma + 1
    # wide whatever the round's γ (γ is data), so one drafter of max_gamma = max(gammas)
    # made every γ pay the widest call (γ = 1 rounds: 2.76 vs 2.36 ms on the bundled LM).
    runs[f"γ={g}"] = d.model_chain(g)
  result = compare(runs, ex.inputs, repeats, reference="ar")
  return {row["decoder"]: row for row in result.rows()}


@gin.configurable(module="table2_speedup")
def run(cli: Cli, *, num_examples: int = 16, max_new_tokens: int = 48,
        gammas: Sequence[int] = (1, 2, 3, 5, 7), temperatures: Sequence[float] = (0.0, 1.0),
        repeats: int = 5, step_repeats: int = 7, max_input_len: int = 48) -> List[Dict]:
  """Writes table2_speedup.{md,csv,json,png}; returns the rows.

  Args:
    cli: pairs and output folder (`experiments.common.cli.parse_cli`).
    num_examples: bundled examples per pair, each decoded alone (batch 1).
    max_new_tokens: tokens generated per example (EOS ignored so lengths match).
    gammas: the γ values; temperatures: sampling temperatures (0 = argmax).
    repeats: timed runs per example and decoder (median); step_repeats: for c and r(γ).
    max_input_len: encoder input / prompt width.
  """
  check_counts(gammas=tuple(gammas), num_examples=num_examples,
                      max_new_tokens=max_new_tokens, repeats=repeats, step_repeats=step_repeats)
  rows = []
  for pair in cli.pairs:
    ex = load_examples(pair, num_examples, max_input_len)
    cache_len = max_input_len + max_new_tokens + max(gammas) + 1
    costs = cost_ratios(pair, ex.inputs[:1], gammas, cache_len, step_repeats)
    for temp in temperatures:
      timed = time_decoders(pair, ex, temp, gammas, max_new_tokens, repeats)
      ar = timed["ar"]
      for g in gammas:
        spec = timed[f"γ={g}"]
        alpha, per_call, c, r = spec["alpha"], spec["tokens_per_call"], costs["c"], costs["r"][g]
        c_round = costs["c_round"][g]
        rows.append({
            "pair": pair.name, "temperature": temp, "gamma": g, "alpha": alpha,
            "c": c, "r": r, "tokens_per_call": per_call,
            "EXP": float(analysis.walltime_improvement(alpha, g, c)),
            "EXP_CPU": float(analysis.expected_tokens(alpha, g) / (g * c + r)),
            "EXP_CPU_obs": per_call / (g * c + r), "c_round": c_round,
            "EXP_CPU_round": float(analysis.expected_tokens(alpha, g) / (g * c_round + r)),
            "EMP": spec["speedup"], "ar_ms_per_token": ar["ms_per_token"],
            "spec_ms_per_token": spec["ms_per_token"], "compile_ar_s": ar["compile_s"],
            "compile_spec_s": spec["compile_s"]})
        print(f"{pair.name} T={temp} γ={g}: α={alpha:.2f} c={c:.3f} r={r:.2f} "
              f"EXP={rows[-1]['EXP']:.2f} EXP-CPU={rows[-1]['EXP_CPU']:.2f} "
              f"EMP={rows[-1]['EMP']:.2f}")
  return write(cli, "table2_speedup", rows, "Tables 2/4 analog: walltime speedup, batch 1", [
      f"{num_examples} examples × {max_new_tokens} tokens, median of {repeats} interleaved "
      "runs (`specjax.timing`), compile excluded",
      "c = draft step / target step (k=1); r = target step with k=γ+1 / k=1; both in-loop",
      "EXP = Thm 3.8; EXP-CPU = E[tokens]/(γc + r); EXP-CPU-obs = measured tokens per round / "
      "(γc + r); c_round = c with both models in one loop; EXP-CPU-round = "
      "E[tokens]/(γ c_round + r); EMP = measured"],
      ["pair", "temperature", "gamma", "alpha", "c", "r", "tokens_per_call", "EXP", "EXP_CPU",
       "EXP_CPU_obs", "c_round", "EXP_CPU_round", "EMP", "ar_ms_per_token",
       "spec_ms_per_token"], plot=lambda out: _plot(out, rows))


def _plot(out: Output, rows: List[Dict]) -> None:
  with out.figure("table2_speedup.png", (6, 4)) as ax:
    for key in sorted({(r["pair"], r["temperature"]) for r in rows}):
      sel = [r for r in rows if (r["pair"], r["temperature"]) == key]
      g = [r["gamma"] for r in sel]
      line = ax.plot(g, [r["EMP"] for r in sel], "o-", label=f"{key[0]} T={key[1]:g} EMP")[0]
      ax.plot(g, [r["EXP_CPU"] for r in sel], "--", color=line.get_color(), label="EXP-CPU")
      ax.plot(g, [r["EXP"] for r in sel], ":", color=line.get_color(), label="EXP")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set(xlabel="γ", ylabel="speedup vs autoregressive", title="Walltime speedup (batch 1)")
    ax.legend(fontsize=7)


main = cli_main(run, "table2_speedup", __doc__, FAST)


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
