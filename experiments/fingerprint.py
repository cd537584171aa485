"""The decode loops' fingerprint: every loop's tokens and the size of its compiled program, to
hold a change that should alter neither (a refactor) against the code before it.

    python -m experiments.fingerprint --output_dir /tmp/before
    python -m experiments.fingerprint --output_dir /tmp/after --compare /tmp/before

What it runs, its columns and settings: docs/experiments.md, section "fingerprint".
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from experiments.common.cli import parse_cli
from experiments.common.decoding import Decoders, decode_config
from experiments.common.inputs import load_examples
from experiments.common.output import write
from specjax.aot import hlo
from specjax.command import run_cli

FAST = dict(examples=1, max_new_tokens=6)
FULL = dict(examples=3, max_new_tokens=24)
GAMMA = 3
LOOP_MODULES = r".*(run_loop|jit__run).*"
"""The whole-loop programs: the runner's `run_loop` and the streamed decode's chunk (`_run`)."""


def _decoders(pair, temperature: float, cache_len: int, max_new_tokens: int
              ) -> Dict[str, Callable[[Any], Any]]:
  """name -> fn(inputs int32 [N, W]) -> DecodeResult, for one pair and temperature."""
  from specjax.app import bundled  # pylint: disable=import-outside-toplevel
  from specjax.draft import (DynamicTree, FeatureDrafter,  # pylint: disable=import-outside-toplevel
                             PromptLookupTreeDrafter, StaticTree)
  from specjax.train import load_head  # pylint: disable=import-outside-toplevel

  d = Decoders(pair, max_new_tokens, decode_config(temperature, cache_len))
  spines = StaticTree.from_spines((GAMMA, 1))
  cut = DynamicTree(branch=2, expand=2, max_depth=GAMMA, keep=4)  # exact at T = 0 only
  draft, dparams = pair.draft, pair.draft_params
  out = {"autoregressive": d.autoregressive(), "chain": d.model_chain(GAMMA),
         "chain, streamed (2 slots)": d.model_chain(GAMMA, slots=2),
         "static tree": d.tree(draft, dparams, tree=spines),
         "dynamic tree": d.tree(draft, dparams,
                                tree=DynamicTree(branch=2, expand=2, max_depth=GAMMA)),
         "prompt-lookup tree": d.tree(PromptLookupTreeDrafter(pair.target.vocab_size,
                                                              branches=2, depth=GAMMA), None)}
  if temperature == 0.0:
    out["chain, 'auto'"] = d.auto().model_chain(GAMMA)
    out["static tree, 'auto'"] = d.auto().tree(draft, dparams, tree=spines)
    out["dynamic tree, keep 4"] = d.tree(draft, dparams, tree=cut)
  if pair.name == "lm" and not pair.random_init:
    head, head_params = load_head(bundled.resolve("bundled:lm/eagle", "checkpoint"))
    feature = FeatureDrafter(pair.target, head, max_gamma=GAMMA)
    fparams = feature.params(head_params, pair.target_params)
    out["feature chain"] = d.chain(feature, fparams, GAMMA)
    out["feature tree"] = d.tree(feature, fparams, tree=spines)
    if temperature == 0.0:
      out["feature dynamic tree, keep 4"] = d.tree(feature, fparams, tree=cut)
  return out


def _programs(folder: Path, seen: set) -> List[Dict[str, Any]]:
  """The loop programs dumped since `seen` (updated): instructions and one iteration's
  kernels of each."""
  out = []
  for name, text in sorted(hlo.loop_modules(str(folder)).items()):
    if name in seen:
      continue
    seen.add(name)
    stats = hlo.loop_stats(text)
    instructions = sum(1 for line in text.splitlines() if " = " in line
                       and line.lstrip().startswith(("%", "ROOT %")))
    out.append({"instructions": instructions, "body_kernels": stats["body_kernels"],
                "whiles": stats["whiles"]})
  return out


def run(cli, examples: int, max_new_tokens: int) -> List[Dict[str, Any]]:
  """Writes fingerprint.{md,json}; returns the rows (module docstring)."""
  folder = Path(os.environ["SPECJAX_FINGERPRINT_DUMP"])
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_enable_compilation_cache", False)
  before = None
  if cli.flags["compare"]:
    before = {(r["pair"], r["T"], r["decode"]): r for r in json.loads(
        (Path(cli.flags["compare"]) / "fingerprint.json").read_text())["rows"]}
  rows, seen, worse = [], set(), []
  for pair in cli.pairs:
    ex = load_examples(pair, examples, max_input_len=16)
    cache_len = 16 + max_new_tokens + 2 * GAMMA + 2
    for temperature in (0.0, 1.0):
      for name, fn in _decoders(pair, temperature, cache_len, max_new_tokens).items():
        result = fn(ex.inputs)
        tokens = np.asarray(result.tokens)
        programs = _programs(folder, seen)
        row = {"pair": pair.name, "T": temperature, "decode": name,
               "tokens": hashlib.sha256(tokens.tobytes()).hexdigest()[:12],
               "first_tokens": tokens[0, :8].tolist(),
               "target_calls": int(np.sum(result.target_calls)),
               "programs": len(programs),
               "instructions": sum(p["instructions"] for p in programs),
               "body_kernels": [p["body_kernels"] for p in programs]}
        old = None if before is None else before.get((pair.name, temperature, name))
        if old is not None:
          row["same_tokens"] = old["tokens"] == row["tokens"]
          row["instructions_before"] = old["instructions"]
          row["body_kernels_before"] = old["body_kernels"]
          if not row["same_tokens"] or row["instructions"] > old["instructions"]:
            worse.append(f"{pair.name} T={temperature:g} {name}")
        rows.append(row)
        print(json.dumps(row), flush=True)
  columns = ["pair", "T", "decode", "tokens", "target_calls", "programs", "instructions",
             "body_kernels"]
  if before is not None:
    columns += ["same_tokens", "instructions_before", "body_kernels_before"]
  write(cli, "fingerprint", rows, "The decode loops' fingerprint", [
      f"{examples} bundled inputs, {max_new_tokens} new tokens, γ {GAMMA}; instructions: the "
      "optimized HLO of the loops each decode compiled"], columns)
  if worse:
    print("tokens changed or a program grew: " + "; ".join(worse))
    return 1
  return rows


def main(argv: Optional[List[str]] = None) -> Any:
  """Sets the dump folder before JAX's backend starts, then runs."""
  folder = Path(tempfile.mkdtemp(prefix="specjax_fingerprint_"))
  os.environ["SPECJAX_FINGERPRINT_DUMP"] = str(folder)
  flags = (f"--xla_dump_to={folder} --xla_dump_hlo_as_text "
           f"--xla_dump_hlo_module_re={LOOP_MODULES}")
  os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), flags]))
  cli = parse_cli(argv, __doc__, "fingerprint", flags={
      "--compare": dict(default=None, help="a folder holding an earlier fingerprint.json")})
  result = run(cli, **(FAST if cli.fast else FULL))
  return result if result == 1 else 0


if __name__ == "__main__":
  sys.exit(run_cli(main))
