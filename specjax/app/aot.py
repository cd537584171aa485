"""`python -m specjax.aot`: a decode compiled for an accelerator this host does not have, read.

    python -m specjax.aot                                   # the bundled LM pair, H200 and TPU v5e
    python -m specjax.aot --target h100 --target tpu-v6e \\
        --model models/decoder_only_large.gin --draft models/decoder_only_small.gin \\
        --pieces steps --output_dir docs/results/aot/decoder_only_large
    python -m specjax.aot --target tpu-v5e --devices 4 \
        --model models/gemma3_27b.gin --draft models/gemma3_270m.gin --pieces steps

Models: a model gin file on the search path (gin/models/*.gin) or 'bundled:PAIR/ROLE'; both
random-init and abstract (no weights are read or allocated). For every compiled piece
(`specjax.aot.report.model_pieces`) one row: kernels per iteration and per layer, weight-shaped
float32 temporaries and the bytes they move, the floor (weights + KV cache), nested loops and
custom calls, XLA's memory analysis (on a TPU its cost analysis too), and the step-time model's prediction
(`specjax.aot.cost`: each iteration's ms and % of roofline; per accelerator the target and
draft steps, c and Thm 3.8's speedup at --alpha and --gamma). Writes aot.json and aot.md to
--output_dir when given. --devices N splits both models over N devices of each accelerator (the
project's `Partitioner`: heads, MLP and vocabulary over a 'model' axis; a TPU's N chips of a
slice, N GPUs of one host); every figure is then one device's. Needs the `aot` extra (`pip install 'specjax[aot]'`); the process's own
JAX backend is the CPU (unless JAX_PLATFORMS says otherwise).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence

from specjax import command, files

DEFAULT_TARGETS = ("h200", "tpu-v5e")
DTYPES = ("float32", "bfloat16", "int8")
PIECES = ("steps", "loops")
MAX_DEVICES = 16  # specjax.aot.targets.MAX_DEVICES (not imported: the parser needs no JAX)
COLUMNS = ("target", "devices", "piece", "kernels", "per_layer", "f32_temps", "f32_temp_MB", "floor_MB",
           "whiles", "custom_calls", "pred_ms", "pct_of_roofline", "compile_s")


def parse_args(argv: Sequence[str]):
  """The command line (module docstring)."""
  parser = command.ArgumentParser(prog="python -m specjax.aot", description=__doc__.split("\n")[0])
  parser.add_argument("--target", action="append", default=None,
                      help=f"an accelerator (repeatable; default {' '.join(DEFAULT_TARGETS)})")
  parser.add_argument("--devices", type=int, default=1,
                      help="devices of each accelerator the models are split over (default 1)")
  parser.add_argument("--model", default="bundled:lm/target",
                      help="the target's model gin file or bundled:PAIR/ROLE")
  parser.add_argument("--draft", default="bundled:lm/draft",
                      help="the draft's model gin file or bundled:PAIR/ROLE")
  parser.add_argument("--dtype", default="bfloat16", choices=DTYPES[:2],
                      help="the target's weight dtype")
  parser.add_argument("--draft_dtype", default="float32", choices=DTYPES,
                      help="the draft's (and the feature head's, unless float32) weight dtype")
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--input_len", type=int, default=16)
  parser.add_argument("--max_new_tokens", type=int, default=64)
  parser.add_argument("--gamma", type=int, default=4)
  parser.add_argument("--alpha", type=float, default=0.75,
                      help="the pair's acceptance rate for the predicted speedup (Thm 3.8)")
  parser.add_argument("--pieces", nargs="+", default=list(PIECES), choices=PIECES)
  parser.add_argument("--unroll", action="store_true",
                      help="the drafters draft unrolled (no loop per guess or tree level)")
  parser.add_argument("--output_dir", default=None, help="writes aot.json and aot.md there")
  parser.add_argument("--verbose", action="store_true", help="tracebacks for errors")
  args = parser.parse_args(list(argv))
  if not 1 <= args.devices <= MAX_DEVICES:
    parser.error(f"--devices must be from 1 to {MAX_DEVICES}, got {args.devices}")
  for name in ("batch", "input_len", "max_new_tokens", "gamma"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
  if args.gamma > args.max_new_tokens:
    parser.error(f"--gamma {args.gamma} exceeds --max_new_tokens {args.max_new_tokens}: a round "
                 "emits at most the budget, so more guesses are never played")
  if args.output_dir and os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
    parser.error(f"--output_dir {args.output_dir} is a file, not a folder")
  if not 0 <= args.alpha <= 1:
    parser.error(f"--alpha must be in [0, 1], got {args.alpha}")
  return args


def compile_row(report, piece, name: str, devices: int = 1) -> Dict[str, Any]:
  """`report.compile_piece(piece, name, devices)`'s row; a program that does not fit the
  accelerator's memory (XLA's RESOURCE_EXHAUSTED) is one ValueError saying what does not fit."""
  try:
    return report.compile_piece(piece, name, devices)[0].row()
  except Exception as e:  # pylint: disable=broad-except  # XLA's errors carry no type
    text = str(e)
    if "RESOURCE_EXHAUSTED" not in text:
      raise
    detail = next((line.strip() for line in text.splitlines()
                   if "memory" in line.lower() and any(ch.isdigit() for ch in line)),
                  text.strip().splitlines()[0])
    split = f" split over {devices}" if devices > 1 else ""
    raise ValueError(f"{piece.name}{split} does not fit one {name} device's memory "
                     f"({detail[:300]}): use more --devices, a smaller --batch, --input_len or "
                     "--max_new_tokens, a smaller --dtype, or an accelerator with more "
                     "memory") from None


def predictions(rows: List[Dict[str, Any]], alpha: float, gamma: int) -> Dict[str, Any]:
  """{accelerator: `specjax.aot.cost.prediction`} from each one's target and draft step rows
  (the step-time model's `pred_ms`); {} without the steps."""
  from specjax.aot import cost  # pylint: disable=import-outside-toplevel
  steps: Dict[str, Dict[str, float]] = {}
  for r in rows:
    if r["piece"] in ("target step", "draft step") and "pred_ms" in r:
      steps.setdefault(r["target"], {})[r["piece"]] = r["pred_ms"]
  return {name: cost.prediction(s["target step"], s["draft step"], alpha, gamma)
          for name, s in steps.items() if len(s) == 2}


def markdown(rows: List[Dict[str, Any]]) -> str:
  """The rows as a markdown table of `COLUMNS` (and the TPU's compiler figures, if any)."""
  extra = sorted({k for r in rows for k in r if k.startswith("xla_")})
  columns = list(COLUMNS) + extra
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
  return "\n".join(lines) + "\n"


def prediction_line(name: str, p: Dict[str, Any]) -> str:
  """One accelerator's prediction (`predictions`) in a line."""
  curve = ", ".join(f"{g}: {x}x" for g, x in p["speedup_by_gamma"].items())
  return (f"{name}: target step {p['target_step_ms']} ms, draft step {p['draft_step_ms']} ms, "
          f"c = {p['c']}; speedup at alpha {p['alpha']}, gamma {p['gamma']}: {p['speedup']}x "
          f"(by gamma: {curve})")


def run(argv: Sequence[str]) -> int:
  """The command: prints one row per (accelerator, piece), as it compiles."""
  args = parse_args(argv)
  from specjax.aot import report, targets  # pylint: disable=import-outside-toplevel
  targets.cpu_host()
  from specjax.app.gin_config import model_config_from_file  # pylint: disable=import-outside-toplevel
  from specjax.models import build_model, check_same_vocab  # pylint: disable=import-outside-toplevel
  names = args.target or list(DEFAULT_TARGETS)
  for name in names:
    targets.devices(name, args.devices)  # an unknown name, a missing compiler: one line, first
  if args.output_dir:
    files.check_destination(os.path.join(args.output_dir, "aot.json"), "the report")
    os.makedirs(args.output_dir, exist_ok=True)
  target_cfg = dataclasses.replace(model_config_from_file(args.model), dtype=args.dtype)
  target = build_model(target_cfg)
  draft = build_model(model_config_from_file(args.draft))
  check_same_vocab(target, draft.vocab_size)
  pieces = report.model_pieces(target, draft, dtype=args.dtype, draft_dtype=args.draft_dtype,
                               batch=args.batch, input_len=args.input_len,
                               max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                               include=args.pieces, unroll=args.unroll)
  rows = []
  print(" | ".join(COLUMNS), flush=True)
  for name in names:
    for piece in pieces:
      row = compile_row(report, piece, name, args.devices)
      rows.append(row)
      print(" | ".join(str(row.get(c, "")) for c in COLUMNS), flush=True)
  predicted = predictions(rows, args.alpha, args.gamma)
  lines = [prediction_line(name, p) for name, p in predicted.items()]
  for line in lines:
    print(line, flush=True)
  if args.output_dir:
    arguments = dict(targets=names, devices=args.devices, model=args.model, draft=args.draft, dtype=args.dtype,
                     draft_dtype=args.draft_dtype, batch=args.batch, input_len=args.input_len,
                     max_new_tokens=args.max_new_tokens, gamma=args.gamma, pieces=args.pieces,
                     unroll=args.unroll, alpha=args.alpha)
    from specjax.aot import cost  # pylint: disable=import-outside-toplevel
    files.write_json(os.path.join(args.output_dir, "aot.json"),
                     {"arguments": arguments, "jax": jax_version(), "rows": rows,
                      "prediction": predicted,
                      "model_constants": dataclasses.asdict(cost.FITTED)})
    files.write_file(os.path.join(args.output_dir, "aot.md"), markdown(rows) + "".join(
        f"\n{line}\n" for line in lines))
  return 0


def jax_version() -> str:
  """'jax X, jaxlib Y' of this process."""
  import jax  # pylint: disable=import-outside-toplevel
  import jaxlib  # pylint: disable=import-outside-toplevel
  return f"jax {jax.__version__}, jaxlib {jaxlib.__version__}"


def cli(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m specjax.aot` with the project's command contract (`specjax.command`)."""
  return command.run_cli(run, argv)
