"""T5X checkpoints: the legacy (msgpack + zarr) and Orbax formats, read and written.

`load_t5x` reads a checkpoint's `target` tree (either format, without orbax);
`load_t5x_for_model` checks it against a model's parameter shapes; `save_t5x`
writes the legacy format atomically (with `extra_files` committed in the same
rename); `list_checkpoint_dirs`, `delete_checkpoint` and `clean_model_dir`
manage a model folder's checkpoints and the leftovers of crashed saves;
`load_sharded` reads straight into a `specjax.runtime.sharding.Partitioner`'s shardings;
`save_t5x_collective` writes global arrays from every process of a job at once.
"""
from specjax.checkpoints.t5x import (LEGACY, ORBAX, VERSION, CheckpointLocation, clean_model_dir,
                                     delete_checkpoint, find_checkpoint, list_checkpoint_dirs,
                                     load_t5x, load_t5x_for_model, save_t5x)

__all__ = ["load_t5x", "load_t5x_for_model", "save_t5x", "find_checkpoint", "CheckpointLocation",
           "list_checkpoint_dirs", "delete_checkpoint", "clean_model_dir",
           "load_sharded", "load_t5x_sharded", "save_t5x_collective", "LEGACY", "ORBAX",
           "VERSION"]


def __getattr__(name):
  # Sharded loading needs jax (and the Partitioner); plain reading must not import it.
  if name in ("load_sharded", "load_t5x_sharded"):
    from specjax.checkpoints import sharded  # pylint: disable=import-outside-toplevel
    return getattr(sharded, name)
  if name == "save_t5x_collective":
    from specjax.checkpoints import collective  # pylint: disable=import-outside-toplevel
    return collective.save_t5x_collective
  raise AttributeError(f"module 'specjax.checkpoints' has no attribute {name!r}")
