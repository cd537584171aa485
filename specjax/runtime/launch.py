"""Starts N local CPU processes of one program, joined by `specjax.runtime.distributed`.

    python -m specjax.runtime.launch --num_processes 2 --local_devices 2 -- \\
        specjax.app.distributed_check --checkpoint bundled:lm/tiny --out /tmp/out.json

runs `python -m specjax.app.distributed_check ...` twice, as processes 0 and 1 of one job
(coordinator 127.0.0.1 on a free port, `--local_devices` CPU devices each: 4 global
devices), with every output line prefixed `[pN] `. It exits with the first non-zero
status of a process, naming that process (the others are then stopped), else 0. Ctrl-C,
SIGTERM and SIGHUP are passed on to every process; none outlives the launcher. Loopback
only: for many machines use the cluster's own launcher (docs/distributed.md).
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import List, Optional, Sequence

from specjax.runtime import distributed

_POLL_S = 0.1
_STOP_GRACE_S = 10.0


def free_port() -> int:
  """A TCP port free on 127.0.0.1 now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def process_env(process_id: int, num_processes: int, port: int, local_devices: int,
                base: Optional[dict] = None) -> dict:
  """The environment of process `process_id`: the job's `specjax.runtime.distributed` variables,
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


class _Output:
  """Where prefixed lines go: bytes in, written whole under a lock (a text stream gets them
  decoded, undecodable bytes shown as escapes)."""

  def __init__(self, out):
    self._out, self._lock = out, threading.Lock()
    self._binary = getattr(out, "buffer", None)

  def write(self, prefix: str, line: bytes) -> None:
    if not line.endswith(b"\n"):
      line += b"\n"
    with self._lock:
      try:
        if self._binary is not None:
          self._out.flush()
          self._binary.write(prefix.encode() + line)
          self._binary.flush()
        else:
          self._out.write(prefix + line.decode("utf-8", "backslashreplace"))
          self._out.flush()
      except (OSError, ValueError):
        pass  # a closed or broken output: keep draining the child so it never blocks


def _relay(stream, prefix: str, out: _Output) -> None:
  """Copies a child's output line by line as bytes until it closes (never stops early, so
  the child never blocks on a full pipe)."""
  with stream:
    for line in iter(stream.readline, b""):
      out.write(prefix, line)


def _describe(status: int) -> str:
  if status < 0:
    try:
      name = signal.Signals(-status).name
    except ValueError:
      name = f"signal {-status}"
    return f"was killed by {name}"
  return f"exited with status {status}"


def _exit_status(status: int) -> int:
  """A child's returncode as a shell reports it (128 + N for a death by signal N)."""
  return 128 - status if status < 0 else status


def check_port(port: int) -> int:
  """`port` if it is a TCP port (1..65535) free on 127.0.0.1; ValueError otherwise."""
  if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
    raise ValueError(f"--port must be a TCP port in 1..65535, got {port!r} (leave it out for "
                     "a free one)")
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
    try:
      sock.bind(("127.0.0.1", port))
    except OSError as e:
      raise ValueError(f"--port {port} is not free on 127.0.0.1 ({e.strerror}); give another "
                       "or leave it out") from None
  return port


# Each child runs its module through this: on Linux it first asks for SIGKILL when its
# parent, the launcher, dies (even by SIGKILL, which no handler sees); then it runs
# `python -m MODULE ARGS` as usual. (Done in the child itself: a preexec_fn would run
# Python between fork and exec, unsafe in a multithreaded parent.)
_CHILD = """import ctypes, runpy, signal, sys
try:
  ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
  pass
del sys.argv[0]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


class _Supervisor:
  """The children of one launch: each in its own process group; polled together; signals
  forwarded to every group; stopped (TERM, then KILL after a grace) when one fails, on the
  timeout, on a signal, and always before the launcher returns."""

  def __init__(self, out: _Output, name: str = "specjax.runtime.launch"):
    self.out, self.name = out, name
    self.procs: List[subprocess.Popen] = []
    self.relays: List[threading.Thread] = []
    self.signals: List[int] = []

  def start(self, argvs: List[List[str]], envs: List[dict]) -> None:
    """Starts every child (each `[pN] `-prefixed), then the threads relaying their output:
    no thread runs while a child is forked."""
    for argv, env in zip(argvs, envs):
      self.procs.append(subprocess.Popen(
          argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT, start_new_session=True))
    for index, proc in enumerate(self.procs):
      relay = threading.Thread(target=_relay, args=(proc.stdout, f"[p{index}] ", self.out),
                               daemon=True)
      relay.start()
      self.relays.append(relay)

  def say(self, message: str) -> None:
    print(f"{self.name}: {message}", file=sys.stderr, flush=True)

  def on_signal(self, signum: int, _frame=None) -> None:
    self.signals.append(signum)

  def _send(self, signum: int) -> None:
    for proc in self.procs:
      if proc.poll() is None:
        try:
          os.killpg(proc.pid, signum)
        except (ProcessLookupError, PermissionError):
          pass

  def wait(self, timeout: Optional[float]) -> int:
    """Polls every child until all exit 0 (0), one fails (its status), the timeout (124) or
    a signal to the launcher (128 + N); then stops the rest."""
    start = time.monotonic()
    while True:
      if self.signals:
        signum = self.signals[0]
        self.say(f"got {signal.Signals(signum).name}; passing it to every process")
        self.stop(signum)
        return 128 + signum
      codes = [proc.poll() for proc in self.procs]
      for index, code in enumerate(codes):
        if code not in (None, 0):
          self.say(f"process {index} of {len(self.procs)} {_describe(code)}; stopping the "
                   "others")
          self.stop(signal.SIGTERM)
          return _exit_status(code)
      if all(code == 0 for code in codes):
        return 0
      if timeout is not None and time.monotonic() - start > timeout:
        self.say(f"timed out after {timeout:g} s; stopping every process")
        self.stop(signal.SIGTERM)
        return 124
      time.sleep(_POLL_S)

  def stop(self, signum: int) -> None:
    """Sends `signum` to every live child's group, then SIGKILL after the grace period."""
    self._send(signum)
    deadline = time.monotonic() + _STOP_GRACE_S
    while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
      time.sleep(_POLL_S)
    self._send(signal.SIGKILL)
    for proc in self.procs:
      proc.wait()

  def close(self) -> None:
    """Leaves nothing behind: every group killed, every child reaped, every relay drained."""
    for proc in self.procs:
      try:
        os.killpg(proc.pid, signal.SIGKILL)  # also what a child left running in its group
      except (ProcessLookupError, PermissionError):
        pass
      proc.wait()
    for relay in self.relays:
      relay.join(timeout=_STOP_GRACE_S)


