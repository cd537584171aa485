"""`python -m specjax.aot`: a decode compiled for an accelerator this host does not have, read.

    python -m specjax.aot --target tpu-v5e --target h100    # speedup curves of PAIRS
    python -m specjax.aot --target h100 --target tpu-v6e \\
        --model models/decoder_only_large.gin --draft models/decoder_only_small.gin \\
        --pieces steps --output_dir docs/results/aot/decoder_only_large
    python -m specjax.aot --target tpu-v5e --devices 4 \
        --model models/gemma3_27b.gin --draft models/gemma3_270m.gin --pieces steps

Without --model and --draft: the speedup curves of `PAIRS` (the bundled pairs and the paper's
T5 1.1 XXL pair), each from its target's and draft's steps at its own α and γ (--alpha, --gamma,
--input_len, --draft_dtype, where given, for all). Models: a model gin file on the search
path (gin/models/*.gin) or 'bundled:PAIR/ROLE'; both random-init and abstract (no weights
are read or allocated). For every compiled piece (`specjax.aot.report.model_pieces`) one row: kernels per iteration and per layer, weight-shaped
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
from typing import Any, Dict, List, Optional, Sequence, Tuple

from specjax import command, files

DEFAULT_TARGETS = ("h200", "tpu-v5e")


@dataclasses.dataclass(frozen=True)
class Pair:
  """A target and draft whose speedup curve the command predicts by default."""
  label: str
  model: str
  draft: str
  draft_dtype: str
  alpha: float
  """Its acceptance rate: the bundled pairs' measured on the CPU (README's results, T = 0),
  the paper's pair's from its Table 2."""
  gamma: int
  input_len: int
  head: Optional[str] = None
  """A trained feature head of the target (a folder or 'bundled:PAIR/ROLE'): its step is
  compiled too, from its model.gin (`report.model_pieces`' head_config)."""
  head_tokens: Tuple[Tuple[int, float], ...] = ()
  """(γ, tokens per target call) of that head's chain, measured greedily on the CPU (they do
  not depend on the hardware): the head's predicted speedup (`cost.head_prediction`)."""
  head_vocab: Optional[int] = None
  """The ids the head drafts over (its chain's `vocab_limit`; None: all the target's): the
  rows of the output projection each guess reads."""


PAIRS = (
    Pair("bundled LM", "bundled:lm/target", "bundled:lm/draft", "float32", 0.70, 4, 16,
         head="bundled:lm/eagle3", head_vocab=1024,
         head_tokens=((2, 2.68), (3, 3.43), (4, 4.09), (5, 4.64), (7, 5.59))),
    Pair("bundled EN-DE", "bundled:translate/target", "bundled:translate/draft", "float32",
         0.51, 4, 16, head="bundled:translate/eagle3", head_vocab=1024,
         head_tokens=((1, 1.55), (2, 1.80), (3, 1.93), (4, 2.00), (5, 2.05), (7, 2.07))),
    Pair("paper: T5 1.1 XXL, T5 1.1 small draft", "models/t5_1_1_xxl.gin",
         "models/t5_1_1_small.gin", "bfloat16", 0.75, 7, 64))
"""The pairs without --model and --draft: the target's and the draft's steps of each
(Leviathan et al.'s Table 2 pair: T5-XXL EN→DE with T5-small, γ = 7, on the T5 1.1 sizes, 64
input tokens, both in bfloat16), and the bundled pairs' EAGLE-3-style heads' steps with their
chains' tokens per target call: greedy, 64 bundled inputs, drafting over the 1024 most
frequent ids, bfloat16 kernels (`python -m experiments.bench.eagle --heads ... --examples 64`;
the LM's 128 tokens with EOS ignored, as its main-job run decodes and its head was trained,
EN→DE's to each translation's EOS, `--stop_at_eos`; docs/feature_drafts.md)."""
PAIR_PIECES = ("target step", "draft step")
DTYPES = ("float32", "bfloat16", "int8")
PIECES = ("steps", "loops")
MAX_DEVICES = 16  # specjax.aot.targets.MAX_DEVICES (not imported: the parser needs no JAX)
COLUMNS = ("target", "devices", "piece", "kernels", "per_layer", "f32_temps", "f32_temp_MB", "floor_MB",
           "whiles", "custom_calls", "pred_ms", "pct_of_roofline", "compile_s")


def _head_arguments(parser, args) -> Tuple[Tuple[int, float], ...]:
  """--head, --tokens_per_call and --head_vocab checked (parser.error names a bad one) ->
  the (γ, tokens per target call) given."""
  if args.pairs and (args.head or args.tokens_per_call or args.head_vocab):
    parser.error("--head, --tokens_per_call and --head_vocab need --model or --draft: the "
                 "pairs of PAIRS name their own heads")
  if (args.tokens_per_call or args.head_vocab) and not args.head:
    parser.error("--tokens_per_call and --head_vocab describe a --head: give one")
  tokens: Tuple[Tuple[int, float], ...] = ()
  if args.tokens_per_call:
    try:
      tokens = tuple((int(g), float(e)) for g, e in
                     (item.split(":") for item in args.tokens_per_call.split(",")))
    except ValueError:
      parser.error(f"--tokens_per_call {args.tokens_per_call!r}: give 'GAMMA:TOKENS,...', "
                   "e.g. '4:3.6,7:4.5'")
    for g, e in tokens:
      if g < 1 or not 1 <= e <= g + 1:
        parser.error(f"--tokens_per_call {g}:{e}: a chain of γ {g} emits from 1 to {g + 1} "
                     "tokens per target call")
  if args.head_vocab is not None and args.head_vocab < 1:
    parser.error(f"--head_vocab must be at least 1, got {args.head_vocab}")
  return tokens


def parse_args(argv: Sequence[str]):
  """The command line (module docstring)."""
  parser = command.ArgumentParser(prog="python -m specjax.aot", description=__doc__.split("\n")[0])
  parser.add_argument("--target", action="append", default=None,
                      help=f"an accelerator (repeatable; default {' '.join(DEFAULT_TARGETS)})")
  parser.add_argument("--devices", type=int, default=1,
                      help="devices of each accelerator the models are split over (default 1)")
  parser.add_argument("--model", default=None,
                      help="the target's model gin file or bundled:PAIR/ROLE (default "
                      "bundled:lm/target with --draft; neither: the pairs of PAIRS)")
  parser.add_argument("--draft", default=None,
                      help="the draft's model gin file or bundled:PAIR/ROLE (default "
                      "bundled:lm/draft with --model)")
  parser.add_argument("--dtype", default="bfloat16", choices=DTYPES[:2],
                      help="the target's weight dtype")
  parser.add_argument("--draft_dtype", default=None, choices=DTYPES,
                      help="the draft's (and the feature head's, unless float32) weight dtype")
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--input_len", type=int, default=None, help="default 16")
  parser.add_argument("--max_new_tokens", type=int, default=64)
  parser.add_argument("--gamma", type=int, default=None, help="default 4")
  parser.add_argument("--alpha", type=float, default=None,
                      help="the pair's acceptance rate for the predicted speedup (Thm 3.8; "
                      "default 0.75)")
  parser.add_argument("--head", default=None,
                      help="a trained feature head of the target (a folder or bundled:PAIR/ROLE):"
                      " its step from its model.gin (default: a random head at the target's "
                      "width)")
  parser.add_argument("--tokens_per_call", default=None,
                      help="with --head: its chain's measured tokens per target call as "
                      "'GAMMA:TOKENS,...' (e.g. '4:3.6,7:4.5'): its predicted speedup")
  parser.add_argument("--head_vocab", type=int, default=None,
                      help="with --head: the ids it drafts over (vocab_limit; default all)")
  parser.add_argument("--pieces", nargs="+", default=None, choices=PIECES,
                      help="default both (with --model or --draft)")
  parser.add_argument("--unroll", action="store_true",
                      help="the drafters draft unrolled (no loop per guess or tree level)")
  parser.add_argument("--output_dir", default=None, help="writes aot.json and aot.md there")
  parser.add_argument("--verbose", action="store_true", help="tracebacks for errors")
  args = parser.parse_args(list(argv))
  args.pairs = args.model is None and args.draft is None
  args.head_tokens = _head_arguments(parser, args)
  if args.pairs and (args.pieces or args.unroll):
    parser.error("--pieces and --unroll need --model or --draft: without them the command "
                 "compiles the steps of the pairs of PAIRS")
  if not args.pairs:
    defaults = dict(model="bundled:lm/target", draft="bundled:lm/draft", draft_dtype="float32",
                    input_len=16, gamma=4, alpha=0.75, pieces=list(PIECES))
    for name, value in defaults.items():
      if getattr(args, name) is None:
        setattr(args, name, value)
  if not 1 <= args.devices <= MAX_DEVICES:
    parser.error(f"--devices must be from 1 to {MAX_DEVICES}, got {args.devices}")
  for name in ("batch", "input_len", "max_new_tokens", "gamma"):
    if getattr(args, name) is not None and getattr(args, name) < 1:
      parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
  gamma = args.gamma or max(p.gamma for p in PAIRS)
  if gamma > args.max_new_tokens:
    parser.error(f"--gamma {gamma} exceeds --max_new_tokens {args.max_new_tokens}: a round "
                 "emits at most the budget, so more guesses are never played")
  if args.output_dir and os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
    parser.error(f"--output_dir {args.output_dir} is a file, not a folder")
  if args.alpha is not None and not 0 <= args.alpha <= 1:
    parser.error(f"--alpha must be in [0, 1], got {args.alpha}")
  return args


def compile_row(report, piece, name: str, devices: int = 1,
                traces: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """`report.compile_piece(piece, name, devices, traces=traces)`'s row; a program that does not
  fit the accelerator's memory (XLA's RESOURCE_EXHAUSTED) is one ValueError saying what does not
  fit."""
  try:
    return report.compile_piece(piece, name, devices, traces=traces)[0].row()
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
  steps = _step_ms(rows)
  return {name: cost.prediction(s["target step"], s["draft step"], alpha, gamma)
          for name, s in steps.items() if "target step" in s and "draft step" in s}


def head_predictions(rows: List[Dict[str, Any]], tokens: Sequence[Tuple[int, float]]
                     ) -> Dict[str, Any]:
  """{accelerator: `specjax.aot.cost.head_prediction`} from each one's target and head step
  rows and the head's measured (γ, tokens per target call); {} without them."""
  from specjax.aot import cost  # pylint: disable=import-outside-toplevel
  if not tokens:
    return {}
  return {name: cost.head_prediction(s["target step"], s["head step"], dict(tokens))
          for name, s in _step_ms(rows).items() if "target step" in s and "head step" in s}


def _step_ms(rows: List[Dict[str, Any]]) -> Dict[str, Dict[str, float]]:
  steps: Dict[str, Dict[str, float]] = {}
  for r in rows:
    if r["piece"] in ("target step", "draft step", "head step") and "pred_ms" in r:
      steps.setdefault(r["target"], {})[r["piece"]] = r["pred_ms"]
  return steps


def markdown(rows: List[Dict[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
  """The rows as a markdown table of `columns` (and the TPU's compiler figures, if any)."""
  extra = sorted({k for r in rows for k in r if k.startswith("xla_")})
  columns = list(columns) + extra
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
  return "\n".join(lines) + "\n"


def prediction_line(name: str, p: Dict[str, Any]) -> str:
  """One accelerator's prediction (`predictions`) in a line."""
  curve = ", ".join(f"{g}: {x}x" for g, x in p["speedup_by_gamma"].items())
  return (f"{name}: target step {p['target_step_ms']} ms, draft step {p['draft_step_ms']} ms, "
          f"c = {p['c']}; speedup at alpha {p['alpha']}, gamma {p['gamma']}: {p['speedup']}x "
          f"(by gamma: {curve})")


def head_prediction_line(name: str, head: str, p: Dict[str, Any]) -> str:
  """One accelerator's feature-head prediction (`head_predictions`) in a line."""
  curve = ", ".join(f"{g}: {p['tokens_per_call'][g]} tokens/call -> {x}x"
                    for g, x in p["speedup_by_gamma"].items())
  return (f"{name}: feature head {head}: head step {p['head_step_ms']} ms, target step "
          f"{p['target_step_ms']} ms, c = {p['c']}; speedup {p['speedup']}x at gamma "
          f"{p['gamma']} (by gamma, measured tokens per call: {curve})")


def _pairs(args) -> List[Pair]:
  """The pairs to compile: `PAIRS` (with the arguments given) or the one named."""
  if not args.pairs:
    return [Pair("", args.model, args.draft, args.draft_dtype, args.alpha, args.gamma,
                 args.input_len, head=args.head, head_tokens=args.head_tokens,
                 head_vocab=args.head_vocab)]
  given = {k: getattr(args, k) for k in ("draft_dtype", "alpha", "gamma", "input_len")
           if getattr(args, k) is not None}
  return [dataclasses.replace(p, **given) for p in PAIRS]


def _gpus_first(names: Sequence[str]) -> List[str]:
  """The accelerators in the order they compile: GPUs first, whose traces the TPUs lower again
  (`specjax.aot.report.compile_piece`'s traces)."""
  from specjax.aot import targets  # pylint: disable=import-outside-toplevel
  return sorted(names, key=lambda n: targets.target(n).platform != "gpu")


def run(argv: Sequence[str]) -> int:
  """The command: prints one row per (accelerator, piece), as it compiles, then per pair and
  accelerator the predicted steps, c and speedup curve."""
  args = parse_args(argv)
  from specjax.aot import cost, report, targets  # pylint: disable=import-outside-toplevel
  targets.cpu_host()
  from specjax.app.gin_config import model_config_from_file  # pylint: disable=import-outside-toplevel
  from specjax.models import build_model, check_same_vocab  # pylint: disable=import-outside-toplevel
  names = args.target or list(DEFAULT_TARGETS)
  for name in names:
    targets.devices(name, args.devices)  # an unknown name, a missing compiler: one line, first
  if args.output_dir:
    files.check_destination(os.path.join(args.output_dir, "aot.json"), "the report")
    os.makedirs(args.output_dir, exist_ok=True)
  columns = (("pair",) if args.pairs else ()) + COLUMNS
  print(" | ".join(columns), flush=True)
  results = []
  for pair in _pairs(args):
    target_cfg = dataclasses.replace(model_config_from_file(pair.model), dtype=args.dtype)
    target = build_model(target_cfg)
    draft = build_model(model_config_from_file(pair.draft))
    check_same_vocab(target, draft.vocab_size)
    head_config = None
    if pair.head is not None:
      from specjax.train.checkpoints import read_trained_folder  # pylint: disable=import-outside-toplevel
      head_config = read_trained_folder(pair.head, "feature head")[1]
    pieces = report.model_pieces(target, draft, dtype=args.dtype, draft_dtype=pair.draft_dtype,
                                 batch=args.batch, input_len=pair.input_len,
                                 max_new_tokens=args.max_new_tokens, gamma=pair.gamma,
                                 include=args.pieces or ("steps",), unroll=args.unroll,
                                 head_config=head_config,
                                 vocab_rows=pair.head_vocab or target.vocab_size)
    if args.pairs:
      wanted = PAIR_PIECES + (("head step",) if pair.head is not None else ())
      pieces = [p for p in pieces if p.name in wanted]
    rows, traces = [], {}
    for name in _gpus_first(names):
      for piece in pieces:
        row = compile_row(report, piece, name, args.devices, traces)
        if args.pairs:
          row = {"pair": pair.label, **row}
        rows.append(row)
        print(" | ".join(str(row.get(c, "")) for c in columns), flush=True)
    predicted = predictions(rows, pair.alpha, pair.gamma)
    head_predicted = head_predictions(rows, pair.head_tokens)
    prefix = f"{pair.label}, " if pair.label else ""
    lines = [prefix + prediction_line(name, p) for name, p in predicted.items()]
    lines += [prefix + head_prediction_line(name, pair.head, p)
              for name, p in head_predicted.items()]
    if head_predicted:
      predicted = dict(predicted, feature_head=head_predicted)
    results.append((pair, rows, predicted, lines))
  lines = [line for *_, pair_lines in results for line in pair_lines]
  for line in lines:
    print(line, flush=True)
  if args.output_dir:
    common = dict(targets=names, devices=args.devices, dtype=args.dtype, batch=args.batch,
                  max_new_tokens=args.max_new_tokens, pieces=args.pieces, unroll=args.unroll)
    arguments = lambda p: dict(common, model=p.model, draft=p.draft, draft_dtype=p.draft_dtype,
                               input_len=p.input_len, gamma=p.gamma, alpha=p.alpha,
                               head=p.head, head_tokens=[list(t) for t in p.head_tokens],
                               head_vocab=p.head_vocab)
    head = {"jax": jax_version(), "model_constants": dataclasses.asdict(cost.FITTED)}
    if args.pairs:
      written = dict(head, pairs=[dict(label=p.label, arguments=arguments(p), rows=rows,
                                       prediction=predicted)
                                  for p, rows, predicted, _ in results])
    else:
      pair, rows, predicted, _ = results[0]
      written = dict(head, arguments=arguments(pair), rows=rows, prediction=predicted)
    all_rows = [r for _, rows, *_ in results for r in rows]
    files.write_json(os.path.join(args.output_dir, "aot.json"), written)
    files.write_file(os.path.join(args.output_dir, "aot.md"), markdown(all_rows, columns) + "".join(
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
