"""The sampler's cost: `categorical`'s two-stage draw beside one race over the vocabulary.

    python -m experiments.bench.sampler [--batches 1 8] [--examples 6] [--new_tokens 128]
        [--gamma 3] [--repeats 5] [--weights_dtype bfloat16] [--pair lm] [--output_dir DIR]

What it runs, its columns and settings: docs/experiments.md, section "bench.sampler".
"""
from __future__ import annotations

import functools
import contextlib
from typing import Dict, List, Optional, Sequence
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.cli import parse_cli
from experiments.common.compare import compare
from experiments.common.decoding import Decoders, decode_config
from experiments.common.inputs import load_examples
from experiments.common.output import Output, markdown_table
from experiments.common.pairs import Pair
from specjax import sampling, timing
from specjax.command import run_cli

# Every module that calls `categorical` by the name it imported.
_DRAWING_MODULES = ("specjax.sampling", "specjax.verify.step", "specjax.verify.block",
                    "specjax.draft.base", "specjax.verify.fused_kernel")
SAMPLERS = {"two-stage": sampling.categorical, "one race": sampling.race}


@contextlib.contextmanager
def drawing_with(sampler):
  """Traces (and so compiles) everything inside with `sampler` as `categorical`."""
  import importlib  # pylint: disable=import-outside-toplevel
  with contextlib.ExitStack() as stack:
    for name in _DRAWING_MODULES:
      module = importlib.import_module(name)
      if hasattr(module, "categorical"):
        stack.enter_context(mock.patch.object(module, "categorical", sampler))
    yield


def draw_loop(sampler, batch: int, vocab: int, draws: int = 200):
  """A zero-argument jitted loop of `draws` draws from [batch, vocab] weights (compiles on its
  first call)."""
  weights = jax.nn.softmax(jnp.asarray(np.random.default_rng(0).normal(size=(batch, vocab)) * 3,
                                       jnp.float32))

  @jax.jit
  def loop(w):
    def body(i, acc):  # the carry feeds the weights, so no draw is hoisted out of the loop
      return acc + sampler(jax.random.fold_in(jax.random.PRNGKey(0), i),
                           w + 0 * acc.astype(jnp.float32)).sum()
    return jax.lax.fori_loop(0, draws, body, jnp.int32(0))
  return lambda: loop(weights)


def micro(batches: Sequence[int], vocabs: Sequence[int], repeats: int = 7,
          draws: int = 200) -> List[Dict]:
  """Median µs of one draw per sampler, (V, B) by (V, B), the samplers interleaved."""
  rows = []
  for vocab in vocabs:
    for batch in batches:
      t = timing.interleaved({name: draw_loop(fn, batch, vocab, draws)
                              for name, fn in SAMPLERS.items()}, repeats)
      us = {name: t.median(name) / draws * 1e6 for name in SAMPLERS}
      rows.append({"V": vocab, "B": batch, "one race µs": round(us["one race"], 1),
                   "two-stage µs": round(us["two-stage"], 1),
                   "ratio": round(us["one race"] / us["two-stage"], 1)})
  return rows


def _drawing(sampler, decode, row):
  with drawing_with(sampler):
    return decode(row)


def end_to_end(pair: Pair, *, examples: int, new_tokens: int, gamma: int,
               repeats: int) -> List[Dict]:
  ex = load_examples(pair, examples, max_input_len=48)
  runs = {}
  for i, (name, sampler) in enumerate(SAMPLERS.items()):
    # A cache one slot longer per sampler: a different static config, so its own trace.
    d = Decoders(pair, new_tokens,
                 decode_config(1.0, ex.inputs.shape[1] + new_tokens + gamma + 1 + i))
    for kind, decode in (("ar", d.autoregressive()), ("spec", d.model_chain(gamma))):
      runs[f"{kind} {name}"] = functools.partial(_drawing, sampler, decode)
  compared = compare(runs, ex.inputs, repeats)
  result = {r["decoder"]: r for r in compared.rows()}
  # Both samplers are exact but draw different tokens from the same key: equal tokens would
  # mean a variant was not traced with its own sampler (a cached inner trace).
  for kind in ("ar", "spec"):
    first = [np.asarray(compared.first[f"{kind} {name}"].tokens) for name in SAMPLERS]
    if np.array_equal(*first):
      raise RuntimeError(f"{kind}: the two samplers drew the same tokens; the patch did not take")
  rows = []
  for name in SAMPLERS:
    ar, spec = result[f"ar {name}"], result[f"spec {name}"]
    rows.append({
        "sampler": name,
        "AR ms/token": round(ar["ms_per_token"], 3),
        f"spec γ={gamma} ms/token": round(spec["ms_per_token"], 3),
        "speedup": round(ar["ms_per_token"] / spec["ms_per_token"], 3),
        "α": round(spec["alpha"], 3),
        "compile AR / spec s": f"{ar['compile_s']:.1f} / {spec['compile_s']:.1f}",
    })
  return rows


FLAGS = {"--batches": dict(type=int, nargs="+", default=[1, 8]),
         "--vocabs": dict(type=int, nargs="+", default=[8192, 32768]),
         "--examples": dict(type=int, default=6), "--new_tokens": dict(type=int, default=128),
         "--gamma": dict(type=int, default=3), "--repeats": dict(type=int, default=5)}


def main(argv: Optional[Sequence[str]] = None) -> None:
  cli = parse_cli(argv, __doc__, "bench_sampler", default_pairs=("lm",), flags=FLAGS,
                  weights_dtype="bfloat16")
  f = cli.flags
  text = ("One draw (jitted loop of 200, median of 7)\n\n"
          + markdown_table(micro(f["batches"], f["vocabs"])))
  for pair in cli.pairs:
    text += (f"\n\n{pair.label}, batch 1, T = 1, "
             f"{f['examples']} prompts × {f['new_tokens']} tokens, median of {f['repeats']} "
             "interleaved runs\n\n"
             + markdown_table(end_to_end(pair, examples=f["examples"], new_tokens=f["new_tokens"],
                                         gamma=f["gamma"], repeats=f["repeats"])))
  print(text)
  Output(cli.output_dir, "bench_sampler").markdown(text)


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
