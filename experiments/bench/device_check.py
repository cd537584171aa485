"""The step-time model (`specjax.aot.cost`) checked on the device at hand: each step, a chain
round and whole decodes (autoregressive and speculative) timed beside what the model predicts
from the program compiled for this device.

    python -m experiments.bench.device_check      # writes docs/results/device_check_<device>
    python -m experiments.bench.device_check --dry_run --output_dir /tmp/dc  # CPU: the machinery

On a GPU or TPU (at most 8 minutes on one H100; --models picks): the target and draft steps of the
bundled LM pair (bfloat16 target, float32 draft) and of the large decoder-only sizes
(decoder_only_large / decoder_only_small, bfloat16), each as `specjax.aot.report.step_piece`
builds it (4 one-token decodes in a fori_loop), compiled here, timed (median of --repeats runs
after a warm-up) and estimated from its own optimized HLO; then, per pair, c and Thm 3.8's
speedup at --alpha and --gamma from the measured and from the predicted steps. Then per pair
two whole greedy decodes of --decode_tokens tokens from a 16-token prompt (random-init models,
no EOS): autoregressive and chain (γ = --gamma), each `specjax.decode.runner.run_loop` as every
decode runs it, compiled here, timed (median of --repeats after a warm-up) and predicted as
its rounds (counted by the decode) times the model's time of one round (the loop's body: for
the chain, γ draft steps, the verification and the nested loops' trips); a chain round
measured is the decode's time over its rounds (the prefill's share included). The measured
speedup is the autoregressive decode's time over the chain's, beside the predicted one. With
--norm_kernels, each GPU step runs again in a child process with SPECJAX_NORM_KERNEL=xla (XLA's
fusions) beside the default (the Pallas sublayer kernel): the faster is the one to keep as the
default for that GPU generation. Writes device_check.json and device_check.md to --output_dir
(default docs/results/device_check_<the model's name of the device>, e.g. device_check_h100;
--dry_run writes only where --output_dir says). --dry_run: the tiny model, one repeat, 8-token
decodes, an H200's figures (the CPU path of the tests).
--target names the accelerator the model takes figures from (default: by the device's kind;
on a CPU there is none, and the tiny models' predictions use an H200's figures: the CPU path
only checks that the machinery runs).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

PAIRS = {"lm": ("bundled:lm/target", "bundled:lm/draft", "bfloat16", "float32"),
         "large": ("models/decoder_only_large.gin", "models/decoder_only_small.gin", "bfloat16",
                   "bfloat16"),
         "tiny": ("models/decoder_only_tiny.gin", "models/decoder_only_tiny.gin", "float32",
                  "float32")}
KINDS = {"H200": "h200", "H100 PCIe": "h100-pcie", "H100": "h100", "A100-SXM4-40GB": "a100-40",
         "A100": "a100", "B200": "b200", "TPU v4": "tpu-v4", "TPU v5 lite": "tpu-v5e",
         "TPU v5": "tpu-v5p", "TPU v6 lite": "tpu-v6e"}
"""Device kinds (as `jax.devices()[0].device_kind` names them, by substring) -> model names."""


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="python -m experiments.bench.device_check",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--models", nargs="+", default=None, choices=sorted(PAIRS),
                      help="default lm large (--dry_run: tiny)")
  parser.add_argument("--repeats", type=int, default=None, help="default 5 (--dry_run: 1)")
  parser.add_argument("--decode_tokens", type=int, default=None,
                      help="tokens of each whole decode (default 64; --dry_run: 8; 0: none)")
  parser.add_argument("--dry_run", action="store_true",
                      help="the tiny model, briefly: the machinery, on any host")
  parser.add_argument("--alpha", type=float, default=0.75)
  parser.add_argument("--gamma", type=int, default=4)
  parser.add_argument("--target", default=None, help="the accelerator's name in the model")
  parser.add_argument("--norm_kernels", action="store_true",
                      help="on a GPU, the steps again with SPECJAX_NORM_KERNEL=xla")
  parser.add_argument("--json_only", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--output_dir", default=None)
  args = parser.parse_args(argv)
  small = args.dry_run
  args.models = args.models or (["tiny"] if small else ["lm", "large"])
  args.repeats = args.repeats or (1 if small else 5)
  args.decode_tokens = (8 if small else 64) if args.decode_tokens is None else args.decode_tokens
  if small and args.target is None:
    args.target = "h200"
  if args.gamma < 1 or args.decode_tokens < 0 or args.repeats < 1:
    parser.error("--gamma and --repeats must be at least 1, --decode_tokens at least 0")
  return args


def model_name(kind: str) -> Optional[str]:
  """The `specjax.aot.cost` name of a device kind ('NVIDIA H200' -> 'h200'), None if unknown."""
  for key, name in KINDS.items():
    if key.lower() in kind.lower():
      return name
  return None


def _model(spec: str, dtype: str):
  from specjax.app.gin_config import model_config_from_file  # pylint: disable=import-outside-toplevel
  from specjax.models import build_model  # pylint: disable=import-outside-toplevel
  return build_model(dataclasses.replace(model_config_from_file(spec), dtype=dtype))


def _params(model, dtype: str):
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax import params as P  # pylint: disable=import-outside-toplevel
  params = model.init(0)
  return P.cast_kernels(params, jnp.bfloat16) if dtype == "bfloat16" else params


def time_step(spec: str, dtype: str, repeats: int, target: str) -> Dict[str, Any]:
  """One step of model `spec`: measured ms (median over `repeats`, 4 steps a call) and the
  model's prediction from the program compiled for this device."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specjax.aot import cost, report  # pylint: disable=import-outside-toplevel
  model = _model(spec, dtype)
  abstract = jax.eval_shape(lambda: _params(model, dtype))
  piece = report.step_piece(spec, model, abstract, batch=1, cache_len=96)
  params = jax.jit(lambda: _params(model, dtype))()
  cache = model.init_cache(1, 96)
  tokens = jnp.zeros((1, 1), jnp.int32)
  compiled = piece.fn.lower(params, cache, None, tokens).compile()
  floor = report._nbytes(piece.weights) + piece.cache_bytes  # pylint: disable=protected-access
  estimate = cost.estimate(compiled.as_text(), target, floor_bytes=floor)
  times = []
  for i in range(repeats + 1):
    cache = model.init_cache(1, 96)
    jax.block_until_ready(cache)
    start = time.perf_counter()
    jax.block_until_ready(compiled(params, cache, None, tokens))
    if i:  # the first call warms up
      times.append((time.perf_counter() - start) * 1e3 / 4)
  measured = statistics.median(times)
  return {"model": spec, "dtype": dtype, "measured_ms": round(measured, 4),
          "predicted_ms": round(estimate.ms, 4), "roofline_ms": round(estimate.roofline_ms, 4),
          "launches": estimate.launches, "round_trips": estimate.round_trips,
          "error_pct": round(100 * (estimate.ms - measured) / measured, 1)}


