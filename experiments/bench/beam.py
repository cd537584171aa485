"""Target calls and walltime: beam search vs speculative beam search (paper A.4).

  python -m experiments.bench.beam                       # random-init tiny T5 pairs
  python -m experiments.bench.beam --target /ckpt/t5_large/checkpoint_N \\
      --target_model models/t5_1_1_large.gin --draft /ckpt/t5_small/checkpoint_M \\
      --draft_model models/t5_1_1_small.gin --task translate_en_de \\
      [--gin.draft/T5Config.num_decoder_layers=4 ...]

What it runs, its columns and settings: docs/experiments.md, section "bench.beam".
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Sequence

import jax
import numpy as np

from experiments.common.checks import check_counts
from experiments.common.cli import parse_cli
from experiments.common.inputs import load_examples
from experiments.common.output import write
from experiments.common.pairs import Pair, RANDOM_CONFIGS, RANDOM_NOTE, pair_from_gin
from specjax import timing
from specjax.app import gin_config
from specjax.command import run_cli
from specjax.decode import beam_search, speculative_beam_search
from specjax.models import T5Model

TASK = "translate_en_de"
PROMPT_WORDS = 10**6
"""LM inputs: whole bundled texts (cut to --max_input_len tokens), not their first words."""

def random_pairs(seed: int, noise: float) -> List[Pair]:
  """Two random-init tiny T5 pairs over the bundled 8k vocabulary (`RANDOM_CONFIGS`'
  translation target, as models/specjax_tiny_t5.gin): a close draft (the target perturbed by
  `noise`) and a 1-layer one."""
  target_config = RANDOM_CONFIGS["translate"][0]
  target = T5Model(target_config)
  params = target.init(seed)
  rng = np.random.default_rng(seed + 1)
  close = jax.tree.map(
      lambda x: x + noise * np.std(x) * rng.normal(size=x.shape).astype(np.float32), params)
  small = T5Model(dataclasses.replace(target_config, num_encoder_layers=1, num_decoder_layers=1))
  return [Pair(f"tiny T5 / close ({100 * noise:g}% noise)", TASK, target, params, target,
                      close, RANDOM_NOTE),
          Pair("tiny T5 / 1-layer random", TASK, target, params, small,
                      small.init(seed + 2), RANDOM_NOTE)]


def checkpoint_pair(args, seed: int, gin_files: Sequence[str], bindings: Sequence[str],
                    paths: Sequence[str]) -> Pair:
  """The pair given by --target/--draft checkpoints and their model gin files.

  The model files are read under the gin scopes target/ and draft/ (as by
  `specjax.main`), so `--gin.draft/T5Config.num_decoder_layers=4` overrides a size.
  """
  if not args.draft:
    raise SystemExit("--target needs --draft (and --target_model / --draft_model, e.g. "
                     "models/t5_1_1_small.gin, unless gin binds TARGET_MODEL / DRAFT_MODEL)")
  macros = [f"{macro} = {value!r}" for macro, value in (
      ("TARGET_MODEL", args.target_model), ("DRAFT_MODEL", args.draft_model),
      ("TARGET_CHECKPOINT", args.target), ("DRAFT_CHECKPOINT", args.draft),
      ("PAIR_TASK", args.task)) if value]
  gin_config.parse(gin_files, [*macros, *bindings], paths)
  pair = pair_from_gin(seed)
  return dataclasses.replace(pair, name=f"{args.target} / {args.draft}")


def bench_pair(pair: Pair, inputs: np.ndarray, args) -> List[Dict[str, Any]]:
  """One row per beam size: calls, walltimes and whether the beams agree."""
  rows = []
  for w in args.beam_sizes:
    u = args.draft_factor * w
    same = dict(beam_size=w, max_new_tokens=args.max_new_tokens, alpha=args.alpha)
    t = timing.interleaved({
        "beam": lambda: beam_search(pair.target, pair.target_params, inputs, **same),
        "spec": lambda: speculative_beam_search(
            pair.target, pair.target_params, pair.draft, pair.draft_params, inputs,
            draft_beam_size=u, gamma=args.gamma, **same)}, args.repeats)
    plain_out, spec_out = t.outputs["beam"], t.outputs["spec"]
    steps = int(np.sum(plain_out.target_calls))
    rounds = int(np.sum(spec_out.target_calls))
    rows.append(dict(
        pair=pair.name, w=w, u=u, gamma=args.gamma, examples=len(inputs),
        beam_calls=steps / len(inputs), spec_calls=rounds / len(inputs),
        saved=1 - rounds / max(steps, 1), steps_per_round=steps / max(rounds, 1),
        draft_calls=float(np.mean(spec_out.draft_calls)), beam_s=t.median("beam"),
        spec_s=t.median("spec"), speedup=t.median("beam") / max(t.median("spec"), 1e-9),
        compile_beam_s=t.compile_s["beam"], compile_spec_s=t.compile_s["spec"],
        identical=bool(np.array_equal(plain_out.sequences, spec_out.sequences)
                       and np.allclose(plain_out.scores, spec_out.scores, atol=1e-4))))
  return rows


COLUMNS = {  # header -> the cell of a row
    "pair": lambda r: r["pair"], "w": lambda r: r["w"], "u": lambda r: r["u"],
    "γ": lambda r: r["gamma"], "target calls: beam": lambda r: f"{r['beam_calls']:.2f}",
    "speculative": lambda r: f"{r['spec_calls']:.2f}",
    "saved": lambda r: f"{100 * r['saved']:.0f}%",
    "steps/round": lambda r: f"{r['steps_per_round']:.2f}",
    "draft calls": lambda r: f"{r['draft_calls']:.1f}", "beam s": lambda r: f"{r['beam_s']:.3f}",
    "spec s": lambda r: f"{r['spec_s']:.3f}", "speedup": lambda r: f"{r['speedup']:.2f}x",
    "compile beam s": lambda r: f"{r['compile_beam_s']:.1f}",
    "compile spec s": lambda r: f"{r['compile_spec_s']:.1f}",
    "same beams": lambda r: "yes" if r["identical"] else "NO",
}


FLAGS = {"--target": dict(help="target T5X checkpoint (default: random-init pairs)"),
         "--draft": dict(help="draft T5X checkpoint"),
         "--target_model": dict(help="target model gin file, e.g. models/t5_1_1_large.gin"),
         "--draft_model": dict(help="draft model gin file"),
         "--task": dict(default=TASK, help="bundled task for the inputs"),
         "--num_examples": dict(type=int, default=8),
         "--max_input_len": dict(type=int, default=48),
         "--beam_sizes": dict(type=int, nargs="+", default=[2, 3, 5]),
         "--draft_factor": dict(type=int, default=2, help="u = draft_factor * w"),
         "--gamma": dict(type=int, default=3), "--max_new_tokens": dict(type=int, default=16),
         "--alpha": dict(type=float, default=0.6),
         "--repeats": dict(type=int, default=1,
                           help="timed runs of each search (median), interleaved"),
         "--noise": dict(type=float, default=0.02,
                         help="random pairs: the close draft's relative weight noise")}
FAST = dict(num_examples=1, beam_sizes=[2], max_new_tokens=4, gamma=2)


def main(argv=None) -> List[Dict[str, Any]]:
  cli = parse_cli(argv, __doc__, "bench_beam", needs_pairs=False, flags=FLAGS, fast=FAST,
                  weights_dtype=None)
  args = cli.args
  check_counts(num_examples=args.num_examples, max_input_len=args.max_input_len,
               beam_sizes=args.beam_sizes, draft_factor=args.draft_factor, gamma=args.gamma,
               max_new_tokens=args.max_new_tokens, repeats=args.repeats)
  pairs = ([checkpoint_pair(args, cli.seed, *cli.gin)] if args.target
           else random_pairs(cli.seed, args.noise))
  rows = []
  for pair in pairs:
    ex = load_examples(dataclasses.replace(pair, task=args.task), args.num_examples,
                       args.max_input_len, prompt_words=PROMPT_WORDS)
    rows += bench_pair(pair, ex.inputs, args)
  return write(cli, "bench_beam", [{h: cell(r) for h, cell in COLUMNS.items()} for r in rows],
               "Beam search vs speculative beam search", [
                   f"{args.num_examples} examples of {args.task}, max_new_tokens="
                   f"{args.max_new_tokens}, alpha={args.alpha}; calls are per example"],
               pairs=pairs, measured=rows)


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
