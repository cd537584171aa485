"""Peak host memory of loading the bundled LM target sharded, per process, over 1 vs 2 processes.

  python -m experiments.bench.distributed                 # the layouts below, on this host's CPU
  python -m experiments.bench.distributed --pair_role lm/tiny

What it runs, its columns and settings: docs/experiments.md, section "bench.distributed".
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from experiments.common.cli import parse_cli
from experiments.common.output import write
from specjax.command import run_cli

LAYOUTS = ((1, 1, 1), (1, 2, 2), (2, 1, 2), (2, 2, 2))
"""(processes, CPU devices per process, num_partitions): model axis within or across processes."""
_CHILD = "--child"


def _max_rss_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _own_bytes(tree: Any) -> int:
  """Bytes this process's devices hold of `tree` (every addressable shard)."""
  import jax  # pylint: disable=import-outside-toplevel
  return int(sum(s.data.nbytes for leaf in jax.tree.leaves(tree) for s in leaf.addressable_shards))


def child(argv: Sequence[str]) -> None:
  """One process of a layout: measures and (process 0) writes `--out` as JSON."""
  # pylint: disable=import-outside-toplevel
  from specjax.runtime import distributed
  parser = argparse.ArgumentParser()
  parser.add_argument("--pair_role", default="lm/target")
  parser.add_argument("--num_partitions", type=int, default=1)
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  distributed.initialize()
  import jax
  import numpy as np
  from jax.experimental import multihost_utils
  from specjax.app import bundled
  from specjax.checkpoints import load_sharded
  from specjax.models import build_model, read_model_gin
  from specjax.runtime.sharding import Partitioner
  from specjax.params import flatten
  pair, role = args.pair_role.split("/")
  folder = bundled.checkpoint_dir(pair, role)
  model = build_model(read_model_gin(str(folder.parent)))
  partitioner = Partitioner(num_partitions=args.num_partitions)
  total = int(sum(4 * np.prod(x.shape) for _, x in flatten(model.param_shapes())))
  jax.block_until_ready(jax.numpy.zeros(1))
  base = _max_rss_bytes()
  params = jax.block_until_ready(load_sharded(str(folder), model, partitioner, dtype="float32"))
  peak = _max_rss_bytes()
  row = np.asarray([jax.process_index(), base, peak, _own_bytes(params)], np.int64)
  rows = np.asarray(multihost_utils.process_allgather(row)).reshape(-1, 4)
  if distributed.is_writer():
    Path(args.out).write_text(json.dumps({
        "mesh": dict(partitioner.mesh.shape), "model_bytes": total,
        "processes": [dict(zip(("process", "base", "peak", "own"), map(int, r))) for r in rows]}))
  distributed.sync("bench_distributed done")


def measure(pair_role: str, layouts: Sequence[Sequence[int]], folder: Path) -> List[Dict]:
  """One row per (layout, process)."""
  from specjax.runtime import launch  # pylint: disable=import-outside-toplevel
  folder.mkdir(parents=True, exist_ok=True)
  rows = []
  for processes, devices, partitions in layouts:
    out = folder / f"layout_{processes}x{devices}_m{partitions}.json"
    status = launch.launch(["experiments.bench.distributed", _CHILD, "--pair_role", pair_role,
                            "--num_partitions", str(partitions), "--out", str(out)],
                           num_processes=processes, local_devices=devices, timeout=900)
    if status:
      raise RuntimeError(f"layout {processes}x{devices} (model {partitions}) failed: {status}")
    record = json.loads(out.read_text())
    mib = lambda b: round(b / 2**20, 1)
    for p in record["processes"]:
      rows.append({"processes": processes, "devices/process": devices,
                   "mesh (data x model)": f"{record['mesh']['data']} x {record['mesh']['model']}",
                   "process": p["process"], "model MiB (f32)": mib(record["model_bytes"]),
                   "own shards MiB": mib(p["own"]), "peak growth MiB": mib(p["peak"] - p["base"]),
                   "growth - own MiB": mib(p["peak"] - p["base"] - p["own"])})
  return rows


def main(argv: Optional[Sequence[str]] = None) -> Optional[List[Dict]]:
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] == [_CHILD]:
    child(argv[1:])
    return None
  cli = parse_cli(argv, __doc__, "bench_distributed", needs_pairs=False, weights_dtype=None,
                  flags={"--pair_role": dict(default="lm/target",
                                             help="bundled PAIR/ROLE to load")})
  pair_role = cli.flags["pair_role"]
  rows = measure(pair_role, LAYOUTS, cli.output_dir)
  return write(cli, "bench_distributed", rows,
               f"Peak host memory of a sharded load: bundled:{pair_role}", [
                   "per process, `ru_maxrss` after minus before `load_sharded` (float32 arrays "
                   "from the bfloat16 zarr checkpoint) under `specjax.runtime.launch` (CPU "
                   "devices, gloo)"], pairs=[], pair_role=pair_role, layouts=LAYOUTS)


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
