"""Scale-out: the same jitted decode loops on many devices through `jax.sharding`.

A `Partitioner` (T5X's `PjitPartitioner` in spirit) holds a 2-D device `Mesh`
with axes ('data', 'model') and logical axis rules that map T5X's logical axis
names to mesh axes:

  batch -> data;  vocab, mlp, heads, joined_kv -> model;  embed, kv, length -> None

Every parameter gets its logical axes from its T5X name (`param_logical_axes`,
T5X's `param_axes`), every loop-state array is batch first, and KV caches and
cross-attention inputs are ('batch', 'heads', 'length', 'kv') for values [B, H, L, D] and
('batch', 'heads', 'kv', 'length') for keys [B, H, D, L].
An axis whose size the mesh axis does not divide is replicated instead (logged
at debug level), so tiny test models still run on a 1x8 mesh.

  partitioner = Partitioner(num_partitions=2)          # 8 devices -> 4 x 2 mesh
  params = partitioner.shard_params(params)            # or checkpoints.load_sharded(path, model, partitioner)
  out = speculative_decode(..., partitioner=partitioner)

The decode functions pad the batch to a multiple of the data axis (repeating the
last row) and drop the padding from the result, place the batch with its
`NamedSharding`, and constrain the loop state inside `jax.jit` (initial state
and every round) so XLA's SPMD partitioner keeps caches split by batch and heads.

Many processes (TPU pods, multi-node GPU, N local CPU processes): call
`specjax.runtime.distributed.initialize()` first in every process (before any other JAX
call), run the same program in every process and build the `Partitioner` there:
`jax.devices()` then lists every process's devices and the mesh spans them all
(`spans_processes`); `specjax.checkpoints.load_sharded` reads in each process only
the shards of its own devices. Every process passes the same full batch; each
places only its own rows (`prepare`), and results come back replicated to every
process (`unpad`), so `np.asarray` works everywhere. See docs/distributed.md.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Optional, Sequence, Tuple

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from specjax.checks import check_int
from specjax.models.layers import EncodedInputs, KVCache
from specjax.params import flatten, unflatten

logger = logging.getLogger(__name__)

DATA, MODEL = "data", "model"
MESH_AXES = (DATA, MODEL)

Rules = Tuple[Tuple[str, Optional[str]], ...]

STANDARD_RULES: Rules = (
    ("batch", DATA),
    ("vocab", MODEL),
    ("mlp", MODEL),
    ("heads", MODEL),
    ("joined_kv", MODEL),
    ("embed", None),
    ("kv", None),
    ("length", None),
    ("relpos_buckets", None),
)
"""T5X's standard logical axis rules (model parallelism over heads, MLP and vocab)."""

# Logical axes of a parameter, found by the end of its T5X path.
_PARAM_AXES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("token_embedder/embedding", ("vocab", "embed")),
    ("query/kernel", ("embed", "joined_kv")),
    ("key/kernel", ("embed", "joined_kv")),
    ("value/kernel", ("embed", "joined_kv")),
    ("out/kernel", ("joined_kv", "embed")),
    ("mlp/wi/kernel", ("embed", "mlp")),
    ("mlp/wi_0/kernel", ("embed", "mlp")),
    ("mlp/wi_1/kernel", ("embed", "mlp")),
    ("mlp/wo/kernel", ("mlp", "embed")),
    ("logits_dense/kernel", ("embed", "vocab")),
    ("relpos_bias/rel_embedding", ("heads", "relpos_buckets")),
    # Gemma (the gemma library's names, `specjax.models.gemma`): heads and the MLP split as
    # T5X's; the stacked einsums' leading axis (q|k|v, gate|up) is not split.
    ("embedder/input_embedding", ("vocab", "embed")),
    ("attn/q_einsum/w", ("heads", "embed", "kv")),
    ("attn/kv_einsum/w", (None, "heads", "embed", "kv")),
    ("attn/qkv_einsum/w", (None, "heads", "embed", "kv")),
    ("attn/attn_vec_einsum/w", ("heads", "kv", "embed")),
    ("mlp/gating_einsum", (None, "mlp", "embed")),  # [2, F, E] (transpose_gating_einsum)
    ("mlp/linear", ("mlp", "embed")),
    ("scale", ("embed",)),
)

