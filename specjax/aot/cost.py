"""How long an accelerator takes for one iteration of a compiled loop, from its optimized HLO.

A sum over the kernels one iteration launches (nested loops times their trips):

    time = Σ_kernels [max(bytes / bandwidth, flops / peak) + launch] + round_trips * round_trip

  bytes        what the kernel reads and writes in device memory: its operands' and results'
               sizes (an operand a fusion only slices: the slices; an in-place
               dynamic-update-slice moves its update only, twice; on a TPU,
               arrays in on-chip memory (S(1), S(2), S(3)) are free and the weight prefetch into it, a DMA
               beside the kernels, moves its bytes with no launch)
  flops        2 * result elements * contracted elements of each dot and convolution (inside
               fusions too); opaque custom calls (Pallas, cuDNN) count their bytes only
  round_trips  on a GPU, one host round trip per iteration of a loop (XLA:GPU copies the loop's
               predicate to the host every trip): the outer loop's one and every nested trip;
               a TPU runs its loops on the device
  launch, round_trip
               the model's only fitted constants (`FITTED`), fitted to the GPU runs on
               record (docs/aot.md)

  On a TPU no kernel is launched from the host: XLA:TPU's program runs its fusions back to
  back on the TensorCore, sequenced by its scalar unit, and loops run on the device (no
  round trip). A fusion's fixed cost there (its pipeline's fill and drain, the DMA latency
  of its first window) is what the compiler estimates for a fusion that moves next to
  nothing: the optimized HLO carries XLA:TPU's `estimated_cycles` per fusion, and the
  launch cost of a TPU program is their median over its near-empty fusions, over the
  TensorCore's clock (`tpu_launch_us`; the fitted launch where the program has none). The
  compiler's estimates of the large fusions are not used: they imply about 450 GB/s on a
  TPU v4's weight-streaming products, below its 1200.

    device(name)                 the accelerator's bandwidth and peak (`DEVICES`; a GPU's from its
                                 target config where it has one)
    kernel_costs(text)           [KernelCost] of one iteration of the module's outer loop
    estimate(text, name)         an `Estimate`: its time, roofline time, kernels, round trips
    prediction(target, draft, alpha, gamma)
                                 c and the speedup of Thm 3.8 from two step estimates
"""
from __future__ import annotations

import dataclasses
import math
import re
import statistics
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from specjax.aot import hlo, targets

# ----------------------------------------------------------------------------
# Devices.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Device:
  """What the model needs of an accelerator."""
  name: str
  platform: str
  """'gpu' or 'tpu'."""
  hbm_gbps: float
  """Memory bandwidth, GB/s."""
  peak_tflops: float
  """Dense bfloat16 matrix peak, TFLOP/s."""
  cores: int
  """SMs (GPU) or TensorCores per chip (TPU)."""
  source: str
  """Where the figures come from ('target config', 'table')."""
  clock_ghz: float = 0.0
  """A TPU's TensorCore clock (for XLA:TPU's cycle estimates; 0: none known)."""


_PEAKS = {"h200": (989.0, 132), "h100": (989.0, 132), "h100-pcie": (756.0, 114),
          "a100": (312.0, 108), "a100-40": (312.0, 108), "b200": (2250.0, 148),
          "tpu-v4": (275.0, 2), "tpu-v5e": (197.0, 1), "tpu-v5p": (459.0, 2),
          "tpu-v6e": (918.0, 1)}
"""Vendors' dense bf16 tensor peak (TFLOP/s) and SMs / TensorCores per chip."""

TPU_CLOCK_GHZ = {"tpu-v4": 1.05, "tpu-v5e": 1.5, "tpu-v5p": 1.75, "tpu-v6e": 1.75}
"""TensorCore clocks: v4's 1050 MHz from its paper (Jouppi et al., ISCA 2023); the others the
bf16 peak over the MXUs' FLOPs per cycle (v5e: 4 MXUs of 128x128, 2 FLOPs per multiply-add:
197 TFLOP/s at 1.5 GHz; v5p: 2 cores of 4: 459 at 1.75; v6e: 4 of 256x256: 918 at 1.75)."""

