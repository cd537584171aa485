"""Decodes with a T5X target and draft on a global mesh; process 0 writes the tokens as JSON.

Run it under the launcher (any number of processes) or alone (one process, or
`--single` for no mesh at all): the tokens must not depend on how it runs.

    python -m specjax.runtime.launch --num_processes 2 --local_devices 2 -- specjax.app.distributed_check \\
        --target bundled:lm/target --draft bundled:lm/draft --num_partitions 2 --out /tmp/d.json

The prompts are drawn from `--seed` over the target's vocabulary (ids >= 2), the same in
every process. Decodes: autoregressive, speculative with the draft model and with prompt
lookup, speculative streamed through batch/2 slots, greedy and sampled (temperature 1, one
seed), and beam search.
The JSON holds {"tokens": {decode: [[...]]}, "processes", "devices", "mesh", "writer"}.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, Optional, Sequence

import numpy as np

DECODES = ("ar_greedy", "ar_sampled", "spec_greedy", "spec_sampled", "lookup_greedy",
           "lookup_sampled", "stream_greedy", "stream_sampled", "beam")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  from specjax.runtime import distributed  # pylint: disable=import-outside-toplevel
  parser = argparse.ArgumentParser(prog="python -m specjax.app.distributed_check",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--target", required=True,
                      help="a model folder (model.gin + checkpoint_N/) or bundled:PAIR/ROLE")
  parser.add_argument("--draft", required=True, help="the same, for the draft model")
  parser.add_argument("--checkpoint_step", type=int, default=None,
                      help="read checkpoint_N of the target folder (default: the latest)")
  parser.add_argument("--out", required=True, help="JSON file process 0 writes")
  parser.add_argument("--num_partitions", type=int, default=1, help="the mesh's 'model' axis")
  parser.add_argument("--single", action="store_true", help="no mesh: the one-device reference")
  parser.add_argument("--batch", type=int, default=6)
  parser.add_argument("--prompt_len", type=int, default=5)
  parser.add_argument("--new_tokens", type=int, default=8)
  parser.add_argument("--gamma", type=int, default=3)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--decodes", default=",".join(DECODES),
                      help=f"comma-separated subset of {DECODES}")
  distributed.add_arguments(parser)
  args = parser.parse_args(argv)
  unknown = sorted(set(args.decodes.split(",")) - set(DECODES))
  if unknown:
    parser.error(f"unknown decodes {unknown}; expected some of {DECODES}")
  return args


def _model_dir(name: str) -> str:
  from specjax.app import bundled  # pylint: disable=import-outside-toplevel
  if name.startswith(bundled.PREFIX):
    return str(bundled.checkpoint_dir(*name[len(bundled.PREFIX):].split("/", 1)).parent)
  return name


def load(name: str, partitioner: Any, step: Optional[int] = None):
  """(model, float32 params) of a model folder: sharded by `partitioner`, or whole (None)."""
  # pylint: disable=import-outside-toplevel
  from specjax.checkpoints import load_sharded, load_t5x_for_model
  from specjax.models import build_model, read_model_gin
  folder = _model_dir(name)
  model = build_model(read_model_gin(folder))
  path = folder if step is None else os.path.join(folder, f"checkpoint_{step}")
  if partitioner is None:
    return model, load_t5x_for_model(path, model, dtype="float32")
  return model, load_sharded(path, model, partitioner, dtype="float32")


def run(args: argparse.Namespace) -> Dict[str, Any]:
  """Every decode of `args.decodes`; returns the JSON record (written by process 0 only)."""
  # pylint: disable=import-outside-toplevel
  import jax
  from specjax.runtime import distributed
  from specjax.decode import DecodeConfig, autoregressive_decode, beam_search, speculative_decode
  from specjax.draft import ModelDrafter, PromptLookupDrafter
  from specjax.sampling import Sampling
  from specjax.runtime.sharding import Partitioner

  partitioner = None if args.single else Partitioner(num_partitions=args.num_partitions)
  target, target_params = load(args.target, partitioner, args.checkpoint_step)
  draft, draft_params = load(args.draft, partitioner)
  rng = np.random.default_rng(args.seed)
  prompts = rng.integers(2, target.vocab_size, (args.batch, args.prompt_len)).astype(np.int32)
  # As if each process read its own part of the inputs: the global batch gathered back.
  prompts = distributed.gather_rows(prompts[distributed.process_rows(args.batch)])
  key = jax.random.PRNGKey(args.seed)
  configs = {"greedy": DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=-1),
             "sampled": DecodeConfig(sampling=Sampling(temperature=1.0), eos_id=-1)}
  drafters = {"spec": (ModelDrafter(draft, max_gamma=args.gamma), draft_params),
              "lookup": (PromptLookupDrafter(target.vocab_size, max_gamma=args.gamma), None)}
  tokens = {}
  for name in args.decodes.split(","):
    if name == "beam":
      result = beam_search(target, target_params, prompts, beam_size=2,
                           max_new_tokens=args.new_tokens, eos_id=1,
                           partitioner=partitioner)
      tokens[name] = np.asarray(result.sequences).tolist()
      continue
    kind, mode = name.split("_")
    common = dict(max_new_tokens=args.new_tokens, rng=key, config=configs[mode],
                  partitioner=partitioner)
    if kind == "stream":  # the model draft, the batch streamed through fewer slots
      kind, common["slots"] = "spec", max(1, args.batch // 2)
    if kind == "ar":
      result = autoregressive_decode(target, target_params, prompts, **common)
    else:
      drafter, params = drafters[kind]
      result = speculative_decode(target, target_params, drafter, params, prompts,
                                  gamma=args.gamma, **common)
    tokens[name] = np.asarray(result.tokens).tolist()
  mesh = None if partitioner is None else dict(partitioner.mesh.shape)
  record = {"tokens": tokens, "processes": jax.process_count(), "devices": jax.device_count(),
            "mesh": mesh, "writer": jax.process_index()}
  if distributed.is_writer():
    from specjax import files  # pylint: disable=import-outside-toplevel
    files.write_json(args.out, record, indent=None)
  distributed.sync("distributed_check done")
  return record


def main(argv: Optional[Sequence[str]] = None) -> int:
  from specjax.runtime import distributed  # pylint: disable=import-outside-toplevel
  args = parse_args(argv)
  process = distributed.initialize_from(args)
  record = run(args)
  print(f"process {process.process_id}/{process.num_processes}: {record['devices']} devices, "
        f"mesh {record['mesh']}, {len(record['tokens'])} decodes"
        + (f", wrote {args.out}" if distributed.is_writer() else ""))
  return 0


if __name__ == "__main__":
  from specjax import command  # pylint: disable=import-outside-toplevel
  sys.exit(command.run_cli(main))
