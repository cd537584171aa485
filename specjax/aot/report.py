"""What an accelerator would run, compiled on this host: one report per compiled piece.

A piece is a jitted function and abstract arguments (shapes and dtypes only: no weights are
allocated, so an XXL model compiles on a laptop). `compile_piece` compiles it for a named
accelerator (`specjax.aot.targets`) and reads the optimized program (`specjax.aot.hlo`):

  kernels        kernels one iteration of the piece's loop launches (a step, or a round)
  per_layer      of those, per decoder layer (their op names say which layer they came from)
  f32_temps      kernels that write a float32 array shaped like a weight matrix
                 (`weight_matrices`), and the bytes they move (written, then read back)
  floor_bytes    what an iteration must read at least: the weights it reads (`read_weights`)
                 and the KV cache
  whiles         loops nested inside one iteration (on a GPU each costs a copy of its predicate
                 to the host per trip)
  custom_calls   {target: count} inside one iteration (cuDNN, Pallas kernels, ...)
  compiler       XLA's own cost and memory analysis where the backend gives one (a TPU's:
                 'bytes accessed' there includes weight prefetches, a while body counted once)
  estimate       the step-time model's prediction of one iteration (`specjax.aot.cost`)

`model_pieces` builds the pieces of a decode: the target's one-token step, the draft's step,
the feature head's step, and the autoregressive, chain, tree, feature-chain and streamed loops.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.aot import cost, hlo, targets


@dataclasses.dataclass(frozen=True)
class Piece:
  """A function to compile and its abstract arguments."""
  name: str
  """What it is, e.g. 'target step', 'chain loop'."""
  fn: Callable
  """A jitted function (static arguments bound)."""
  args: Tuple
  """Its arguments as pytrees of `jax.ShapeDtypeStruct` (placed by `compile_piece`)."""
  layers: int
  """Decoder layers of one model that one iteration runs through (for the per-layer figure;
  0: not counted, as in a round, whose kernels hold the target's and the drafter's layers)."""
  weights: Any
  """The weights one iteration reads (abstract pytree), for the floor and the smallest matrix."""
  cache_bytes: int = 0
  """KV-cache bytes one iteration reads, for the floor."""
  cache: Any = None
  """Those caches (abstract: a `KVCache`, T5's encoded inputs), for one device's share."""


@dataclasses.dataclass
class Report:
  """The compiled program of one piece, read (see the module docstring)."""
  piece: str
  target: str
  kernels: int
  per_layer: float
  outside_layers: int
  f32_temps: int
  f32_temp_bytes: int
  floor_bytes: int
  whiles: int
  custom_calls: Dict[str, int]
  compile_s: float
  devices: int = 1
  """Devices the models are split over (the figures are one device's)."""
  compiler: Dict[str, float] = dataclasses.field(default_factory=dict)
  estimate: Any = None
  """The step-time model's `specjax.aot.cost.Estimate` of one iteration (None: not known)."""

  def row(self) -> Dict[str, Any]:
    """The report as a flat table row (MB for bytes)."""
    return {"piece": self.piece, "target": self.target, "devices": self.devices,
            "kernels": self.kernels,
            "per_layer": round(self.per_layer, 1) if self.per_layer else "",
            "outside_layers": self.outside_layers,
            "f32_temps": self.f32_temps, "f32_temp_MB": round(self.f32_temp_bytes / 1e6, 1),
            "floor_MB": round(self.floor_bytes / 1e6, 1), "whiles": self.whiles,
            "custom_calls": ", ".join(f"{k} x{v}" for k, v in sorted(self.custom_calls.items())),
            "compile_s": round(self.compile_s, 1), **self.compiler,
            **(self.estimate.row() if self.estimate is not None else {})}


def _key_name(key) -> str:
  for attribute in ("key", "name", "idx"):
    if hasattr(key, attribute):
      return str(getattr(key, attribute))
  return str(key)


def _model_of(names: List[str], at: int) -> Tuple[str, ...]:
  """The path of the model that owns `names[at]`: the names before it, less a T5's or a
  decoder-only model's `decoder` scope (T5 keeps its embedding beside that scope, the
  decoder-only model inside it)."""
  prefix = names[:at]
  return tuple(prefix[:-1] if prefix[-1:] == ["decoder"] else prefix)


def read_weights(weights: Any) -> List[Any]:
  """The leaves of `weights` (one model's parameters, or a tuple or `LoopParams` of several)
  that one iteration reads in full, for the floor. Left out: a T5 encoder (run once per
  decode), a T5 decoder's cross-attention key and value kernels (`encode` applies them once;
  a step reads their output, the encoded inputs, counted with the cache), and a token
  embedding that the logits do not read (a model with `logits_dense`: a step gathers a few
  rows of it). A Gemma's embedding is its logits' kernel too, so it stays."""
  leaves = [([_key_name(k) for k in path], x)
            for path, x in jax.tree_util.tree_flatten_with_path(weights)[0]]
  untied = {_model_of(names, names.index("logits_dense"))
            for names, _ in leaves if "logits_dense" in names}
  read = []
  for names, x in leaves:
    if "encoder" in names:
      continue
    if "encoder_decoder_attention" in names:
      at = names.index("encoder_decoder_attention")
      if names[at + 1:at + 2] in (["key"], ["value"]):
        continue
    if "token_embedder" in names and _model_of(names, names.index("token_embedder")) in untied:
      continue
    read.append(x)
  return read


def _split_floor(piece: Piece, partitioner) -> int:
  """One device's share of `piece`'s floor: the weights it reads (`read_weights`) and its
  caches, split as `split` splits them (a piece without its `cache` tree: the cache's bytes
  over the devices)."""
  weights = per_device_nbytes(read_weights(_placed(
      piece.weights, _param_shardings(piece.weights, partitioner))))
  if piece.cache is None:
    return weights + piece.cache_bytes // partitioner.mesh.size
  return weights + per_device_nbytes(_placed(piece.cache,
                                             partitioner.state_shardings(piece.cache)))


def _nbytes(tree: Any) -> int:
  return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def weight_matrices(weights: Any) -> List[Tuple[int, ...]]:
  """The shapes of the weight matrices whose float32 copies count as temporaries: parameters
  of two axes or more (T5X's 2-D kernels; a Gemma's [N, E, H] and [2, F, E] einsum weights)
  at least half the median one's size (projections and embeddings; not the small
  relative-position tables, whose per-step float32 relayout on a TPU is a few KB)."""
  shapes = [tuple(x.shape) for x in jax.tree.leaves(weights) if len(x.shape) >= 2]
  if not shapes:
    return []
  sizes = sorted(math.prod(shape) for shape in shapes)
  floor = sizes[len(sizes) // 2] / 2
  return [shape for shape in shapes if math.prod(shape) >= floor]


def place(tree: Any, device) -> Any:
  """Abstract arrays (anything with shape and dtype) on one compile-only `device`."""
  mesh = jax.sharding.Mesh(np.array([device]), ("x",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def split(args: Sequence[Any], devices: Sequence[Any]) -> Tuple[Tuple, Any]:
  """(abstract `args` placed over `devices`, the `Partitioner`) for a model split over them:
  the project's `specjax.runtime.sharding.Partitioner` with every device on its 'model' axis
  (heads, MLP and vocabulary split; `STANDARD_RULES`). args[0] is the piece's parameters (a
  tree, or `LoopParams` of trees: each split by its names), the rest loop state and caches
  (`Partitioner.state_shardings`: caches split by heads, the rest replicated)."""
  from specjax.runtime.sharding import Partitioner  # pylint: disable=import-outside-toplevel
  partitioner = Partitioner(num_partitions=len(devices), devices=tuple(devices))
  shardings = ((_param_shardings(args[0], partitioner),)
               + tuple(partitioner.state_shardings(a) for a in args[1:]))
  return _placed(tuple(args), shardings), partitioner


def _param_shardings(tree: Any, partitioner) -> Any:
  """Shardings of parameter trees (a dict by its names; `LoopParams`, tuples of them)."""
  from specjax.decode.state import LoopParams  # pylint: disable=import-outside-toplevel
  if isinstance(tree, LoopParams):
    return LoopParams(*(_param_shardings(getattr(tree, f.name), partitioner)
                        for f in dataclasses.fields(tree)))
  if isinstance(tree, (tuple, list)):
    return type(tree)(_param_shardings(t, partitioner) for t in tree)
  if isinstance(tree, dict):
    return partitioner.param_shardings(tree)
  return partitioner.state_shardings(tree)


def _placed(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                      shardings)


def per_device_nbytes(tree: Any) -> int:
  """Bytes of one device's shards of abstract arrays placed by `split` (all of an array
  without a sharding)."""
  total = 0
  for x in jax.tree.leaves(tree):
    sharding = getattr(x, "sharding", None)
    shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
    total += math.prod(shape) * np.dtype(x.dtype).itemsize
  return total


def _compiler_figures(compiled, tpu: bool) -> Dict[str, float]:
  """XLA's memory analysis of one device's program (every backend: its arguments, temporaries
  and peak in MB), and on a TPU its cost analysis too (FLOPs, bytes accessed)."""
  out: Dict[str, float] = {}
  if tpu:
    try:
      cost = compiled.cost_analysis()
      cost = cost[0] if isinstance(cost, (list, tuple)) else cost
      for key in ("flops", "bytes accessed"):
        if cost and key in cost:
          out[f"xla_{key.replace(' ', '_')}"] = float(cost[key])
    except Exception:  # pylint: disable=broad-except  # not every backend answers
      pass
  try:
    memory = compiled.memory_analysis()
    if memory is not None:
      out["xla_args_MB"] = round(memory.argument_size_in_bytes / 1e6, 1)
      out["xla_temp_MB"] = round(memory.temp_size_in_bytes / 1e6, 1)
      peak = getattr(memory, "peak_memory_in_bytes", 0)
      if peak:
        out["xla_peak_MB"] = round(peak / 1e6, 1)
  except Exception:  # pylint: disable=broad-except
    pass
  return out


GPU_COMPILE_OPTIONS = {"xla_llvm_disable_expensive_passes": True,
                       "xla_gpu_disable_gpuasm_optimizations": True}
"""XLA options of a GPU compile here: LLVM's and ptxas's optimizations off. They act after the
HLO passes, on machine code nobody runs here, so the optimized program read is the same
(`tests/aot/test_deviceless.py` compares it), in about half the compile time."""


def retraced(traced, like: Callable) -> Callable:
  """A jitted function that binds the ops of `traced` (a `jax.stages.Traced` of the jitted
  `like`) again, for placing the arguments on another device: its jaxpr is evaluated, not the
  model's Python traced again (a piece's trace for a GPU and for a TPU is the same jaxpr:
  where the programs differ, `jax.lax.platform_dependent` holds both branches). The
  arguments keep `like`'s names and donations, so the lowered program is the one a fresh
  trace gives."""
  import inspect  # pylint: disable=import-outside-toplevel
  from jax._src import core  # pylint: disable=import-outside-toplevel
  closed = traced.jaxpr
  sizes = [child.num_leaves for child in traced.in_tree.children()[0].children()]
  starts = np.cumsum([0] + sizes)
  donated = set(traced.donate_argnums)
  donate = tuple(i for i, n in enumerate(sizes) if n and all(
      j in donated for j in range(starts[i], starts[i] + n)))

  def again(*args):
    out = core.eval_jaxpr(closed.jaxpr, closed.consts, *jax.tree.leaves(args))
    return jax.tree.unflatten(traced.out_tree, out)
  again.__name__ = again.__qualname__ = traced.fun_name
  try:
    names = list(inspect.signature(like).parameters)
  except (TypeError, ValueError):
    names = []
  names = names[:len(sizes)] + [f"arg{i}" for i in range(len(names), len(sizes))]
  again.__signature__ = inspect.Signature([
      inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names])
  return jax.jit(again, donate_argnums=donate)


def compile_piece(piece: Piece, target: str, devices: int = 1,
                  traces: Optional[Dict[str, Any]] = None) -> Tuple[Report, str]:
  """(its `Report`, the optimized HLO text: one device's program) of `piece` compiled for
  `target` without the device; with `devices` > 1 the models split over that many devices
  (`split`; the floor is then one device's share). Raises `targets.TargetUnavailable` when
  the target's compiler is missing.

  traces: {piece name: `jax.stages.Traced`} shared by the calls of one run: a TPU target
  lowers a trace made for another accelerator (`retraced`: seconds, against the model's
  Python traced again); a GPU target traces afresh (its Pallas kernels are traced for its
  kind) and leaves its trace there. None: trace here. A split compile traces afresh (its
  trace has no Pallas calls: `fused.placed_by`)."""
  chosen = targets.devices(target, devices)
  start = time.perf_counter()
  gpu = targets.target(target).platform == "gpu"
  if devices == 1:
    args, context = place(piece.args, chosen[0]), (
        # Pallas's Triton lowering asks for the GPU's kind (`specjax.models.fused`).
        targets.kernels_for(chosen[0]) if gpu else contextlib.nullcontext())
  else:  # XLA's partitioner would gather a Pallas call's operands: XLA's own kernels
    from specjax.models import fused  # pylint: disable=import-outside-toplevel
    args, partitioner = split(piece.args, chosen)
    context = fused.placed_by(partitioner)
    traces = None
  shared = None if gpu or traces is None else traces.get(piece.name)
  with context:
    if shared is not None:
      lowered = retraced(shared, piece.fn).lower(*args)
    else:
      traced = piece.fn.trace(*args)
      if traces is not None:
        traces.setdefault(piece.name, traced)
      lowered = traced.lower()
  compiled = lowered.compile(compiler_options=GPU_COMPILE_OPTIONS) if gpu else lowered.compile()
  seconds = time.perf_counter() - start
  text = compiled.as_text()
  kernels = hlo.body_kernels(text)
  per_layer, _, outside = hlo.per_layer(kernels)
  temps = hlo.f32_temporaries(kernels, weight_matrices(piece.weights))
  temp_bytes = 2 * sum(4 * n for k in temps for dtype, n in k.outputs() if dtype == "f32")
  calls: Dict[str, int] = {}
  for k in kernels:
    if k.opcode == "custom-call":
      calls[k.kind] = calls.get(k.kind, 0) + 1
  report = Report(
      piece=piece.name, target=target, kernels=len(kernels),
      per_layer=per_layer if piece.layers else 0.0, outside_layers=outside,
      f32_temps=len(temps), f32_temp_bytes=temp_bytes,
      floor_bytes=(_nbytes(read_weights(piece.weights)) + piece.cache_bytes) if devices == 1 else
      _split_floor(piece, partitioner), devices=devices,
      whiles=sum(k.opcode == "while" for k in kernels), custom_calls=calls,
      compile_s=seconds,
      compiler=_compiler_figures(compiled, not gpu))
  try:
    report.estimate = cost.estimate(text, target, floor_bytes=report.floor_bytes)
  except targets.TargetUnavailable:  # a 'gpu:FILE' without bandwidth: no estimate
    pass
  return report, text


# ----------------------------------------------------------------------------
# The pieces of a decode.
# ----------------------------------------------------------------------------
def _layers(model) -> int:
  cfg = model.config
  return getattr(cfg, "num_layers", None) or getattr(cfg, "num_decoder_layers", 0)


def _decoder_weights(model, params) -> Any:
  """The weights a decode step reads: all but a T5 encoder's (abstract)."""
  if isinstance(params, dict) and "encoder" in params:
    return {k: v for k, v in params.items() if k != "encoder"}
  return params


def step_piece(name: str, model, params, *, batch: int, cache_len: int, input_len: int = 8,
               steps: int = 4) -> Piece:
  """`steps` one-token `model.decode` calls in a jitted `fori_loop` (the step as the loops
  make it; one iteration is one step), the cache donated so it is updated in place.

  Args:
    name: the piece's name.
    model: a `specjax.models` model (decoder-only or T5).
    params: its parameters, abstract (`jax.eval_shape`) or real.
    batch, cache_len: the cache's rows and slots; input_len: a T5's encoded input length.
  """
  cache = jax.eval_shape(lambda: model.init_cache(batch, cache_len))
  encoded = None
  if model.is_encoder_decoder:
    encoded = jax.eval_shape(model.encode, params, jax.ShapeDtypeStruct((batch, input_len),
                                                                        jnp.int32))

  def decode_steps(params, cache, encoded, tokens):
    def body(i, carry):
      cache, tokens = carry
      logits, cache = model.decode(params, cache, tokens, jnp.full((batch,), i, jnp.int32),
                                   encoded)
      return cache, jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32)
    return jax.lax.fori_loop(0, steps, body, (cache, tokens))

  fn = jax.jit(decode_steps, donate_argnums=(1,))
  tokens = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
  return Piece(name, fn, (params, cache, encoded, tokens), _layers(model),
               _decoder_weights(model, params), _nbytes(cache) + _nbytes(encoded),
               (cache, encoded))


def head_step_piece(name: str, head, params, *, batch: int, cache_len: int,
                    steps: int = 4, encoded: Any = None, vocab_rows: int = 0) -> Piece:
  """`steps` one-position `head.decode` calls of a feature head (`specjax.models.FeatureHead`)
  in a jitted `fori_loop` (one iteration is one guess), each reading the features the last one
  predicted (a chain's later guesses). With `vocab_rows` K > 0 a guess is a feature drafter's
  whole guess: the logits of K output rows (an abstract [K, E] matrix in the head's dtype, as
  `FeatureDrafter` with `vocab_limit` K reads them), their argmax, and that row as the next
  guess's embedding; with 0 the logits are not counted. `encoded`: an encoder-decoder target's
  abstract `encode` output, for a head with cross_attention (it reads the target's last
  layer's cross-attention keys and values)."""
  cache = jax.eval_shape(lambda: head.init_cache(batch, cache_len))
  width = head.config.emb_dim
  kernel_dtype = max(jax.tree.leaves(params), key=lambda x: math.prod(x.shape)).dtype

  def head_steps(params, rows, cache, encoded, features, embedded):
    def body(i, carry):
      cache, features, embedded = carry
      predicted, cache = head.decode(params, cache, features, embedded,
                                     jnp.full((batch,), i, jnp.int32), encoded=encoded)
      if rows is not None:
        # int8 rows are read as int8 and widened in the dot (their scales are not modelled).
        table = rows.astype(jnp.bfloat16) if rows.dtype == jnp.int8 else rows
        logits = jnp.einsum("bke,ve->bkv", predicted.astype(table.dtype), table,
                            preferred_element_type=jnp.float32)
        embedded = jnp.take(rows, jnp.argmax(logits, axis=-1), axis=0).astype(jnp.float32)
      return cache, predicted, embedded
    return jax.lax.fori_loop(0, steps, body, (cache, features, embedded))

  fn = jax.jit(head_steps, donate_argnums=(2,))
  features = jax.ShapeDtypeStruct((batch, 1, width), jnp.float32)
  rows = jax.ShapeDtypeStruct((vocab_rows, width), kernel_dtype) if vocab_rows else None
  weights = params if rows is None else (params, rows)
  return Piece(name, fn, (params, rows, cache, encoded, features, features), 1, weights,
               _nbytes(cache) + _nbytes(encoded), (cache, encoded))


def loop_piece(name: str, loop, params, *, batch: int, input_len: int, cache_len: int,
               weights: Any) -> Piece:
  """The whole decode of one padded batch (`specjax.decode.runner.run_loop`: start, then one
  while loop of rounds), as the decode entry points run it; one iteration is one round.

  Args:
    loop: an `AutoregressiveLoop`, `SpeculativeLoop` or `TreeLoop` (its config's cache_len set).
    params: its `LoopParams`, abstract.
    batch, input_len, cache_len: the padded batch's rows, input length and cache slots.
    weights: what a round reads (for the floor and the weight shapes).
  """
  from specjax.decode import runner  # pylint: disable=import-outside-toplevel
  from specjax.sampling import row_keys  # pylint: disable=import-outside-toplevel
  fn = jax.jit(lambda params, inputs, seq, length, keys, budget, gamma: runner.run_loop(
      loop, None, params, inputs, seq, length, keys, budget, gamma))
  ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
  keys = jax.eval_shape(lambda: row_keys(jax.random.PRNGKey(0), batch))
  gamma = ints()  # a loop that does not read it ignores it (jit drops the argument)
  cache = jax.eval_shape(lambda: loop.target.init_cache(batch, cache_len))
  return Piece(name, fn, (params, ints(batch, input_len), ints(batch, cache_len), ints(batch),
                          keys, ints(), gamma), 0, weights, _nbytes(cache), cache)


def stream_piece(name: str, loop, params, *, slots: int, examples: int, input_len: int,
                 cache_len: int, weights: Any) -> Piece:
  """One chunk of a streamed decode (`specjax.decode.stream.chunk_program`: refill free slots,
  then rounds, in one while loop) of `examples` inputs through `slots` slots; one iteration is
  a refill and a round."""
  from specjax.decode.stream import chunk_program  # pylint: disable=import-outside-toplevel
  from specjax.sampling import row_keys  # pylint: disable=import-outside-toplevel
  ints = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
  keys = jax.eval_shape(lambda: row_keys(jax.random.PRNGKey(0), examples))
  fn, args = chunk_program(loop, params, ints(examples, input_len), ints(examples), keys,
                           slots=slots, refill_rows=slots, width=cache_len)
  cache = jax.eval_shape(lambda: loop.target.init_cache(slots, cache_len))
  return Piece(name, fn, args, 0, weights, _nbytes(cache), cache)


def abstract_params(model, dtype: str, seed: int = 0) -> Any:
  """The model's parameters as abstract arrays, kernels cast to `dtype` ('bfloat16': as
  `specjax.params.cast_kernels`; 'int8': as `quantize_kernels`; 'float32': as initialized)."""
  from specjax import params as P  # pylint: disable=import-outside-toplevel

  def build():
    p = model.init(seed)
    if dtype == "bfloat16":
      return P.cast_kernels(p, jnp.bfloat16)
    if dtype == "int8":
      return P.quantize_kernels(p)
    return p
  return jax.eval_shape(build)


def pieces_head(target_model, head_config: Any = None):
  """The `FeatureHead` `model_pieces` compiles: `head_config` (a trained head's, checked
  against the target) in the target's dtype, or a random head at the target's widths."""
  from specjax.models import FeatureHead, FeatureHeadConfig  # pylint: disable=import-outside-toplevel
  from specjax.models import GemmaConfig  # pylint: disable=import-outside-toplevel

  cfg = target_model.config
  if isinstance(cfg, GemmaConfig):  # a head of T5X layers at the Gemma target's widths
    sizes = dict(emb_dim=cfg.embed_dim, mlp_dim=cfg.hidden_dim, mlp_activations=("gelu", "linear"))
  else:
    sizes = dict(emb_dim=cfg.emb_dim, mlp_dim=cfg.mlp_dim, mlp_activations=cfg.mlp_activations)
  if head_config is None:
    head_config = FeatureHeadConfig(vocab_size=cfg.vocab_size, num_heads=cfg.num_heads,
                                    head_dim=cfg.head_dim, dtype=cfg.dtype, **sizes)
  else:
    if (head_config.emb_dim, head_config.vocab_size) != (target_model.feature_dim,
                                                         cfg.vocab_size):
      raise ValueError(f"the feature head reads features of width {head_config.emb_dim} and "
                       f"{head_config.vocab_size} ids; the target's are "
                       f"{target_model.feature_dim} and {cfg.vocab_size}")
    if head_config.cross_attention and not target_model.is_encoder_decoder:
      raise ValueError("the feature head attends to a source (cross_attention); the target "
                       "is decoder-only")
    head_config = dataclasses.replace(head_config, dtype=cfg.dtype)
  return FeatureHead(head_config)


def model_pieces(target_model, draft_model, *, dtype: str = "bfloat16",
                 draft_dtype: str = "float32", batch: int = 1, input_len: int = 16,
                 max_new_tokens: int = 64, gamma: int = 4,
                 include: Sequence[str] = ("steps", "loops"), unroll: bool = False,
                 head_config: Any = None, vocab_rows: int = 0) -> List[Piece]:
  """The pieces of decoding with `target_model` verifying and `draft_model` drafting (both
  random-init, abstract: shapes only), greedy, at `batch` rows:

    target step, draft step, head step       one-token steps (`step_piece`); the head is a
                                             random feature head at the target's width
    autoregressive loop, chain loop (γ),     whole decodes (`loop_piece`)
    tree loop (spines (γ, 1)), feature chain loop (γ)
    streamed chain loop                      8 inputs streamed through `batch` slots
                                             (`stream_piece`)

  include: 'steps', 'loops' or both. unroll: the drafters' `unroll` (the chains' γ guesses and
  the tree's spine tail in straight-line code: a round's one nested loop is then the draft's
  catch-up). head_config: a trained head's `FeatureHeadConfig` (its model.gin; its sizes,
  cross-attention and fused layers, computed in the target's dtype) for the head step and the
  feature chain, in place of the random head at the target's width; vocab_rows: the head step's
  drafted ids (`head_step_piece`; 0: its logits not counted).
  """
  from specjax.decode import DecodeConfig  # pylint: disable=import-outside-toplevel
  from specjax.decode.round import AutoregressiveLoop, SpeculativeLoop  # pylint: disable=import-outside-toplevel
  from specjax.decode.state import LoopParams  # pylint: disable=import-outside-toplevel
  from specjax.decode.tree import TreeLoop  # pylint: disable=import-outside-toplevel
  from specjax.draft import (FeatureDrafter, ModelDrafter, StaticTree,  # pylint: disable=import-outside-toplevel
                             TreeModelDrafter)
  from specjax.sampling import Sampling  # pylint: disable=import-outside-toplevel

  head = pieces_head(target_model, head_config)
  tparams = abstract_params(target_model, dtype)
  dparams = abstract_params(draft_model, draft_dtype, seed=1)
  hparams = abstract_params(head, draft_dtype if draft_dtype != "float32" else dtype, seed=2)
  prompt = 0 if target_model.is_encoder_decoder else input_len
  cache_len = prompt + max_new_tokens + gamma + 2
  pieces: List[Piece] = []
  if "steps" in include:
    pieces += [step_piece("target step", target_model, tparams, batch=batch,
                          cache_len=cache_len, input_len=input_len),
               step_piece("draft step", draft_model, dparams, batch=batch,
                          cache_len=cache_len, input_len=input_len)]
    encoded = None if not head.config.cross_attention else jax.eval_shape(
        target_model.encode, tparams, jax.ShapeDtypeStruct((batch, input_len), jnp.int32))
    pieces.append(head_step_piece("head step", head, hparams, batch=batch,
                                  cache_len=cache_len, encoded=encoded,
                                  vocab_rows=vocab_rows))
  if "loops" in include:
    config = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=-1, cache_len=cache_len)
    feature = FeatureDrafter(target_model, head, gamma, unroll=unroll)
    fparams = jax.eval_shape(lambda h, t: feature.params(h, t), hparams, tparams)
    loops = (
        ("autoregressive loop", AutoregressiveLoop(target_model, config), None, tparams),
        ("chain loop", SpeculativeLoop(target_model, ModelDrafter(draft_model, gamma,
                                                                 unroll=unroll), config),
         dparams, (tparams, dparams)),
        ("tree loop", TreeLoop(target_model, TreeModelDrafter(
            draft_model, StaticTree.from_spines((gamma, 1)), unroll=unroll), config), dparams,
         (tparams, dparams)),
        ("feature chain loop", SpeculativeLoop(target_model, feature, config), fparams,
         (tparams, hparams)))
    for name, loop, drafter_params, weights in loops:
      pieces.append(loop_piece(
          name, loop, LoopParams(target=tparams, drafter=drafter_params), batch=batch,
          input_len=input_len, cache_len=cache_len, weights=_decoder_weights(
              target_model, weights) if drafter_params is None else weights))
    pieces.append(stream_piece(
        "streamed chain loop", loops[1][1], LoopParams(target=tparams, drafter=dparams),
        slots=batch, examples=8, input_len=input_len, cache_len=cache_len,
        weights=(tparams, dparams)))
  return pieces
