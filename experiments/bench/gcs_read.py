"""Reading a checkpoint from a GCS API server vs from local disk: the bundled checkpoints, each
uploaded to gcp-storage-emulator on 127.0.0.1 (in memory) and read with `load_t5x` both ways.

    python -m experiments.bench.gcs_read [--passes 5] [--output_dir DIR]

Columns: local_s and gcs_s (median seconds of `load_t5x`, interleaved passes), gcs_vs_local
(their ratio; the goal is at most 1.5), objects and MiB of the checkpoint, and the emulator's own
cost: raw_gcs_s, every object of the checkpoint fetched at once through the same client with no
checkpoint logic (a Python HTTP server's cost per request and per byte), against raw_local_s, the
same files read from disk; less_emulator_vs_local: gcs_s less that difference, over local_s (an
estimate: OCDBT reads byte ranges, more requests than objects). Needs the `test` extra
(gcp-storage-emulator).
"""
from __future__ import annotations

import os
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np

from experiments.common.checks import check_counts
from experiments.common.cli import parse_cli
from experiments.common.output import write
from specjax import checkpoints, machine, remote, testing_gcs, timing
from specjax.app.bundled import model_dir
from specjax.command import run_cli

CHECKPOINTS = (("translate", "target"), ("lm", "target"), ("translate", "draft"))


def _orbax_copy(folder: str, out: str) -> str:
  """The checkpoint at `folder` written again as T5X writes Orbax (OCDBT), into `out`."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  params = checkpoints.load_t5x(folder)
  path = os.path.join(out, "checkpoint_1", "state")
  ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True)).save(
      path, {"version": 3, "optimizer": {"target": params, "state": {"step": np.int32(1)}}})
  return os.path.dirname(path)


def _raw_reads(local: str, url: str):
  """(read every file of `local`, fetch every object below `url` at once) as functions."""
  names = sorted(os.path.relpath(os.path.join(d, n), local)
                 for d, _, ns in os.walk(local) for n in ns)

  def from_disk():
    for name in names:
      with open(os.path.join(local, name), "rb") as f:
        f.read()

  def from_gcs():
    bucket, _ = remote.split(url)
    store = remote._bucket_store(bucket)  # pylint: disable=protected-access
    futures = [store.read(remote.split(remote.join(url, n))[1]) for n in names]
    for future in futures:
      future.result()
  return from_disk, from_gcs, len(names), sum(
      os.path.getsize(os.path.join(local, n)) for n in names)


def measure(passes: int) -> List[Dict]:
  """One row per checkpoint (and format)."""
  rows = []
  with testing_gcs.emulator() as _, tempfile.TemporaryDirectory() as tmp:
    cases = [(f"{p}/{r} legacy", str(model_dir(p, r))) for p, r in CHECKPOINTS]
    cases.append(("translate/target orbax",
                  _orbax_copy(str(model_dir("translate", "target")), os.path.join(tmp, "o"))))
    for i, (name, local) in enumerate(cases):
      url = f"gs://specjax-test/c{i}"
      testing_gcs.upload(local, url)
      raw_disk, raw_gcs, objects, size = _raw_reads(local, url)
      t = timing.interleaved({"local": lambda local=local: checkpoints.load_t5x(local),
                              "gcs": lambda url=url: checkpoints.load_t5x(url),
                              "raw_local": raw_disk, "raw_gcs": raw_gcs}, passes)
      row = {"checkpoint": name, "objects": objects, "MiB": size / 2**20}
      for key in ("local", "gcs", "raw_local", "raw_gcs"):
        row[f"{key}_s"] = t.median(key)
      row["gcs_vs_local"] = row["gcs_s"] / row["local_s"]
      overhead = row["raw_gcs_s"] - row["raw_local_s"]  # the emulator's, once per object
      row["less_emulator_vs_local"] = (row["gcs_s"] - overhead) / row["local_s"]
      rows.append(row)
  return rows


FLAGS = {"--passes": dict(type=int, default=5)}


def main(argv: Optional[Sequence[str]] = None) -> List[Dict]:
  cli = parse_cli(argv, __doc__, "bench_gcs_read", needs_pairs=False, flags=FLAGS,
                  weights_dtype=None)
  check_counts(passes=cli.args.passes)
  return write(cli, "bench_gcs_read", measure(cli.args.passes),
               "Reading a checkpoint from a GCS API server vs local disk", [
                   f"median seconds of {cli.args.passes} interleaved passes of load_t5x; "
                   "gcs: gcp-storage-emulator on 127.0.0.1 in memory (a Python HTTP server, "
                   "requests handled one at a time); raw_*: every object / file read with no "
                   "checkpoint logic (the emulator's own cost: raw_gcs_s against raw_local_s)"],
               machine=machine.describe())


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
