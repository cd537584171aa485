"""The main job across processes against a hostile setup: a malformed coordinator address, a
busy coordinator port, a process left alone, and processes given different prompts. Each
ends in one `specjax: error:` line and exit status 2 within seconds (JAX alone waited
300 s, then aborted with a C++ stack, a segfault or a gloo abort)."""
import os
import socket
import subprocess
import sys
import time

import pytest

from specjax.runtime import distributed, launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = "--gin_file=runs/random_tiny.gin"  # a random-init tiny T5 pair (no checkpoint)


def _job(*args, process_id=0, prompt="x", **kw):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
  env.update(JAX_PLATFORMS="cpu")
  return subprocess.Popen(
      [sys.executable, "-m", "specjax.main", TINY, "--prompt", prompt, "--num_processes", "2",
       "--process_id", str(process_id), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, **kw)


def _error_line(proc, timeout=120):
  out, err = proc.communicate(timeout=timeout)
  assert proc.returncode == 2, out[-2000:] + err[-2000:]
  assert "Traceback" not in err and "Check failure" not in err, err[-2000:]
  return [l for l in err.splitlines() if l.startswith("specjax: error: ")]


def test_coordinator_addresses_are_checked():
  for bad in (":99999", ":0", "[::1:5", "host", "127.0.0.1:70000", "[]:5", "::1:5", "h:x"):
    with pytest.raises(ValueError, match="coordinator_address must be host:port"):
      distributed.split_address(bad)
  assert distributed.split_address("[::1]:8476") == ("::1", 8476)
  # Through the command: one line, at once (it waited 5 minutes, then aborted, status 134).
  start = time.monotonic()
  lines = _error_line(_job("--coordinator_address", "[::1:5"))
  assert lines == ["specjax: error: coordinator_address must be host:port or [ipv6]:port with "
                   "a port in 1..65535, got '[::1:5'"]
  assert time.monotonic() - start < 60


def test_a_busy_coordinator_port_is_named():
  # It died with a JaxRuntimeError traceback, or a segfault.
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    lines = _error_line(_job("--coordinator_address", f"127.0.0.1:{port}"))
  assert lines == [f"specjax: error: the coordinator port {port} is busy (another program "
                   "listens on it); give another port in coordinator_address"]


def test_a_process_left_alone_gives_up_after_the_connect_timeout():
  # Process 0 started alone waited 300 s in silence (JAX's default), then aborted.
  port = launch.free_port()
  start = time.monotonic()
  lines = _error_line(_job("--coordinator_address", f"127.0.0.1:{port}",
                           "--connect_timeout", "3"))
  assert lines == [f"specjax: error: process 0 of 2 could not join the job at 127.0.0.1:{port} "
                   "within 3 s: start every process with the same coordinator_address (process "
                   "0 serves it), or raise --connect_timeout / $SPECJAX_CONNECT_TIMEOUT"]
  assert time.monotonic() - start < 90


def test_processes_given_different_prompts_are_refused_together(tmp_path):
  # An AssertionError traceback and a gloo abort.
  address = f"127.0.0.1:{launch.free_port()}"
  flags = ("--coordinator_address", address, "--connect_timeout", "60",
           f"--gin.OUTPUT_DIR='{tmp_path}'")
  procs = [_job(*flags, process_id=i, prompt=f"prompt of process {i}") for i in range(2)]
  for proc in procs:
    assert _error_line(proc, timeout=180) == [
        "specjax: error: the inputs differ between processes (those of process 1 are not those "
        "of process 0); every process of a job must be given the same"]
  assert not list(tmp_path.iterdir())