PROMPT = 16
"""The whole decodes' prompt tokens."""


def time_decodes(pair: str, args, target: str) -> List[Dict[str, Any]]:
  """The pair's autoregressive and chain decodes of `args.decode_tokens` tokens (greedy, batch
  1, no EOS): measured ms (median over --repeats after a warm-up), rounds, the model's ms of
  one round from the loop compiled here, and the decode predicted as rounds times that."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from specjax.aot import cost, report  # pylint: disable=import-outside-toplevel
  from specjax.decode.inputs import initial_seq  # pylint: disable=import-outside-toplevel
  from specjax.decode.state import LoopParams  # pylint: disable=import-outside-toplevel
  from specjax.sampling import row_keys  # pylint: disable=import-outside-toplevel
  target_spec, draft_spec, target_dtype, draft_dtype = PAIRS[pair]
  model, draft = _model(target_spec, target_dtype), _model(draft_spec, draft_dtype)
  if model.is_encoder_decoder:
    raise ValueError(f"{target_spec}: the decodes here take a decoder-only pair")
  pieces = {p.name: p for p in report.model_pieces(
      model, draft, dtype=target_dtype, draft_dtype=draft_dtype, input_len=PROMPT,
      max_new_tokens=args.decode_tokens, gamma=args.gamma, include=("loops",))}
  tparams = jax.jit(lambda: _params(model, target_dtype))()
  dparams = jax.jit(lambda: _params(draft, draft_dtype))()
  inputs = np.random.RandomState(0).randint(1, model.vocab_size, (1, PROMPT)).astype(np.int32)
  rows = []
  for name, params in (("autoregressive", LoopParams(target=tparams)),
                       ("chain", LoopParams(target=tparams, drafter=dparams))):
    piece = pieces[f"{name} loop"]
    cache_len = piece.args[2].shape[1]
    args_now = (params, jnp.asarray(inputs), jnp.asarray(initial_seq(model, inputs, cache_len)),
                jnp.full((1,), PROMPT, jnp.int32), row_keys(jax.random.PRNGKey(0), 1),
                jnp.int32(args.decode_tokens), jnp.int32(args.gamma))
    compiled = piece.fn.lower(*args_now).compile()
    round_est = cost.estimate(compiled.as_text(), target)
    times, result = [], None
    for i in range(args.repeats + 1):
      start = time.perf_counter()
      result = jax.block_until_ready(compiled(*args_now))
      if i:  # the first call warms up
        times.append((time.perf_counter() - start) * 1e3)
    decoded = result[0]
    rounds = int(np.asarray(decoded.target_calls)[0])
    measured = statistics.median(times)
    predicted = rounds * round_est.ms
    rows.append({"pair": pair, "decode": name, "tokens": int(np.asarray(decoded.lengths)[0]),
                 "rounds": rounds, "measured_ms": round(measured, 3),
                 "predicted_ms": round(predicted, 3),
                 "measured_round_ms": round(measured / max(rounds, 1), 4),
                 "predicted_round_ms": round(round_est.ms, 4),
                 "error_pct": round(100 * (predicted - measured) / measured, 1)})
    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  ar, chain = rows
  for row, key in ((chain, "measured_ms"), (chain, "predicted_ms")):
    row[f"speedup_{key.split('_')[0]}"] = round(ar[key] / row[key], 3) if row[key] else None
  return rows


def _rows(args, target: str) -> List[Dict[str, Any]]:
  rows = []
  for pair in args.models:
    target_spec, draft_spec, target_dtype, draft_dtype = PAIRS[pair]
    for role, spec, dtype in (("target", target_spec, target_dtype),
                              ("draft", draft_spec, draft_dtype)):
      rows.append({"pair": pair, "role": role, **time_step(spec, dtype, args.repeats, target)})
      print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  return rows


def pairs(rows: List[Dict[str, Any]], alpha: float, gamma: int) -> List[Dict[str, Any]]:
  """Per pair: c and Thm 3.8's speedup from the measured and from the predicted steps."""
  from specjax.aot import cost  # pylint: disable=import-outside-toplevel
  out = []
  for pair in dict.fromkeys(r["pair"] for r in rows):
    got = {r["role"]: r for r in rows if r["pair"] == pair}
    row = {"pair": pair}
    for what in ("measured", "predicted"):
      p = cost.prediction(got["target"][f"{what}_ms"], got["draft"][f"{what}_ms"], alpha, gamma)
      row.update({f"c_{what}": p["c"], f"speedup_{what}": p["speedup"]})
    out.append(row)
  return out


