"""Building blocks of the T5X networks, with a multi-token KV cache.

Parameter names, shapes and initializers follow t5x/examples/t5/layers.py, so a
T5X checkpoint's `target` tree loads with no renaming: 2-D kernels
([E, H*D] for query/key/value, [H*D, E] for out), RMS layer norm `scale`,
`rel_embedding [H, 32]`, `embedding [V, E]`.

What differs from T5X is the cache. T5X's decoder cache takes one token per
step at one shared index. Here a cache is a `KVCache` of per-layer buffers,
keys [B, H, D, max_len] and values [B, H, max_len, D], and
`DecoderStack.decode_step` writes k tokens of row b at slots
`positions[b] .. positions[b] + k - 1`; query `positions[b] + i` sees the slots
`<= positions[b] + i`, so moving a row's length back is a rollback.
Relative position biases come from per-row absolute positions.

Cache layout and attention (why head-major, why keys [D, L], why two parts),
from the optimized HLO of the decode loops and profiler traces (bundled LM
pair, XLA:CPU; see the commits that introduced them for the counts):
- XLA's batched matmul wants the batch axes (here B and H) major and one
  matrix per (b, h). [B, L, H, D] buffers made XLA copy every cache
  buffer transposed on every call, as many cache-sized copies per step as
  there are buffers. Head-major buffers are read as they lie.
- Keys are stored [D, L] per (b, h), as T5X's own decode cache stores them
  (`cached_key` [batch, heads, head_dim, length]), so the scores q @ K are a
  plain [q, D] x [D, L] product. With [L, D] keys, XLA:CPU ran q @ K^T with
  q > 1 as a YNNPACK dot that re-packs the transposed keys on every call: at
  batch 8 with 3 queries and 256 slots, 270 us per layer against 121 with
  [D, L] keys (profiler), and the whole 3-token call of the LM target 9%
  slower (the 1-token call 7%). Values stay [L, D]: weights @ V is then a
  plain product too.
- A call attends over the cache as it was BEFORE the call (slots <
  positions[b]) and over its own k new keys, with one softmax over both parts
  (`cached_attention`). The write of the new keys (`write_rows`) is then only
  carried to the next call and never read in the same one. When the attention
  read the updated buffer instead, XLA at batch 1 (where the write is a
  fusible dynamic-update-slice) fused the write into its readers and copied
  every buffer twice per call.
- The write is made data-dependent on the attention output (`after`), so the
  reads of the old buffer are ordered before its in-place update; otherwise
  XLA copies the buffer to keep the old value alive.
These are layout and dataflow choices, no backend-specific ops: a dot with
batch axes major and an in-place update after its last reader are what XLA's
GPU and TPU compilers want too.
"""
from __future__ import annotations

import functools
import operator
from typing import Any, Callable, List, Optional, Sequence, Tuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specjax.checks import check_int
from specjax.params import SCALE_SUFFIX

Array = jax.Array
NEG_INF = -1e10  # T5X's additive mask value; softmax turns it into exactly 0.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
ATTENTION_IMPLEMENTATIONS = {
    "specjax": "the head-major cache read where it lies, one softmax over its parts "
               "(`cached_attention`); the default",
    "xla": "jax.nn.dot_product_attention(implementation='xla') over the parts joined "
           "(`fused_attention`)",
    "cudnn": "jax.nn.dot_product_attention(implementation='cudnn'): cuDNN's fused kernel "
             "(NVIDIA GPU only, bfloat16 or float16)",
}
"""Values of a model config's `attention_impl`: how attention is computed (not what)."""
NUM_BUCKETS = 32
MAX_DISTANCE = 128

# T5X initializers (t5x/examples/t5/layers.py and network.py).
attention_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
mlp_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
embedding_init = nn.initializers.normal(stddev=1.0)
relpos_init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")


# ----------------------------------------------------------------------------
# Configuration helpers shared by T5Config and DecoderOnlyConfig.
# ----------------------------------------------------------------------------
ACTIVATIONS = ("linear", "relu", "gelu", "silu", "swish", "sigmoid", "tanh", "elu", "celu",
               "selu", "softplus", "soft_sign", "leaky_relu", "relu6", "hard_sigmoid",
               "hard_silu", "hard_swish", "hard_tanh", "log_sigmoid")
"""The MLP activation names accepted: T5X's 'linear' and flax.linen's element-wise activation
functions (T5X looks a name up in flax.linen; specjax looks only these up, so a model gin file
cannot reach another flax.linen function such as `jit`)."""


