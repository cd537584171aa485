"""The tokens-per-call table: feature heads of several kinds side by side on one pair.

  python -m experiments.bench.eagle --pair lm --weights_dtype bfloat16 \
      --heads "EAGLE-1=bundled:lm/eagle,EAGLE-3 + TTT=/path/to/head" [--fast]

Per head (a kind label and a head folder or bundled name; EAGLE-1: the final features,
EAGLE-3: fused layers, with or without training-time test): chains of γ 1..8 and a dynamic
tree, each decoded greedily over the bundled inputs, interleaved with the autoregressive
decode. Columns: α (Eq. 1's estimate; trees the depth-equivalent α), tokens per target call
(the accepted guesses plus the correction per round), accepted guesses per round, acceptance
by position (guess i's acceptance among the rounds whose guess i - 1 was accepted: a head
trained on its own guesses should keep it from position 2 on) and the CPU speedup over
autoregressive. These counts do not depend on the hardware; the speedup does.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import gin
import numpy as np

from experiments.common.compare import compare
from experiments.common.decoding import Decoders, decode_config
from experiments.common.inputs import load_examples
from experiments.common.output import write
from specjax.app import bundled
from specjax.data import load_vocab
from specjax.draft import DynamicTree, FeatureDrafter
from specjax.params import DRAFT_WEIGHTS_DTYPES, cast_kernels
from specjax.train import load_head, load_token_ranking

FAST = dict(num_examples=1, max_new_tokens=8, gammas=(2,), dynamic_tree=(2, 1, 2), repeats=1,
            kernels="float32")


def table_settings(gammas: Optional[str] = None, tree: Optional[str] = None,
                   examples: Optional[int] = None, repeats: Optional[int] = None
                   ) -> Dict[str, Any]:
  """`table`'s keywords from the command's --gammas ('5,7'), --tree ('2,1,6' or 'none'),
  --examples and --repeats (timed passes: the counts need one); those not given are left out
  (the defaults stand). ValueError names a bad one."""
  out: Dict[str, Any] = {}
  if gammas is not None:
    try:
      values = tuple(int(g) for g in gammas.split(","))
    except ValueError:
      raise ValueError(f"--gammas {gammas!r}: give γ values as '5,7'") from None
    if not values or min(values) < 1:
      raise ValueError(f"--gammas {gammas!r}: every γ must be >= 1")
    out["gammas"] = values
  if tree is not None:
    if tree.strip().lower() == "none":
      out["dynamic_tree"] = None
    else:
      try:
        shape = tuple(int(v) for v in tree.split(","))
      except ValueError:
        shape = ()
      if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"--tree {tree!r}: give 'branch,expand,depth' (each >= 1) or 'none'")
      out["dynamic_tree"] = shape
  if examples is not None:
    if examples < 1:
      raise ValueError(f"--examples must be >= 1, got {examples}")
    out["num_examples"] = examples
  if repeats is not None:
    if repeats < 1:
      raise ValueError(f"--repeats must be >= 1, got {repeats}")
    out["repeats"] = repeats
  return out


def acceptance(hist: np.ndarray) -> Tuple[float, List[float]]:
  """Rounds by guesses accepted, int [n + 1] -> (mean accepted per round, acceptance by
  position i = 1..n: rounds accepting >= i over rounds accepting >= i - 1)."""
  hist = np.asarray(hist, np.float64)
  rounds = max(hist.sum(), 1.0)
  mean = float((np.arange(hist.size) * hist).sum() / rounds)
  reached = np.cumsum(hist[::-1])[::-1]  # reached[i]: rounds accepting >= i
  rates = [float(reached[i] / reached[i - 1]) if reached[i - 1] else float("nan")
           for i in range(1, hist.size)]
  return mean, rates


class _Recorder:
  """A decoder that keeps each input's accepted-guess histogram (the last decode of it:
  greedy decodes of one input are equal)."""

  def __init__(self, fn):
    self.fn, self.hist = fn, {}

  def __call__(self, row):
    out = self.fn(row)
    self.hist[row.tobytes()] = np.asarray(out.accepted_hist).sum(0)
    return out

  def total(self) -> np.ndarray:
    width = max(h.size for h in self.hist.values())
    return sum(np.pad(h, (0, width - h.size)) for h in self.hist.values())


@gin.configurable(module="bench_eagle_heads")
def table(cli: Any, heads: Sequence[Tuple[str, str]], *, num_examples: int = 16,
          max_new_tokens: int = 128, gammas: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8),
          dynamic_tree: Optional[Tuple[int, int, int]] = (2, 1, 6),
          vocab_limit: Optional[int] = 1024, kernels: str = "bfloat16", repeats: int = 3,
          max_input_len: int = 48, stop_at_eos: bool = False) -> List[Dict[str, Any]]:
  """Writes bench_eagle_heads.{md,csv,json}; returns the rows (module docstring).
  dynamic_tree: (branch, expand, max_depth) of EAGLE-2's tree, or None. stop_at_eos: each
  decode ends at its first EOS (the output a user reads; the heads were trained on text that
  ends there), else it runs on to max_new_tokens past it (equal lengths for every decoder)."""
  if kernels not in DRAFT_WEIGHTS_DTYPES:
    raise ValueError(f"kernels must be one of {sorted(DRAFT_WEIGHTS_DTYPES)}, got {kernels!r}")
  pair = cli.pairs[0]
  ex = load_examples(pair, num_examples, max_input_len)
  depth = max([*gammas, dynamic_tree[2] if dynamic_tree else 0])
  grown = depth if dynamic_tree is None else max(
      depth, dynamic_tree[0] + dynamic_tree[0] * dynamic_tree[1] * (dynamic_tree[2] - 1))
  d = Decoders(pair, max_new_tokens,
               decode_config(0.0, max_input_len + max_new_tokens + grown + 1,
                             eos_id=load_vocab().eos_id if stop_at_eos else -1))
  runs: Dict[str, Any] = {"autoregressive": d.autoregressive()}
  meta: Dict[str, Tuple[str, str, Optional[int]]] = {}
  for kind, name in heads:
    folder = bundled.resolve(name, "checkpoint")
    head, params32 = load_head(folder)
    params = (params32 if kernels == "float32"
              else cast_kernels(params32, DRAFT_WEIGHTS_DTYPES[kernels]))
    ranking = load_token_ranking(folder, head.config.vocab_size)
    for g in gammas:
      drafter = FeatureDrafter(pair.target, head, max_gamma=g, vocab_limit=vocab_limit)
      label = f"{kind}, chain γ={g}"
      runs[label] = _Recorder(d.chain(drafter, drafter.params(params, pair.target_params,
                                                              token_ranking=ranking), g))
      meta[label] = (kind, f"chain γ={g}", g)
    if dynamic_tree is not None:
      b, e, depth_ = dynamic_tree
      drafter = FeatureDrafter(pair.target, head, max_gamma=1, vocab_limit=vocab_limit)
      label = f"{kind}, dynamic b{b} e{e} d{depth_}"
      runs[label] = _Recorder(d.tree(drafter, drafter.params(params, pair.target_params,
                                                             token_ranking=ranking),
                                     tree=DynamicTree(branch=b, expand=e, max_depth=depth_)))
      meta[label] = (kind, f"dynamic b{b} e{e} d{depth_}", None)
  result = compare(runs, ex.inputs, repeats, reference="autoregressive", progress=True,
                   gammas={label: g for label, (_, _, g) in meta.items() if g is not None})
  rows = []
  for row in result.rows()[1:]:
    kind, decoder, _ = meta[row["decoder"]]
    mean, rates = acceptance(runs[row["decoder"]].total())
    rows.append({"head": kind, "decoder": decoder, "alpha": row["alpha"],
                 "tokens_per_call": row["tokens_per_call"], "accepted_per_round": mean,
                 "acceptance_by_position": " ".join(f"{r:.2f}" for r in rates),
                 "ms_per_token": row["ms_per_token"], "speedup": row["speedup"],
                 "greedy": row["greedy"]})
  return write(cli, "bench_eagle_heads", rows,
               "Feature heads side by side: tokens per target call, batch 1", [
                   "heads: " + ", ".join(f"{kind} = {name}" for kind, name in heads)
                   + f"; kernels {kernels}; "
                   + (f"drafting over the {vocab_limit} most frequent ids (token_ranking.npy)"
                      if vocab_limit else "all ids"),
                   f"{num_examples} bundled inputs × {max_new_tokens} tokens "
                   f"({'up to the first EOS' if stop_at_eos else 'EOS ignored'}), "
                   f"temperature 0, interleaved per example, median of {repeats} passes",
                   "acceptance by position: guess i accepted among rounds whose guess i - 1 "
                   "was; accepted_per_round excludes the correction token, tokens_per_call "
                   "includes it"],
               columns=["head", "decoder", "alpha", "tokens_per_call", "accepted_per_round",
                        "acceptance_by_position", "ms_per_token", "speedup", "greedy"])
