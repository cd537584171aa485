"""Many processes, one program: `jax.distributed` set up the way T5X's launchers do.

Every process runs the same script. Call `initialize` first (before any other JAX
call); then `jax.devices()` lists every process's devices, a
`specjax.runtime.sharding.Partitioner` built there has one global mesh over them all, and the
decode functions, `specjax.checkpoints.load_sharded` and the trainer work on it
unchanged: each process reads only its devices' checkpoint shards, places only its own
rows of the (same, full) batch, and receives the results replicated. Only process 0
writes files (`is_writer`).

    from specjax.runtime import distributed
    distributed.initialize()                  # explicit values, environment, or a cluster
    partitioner = Partitioner(num_partitions=2)
    params = load_sharded(path, model, partitioner)
    result = speculative_decode(..., partitioner=partitioner)
    if distributed.is_writer():
      write(result)

Where the values come from, first found wins: the arguments; the environment
(`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`,
`SPECJAX_LOCAL_DEVICES`, as `python -m specjax.runtime.launch` sets them); else JAX's own
cluster detection (SLURM, Open MPI, Cloud TPU, Kubernetes) when such a cluster is
detected; else one process and nothing to do.

On CPU the collectives between processes use gloo (`jax_cpu_collectives_implementation`).
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import logging
import os
import socket
import sys
import threading
from typing import Any, Mapping, Optional, Tuple

import jax
import numpy as np

logger = logging.getLogger(__name__)

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
ENV_LOCAL_DEVICES = "SPECJAX_LOCAL_DEVICES"
MAX_LOCAL_DEVICES = 1024
"""Most CPU devices one process may simulate (100,000 crashed XLA after a minute)."""
"""CPU only: devices each process simulates (`jax_num_cpu_devices`)."""
ENV_CONNECT_TIMEOUT = "SPECJAX_CONNECT_TIMEOUT"
"""Seconds a process waits for every process of the job to join (default
DEFAULT_CONNECT_TIMEOUT)."""
DEFAULT_CONNECT_TIMEOUT = 120.0
WAITING_NOTICE_S = 10.0
"""Seconds of waiting to join after which a process says what it waits for."""
EXIT_NOT_JOINED = 2
"""The exit status of a process that could not join its job in time."""
CPU_COLLECTIVES = "gloo"


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
  """Where this process stands after `initialize`."""
  process_id: int
  """This process's index (0 writes files)."""
  num_processes: int
  """Processes in the job."""
  coordinator_address: Optional[str]
  """host:port of process 0's coordinator (None: one process, nothing initialized)."""


def _int_or_none(value: Any, name: str) -> Optional[int]:
  if value is None or value == "":
    return None
  if isinstance(value, bool):
    raise ValueError(f"{name} must be an integer, got {value!r}")
  try:
    return int(value)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be an integer, got {value!r}") from None


def resolve(coordinator_address: Optional[str] = None, num_processes: Any = None,
            process_id: Any = None, local_device_count: Any = None,
            environ: Optional[Mapping[str, str]] = None) -> dict:
  """The arguments of `initialize`, each from its argument or else the environment; checked.

  Returns:
    {'coordinator_address', 'num_processes', 'process_id', 'local_device_count'}, None where
    neither gives a value.
  Raises:
    ValueError: a value that is not an integer, a process id outside [0, num_processes), a
      count below 1, or a coordinator address without a port.
  """
  env = os.environ if environ is None else environ
  address = coordinator_address or env.get(ENV_COORDINATOR) or None
  count = _int_or_none(num_processes if num_processes is not None
                       else env.get(ENV_NUM_PROCESSES), "num_processes")
  index = _int_or_none(process_id if process_id is not None else env.get(ENV_PROCESS_ID),
                       "process_id")
  local = _int_or_none(local_device_count if local_device_count is not None
                       else env.get(ENV_LOCAL_DEVICES), "local_device_count")
  if count is not None and count < 1:
    raise ValueError(f"num_processes must be at least 1, got {count}")
  if local is not None and not 1 <= local <= MAX_LOCAL_DEVICES:
    raise ValueError(f"local_device_count ({ENV_LOCAL_DEVICES}) must be in [1, "
                     f"{MAX_LOCAL_DEVICES}] (CPU devices one process simulates), got {local}")
  if index is not None and (index < 0 or (count is not None and index >= count)):
    raise ValueError(f"process_id must be in [0, num_processes={count}), got {index}")
  if address is not None:
    split_address(address)
  return {"coordinator_address": address, "num_processes": count, "process_id": index,
          "local_device_count": local}


