"""`python -m specjax.runtime.launch` against hostile children and signals: every child polled,
signals passed on to every process group, output relayed as bytes, the failed child named,
the port checked, and no process left behind. The children are plain Python
(tests/runtime/launch_child.py), so each run takes a second or two."""
import os
import signal
import subprocess
import sys
import time

import pytest

from specjax.runtime import launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _launcher(folder, action, *flags):
  return subprocess.Popen(
      [sys.executable, "-m", "specjax.runtime.launch", "--num_processes", "2", *flags, "--",
       "tests.runtime.launch_child", action, str(folder)],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _pids(folder):
  """Every child's and grandchild's pid, once both children have written theirs."""
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    found = [folder / f"{i}.pids" for i in range(2)]
    if all(p.exists() and p.read_text().endswith("\n") for p in found):
      return [int(pid) for p in found for pid in p.read_text().split()]
    time.sleep(0.1)
  raise AssertionError("the children never started")


def _alive(pid):
  """Whether `pid` runs (a zombie waiting for its reaper does not)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def _none_left(pids):
  deadline = time.monotonic() + 5
  while any(_alive(p) for p in pids) and time.monotonic() < deadline:
    time.sleep(0.1)
  return [p for p in pids if _alive(p)]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_launcher_stops_every_process(tmp_path, signum):
  # The children (and theirs) kept running after the launcher died; SIGINT printed a
  # KeyboardInterrupt traceback.
  proc = _launcher(tmp_path, "sleep")
  pids = _pids(tmp_path)
  proc.send_signal(signum)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 128 + signum
  assert f"got {signum.name}; passing it to every process" in err.decode()
  assert "Traceback" not in err.decode()
  assert _none_left(pids) == []


def test_a_launcher_killed_by_sigkill_takes_its_children_along(tmp_path):
  # No handler sees SIGKILL: the children die with their parent (Linux's parent-death signal).
  proc = _launcher(tmp_path, "sleep")
  pids = _pids(tmp_path)
  children, grandchildren = pids[::2], pids[1::2]
  proc.kill()
  proc.communicate(timeout=60)
  try:
    assert _none_left(children) == []
  finally:  # a grandchild outlives its killed parent here: the test ends it
    for pid in grandchildren:
      if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def test_a_killed_child_is_named_and_the_others_are_stopped(tmp_path):
  # The poll loop stopped at the first live process: a SIGKILLed process 1 went unnoticed
  # and the job hung; the launcher then exited 247 without naming the child.
  proc = _launcher(tmp_path, "die1")
  pids = _pids(tmp_path)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 128 + signal.SIGKILL
  assert "process 1 of 2 was killed by SIGKILL; stopping the others" in err.decode()
  assert _none_left(pids) == []


def test_output_that_is_not_utf8_is_relayed_whole(tmp_path):
  # One non-UTF-8 byte killed the relay thread; the child then blocked on a full pipe.
  proc = _launcher(tmp_path, "bytes", "--timeout", "60")
  pids = _pids(tmp_path)
  out, err = proc.communicate(timeout=90)
  assert proc.returncode == 0, err.decode(errors="replace")
  for index in range(2):
    assert f"[p{index}] caf\xe9 \xff\n".encode("latin-1") in out
    assert out.count(f"[p{index}] done\n".encode()) == 1
    assert out.count(f"[p{index}] {'y' * 255}\n".encode()) == 1024  # all of the 256 KiB
  assert _none_left(pids) == []  # the grandchildren too


def test_ports_are_checked_before_anything_starts(tmp_path):
  # --port 0 hung and --port 70000 was accepted.
  for port in ("0", "70000", "-1"):
    proc = _launcher(tmp_path, "sleep", "--port", port)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "--port must be a TCP port in 1..65535" in err.decode()
  with pytest.raises(ValueError, match="is not free on 127.0.0.1"):
    import socket  # pylint: disable=import-outside-toplevel
    with socket.socket() as busy:
      busy.bind(("127.0.0.1", 0))
      busy.listen()
      launch.launch(["json.tool"], 2, port=busy.getsockname()[1])
  assert not list(tmp_path.iterdir())  # no child ever started
