"""Feature-level (EAGLE-style) drafts beside the independent draft model, in one run.

  python -m experiments.bench.eagle --pair lm --weights_dtype bfloat16 [--head DIR] [--fast]
  python -m experiments.bench.eagle --pair translate --weights_dtype bfloat16 --head DIR
  python -m experiments.bench.eagle --pair lm --heads "EAGLE-1=bundled:lm/eagle,EAGLE-3=DIR"

With --heads: the tokens-per-call table of several heads side by side
(`experiments.common.eagle_heads`: chains of γ 1..8 and a dynamic tree per head).

What it runs, its columns and settings: docs/experiments.md, section "bench.eagle".
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import gin
import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import eagle_heads
from experiments.common.checks import check_counts
from experiments.common.cli import Cli, cli_main
from experiments.common.compare import compare
from experiments.common.decoding import Decoders, decode_config
from experiments.common.inputs import load_examples
from experiments.common.output import write
from specjax.app import bundled
from specjax.app.greedy_check import greedy_difference
from specjax.command import run_cli
from specjax.draft import DynamicTree, FeatureDrafter, StaticTree
from specjax.params import DRAFT_WEIGHTS_DTYPES, cast_kernels
from specjax.train import load_head, load_token_ranking
from specjax.train.head_eval import parse_heads

FAST = dict(num_examples=1, max_new_tokens=8, draft_gammas=(2,),
            feature_chains=((2, None, False, "float32"), (2, 64, True, "int8")),
            tree_spines=((2, 1),), dynamic_trees=((2, 1, 2, 3),), repeats=1)
DEFAULT_HEADS = {"lm": "bundled:lm/eagle", "translate": "bundled:translate/eagle"}
"""The feature head each pair decodes with when --head is not given."""


def decoders(pair, head, head_params, ranking, *, draft_gammas: Sequence[int],
             feature_chains: Sequence[Tuple[int, Optional[int], bool, str]],
             tree_spines: Sequence[Sequence[int]],
             dynamic_trees: Sequence[Tuple[int, int, int, int]], tree_vocab_limit: Optional[int],
             tree_kernels: str, cache_len: int, max_new_tokens: int
             ) -> Dict[str, Tuple[str, object]]:
  """name -> (kind, fn(row int32 [1, W]) -> DecodeResult), the autoregressive one first;
  `head_params`: the head's params by kernels dtype."""
  d = Decoders(pair, max_new_tokens, decode_config(0.0, cache_len))
  target, params = pair.target, pair.target_params
  runs = {"autoregressive": ("ar", d.autoregressive())}
  for g in draft_gammas:
    runs[f"draft model, chain γ={g}"] = ("chain", d.model_chain(g))
  for g, limit, ranked, kernels in feature_chains:
    drafter = FeatureDrafter(target, head, max_gamma=g, vocab_limit=limit)
    fparams = drafter.params(head_params[kernels], params,
                             token_ranking=ranking if ranked else None)
    runs[f"feature head{_limited(limit, ranked)}, {kernels}, chain γ={g}"] = (
        "chain", d.chain(drafter, fparams, g))
  trees = [(f"feature head, spines {tuple(s)}", StaticTree.from_spines(tuple(s)))
           for s in tree_spines]
  trees += [(f"feature head, dynamic b{b} e{e} d{d} keep {k}",
             DynamicTree(branch=b, expand=e, max_depth=d, keep=k or None))
            for b, e, d, k in dynamic_trees]
  drafter = FeatureDrafter(target, head, max_gamma=1, vocab_limit=tree_vocab_limit)
  fparams = drafter.params(head_params[tree_kernels], params, token_ranking=ranking)
  for name, tree in trees:
    label = name.replace("feature head", f"feature head"
                         f"{_limited(tree_vocab_limit, ranking is not None)}, {tree_kernels}")
    runs[label] = ("tree", d.tree(drafter, fparams, tree=tree))
  return runs