def split_address(address: str) -> Tuple[str, int]:
  """(host, port) of 'host:port' or '[ipv6]:port'; ValueError naming what is wrong (a port
  outside 1..65535, no host, unbalanced brackets)."""
  bad = "coordinator_address must be host:port or [ipv6]:port with a port in 1..65535, got "
  if not isinstance(address, str) or ":" not in address:
    raise ValueError(bad + repr(address))
  host, port = address.rsplit(":", 1)
  if host.startswith("["):
    if not host.endswith("]") or len(host) < 3 or "]" in host[:-1]:
      raise ValueError(bad + repr(address))
    host = host[1:-1]
  elif "[" in host or "]" in host or ":" in host:
    raise ValueError(bad + repr(address))
  if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
    raise ValueError(bad + repr(address))
  return host, int(port)


def check_coordinator_port(port: int) -> None:
  """ValueError if `port` cannot be bound here (process 0 serves the coordinator on every
  interface at that port): another program holds it."""
  for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "")):
    try:
      sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
      continue  # no IPv6 here: try IPv4
    with sock:
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      try:
        sock.bind((host, port))
      except OSError as e:
        if e.errno == errno.EADDRINUSE:
          raise ValueError(f"the coordinator port {port} is busy (another program listens on "
                           "it); give another port in coordinator_address") from None
        continue
      return


def _connect_timeout(value: Any) -> float:
  raw = value if value is not None else os.environ.get(ENV_CONNECT_TIMEOUT) or None
  if raw is None:
    return DEFAULT_CONNECT_TIMEOUT
  try:
    seconds = float(raw)
  except (TypeError, ValueError):
    raise ValueError(f"connect_timeout must be a number of seconds, got {raw!r}") from None
  if not 0 < seconds < 1e6:
    raise ValueError(f"connect_timeout must be a positive number of seconds, got {raw!r}")
  return seconds


def _say_waiting(values: dict, seconds: float) -> None:
  print(f"specjax: process {values['process_id']} of {values['num_processes']} is waiting for "
        f"the job's other processes at {values['coordinator_address']} (at most {seconds:g} s)",
        file=sys.stderr, flush=True)


def _give_up(values: dict, seconds: float) -> None:
  """Ends a process that could not join its job in time: one line, then exit (JAX's own
  timeout aborts the process with a C++ stack instead)."""
  print(f"specjax: error: process {values['process_id']} of {values['num_processes']} could "
        f"not join the job at {values['coordinator_address']} within {seconds:g} s: start "
        f"every process with the same coordinator_address (process 0 serves it), or raise "
        f"--connect_timeout / ${ENV_CONNECT_TIMEOUT}", file=sys.stderr, flush=True)
  os._exit(EXIT_NOT_JOINED)  # the join blocks inside XLA: nothing else can stop it