CACHE_AXES = ("batch", "heads", "length", "kv")  # values of KV caches and cross-attention
KEY_CACHE_AXES = ("batch", "heads", "kv", "length")  # their keys [B, H, D, L]


def create_mesh(num_partitions: int = 1, devices: Optional[Sequence[Any]] = None) -> Mesh:
  """A ('data', 'model') mesh: `num_partitions` devices per model replica.

  Args:
    num_partitions: size of the 'model' axis (T5X's `num_partitions`); 1 is
      pure data parallelism.
    devices: the devices to use (default `jax.devices()`, every host's).
  Returns:
    A `Mesh` of shape (len(devices) // num_partitions, num_partitions).
  """
  devices = list(jax.devices() if devices is None else devices)
  check_int("num_partitions", num_partitions, low=1, expected="a positive integer")
  if not devices or len(devices) % num_partitions:
    raise ValueError(f"num_partitions={num_partitions} does not divide the {len(devices)} "
                     "devices")
  shape = (len(devices) // num_partitions, int(num_partitions))
  try:  # topology-aware order on TPU/GPU
    grid = mesh_utils.create_device_mesh(shape, devices)
  except Exception:  # pylint: disable=broad-except  # e.g. a device subset it cannot tile
    grid = np.asarray(devices, dtype=object).reshape(shape)
  return Mesh(grid, MESH_AXES)


def param_logical_axes(params: Any) -> Any:
  """The logical axes of every parameter (a tree like `params`; None = replicate).

  Names follow T5X's `param_axes` (e.g. `attention/query/kernel` ->
  ('embed', 'joined_kv')); leaves of unknown names or of another rank (n-gram
  tables, test tables) are replicated.
  """
  if not hasattr(params, "items"):
    return jax.tree.map(lambda _: None, params)
  out = {}
  for path, leaf in flatten(params):
    axes = None
    for suffix, logical in _PARAM_AXES:
      if (path == suffix or path.endswith("/" + suffix)) and len(np.shape(leaf)) == len(logical):
        axes = logical
        break
    if axes is None:
      logger.debug("parameter %s %s: no logical axes, replicated", path, np.shape(leaf))
    out[path] = axes
  return unflatten(out)


def logical_to_spec(axes: Optional[Sequence[Optional[str]]], shape: Sequence[int], mesh: Mesh,
                    rules: Rules = STANDARD_RULES, what: str = "array") -> PartitionSpec:
  """Maps logical axes to a `PartitionSpec` on `mesh`.

  A logical axis maps to the first rule naming it (absent: replicated). A mesh
  axis is used at most once per array, and only where it divides the size.
  """
  if axes is None:
    return PartitionSpec()
  if len(axes) != len(shape):
    raise ValueError(f"{what}: {len(axes)} logical axes {tuple(axes)} for shape {tuple(shape)}")
  table = {}
  for logical, mesh_axis in rules:
    table.setdefault(logical, mesh_axis)
  spec, used = [], set()
  for logical, size in zip(axes, shape):
    mesh_axis = table.get(logical) if logical is not None else None
    if mesh_axis is not None and mesh_axis not in mesh.shape:
      raise ValueError(f"rule {logical!r} -> {mesh_axis!r}: no such mesh axis in {MESH_AXES}")
    if mesh_axis is not None and mesh.shape[mesh_axis] == 1:
      mesh_axis = None  # nothing to split over
    if mesh_axis is not None and (mesh_axis in used or size % mesh.shape[mesh_axis]):
      logger.debug("%s %s: axis %s of size %d not split over %s (%d devices)", what,
                   tuple(shape), logical, size, mesh_axis, mesh.shape[mesh_axis])
      mesh_axis = None
    used.add(mesh_axis)
    spec.append(mesh_axis)
  while spec and spec[-1] is None:
    spec.pop()
  return PartitionSpec(*spec)


def _is_struct(x: Any) -> bool:
  return isinstance(x, (KVCache, EncodedInputs))


@dataclasses.dataclass(frozen=True)
class Partitioner:
  """A ('data', 'model') mesh and logical axis rules (gin-configurable).

  Hashable: it is a static argument of the jitted loops.
  """

  num_partitions: int = 1
  """Devices per model replica: the 'model' axis (T5X's `num_partitions`). 1 = data parallel."""
  rules: Rules = STANDARD_RULES
  """Logical axis -> mesh axis ('data', 'model' or None), first match wins."""
  devices: Optional[Tuple[Any, ...]] = None
  """The devices of the mesh (default: `jax.devices()`)."""
  mesh: Mesh = dataclasses.field(init=False, compare=False, repr=False)

  def __post_init__(self):
    object.__setattr__(self, "rules", tuple(tuple(r) for r in self.rules))
    object.__setattr__(self, "mesh", create_mesh(self.num_partitions, self.devices))

  def __hash__(self) -> int:
    return hash((self.rules, self.mesh))

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, Partitioner) and (self.rules, self.mesh) == (other.rules, other.mesh)

  @property
  def data_size(self) -> int:
    """Devices on the 'data' axis (the batch is split this many ways)."""
    return self.mesh.shape[DATA]

  @property
  def model_size(self) -> int:
    """Devices on the 'model' axis."""
    return self.mesh.shape[MODEL]

  @property
  def spans_processes(self) -> bool:
    """Whether the mesh holds devices of other processes (after `jax.distributed.initialize`)."""
    return _spans_processes(self.mesh)

  def sharding(self, axes: Optional[Sequence[Optional[str]]], shape: Sequence[int],
               what: str = "array") -> NamedSharding:
    """The `NamedSharding` of an array with these logical axes."""
    return NamedSharding(self.mesh, logical_to_spec(axes, shape, self.mesh, self.rules, what))

  # ------------------------------------------------------------------ parameters

  def param_shardings(self, params: Any) -> Any:
    """A tree of `NamedSharding`s for `params` (arrays or `jax.ShapeDtypeStruct`s)."""
    if not hasattr(params, "items"):
      return jax.tree.map(lambda x: self.sharding(None, np.shape(x)), params)
    axes = dict(flatten(param_logical_axes(params)))
    return unflatten({path: self.sharding(axes[path], np.shape(leaf), path)
                      for path, leaf in flatten(params)})

  def shard_params(self, params: Any) -> Any:
    """Places `params` (numpy or jax arrays, or None) in their shardings."""
    if params is None:
      return None
    return jax.device_put(params, self.param_shardings(params))

  # ------------------------------------------------------------- batch and state

  def batch_sharding(self, shape: Sequence[int]) -> NamedSharding:
    """Batch-first arrays: rows over 'data', the rest replicated."""
    return self.sharding(("batch",) + (None,) * (len(shape) - 1), shape, "batch")

  def _state_sharding(self, x: Any) -> NamedSharding:
    if np.ndim(x) == 0:
      return NamedSharding(self.mesh, PartitionSpec())
    return self.batch_sharding(np.shape(x))

  def _struct_shardings(self, struct: Any) -> Any:
    cache = lambda x: self.sharding(CACHE_AXES, x.shape, "cache")
    keys = lambda x: self.sharding(KEY_CACHE_AXES, x.shape, "cache")
    if isinstance(struct, KVCache):
      return KVCache(keys=tuple(map(keys, struct.keys)), values=tuple(map(cache, struct.values)))
    return EncodedInputs(keys=tuple(map(keys, struct.keys)),
                         values=tuple(map(cache, struct.values)),
                         mask=self.batch_sharding(struct.mask.shape))

  def state_shardings(self, tree: Any) -> Any:
    """Shardings of a batch-first pytree (loop state, caches, encoder outputs, results)."""
    def one(x):
      return self._struct_shardings(x) if _is_struct(x) else self._state_sharding(x)
    return jax.tree.map(one, tree, is_leaf=_is_struct)

  def constrain_state(self, tree: Any) -> Any:
    """`with_sharding_constraint` by `state_shardings` (inside `jax.jit`)."""
    return jax.lax.with_sharding_constraint(tree, self.state_shardings(tree))

  def pad_rows(self, batch: int) -> int:
    """Rows after padding `batch` up to a multiple of the 'data' axis."""
    return -(-batch // self.data_size) * self.data_size

  def prepare(self, params: Sequence[Any], rows: Sequence[Any]) -> Tuple[list, list]:
    """Places params and batch-first arrays for a sharded call.

    Args:
      params: parameter trees (each placed by `shard_params`; already placed
        arrays are not copied).
      rows: batch-first arrays with the same leading size B; padded to
        `pad_rows(B)` rows by repeating the last row, then split over 'data'.
    Returns:
      (placed params, placed padded rows).
    """
    batch = np.shape(rows[0])[0]
    pad = self.pad_rows(batch) - batch
    return [self.shard_params(p) for p in params], [self.place_rows(x, pad) for x in rows]

  def place_rows(self, x: Any, pad: int = 0) -> jax.Array:
    """A batch-first array [B, ...] split over 'data', padded by `pad` copies of its last row
    (replicated instead when `data_size` does not divide B + pad, as `logical_to_spec`
    does). On a mesh that spans processes every process passes the same full batch and
    transfers only its own devices' rows."""
    if self.spans_processes and _host_rows(x):
      return _own_rows(np.asarray(x), pad, self.batch_sharding((np.shape(x)[0] + pad,)
                                                               + np.shape(x)[1:]))
    if pad:
      x = jax.numpy.concatenate([x, jax.numpy.repeat(x[-1:], pad, axis=0)])
    return jax.device_put(x, self.batch_sharding(np.shape(x)))

  def unpad(self, tree: Any, batch: int) -> Any:
    """Drops padding rows: every batch-first leaf cut to `batch` rows. On a mesh that spans
    processes the result is replicated to every device (one all-gather), so every process can
    read it (`np.asarray` of an array split over processes fails)."""
    if not self.spans_processes:
      return jax.tree.map(lambda x: x[:batch], tree)
    return _cut_replicated(batch, NamedSharding(self.mesh, PartitionSpec()), tree)


def _spans_processes(mesh: Mesh) -> bool:
  here = jax.process_index()
  return any(d.process_index != here for d in mesh.devices.flat)


def _host_rows(x: Any) -> bool:
  """Whether `x` is a batch this process holds whole (numpy, or a jax array on its devices),
  not a typed PRNG key array (those go through `jax.device_put`)."""
  return getattr(x, "is_fully_addressable", True) and not jax.dtypes.issubdtype(
      getattr(x, "dtype", np.int32), jax.dtypes.prng_key)


def _own_rows(rows: np.ndarray, pad: int, sharding: NamedSharding) -> jax.Array:
  """A global batch-first array from the full host batch `rows` [B, ...] padded by `pad`
  copies of its last row: this process's devices receive only their own rows."""
  batch = rows.shape[0]

  def read(index):  # index: the slices of one addressable shard
    wanted = np.arange(batch + pad)[index[0]] if index else np.arange(batch + pad)
    return rows[np.minimum(wanted, batch - 1)][(slice(None),) + tuple(index[1:])]
  return jax.make_array_from_callback((batch + pad,) + rows.shape[1:], sharding, read)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _cut_replicated(batch: int, replicated: NamedSharding, tree: Any) -> Any:
  """Every leaf cut to `batch` rows and replicated (the all-gather runs inside the jit)."""
  return jax.lax.with_sharding_constraint(jax.tree.map(lambda x: x[:batch], tree), replicated)


def per_device_bytes(tree: Any) -> int:
  """Bytes of `tree` held by the first addressable device (its own shards only)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    device = leaf.sharding._device_assignment[0]  # pylint: disable=protected-access
    total += sum(s.data.nbytes for s in leaf.addressable_shards if s.device == device)
  return total


def constrain(partitioner: Optional[Partitioner], tree: Any) -> Any:
  """`partitioner.constrain_state(tree)`; `tree` itself without a partitioner."""
  return tree if partitioner is None else partitioner.constrain_state(tree)


def place(partitioner: Optional[Partitioner], params: Sequence[Any],
          rows: Sequence[Any]) -> Tuple[list, list]:
  """`partitioner.prepare(params, rows)`; unchanged lists without a partitioner."""
  return (list(params), list(rows)) if partitioner is None else partitioner.prepare(params, rows)


def unpad(partitioner: Optional[Partitioner], tree: Any, batch: int) -> Any:
  """Drops the padding rows `place` added (nothing without a partitioner)."""
  return tree if partitioner is None else partitioner.unpad(tree, batch)
