"""Regenerates the README's first-run block from a real run of the main job.

  python -m experiments.readme_first_run            # run the job, rewrite README.md's block
  python -m experiments.readme_first_run --dry_run  # run the job, print the block instead

Runs `python -m specjax.main --plain` (the README's first command's job, the bundled default) in
a subprocess and puts its output between `<!-- first-run:start -->` and `<!-- first-run:end -->`:
the first `--keep` output lines, a "..." line where the rest of the outputs are cut, then the
trace and the summary unchanged, and a line naming the command, the machine and the date. Run it
on a quiet machine: the summary's timings are whatever the machine gave.
"""
import argparse
import datetime
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from specjax import machine
from specjax.command import run_cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
START, END = "<!-- first-run:start -->", "<!-- first-run:end -->"
COMMAND = ["-m", "specjax.main", "--plain"]
TRACE_HEAD = "Figure-1 trace"


def machine_line(date=None):
  """Two lines: the command and the date (UTC), then the machine
  (`specjax.machine.describe`: CPU model, cores, dot instructions)."""
  date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
  return f"`python {' '.join(COMMAND)}`, {date},\non {machine.describe()}."


def cut_outputs(stdout, keep):
  """The job's stdout with the outputs before the trace cut to `keep` lines and a '...' line."""
  lines = stdout.rstrip("\n").splitlines()
  at = next((i for i, line in enumerate(lines) if line.startswith(TRACE_HEAD)), None)
  if at is None:
    raise ValueError(f"the job's output has no line starting {TRACE_HEAD!r}; is it the main job?")
  outputs, rest = lines[:at], lines[at:]
  if len(outputs) > keep:
    outputs = outputs[:keep] + ["..."]
  return "\n".join(outputs + rest)


def block(stdout, keep, date=None):
  """The markdown between the markers: the cut output in a text fence, then the machine line."""
  return f"```text\n{cut_outputs(stdout, keep)}\n```\n\n{machine_line(date)}\n"


def replace_block(text, new_block):
  """`text` with whatever lies between the first-run markers replaced by `new_block`."""
  start, end = text.find(START), text.find(END)
  if start < 0 or end < start:
    raise ValueError(f"README.md needs the markers {START} and {END}, in that order")
  return text[:start + len(START)] + "\n" + new_block + text[end:]


def write_atomic(path, text):
  """Writes beside `path` under a temporary name, then renames into place."""
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def run_job(timeout_s):
  """stdout of the main job, run from an empty folder with this checkout first on the path."""
  env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  with tempfile.TemporaryDirectory() as cwd:
    result = subprocess.run([sys.executable] + COMMAND, cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout_s)
  if result.returncode != 0:
    raise RuntimeError(f"the main job failed ({result.returncode}):\n{result.stderr[-2000:]}")
  return result.stdout


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dry_run", action="store_true", help="print the block, leave README")
  parser.add_argument("--keep", type=int, default=8, help="output lines kept before '...'")
  parser.add_argument("--timeout_s", type=int, default=1800)
  args = parser.parse_args(argv)
  if args.keep < 0:
    parser.error(f"--keep must be >= 0, got {args.keep}")
  text = README.read_text()
  replace_block(text, "")  # the markers must exist before the job runs
  new_block = block(run_job(args.timeout_s), args.keep)
  if args.dry_run:
    print(new_block, end="")
  else:
    write_atomic(README, replace_block(text, new_block))
    print(f"rewrote the first-run block of {README}")


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