_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def launch(command: Sequence[str], num_processes: int, local_devices: int = 1,
           port: Optional[int] = None, timeout: Optional[float] = None, out=None) -> int:
  """Runs `python -m COMMAND...` as `num_processes` local processes of one job.

  Every child runs in its own process group, its output (bytes, any encoding) relayed line
  by line with a `[pN] ` prefix. SIGINT, SIGTERM and SIGHUP sent to the launcher are passed
  to every child's group; a child that fails (or dies by a signal) is named on stderr and
  the others are stopped; no child outlives the call (on Linux not even a launcher killed by
  SIGKILL: each child asks for the parent-death signal).

  Args:
    command: a module name and its arguments.
    num_processes: processes to start (ids 0..N-1).
    local_devices: CPU devices per process.
    port: the coordinator's port on 127.0.0.1, 1..65535 and free (default: a free one).
    timeout: seconds before every process is stopped (status 124).
    out: where prefixed output goes (default sys.stdout).
  Returns:
    0 when every process exits 0; else the first failure's status (128 + N for a death by
    signal N), 124 on the timeout, 128 + N after signal N reached the launcher.
  Raises:
    ValueError: no command, a count below 1, a port outside 1..65535 or busy.
  """
  if not command:
    raise ValueError("launch: no module to run (give it after `--`)")
  if num_processes < 1 or local_devices < 1:
    raise ValueError(f"launch: num_processes and local_devices must be at least 1, got "
                     f"{num_processes} and {local_devices}")
  if timeout is not None and not timeout > 0:
    raise ValueError(f"--timeout must be a positive number of seconds, got {timeout}")
  port = free_port() if port is None else check_port(port)
  supervisor = _Supervisor(_Output(sys.stdout if out is None else out))
  handlers = {}
  if threading.current_thread() is threading.main_thread():
    handlers = {s: signal.signal(s, supervisor.on_signal) for s in _FORWARDED}
  try:
    supervisor.start([[sys.executable, "-u", "-c", _CHILD, *command]] * num_processes,
                     [process_env(index, num_processes, port, local_devices)
                      for index in range(num_processes)])
    return supervisor.wait(timeout)
  finally:
    supervisor.close()
    for signum, handler in handlers.items():
      signal.signal(signum, handler)


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  command: List[str] = []
  if "--" in argv:
    cut = argv.index("--")
    argv, command = argv[:cut], argv[cut + 1:]
  parser = argparse.ArgumentParser(
      prog="python -m specjax.runtime.launch",
      description="Run `python -m MODULE ARGS` as N local CPU processes of one JAX job.",
      usage="%(prog)s --num_processes N [--local_devices D] -- MODULE [ARGS...]")
  parser.add_argument("--num_processes", type=int, required=True)
  parser.add_argument("--local_devices", type=int, default=1, help="CPU devices per process")
  parser.add_argument("--port", type=int, default=None,
                      help="coordinator port on 127.0.0.1, 1..65535 (default: a free one)")
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
  try:
    sys.exit(main())
  except KeyboardInterrupt:  # before the children start (afterwards a handler passes it on)
    print("specjax.runtime.launch: interrupted", file=sys.stderr)
    sys.exit(130)
