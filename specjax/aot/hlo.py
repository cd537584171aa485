"""Op counts of compiled decode loops, read from XLA's optimized HLO text.

What a round costs beyond its bandwidth shows in the loop's optimized HLO: how many
kernels run per iteration (fusions, dots, copies, custom calls), whether anything inside the
loop moves data to or from the host (send / recv, infeed / outfeed, host callbacks, copies
to the host memory space), and how many nested loops and conditionals a round holds.

    dump_flags(folder)         XLA_FLAGS that make XLA write every optimized module there
    loop_modules(folder)       {module name: optimized HLO text} of the dumped decode loops
    loop_stats(text)           the counts of one module: its outer while loop, per iteration
    body_kernels(text)         the kernels of one iteration, each with its shape and source op
    per_layer(kernels)         kernels per decoder layer (by the `layers_<i>/` of their op names)
    f32_temporaries(kernels, weight_shapes)
                               float32 outputs shaped like a weight matrix (written to
                               memory, then read back: traffic a step should not have)
    stablehlo_stats(text)      the same kinds of counts from a StableHLO lowering (any platform)
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

LOOP_MODULES = r".*(run_loop|reference_decode|decode_steps).*"
"""Module names (jit function names) of the loops worth counting: specjax's one whole-loop
runner (`specjax.decode.runner.run_loop`: the autoregressive and speculative loops are two
compiles of it), the reference decoder and the bench's step loop."""

