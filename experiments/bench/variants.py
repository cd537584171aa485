"""Adaptive γ and hierarchical drafting, measured against fixed-γ two-model speculation.

  python -m experiments.bench.variants [--pair lm --pair translate] [--fast]
      [--gin.bench_variants.run.temperatures=(0.0,)]

What it runs, its columns and settings: docs/experiments.md, section "bench.variants".
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Dict, List, Sequence

import gin
import jax

from experiments.common.checks import check_counts
from experiments.common.cli import Cli, cli_main
from experiments.common.decoding import decode_config, model_drafter
from experiments.common.inputs import Examples, load_examples
from experiments.common.output import fmt, header, markdown_table, write
from experiments.common.pairs import Pair, tiny_model
from experiments.common.compare import compare
from experiments.common.timed import cost_ratios
from specjax.command import run_cli
from specjax.decode import runner
from specjax.decode import autoregressive_decode, speculative_decode
from specjax.draft import ModelDrafter
from specjax.draft import HierarchicalDrafter

FAST = dict(num_examples=1, max_new_tokens=8, gammas=(1, 2), repeats=1, step_repeats=2,
            hier_gamma=2, inner_gamma=1)


def _counting(fn, counts: Dict, name):
  """fn wrapped to add the decode loops' jit-cache growth (`runner.run_loop`) to counts[name]."""
  def wrapped(row):
    before = runner.run_loop._cache_size()  # pylint: disable=protected-access
    out = fn(row)
    counts[name] = counts.get(name, 0) + runner.run_loop._cache_size() - before  # pylint: disable=protected-access
    return out
  return wrapped


def _rows(pair, temp, runs, inputs, repeats, **extra) -> List[Dict]:
  """The standard rows of `runs` (`compare`, 'ar' the reference) with the pair, temperature
  and `extra` (name -> {column: value} per decoder) in front."""
  rows = compare(runs, inputs, repeats, reference="ar").rows()
  if temp != 0:  # sampled: outputs differ from the autoregressive one by design
    rows = [{k: v for k, v in r.items() if k != "greedy"} for r in rows]
  return [{"pair": pair.name, "temperature": temp, **extra.get(r["decoder"], {}), **r,
           "alpha": r["alpha"] if r["decoder"] != "ar" else ""} for r in rows]


def adaptive(pair: Pair, ex: Examples, temp: float, gammas: Sequence[int],
             max_new_tokens: int, repeats: int, c: float) -> List[Dict]:
  """Rows for AR, each constant γ, heuristic and optimal (see the module docstring)."""
  max_gamma = max(gammas)
  width = ex.inputs.shape[1]
  base = decode_config(temp, width + max_new_tokens + max_gamma + 1)
  drafter, dparams = model_drafter(pair, max_gamma)
  key = jax.random.PRNGKey(0)
  counts: Dict = {}

  def spec(config, gamma, count_as):
    return _counting(lambda row: speculative_decode(
        pair.target, pair.target_params, drafter, dparams, row, max_new_tokens=max_new_tokens,
        gamma=gamma, rng=key, config=config), counts, count_as)

  runs = {"ar": lambda row: autoregressive_decode(pair.target, pair.target_params, row,
                                                  max_new_tokens=max_new_tokens, rng=key,
                                                  config=base)}
  for g in gammas:
    runs[f"constant γ={g}"] = spec(base, g, "constant")
  start = min(2, max_gamma)
  runs["heuristic"] = spec(dataclasses.replace(base, gamma_policy="heuristic"), start,
                           "heuristic")
  runs["optimal"] = spec(dataclasses.replace(base, gamma_policy="optimal",
                                                    cost_coefficient=c), start, "optimal")
  rows = _rows(pair, temp, runs, ex.inputs, repeats)
  for r in rows:  # counted while compare ran them
    r["compiles"] = counts.get(r["decoder"].split(" ")[0], "") if r["decoder"] != "ar" else ""
  best = max((r for r in rows if r["decoder"].startswith("constant")), key=lambda r: r["speedup"])
  for r in rows:
    r["vs_best_fixed"] = r["speedup"] / best["speedup"]
  return rows


