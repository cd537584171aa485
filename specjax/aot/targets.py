"""Compile-only devices of an accelerator this host does not have (deviceless compilation).

XLA compiles for a GPU from a `GpuTargetConfigProto` (the device's description: compute
capability, memory, cores, bandwidth) and for a TPU from a topology name; neither needs the
device. The CUDA plugin (`jax-cuda13-pjrt`, or 12) of JAX 0.12 and later carries XLA's target configs of
the common GPUs inside its shared library, each a text proto ending in
`device_description_str: "<name>"`: `gpu_config_text` reads one from there, so no file has to
ship with specjax (`GPU_CONFIGS_SINCE`: the plugins of JAX 0.10 and 0.11 carry none; there a GPU
is named by a file). libtpu (`jax[tpu]`) knows the TPU topologies by name (`TPU_TOPOLOGIES`).

    devices("h200")        [one compile-only H200]     (GPU names: `GPUS`)
    devices("tpu-v5e")     [one compile-only v5e chip] (TPU names: `TPUS`)
    devices("tpu-v5e", 4)  the four chips of a v5e 2x2 slice (a model split over them:
                           `specjax.aot.report.compile_piece(..., devices=4)`)
    devices("gpu:FILE")    a GPU described by a GpuTargetConfigProto text file, e.g. the
                           `*.gpu_target_config.pbtxt` that `--xla_dump_to` writes on a real GPU

`TargetUnavailable` (a ValueError) says in one line what is missing and how to install it
(`pip install 'specjax[aot]'`). Run with JAX_PLATFORMS=cpu (or `cpu_host()` first): the host's
own backend stays the CPU, and `jax.default_backend()` answers 'cpu' during such a compile, so choices that depend on
the device are made per lowering platform (`jax.lax.platform_dependent`), never by asking
the host's backend.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import importlib.util
import os
import re
from typing import Dict, List, Optional, Tuple

INSTALL = "pip install 'specjax[aot]'"
"""What installs both compilers (the CUDA plugin without NVIDIA libraries, and libtpu)."""

GPU_CONFIGS_SINCE = "0.12.0"
"""The first JAX whose CUDA plugin embeds XLA's GPU target configs (its library holds none in
0.10.2 and 0.11.2: neither the text nor the GPUs' names)."""

TPU_TOPOLOGIES = {"0.0.42.1": "v4, v5e, v5p, v6e", "0.0.48.1": "v4, v5e, v5p, v6e",
                  "0.0.50.1": "v4, v5e, v5p, v6e"}
"""The TPU generations (of `TPUS`) each libtpu that JAX 0.10.2, 0.11.2 and 0.12.0.1 pin compiles
for by topology name (none of them knows a v7x)."""


class TargetUnavailable(ValueError):
  """An accelerator name that is unknown, or whose compiler is not installed (one line)."""


@dataclasses.dataclass(frozen=True)
class Target:
  """A named accelerator to compile for."""
  name: str
  """The name `devices` takes, e.g. 'h200', 'tpu-v5e'."""
  platform: str
  """'gpu' or 'tpu'."""
  spec: str
  """GPU: the `device_description_str` of XLA's target config; TPU: libtpu's topology name."""
  hbm_gbps: float
  """Peak memory bandwidth in GB/s (the vendor's figure), for rooflines."""
  slices: Tuple[str, ...] = ()
  """TPU: larger topologies of the same chip, smallest first, for compiles over several chips
  (`devices(name, count)` takes the first `count` chips of the first that has enough)."""


GPUS = {t.name: t for t in (
    Target("h200", "gpu", "NVIDIA H200 141GB HBM3e", 4800.0),
    Target("h100", "gpu", "NVIDIA H100 80GB HBM3", 3350.0),
    Target("h100-pcie", "gpu", "NVIDIA H100 PCIe", 2000.0),
    Target("a100", "gpu", "NVIDIA A100-SXM4-80GB", 2039.0),
    Target("a100-40", "gpu", "NVIDIA A100-SXM4-40GB", 1555.0),
    Target("b200", "gpu", "NVIDIA B200", 8000.0),
)}
"""GPU names -> XLA's target configs (those the CUDA plugin embeds)."""

