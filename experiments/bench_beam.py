"""Target calls and walltime: beam search vs speculative beam search (paper A.4).

  python -m experiments.bench_beam                       # random-init tiny T5 pairs
  python -m experiments.bench_beam --target /ckpt/t5_large/checkpoint_N \\
      --target_model models/t5_1_1_large.gin --draft /ckpt/t5_small/checkpoint_M \\
      --draft_model models/t5_1_1_small.gin --task translate_en_de \\
      [--gin.draft/T5Config.num_decoder_layers=4 ...]

For each pair and each beam size w (default 2, 3, 5) it runs `beam_search` on
the target alone and `speculative_beam_search` with u = draft_factor * w, checks
that both return the same beams, and prints a markdown table: target calls per
example, the share saved, steps per round, walltimes (compilation timed apart,
on a first call) and the speedup. A speculative round scores w + γ * u rows of
γ + 1 tokens where a plain step scores w tokens: on a CPU, where a call costs
its arithmetic, the walltime shows that cost; the saving in calls is what pays
off where a call costs its memory traffic (large models on accelerators).
Random-init pairs: "close" perturbs the target's weights by --noise (2%: a
draft that mostly agrees with the target), "1-layer" is an independent smaller
random model (no agreement: the worst case).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, List, Sequence

import jax
import numpy as np

from specjax.app import gin_config
from specjax.decode import beam_search, speculative_beam_search
from specjax.checkpoints import load_t5x_for_model
from specjax.data import load_bundled
from specjax.app import encode_inputs
from specjax.models import DecoderOnlyConfig, DecoderOnlyModel, T5Config, T5Model
from specjax.data import load_vocab

TINY = dict(vocab_size=8192, emb_dim=64, num_heads=4, head_dim=16, mlp_dim=128)


def _model(config):
  return DecoderOnlyModel(config) if isinstance(config, DecoderOnlyConfig) else T5Model(config)


def random_pairs(seed: int, noise: float) -> List[Dict[str, Any]]:
  """Two random-init tiny T5 pairs over the bundled 8k vocabulary (models/specjax_tiny_t5.gin)."""
  target = T5Model(T5Config(num_encoder_layers=2, num_decoder_layers=2, **TINY))
  params = target.init(seed)
  rng = np.random.default_rng(seed + 1)
  close = jax.tree.map(
      lambda x: x + noise * np.std(x) * rng.normal(size=x.shape).astype(np.float32), params)
  small = T5Model(T5Config(num_encoder_layers=1, num_decoder_layers=1, **TINY))
  return [dict(name=f"tiny T5 / close ({100 * noise:g}% noise)", target=target,
               target_params=params,
               draft=target, draft_params=close),
          dict(name="tiny T5 / 1-layer random", target=target, target_params=params,
               draft=small, draft_params=small.init(seed + 2))]


def checkpoint_pair(args, gin_files: Sequence[str], bindings: Sequence[str],
                    paths: Sequence[str]) -> Dict[str, Any]:
  """The pair given by --target/--draft checkpoints and their model gin files.

  The model files are read under the gin scopes target/ and draft/ (as by
  `specjax.main`), so `--gin.draft/T5Config.num_decoder_layers=4` overrides a size.
  """
  if not args.draft:
    raise SystemExit("--target needs --draft (and --target_model / --draft_model, e.g. "
                     "models/t5_1_1_small.gin, unless gin binds TARGET_MODEL / DRAFT_MODEL)")
  models = [f"{macro} = '{path}'" for macro, path in (("TARGET_MODEL", args.target_model),
                                                        ("DRAFT_MODEL", args.draft_model)) if path]
  gin_config.parse(gin_files, [*models, *bindings], paths)
  pair = {"name": f"{args.target} / {args.draft}"}
  for scope, path in (("target", args.target), ("draft", args.draft)):
    model = _model(gin_config.model_config(scope))
    pair[scope] = model
    pair[f"{scope}_params"] = jax.tree.map(jax.numpy.asarray,
                                           load_t5x_for_model(path, model, dtype="float32"))
  return pair


def _timed(fn):
  start = time.perf_counter()
  out = fn()
  jax.block_until_ready(out.sequences)
  return out, time.perf_counter() - start


def bench_pair(pair: Dict[str, Any], inputs: np.ndarray, args) -> List[Dict[str, Any]]:
  """One row per beam size: calls, walltimes and whether the beams agree."""
  rows = []
  for w in args.beam_sizes:
    u = args.draft_factor * w
    common = dict(beam_size=w, max_new_tokens=args.max_new_tokens, alpha=args.alpha)
    plain = lambda: beam_search(pair["target"], pair["target_params"], inputs, **common)
    spec = lambda: speculative_beam_search(
        pair["target"], pair["target_params"], pair["draft"], pair["draft_params"], inputs,
        draft_beam_size=u, gamma=args.gamma, **common)
    plain_first, spec_first = _timed(plain)[1], _timed(spec)[1]  # compile + one run
    plain_out, plain_s = _timed(plain)
    spec_out, spec_s = _timed(spec)
    steps = int(np.sum(plain_out.target_calls))
    rounds = int(np.sum(spec_out.target_calls))
    rows.append(dict(
        pair=pair["name"], w=w, u=u, gamma=args.gamma, examples=len(inputs),
        beam_calls=steps / len(inputs), spec_calls=rounds / len(inputs),
        saved=1 - rounds / max(steps, 1), steps_per_round=steps / max(rounds, 1),
        draft_calls=float(np.mean(spec_out.draft_calls)), beam_s=plain_s, spec_s=spec_s,
        speedup=plain_s / max(spec_s, 1e-9), compile_beam_s=max(plain_first - plain_s, 0.0),
        compile_spec_s=max(spec_first - spec_s, 0.0),
        identical=bool(np.array_equal(plain_out.sequences, spec_out.sequences)
                       and np.allclose(plain_out.scores, spec_out.scores, atol=1e-4))))
  return rows


def markdown(rows: List[Dict[str, Any]]) -> str:
  """The results as a markdown table."""
  head = ("| pair | w | u | γ | target calls: beam | speculative | saved | steps/round | "
          "draft calls | beam s | spec s | speedup | compile beam s | compile spec s | "
          "same beams |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for r in rows:
    lines.append(
        f"| {r['pair']} | {r['w']} | {r['u']} | {r['gamma']} | {r['beam_calls']:.2f} | "
        f"{r['spec_calls']:.2f} | {100 * r['saved']:.0f}% | {r['steps_per_round']:.2f} | "
        f"{r['draft_calls']:.1f} | {r['beam_s']:.3f} | {r['spec_s']:.3f} | "
        f"{r['speedup']:.2f}x | {r['compile_beam_s']:.1f} | {r['compile_spec_s']:.1f} | "
        f"{'yes' if r['identical'] else 'NO'} |")
  return "\n".join(lines)


def main(argv=None) -> List[Dict[str, Any]]:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--target", help="target T5X checkpoint (default: random-init pairs)")
  parser.add_argument("--draft", help="draft T5X checkpoint")
  parser.add_argument("--target_model", help="target model gin file, e.g. models/t5_1_1_large.gin")
  parser.add_argument("--draft_model", help="draft model gin file")
  parser.add_argument("--task", default="translate_en_de", help="bundled task for the inputs")
  parser.add_argument("--num_examples", type=int, default=8)
  parser.add_argument("--max_input_len", type=int, default=48)
  parser.add_argument("--beam_sizes", default="2,3,5")
  parser.add_argument("--draft_factor", type=int, default=2, help="u = draft_factor * w")
  parser.add_argument("--gamma", type=int, default=3)
  parser.add_argument("--max_new_tokens", type=int, default=16)
  parser.add_argument("--alpha", type=float, default=0.6)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--noise", type=float, default=0.02,
                      help="random pairs: the close draft's relative weight noise")
  parser.add_argument("--output", help="also write the rows as JSON lines here")
  gin_files, bindings, paths, rest = gin_config.split_gin_args(
      sys.argv[1:] if argv is None else argv)
  args = parser.parse_args(rest)
  args.beam_sizes = [int(w) for w in args.beam_sizes.split(",") if w]
  pairs = ([checkpoint_pair(args, gin_files, bindings, paths)] if args.target
           else random_pairs(args.seed, args.noise))
  examples = load_bundled(args.task)[:args.num_examples]
  texts = [e[0] if isinstance(e, (tuple, list)) else e for e in examples]
  rows = []
  for pair in pairs:
    inputs = encode_inputs(load_vocab(), texts, pair["target"].is_encoder_decoder,
                           args.max_input_len)
    rows += bench_pair(pair, inputs, args)
  print(f"{jax.devices()[0].platform}, {len(texts)} examples of {args.task}, "
        f"max_new_tokens={args.max_new_tokens}, alpha={args.alpha}; calls are per example")
  print(markdown(rows))
  if args.output:
    with open(args.output, "w", encoding="utf-8") as f:
      for r in rows:
        f.write(json.dumps(r) + "\n")
  return rows


if __name__ == "__main__":
  main()
