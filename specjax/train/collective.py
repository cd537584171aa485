"""Data-parallel training over the processes of a job, with collective T5X checkpoints.

Every process runs `fit` with the same arguments (after `specjax.runtime.distributed.initialize`).
The train state is replicated over the partitioner's mesh (`num_partitions=1`: a
'data' axis over every device of every process); each step's global batch (the same
in every process) is split over 'data', each process transferring only its own rows,
and XLA all-reduces the gradients. Checkpoints are `checkpoint_N` folders in the
`specjax.train` layout (T5X params, `optimizer_state.npz`, `train_state.json`),
written by `specjax.checkpoints.save_t5x_collective` (each process its shards,
process 0 the rest and the atomic commit), so `restore` resumes them exactly: a run
stopped after a checkpoint and resumed ends with the parameters, bit for bit, of a
run that was never stopped.

    state = fit(trainer, batch_fn, "/shared/model_dir", num_steps=1000, checkpoint_every=100,
                partitioner=Partitioner(), init_params=model.init(0))
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, Mapping, Optional

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from specjax import checkpoints
from specjax.runtime import distributed
from specjax.checkpoints.collective import save_t5x_collective
from specjax.runtime.sharding import Partitioner
from specjax.train.checkpoints import (OPT_STATE_FILE, TRAIN_STATE_FILE, list_checkpoints,
                                       opt_state_bytes, restore)


def place_state(state: Any, partitioner: Partitioner) -> Any:
  """The train state replicated on every device of the partitioner's mesh."""
  return jax.device_put(state, NamedSharding(partitioner.mesh, PartitionSpec()))


def save_checkpoint_collective(model_dir: str, state: Any, keep: int = 2,
                               fingerprint: Optional[Mapping[str, Any]] = None) -> str:
  """`specjax.train.save_checkpoint` (float32, resumable) written by every process at once;
  the oldest checkpoints beyond `keep` are then removed by process 0."""
  step = int(state.step)
  marker = {"step": step, "optimizer_state": True, "fingerprint": fingerprint}
  extra = {TRAIN_STATE_FILE: json.dumps(marker, indent=1).encode("utf-8"),
           OPT_STATE_FILE: opt_state_bytes(distributed.gather(state.opt_state))}
  path = save_t5x_collective(state.params, model_dir, step=step, dtype="float32",
                             extra_files=extra)
  if distributed.is_writer():
    for old in list_checkpoints(model_dir)[:-keep]:
      checkpoints.delete_checkpoint(model_dir, old)
  distributed.sync(f"{path} pruned")
  return path


def fit(trainer: Any, batch_fn: Callable[[int], Dict[str, np.ndarray]], model_dir: str, *,
        num_steps: int, checkpoint_every: int, partitioner: Partitioner, init_params: Any,
        fingerprint: Optional[Mapping[str, Any]] = None, stop_after: Optional[int] = None,
        keep: int = 2) -> Any:
  """Trains from the newest checkpoint in `model_dir` (or `init_params`) to `num_steps`.

  Args:
    trainer: a `specjax.train.Trainer`.
    batch_fn: step -> the global batch of that step (numpy [B, ...] features; B divisible by
      the mesh's 'data' axis), the same in every process.
    model_dir: a folder every process sees.
    num_steps: the run's length (a checkpoint is written at the end).
    checkpoint_every: steps between checkpoints.
    partitioner: its mesh must have `num_partitions=1` (data parallelism).
    init_params: the parameters of a fresh run.
    fingerprint: recorded in and checked against the checkpoints (`resume_fingerprint`).
    stop_after: stop once this many steps are done (after any checkpoint of that step): a
      run cut short, to be resumed.
    keep: checkpoints kept.
  Returns:
    The last `TrainState` (replicated).
  """
  if partitioner.model_size != 1:
    raise ValueError(f"fit trains data-parallel: the partitioner needs num_partitions=1, got "
                     f"a 'model' axis of {partitioner.model_size}")
  if checkpoint_every < 1:
    raise ValueError(f"checkpoint_every must be at least 1, got {checkpoint_every}")
  state = restore(model_dir, trainer, fingerprint)
  if state is None:
    state = trainer.init_state(init_params)
  state = place_state(state, partitioner)
  for step in range(int(state.step), num_steps):
    batch = {name: partitioner.place_rows(rows) for name, rows in batch_fn(step).items()}
    state, _ = trainer.train_step(state, batch)
    # Replicated after every step, as a resumed run places it: the same compiled step.
    state = place_state(state, partitioner)
    done = step + 1
    if done % checkpoint_every == 0 or done == num_steps:
      save_checkpoint_collective(model_dir, state, keep, fingerprint)
    if stop_after is not None and done >= stop_after:
      break
  return state