TPUS = {t.name: t for t in (
    Target("tpu-v4", "tpu", "v4:2x2x1", 1200.0, ("v4:2x2x2", "v4:2x2x4")),
    Target("tpu-v5e", "tpu", "v5e:2x2", 819.0, ("v5e:2x4", "v5e:4x4")),
    Target("tpu-v5p", "tpu", "v5p:2x2x1", 2765.0, ("v5p:2x2x2", "v5p:2x2x4")),
    Target("tpu-v6e", "tpu", "v6e:2x2", 1640.0, ("v6e:2x4", "v6e:4x4")),
)}
"""TPU names -> libtpu topologies (a one-chip compile uses the topology's first chip)."""

TARGETS: Dict[str, Target] = {**GPUS, **TPUS}

_CUDA_PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


def names() -> str:
  """The accepted names, for messages."""
  return ", ".join(TARGETS) + ", gpu:<GpuTargetConfigProto file>"


def target(name: str) -> Target:
  """The `Target` called `name` (`TARGETS`); a 'gpu:FILE' name describes a GPU by a file."""
  if not isinstance(name, str):
    raise TargetUnavailable(f"an accelerator name must be a string, got {name!r}; "
                            f"one of: {names()}")
  if name.startswith("gpu:"):
    return Target(name, "gpu", name[4:], 0.0)
  key = name.strip().lower()
  if key not in TARGETS:
    raise TargetUnavailable(f"unknown accelerator {name!r}; one of: {names()}")
  return TARGETS[key]


def cpu_host() -> None:
  """Makes this process's own backend the CPU, as a deviceless compile needs (JAX's CUDA plugin
  then registers its compiler without a GPU or cuDNN), unless JAX_PLATFORMS says otherwise or
  JAX's backends are up already. Commands call it before any JAX work."""
  import jax  # pylint: disable=import-outside-toplevel
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  if not os.environ.get("JAX_PLATFORMS") and not xla_bridge.backends_are_initialized():
    jax.config.update("jax_platforms", "cpu")


def _find(module: str):
  try:
    return importlib.util.find_spec(module)
  except ImportError:  # its parent package (jax_plugins) is not installed
    return None


def _plugin_library() -> Tuple[str, str]:
  """(module, path) of the installed CUDA plugin's shared library."""
  for module in _CUDA_PLUGINS:
    spec = _find(module)
    if spec and spec.submodule_search_locations:
      for folder in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(folder, "*.so")))
        if found:
          return module, found[0]
  raise TargetUnavailable(f"compiling for a GPU needs JAX's CUDA plugin, which is not "
                          f"installed: {INSTALL}")


def _version(module: str) -> str:
  """The installed version of a module's distribution ('' if unknown)."""
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  name = {"jax_plugins.xla_cuda13": "jax-cuda13-pjrt",
          "jax_plugins.xla_cuda12": "jax-cuda12-pjrt"}.get(module, module)
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return ""


@functools.lru_cache(maxsize=None)
def _embedded_configs(library: str) -> Dict[str, str]:
  """{device_description_str: target config text} of every config embedded in `library`."""
  with open(library, "rb") as f:
    data = f.read()
  out = {}
  for match in re.finditer(rb'device_description_str: "([^"\n]+)"', data):
    start = data.rfind(b"\x00", 0, match.start()) + 1
    end = data.find(b"\x00", match.end())
    text = data[start:end]
    if b"gpu_device_info" in text:  # a whole config, not a string that names the field
      out.setdefault(match.group(1).decode(), text.decode("utf-8", "replace"))
  return out


def embedded_gpus() -> List[str]:
  """The device names of the GPU target configs the installed CUDA plugin carries."""
  return sorted(_embedded_configs(_plugin_library()[1]))


GPU_FIELDS = ("threads_per_block_limit", "threads_per_warp", "shared_memory_per_block",
              "shared_memory_per_core", "threads_per_core_limit", "core_count", "fpus_per_core",
              "block_dim_limit_x", "block_dim_limit_y", "block_dim_limit_z", "memory_bandwidth",
              "l2_cache_size", "clock_rate_ghz", "device_memory_size")
"""The `gpu_device_info` fields XLA's GPU compiler divides by or sizes with: a config that
lacks one (or gives 0) crashed the process with SIGFPE instead of an error."""