def hierarchical(pair: Pair, tiny, tiny_params, ex: Examples, temp: float,
                 gamma: int, inner_gamma: int, max_new_tokens: int, repeats: int) -> List[Dict]:
  """Rows for AR, target←draft, target←tiny and target←draft←tiny (one γ)."""
  width = ex.inputs.shape[1]
  config = decode_config(temp, width + max_new_tokens + gamma + 1)
  key = jax.random.PRNGKey(0)
  hier = HierarchicalDrafter(pair.draft, ModelDrafter(tiny, max_gamma=inner_gamma, window=3),
                             max_gamma=gamma, inner_gamma=inner_gamma)
  drafters = {
      "target ← draft": (ModelDrafter(pair.draft, max_gamma=gamma), pair.draft_params),
      "target ← tiny": (ModelDrafter(tiny, max_gamma=gamma), tiny_params),
      "target ← draft ← tiny": (hier, {"medium": pair.draft_params, "inner": tiny_params}),
  }
  runs = {"ar": lambda row: autoregressive_decode(pair.target, pair.target_params, row,
                                                  max_new_tokens=max_new_tokens, rng=key,
                                                  config=config)}
  for name, (d, p) in drafters.items():
    runs[name] = functools.partial(speculative_decode, pair.target, pair.target_params, d, p,
                                   max_new_tokens=max_new_tokens, gamma=gamma, rng=key,
                                   config=config)
  rows = _rows(pair, temp, runs, ex.inputs, repeats,
               **{name: {"gamma": gamma} for name in runs if name != "ar"})
  for row in rows:  # greedy: every example's output the target's (compare's greedy column)
    row["greedy_identical"] = ("" if row["decoder"] == "ar" or temp != 0 else
                               row["greedy"].startswith(f"{len(ex.inputs)} of "))
  return rows


@gin.configurable(module="bench_variants")
def run(cli: Cli, *, num_examples: int = 8, max_new_tokens: int = 64,
        gammas: Sequence[int] = (1, 2, 3, 5, 7), temperatures: Sequence[float] = (0.0, 1.0),
        repeats: int = 3, step_repeats: int = 5, max_input_len: int = 48, hier_gamma: int = 4,
        inner_gamma: int = 2) -> List[Dict]:
  """Writes bench_variants.{md,csv,json}; returns the rows of both parts.

  Args:
    cli: pairs and output folder (`experiments.common.cli.parse_cli`).
    num_examples: bundled examples per pair, each decoded alone (batch 1).
    max_new_tokens: tokens per example (EOS ignored so lengths match).
    gammas: the fixed γ values (their max caps the adaptive policies).
    temperatures: sampling temperatures (0 = argmax).
    repeats: timed runs per example and decoder (median); step_repeats: for c.
    max_input_len: encoder input / prompt width.
    hier_gamma, inner_gamma: γ of the target round and of the draft's inner rounds.
  """
  check_counts(num_examples=num_examples, max_new_tokens=max_new_tokens,
                      gammas=tuple(gammas), repeats=repeats, step_repeats=step_repeats,
                      hier_gamma=hier_gamma, inner_gamma=inner_gamma)
  adaptive_rows, hier_rows, notes = [], [], []
  for pair in cli.pairs:
    ex = load_examples(pair, num_examples, max_input_len)
    cache_len = max_input_len + max_new_tokens + max(gammas) + 1
    c = cost_ratios(pair, ex.inputs[:1], (), cache_len, step_repeats)["c"]
    notes.append(f"{pair.name}: measured c = {c:.3f} (given to the optimal policy)")
    for temp in temperatures:
      rows = adaptive(pair, ex, temp, gammas, max_new_tokens, repeats, c)
      adaptive_rows += rows
      for r in rows:
        print({k: fmt(v) for k, v in r.items()})
    tiny = tiny_model(pair) if pair.name == "lm" else None
    if pair.name == "lm" and tiny is None:
      notes.append("hierarchical: skipped (no specjax/assets/pairs/lm/tiny)")
    if tiny is not None:
      for temp in temperatures:
        rows = hierarchical(pair, *tiny, ex, temp, hier_gamma, inner_gamma, max_new_tokens,
                            repeats)
        hier_rows += rows
        for r in rows:
          print({k: fmt(v) for k, v in r.items()})
  md = header("Adaptive γ and hierarchical drafting (batch 1)", cli.pairs, [
      f"{num_examples} examples × {max_new_tokens} tokens, median of {repeats} interleaved runs, "
      "compile excluded", *notes])
  md += "\n## Adaptive γ\n\n" + markdown_table(adaptive_rows, [
      "pair", "temperature", "decoder", "alpha", "tokens_per_call", "ms_per_token", "speedup",
      "vs_best_fixed", "compiles"])
  if hier_rows:
    md += "\n\n## Hierarchical\n\n" + markdown_table(hier_rows, [
        "pair", "temperature", "decoder", "gamma", "alpha", "tokens_per_call", "ms_per_token",
        "speedup", "greedy_identical"])
  return write(cli, "bench_variants", adaptive_rows + hier_rows, "", md=md)


main = cli_main(run, "bench_variants", __doc__, FAST)


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
