"""A pre-norm sublayer's entry as one GPU kernel: residual add, T5's RMS norm and the
projections that read the normed input (q/k/v, or the MLP's input kernels and their gated
activation), for the few rows of a decode call.

XLA:GPU compiles a sublayer's entry to three kernels or more: the norm's reduction (riding
with the residual add), an elementwise kernel that scales the row, and the GEMM that reads
it (docs/aot.md). `norm_project` computes the same values in one Triton kernel (Pallas) where
it is lowered for an NVIDIA GPU and the call has at most `MAX_ROWS` rows; elsewhere (CPU,
TPU, larger calls, int8 weights) it runs the plain layers' ops, so those programs are the ones
they were. Each program of the kernel recomputes the rows' norm (they are a few KB, read from
L2) and reads its own columns of the weights once: a matrix-vector product per row, which is
what a decode step's weight traffic wants.
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array
ENV = "SPECJAX_NORM_KERNEL"
ENV_VALUES = ("fused", "xla")
"""The values SPECJAX_NORM_KERNEL takes (unset: 'fused')."""
MAX_ROWS = 16
"""Calls with more rows (batch × tokens) than this take the plain layers' ops."""
_CHUNK = 128  # columns of the input read per loop trip (a power of two dividing E)
_TARGET_PROGRAMS = 256  # enough column blocks to keep every SM of a large GPU reading


_SPREAD = [0]  # traces under way whose arrays are spread over several devices


def enabled() -> bool:
  """Whether `norm_project` may use its kernel, read when a call is traced: yes unless the
  environment variable SPECJAX_NORM_KERNEL is 'xla' (XLA's own fusions everywhere) or the
  trace runs under `placed_by` a partitioner of several devices."""
  value = os.environ.get(ENV, "fused")
  if value not in ENV_VALUES:
    raise ValueError(f"{ENV}={value!r} is not one of {', '.join(ENV_VALUES)} ('fused': the "
                     "sublayer-entry kernel where it applies; 'xla': XLA's own fusions)")
  return value != "xla" and not _SPREAD[0]


@contextlib.contextmanager
def placed_by(partitioner: Any) -> Iterator[None]:
  """Traces inside run without the kernel when `partitioner` (a
  `specjax.runtime.sharding.Partitioner`, or None) spreads the arrays over more than one
  device: XLA's partitioner has no rule for a Pallas call and would gather its operands, the
  weights included, onto every device."""
  spread = int(partitioner is not None and partitioner.mesh.size > 1)
  _SPREAD[0] += spread
  try:
    yield
  finally:
    _SPREAD[0] -= spread


def _fits(x: Array, kernels: Sequence[Array]) -> bool:
  """Rows few enough, widths with a power-of-two divisor of 8 or more (Triton's blocks are
  powers of two), one output width, and bfloat16 or float32 kernels."""
  rows = x.size // x.shape[-1]
  outs = {k.shape[1] for k in kernels}
  return (rows <= MAX_ROWS and x.shape[-1] % 8 == 0 and len(outs) == 1 and min(outs) % 8 == 0
          and all(k.dtype in (jnp.bfloat16, jnp.float32) and k.ndim == 2 for k in kernels))


def _pow2_divisor(n: int, limit: int) -> int:
  """The largest power of two that divides n and is at most `limit`."""
  d = 1
  while d * 2 <= limit and n % (d * 2) == 0:
    d *= 2
  return d


def _kernel(*refs, rows: int, width: int, chunk: int, block: int, count: int, gated: bool,
            has_delta: bool, dtype: Any, epsilon: float, activations: Tuple[Callable, ...]):
  """One program: `block` output columns of every kernel (gated: of their gated product) for
  all `rows` rows; program 0 also writes the summed residual."""
  from jax.experimental import pallas as pl  # pylint: disable=import-outside-toplevel
  x_ref = refs[0]
  delta_ref = refs[1] if has_delta else None
  scale_ref = refs[1 + has_delta]
  w_refs = refs[2 + has_delta:2 + has_delta + count]
  out_refs = refs[2 + has_delta + count:]
  sum_ref, o_refs = out_refs[0], out_refs[1:]
  pid = pl.program_id(0)
  if gated:
    which, col = 0, pid * block
  else:
    blocks = o_refs[0].shape[1] // block
    which, col = pid // blocks, (pid % blocks) * block
  trips = width // chunk

  def residual(m, c):
    span = pl.ds(c * chunk, chunk)
    h = x_ref[m, span]
    if has_delta:
      h = h + delta_ref[m, span]
    return h

  def sums(c, acc):
    return tuple(a + jnp.sum(jnp.square(residual(m, c).astype(jnp.float32)))
                 for m, a in enumerate(acc))

  zero = jnp.zeros((), jnp.float32)
  squares = lax.fori_loop(0, trips, sums, (zero,) * rows)
  inv = [lax.rsqrt(s / width + epsilon) for s in squares]

  @pl.when(pid == 0)
  def _():
    def write(c, carry):
      for m in range(rows):
        sum_ref[m, pl.ds(c * chunk, chunk)] = residual(m, c)
      return carry
    lax.fori_loop(0, trips, write, 0)

  def products(w_ref):
    def step(c, acc):
      span = pl.ds(c * chunk, chunk)
      w = w_ref[span, pl.ds(col, block)].astype(jnp.float32)  # [chunk, block]
      s = scale_ref[span].astype(dtype)
      out = []
      for m in range(rows):
        y = (residual(m, c).astype(jnp.float32) * inv[m]).astype(dtype) * s
        y = y.astype(w_ref.dtype).astype(jnp.float32)
        out.append(acc[m] + jnp.sum(y[:, None] * w, axis=0))
      return tuple(out)
    return lax.fori_loop(0, trips, step, (jnp.zeros((block,), jnp.float32),) * rows)

  if gated:
    parts = [products(w_ref) for w_ref in w_refs]
    for m in range(rows):
      h = None
      for act, part in zip(activations, parts):
        # Triton has no bfloat16 tanh: the activation runs in float32, rounded to `dtype`.
        a = act(part[m].astype(dtype).astype(jnp.float32)).astype(dtype)
        h = a if h is None else h * a
      o_refs[0][m, pl.ds(col, block)] = h.astype(o_refs[0].dtype)
  else:
    for i, (w_ref, o_ref) in enumerate(zip(w_refs, o_refs)):
      @pl.when(which == i)
      def _(w_ref=w_ref, o_ref=o_ref):
        acc = products(w_ref)
        for m in range(rows):
          o_ref[m, pl.ds(col, block)] = acc[m].astype(o_ref.dtype)