FREE_OPS = frozenset({"parameter", "get-tuple-element", "tuple", "bitcast", "constant"})
"""Ops that launch no work (names and views of buffers)."""
ASYNC_COPY_OPS = frozenset({"copy-start", "copy-done"})
"""XLA:TPU's prefetches of weights into on-chip memory: DMAs beside the kernels, not kernels."""
HOST_OPS = frozenset({"send", "send-done", "recv", "recv-done", "infeed", "outfeed"})
"""Ops that move data between the device and the host."""
_HOST_CALL = re.compile(r"callback|host", re.I)  # custom-call targets that reach the host
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) ")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%[\w.\-]+ = (.*?)\s?([a-z][a-z0-9\-]*)\((.*)$")
_CALLED = re.compile(r"(calls|to_apply|body|condition|true_computation|false_computation)"
                     r"=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')


def dump_flags(folder: str) -> str:
  """XLA_FLAGS that dump the optimized HLO text of the loop modules (`LOOP_MODULES`) to
  `folder`; they take effect only in a process whose backend is not started yet."""
  return (f"--xla_dump_to={folder} --xla_dump_hlo_as_text "
          f"--xla_dump_hlo_module_re={LOOP_MODULES}")


def loop_modules(folder: str) -> Dict[str, str]:
  """{module name and number (e.g. 'jit_run_loop.0012'): its optimized HLO text} of the dumps
  in `folder`, one entry per compiled module: every decode loop is a compile of the one runner
  `run_loop`, so the name alone does not tell the loops apart (`loop_stats` does: a
  speculative round holds the draft's loop)."""
  out = {}
  for path in sorted(Path(folder).glob("*after_optimizations.txt")):
    parts = path.name.split(".")
    if len(parts) >= 3:
      out[f"{parts[1]}.{parts[0].rsplit('_', 1)[-1]}"] = path.read_text()
  return out


def _parse(text: str) -> Tuple[Dict[str, List[Tuple[str, str, str]]], str]:
  """({computation: [(shape, opcode, rest of line)]}, the entry computation's name)."""
  comps: Dict[str, List[Tuple[str, str, str]]] = {}
  entry, current = "", None
  for line in text.splitlines():
    head = _COMPUTATION.match(line)
    if head:
      current = head.group(1)
      comps[current] = []
      if line.startswith("ENTRY"):
        entry = current
      continue
    if line.startswith("}"):
      current = None
      continue
    ins = _INSTRUCTION.match(line) if current else None
    if ins:
      comps[current].append(ins.groups())
  if not entry:
    raise ValueError("no ENTRY computation in this HLO text")
  return comps, entry


def _called(rest: str) -> List[Tuple[str, str]]:
  """(kind, computation) pairs an instruction calls."""
  out = [(m.group(1), m.group(2)) for m in _CALLED.finditer(rest)]
  for m in _BRANCHES.finditer(rest):
    out += [("branch", b.strip().lstrip("%")) for b in m.group(1).split(",") if b.strip()]
  return out


def _is_host(shape: str, opcode: str, rest: str) -> bool:
  if opcode in HOST_OPS:
    return True
  if opcode == "custom-call":
    target = _TARGET.search(rest)
    return bool(target and _HOST_CALL.search(target.group(1)))
  return opcode in ("copy-start", "copy-done") and "S(5)" in shape  # host memory space


def _count(comps, name: str, into: collections.Counter, *, nested: bool) -> None:
  """Adds computation `name`'s ops to `into` (recursing into conditionals and calls, and into
  nested while bodies when `nested`; fusions count as one kernel each)."""
  for shape, opcode, rest in comps.get(name, ()):
    if opcode not in FREE_OPS:
      into["kernels"] += 1
      into[f"op:{opcode}"] += 1
    if opcode == "custom-call":
      target = _TARGET.search(rest)
      into[f"custom-call:{target.group(1) if target else '?'}"] += 1
    if opcode in ("conditional", "call") or (opcode == "while" and nested):
      for _, callee in _called(rest):  # a fusion's or a reduction's computation runs inside it
        _count(comps, callee, into, nested=nested)


def _host_transfers(comps, name: str, seen: set) -> int:
  """Host transfers anywhere under computation `name` (fusions and nested loops included)."""
  if name in seen:
    return 0
  seen.add(name)
  total = 0
  for shape, opcode, rest in comps.get(name, ()):
    total += _is_host(shape, opcode, rest)
    total += sum(_host_transfers(comps, callee, seen) for _, callee in _called(rest))
  return total


def loop_stats(text: str) -> Dict[str, object]:
  """Counts of one optimized HLO module (XLA's text dump after optimizations).

  The module's outer while loop is the first `while` reachable from ENTRY outside any other
  loop (the decode loop: one iteration is one round or one token). Returns:
    whiles, conditionals, custom_calls: in the whole module;
    body_kernels: ops that launch work in one iteration of the outer loop, as written (a
      fusion is one; a nested loop is one `while` op plus its condition and body, counted
      once, not per trip; conditionals count both branches);
    body_fusions, body_dots, body_copies, body_whiles, body_conditionals: kinds of them;
    body_custom_calls: {target: count} in the outer loop's iteration;
    body_host_transfers: host transfers anywhere inside the outer loop (must be 0: a round
      runs on the device; XLA:GPU's own per-iteration copy of the loop predicate to the host
      is not an HLO op and does not show here);
    entry_host_transfers: host transfers anywhere in the module.
  """
  comps, entry = _parse(text)
  module = collections.Counter()
  for ops in comps.values():
    for _, opcode, rest in ops:
      module[opcode] += 1
  outer = _outer_while(comps, entry)
  stats: Dict[str, object] = {"whiles": module["while"], "conditionals": module["conditional"],
                              "custom_calls": module["custom-call"],
                              "entry_host_transfers": _host_transfers(comps, entry, set())}
  if outer is None:
    return {**stats, "body_kernels": 0, "body_host_transfers": 0}
  body, cond = outer
  count = collections.Counter()
  _count(comps, body, count, nested=True)
  _count(comps, cond, count, nested=True)
  stats.update({
      "body_kernels": count["kernels"], "body_fusions": count["op:fusion"],
      "body_dots": count["op:dot"], "body_copies": count["op:copy"],
      "body_whiles": count["op:while"], "body_conditionals": count["op:conditional"],
      "body_custom_calls": {k.split(":", 1)[1]: v for k, v in sorted(count.items())
                            if k.startswith("custom-call:")},
      "body_host_transfers": (_host_transfers(comps, body, set())
                              + _host_transfers(comps, cond, set()))})
  return stats


def _outer_while(comps, name: str, seen=None):
  """(body, condition) of the first while reachable from `name` through non-loop calls."""
  seen = set() if seen is None else seen
  if name in seen:
    return None
  seen.add(name)
  for _, opcode, rest in comps.get(name, ()):
    called = dict(_called(rest))
    if opcode == "while":
      return called["body"], called["condition"]
    for kind, callee in _called(rest):
      if kind != "calls" or opcode == "call":
        found = _outer_while(comps, callee, seen)
        if found:
          return found
  return None


_STABLEHLO_OP = re.compile(r"\b(stablehlo|func|chlo)\.([a-z_]+)")
_STABLEHLO_TARGET = re.compile(r"stablehlo\.custom_call @([\w$.\-]+)")


def stablehlo_stats(text: str) -> Dict[str, object]:
  """Counts in a StableHLO lowering (`jax.jit(f).trace(...).lower(...).as_text()`, e.g. for
  lowering_platforms=('cuda',) on a machine without a GPU): loops, conditionals, custom call
  targets and host transfers before XLA's optimizations."""
  ops = collections.Counter(f"{d}.{o}" for d, o in _STABLEHLO_OP.findall(text))
  targets = collections.Counter(_STABLEHLO_TARGET.findall(text))
  host = sum(ops[f"stablehlo.{o}"] for o in ("send", "recv", "infeed", "outfeed"))
  host += sum(n for t, n in targets.items() if _HOST_CALL.search(t))
  return {"whiles": ops["stablehlo.while"], "conditionals": ops["stablehlo.case"]
          + ops["stablehlo.if"], "custom_calls": dict(targets), "host_transfers": host,
          "ops": sum(n for k, n in ops.items() if k.startswith("stablehlo."))}


def decode_step_stats(model, params, batch: int, cache_len: int, encoded=None,
                      steps: int = 4) -> Dict[str, object]:
  """HLO counts of `steps` one-token `model.decode` calls in one jitted `fori_loop` (the
  target's step as the loops make it): compiled for this machine (`loop_stats`: per step) and
  lowered for CUDA (`stablehlo_stats`; no GPU needed to lower, only to compile)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  def decode_steps(params, cache, encoded):
    def body(i, carry):
      cache, acc = carry
      logits, cache = model.decode(params, cache, jnp.full((batch, 1), 3, jnp.int32),
                                   jnp.full((batch,), i, jnp.int32), encoded)
      return cache, acc + logits[:, 0, 0].sum()
    return jax.lax.fori_loop(0, steps, body, (cache, jnp.float32(0)))[1]

  from specjax.aot.targets import kernels_for  # pylint: disable=import-outside-toplevel
  cache = model.init_cache(batch, cache_len)
  trace = lambda: jax.jit(decode_steps).trace(params, cache, encoded)
  out: Dict[str, object] = {"compiled": loop_stats(trace().lower().compile().as_text())}
  try:
    with kernels_for():  # Pallas kernels lowered for an H200 (`specjax.models.fused`)
      text = trace().lower(lowering_platforms=("cuda",)).as_text()
    out["cuda_stablehlo"] = stablehlo_stats(text)
  except Exception as e:  # pylint: disable=broad-except  (reported, e.g. cuDNN not present)
    out["cuda_stablehlo"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
  return out


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One op that launches work in a loop iteration (a fusion is one)."""
  opcode: str
  """'fusion', 'custom-call', 'dot', 'copy', ..."""
  shape: str
  """Its output shape as XLA writes it, e.g. 'f32[2,3072]{1,0}'."""
  kind: str
  """A fusion's kind and backend, e.g. 'kCustom/__triton_nested_gemm_fusion', 'kLoop'; a
  custom call's target."""
  source: str
  """The op name of the JAX code it came from (the `op_name` metadata), '' if none."""

  def outputs(self) -> List[Tuple[str, int]]:
    """(dtype, element count) of each array it writes (a tuple-shaped op writes several)."""
    return [(dtype, math.prod(int(d) for d in dims.split(",") if d) if dims else 1)
            for dtype, dims in _ARRAY.findall(self.shape)]


_ARRAY = re.compile(r"\b(pred|[a-z]+\d+(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FUSION_KIND = re.compile(r"kind=(k\w+)")
_BACKEND_KIND = re.compile(r'"kind":"(__\w+)"')
_LAYER = re.compile(r"layers?_(\d+)/")  # T5X's layers_3, the gemma library's layer_3


def _kernels_in(comps, name: str, out: List[Kernel], seen: set) -> None:
  if name in seen:
    return
  seen.add(name)
  for shape, opcode, rest in comps.get(name, ()):
    if opcode in ("conditional", "call", "while"):
      for _, callee in _called(rest):
        _kernels_in(comps, callee, out, seen)
      if opcode != "while":
        continue
    if opcode in FREE_OPS or opcode in ASYNC_COPY_OPS:
      continue
    kind = ""
    if opcode == "fusion":
      kind = "/".join(m.group(1) for m in (_FUSION_KIND.search(rest), _BACKEND_KIND.search(rest))
                      if m)
    elif opcode == "custom-call":
      target = _TARGET.search(rest)
      kind = target.group(1) if target else "?"
    source = _OP_NAME.search(rest)
    out.append(Kernel(opcode, shape, kind, source.group(1) if source else ""))


def body_kernels(text: str) -> List[Kernel]:
  """The kernels one iteration of the module's outer while loop launches (see `loop_stats`:
  nested loops' bodies and conditionals' branches counted once each; XLA:TPU's weight
  prefetches left out), in program order; [] when the module has no loop."""
  comps, entry = _parse(text)
  outer = _outer_while(comps, entry)
  if outer is None:
    return []
  out: List[Kernel] = []
  seen: set = set()
  for name in outer:
    _kernels_in(comps, name, out, seen)
  return out


def per_layer(kernels: Sequence[Kernel]) -> Tuple[float, int, int]:
  """(kernels per decoder layer, layers seen, kernels outside any layer): a kernel belongs to
  the layer its op name names (`.../layers_3/...`); the per-layer figure is the mean over the
  layers seen (a step through L layers then costs L times it plus the rest)."""
  counts = collections.Counter()
  outside = 0
  for k in kernels:
    layer = _LAYER.findall(k.source)
    if layer:
      counts[layer[-1]] += 1
    else:
      outside += 1
  if not counts:
    return 0.0, 0, outside
  return sum(counts.values()) / len(counts), len(counts), outside


def f32_temporaries(kernels: Sequence[Kernel], weight_shapes: Sequence[Sequence[int]]
                    ) -> List[Kernel]:
  """The kernels that write a float32 array shaped like one of the weight matrices
  `weight_shapes` (its dimensions other than 1, in any order): a bfloat16 weight converted to
  float32, or a one-row product's elementwise partial sums, written to memory and read back
  by the next kernel: traffic a step should not have."""
  shapes = {tuple(sorted(d for d in shape if d != 1)) for shape in weight_shapes
            if sum(d != 1 for d in shape) >= 2}
  out = []
  for k in kernels:
    if k.opcode in _CONTROL_OPS:  # a nested loop's state, carried in place: no kernel writes it
      continue
    for dims in _F32_DIMS.findall(k.shape):
      key = tuple(sorted(int(d) for d in dims.split(",") if d and int(d) != 1))
      if key in shapes:
        out.append(k)
        break
  return out


_CONTROL_OPS = frozenset({"while", "conditional", "call"})
_F32_DIMS = re.compile(r"\bf32\[([\d,]*)\]")
