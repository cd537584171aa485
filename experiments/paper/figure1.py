"""Paper Figure 1: the trace of one speculative generation (terminal and HTML).

  python -m experiments.paper.figure1 [--pair translate] [--fast] [--gin.figure1.run.example=3]

One line per target call: accepted guesses green, the rejected guess red (struck
through), the target's correction blue. Writes figure1.txt (plain: [+accepted+], [-rejected-],
[*correction*]), figure1.html, figure1.md and figure1.json (ids and pieces per round).
"""
from __future__ import annotations

import itertools
from typing import Dict

import gin
import jax
from rich.console import Console

from experiments.common.cli import Cli, cli_main
from experiments.common.decoding import decode_config, model_drafter
from experiments.common.inputs import load_examples, output_ids
from experiments.common.output import Output, header
from specjax.app import report
from specjax.command import run_cli
from specjax.decode import speculative_decode
from specjax.data import load_vocab

FAST = dict(max_new_tokens=8)


@gin.configurable(module="figure1")
def run(cli: Cli, *, example: int = 0, gamma: int = 5, temperature: float = 0.0,
        max_new_tokens: int = 32, max_input_len: int = 48, seed: int = 0) -> Dict:
  """Decodes bundled example `example` of the first pair with a trace; writes the figure.

  Returns {'rounds': [...], 'text': str, 'pair': name}.
  """
  pair = cli.pairs[0]
  vocab = load_vocab()
  ex = load_examples(pair, 1, max_input_len, skip=example)
  drafter, dparams = model_drafter(pair, gamma)
  config = decode_config(temperature, max_input_len + max_new_tokens + gamma + 1,
                                trace=True, eos_id=vocab.eos_id)
  result = speculative_decode(pair.target, pair.target_params, drafter, dparams, ex.inputs,
                              max_new_tokens=max_new_tokens, gamma=gamma,
                              rng=jax.random.PRNGKey(seed), config=config)
  rounds = report.trace_rounds(result, 0)
  shown = report.readable_rounds(rounds, vocab)
  console = Console(record=True, width=100)
  title = f"Figure 1: {pair.label}, γ={gamma}, T={temperature:g}"
  console.print(title, markup=False)
  console.print(f"input: {ex.texts[0]}", markup=False, highlight=False)
  console.print(report.render_trace(shown))
  out = Output(cli.output_dir, "figure1")
  plain = report.plain_trace(shown)
  out.path("figure1.txt").write_text(plain + "\n", encoding="utf-8")
  out.path("figure1.html").write_text(console.export_html(), encoding="utf-8")
  md = header(title, [pair], [f"input: {ex.texts[0]}",
                                     report.legend(colours=False)])
  out.markdown(md + "\n```\n" + plain + "\n```")
  text = vocab.decode(output_ids(result.tokens[0], int(result.lengths[0])))
  record = {"pair": pair.name, "source": pair.source, "input": ex.texts[0], "text": text,
            "target_calls": int(result.target_calls[0]), "rounds": [
                {**r, "pieces": ({k: text[k] for k in ("accepted", "rejected", "correction")}
                                 if text is not None else None)}  # None: past the first EOS
                for r, text in itertools.zip_longest(rounds, shown)]}
  out.json(record)
  out.announce()
  return record


main = cli_main(run, "figure1", __doc__, FAST, default_pairs=("translate",))


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