DEVICES: Dict[str, Device] = {
    name: Device(name, t.platform, t.hbm_gbps, *_PEAKS[name], "table",
                 TPU_CLOCK_GHZ.get(name, 0.0))
    for name, t in targets.TARGETS.items()}
"""The accelerators `specjax.aot.targets` names, by the vendors' figures."""

_BF16_FLOPS_PER_SM_CLOCK = {7: 1024, 8: 2048, 9: 4096, 10: 8192, 12: 4096}
"""Dense bf16 (fp16 on Volta) tensor-core FLOPs per SM per clock, by compute capability major."""


def _config_number(text: str, field: str) -> Optional[float]:
  found = re.search(rf"\b{field}:\s*([0-9.eE+]+)", text)
  return float(found.group(1)) if found else None


def device(name: str) -> Device:
  """The accelerator `name` (a `specjax.aot.targets` name): a GPU's bandwidth, cores and peak
  read from its target config where the CUDA plugin (or the 'gpu:FILE') has one (peak: SMs *
  clock * the tensor cores' bf16 FLOPs per clock of its compute capability), else `DEVICES`."""
  chosen = targets.target(name)
  table = DEVICES.get(chosen.name)
  if chosen.platform == "gpu":
    try:
      text = targets.gpu_config_text(chosen.spec)
    except targets.TargetUnavailable:
      text = ""
    bandwidth = _config_number(text, "memory_bandwidth")
    cores = _config_number(text, "core_count")
    clock = _config_number(text, "clock_rate_ghz")
    major = re.search(r"cuda_compute_capability\s*\{[^}]*major:\s*(\d+)", text)
    if bandwidth and cores and clock and major:
      per_clock = _BF16_FLOPS_PER_SM_CLOCK.get(int(major.group(1)), 2048)
      return Device(chosen.name, "gpu", bandwidth / 1e9, cores * clock * per_clock / 1e3,
                    int(cores), "target config")
  if table is None:
    raise targets.TargetUnavailable(f"no bandwidth or peak known for {name!r}: its target "
                                    f"config lacks them and it is not one of {', '.join(DEVICES)}")
  return table


# ----------------------------------------------------------------------------
# Kernels and their bytes and FLOPs.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Constants:
  """The model's two fitted constants."""
  launch_us: float
  """Per kernel launched (its fixed cost beyond moving bytes and doing FLOPs)."""
  round_trip_us: float
  """Per host round trip (a GPU loop's trip)."""


FITTED = Constants(launch_us=2.66, round_trip_us=17.5)
"""Fitted to the runs on record (docs/aot.md, 'The step-time model')."""


@dataclasses.dataclass(frozen=True)
class KernelCost:
  """One kernel of an iteration, with how often it runs per iteration."""
  opcode: str
  kind: str
  name: str
  bytes: int
  flops: int
  runs: int = 1
  """Times per iteration (a nested loop's trips)."""
  launches: bool = True
  """False for a DMA beside the kernels (a TPU's weight prefetch)."""
  scalar: bool = False
  """Its results are scalars (a loop counter, a predicate)."""
  cycles: int = 0
  """XLA:TPU's own estimate of the kernel's cycles (its backend config's `estimated_cycles`;
  0: none given)."""