def check_gpu_config(text: str, where: str) -> None:
  """TargetUnavailable naming the first of GPU_FIELDS (and the compute capability's `major`)
  that the GpuTargetConfigProto `text` lacks or gives as zero or less; checked before XLA
  reads it."""
  for field in (*GPU_FIELDS, "major"):
    pattern = (r"cuda_compute_capability\s*\{[^}]*?\bmajor" if field == "major"
               else rf"(?<![\w.]){field}")  # text format: a field on its line or inline
    found = re.search(pattern + r"\s*:\s*([-+0-9.eE]+)", text)
    try:
      ok = found is not None and float(found.group(1)) > 0
    except ValueError:
      ok = False
    if not ok:
      what = "cuda_compute_capability.major" if field == "major" else f"gpu_device_info.{field}"
      raise TargetUnavailable(f"{where}: the GPU target config has no positive {what} (XLA needs "
                              "it); use a config written by a GPU (`--xla_dump_to` writes "
                              "*.gpu_target_config.pbtxt) or one of XLA's specs")


def gpu_config_text(spec: str) -> str:
  """The GpuTargetConfigProto text of a GPU: `spec` is a `device_description_str` the CUDA
  plugin embeds, or (a 'gpu:FILE' target's) the path of a text proto file."""
  if os.path.sep in spec or spec.endswith((".txtpb", ".pbtxt", ".textproto")):
    from specjax import files  # pylint: disable=import-outside-toplevel
    try:
      text = files.read_bytes(spec, files.MIB, "the GPU target config").decode("utf-8")
    except (OSError, ValueError) as e:
      raise TargetUnavailable(str(e)) from None
    if "gpu_device_info" not in text:
      raise TargetUnavailable(f"{spec} is not a GpuTargetConfigProto text (no gpu_device_info)")
    check_gpu_config(text, spec)
    return installed_proto_text(text)
  module, library = _plugin_library()
  configs = _embedded_configs(library)
  if not configs:
    raise TargetUnavailable(
        f"the installed CUDA plugin ({_version(module) or module}) carries no GPU target "
        f"configs: GPUs by name need JAX >= {GPU_CONFIGS_SINCE} ({INSTALL} on Python >= "
        f"3.12); here name a GPU by a GpuTargetConfigProto file: --target gpu:FILE")
  if spec not in configs:
    raise TargetUnavailable(f"the installed CUDA plugin has no target config for {spec!r}; "
                            f"it has: {', '.join(sorted(configs))}")
  return configs[spec]


@functools.lru_cache(maxsize=None)
def _known_fields(library: str) -> frozenset:
  """The field names of every protobuf message the library's serialized descriptors define
  (each field a `FieldDescriptorProto`: its name, tag 1, is followed by its number, tag 3)."""
  import mmap  # pylint: disable=import-outside-toplevel
  with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
    return frozenset(m.group(2).decode() for m in re.finditer(
        rb"\n([\x01-\x7f])([a-z][a-z0-9_]*)\x18", data) if len(m.group(2)) == m.group(1)[0])


_FIELD = re.compile(r"^\s*([A-Za-z_]\w*)\s*(:|\{)")


def _braces(line: str) -> int:
  """{ minus } outside quoted strings and comments of a text-proto line."""
  depth, quote = 0, ""
  for i, ch in enumerate(line):
    if quote:
      quote = "" if ch == quote and line[i - 1] != "\\" else quote
    elif ch in "\"'":
      quote = ch
    elif ch == "#":
      break
    else:
      depth += (ch == "{") - (ch == "}")
  return depth


def known_fields_only(text: str, known) -> str:
  """A text proto with every field whose name is not in `known` dropped, with its block: a
  target config from a newer XLA (e.g. its source tree's specs) made readable by an older
  plugin's proto, which refuses any field it does not define. Comments go too."""
  out, skip = [], 0
  for line in text.splitlines():
    if skip:
      skip += _braces(line)
      continue
    field = _FIELD.match(line)
    if field and field.group(1) not in known:
      skip = max(_braces(line), 0)
      continue
    if line.strip() and not line.lstrip().startswith("#"):
      out.append(line)
  return "\n".join(out) + "\n"


def installed_proto_text(text: str) -> str:
  """`text` (a GpuTargetConfigProto) with the fields the installed CUDA plugin does not know
  dropped (`known_fields_only`: comments and blank lines go too)."""
  return known_fields_only(text, _known_fields(_plugin_library()[1]))


