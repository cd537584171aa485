"""Reading a checkpoint from a GCS API server vs from local disk: the bundled checkpoints, each
uploaded to gcp-storage-emulator on 127.0.0.1 (in memory, a bucket of its own) and read with
`load_t5x` both ways.

    python -m experiments.bench.gcs_read [--passes 7] [--output_dir DIR]

Columns: local_s and gcs_s (median seconds of `load_t5x`, interleaved passes) and the range of
their per-pass ratio, gcs_vs_local (the median ratio; the goal is at most 1.5), objects and MiB
of the checkpoint, requests (what one gs:// read asks of the server) and the emulator's own
cost: emulator_s, the seconds its handlers took for them (one at a time, under its lock), and
replay_gcs_s, the same requests (object, byte range, listing) sent at once through the same
client with no checkpoint logic, against replay_local_s, the same byte ranges read from disk;
less_emulator_vs_local: gcs_s less (replay_gcs_s - replay_local_s), over local_s. Needs the
`test` extra (gcp-storage-emulator).
"""
from __future__ import annotations

import os
import statistics
import tempfile
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import unquote

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


Plan = List[Tuple[str, Optional[Tuple[int, int]]]]  # (key, (start, stop) or None: whole / list)


def _plan(requests: Sequence[testing_gcs.Request], bucket: str) -> Plan:
  """The object reads and listings of `requests` (one checkpoint read), as client calls."""
  plan: Plan = []
  for r in requests:
    head, _, key = r.path.partition(f"/b/{bucket}/o")
    if r.method != "GET" or not head:
      continue
    key = unquote(key.lstrip("/"))
    if not key:
      plan.append(("", None))  # a listing
    elif "alt=json" in r.query.split("&"):
      plan.append((key, (0, 0)))  # its metadata: what tensorstore asks for an empty range
    elif r.range:  # a range past an object's end is answered with what there is
      start = int(r.range.split("=", 1)[1].partition("-")[0])
      plan.append((key, (start, start + r.bytes)))
    else:
      plan.append((key, None))
  return plan


def _replays(plan: Plan, local: str, prefix: str, bucket: str
             ) -> Tuple[Callable[[], None], Callable[[], None]]:
  """(the requests of `plan` sent at once, the same bytes read from the files below `local`)."""
  def from_gcs():
    store = remote._bucket_store(bucket)  # pylint: disable=protected-access
    futures = [store.list() if not key else store.read(key) if span is None
               else store.read(key, byte_range=slice(*span)) for key, span in plan]
    for future in futures:
      future.result()

  def from_disk():
    for key, span in plan:
      path = os.path.join(local, key[len(prefix):]) if key.startswith(prefix) else None
      if not key:
        list(os.walk(local))
      elif path is not None and os.path.isfile(path):
        with open(path, "rb") as f:
          if span is not None:
            f.seek(span[0])
          f.read(-1 if span is None else span[1] - span[0])
  return from_gcs, from_disk


def measure(passes: int) -> List[Dict]:
  """One row per checkpoint (and format)."""
  rows = []
  with testing_gcs.emulator() as server, tempfile.TemporaryDirectory() as tmp:
    cases = [(f"{p}/{r} legacy", str(model_dir(p, r))) for p, r in CHECKPOINTS]
    cases.append(("translate/target orbax",
                  _orbax_copy(str(model_dir("translate", "target")), os.path.join(tmp, "o"))))
    for i, (name, local) in enumerate(cases):
      # a bucket each: the emulator answers a listing with the whole bucket (it ignores
      # startOffset / endOffset), where GCS lists only the prefix asked for
      bucket = f"specjax-bench-{i}"
      server.create_bucket(bucket)
      url = f"gs://{bucket}/ckpt"
      testing_gcs.upload(local, url)
      checkpoints.load_t5x(url)  # what one read asks of the server
      del server.requests[:]
      checkpoints.load_t5x(url)
      plan = _plan(list(server.requests), bucket)
      replay_gcs, replay_disk = _replays(plan, local, "ckpt/", bucket)
      served: List[float] = []

      def from_gcs(url=url, served=served):
        del server.requests[:]
        out = checkpoints.load_t5x(url)
        served.append(sum(r.seconds for r in server.requests))
        return out
      t = timing.interleaved({"local": lambda local=local: checkpoints.load_t5x(local),
                              "gcs": from_gcs, "replay_local": replay_disk,
                              "replay_gcs": replay_gcs}, passes)
      size = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(local) for n in ns)
      row = {"checkpoint": name, "objects": sum(len(ns) for _, _, ns in os.walk(local)),
             "MiB": size / 2**20, "requests": len(plan)}
      for key in ("local", "gcs"):
        row[f"{key}_s"] = t.median(key)
      ratio, low, high = t.ratio("gcs", "local")
      row["gcs_vs_local"] = ratio
      row["ratio_range"] = f"{low:.2f}-{high:.2f}"
      row["emulator_s"] = statistics.median(served[-passes:])
      for key in ("replay_local", "replay_gcs"):
        row[f"{key}_s"] = t.median(key)
      overhead = row["replay_gcs_s"] - row["replay_local_s"]  # the emulator's, for these requests
      row["less_emulator_vs_local"] = (row["gcs_s"] - overhead) / row["local_s"]
      rows.append(row)
  return rows


FLAGS = {"--passes": dict(type=int, default=7)}


def main(argv: Optional[Sequence[str]] = None) -> List[Dict]:
  cli = parse_cli(argv, __doc__, "bench_gcs_read", needs_pairs=False, flags=FLAGS,
                  weights_dtype=None)
  check_counts(passes=cli.args.passes)
  before = os.getloadavg()[0]
  rows = measure(cli.args.passes)
  load = (f"load average {before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
          f"(other jobs on this machine's {os.cpu_count()} cores)")
  return write(cli, "bench_gcs_read", rows,
               "Reading a checkpoint from a GCS API server vs local disk", [
                   f"median seconds of {cli.args.passes} interleaved passes of load_t5x; "
                   "gcs: gcp-storage-emulator on 127.0.0.1 in memory, a bucket per checkpoint "
                   "(a Python HTTP server, requests handled one at a time); ratio_range: the "
                   "lowest and highest per-pass gcs/local; emulator_s: its handlers' seconds "
                   "for one read's requests; replay_*: those requests sent at once with no "
                   "checkpoint logic, and the same bytes read from disk (the emulator's own "
                   "cost: replay_gcs_s against replay_local_s)", load],
               machine=machine.describe())


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