def _limited(limit: Optional[int], ranked: bool) -> str:
  if limit is None:
    return ""
  return f" ({limit} most frequent ids)" if ranked else f" (first {limit} ids)"


@gin.configurable(module="bench_eagle")
def run(cli: Cli, *, num_examples: int = 16, max_new_tokens: int = 128,
        draft_gammas: Sequence[int] = (3, 4, 5),
        feature_chains: Sequence[Tuple[int, Optional[int], bool, str]] = (
            (5, None, False, "bfloat16"), (5, 1024, True, "bfloat16"), (4, 1024, True, "int8"),
            (5, 1024, True, "int8"), (6, 1024, True, "int8")),
        tree_spines: Sequence[Sequence[int]] = ((6, 1), (5, 2, 1)),
        dynamic_trees: Sequence[Tuple[int, int, int, int]] = ((2, 1, 6, 0), (3, 2, 6, 12)),
        tree_vocab_limit: Optional[int] = 1024, tree_kernels: str = "int8",
        repeats: int = 5,
        max_input_len: int = 48) -> List[Dict]:
  """Writes bench_eagle.{md,csv,json}; returns the rows (module docstring). With --heads,
  `eagle_heads.table`'s instead."""
  if cli.flags["heads"]:
    if len(cli.pairs) != 1:
      raise ValueError("bench_eagle decodes one pair: give --pair lm or --pair translate")
    return eagle_heads.table(cli, parse_heads(cli.flags["heads"]),
                             **{**(eagle_heads.FAST if cli.fast else {}),
                                **eagle_heads.table_settings(cli.flags["gammas"],
                                                             cli.flags["tree"],
                                                             cli.flags["examples"],
                                                             cli.flags["repeats"]),
                                **({"stop_at_eos": True} if cli.flags["stop_at_eos"] else {})})
  check_counts(num_examples=num_examples, max_new_tokens=max_new_tokens, repeats=repeats,
               draft_gammas=tuple(draft_gammas),
               feature_gammas=tuple(g for g, _, _, _ in feature_chains))
  pair = cli.pairs[0]
  if len(cli.pairs) != 1:
    raise ValueError("bench_eagle decodes one pair: give --pair lm or --pair translate")
  head_name = cli.flags["head"] or DEFAULT_HEADS.get(pair.name)  # a folder, or 'bundled:...'
  if head_name is None:
    raise ValueError(f"pair {pair.name!r} has no bundled feature head: give --head DIR")
  kinds = {tree_kernels, *(kernels for _, _, _, kernels in feature_chains)}
  for kernels in sorted(kinds):
    if kernels not in DRAFT_WEIGHTS_DTYPES:
      raise ValueError(f"head kernels must be one of {sorted(DRAFT_WEIGHTS_DTYPES)}, "
                       f"got {kernels!r}")
  head_dir = bundled.resolve(head_name, "checkpoint")
  head, params32 = load_head(head_dir)
  head_params = {kernels: cast_kernels(params32, DRAFT_WEIGHTS_DTYPES[kernels])
                 if kernels != "float32" else params32 for kernels in kinds}
  ranking = load_token_ranking(head_dir, head.config.vocab_size)
  if ranking is None and any(ranked for _, _, ranked, _ in feature_chains):
    raise ValueError(f"feature head {head_name}: no token_ranking.npy beside its model.gin; "
                     "give feature_chains without ranked entries")
  ex = load_examples(pair, num_examples, max_input_len)
  depth = max([*draft_gammas, *(g for g, _, _, _ in feature_chains),
               *(max(s) for s in tree_spines),
               *(d for _, _, d, _ in dynamic_trees)])
  grown = max([sum(s) for s in tree_spines] + [b + b * e * (d - 1) for b, e, d, _ in
                                               dynamic_trees] + [depth])
  runs = decoders(pair, head, head_params, ranking, draft_gammas=draft_gammas,
                  feature_chains=feature_chains, tree_spines=tree_spines,
                  dynamic_trees=dynamic_trees, tree_vocab_limit=tree_vocab_limit,
                  tree_kernels=tree_kernels,
                  cache_len=max_input_len + max_new_tokens + grown + 1,
                  max_new_tokens=max_new_tokens)
  weights = ("bfloat16" if any(np.asarray(leaf).dtype == jnp.bfloat16
                               for leaf in jax.tree.leaves(pair.target_params)) else "float32")

  def near_ties_only(name, i, row, reference, out):  # else the run fails
    found = greedy_difference(pair.target, pair.target_params, row, None, reference, out,
                              weights)
    if not found["greedy_verdict"].startswith("differs only at near-ties"):
      raise AssertionError(f"{name}, example {i}: {found}")
    return "near-ties: " + found["greedy_difference"].replace("example 0:", f"example {i}:", 1)

  result = compare({name: fn for name, (_, fn) in runs.items()}, ex.inputs, repeats,
                   reference="autoregressive", check=near_ties_only, progress=True,
                   gammas={name: int(name.rsplit("γ=", 1)[1])
                           for name, (kind, _) in runs.items() if kind == "chain"})
  rows = result.rows()
  for row in rows:
    alpha = "-" if row["alpha"] is None else f"{row['alpha']:.3f}"
    print(f"{row['decoder']}: α={alpha} tokens/call={row['tokens_per_call']:.2f} "
          f"ms/token={row['ms_per_token']:.3f} speedup={row['speedup']:.2f} "
          f"({row['speedup_range']})")
  return write(cli, "bench_eagle", rows,
               "Feature-level drafts (EAGLE-style) beside the independent draft, batch 1", [
                  f"feature head: {head_name}, its kernels as each row names"
                  + ("; most frequent ids: its token_ranking.npy" if ranking is not None
                     else ""),
                  f"{num_examples} bundled inputs × {max_new_tokens} tokens (EOS ignored), "
                  f"temperature 0, every decoder interleaved per example, median of {repeats} "
                  "passes, compile excluded (compile_s apart); greedy: outputs equal to the "
                  "autoregressive one, or differing only at near-ties of the target's logits "
                  "(`specjax.app.greedy_check`; a clear margin fails the run)",
                  "alpha: chains Eq. 1's estimate, trees the depth-equivalent α; E_tokens: "
                  "Eq. 1 at alpha and γ; speedup: autoregressive ms per token / the decoder's; "
                  "range: per example"],
               columns=["decoder", "alpha", "tokens_per_call", "E_tokens", "ms_per_token",
                        "speedup", "speedup_range", "compile_s", "greedy"])


