"""The bundled pairs' report card: size, training, held-out quality, α at T=0 and T=1.

  python -m experiments.eval_pairs [--pair lm --pair translate] [--fast]
      [--gin.eval_pairs.run.alpha_tokens=10000]

What it runs, its columns and settings: docs/experiments.md, section "eval_pairs".
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.cli import Cli, cli_main
from experiments.common.decoding import Decoders, decode_config, in_batches, join
from experiments.common.inputs import Examples, bleu, load_examples, output_ids
from experiments.common.output import fmt, header, markdown_table, write
from experiments.common.pairs import Pair
from specjax.app import bundled
from specjax import data as data_lib  # load_bundled, read_split, TASK_FILES
from specjax.command import run_cli
from specjax.train import Batches, make_features
from specjax.decode import autoregressive_decode
from specjax.params import count_params
from specjax.train import OptimizerConfig, get_trainer
from specjax.data import load_vocab

FAST = dict(alpha_tokens=16, alpha_batch=2, max_new_tokens=8, bleu_examples=4, ppl_batches=1,
            temperatures=(0.0,))
TRAIN_TASK = {"lm_ddtp_en": "lm", "translate_en_de": "translate"}


def training_info(pair: Pair, role: str) -> Dict:
  """train_summary.json of a shipped model ({} for a random-init or gin pair)."""
  if pair.random_init or pair.name not in bundled.PAIRS:
    return {}
  return bundled.train_summary(pair.name, role)


def heldout_split(task: str, data_dir: Optional[Path]):
  """(examples, description): the prepared test split, else the bundled sample."""
  ext = data_lib.TASK_FILES[task]
  path = (data_dir / task / f"test.{ext}") if data_dir else None
  if path is not None and path.is_file():
    examples = data_lib.read_split(path)
    return ([s for s, _ in examples] if task == "lm_ddtp_en" else examples), str(path)
  return data_lib.load_bundled(task), f"bundled {task} sample"


def perplexity(model, params, task: str, examples: Sequence, max_batches: int,
               batch_size: int = 32) -> float:
  """Teacher-forced perplexity over `examples` (packed 128-token rows for the LM;
  64 + 64 token pairs for translation), at most `max_batches` batches."""
  feats = make_features(TRAIN_TASK[task], list(examples), load_vocab(), seq_len=128,
                        inputs_length=64, targets_length=64)
  trainer = get_trainer(model.config, OptimizerConfig(), 1)
  params32 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  batches = Batches(feats, batch_size).eval_batches(max_batches)
  return float(trainer.evaluate(params32, batches)["perplexity"])


def greedy_bleu(pair: Pair, which: str, ex: Examples, batch: int,
                max_new_tokens: int) -> float:
  """Corpus BLEU of `which` ('target' or 'draft') decoding greedily on its own."""
  model, params = ((pair.target, pair.target_params) if which == "target"
                   else (pair.draft, pair.draft_params))
  vocab = load_vocab()
  config = decode_config(0.0, max_new_tokens + 2, eos_id=1)
  out = in_batches(lambda rows, _: autoregressive_decode(
      model, params, rows, max_new_tokens=max_new_tokens, rng=jax.random.PRNGKey(0),
      config=config), ex.inputs, batch)
  return bleu(ex.references, [vocab.decode(output_ids(t, int(n)))
                              for t, n in zip(np.asarray(out.tokens), np.asarray(out.lengths))])


def measure_alpha(pair: Pair, temperature: float, *, gamma: int, batch: int,
                  max_new_tokens: int, min_tokens: int, max_input_len: int) -> Dict:
  """α over ≥ `min_tokens` generated tokens (batches of bundled examples in order)."""
  eos = 1 if pair.target.is_encoder_decoder else -1  # LM rows run their full budget
  config = decode_config(temperature, max_input_len + max_new_tokens + gamma + 1, eos_id=eos)
  chain = Decoders(pair, max_new_tokens, config).model_chain(gamma)
  outs, tokens, skip = [], 0, 0
  available = len(data_lib.load_bundled(pair.task))
  while tokens < min_tokens:
    if skip >= available:
      raise ValueError(f"{pair.task}: the bundled split ran out at {tokens} tokens "
                       f"(asked for {min_tokens}); raise max_new_tokens")
    ex = load_examples(pair, min(batch, available - skip), max_input_len, skip=skip)
    outs.append(in_batches(lambda rows, _: chain(rows, rng=jax.random.PRNGKey(skip)),
                           ex.inputs, batch))
    tokens += int(np.sum(outs[-1].lengths))
    skip += len(ex.texts)
  out = join(outs)
  return {"alpha": out.pooled_alpha, "tokens": tokens, "positions": int(np.sum(out.alpha_count)),
          "examples": skip, "tokens_per_call": tokens / max(int(np.sum(out.target_calls)), 1)}


@gin.configurable(module="eval_pairs")
def run(cli: Cli, *, alpha_tokens: int = 10000, alpha_batch: int = 64,
        max_new_tokens: int = 96, gamma: int = 4, temperatures: Sequence[float] = (0.0, 1.0),
        bleu_examples: int = 500, ppl_batches: int = 50, max_input_len: int = 48,
        data_dir: Optional[str] = "data") -> List[Dict]:
  """Writes eval_pairs.{md,csv,json}; returns one row per pair and model.

  Args:
    cli: pairs and output folder (`experiments.common.cli.parse_cli`).
    alpha_tokens: generated tokens α is averaged over, per pair and temperature.
    alpha_batch: rows per speculative decode while measuring α.
    max_new_tokens: budget per example (LM rows run it all; translations stop at EOS).
    gamma: guesses per round while measuring α.
    temperatures: for α.
    bleu_examples: bundled translation examples BLEU is computed on.
    ppl_batches: held-out batches of 32 for perplexity.
    max_input_len: encoder input / prompt width.
    data_dir: prepared data (for the test split); missing: the bundled sample.
  """
  root = Path(data_dir) if data_dir else None
  if root is not None and not root.is_absolute():
    root = Path(__file__).resolve().parent.parent / root
  rows, notes, details = [], [], {}
  for pair in cli.pairs:
    examples, where = heldout_split(pair.task, root)
    notes.append(f"{pair.name}: perplexity on {where}")
    alphas = {t: measure_alpha(pair, t, gamma=gamma, batch=alpha_batch,
                               max_new_tokens=max_new_tokens, min_tokens=alpha_tokens,
                               max_input_len=max_input_len) for t in temperatures}
    details[pair.name] = {f"T={t:g}": a for t, a in alphas.items()}
    for t, a in alphas.items():
      print(f"{pair.name} T={t:g}: α={a['alpha']:.3f} over {a['tokens']} tokens "
            f"({a['positions']} verified positions, {a['examples']} examples)")
      notes.append(f"{pair.name} α at T={t:g}: {a['tokens']} generated tokens, "
                   f"{a['positions']} verified positions, γ={gamma}")
    bleu_ex = (load_examples(pair, bleu_examples, max_input_len)
               if pair.target.is_encoder_decoder else None)
    for role in ("target", "draft"):
      model, params = ((pair.target, pair.target_params) if role == "target"
                       else (pair.draft, pair.draft_params))
      info = training_info(pair, role)
      row = {"pair": pair.name, "model": role, "params_M": count_params(params) / 1e6,
             "train_steps": info.get("steps", ""),
             "train_tokens_M": info["train_tokens"] / 1e6 if info else "",
             # Time spent in train steps (evals and restarts excluded).
             "train_minutes": (info["train_seconds"] / 60 if info.get("train_seconds")
                               else ""),
             "heldout_ppl": perplexity(model, params, pair.task, examples, ppl_batches)}
      if bleu_ex is not None:
        row["bleu"] = greedy_bleu(pair, role, bleu_ex, alpha_batch, max_new_tokens)
      for t, a in alphas.items():
        row[f"alpha_T{t:g}"] = a["alpha"] if role == "draft" else ""
      rows.append(row)
      print({k: fmt(v) for k, v in row.items()})
  columns = list(dict.fromkeys(k for r in rows for k in r))
  md = header("The bundled pairs: size, training, quality, α", cli.pairs, notes)
  md += ("\n(α is a property of the pair; it sits on the draft's row. BLEU: greedy, "
         f"{bleu_examples} bundled examples.)\n\n")
  return write(cli, "eval_pairs", rows, "", md=md + markdown_table(rows, columns),
               alpha=details)


main = cli_main(run, "eval_pairs", __doc__, FAST)


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