def _cluster_detected() -> bool:
  """Whether one of JAX's cluster environments (SLURM, Open MPI, Cloud TPU, ...) is present."""
  try:  # JAX's own list of cluster environments (not public API: absent means none)
    from jax._src import clusters  # pylint: disable=import-outside-toplevel
    kinds = list(clusters.ClusterEnv._cluster_types)  # pylint: disable=protected-access
  except (ImportError, AttributeError):
    return False
  return any(env.is_env_present() for env in kinds if not getattr(env, "opt_in_only_method", False))


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, local_device_count: Optional[int] = None,
               connect_timeout: Optional[float] = None) -> ProcessInfo:
  """Joins this process to the job (`jax.distributed.initialize`); call before other JAX use.

  Args:
    coordinator_address: host:port of process 0 (default `$JAX_COORDINATOR_ADDRESS`).
    num_processes: processes in the job (default `$JAX_NUM_PROCESSES`).
    process_id: this process's index (default `$JAX_PROCESS_ID`).
    local_device_count: CPU only: devices this process simulates (default
      `$SPECJAX_LOCAL_DEVICES`; `XLA_FLAGS=--xla_force_host_platform_device_count` works too).
    connect_timeout: seconds to wait for every process to join (default
      `$SPECJAX_CONNECT_TIMEOUT`, else 120). Past it the process prints one line naming the
      coordinator and exits with status 2.
  Returns:
    A `ProcessInfo`. With none of the values set and no cluster detected: one process,
    nothing initialized.
  Raises:
    ValueError: as `resolve`; only some of address, count and id given outside a cluster; a
      busy coordinator port (process 0); a connect_timeout that is not a positive number.
  """
  values = resolve(coordinator_address, num_processes, process_id, local_device_count)
  seconds = _connect_timeout(connect_timeout)
  if values["local_device_count"] is not None:
    jax.config.update("jax_num_cpu_devices", values["local_device_count"])
  explicit = [values[k] for k in ("coordinator_address", "num_processes", "process_id")]
  if jax.distributed.is_initialized():
    return info()
  if all(v is None for v in explicit) and not _cluster_detected():
    return ProcessInfo(0, 1, None)
  if values["num_processes"] == 1 and values["coordinator_address"] is None:
    return ProcessInfo(0, 1, None)
  if any(v is None for v in explicit) and not _cluster_detected():
    missing = [k for k in ("coordinator_address", "num_processes", "process_id")
               if values[k] is None]
    raise ValueError(f"distributed.initialize: {', '.join(missing)} not given (as an argument "
                     f"or {ENV_COORDINATOR} / {ENV_NUM_PROCESSES} / {ENV_PROCESS_ID}) and no "
                     "cluster detected")
  if values["process_id"] == 0 and values["coordinator_address"] is not None:
    check_coordinator_port(split_address(values["coordinator_address"])[1])
  if jax.config.jax_cpu_collectives_implementation in (None, "none"):
    jax.config.update("jax_cpu_collectives_implementation", CPU_COLLECTIVES)
  logger.info("process %s of %s: joining the job at %s (up to %g s)", values["process_id"],
              values["num_processes"], values["coordinator_address"], seconds)
  timers = [threading.Timer(min(WAITING_NOTICE_S, seconds / 2), _say_waiting,
                           (values, seconds)),
            threading.Timer(seconds, _give_up, (values, seconds))]
  for timer in timers:
    timer.daemon = True
    timer.start()
  try:  # JAX's own timeout is set past ours: it would abort with a C++ stack
    jax.distributed.initialize(coordinator_address=values["coordinator_address"],
                               num_processes=values["num_processes"],
                               process_id=values["process_id"],
                               initialization_timeout=int(seconds) + 60)
  finally:
    for timer in timers:
      timer.cancel()
  logger.info("process %d of %d, %d local / %d global devices", jax.process_index(),
              jax.process_count(), jax.local_device_count(), jax.device_count())
  return info()


def initialize_from(args: Any) -> ProcessInfo:
  """`initialize` from an argparse namespace or mapping with any of `coordinator_address`,
  `num_processes`, `process_id`, `local_device_count` (e.g. made by `add_arguments`)."""
  get = args.get if isinstance(args, Mapping) else lambda k: getattr(args, k, None)
  return initialize(get("coordinator_address"), get("num_processes"), get("process_id"),
                    get("local_device_count"), get("connect_timeout"))