def _table(rows: List[Dict[str, Any]]) -> str:
  if not rows:
    return ""
  columns = list(dict.fromkeys(k for r in rows for k in r))
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  return "\n".join(lines + ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |"
                            for r in rows]) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """The check (module docstring); returns what it writes."""
  args = parse_args(argv)
  import jax  # pylint: disable=import-outside-toplevel
  device = jax.devices()[0]
  target = args.target or model_name(device.device_kind) or "h200"
  rows = _rows(args, target)
  decodes = [r for pair in (args.models if args.decode_tokens else ())
             for r in time_decodes(pair, args, target)]
  result = {"device": device.device_kind, "platform": device.platform, "jax": jax.__version__,
            "model_target": target, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python -m experiments.bench.device_check " + " ".join(argv or sys.argv[1:]),
            "norm_kernel": os.environ.get("SPECJAX_NORM_KERNEL", "default"),
            "steps": rows, "pairs": pairs(rows, args.alpha, args.gamma), "decodes": decodes}
  if args.json_only:
    print(json.dumps(result))
    return result
  if args.norm_kernels and device.platform == "gpu":
    child = [a for a in (argv or sys.argv[1:]) if a != "--norm_kernels"] + [
        "--json_only", "--decode_tokens", "0"]
    done = subprocess.run([sys.executable, "-m", "experiments.bench.device_check", *child],
                          env={**os.environ, "SPECJAX_NORM_KERNEL": "xla"}, check=True,
                          capture_output=True, text=True)
    result["xla_fusions"] = json.loads(done.stdout.strip().splitlines()[-1])["steps"]
  text = (f"# Device check: {result['device']} ({result['date']})\n\n`{result['command']}`, "
          f"jax {result['jax']}, model figures of `{target}`.\n\n" + _table(rows) + "\n"
          + _table(result["pairs"]) + ("\nWhole decodes (autoregressive, chain at γ = "
                                       f"{args.gamma}):\n\n" + _table(decodes) if decodes else ""))
  if "xla_fusions" in result:
    text += "\nSPECJAX_NORM_KERNEL=xla:\n\n" + _table(result["xla_fusions"])
  print(text)
  output_dir = args.output_dir or (None if args.dry_run else
                                   os.path.join("docs", "results", f"device_check_{target}"))
  if output_dir:
    from specjax import files  # pylint: disable=import-outside-toplevel
    os.makedirs(output_dir, exist_ok=True)
    files.write_json(os.path.join(output_dir, "device_check.json"), result)
    files.write_file(os.path.join(output_dir, "device_check.md"), text)
    print(f"written to {output_dir}", file=sys.stderr)
  return result


if __name__ == "__main__":
  main()
