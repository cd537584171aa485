"""Paper Table 5 / A.5: lenience l trades exactness for α and speed; what it costs in quality.

  python -m experiments.paper.table5_lenience [--pair translate] [--fast]
      [--gin_file=experiments/table5_lenience.gin]

What it runs, its columns and settings: docs/experiments.md, section "paper.table5_lenience".
"""
from __future__ import annotations

import functools
from typing import Dict, List, Sequence

import gin
import jax

from experiments.common.checks import check_counts
from experiments.common.cli import Cli, cli_main
from experiments.common.decoding import Decoders, decode_config, model_drafter
from experiments.common.inputs import bleu, load_examples, output_ids, perplexity
from experiments.common.output import Output, fmt, write
from specjax import timing
from specjax.command import run_cli
from specjax.data import load_vocab

FAST = dict(num_examples=2, max_new_tokens=6, leniences=(1.0, 0.3), argmax_leniences=(0.5,),
            repeats=1)


def _quality(pair, ex, result) -> Dict:
  vocab = load_vocab()
  ids = [output_ids(result.tokens[i], int(result.lengths[i])) for i in range(len(ex.texts))]
  out = {"perplexity": perplexity(pair, ex.inputs, ids)}
  if ex.references[0] is not None:
    out["bleu"] = bleu(ex.references, [vocab.decode(i) for i in ids])
  return out


@gin.configurable(module="table5_lenience")
def run(cli: Cli, *, num_examples: int = 32, max_new_tokens: int = 32, gamma: int = 5,
        leniences: Sequence[float] = (1.0, 0.5, 0.3, 0.1),
        argmax_leniences: Sequence[float] = (1.0, 0.5, 0.3, 0.1), repeats: int = 3,
        max_input_len: int = 48) -> List[Dict]:
  """Writes table5_lenience.{md,csv,json,png}; returns the rows.

  Args:
    cli: pairs and output folder.
    num_examples, max_new_tokens: examples per pair (one batch) and budget.
    gamma: guesses per round.
    leniences: l values at temperature 1; argmax_leniences: at temperature 0 (A.5).
    repeats: timed runs (median); max_input_len: input width.
  """
  check_counts(num_examples=num_examples, max_new_tokens=max_new_tokens, gamma=gamma,
                      repeats=repeats)
  rows = []
  for pair in cli.pairs:
    ex = load_examples(pair, num_examples, max_input_len)
    cache_len = max_input_len + max_new_tokens + gamma + 1
    drafter, dparams = model_drafter(pair, gamma)
    key = jax.random.PRNGKey(0)
    for temp, ls in ((1.0, leniences), (0.0, argmax_leniences)):
      if not ls:
        continue
      d = Decoders(pair, max_new_tokens, decode_config(temp, cache_len), key)
      runs = {"AR": functools.partial(d.autoregressive(), ex.inputs)}
      for l in ls:
        runs[f"l={l}"] = functools.partial(d.chain(drafter, dparams, gamma), ex.inputs,
                                           config=decode_config(temp, cache_len, lenience=l))
      t = timing.interleaved(runs, repeats)
      rows.append({"pair": pair.name, "temperature": temp, "lenience": "AR", "alpha": None,
                   "tokens_per_call": 1.0, "speedup": 1.0,
                   **_quality(pair, ex, t.outputs["AR"])})
      for l in ls:
        out = t.outputs[f"l={l}"]
        calls = int(out.target_calls.sum())
        rows.append({"pair": pair.name, "temperature": temp, "lenience": l,
                     "alpha": out.pooled_alpha,
                     "tokens_per_call": float(out.lengths.sum()) / max(calls, 1),
                     "speedup": t.median("AR") / t.median(f"l={l}"), **_quality(pair, ex, out)})
        print({k: fmt(v) for k, v in rows[-1].items()})
  return write(cli, "table5_lenience", rows, "Table 5 analog: lenience", [
      f"{num_examples} examples × {max_new_tokens} tokens in one batch, γ={gamma}; "
      "l = 1 is exact, l < 1 is NOT (quality columns show the cost)",
      "temperature 0 rows use the argmax lenience of A.5",
      f"speedup: AR / speculative median time of {repeats} interleaved runs"],
      ["pair", "temperature", "lenience", "alpha", "tokens_per_call", "speedup", "perplexity",
       "bleu"], plot=lambda out: _plot(out, rows))


def _plot(out: Output, rows: List[Dict]) -> None:
  with out.figure("table5_lenience.png", (5, 3.5)) as ax:
    for key in sorted({(r["pair"], r["temperature"]) for r in rows}):
      sel = [r for r in rows if (r["pair"], r["temperature"]) == key and r["lenience"] != "AR"]
      ax.plot([r["lenience"] for r in sel], [r["alpha"] for r in sel], "o-",
              label=f"{key[0]} T={key[1]:g}")
    ax.set(xlabel="lenience l", ylabel="α", xscale="log", title="α vs lenience")
    ax.legend(fontsize=7)


main = cli_main(run, "table5_lenience", __doc__, FAST,
                       default_pairs=("translate", "lm"))


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