main = cli_main(run, "bench_eagle", __doc__, FAST, default_pairs=("lm",),
                flags={"--head": dict(default=None,
                                      help="the feature head: a folder written by "
                                           "runs/train_lm_eagle.gin or "
                                           "runs/train_translate_eagle.gin, or 'bundled:lm/eagle' "
                                           "(default: the pair's bundled head)"),
                       "--heads": dict(default=None,
                                       help="KIND=HEAD,...: the tokens-per-call table of "
                                            "these heads side by side (e.g. "
                                            "'EAGLE-1=bundled:lm/eagle,EAGLE-3=DIR'), "
                                            "experiments.common.eagle_heads"),
                       "--gammas": dict(default=None,
                                        help="with --heads: the chains' γ, e.g. '7' or '5,7' "
                                             "(default 1,...,8)"),
                       "--tree": dict(default=None,
                                      help="with --heads: the dynamic tree as "
                                           "'branch,expand,depth', or 'none' (default 2,1,6)"),
                       "--examples": dict(type=int, default=None,
                                          help="with --heads: bundled inputs decoded "
                                               "(default 16)"),
                       "--repeats": dict(type=int, default=None,
                                         help="with --heads: timed passes per decoder "
                                              "(default 3; the counts need 1)"),
                       "--stop_at_eos": dict(action="store_true",
                                             help="with --heads: each decode ends at its "
                                                  "first EOS (default: 128 tokens past it)")})


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