def _tpu_ready() -> None:
  if _find("libtpu") is None:
    raise TargetUnavailable(f"compiling for a TPU needs libtpu, which is not installed: "
                            f"{INSTALL} (or pip install 'jax[tpu]')")
  # libtpu asks the cloud's metadata server which TPU this host has. On a host whose own
  # backend is not a TPU (JAX_PLATFORMS=cpu) there is none to ask: say so, and it stays quiet.
  import jax  # pylint: disable=import-outside-toplevel
  host = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")
  if not host or "tpu" in host:
    return
  # Nor a chip to guard: libtpu's lock file, which lets one process at a time use the chips,
  # would keep a second compiling process (a parallel test worker) out.
  for key, value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_ACCELERATOR_TYPE", "v5litepod-4"),
                     ("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_WORKER_ID", "0"),
                     ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
    os.environ.setdefault(key, value)


MAX_DEVICES = 16
"""The most compile-only devices `devices` gives (a v5e 4x4 slice, 16 GPUs of one host)."""


def _tpu_topology(chosen: Target, count: int):
  """libtpu's description of the first of the target's topologies with `count` chips or more."""
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  topology = None
  for spec in (chosen.spec,) + chosen.slices:
    topology = topologies.get_topology_desc(topology_name=spec, platform="tpu")
    if len(topology.devices) >= count:
      return topology
  largest = ((chosen.spec,) + chosen.slices)[-1]
  raise TargetUnavailable(f"{chosen.name}: {count} devices asked for, but its largest "
                          f"topology here ({largest}) has {len(topology.devices)}")


@functools.lru_cache(maxsize=None)
def _devices(name: str, count: int = 1) -> Tuple:
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  chosen = target(name)
  if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_DEVICES:
    raise TargetUnavailable(f"the number of {name} devices must be an integer from 1 to "
                            f"{MAX_DEVICES}, got {count!r}")
  try:
    if chosen.platform == "gpu":  # one host with `count` GPUs (slices x hosts x GPUs)
      text = gpu_config_text(chosen.spec)
      topology = topologies.get_topology_desc("cuda", "cuda", target_config=text,
                                              topology=f"1x1x{count}")
    else:
      _tpu_ready()
      topology = _tpu_topology(chosen, count)
  except TargetUnavailable:
    raise
  except Exception as e:  # pylint: disable=broad-except  # XLA's errors carry no type
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "not implemented" in first:  # the plugin failed to start in this process
      first += (" (JAX's backend for it did not start in this process: run with "
                "JAX_PLATFORMS=cpu, or call specjax.aot.targets.cpu_host() before any JAX work)")
    raise TargetUnavailable(f"cannot compile for {name}: {first}") from None
  return tuple(topology.devices[:count])


def devices(name: str, count: int = 1) -> List:
  """`count` compile-only devices of the accelerator `name` (see the module docstring), as a
  list for a `jax.sharding.Mesh`: GPUs of one host, or a TPU slice's first `count` chips.
  Raises `TargetUnavailable` with one line naming what is missing."""
  return list(_devices(name, count))


def hbm_gbps(name: str) -> Optional[float]:
  """The accelerator's peak memory bandwidth in GB/s, None when unknown (a 'gpu:FILE')."""
  return target(name).hbm_gbps or None


def kernels_for(device=None):
  """A context in which Pallas kernels are lowered for a GPU this host does not have (their
  Triton lowering asks for the GPU's kind, and without a GPU JAX has none to give).

  `device`: a compile-only GPU from `devices`, the one a `lower` places its arguments on
  (`specjax.aot.report.place`: the context's mesh must be theirs); None: an H200 named
  abstractly, around `jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))` on a CPU
  host (no plugin needed). A no-op on a JAX without abstract meshes."""
  import contextlib  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  use = getattr(jax.sharding, "use_abstract_mesh", None)
  device_type = getattr(jax.sharding, "AbstractDevice", None)
  if use is None or device_type is None:
    return contextlib.nullcontext()
  if device is not None:
    return use(jax.sharding.Mesh(np.array([device]), ("x",)).abstract_mesh)
  named = device_type(device_kind="NVIDIA H200", num_cores=None, platform="gpu")
  return use(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=named))