def _pallas(x, delta, scale, kernels, *, dtype, epsilon, activations, interpret):
  """The Triton kernel (or its interpretation on the host, for tests) on x [M, E]."""
  rows, width = x.shape
  out_width = kernels[0].shape[1]
  gated = activations is not None
  count = len(kernels)
  per_kernel = max(1, _TARGET_PROGRAMS // (1 if gated else count))
  block = _pow2_divisor(out_width, max(16, min(128, out_width // per_kernel)))
  programs = out_width // block * (1 if gated else count)
  chunk = _pow2_divisor(width, _CHUNK)
  out_shapes = [jax.ShapeDtypeStruct((rows, width), x.dtype)]
  out_shapes += [jax.ShapeDtypeStruct((rows, out_width), dtype)] * (1 if gated else count)
  call = _call(tuple(out_shapes), programs, interpret, rows=rows, width=width, chunk=chunk,
               block=block, count=count, gated=gated, has_delta=delta is not None,
               dtype=dtype, epsilon=epsilon, activations=tuple(activations or ()))
  return call(*([x] + ([delta] if delta is not None else []) + [scale] + list(kernels)))


@functools.lru_cache(maxsize=64)
def _call(out_shapes, programs: int, interpret: bool, **options) -> Callable:
  """The jitted Pallas call of one kernel configuration (`_kernel`'s options): jitted, a
  model's layers of one shape share its trace, and a program lowers it once (XLA inlines the
  calls: the compiled program is that of one Pallas call per sublayer)."""
  from jax.experimental import pallas as pl  # pylint: disable=import-outside-toplevel
  from jax.experimental.pallas import triton as pltriton  # pylint: disable=import-outside-toplevel
  return jax.jit(pl.pallas_call(
      functools.partial(_kernel, **options), out_shape=out_shapes, grid=(programs,),
      interpret=interpret, compiler_params=pltriton.CompilerParams(num_warps=4),
      name="specjax_norm_project"))


def norm_project(x: Array, delta: Optional[Array], norm: Callable[[Array], Array],
                 plain: Callable[[Array], Tuple[Array, ...]], scale: Optional[Array],
                 kernels: Sequence[Array], *, dtype: Any, epsilon: float = 1e-6,
                 activations: Optional[Sequence[Callable[[Array], Array]]] = None,
                 interpret: bool = False) -> Tuple[Array, Tuple[Array, ...]]:
  """(h, plain(norm(h))) with h = x + delta (x when delta is None): a sublayer's residual
  sum and what its projections make of the normed sum, in one kernel where lowered for an
  NVIDIA GPU (see the module's docstring), else by `norm` and `plain` themselves.

  Args:
    x, delta: [..., E] residual stream and the sublayer output to add to it (or None).
    norm: the layer's norm (`layers.RMSNorm` with `scale`, `epsilon` and `dtype`).
    plain: normed [..., E] -> outputs, the layer's own modules: one `Dense` per kernel, or
      with `activations` the gated product act_0(normed @ k_0) * act_1(normed @ k_1) ...
    scale: float32 [E], the norm's scale; None: `norm` and `plain` run everywhere.
    kernels: [E, N] each (one N), what `plain` multiplies by, in its order.
    dtype: the activations' dtype (the `Dense` modules' and the norm's).
    activations: None, or the gated MLP's functions, one per kernel (`layers.activation_fn`).
    interpret: run the Pallas kernel on the host (tests), wherever it is lowered.

  Returns:
    (h [..., E], outputs: one [..., N] per kernel, or with `activations` one [..., N]).
  """
  def run_plain(x, delta, *unused):
    del unused
    h = x if delta is None else x + delta
    return (h,) + tuple(plain(norm(h)))

  mixed = delta is not None and delta.dtype != x.dtype
  if scale is None or mixed or not enabled() or not _fits(x, kernels):
    out = run_plain(x, delta)
    return out[0], out[1:]
  lead = x.shape[:-1]
  flat = lambda a: None if a is None else a.reshape(-1, a.shape[-1])

  def fused(x, delta, scale, *kernels):
    out = _pallas(flat(x), flat(delta), scale, kernels, dtype=dtype, epsilon=epsilon,
                  activations=activations, interpret=interpret)
    return tuple(o.reshape(lead + o.shape[-1:]) for o in out)

  if interpret:
    out = fused(x, delta, scale, *kernels)
  else:
    out = lax.platform_dependent(x, delta, scale, *kernels, cuda=fused, default=run_plain)
  return out[0], out[1:]
