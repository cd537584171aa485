"""Fault injection: checkpoint writers killed by SIGKILL at many points.

A child process saves a stream of small checkpoints into one model folder:
save k writes params P(k) as a new step ((k + 1) // 2, odd k) or overwrites
that step (even k), and after an overwrite deletes the step two below. It
prints k after each save. It dies by SIGKILL either after a random delay
(sent by the parent) or at its n-th file-system operation of the save path
(rename, mkdir, rmtree, file writes, fsyncs, the no-replace rename), before
or after it, so the narrow windows (between the two renames of an overwrite)
are hit as well as the wide ones (inside tensorstore's writes).

After each kill the model folder must load as P(k_done) or P(k_done + 1), with
every array of that one save (never a mix, never a missing chunk), every
committed checkpoint must load, and a save by another process must leave no
`.tmp-` / `.old-` / `.del-` folder while keeping what was loadable.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from specjax import checkpoints
from specjax.checkpoints import _commit as _ckpt_commit
from specjax.params import flatten

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRIALS = 24  # half killed by the parent after a random delay, half at an operation

CHILD = textwrap.dedent("""
    import itertools, os, shutil, signal, sys
    import numpy as np
    from specjax import checkpoints
    from specjax.checkpoints import _commit as _ckpt_commit, t5x

    path, kill_at = sys.argv[1], int(sys.argv[2])

    def tree(k):
      return {"w": np.full((16, 8), k, np.float32),
              "enc": {"k": np.arange(64, dtype=np.float32).reshape(8, 8) * k,
                      "b": np.full((8,), -k, np.float32)},
              "s": np.float32(k)}

    ops = itertools.count(1)

    def tick():
      if next(ops) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

    def wrap(fn):
      def wrapped(*args, **kwargs):
        tick()
        out = fn(*args, **kwargs)
        tick()
        return out
      return wrapped

    if kill_at:
      os.rename, os.mkdir, os.rmdir = wrap(os.rename), wrap(os.mkdir), wrap(os.rmdir)
      shutil.rmtree = wrap(shutil.rmtree)
      _ckpt_commit.rename_noreplace = wrap(_ckpt_commit.rename_noreplace)
      _ckpt_commit.fsync_dir = wrap(_ckpt_commit.fsync_dir)
      t5x._write_file = wrap(t5x._write_file)
      t5x._write_zarr = wrap(t5x._write_zarr)
    print("ready", flush=True)
    for k in range(1, 200):
      step = (k + 1) // 2
      checkpoints.save_t5x(tree(k), path, step=step, dtype="float32", overwrite=k % 2 == 0)
      if k % 2 == 0 and step > 2:
        checkpoints.delete_checkpoint(path, step - 2)
      print(k, flush=True)
    sys.exit(3)  # never reached: the parent or an operation kills it first
""")


def tree(k):
  return {"w": np.full((16, 8), k, np.float32),
          "enc": {"k": np.arange(64, dtype=np.float32).reshape(8, 8) * k,
                  "b": np.full((8,), -k, np.float32)},
          "s": np.float32(k)}


def which_save(params):
  """The k whose P(k) `params` is, checking every array (a mix fails)."""
  k = int(params["s"])
  want = dict(flatten(tree(k)))
  got = dict(flatten(params))
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} of save {k}")
  return k


def run_child(path, kill_at, delay):
  proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(kill_at)], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "ready"
  if not kill_at:
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == -signal.SIGKILL, err
  done = [int(line) for line in out.split()]
  return done[-1] if done else 0


def test_killed_saves_leave_the_previous_or_the_new_checkpoint(tmp_path):
  rng = np.random.default_rng(20261123)
  outcomes = []
  for trial in range(TRIALS):
    path = tmp_path / f"trial_{trial}"
    by_op = trial % 2 == 1
    kill_at = int(rng.integers(1, 160)) if by_op else 0
    k_done = run_child(path, kill_at, float(rng.uniform(0.0, 0.25)))
    # Loadable at the last finished save or the one that was killed.
    try:
      loaded = which_save(checkpoints.load_t5x(str(path)))
    except FileNotFoundError:
      assert k_done == 0, f"trial {trial}: nothing loadable after save {k_done}"
      loaded = 0
    assert loaded in (k_done, k_done + 1), (trial, kill_at, k_done, loaded)
    committed = checkpoints.list_checkpoint_dirs(str(path))
    for step, folder in committed:  # every committed checkpoint is whole
      assert (which_save(checkpoints.load_t5x(folder)) + 1) // 2 == step
    # A later save (this process) cleans every leftover and keeps what was there.
    checkpoints.save_t5x(tree(1000), str(path), step=1000, dtype="float32")
    left = [e for e in os.listdir(path) if _ckpt_commit.LEFTOVER.fullmatch(e)]
    assert left == [], (trial, left)
    for step, folder in committed:
      assert (which_save(checkpoints.load_t5x(str(path / f"checkpoint_{step}"))) + 1) // 2 \
          == step
    outcomes.append((kill_at, k_done, loaded))
  # The kills landed at many different points: after many different saves, and
  # both before the killed save was in place and after.
  assert len({k for _, k, _ in outcomes}) >= 6, outcomes
  assert any(loaded == k for _, k, loaded in outcomes if k)
  assert any(loaded == k + 1 for _, k, loaded in outcomes), outcomes