def activation_fn(name: str) -> Callable[[Array], Array]:
  """Maps a T5X activation name (one of ACTIVATIONS) to a function.

  'gelu' is flax's default gelu, the tanh approximation, as T5X computes it.
  """
  if not isinstance(name, str) or name not in ACTIVATIONS:
    raise ValueError(f"unknown MLP activation {name!r}: use one of {', '.join(ACTIVATIONS)}")
  if name == "linear":
    return lambda x: x
  return getattr(nn, name)


# ----------------------------------------------------------------------------
# Relative position buckets.
# ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _bucket_table(bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
  """int32 [2 * max_distance + 1]: bucket of relative position r at r + max_distance.

  Evaluated once in numpy float32, the arithmetic T5X uses. Buckets saturate
  at |r| >= max_distance, so clipping r to that range is exact.
  """
  rel = np.arange(-max_distance, max_distance + 1, dtype=np.int32)
  dist = -rel  # how far back the key lies from the query
  offset = np.zeros_like(dist)
  if bidirectional:
    num_buckets //= 2
    offset = np.where(dist < 0, num_buckets, 0).astype(np.int32)
    dist = np.abs(dist)
  else:
    dist = np.maximum(dist, 0)
  exact = num_buckets // 2
  # Logarithmic buckets beyond `exact` (eps keeps log(0) finite; unused there).
  scaled = dist.astype(np.float32) / np.float32(exact)
  log_ratio = np.log(scaled + np.finfo(np.float32).eps) / np.float32(
      np.log(max_distance / exact))
  large = exact + (log_ratio * np.float32(num_buckets - exact)).astype(np.int32)
  large = np.minimum(large, num_buckets - 1)
  return (offset + np.where(dist < exact, dist, large)).astype(np.int32)


def relative_position_bucket(relative_position: Array, bidirectional: bool,
                             num_buckets: int = NUM_BUCKETS,
                             max_distance: int = MAX_DISTANCE) -> Array:
  """T5's bucket of `relative_position` = key position - query position.

  Args:
    relative_position: int array of any shape.
    bidirectional: False for causal attention (keys after the query share
      bucket 0); True splits the buckets between the two directions.
    num_buckets: number of buckets (T5: 32).
    max_distance: distances beyond this share the last bucket (T5: 128).

  Returns:
    int32 array of the same shape, values in [0, num_buckets).
  """
  table = jnp.asarray(_bucket_table(bool(bidirectional), num_buckets, max_distance))
  rel = jnp.clip(jnp.asarray(relative_position, jnp.int32), -max_distance, max_distance)
  return table[rel + max_distance]


# ----------------------------------------------------------------------------
# Layers.
# ----------------------------------------------------------------------------
class Dense(nn.Module):
  """Bias-free linear map with a 2-D float32 `kernel [in, features]` (T5X DenseGeneral)."""
  features: int
  kernel_init: Callable = mlp_kernel_init
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x: [..., in] -> [..., features] in `dtype`."""
    kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features),
                        jnp.float32)
    scales = (self.get_variable("params", "kernel" + SCALE_SUFFIX)
              if kernel.dtype == jnp.int8 else None)
    return dense_product(x, kernel, scales, self.dtype)


def dense_product(x: Array, kernel: Array, scales: Optional[Array], dtype: Any) -> Array:
  """What a `Dense` computes: x [..., in] @ kernel [in, out] -> [..., out] in `dtype`, by the
  kernel's dtype: bfloat16 (`specjax.params.cast_kernels`) through `bfloat16_dot`, int8 (a
  draft's, `specjax.params.quantize_kernels`, with its `scales`) through `int8_dot`, else in
  `dtype`."""
  if kernel.dtype == jnp.bfloat16:
    return bfloat16_dot(x, kernel).astype(dtype)
  if kernel.dtype == jnp.int8:
    return int8_dot(x, kernel, scales).astype(dtype)
  return plain_dot(x.astype(dtype), kernel.astype(dtype))


def dense_params(params: Any) -> Tuple[Array, Optional[Array]]:
  """A `Dense`'s (kernel, int8 scales or None), from its parameter dict."""
  return params["kernel"], params.get("kernel" + SCALE_SUFFIX)


def plain_dot(x: Array, kernel: Array, *, transposed: bool = False) -> Array:
  """x [..., in] @ kernel [in, out] ([out, in] with `transposed`) in their own dtype (float32
  weights). A single row is padded to two when lowered for a GPU or TPU, where XLA runs a
  one-row product as an elementwise multiply writing a weight-sized temporary and a reduce
  (see `bfloat16_dot`); XLA:CPU runs it as a fast matrix-vector product, so it stays one."""
  lead = x.shape[:-1]
  rows = x.reshape(-1, x.shape[-1])
  matrix = kernel.T if transposed else kernel
  product = lambda r: jnp.dot(r, matrix)
  if rows.shape[0] == 1:
    out = lax.platform_dependent(rows, cpu=product, default=lambda r: product(pad_row(r))[:1])
  else:
    out = product(rows)
  return out.reshape(lead + (matrix.shape[1],))


