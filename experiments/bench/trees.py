"""Benchmark: chains vs static token trees vs dynamic token trees at equal target-call width.

  python -m experiments.bench.trees [--pair lm] [--batch 1 --batch 8] [--temperature 0
      --temperature 1] [--width 8 --width 16 --width 32] [--trees K] [--auto] [--lookup]
      [--ngram] [--no_timing] [--fast]

What it runs, its columns and settings: docs/experiments.md, section "bench.trees".
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import gin
import jax
import numpy as np

from experiments.common.cli import parse_cli
from experiments.common.decoding import Decoders, decode_config
from experiments.common.inputs import load_examples, ngram_corpus
from experiments.common.output import markdown_table, write
from experiments.common.timed import decode_loop, ms_per_call
from specjax.command import run_cli
from specjax.timing import interleaved
from specjax.draft import (BigramDrafter, DynamicTree, NGramTreeDrafter, PromptLookupDrafter,
                           PromptLookupTreeDrafter, StaticTree, TreeModelDrafter)

FAST = dict(examples=1, new=8, widths=(8,), repeats=1, trees=1)
FULL = dict(examples=8, new=128, widths=(8, 16, 32), repeats=3, trees=None)


ALTERNATIVES = ((1,), (1, 1), (2, 1, 1, 1))
"""Spine lengths under the root's second, third, ... children; the first child's spine
takes the rest of the width. (On the bundled LM pair at 128 new tokens, T = 0, these beat
wider heads (k-ary first levels), longer alternative spines, second-token alternatives and
EAGLE-2-style cut dynamic trees of the same width: docs/trees.md.)"""

MAX_DYNAMIC_DEPTH = 8
"""Deepest dynamic tree tried (its levels are wider than a spine's, and each is one
draft call unrolled in the compiled loop)."""


def static_trees(width: int) -> Dict[str, StaticTree]:
  """Spine trees of width - 1 nodes: a deep top-1 spine plus short alternatives for the
  first token (`StaticTree.from_spines`), by name."""
  out = {}
  for alternatives in ALTERNATIVES:
    main = width - 1 - sum(alternatives)
    if main > alternatives[0]:
      lengths = (main,) + alternatives
      out["spines(" + ",".join(map(str, lengths)) + ")"] = StaticTree.from_spines(lengths)
  return out


def dynamic_trees(width: int, greedy: bool) -> Dict[str, DynamicTree]:
  """A dynamic tree scoring at most width - 1 nodes: at temperature 0 grown with branch 2,
  expand 2 and cut to width - 1 nodes (EAGLE-2's rerank, `keep`); otherwise (no cut is
  exact there) branch 2, expand 1 as deep as the width allows."""
  nodes = width - 1
  if greedy:
    depth = min(MAX_DYNAMIC_DEPTH, 1 + -(-(nodes - 2) // 4))
    tree = DynamicTree(2, 2, depth, keep=min(nodes, 2 + 4 * (depth - 1)))
    return {f"dyn(b2,e2,d{depth},keep{tree.keep})": tree}
  depth = min(MAX_DYNAMIC_DEPTH, nodes // 2)
  return {f"dyn(b2,e1,d{depth})": DynamicTree(2, 1, depth)}


@gin.configurable(module="bench_trees")
def extra_trees(trees: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
  """Trees given in gin by name (gin/experiments/trees.gin), tried beside the built-in ones
  at every width whose call they fit."""
  out = dict(trees or {})
  for name, tree in out.items():
    if not isinstance(tree, (StaticTree, DynamicTree)):
      raise ValueError(f"bench_trees.extra_trees.trees[{name!r}] must be a StaticTree or "
                       f"DynamicTree, got {tree!r}")
  return out


def _setting(pair, batches: List[np.ndarray], width: int, temperature: float, new: int,
             repeats: int, timing: bool, costs: Tuple[Dict[int, float], float],
             trees_per_kind=None, auto: bool = False, lookup: bool = False,
             ngram: Any = None) -> List[dict]:
  """Every decoder of one setting over `batches` (each one call of the decoder)."""
  cache_len = batches[0].shape[1] + new + 2 * width + 1  # a cut dynamic tree grows more
  d = Decoders(pair, new, decode_config(temperature, cache_len))
  gamma = width - 1
  decoders = {"chain": ("chain", d.model_chain(gamma))}
  configured = {name: tree for name, tree in extra_trees().items()
                if tree.nodes < width and (temperature == 0 or not tree.greedy_only)}
  for kind, trees in (("static", static_trees(width)),
                      ("dynamic", dynamic_trees(width, temperature == 0)), ("gin", configured)):
    for name, tree in list(trees.items())[:trees_per_kind]:
      decoders[name] = (kind, d.tree(TreeModelDrafter(pair.draft, tree), pair.draft_params))
  if lookup:  # prompt lookup: one continuation (chain) or several (tree)
    vocab = pair.target.vocab_size
    decoders["lookup chain"] = ("lookup chain",
                                d.chain(PromptLookupDrafter(vocab, gamma), None, gamma))
    for b in (2, 4):
      decoders[f"lookup tree {b}x{gamma // b}"] = (
          "lookup tree", d.tree(PromptLookupTreeDrafter(vocab, b, gamma // b), None))
  if ngram is not None:  # a bigram table: one chain, or the first static tree from it
    table, counts = ngram
    name, tree = next(iter(static_trees(width).items()))
    decoders["bigram chain"] = ("bigram chain", d.chain(
        dataclasses.replace(table, max_gamma=gamma), counts, gamma))
    decoders[f"bigram {name}"] = ("bigram tree", d.tree(NGramTreeDrafter(table, tree), counts))
  if auto:  # the chain and the first static tree under the 'auto' policy
    name, tree = next(iter(static_trees(width).items()))
    decoders["chain auto"] = ("chain auto", d.auto().model_chain(gamma))
    decoders[f"{name} auto"] = ("tree auto", d.auto().tree(TreeModelDrafter(pair.draft, tree),
                                                           pair.draft_params))
  ar = d.autoregressive()
  every = lambda fn: [fn(x) for x in batches]
  runs = {name: (lambda fn=fn: every(fn)) for name, (_, fn) in decoders.items()}
  if timing:  # warm-up (compiles, reported apart), then interleaved passes, AR among them
    runs["AR"] = lambda: every(ar)
    timings = interleaved(runs, repeats)
    results = {name: timings.outputs[name] for name in decoders}
  else:
    results = {name: run() for name, run in runs.items()}
  total = lambda res, field: float(sum(np.asarray(getattr(r, field)).sum() for r in res))
  step, c = costs
  r = step[width] / step[1]
  rows = []
  for name, (kind, _) in decoders.items():
    res = results[name]
    calls = total(res, "target_calls")
    per_call = total(res, "lengths") / calls
    drafts = total(res, "draft_calls") / calls
    hist = sum(np.asarray(r.accepted_hist).sum(0) for r in res)
    row = dict(pair=pair.name, batch=batches[0].shape[0], temperature=temperature, width=width,
               kind=kind, decoder=name, tokens_per_call=per_call, draft_calls_per_round=drafts,
               none_accepted=hist[0] / hist.sum(), all_accepted=hist[-1] / hist.sum(),
               narrow_rounds=0.0, table_ms_per_token="-", r=r, c=c, predicted_speedup=per_call / (r + c * drafts))
    if kind.endswith("auto"):
      row.update(_auto_prediction(res))
    if timing:
      tokens = total(res, "lengths")
      # Per emitted token: the per-pass time ratio scaled by the two decodes' token counts.
      ar_tokens = total(timings.outputs["AR"], "lengths")
      speedup, low, high = (x * tokens / ar_tokens for x in timings.ratio("AR", name))
      row.update(ms_per_token=1000 * timings.median(name) / tokens,
                 ar_ms_per_token=1000 * timings.median("AR") / ar_tokens,
                 speedup=speedup, speedup_range=f"{low:.2f}-{high:.2f}",
                 compile_s=timings.compile_s[name])
    rows.append(row)
  return rows


def _auto_prediction(results) -> dict:
  """An 'auto' row's share of narrow rounds and its predicted speedup from the cost table
  it decided with: tokens / Σ_rounds s[γ] / s[0] (γ from each row's γ histogram)."""
  tokens = narrow = priced = rounds = 0.0
  for res in results:
    per_gamma = res.cost_table.per_gamma()
    hist = np.asarray(res.gamma_hist).sum(0)  # [G + 1]
    tokens += float(np.asarray(res.lengths).sum())
    narrow, rounds = narrow + hist[0], rounds + hist.sum()
    priced += float((hist * per_gamma[:len(hist)] / per_gamma[0]).sum())
  return dict(narrow_rounds=narrow / rounds, predicted_speedup=tokens / priced,
              table_ms_per_token=1e3 * results[0].cost_table.seconds_per_token()[1])


def _costs(pair, inputs: np.ndarray, widths: Sequence[int], new: int):
  """(target step seconds by width, c) from in-loop chain calls at the batch of `inputs`
  [B, L], interleaved."""
  cache_len = inputs.shape[1] + new + max(widths) + 1
  position = 8 if pair.target.is_encoder_decoder else inputs.shape[1] + new // 2
  rows = jax.numpy.asarray(inputs)

  def loop(model, params, k):
    encoded = model.encode(params, rows) if model.is_encoder_decoder else None
    return decode_loop(model, params, rows.shape[0], cache_len, k, encoded=encoded,
                              position=position, calls=10)

  ks = sorted({1, *widths})
  runs = {f"target{k}": loop(pair.target, pair.target_params, k) for k in ks}
  runs["draft1"] = loop(pair.draft, pair.draft_params, 1)
  ms, _ = ms_per_call(runs, repeats=3)
  return {k: ms[f"target{k}"] / 1e3 for k in ks}, ms["draft1"] / ms["target1"]


FLAGS = {"--batch": dict(type=int, action="append"),
         "--temperature": dict(type=float, action="append"),
         "--width": dict(type=int, action="append"), "--trees": dict(type=int),
         "--auto": dict(action="store_true"), "--lookup": dict(action="store_true"),
         "--ngram": dict(action="store_true"), "--no_timing": dict(action="store_true")}


def main(argv=None) -> List[dict]:
  cli = parse_cli(argv, __doc__, "bench_trees", flags=FLAGS)
  own = cli.args
  settings = FAST if cli.fast else FULL
  widths = tuple(own.width or settings["widths"])
  batches = tuple(own.batch or ((1,) if cli.fast else (1, 8)))
  temperatures = tuple(own.temperature or ((0.0,) if cli.fast else (0.0, 1.0)))
  rows = []
  for pair in cli.pairs:
    inputs = load_examples(pair, max(settings["examples"], max(batches))).inputs
    ngram = (BigramDrafter(ngram_corpus(pair)[0], pair.target.vocab_size, max_gamma=1)
             if own.ngram else None)
    for batch in batches:
      costs = _costs(pair, inputs[:batch], widths, settings["new"])
      calls = ([inputs[:batch]] if batch > 1 else
               [inputs[i:i + 1] for i in range(settings["examples"])])
      for temperature in temperatures:
        for width in widths:
          rows += _setting(pair, calls, width, temperature, settings["new"],
                           settings["repeats"], not own.no_timing, costs,
                           own.trees or settings["trees"], own.auto, own.lookup, ngram)
          # No two settings share a compiled loop, and a process holds a bounded number of
          # XLA:CPU code mappings (vm.max_map_count): the whole grid in one process ran out.
          jax.clear_caches()
  best = _best(rows)
  return write(cli, "bench_trees", rows, "Chains vs token trees at equal target-call width", [
      "tokens per call: generated tokens / target calls; r: w-token call / 1-token call "
      "(chain calls at the row's batch); c: the draft's 1-token call / the target's; "
      "predicted = tokens per call / (r + c x draft calls per round); 'auto' rows: tokens / "
      "sum over rounds of s[gamma] / s[0] from their own cost table, narrow_rounds the share "
      "of rounds at gamma = 0",
      "none_accepted / all_accepted: share of rounds that accept no node / the whole depth",
      "speedup: per emitted token over autoregressive, median of interleaved passes (range); "
      "compile_s: the warm-up less a timed pass",
      "batch 1: each example decoded alone; batch B: the first B examples in one call"],
      more="\n\n## Best tree vs best chain\n\n" + markdown_table(best) + "\n", best=best)


def _best(rows: List[dict]) -> List[dict]:
  """Per (pair, batch, temperature, width): the chain's and the best tree's tokens per call."""
  out = []
  keys = sorted({(r["pair"], r["batch"], r["temperature"], r["width"]) for r in rows})
  for key in keys:
    group = [r for r in rows if (r["pair"], r["batch"], r["temperature"], r["width"]) == key]
    chain = next(r for r in group if r["kind"] == "chain")
    trees = [r for r in group if r["kind"] in ("static", "dynamic", "gin")]
    tree = max(trees, key=lambda r: r["tokens_per_call"])
    out.append(dict(pair=key[0], batch=key[1], temperature=key[2], width=key[3],
                    chain=chain["tokens_per_call"], best_tree=tree["decoder"],
                    tree=tree["tokens_per_call"],
                    ratio=tree["tokens_per_call"] / chain["tokens_per_call"]))
  return out


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