def add_arguments(parser: Any) -> Any:
  """Adds --coordinator_address, --num_processes, --process_id, --local_device_count and
  --connect_timeout to an argparse parser; `initialize_from(parser.parse_args())` uses them."""
  parser.add_argument("--coordinator_address", default=None,
                      help=f"host:port of process 0 (default ${ENV_COORDINATOR})")
  parser.add_argument("--num_processes", type=int, default=None,
                      help=f"processes in the job (default ${ENV_NUM_PROCESSES})")
  parser.add_argument("--process_id", type=int, default=None,
                      help=f"this process's index (default ${ENV_PROCESS_ID})")
  parser.add_argument("--local_device_count", type=int, default=None,
                      help=f"CPU: devices per process (default ${ENV_LOCAL_DEVICES})")
  parser.add_argument("--connect_timeout", type=float, default=None,
                      help=f"seconds to wait for every process to join (default "
                      f"${ENV_CONNECT_TIMEOUT}, else {DEFAULT_CONNECT_TIMEOUT:g})")
  return parser


def info() -> ProcessInfo:
  """This process's `ProcessInfo`."""
  address = None
  if jax.distributed.is_initialized():
    from jax._src import distributed as _state  # pylint: disable=import-outside-toplevel
    address = _state.global_state.coordinator_address
  return ProcessInfo(jax.process_index(), jax.process_count(), address)


def is_writer() -> bool:
  """Whether this process writes output files (process 0)."""
  return jax.process_index() == 0


def sync(name: str) -> None:
  """Waits until every process reaches `sync(name)` (nothing with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    multihost_utils.sync_global_devices(name)


def broadcast_text(text: str) -> str:
  """Process 0's `text` on every process (e.g. a temporary folder name it chose)."""
  if jax.process_count() == 1:
    return text
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  data = text.encode("utf-8")
  size = int(np.asarray(multihost_utils.broadcast_one_to_all(np.int32(len(data)))))
  buffer = np.zeros(size, np.uint8)
  if is_writer():
    buffer[:] = np.frombuffer(data, np.uint8)
  return bytes(np.asarray(multihost_utils.broadcast_one_to_all(buffer))).decode("utf-8")


def check_same(data: bytes, what: str) -> None:
  """ValueError on every process unless every process passed the same `data` (compared by
  sha256; nothing with one process). `what` names it in the message ("the inputs")."""
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  digest = np.frombuffer(hashlib.sha256(data).digest(), np.uint8)
  every = np.asarray(multihost_utils.process_allgather(digest))  # [P, 32]
  differ = [i for i in range(every.shape[0]) if not np.array_equal(every[i], every[0])]
  if differ:
    raise ValueError(f"{what} differ between processes (those of process "
                     f"{', '.join(map(str, differ))} are not those of process 0); every "
                     "process of a job must be given the same")


def process_rows(batch: int, process_id: Optional[int] = None,
                 num_processes: Optional[int] = None) -> slice:
  """The rows [start, stop) of a `batch`-row global batch that a process reads from its input
  files: contiguous blocks in process order, the first `batch % num_processes` one row longer."""
  index = jax.process_index() if process_id is None else process_id
  count = jax.process_count() if num_processes is None else num_processes
  base, extra = divmod(int(batch), count)
  start = index * base + min(index, extra)
  return slice(start, start + base + (index < extra))


def gather_rows(local: Any) -> np.ndarray:
  """The global batch from each process's own rows (`process_rows` order): every process
  passes its rows [b_i, ...] and gets all of them [sum b_i, ...] (the same on every process),
  ready for the decode functions."""
  local = np.asarray(local)
  if jax.process_count() == 1:
    return local
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  sizes = np.asarray(multihost_utils.process_allgather(np.int32(local.shape[0])))  # [P]
  width = int(sizes.max())
  padded = np.zeros((width,) + local.shape[1:], local.dtype)
  padded[:local.shape[0]] = local
  every = np.asarray(multihost_utils.process_allgather(padded))  # [P, width, ...]
  return np.concatenate([every[i, :n] for i, n in enumerate(sizes)])


def gather(tree: Any) -> Any:
  """Every leaf of `tree` as numpy, whole on every process (global arrays are all-gathered)."""
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
  return jax.tree.map(one, tree)