def pad_row(rows: Array) -> Array:
  """A single row [1, in] -> [2, in]: the product of two rows is a matrix product on every
  backend, of one row a reduction (see `bfloat16_dot`). On the CPU a zero row below (XLA:CPU
  then runs a YNNPACK dot); on a GPU or TPU the row twice (a broadcast, which XLA:GPU folds
  into the Triton GEMM that reads it, where a concatenation is one more kernel). Only row 0 of
  the product is kept either way."""
  return lax.platform_dependent(
      rows, cpu=lambda r: jnp.concatenate([r, jnp.zeros_like(r)], axis=0),
      default=lambda r: jnp.broadcast_to(r, (2,) + r.shape[1:]))


def project(x: Array, weights: Array, *, transposed: bool = False,
            scales: Optional[Array] = None) -> Array:
  """x [..., in] @ weights [in, out] ([out, in] with `transposed`) -> float32 [..., out]:
  bfloat16 weights through `bfloat16_dot`, int8 ones (with their `scales` [out]) through
  `int8_dot`, others as a float32 product."""
  if weights.dtype == jnp.bfloat16:
    return bfloat16_dot(x, weights, transposed=transposed)
  if weights.dtype == jnp.int8:
    if scales is None:
      raise ValueError("int8 weights need their scales (`specjax.params.quantize_kernels`)")
    return int8_dot(x, weights, scales, transposed=transposed)
  return plain_dot(x.astype(jnp.float32), weights.astype(jnp.float32), transposed=transposed)


def bfloat16_dot(x: Array, kernel: Array, *, transposed: bool = False) -> Array:
  """x [..., in] @ a bfloat16 kernel [in, out] -> float32 [..., out]; with `transposed`
  the kernel is [out, in] (an embedding table used as the output projection).

  The inputs are rounded to bfloat16 and the products summed in float32 (the
  precision of a T5X model run with dtype bfloat16). A single row (M = 1, a
  batch-1 decode step) is padded to two on every platform: XLA rewrites a
  one-row product with float32 sums as an elementwise multiply and a reduce,
  and on a GPU and a TPU that multiply writes a float32 temporary the size of
  the weight (read back by the reduce: about 3x a step's weight traffic); on
  the CPU it becomes a loop that converts every bfloat16 weight. Two rows are a
  matrix product (a Triton GEMM on a GPU, the MXU on a TPU, a YNNPACK dot on
  the CPU), faster even for the whole padded pair. The choice does not depend
  on the backend, so a program compiled for an accelerator on a CPU host
  (`specjax.aot`) is the one the accelerator runs.
  """
  lead = x.shape[:-1]
  rows = x.reshape(-1, x.shape[-1]).astype(jnp.bfloat16)
  m = rows.shape[0]
  if m == 1:
    rows = pad_row(rows)
  contract = 1 if transposed else 0
  out = lax.dot_general(rows, kernel, (((1,), (contract,)), ((), ())),
                        preferred_element_type=jnp.float32)[:m]
  return out.reshape(lead + (kernel.shape[1 - contract],))


def int8_dot(x: Array, values: Array, scales: Array, *, transposed: bool = False) -> Array:
  """x [..., in] @ an int8-quantized kernel -> float32 [..., out]: values int8 [in, out]
  ([out, in] with `transposed`) times scales float32 [out] (`specjax.params.quantize`).

  Each row of x is quantized on the fly the same way (symmetric, its max |x| to 127), the
  product summed in int32 and scaled back: a quarter of float32's weight bytes read, for
  drafts, whose weights only change how often their guesses are accepted. A single row is
  padded to two, as in `bfloat16_dot`.
  """
  lead = x.shape[:-1]
  rows = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
  m = rows.shape[0]
  if m == 1:
    rows = pad_row(rows)
  top = jnp.max(jnp.abs(rows), axis=-1, keepdims=True)
  row_scales = jnp.where(top > 0, top / 127.0, 1.0)
  quantized = jnp.clip(jnp.rint(rows / row_scales), -127, 127).astype(jnp.int8)
  contract = 1 if transposed else 0
  out = lax.dot_general(quantized, values, (((1,), (contract,)), ((), ())),
                        preferred_element_type=jnp.int32)
  out = out.astype(jnp.float32) * row_scales * scales.astype(jnp.float32)
  return out[:m].reshape(lead + (values.shape[1 - contract],))


