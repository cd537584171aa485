"""Fault injection: training killed by SIGKILL at random points resumes exactly.

A child process trains a tiny decoder-only LM for 10 steps (float32 checkpoint
every 2 steps, 2 kept) and dies by SIGKILL: either sent by the parent after a
random delay once training has started, or at its n-th file-system operation
(renames, mkdirs, deletions, file writes, fsyncs of the checkpoint and metrics
writers; n uniform over all operations of a whole run). This process then
resumes the run in the same folder; its final parameters must be bit-identical
to an uninterrupted run's, and metrics.jsonl must hold each step once.

The children share a persistent compilation cache, so only the first compiles.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from specjax import checkpoints
from specjax.params import flatten

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILLED_TRIALS = 10
STEPS = 10

SETUP = textwrap.dedent("""
    from specjax import train as T
    from specjax.models.decoder_only import DecoderOnlyConfig

    def run(model_dir):
      model = DecoderOnlyConfig(vocab_size=8192, emb_dim=16, num_heads=2, num_layers=1,
                                head_dim=8, mlp_dim=32)
      data = T.DataConfig(task="lm", batch_size=2, seq_len=16)
      opt = T.OptimizerConfig(learning_rate=0.05, warmup_steps=2)
      conf = T.TrainConfig(model_dir=model_dir, num_steps=%d, checkpoint_every=2,
                           keep_checkpoints=2, log_every=1, eval_batches=1, progress=False)
      return T.train(model, data, opt, conf)
""" % STEPS)

CHILD = SETUP + textwrap.dedent("""
    import itertools, os, shutil, signal, sys
    from specjax.checkpoints import _commit as _ckpt_commit, t5x
    from specjax.train import checkpoints as train_ckpt, trainer

    model_dir, kill_at = sys.argv[1], int(sys.argv[2])
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

    os.rename, os.replace, os.mkdir = wrap(os.rename), wrap(os.replace), wrap(os.mkdir)
    os.fsync, shutil.rmtree = wrap(os.fsync), wrap(shutil.rmtree)
    _ckpt_commit.rename_noreplace = wrap(_ckpt_commit.rename_noreplace)
    t5x._write_zarr = wrap(t5x._write_zarr)
    train_ckpt.opt_state_bytes = wrap(train_ckpt.opt_state_bytes)
    trainer._append_metrics = wrap(trainer._append_metrics)
    run(model_dir)
    print("ops", next(ops) - 1, flush=True)
""")


def child(model_dir, kill_at, env, delay=None):
  """Runs the child; returns (killed, its printed op count or None)."""
  proc = subprocess.Popen([sys.executable, "-c", CHILD, str(model_dir), str(kill_at)],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  if delay is not None:  # wait for the first step (compilation done), then a random delay
    metrics = os.path.join(model_dir, "metrics.jsonl")
    while proc.poll() is None and not os.path.exists(metrics):
      time.sleep(0.01)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
  out, err = proc.communicate(timeout=300)
  if proc.returncode == -signal.SIGKILL:
    return True, None
  assert proc.returncode == 0, err[-3000:]
  return False, int(out.split()[-1])


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  cache = tmp_path_factory.mktemp("jax_cache")
  return dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
              PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_killed_training_resumes_bit_identically(tmp_path, env):
  namespace = {}
  exec(SETUP, namespace)  # pylint: disable=exec-used
  # The uninterrupted run, in a child like the killed ones; it counts the operations.
  killed, total_ops = child(tmp_path / "reference", -1, env)
  assert not killed and total_ops > 50
  want = dict(flatten(checkpoints.load_t5x(str(tmp_path / "reference"))))
  rng = np.random.default_rng(16)
  trials, points = 0, []
  while trials < KILLED_TRIALS:
    model_dir = tmp_path / f"trial_{len(points)}"
    by_op = len(points) % 2 == 0
    kill_at = int(rng.integers(1, total_ops + 1)) if by_op else 0
    killed, _ = child(model_dir, kill_at, env, None if by_op else float(rng.uniform(0, 1.5)))
    left = checkpoints.list_checkpoint_dirs(str(model_dir))
    points.append((kill_at, killed, [s for s, _ in left]))
    trials += killed
    if not killed:
      assert len(points) < 3 * KILLED_TRIALS, points
      continue
    result = namespace["run"](str(model_dir))  # resume here
    assert result.step == STEPS and result.start_step == (left[-1][0] if left else 0)
    got = dict(flatten(result.params))
    assert sorted(got) == sorted(want)
    for name, value in want.items():  # bit-identical
      np.testing.assert_array_equal(got[name], value, err_msg=f"{name} after {points[-1]}")
    with open(model_dir / "metrics.jsonl") as f:
      records = [json.loads(line) for line in f]
    assert [r["step"] for r in records if r["split"] == "train"] == list(range(1, STEPS + 1))
    assert [r["step"] for r in records if r["split"] == "validation"] == [STEPS]
  # The kills fell before, between and after checkpoints.
  assert len({tuple(p[2]) for p in points if p[1]}) >= 3, points
