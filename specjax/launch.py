"""Starts N local CPU processes of one program, joined by `specjax.distributed`.

    python -m specjax.launch --num_processes 2 --local_devices 2 -- \\
        specjax.app.distributed_check --checkpoint bundled:lm/tiny --out /tmp/out.json

runs `python -m specjax.app.distributed_check ...` twice, as processes 0 and 1 of one job
(coordinator 127.0.0.1 on a free port, `--local_devices` CPU devices each: 4 global
devices), with every output line prefixed `[pN] `. It exits with the first non-zero
status of a process (the others are then stopped), else 0. Loopback only: for many
machines use the cluster's own launcher (docs/distributed.md).
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from typing import List, Optional, Sequence

from specjax import distributed

_POLL_S = 0.1
_STOP_GRACE_S = 10.0


def free_port() -> int:
  """A TCP port free on 127.0.0.1 now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def process_env(process_id: int, num_processes: int, port: int, local_devices: int,
                base: Optional[dict] = None) -> dict:
  """The environment of process `process_id`: the job's `specjax.distributed` variables,
  CPU only, `local_devices` host devices."""
  env = dict(os.environ if base is None else base)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env.update({
      distributed.ENV_COORDINATOR: f"127.0.0.1:{port}",
      distributed.ENV_NUM_PROCESSES: str(num_processes),
      distributed.ENV_PROCESS_ID: str(process_id),
      distributed.ENV_LOCAL_DEVICES: str(local_devices),
      "JAX_PLATFORMS": "cpu",
      "XLA_FLAGS": " ".join(flags + [f"--xla_force_host_platform_device_count={local_devices}"]),
  })
  return env


def _relay(stream, prefix: str, out) -> None:
  for line in iter(stream.readline, ""):
    out.write(prefix + line)
    out.flush()
  stream.close()


def launch(command: Sequence[str], num_processes: int, local_devices: int = 1,
           port: Optional[int] = None, timeout: Optional[float] = None, out=None) -> int:
  """Runs `python -m COMMAND...` as `num_processes` local processes of one job.

  Args:
    command: a module name and its arguments.
    num_processes: processes to start (ids 0..N-1).
    local_devices: CPU devices per process.
    port: the coordinator's port on 127.0.0.1 (default: a free one).
    timeout: seconds before every process is stopped (status 124).
    out: where prefixed output goes (default sys.stdout).
  Returns:
    0 when every process exits 0, else the first failure's status (124 on timeout).
  """
  if not command:
    raise ValueError("launch: no module to run (give it after `--`)")
  if num_processes < 1 or local_devices < 1:
    raise ValueError(f"launch: num_processes and local_devices must be at least 1, got "
                     f"{num_processes} and {local_devices}")
  out = sys.stdout if out is None else out
  port = free_port() if port is None else port
  procs: List[subprocess.Popen] = []
  relays = []
  for index in range(num_processes):
    proc = subprocess.Popen([sys.executable, "-u", "-m", *command],
                            env=process_env(index, num_processes, port, local_devices),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs.append(proc)
    relay = threading.Thread(target=_relay, args=(proc.stdout, f"[p{index}] ", out), daemon=True)
    relay.start()
    relays.append(relay)
  status = _wait(procs, timeout)
  for relay in relays:
    relay.join(timeout=_STOP_GRACE_S)
  return status


def _wait(procs: List[subprocess.Popen], timeout: Optional[float]) -> int:
  """Waits for every process; on a failure or the timeout stops the others (their own ids)."""
  start = time.monotonic()
  status = 0
  while any(p.poll() is None for p in procs):
    failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
    late = timeout is not None and time.monotonic() - start > timeout
    if failed or late:
      status = failed[0] if failed else 124
      _stop(procs)
      break
    time.sleep(_POLL_S)
  if not status:
    status = next((p.returncode for p in procs if p.returncode), 0)
  return status


def _stop(procs: List[subprocess.Popen]) -> None:
  for proc in procs:
    if proc.poll() is None:
      proc.terminate()
  deadline = time.monotonic() + _STOP_GRACE_S
  for proc in procs:
    try:
      proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  command: List[str] = []
  if "--" in argv:
    cut = argv.index("--")
    argv, command = argv[:cut], argv[cut + 1:]
  parser = argparse.ArgumentParser(
      prog="python -m specjax.launch",
      description="Run `python -m MODULE ARGS` as N local CPU processes of one JAX job.",
      usage="%(prog)s --num_processes N [--local_devices D] -- MODULE [ARGS...]")
  parser.add_argument("--num_processes", type=int, required=True)
  parser.add_argument("--local_devices", type=int, default=1, help="CPU devices per process")
  parser.add_argument("--port", type=int, default=None, help="coordinator port on 127.0.0.1")
  parser.add_argument("--timeout", type=float, default=None, help="seconds before stopping all")
  args = parser.parse_args(argv)
  if not command:
    parser.error("give the module to run after `--`")
  try:
    return launch(command, args.num_processes, args.local_devices, args.port, args.timeout)
  except ValueError as e:
    parser.error(str(e))
  return 2


if __name__ == "__main__":
  sys.exit(main())
