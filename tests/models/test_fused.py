"""A sublayer's entry as one GPU kernel (`specjax.models.fused.norm_project`), run on this CPU
by Pallas's interpreter: the same values as the layers' own ops, alone and inside whole models.

The kernel is what a cached call runs where lowered for an NVIDIA GPU; on this CPU the decode
functions take the layers' own ops. Here `lax.platform_dependent` is patched to take the
`cuda` branch (the GPU's; the other branches their accelerator default) and the kernel runs
interpreted, so the GPU's values are checked against the CPU's: logits and caches of chain
calls and a tree call of the tiny pairs, float32 and bfloat16 weights, equal within the
rounding of a different summation order. Its deviceless compile (one kernel per sublayer
entry): tests/aot/test_deviceless.py.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.models import fused
from specjax.models.layers import activation_fn, bfloat16_dot
from specjax.params import cast_kernels
from tests.models.calls import chain_and_tree_calls, encoded_inputs

pytestmark = pytest.mark.usefixtures("float32_matmuls")


def _norm(scale, dtype):
  def norm(h):
    h = h.astype(jnp.float32)
    y = (h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-6)).astype(dtype)
    return y * scale.astype(dtype)
  return norm


def _product(x, w, dtype):
  if w.dtype == jnp.bfloat16:
    return bfloat16_dot(x, w).astype(dtype)
  return jnp.dot(x.astype(dtype), w.astype(dtype), precision="highest")


@pytest.mark.parametrize("rows, gated, with_delta, dtypes", [
    (5, False, False, ("float32", "bfloat16")), (5, True, True, ("float32", "bfloat16")),
    (1, True, True, ("bfloat16", "bfloat16")), (16, False, True, ("bfloat16", "bfloat16")),
    (5, False, True, ("float32", "float32")), (16, True, False, ("float32", "float32"))])
def test_the_kernel_equals_the_layers_ops(rows, gated, with_delta, dtypes):
  """E = 384 (three chunks of 128), N = 200 (blocks of 8): the loops over chunks and
  blocks, the residual written once, each kernel's own columns (a kernel reading another's
  columns, or the gate's factors swapped, is off by O(1))."""
  dtype, weights = (getattr(jnp, d) for d in dtypes)
  keys = jax.random.split(jax.random.PRNGKey(rows), 6)
  x = jax.random.normal(keys[0], (1, rows, 384)).astype(dtype)
  delta = jax.random.normal(keys[1], (1, rows, 384)).astype(dtype) if with_delta else None
  scale = 1 + 0.2 * jax.random.normal(keys[2], (384,))
  kernels = [(jax.random.normal(k, (384, 200)) / 20).astype(weights) for k in keys[3:]]
  if gated:
    kernels = kernels[:2]
  acts = [activation_fn("gelu"), activation_fn("linear")] if gated else None

  def plain(normed):
    parts = [_product(normed, w, dtype) for w in kernels]
    return [acts[0](parts[0]) * acts[1](parts[1])] if gated else parts

  args = (x, delta, _norm(scale, dtype), plain)
  want_h, want = fused.norm_project(*args, None, kernels, dtype=dtype)  # the layers' ops
  got_h, got = fused.norm_project(*args, scale, kernels, dtype=dtype, activations=acts,
                                  interpret=True)
  np.testing.assert_array_equal(np.asarray(got_h, np.float32), np.asarray(want_h, np.float32))
  assert len(got) == len(want) == (1 if gated else 3)
  tol = 2e-2 if dtype == jnp.bfloat16 else 2e-5  # a bfloat16 output: one rounding step
  for g, w in zip(got, want):
    assert g.shape == w.shape and g.dtype == w.dtype
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                               rtol=tol, atol=tol)


def test_calls_it_does_not_fit_take_the_layers_ops():
  """More rows than `MAX_ROWS`, int8 kernels, or SPECJAX_NORM_KERNEL=xla: no kernel."""
  x = jnp.ones((1, fused.MAX_ROWS + 1, 16))
  w = jnp.ones((16, 8))
  assert not fused._fits(x, [w])  # pylint: disable=protected-access
  assert fused._fits(x[:, :fused.MAX_ROWS], [w])  # pylint: disable=protected-access
  assert not fused._fits(x[:, :2], [w.astype(jnp.int8)])  # pylint: disable=protected-access
  assert not fused._fits(x[:, :2], [w, jnp.ones((16, 16))])  # pylint: disable=protected-access


def test_the_environment_turns_the_kernel_off(monkeypatch):
  monkeypatch.setenv(fused.ENV, "xla")
  assert not fused.enabled()
  monkeypatch.setenv(fused.ENV, "fused")
  assert fused.enabled()


def _gpu_branch(*args, default, **branches):
  """`lax.platform_dependent` as lowered for an NVIDIA GPU."""
  return branches.get("cuda", default)(*args)


@pytest.mark.parametrize("family, weights", [("lm", "float32"), ("t5", "bfloat16")])
def test_models_compute_the_same_with_the_kernel(family, weights, tiny_lm_pair, tiny_t5_pair,
                                                 monkeypatch):
  """Every sublayer entry of the tiny pairs' targets through the kernel (self-attention,
  cross-attention, MLP): logits and caches as the CPU's ops make them."""
  pair = tiny_lm_pair if family == "lm" else tiny_t5_pair
  model, params = pair.target, pair.target_params
  if weights == "bfloat16":
    params = cast_kernels(params, jnp.bfloat16)
  encoded = encoded_inputs(model, params)
  cpu = chain_and_tree_calls(model, params, encoded)
  entered = []
  interpreted = functools.partial(fused._pallas, interpret=True)  # pylint: disable=protected-access

  def counted(*args, **kwargs):
    entered.append(args[0].shape)
    kwargs.pop("interpret")
    return interpreted(*args, **kwargs)

  monkeypatch.setattr(fused, "_pallas", counted)
  monkeypatch.setattr(jax.lax, "platform_dependent", _gpu_branch)
  gpu = chain_and_tree_calls(model, params, encoded)
  layers = model.config.num_layers if family == "lm" else model.config.num_decoder_layers
  # Per call and layer: self-attention and MLP entries, and T5's cross-attention's.
  assert len(entered) == 4 * layers * (2 if family == "lm" else 3)
  for a, b in zip(jax.tree.leaves(cpu), jax.tree.leaves(gpu)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=2e-4, atol=2e-4)


class _Spread:
  """A partitioner's face as `placed_by` reads it: a mesh of `size` devices."""

  def __init__(self, size):
    self.mesh = type("Mesh", (), {"size": size})()


def test_a_trace_spread_over_devices_takes_the_layers_ops(monkeypatch):
  """Under a partitioner of several devices the kernel is off (XLA would gather its operands,
  weights included, onto every device); one device or none leaves it on, and leaving the
  block turns it back on."""
  monkeypatch.delenv(fused.ENV, raising=False)
  with fused.placed_by(_Spread(2)):
    assert not fused.enabled()
    with fused.placed_by(None):
      assert not fused.enabled()
  assert fused.enabled()
  for one in (None, _Spread(1)):
    with fused.placed_by(one):
      assert fused.enabled()


def test_the_decode_loops_trace_under_their_partitioner(monkeypatch):
  """run_loop, the streamed loop and beam search trace their calls inside `placed_by`."""
  import inspect  # pylint: disable=import-outside-toplevel
  from specjax.decode import beam, runner, stream  # pylint: disable=import-outside-toplevel
  for fn in (runner.run_loop, stream._run, beam._beam_search):  # pylint: disable=protected-access
    assert "fused.placed_by(partitioner)" in inspect.getsource(fn.__wrapped__)