class RMSNorm(nn.Module):
  """T5 layer norm: no mean subtraction, no bias; `scale [E]`, eps 1e-6."""
  dtype: Any = jnp.float32
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x: [..., E] -> [..., E] in `dtype`, normalized in float32."""
    x = x.astype(jnp.float32)
    mean2 = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    y = (x * lax.rsqrt(mean2 + self.epsilon)).astype(self.dtype)
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
    return y * scale.astype(self.dtype)


def embedding_rows(table: Array, tokens: Array) -> Array:
  """table[tokens] (rows of a [V, E] table). On the CPU a bfloat16 table's rows are gathered
  as their 16-bit patterns: XLA:CPU gathers bfloat16 through float32, converting the WHOLE
  table first, and in a decode loop hoists that float32 copy (2x the table's bytes) out of
  the loop into its state. A GPU and a TPU gather bfloat16 rows as they lie; XLA:TPU would
  write the 16-bit view as a copy of the whole table (hoisted out of the loop, the table's
  bytes more memory per device)."""
  take = lambda t: jnp.take(t, tokens, axis=0)
  if table.dtype == jnp.bfloat16:
    bits = lambda t: lax.bitcast_convert_type(take(lax.bitcast_convert_type(t, jnp.uint16)),
                                              jnp.bfloat16)
    return lax.platform_dependent(table, cpu=bits, default=take)
  return take(table)


class Embed(nn.Module):
  """Token embedding `embedding [V, E]`, also usable as the output projection."""
  num_embeddings: int
  features: int
  dtype: Any = jnp.float32

  def setup(self):
    self.embedding = self.param("embedding", embedding_init,
                                (self.num_embeddings, self.features), jnp.float32)

  def _scales(self) -> Optional[Array]:
    """An int8 table's scales [V] (`specjax.params.quantize_kernels`), else None."""
    if self.embedding.dtype != jnp.int8:
      return None
    return self.get_variable("params", "embedding" + SCALE_SUFFIX)

  def __call__(self, tokens: Array) -> Array:
    """tokens: int [...] -> [..., E] in `dtype`."""
    rows = embedding_rows(self.embedding, tokens)
    scales = self._scales()
    if scales is not None:
      rows = rows.astype(jnp.float32) * jnp.take(scales, tokens, axis=0)[..., None]
    return rows.astype(self.dtype)

  def attend(self, y: Array) -> Array:
    """y: [..., E] -> float32 [..., V], the dot product with every embedding (in
    bfloat16 with float32 sums when the table was cast by `cast_kernels`, in int8 when it
    was quantized)."""
    return project(y, self.embedding, transposed=True, scales=self._scales())


class MlpBlock(nn.Module):
  """T5X MLP: wo(act_0(x wi_0) * act_1(x wi_1) * ...); one activation names `wi`."""
  intermediate_dim: int
  activations: Tuple[str, ...] = ("gelu", "linear")
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x: [..., E] -> [..., E].

    One dot per input kernel. Joining them into one dot against the kernels concatenated
    (tried for the cached decode step) made every decode call concatenate the kernels
    anew: on XLA:CPU ~12 ms of a batch-1 decode call for the bundled LM target (29.5 MB
    written into fresh pages), against no measurable gain per step.
    """
    parts = [Dense(self.intermediate_dim, mlp_kernel_init, self.dtype, name=n)(x)
             for n in mlp_input_names(self.activations)]
    return Dense(x.shape[-1], mlp_kernel_init, self.dtype, name="wo")(
        gate(parts, self.activations))


def mlp_input_names(activations: Sequence[str]) -> List[str]:
  """T5X's names of an MLP's input kernels: 'wi' for one activation, else wi_0, wi_1, ..."""
  return ["wi"] if len(activations) == 1 else [f"wi_{i}" for i in range(len(activations))]


def gate(parts: Sequence[Array], activations: Sequence[str]) -> Array:
  """The gated MLP's hidden state: act_0(parts[0]) * act_1(parts[1]) * ..."""
  return functools.reduce(operator.mul, [activation_fn(act)(h)
                                         for act, h in zip(activations, parts)])


class RelativePositionBias(nn.Module):
  """T5 relative position bias, `rel_embedding [H, num_buckets]`, one per stack."""
  num_heads: int
  num_buckets: int = NUM_BUCKETS
  max_distance: int = MAX_DISTANCE

  @nn.compact
  def __call__(self, query_positions: Array, key_positions: Array,
               bidirectional: bool) -> Array:
    """Bias for every (query, key) pair from absolute positions.

    Args:
      query_positions: int32 [B, q] (B may be 1 to broadcast).
      key_positions: int32 [kv], shared by every row, or [B, kv] per row (a tree call).
      bidirectional: True in the encoder, False in decoders.

    Returns:
      float32 [B, H, q, kv].
    """
    table = self.param("rel_embedding", relpos_init,
                       (self.num_heads, self.num_buckets), jnp.float32)
    keys = key_positions[None] if key_positions.ndim == 1 else key_positions
    rel = keys[:, None, :] - query_positions[:, :, None]
    buckets = relative_position_bucket(rel, bidirectional, self.num_buckets,
                                       self.max_distance)  # [B, q, kv]
    return jnp.moveaxis(jnp.take(table.T, buckets, axis=0), -1, 1)


def dot_product_attention(query: Array, key: Array, value: Array, bias: Array,
                          dtype: Any) -> Array:
  """Softmax(q k^T + bias) v, logits and softmax in float32; no 1/sqrt(D).

  The uncached path (teacher forcing): keys and values as projected.

  Args:
    query: [B, q, H, D].
    key: [B, kv, H, D].
    value: [B, kv, H, D].
    bias: float32 [B or 1, H or 1, q, kv]; masks are NEG_INF entries.
    dtype: the dtype of the weighted sum.

  Returns:
    [B, q, H, D] in `dtype`.
  """
  logits = jnp.einsum("bqhd,bkhd->bhqk", query.astype(jnp.float32),
                      key.astype(jnp.float32)) + bias
  weights = jax.nn.softmax(logits, axis=-1).astype(dtype)
  return jnp.einsum("bhqk,bkhd->bqhd", weights, value.astype(dtype))


def cached_attention(query: Array, parts: Sequence[Tuple[Array, Array, Array]],
                     dtype: Any, soft_cap: Optional[float] = None) -> Array:
  """One softmax over the union of head-major key/value parts.

  Equal to `dot_product_attention` over the parts' keys concatenated along the
  key axis (only the order of the float sums differs), but the keys and
  values are read where they lie, and the softmax is taken part by part.
  Used with one part for cross-attention and with two for cached
  self-attention (the cache before this call's write, and the call's own new
  keys).

  Args:
    query: [B, q, H, D].
    parts: (keys [B, H, D, kv_i], values [B, H, kv_i, D],
      bias float32 [B or 1, H or 1, q, kv_i]) per part; masks are NEG_INF.
      Every query must see at least one key in some part.
    dtype: the dtype of the weighted sums.
    soft_cap: None, or c: each score q.k becomes c * tanh(q.k / c) before the bias is
      added (Gemma 2's attention logit soft cap).

  Returns:
    [B, q, H, D] in `dtype`.
  """
  batch, q, heads, depth = query.shape
  # Rows and heads as ONE batch axis of the matrix products (a free reshape of the
  # head-major buffers): XLA:CPU ran the products with two batch axes as a generic
  # batched dot, at batch 8 with 5 queries 0.58 ms per layer against 0.19 ms merged.
  merge = lambda x: x.reshape((batch * heads,) + x.shape[2:])
  query = merge(jnp.swapaxes(query.astype(jnp.float32), 1, 2))  # [B*H, q, D]
  # Queries times [D, kv_i] keys: a plain matrix product per (b, h) (module docstring).
  def scores(keys):
    out = jnp.einsum("nqd,ndk->nqk", query, merge(keys.astype(jnp.float32)))
    return out if soft_cap is None else jnp.tanh(out / soft_cap) * soft_cap

  logits = [scores(keys).reshape(batch, heads, q, -1) + bias for keys, _, bias in parts]
  # The softmax over the parts' union, part by part: no [q, Σ kv_i] concatenation (a
  # standalone op per layer and call on XLA:CPU; fewer ops, no measurable end-to-end change).
  top = functools.reduce(jnp.maximum, [jnp.max(x, axis=-1, keepdims=True) for x in logits])
  top = lax.stop_gradient(top)
  exps = [jnp.exp(x - top) for x in logits]
  total = functools.reduce(operator.add, [jnp.sum(e, axis=-1, keepdims=True) for e in exps])
  out = functools.reduce(operator.add, (
      jnp.einsum("nqk,nkd->nqd", merge((e / total).astype(dtype)),
                 merge(values.astype(dtype)))
      for e, (_, values, _) in zip(exps, parts)))
  out = out.reshape(batch, heads, q, depth)
  return jnp.swapaxes(out, 1, 2)  # [B, q, H, D]: q tokens, not the cache


def cache_attention(query: Array, keys: Array, values: Array, bias: Array, dtype: Any) -> Array:
  """`dot_product_attention` over one head-major cache, as plain products: the form XLA:GPU
  fuses into one kernel (scores, softmax and weighted sum; `cached_attention` splits its
  softmax over parts, which it cannot).

  Args:
    query: [B, q, H, D].
    keys: [B, H, D, kv]; values: [B, H, kv, D] (the cache's layouts).
    bias: float32 [B or 1, H or 1, q, kv]; masks are NEG_INF entries.
    dtype: the dtype of the weighted sum.

  Returns:
    [B, q, H, D] in `dtype`.
  """
  # The cache's layouts as `dot_product_attention` reads them: views, folded into the products.
  return dot_product_attention(query, jnp.transpose(keys, (0, 3, 1, 2)),
                               jnp.swapaxes(values, 1, 2), bias, dtype)


def fused_attention(query: Array, parts: Sequence[Tuple[Array, Array, Array]], dtype: Any,
                    implementation: str) -> Array:
  """`cached_attention` computed by `jax.nn.dot_product_attention` (scale 1, T5's convention).

  The parts are joined along the key axis in jax's [B, kv, H, D] layout: the cached keys
  [B, H, D, kv] and values [B, H, kv, D] are transposed first (on XLA:CPU a copy of every
  cache buffer per call; a fused kernel may read the strides instead). Query, keys and
  values are cast to `dtype` (jax's function needs one dtype); the scores and the softmax
  are float32 in its 'xla' implementation, as in `cached_attention`.

  Args:
    query: [B, q, H, D].
    parts: as for `cached_attention`: (keys [B, H, D, kv_i], values [B, H, kv_i, D],
      bias float32 [B or 1, H or 1, q, kv_i]).
    dtype: the dtype of the inputs and of the result.
    implementation: 'xla' or 'cudnn' (jax.nn.dot_product_attention's `implementation`).

  Returns:
    [B, q, H, D] in `dtype`.
  """
  keys = jnp.concatenate([jnp.transpose(k, (0, 3, 1, 2)) for k, _, _ in parts], axis=1)
  values = jnp.concatenate([jnp.swapaxes(v, 1, 2) for _, v, _ in parts], axis=1)
  lead = (max(b.shape[0] for _, _, b in parts), max(b.shape[1] for _, _, b in parts))
  if implementation == "cudnn":  # a full [B, H, q, kv] bias: no broadcast asked of the kernel
    lead = (query.shape[0], query.shape[2])
  bias = jnp.concatenate([jnp.broadcast_to(b, lead + b.shape[2:]) for _, _, b in parts],
                         axis=-1)  # [B or 1, H or 1, q, Σ kv_i]
  return jax.nn.dot_product_attention(query.astype(dtype), keys.astype(dtype),
                                      values.astype(dtype), bias=bias, scale=1.0,
                                      implementation=implementation).astype(dtype)


def attention_parts(implementation: str, dtype: Any) -> Callable:
  """`parts(query, parts) -> heads` for an `ATTENTION_IMPLEMENTATIONS` name: queries
  [B, q, H, D] over head-major parts (`cached_attention`) -> the heads' outputs [B, q, H, D]."""
  if implementation == "specjax":
    return functools.partial(cached_attention, dtype=dtype)
  return functools.partial(fused_attention, dtype=dtype, implementation=implementation)


class MultiHeadAttention(nn.Module):
  """T5X attention: `query`, `key`, `value` [E, H*D] and `out` [H*D, E] kernels.

  The 1/sqrt(head_dim) of dot-product attention is folded into the query
  kernel's initializer, as in T5X; the forward pass does not rescale.
  `implementation` picks how the weights are computed (ATTENTION_IMPLEMENTATIONS).
  """
  num_heads: int
  head_dim: int
  emb_dim: int
  dtype: Any = jnp.float32
  implementation: str = "specjax"

  def setup(self):
    inner = self.num_heads * self.head_dim
    depth = float(np.sqrt(self.head_dim))

    def query_init(key, shape, dtype=jnp.float32):
      return attention_kernel_init(key, shape, dtype) / depth

    self.query = Dense(inner, query_init, self.dtype)
    self.key = Dense(inner, attention_kernel_init, self.dtype)
    self.value = Dense(inner, attention_kernel_init, self.dtype)
    self.out = Dense(self.emb_dim, attention_kernel_init, self.dtype)

  def split_heads(self, x: Array) -> Array:
    """[..., H*D] -> [..., H, D]."""
    return x.reshape(x.shape[:-1] + (self.num_heads, self.head_dim))

  def project_q(self, x: Array) -> Array:
    """x: [B, L, E] -> queries [B, L, H, D]."""
    return self.split_heads(self.query(x))

  def project_kv(self, x: Array) -> Tuple[Array, Array]:
    """x: [B, L, E] -> (keys, values), each [B, L, H, D]."""
    return self.split_heads(self.key(x)), self.split_heads(self.value(x))

  def project_kv_heads(self, x: Array) -> Tuple[Array, Array]:
    """x: [B, L, E] -> keys [B, H, D, L] and values [B, H, L, D] (the cache's layout)."""
    key, value = self.project_kv(x)
    return key_layout(key), value_layout(value)

  def attend(self, query: Array, key: Array, value: Array, bias: Array) -> Array:
    """Queries [B, q, H, D] over keys/values [B, kv, H, D] -> [B, q, E]."""
    if self.implementation == "specjax":
      return self.output(dot_product_attention(query, key, value, bias, self.dtype))
    heads = jax.nn.dot_product_attention(
        query.astype(self.dtype), key.astype(self.dtype), value.astype(self.dtype), bias=bias,
        scale=1.0, implementation=self.implementation)
    return self.output(heads.astype(self.dtype))

  def attend_heads(self, query: Array, parts: Sequence[Tuple[Array, Array, Array]]) -> Array:
    """Queries [B, q, H, D] over head-major parts (see `cached_attention`) -> the heads'
    outputs [B, q, H, D], by `implementation`."""
    return attention_parts(self.implementation, self.dtype)(query, parts)

  def attend_parts(self, query: Array, parts: Sequence[Tuple[Array, Array, Array]]) -> Array:
    """Queries [B, q, H, D] over head-major parts (see `cached_attention`) -> [B, q, E]."""
    return self.output(self.attend_heads(query, parts))

  def output(self, x: Array) -> Array:
    """Per-head attention output [B, q, H, D] -> [B, q, E] (the `out` kernel)."""
    return self.out(x.reshape(x.shape[:-2] + (-1,)))

  def __call__(self, inputs_q: Array, inputs_kv: Array, bias: Array) -> Array:
    """Uncached attention: [B, q, E] over [B, kv, E] with bias [B|1, H|1, q, kv]."""
    return self.attend(self.project_q(inputs_q), *self.project_kv(inputs_kv), bias)


def after(x: Array, heads: Array) -> Array:
  """x [B, k, H, D], made to depend on `heads` [B, q, H, D]; the value is unchanged.

  Adds 0 * heads[:, :1, :, :1], so whatever computes `heads` runs before
  whatever uses the result. `DecoderLayer` orders each cache write after the
  attention that read the old buffer this way: XLA updates a buffer in place
  only when its last reader is ordered before the update, and its copy
  insertion orders by data dependence (XLA:CPU strips optimization barriers
  before it); without this XLA copied every cache buffer twice per call. The
  term is taken per row and head, so it stays on the device that holds those
  heads when the mesh splits them. Equal to x whenever `heads` is finite; a
  NaN there (the row's logits are NaN anyway) would also reach x.
  """
  return x + (0 * heads[:, :1, :, :1]).astype(x.dtype)


def mask_to_bias(mask: Array) -> Array:
  """bool [...] -> float32 [...]: 0 where True, NEG_INF where False."""
  return jnp.where(mask, 0.0, NEG_INF).astype(jnp.float32)


KEY_SLOT_AXIS = 3  # keys [B, H, D, L]
VALUE_SLOT_AXIS = 2  # values [B, H, L, D]


def key_layout(key: Array) -> Array:
  """Projected keys [B, L, H, D] -> the cache's key layout [B, H, D, L]."""
  return jnp.transpose(key, (0, 2, 3, 1))


def value_layout(value: Array) -> Array:
  """Projected values [B, L, H, D] -> the cache's value layout [B, H, L, D]."""
  return jnp.swapaxes(value, 1, 2)


def write_rows(buffer: Array, update: Array, starts: Array, axis: int) -> Array:
  """Writes update[b] into buffer[b] at slots starts[b] .. starts[b] + k - 1 of `axis`.

  Args:
    buffer: a cache buffer, keys [B, H, D, max_len] (axis 3) or values
      [B, H, max_len, D] (axis 2).
    update: the k new keys or values in the buffer's layout (`key_layout`,
      `value_layout`): k in place of max_len.
    starts: int32 [B]; the caller keeps starts[b] + k <= max_len (XLA clamps).
    axis: the slot axis, KEY_SLOT_AXIS or VALUE_SLOT_AXIS.

  Returns:
    The updated buffer, same shape and dtype. Under jit XLA updates it in
    place (a dynamic-update-slice at batch 1, a scatter otherwise) when its
    readers are ordered before the write (see `after`).
  """
  update = update.astype(buffer.dtype)
  if buffer.shape[0] == 1:
    # One row: a plain dynamic-update-slice (which clamps the start, as the
    # vmapped form does). XLA would turn the vmapped scatter into the same
    # update, but guarded by an in-bounds test it cannot prove: three extra
    # small ops per buffer and call, on any backend.
    return lax.dynamic_update_slice_in_dim(buffer, update, starts[0], axis=axis)

  def one_row(buf, upd, start):
    return lax.dynamic_update_slice_in_dim(buf, upd, start, axis=axis - 1)
  return jax.vmap(one_row)(buffer, update, starts)


def attend_and_write(query: Array, key: Array, value: Array, cache: Tuple[Array, Array],
                     bias: Tuple[Array, Array, Array], starts: Array, attend: Callable,
                     attend_written: Callable) -> Tuple[Array, Tuple[Array, Array]]:
  """A cached call's attention and cache write, in the order that runs fastest where it is
  lowered (`jax.lax.platform_dependent`; both orders compute the same values): on the CPU
  attend over the cache as it was and the call's own keys, then write after that read
  (`after`); on a GPU or TPU write first and attend over the written cache with the joined
  bias (`decoder_only.cached_self_attention` says why).

  query, key, value: the call's projections ([B, k, heads, D]); cache (keys, values) in their
  layouts; bias (over the cache before the call, over the call's own keys, over the cache
  after its write); starts int32 [B]. attend(query, parts) -> (heads, read): the attention
  over [(keys, values, bias), ...] and an array [B, q, H, D] the writes wait for;
  attend_written(query, keys, values, joined_bias) -> heads. Returns (heads, the written
  cache)."""
  def read_first(query, key, value, keys, values, old, new, joined, starts):
    del joined  # pylint: disable=unused-variable
    heads, read = attend(query, [(keys, values, old), (key_layout(key), value_layout(value), new)])
    key, value = after(key, read), after(value, read)  # read the old buffers, then write
    return heads, (write_rows(keys, key_layout(key), starts, KEY_SLOT_AXIS),
                   write_rows(values, value_layout(value), starts, VALUE_SLOT_AXIS))

  def write_first(query, key, value, keys, values, old, new, joined, starts):
    del old, new  # pylint: disable=unused-variable
    keys = write_rows(keys, key_layout(key), starts, KEY_SLOT_AXIS)
    values = write_rows(values, value_layout(value), starts, VALUE_SLOT_AXIS)
    return attend_written(query, keys, values, joined), (keys, values)

  return lax.platform_dependent(query, key, value, cache[0], cache[1], *bias, starts,
                                cpu=read_first, default=write_first)


# ----------------------------------------------------------------------------
# Cache and cross-attention inputs.
# ----------------------------------------------------------------------------
@flax.struct.dataclass
class KVCache:
  """Self-attention keys and values of every decoder layer; batch axis first.

  Allocated once by `init_cache`; `decode` returns a cache of the same shapes.
  Which slots are valid is not stored here: the decode loop tracks each row's
  length and passes it as `positions`.
  """
  keys: Tuple[Array, ...]  # per layer: dtype [B, H, D, max_len] (as T5X's cached_key)
  values: Tuple[Array, ...]  # per layer: dtype [B, H, max_len, D]

  @property
  def batch(self) -> int:
    """Number of rows B."""
    return self.keys[0].shape[0]

  @property
  def max_len(self) -> int:
    """Number of slots per row."""
    return self.values[0].shape[2]


def zeros_cache(batch: int, max_len: int, num_layers: int, num_heads: int,
                head_dim: int, dtype: Any) -> KVCache:
  """A zeroed KVCache; raises ValueError for non-positive sizes."""
  for name, value in (("batch", batch), ("max_len", max_len)):
    check_int(f"init_cache: {name}", value, low=1, expected="a positive integer")
  keys = tuple(jnp.zeros((int(batch), num_heads, head_dim, int(max_len)), dtype)
               for _ in range(num_layers))
  values = tuple(jnp.zeros((int(batch), num_heads, int(max_len), head_dim), dtype)
                 for _ in range(num_layers))
  return KVCache(keys=keys, values=values)


@flax.struct.dataclass
class EncodedInputs:
  """What cross-attention needs, computed once per generation by `encode`."""
  keys: Tuple[Array, ...]  # per decoder layer: dtype [B, H, D, L_in] (as KVCache)
  values: Tuple[Array, ...]  # per decoder layer: dtype [B, H, L_in, D]
  mask: Array  # bool [B, L_in], True at real (non-padding) input tokens