_LINE = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?)\s?([a-z][a-z0-9\-]*)\((.*)$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_DIMS = {"lhs": re.compile(r"lhs_contracting_dims=\{([\d,]*)\}"),
         "cublas": re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')}
_LABELS = re.compile(r"dim_labels=\w+_(\w+)->")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_SKIP = hlo.FREE_OPS | {"after-all", "partition-id", "replica-id"}
_FREE_CALLS = frozenset({"ConcatBitcast"})
"""XLA:TPU custom calls that are views of buffers (no data moves)."""


@dataclasses.dataclass
class _Op:
  name: str
  shape: str
  opcode: str
  operands: List[str]
  rest: str


def _parse(text: str) -> Tuple[Dict[str, List[_Op]], str]:
  """({computation: [ops]}, the entry computation's name)."""
  comps: Dict[str, List[_Op]] = {}
  entry, current = "", None
  for line in text.splitlines():
    head = hlo._COMPUTATION.match(line)  # pylint: disable=protected-access
    if head:
      current = head.group(1)
      comps[current] = []
      entry = current if line.startswith("ENTRY") else entry
      continue
    if line.startswith("}"):
      current = None
      continue
    op = _LINE.match(line) if current else None
    if op:
      name, shape, opcode, rest = op.groups()
      depth, end = 1, len(rest)
      for i, ch in enumerate(rest):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
          end = i
          break
      comps[current].append(_Op(name, shape, opcode, _OPERAND.findall(rest[:end]), rest))
  if not entry:
    raise ValueError("no ENTRY computation in this HLO text")
  return comps, entry


def _arrays(shape: str) -> List[Tuple[str, List[int]]]:
  return [(dtype, [int(d) for d in dims.split(",") if d])
          for dtype, dims in hlo._ARRAY.findall(shape)]  # pylint: disable=protected-access


_ON_CHIP = re.compile(r"S\(([123])\)")
"""Memory spaces on the chip (XLA:TPU's VMEM, SMEM and CMEM), not device memory."""


def _hbm_bytes(shape: str) -> int:
  """Bytes of the arrays of `shape` in device memory (a TPU's on-chip arrays: none)."""
  total = 0
  for part in re.split(r",\s*(?=\(*[a-z]+\d*\[)", shape.strip("()")):
    if _ON_CHIP.search(part):
      continue
    total += sum(_BYTES.get(dtype, 4) * math.prod(dims) for dtype, dims in _arrays(part))
  return total


def _flops(comps, op: _Op, shapes: Dict[str, str]) -> int:
  """FLOPs of a dot or convolution op (2 * result elements * contracted elements)."""
  result = sum(math.prod(dims) for _, dims in _arrays(op.shape))
  if op.opcode == "dot" or op.opcode == "custom-call" and "gemm" in op.rest.lower() + "".join(
      re.findall(r'custom_call_target="([^"]+)"', op.rest)).lower():
    found = _DIMS["lhs"].search(op.rest) or _DIMS["cublas"].search(op.rest)
    lhs = _arrays(shapes.get(op.operands[0], "")) if op.operands else []
    if not found or not lhs:
      return 0
    dims = [int(d.strip('" ')) for d in found.group(1).split(",") if d.strip('" ')]
    return 2 * result * math.prod(lhs[0][1][d] for d in dims if d < len(lhs[0][1]))
  if op.opcode == "convolution" and len(op.operands) > 1:
    labels = _LABELS.search(op.rest)
    rhs = _arrays(shapes.get(op.operands[1], ""))
    if not labels or not rhs:
      return 0
    out_feature = labels.group(1).find("o")
    dims = rhs[0][1]
    return 2 * result * math.prod(dims) // max(dims[out_feature] if out_feature >= 0 else 1, 1)
  return 0


def _fusion_flops(comps, name: str, seen: Optional[set] = None) -> int:
  seen = set() if seen is None else seen
  if name in seen:
    return 0
  seen.add(name)
  ops = comps.get(name, [])
  shapes = {o.name: o.shape for o in ops}
  total = 0
  for op in ops:
    total += _flops(comps, op, shapes)
    if op.opcode == "fusion":
      total += sum(_fusion_flops(comps, c, seen) for _, c in hlo._called(op.rest))  # pylint: disable=protected-access
  return total


def _root(comps, op: _Op) -> str:
  called = [c for k, c in hlo._called(op.rest) if k == "calls"]  # pylint: disable=protected-access
  ops = comps.get(called[0], []) if called else []
  return ops[-1].opcode if ops else ""


_SLICES = frozenset({"dynamic-slice", "slice", "gather"})
_PARAMETER = re.compile(r"^(\d+)\)")


def _sliced_reads(comps, op: _Op) -> Dict[int, int]:
  """{operand index: bytes read} of a fusion's operands that its computation reads only
  through slices (dynamic-slice, slice, gather, as operand 0, past bitcasts): one row of an
  embedding table, one layer of a stacked array."""
  called = [c for k, c in hlo._called(op.rest) if k == "calls"]  # pylint: disable=protected-access
  ops = comps.get(called[0], []) if called else []
  users: Dict[str, List[_Op]] = {}
  for o in ops:
    for name in o.operands:
      users.setdefault(name, []).append(o)
  out = {}
  for o in ops:
    index = _PARAMETER.match(o.rest) if o.opcode == "parameter" else None
    if not index:
      continue
    frontier, read = [o.name], 0
    while frontier:
      name = frontier.pop()
      for user in users.get(name, []):
        if user.opcode == "bitcast":
          frontier.append(user.name)
        elif user.opcode in _SLICES and user.operands[:1] == [name]:
          read += _hbm_bytes(user.shape)
        else:
          read = -1
          frontier = []
          break
    if read >= 0 and users.get(o.name):
      out[int(index.group(1))] = read
  return out


def _async_start(op: _Op) -> KernelCost:
  """An asynchronous copy or slice (XLA:TPU's prefetches into on-chip memory): a DMA beside
  the kernels, moving its destination's bytes (its shape: (source, destination, context))."""
  parts = re.split(r",\s*(?=[a-z]+\d*\[)", op.shape.strip("()"))
  moved = sum(_BYTES.get(d, 4) * math.prod(dims) for part in parts[1:2]
              for d, dims in _arrays(part))
  return KernelCost(op.opcode, "", op.name, moved, 0, launches=False)


def _kernel(comps, op: _Op, shapes: Dict[str, str], runs: int) -> KernelCost:
  """The bytes and FLOPs of one kernel op."""
  if op.opcode.endswith("-start"):
    return dataclasses.replace(_async_start(op), runs=runs)
  operands = [shapes.get(o, "") for o in op.operands]
  reads = [_hbm_bytes(s) for s in operands]
  if op.opcode == "fusion":
    for i, size in _sliced_reads(comps, op).items():
      if i < len(reads):
        reads[i] = min(reads[i], size)
  written = _hbm_bytes(op.shape)
  in_place = op.opcode == "dynamic-update-slice" or (
      op.opcode == "fusion" and _root(comps, op) == "dynamic-update-slice")
  if in_place:  # the buffer (an operand shaped like the result) is updated where it lies
    moved = sum(r for r, s in zip(reads, operands) if s.split("{")[0] != op.shape.split("{")[0])
    size = 2 * moved
  else:
    size = sum(reads) + written
  if op.opcode == "fusion":
    flops = sum(_fusion_flops(comps, c) for k, c in hlo._called(op.rest) if k == "calls")  # pylint: disable=protected-access
  else:
    flops = _flops(comps, op, shapes)
  kind = ""
  target = re.search(r'custom_call_target="([^"]+)"', op.rest)
  if target:
    kind = target.group(1)
  elif op.opcode == "fusion":
    found = re.search(r"kind=(k\w+)", op.rest)
    kind = found.group(1) if found else ""
  scalar = all(not dims for _, dims in _arrays(op.shape))
  cycles = _CYCLES.search(op.rest)
  return KernelCost(op.opcode, kind, op.name, size, flops, runs, scalar=scalar,
                    cycles=int(cycles.group(1)) if cycles else 0)


def _walk(comps, name: str, runs: int, trips: int, out: List[KernelCost],
          loops: List[int]) -> None:
  """Kernels of computation `name`, each run `runs` times; nested loops' trips into `loops`."""
  ops = comps.get(name, [])
  shapes = {o.name: o.shape for o in ops}
  for op in ops:
    called = hlo._called(op.rest)  # pylint: disable=protected-access
    if op.opcode == "while":
      found = _TRIPS.search(op.rest)
      n = int(found.group(1)) if found else trips
      loops.append(runs * n)
      for kind, callee in called:
        _walk(comps, callee, runs * n + (kind == "condition") * runs, trips, out, loops)
      continue
    if op.opcode == "call":
      for _, callee in called:
        _walk(comps, callee, runs, trips, out, loops)
      continue
    if op.opcode == "conditional":  # the costliest branch
      branches = []
      for _, callee in called:
        part: List[KernelCost] = []
        _walk(comps, callee, runs, trips, part, loops)
        branches.append(part)
      out.extend(max(branches, key=lambda p: sum(k.bytes * k.runs for k in p), default=[]))
      continue
    if op.opcode in _SKIP or op.opcode.endswith("-done") or (
        op.opcode == "custom-call" and any(f'"{t}"' in op.rest for t in _FREE_CALLS)):
      continue
    out.append(_kernel(comps, op, shapes, runs))


def kernel_costs(text: str, trips: int = 1) -> Tuple[List[KernelCost], List[int]]:
  """([KernelCost] of one iteration of the module's outer while loop, [trips of each nested
  loop per iteration]); a nested loop whose trip count XLA does not know is taken to make
  `trips` trips. A module without a loop: its entry computation, once."""
  comps, entry = _parse(text)
  out: List[KernelCost] = []
  loops: List[int] = []
  plain = {name: [(o.shape, o.opcode, o.rest) for o in ops] for name, ops in comps.items()}
  outer = hlo._outer_while(plain, entry)  # pylint: disable=protected-access
  for name in outer or (entry,):
    _walk(comps, name, 1, trips, out, loops)
  return out, loops


@dataclasses.dataclass(frozen=True)
class Estimate:
  """One iteration's predicted time on one accelerator."""
  ms: float
  """The model's time."""
  roofline_ms: float
  """Σ max(bytes / bandwidth, flops / peak): the time with no launch or round-trip cost."""
  floor_ms: float
  """The piece's floor bytes (weights + cache) over the bandwidth, 0 if not given."""
  bytes: int
  flops: int
  launches: int
  round_trips: int
  launch_us: float = 0.0
  """The launch cost per kernel used (a TPU's from its program: `tpu_launch_us`)."""

  def row(self) -> Dict[str, float]:
    """The figures as a report's columns."""
    return {"pred_ms": round(self.ms, 4), "roofline_ms": round(self.roofline_ms, 4),
            "pct_of_roofline": round(100 * (self.floor_ms or self.roofline_ms) / self.ms, 1)
            if self.ms else 0.0, "pred_launches": self.launches,
            "pred_round_trips": self.round_trips, "pred_launch_us": round(self.launch_us, 3)}


def estimate(text: str, name: str, *, constants: Constants = FITTED, floor_bytes: int = 0,
             trips: int = 1, dev: Optional[Device] = None) -> Estimate:
  """The time of one iteration of the outer loop of the optimized HLO `text`, compiled for the
  accelerator `name` (the module docstring's sum). floor_bytes: what the iteration must read
  at least (for `Estimate.floor_ms`)."""
  dev = dev or device(name)
  kernels, loops = kernel_costs(text, trips)
  bandwidth, peak = dev.hbm_gbps * 1e9, dev.peak_tflops * 1e12
  roofline = sum(k.runs * max(k.bytes / bandwidth, k.flops / peak) for k in kernels)
  tpu = dev.platform == "tpu"
  # A TPU runs a step as one program: its scalar bookkeeping (loop counters) is no launch.
  launches = sum(k.runs for k in kernels if k.launches and not (tpu and k.scalar))
  launch_us, round_trips = constants.launch_us, 1 + sum(loops)
  if tpu:
    launch_us, round_trips = tpu_launch_us(kernels, dev) or launch_us, 0
  seconds = roofline + launches * launch_us * 1e-6 + round_trips * constants.round_trip_us * 1e-6
  return Estimate(seconds * 1e3, roofline * 1e3, floor_bytes / bandwidth * 1e3,
                  sum(k.bytes * k.runs for k in kernels), sum(k.flops * k.runs for k in kernels),
                  launches, round_trips, launch_us)


TPU_EMPTY_BYTES = 64 * 1024
"""A TPU fusion moving less than this is near-empty: XLA:TPU's estimate of its cycles is its
fixed cost (64 KB take 0.05-0.15 µs at the TPUs' bandwidths, against estimates of 0.6-1 µs)."""


def tpu_launch_us(kernels: Sequence[KernelCost], dev: Device) -> Optional[float]:
  """A TPU's fixed cost per fusion in this program (µs), as XLA:TPU estimates it: the median of
  its own `estimated_cycles` over the near-empty fusions (`TPU_EMPTY_BYTES`), over the
  TensorCore's clock. None where the program carries no estimates or the clock is unknown."""
  cycles = [k.cycles for k in kernels if k.cycles and k.bytes < TPU_EMPTY_BYTES]
  if not cycles or not dev.clock_ghz:
    return None
  return statistics.median(cycles) / (dev.clock_ghz * 1e3)


def prediction(target_ms: float, draft_ms: float, alpha: float, gamma: int,
               gammas: Sequence[int] = tuple(range(1, 9))) -> Dict[str, object]:
  """c = draft step / target step, and Thm 3.8's expected speedup at (alpha, gamma) and per
  γ in `gammas` (batch 1, greedy: a verification of γ + 1 tokens costs one target step)."""
  from specjax import analysis  # pylint: disable=import-outside-toplevel
  c = draft_ms / target_ms
  curve = {g: round(float(analysis.walltime_improvement(alpha, g, c)), 3) for g in gammas}
  return {"target_step_ms": round(target_ms, 4), "draft_step_ms": round(draft_ms, 4),
          "c": round(c, 4), "alpha": alpha, "gamma": gamma,
          "speedup": round(float(analysis.walltime_improvement(alpha, gamma, c)), 3),
          "round_ms": round(gamma * draft_ms + target_ms, 4),
          "speedup_by_gamma": curve}


def head_prediction(target_ms: float, head_ms: float,
                    tokens_per_call: Mapping[int, float]) -> Dict[str, object]:
  """A feature head's chain (EAGLE): c = head step / target step and, per γ in
  `tokens_per_call` ({γ: tokens per target call, measured: they do not depend on the
  hardware}), the speedup tokens / (γ c + 1). A round is γ head guesses (its first also feeds
  the accepted positions' true features) and one target call of γ + 1 positions, costed as one
  step (batch 1: Thm 3.8's cost model); `speedup` is the best γ's."""
  if not tokens_per_call:
    raise ValueError("head_prediction needs the tokens per target call of at least one γ")
  c = head_ms / target_ms
  curve = {int(g): round(float(e) / (int(g) * c + 1), 3)
           for g, e in sorted(tokens_per_call.items())}
  best = max(curve, key=curve.get)
  return {"target_step_ms": round(target_ms, 4), "head_step_ms": round(head_ms, 4),
          "c": round(c, 4), "tokens_per_call": {int(g): float(e)
                                                for g, e in sorted(tokens_per_call.items())},
          "gamma": best, "speedup": curve[best],
          "round_ms": round(best * head_ms + target_ms, 4), "speedup_by_gamma": curve}


def fit_launch_us(points: Sequence[Tuple[float, int, int, float]],
                  round_trip_us: float) -> float:
  """The launch cost (µs) that fits measured iterations best in relative error, the round
  trip's cost given: `points` are (roofline ms, launches, round trips, measured ms) of each
  (`Estimate.roofline_ms`, `.launches`, `.round_trips`); least squares of
  (roofline + launches * L + trips * R) / measured - 1 over L, in closed form."""
  num = sum(n * (y - r - t * round_trip_us * 1e-3) / y ** 2 for r, n, t, y in points)
  den = sum(n * n / y ** 2 for _, n, _, y in points)
  if den == 0:
    raise ValueError("no launches to fit a launch cost to")
  return num / den * 1e3
