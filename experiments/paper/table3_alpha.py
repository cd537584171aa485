"""Paper Table 3's analog: α of unigram, bigram and model drafts at temperature 0 and 1.

  python -m experiments.paper.table3_alpha [--pair lm --pair translate] [--fast]
      [--gin_file=experiments/table3_alpha.gin] [--gin.table3_alpha.run.num_examples=64]

α is measured inside speculative decoding as the mean over verified positions of
Σ_x min(p(x), q(x)) (Cor. 3.6), p the target's and q the draft's standardized
distributions; at temperature 0 that is the rate at which the argmaxes agree.
The unigram / bigram drafts are count tables (add-k smoothed) fitted on the task's
train split (or, without data/, on bundled examples the table does not evaluate).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import gin
import jax
import numpy as np

from experiments.common.cli import Cli, cli_main
from experiments.common.decoding import decode_config, model_drafter
from experiments.common.inputs import Examples, load_examples, ngram_corpus
from experiments.common.output import Output, write
from experiments.common.pairs import Pair
from specjax.command import run_cli
from specjax.decode import speculative_decode
from specjax.draft import BigramDrafter, UnigramDrafter

FAST = dict(num_examples=2, max_new_tokens=6, temperatures=(1.0,), gamma=2,
            drafts=("bigram", "model"), ngram_lines=200)


def measure_alpha(pair: Pair, drafter, drafter_params, ex: Examples,
                  temperature: float, gamma: int, max_new_tokens: int, seed: int = 0) -> Dict:
  """Decodes every example once (one batch); returns α and tokens per target call."""
  width = ex.inputs.shape[1]
  config = decode_config(temperature, width + max_new_tokens + gamma + 1)
  result = speculative_decode(pair.target, pair.target_params, drafter, drafter_params,
                              ex.inputs, max_new_tokens=max_new_tokens, gamma=gamma,
                              rng=jax.random.PRNGKey(seed), config=config)
  alpha = result.pooled_alpha
  per_call = float(np.sum(result.lengths) / max(int(np.sum(result.target_calls)), 1))
  return {"alpha": alpha, "tokens_per_call": per_call,
          "positions": int(np.sum(result.alpha_count))}


@gin.configurable(module="table3_alpha")
def run(cli: Cli, *, num_examples: int = 64, max_new_tokens: int = 32, gamma: int = 3,
        temperatures: Sequence[float] = (0.0, 1.0),
        drafts: Sequence[str] = ("unigram", "bigram", "model"), max_input_len: int = 48,
        ngram_lines: int = 20000) -> List[Dict]:
  """Writes table3_alpha.{md,csv,json}; returns the rows (pair, draft, temperature, α).

  Args:
    cli: pairs and output folder (`experiments.common.cli.parse_cli`).
    num_examples: bundled evaluation examples per pair; max_new_tokens: budget per example.
    gamma: guesses per round while measuring (α does not depend on it).
    temperatures: sampling temperatures (0 = argmax).
    drafts: any of 'unigram', 'bigram', 'model'.
    max_input_len: encoder input / prompt width; ngram_lines: train lines for the n-grams.
  """
  unknown = set(drafts) - {"unigram", "bigram", "model"}
  if unknown:
    raise ValueError(f"unknown drafts {sorted(unknown)}; use unigram, bigram, model")
  rows = []
  notes = []
  for pair in cli.pairs:
    ex = load_examples(pair, num_examples, max_input_len)
    corpus, where = (ngram_corpus(pair, ngram_lines) if set(drafts) - {"model"}
                     else ([], ""))
    if where:
      notes.append(f"{pair.name}: n-gram drafts fitted on {where}")
    for name in drafts:
      if name == "model":
        drafter, params = model_drafter(pair, gamma)
      else:
        make = UnigramDrafter if name == "unigram" else BigramDrafter
        drafter, params = make(corpus, pair.target.vocab_size, max_gamma=gamma)
      for temp in temperatures:
        stats = measure_alpha(pair, drafter, params, ex, temp, gamma, max_new_tokens)
        rows.append({"pair": pair.name, "draft": name, "temperature": temp, **stats})
        print(f"{pair.name:10s} {name:8s} T={temp}: α={stats['alpha']:.3f}")
  return write(cli, "table3_alpha", rows, "Table 3 analog: α by draft and temperature",
               [f"{num_examples} examples × {max_new_tokens} new tokens, γ={gamma}", *notes],
               ["pair", "draft", "temperature", "alpha", "tokens_per_call"],
               plot=lambda out: _plot(out, rows))


def _plot(out: Output, rows: List[Dict]) -> None:
  labels = [f"{r['pair']}/{r['draft']}\nT={r['temperature']:g}" for r in rows]
  with out.figure("table3_alpha.png", (6, 3.5)) as ax:
    ax.bar(range(len(rows)), [r["alpha"] for r in rows])
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set(ylabel="α", ylim=(0, 1), title="α by draft (Table 3 analog)")


main = cli_main(run, "table3_alpha", __doc__, FAST)


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
