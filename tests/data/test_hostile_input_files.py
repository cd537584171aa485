"""--input_file against files that are not what they seem (docs/results/hostile_probe.md,
second part): CR-only line endings, /dev/zero, a FIFO, a file past the size cap."""
import os
import subprocess
import sys

import pytest

from specjax.data import inputs as inputs_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_cr_only_line_endings_are_lines(tmp_path):
  # Old Mac line endings made the whole file one input.
  path = tmp_path / "inputs.txt"
  path.write_bytes(b"one\rtwo\r\rthree\r\nfour\n")
  assert inputs_lib.read_input_file(str(path)) == ["one", "two", "three", "four"]


def test_a_file_past_the_cap_is_refused_by_size(tmp_path):
  path = tmp_path / "inputs.txt"
  path.write_bytes(b"x\n" * 600)
  with pytest.raises(ValueError, match="--input_file .*inputs.txt is 1200 bytes, more than the "
                     "1024 bytes accepted"):
    inputs_lib.read_input_file(str(path), limit=1024)


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_dev_zero_and_a_fifo_are_refused_not_read(tmp_path, special):
  # /dev/zero was read until MemoryError; a FIFO waited forever. Run capped at 3 GiB and 30 s.
  path = special
  if special == "fifo":
    path = str(tmp_path / "inputs.fifo")
    os.mkfifo(path)
  code = ("import resource, sys\n"
          "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
          "from specjax.data import inputs\n"
          f"try:\n  inputs.read_input_file({path!r})\n"
          "except ValueError as e:\n  print(e); sys.exit(3)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=30)
  assert result.returncode == 3, result.stderr[-1500:]
  kind = "a character device" if special == "/dev/zero" else "a FIFO"
  assert f"is {kind}, not a regular file" in result.stdout
