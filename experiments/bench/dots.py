"""Which weight dtype runs a dense dot fastest on this machine: float32, bfloat16, int8.

    python -m experiments.bench.dots [--rows 1 2 6 48] [--dots 200] [--passes 7]
        [--output_dir DIR]

What it runs, its columns and settings: docs/experiments.md, section "bench.dots".
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.checks import check_counts
from experiments.common.cli import parse_cli
from experiments.common.output import write
from specjax import machine, timing
from specjax.command import run_cli
from specjax.models.layers import project
from specjax.params import quantize

SHAPES = {"attention 384x384": (384, 384, False), "mlp in 384x1024": (384, 1024, False),
          "mlp out 1024x384": (1024, 384, False), "logits 8192x384ᵀ": (8192, 384, True)}
"""name -> (weight rows, weight columns, transposed): the bundled LM target's dense weights."""
DTYPES = ("float32", "bfloat16", "int8")


def weights(rows: int, cols: int, transposed: bool, dtype: str, seed: int = 0):
  """(w, scales or None) in `dtype` ('int8': `specjax.params.quantize`, one scale per output)."""
  w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
  if dtype == "int8":
    values, scales = quantize(w, 0 if transposed else 1)
    return jnp.asarray(values), jnp.asarray(scales)
  return jnp.asarray(w, jnp.bfloat16 if dtype == "bfloat16" else jnp.float32), None


def dot_loop(w, scales, transposed: bool, m: int, dots: int):
  """A zero-argument jitted loop of `dots` products x [m, in] @ w through `project`, each
  input depending on the last output (nothing hoisted or dropped)."""
  width = w.shape[1] if transposed else w.shape[0]
  x0 = jnp.asarray(np.random.default_rng(1).standard_normal((m, width)), jnp.float32)

  @jax.jit
  def run(x):
    def body(_, x):
      out = project(x, w, transposed=transposed, scales=scales)
      return x + 1e-6 * jnp.sum(out, axis=-1, keepdims=True)
    return jax.lax.fori_loop(0, dots, body, x)

  return lambda: run(x0)


def measure(rows: Sequence[int], dots: int, passes: int) -> List[Dict]:
  """One row per (shape, M): µs per dot of each dtype and its ratio to float32's."""
  out = []
  for name, (r, c, transposed) in SHAPES.items():
    made = {d: weights(r, c, transposed, d) for d in DTYPES}
    for m in rows:
      fns = {d: dot_loop(*made[d], transposed, m, dots) for d in DTYPES}
      t = timing.interleaved(fns, passes)
      us = {d: t.median(d) / dots * 1e6 for d in DTYPES}
      row = {"weights": name, "rows": m}
      for d in DTYPES:
        row[f"{d}_us"] = us[d]
      for d in DTYPES[1:]:
        row[f"{d}_vs_float32"] = us[d] / us["float32"]
      row["fastest"] = min(DTYPES, key=us.get)
      out.append(row)
  return out


FLAGS = {"--rows": dict(type=int, nargs="+", default=[1, 2, 6, 48]),
         "--dots": dict(type=int, default=200), "--passes": dict(type=int, default=7)}


def main(argv: Optional[Sequence[str]] = None) -> List[Dict]:
  cli = parse_cli(argv, __doc__, "bench_dots", needs_pairs=False, flags=FLAGS, weights_dtype=None)
  args = cli.args
  check_counts(rows=tuple(args.rows), dots=args.dots, passes=args.passes)
  return write(cli, "bench_dots", measure(args.rows, args.dots, args.passes),
               "Dense dots by weight dtype", [
                   f"µs per dot, median of {args.passes} interleaved passes of a jitted loop of "
                   f"{args.dots} dots; *_vs_float32: that dtype's time over float32's (< 1: "
                   "faster)"], machine=machine.describe())


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
