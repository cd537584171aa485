"""The JAX APIs that differ across the releases specjax supports (jax 0.10.0 to 0.12.x).

Every call whose name, signature or import path changed between those releases goes through
this module, so the rest of the package is written against one API and a new JAX release
is met here alone. Each helper finds what the installed JAX offers by looking at the API
itself (a parameter's presence, a name's export), never by comparing version numbers.

What moved, and where:
- Pallas Mosaic GPU's `plgpu.load` took the index as a required second argument up to
  jax 0.10.2, deprecated it in 0.11 (indexing the reference instead) and dropped it in 0.12.
- `plgpu.kernel` named its result and scratch types `out_shape` / `scratch_shapes` up to
  jax 0.10.1, accepted both from 0.10.2 and only `out_type` / `scratch_types` from 0.11.2.
- The GPU interpreter's settings (`InterpretGPUParams`) are exported under
  `jax.experimental.pallas.mosaic_gpu` from jax 0.11.1; before, only from JAX's internals.
- `jax.sharding.AbstractDevice` gained its `platform` field in jax 0.10.1; from jax 0.11 a
  Pallas GPU kernel lowered on a host without a GPU reads the GPU it is for from the abstract
  mesh's device.

flax 0.12.8 to 0.12.12 changed nothing specjax uses.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Sequence

import jax


def _mosaic_gpu():
  """JAX's Pallas Mosaic GPU module (ImportError where this JAX lacks it)."""
  from jax.experimental.pallas import mosaic_gpu  # pylint: disable=import-outside-toplevel
  return mosaic_gpu


@functools.lru_cache(maxsize=None)
def _parameters(fn: Callable) -> dict:
  return dict(inspect.signature(fn).parameters)


def mgpu_load(ref: Any, layout: Any) -> Any:
  """The whole of a Mosaic GPU shared-memory `ref`, loaded into registers in `layout`
  (`plgpu.load`; inside a `plgpu.kernel` body)."""
  plgpu = _mosaic_gpu()
  idx = _parameters(plgpu.load).get("idx")
  if idx is not None and idx.default is inspect.Parameter.empty:  # the index is required
    return plgpu.load(ref, (), layout=layout)
  return plgpu.load(ref, layout=layout)


def mgpu_kernel(body: Callable, *, out_type: Any, scratch_types: Sequence[Any],
                **kwargs: Any) -> Callable:
  """`plgpu.kernel(body, ...)` with its result types `out_type` and its scratch buffers
  `scratch_types`, under whichever keyword names this JAX uses; `kwargs` pass through."""
  plgpu = _mosaic_gpu()
  if "out_type" in _parameters(plgpu.kernel):
    types = {"out_type": out_type, "scratch_types": scratch_types}
  else:
    types = {"out_shape": out_type, "scratch_shapes": scratch_types}
  return plgpu.kernel(body, **types, **kwargs)


def mgpu_interpret_params() -> Any:
  """The settings that run a `plgpu.kernel` in JAX's GPU interpreter (on a CPU)."""
  plgpu = _mosaic_gpu()
  if hasattr(plgpu, "InterpretGPUParams"):
    return plgpu.InterpretGPUParams()
  from jax._src.pallas.mosaic_gpu.interpret import params  # pylint: disable=import-outside-toplevel
  return params.InterpretGPUParams()


def abstract_gpu_mesh(device_kind: str, num_cores: int) -> jax.sharding.AbstractMesh:
  """A one-device abstract mesh of the NVIDIA GPU `device_kind` (e.g. 'NVIDIA H200') with
  `num_cores` SMs: under `jax.sharding.use_abstract_mesh`, what a Pallas GPU kernel lowers
  for on a host without that GPU."""
  fields = {f.name for f in dataclasses.fields(jax.sharding.AbstractDevice)}
  device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=num_cores,
                                       **({"platform": "gpu"} if "platform" in fields else {}))
  return jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
