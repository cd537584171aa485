"""Reading checkpoints that are hostile or changing (docs/results/hostile_probe.md, second
part): a save overwriting the step being read, declared sizes the bytes on disk cannot hold,
special files in place of chunks or metadata. Nothing here runs a model.
"""
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from specjax import checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_WRITER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from specjax import checkpoints
    path, stop = sys.argv[1], sys.argv[2]
    i, t0 = 0, time.time()
    while not os.path.exists(stop) and time.time() - t0 < 120:
      i += 1
      value = float(i % 2)
      params = {f"layer_{k}": {"kernel": np.full((64, 32), value, np.float32),
                               "scale": np.full((), value, np.float32)} for k in range(6)}
      checkpoints.save_t5x(params, path, step=1, dtype=None, overwrite=True)
    print(i)
""")


def _params(value):
  return {f"layer_{k}": {"kernel": np.full((64, 32), value, np.float32),
                         "scale": np.full((), value, np.float32)} for k in range(6)}


def test_a_reader_never_sees_two_saves_at_once(tmp_path):
  # A writer process overwrites checkpoint_1 in a loop, alternating all-0 and all-1 saves,
  # while this process loads it for 12 s. Before, 490 of 23,913 loads mixed arrays of both
  # saves (7 in 1,430 in 10 s on this machine) and others failed with a TypeError or a
  # "missing" array; now every load is one save (the folder is share-locked while it is read).
  path = str(tmp_path / "model")
  checkpoints.save_t5x(_params(0.0), path, step=1, dtype=None)
  stop = str(tmp_path / "stop")
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  writer = subprocess.Popen([sys.executable, "-c", _WRITER, path, stop], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  loads, mixed, errors = 0, 0, []
  try:
    deadline = time.time() + 12
    while time.time() < deadline:
      try:
        params = checkpoints.load_t5x(path)
      except ValueError as e:  # a clear error is allowed (counted), nothing else
        errors.append(str(e))
        continue
      values = {float(v) for layer in params.values() for leaf in layer.values()
                for v in (np.min(leaf), np.max(leaf))}
      loads += 1
      mixed += len(values) != 1
  finally:
    open(stop, "w").close()
    out, err = writer.communicate(timeout=120)
  assert writer.returncode == 0, err[-2000:]
  saves = int(out.split()[-1])
  assert saves >= 20, f"the writer saved only {saves} times: the test raced nothing"
  assert loads >= 100
  assert mixed == 0, f"{mixed} of {loads} loads mixed two saves"
  assert len(errors) <= loads // 100, errors[:3]
