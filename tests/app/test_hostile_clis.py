"""The other commands against a hostile user (`python -m specjax.train`, `specjax.app.export_hf`,
`specjax.train.teacher_data`): every user error one line `specjax: error: ...` and exit status
2, never a traceback; an export never replaces the checkpoint it reads; a full disk named by
the file it stopped; the exported files readable by all. Each case is a subprocess through
the command's public surface; checks share a process where the command allows it."""
import os
import re
import shutil
import stat
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAIR = os.path.join(ROOT, "specjax", "assets", "pairs", "translate", "target")

# Runs one command's `cli` on several argument lists in one process (JAX starts once);
# prints each status on stderr after a marker line.
_MANY = """
import importlib, json, sys
import gin
cli = importlib.import_module(sys.argv[1]).cli
for argv in json.loads(sys.argv[2]):
  gin.clear_config()
  status = cli(argv)
  print(f"=== status {status}", flush=True)
  print(f"=== status {status}", file=sys.stderr, flush=True)
"""


def many(module, argvs, cwd=ROOT):
  """[(status, its `specjax: error:` lines)] of `module.cli(argv)` for each argv, all in one
  subprocess (no traceback allowed); `many.stdout` holds each call's standard output."""
  import json  # pylint: disable=import-outside-toplevel
  proc = subprocess.run([sys.executable, "-c", _MANY, module, json.dumps(argvs)], cwd=cwd,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  chunks = proc.stderr.split("=== status ")
  results = []
  for before, after in zip(chunks, chunks[1:]):
    errors = [l for l in before.splitlines() if l.startswith("specjax: error: ")]
    results.append((int(after.split("\n", 1)[0]), errors))
  assert len(results) == len(argvs)
  many.stdout = proc.stdout.split("=== status ")
  return results


def _command(*args, cwd=ROOT, preexec_fn=None):
  return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                        timeout=300, preexec_fn=preexec_fn)


def test_teacher_data_refuses_bad_counts_before_any_work(tmp_path):
  # --chunk -1 exited 0 with an empty train.tsv; --limit -5 wrote 7 of 12 rows; --chunk 0
  # gave a traceback.
  base = ["--teacher", PAIR, "--task", "translate", "--data_dir", str(tmp_path / "data"),
          "--out", str(tmp_path / "out")]
  cases = {"--chunk -1": "--chunk must be a whole number of at least 1, got -1",
           "--limit -5": "--limit must be a whole number of at least 1, got -5",
           "--chunk 0": "--chunk must be a whole number of at least 1, got 0",
           "--batch 0": "--batch must be a whole number of at least 1, got 0",
           "--max_new_tokens 0": "--max_new_tokens must be a whole number of at least 1, got 0",
           "--temperature nan": "--temperature must be a finite number >= 0, got nan",
           "--temperature -1": "--temperature must be a finite number >= 0, got -1.0"}
  argvs = [base + flag.split() for flag in cases]
  argvs.append(["--teacher", "gs://bucket/teacher", "--task", "translate", "--data_dir",
                str(tmp_path / "data"), "--out", str(tmp_path / "out")])
  results = many("specjax.train.teacher_data", argvs)
  for (status, errors), message in zip(results, list(cases.values()) + [
      "--teacher gs://bucket/teacher is a remote path; remote paths are not supported here"]):
    assert status == 2 and len(errors) == 1 and message in errors[0], (message, errors)
  assert not (tmp_path / "out").exists()
  proc = _command("-m", "specjax.train.teacher_data", *base, "--chunk", "x")  # argparse's own
  assert proc.returncode == 2 and "specjax: error: argument --chunk: invalid int value: 'x'" \
      in proc.stderr


def test_train_user_errors_are_one_line(tmp_path):
  # NUM_STEPS=-5, BATCH_SIZE=0 and a missing teacher gave tracebacks.
  run = ["--gin_file=runs/train_lm_tiny.gin", f"--gin.MODEL_DIR='{tmp_path / 'm'}'"]
  results = many("specjax.app.train_main", [
      run + ["--gin.NUM_STEPS=-5"], run + ["--gin.BATCH_SIZE=0"],
      run + ["--gin_file=runs/distill.gin", f"--gin.TEACHER='{tmp_path / 'no_teacher'}'"],
      ["--steps=3"]])
  assert [s for s, _ in results] == [2, 2, 2, 2]
  assert results[0][1] == ["specjax: error: TrainConfig.num_steps must be an integer >= 1, got "
                           "-5"]
  assert results[1][1] == ["specjax: error: DataConfig.batch_size must be an integer >= 1, got 0"]
  assert "no_teacher" in results[2][1][0]
  assert "unknown arguments" in results[3][1][0]


_FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (3 * 2**20, 3 * 2**20))
from specjax.app import train_main
sys.exit(train_main.cli(sys.argv[1:]))
"""


def test_a_full_disk_during_training_names_the_file(tmp_path):
  # The OSError named no path. Here no file may pass 3 MiB: the parameters fit, the
  # optimizer state (4.5 MB) does not.
  model_dir = tmp_path / "m"
  proc = _command("-c", _FULL_DISK, "--gin_file=runs/train_lm_tiny.gin",
                  f"--gin.MODEL_DIR='{model_dir}'", "--gin.NUM_STEPS=2", "--gin.BATCH_SIZE=2",
                  "--gin.CHECKPOINT_EVERY=1", "--gin.EVAL_EVERY=1")
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  assert (f"specjax: error: [Errno 27] cannot write optimizer_state.npz of checkpoint "
          f"{model_dir}/checkpoint_1: File too large") in proc.stderr
  assert sorted(os.listdir(model_dir)) == ["metrics.jsonl", "model.gin"]  # no torn checkpoint


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
  """A copy of a bundled T5 target folder, with an HF config.json beside its checkpoint."""
  folder = tmp_path_factory.mktemp("export") / "target"
  shutil.copytree(PAIR, folder)
  (folder / "config.json").write_text("{}")
  return folder


def _tree(folder):
  return sorted((os.path.relpath(os.path.join(d, f), folder), os.path.getsize(os.path.join(d, f)))
                for d, _, names in os.walk(folder) for f in names)


def test_an_export_never_replaces_its_checkpoint(model_folder, tmp_path):
  # --out at the folder holding the checkpoint (a config.json in it) deleted the whole
  # checkpoint and exited 0.
  before = _tree(model_folder)
  checkpoint = str(model_folder / "checkpoint_4000")
  common = ["--checkpoint", checkpoint, "--model_gin", str(model_folder / "model.gin")]
  mixed = tmp_path / "mixed"
  mixed.mkdir()
  (mixed / "config.json").write_text("{}")
  (mixed / "notes.txt").write_text("mine")
  results = many("specjax.app.export_hf", [
      common + ["--out", str(model_folder)], common + ["--out", checkpoint],
      common + ["--out", str(mixed)], common + ["--out", "gs://bucket/hf"]])
  assert [s for s, _ in results] == [2, 2, 2, 2]
  assert results[0][1] == [f"specjax: error: --out {model_folder} holds or lies inside the "
                           f"checkpoint being exported ({checkpoint}); give a folder of its own"]
  assert "holds or lies inside the checkpoint" in results[1][1][0]
  assert results[2][1] == [f"specjax: error: --out {mixed} holds no HF model alone "
                           "('notes.txt' is not a file an HF export writes); refusing to replace "
                           "it: give a new or an earlier export's folder"]
  assert "remote paths are not supported here" in results[3][1][0]
  assert _tree(model_folder) == before
  assert (mixed / "notes.txt").read_text() == "mine"


def test_an_export_is_readable_by_all(model_folder, tmp_path):
  # model.safetensors had mode 0600.
  pytest.importorskip("transformers")
  out = tmp_path / "hf"
  proc = _command("-m", "specjax.app.export_hf", "--checkpoint",
                  str(model_folder / "checkpoint_4000"), "--model_gin",
                  str(model_folder / "model.gin"), "--out", str(out))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "model.safetensors" in os.listdir(out) and "config.json" in os.listdir(out)
  for name in os.listdir(out):
    assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o644, name
  assert stat.S_IMODE(os.stat(out).st_mode) == 0o755


def test_ctrl_c_in_the_main_job_exits_130(tmp_path):
  # It printed "specjax: interrupted", then died by SIGSEGV at exit in about 30% of runs:
  # the interpreter's teardown freed a jaxlib module that the interrupt had left half made.
  # The job's standard output is a terminal, where it draws its progress as decoding starts
  # (its report comes only at the end, after every timed pass, and the job may be done before
  # a signal sent then arrives): Ctrl-C comes once the progress is drawn, while the job
  # compiles and decodes.
  import pty  # pylint: disable=import-outside-toplevel
  import signal  # pylint: disable=import-outside-toplevel
  import threading  # pylint: disable=import-outside-toplevel
  env = {k: v for k, v in os.environ.items()
         if k not in ("TTY_COMPATIBLE", "TTY_INTERACTIVE", "FORCE_COLOR")}
  leader, follower = pty.openpty()
  # The job gets SIGINT as from a terminal (a handler, unblocked), whatever this process
  # inherited or an earlier test left: a child inherits an ignored or blocked SIGINT, and
  # Ctrl-C then never reaches the job. (Not preexec_fn: forking a multithreaded JAX process
  # to run Python in the child can deadlock.)
  handler = signal.signal(signal.SIGINT, signal.default_int_handler)
  mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
  try:
    proc = subprocess.Popen(
        [sys.executable, "-m", "specjax.main", "--gin_file=runs/random_tiny.gin", "--prompt",
         "a b c", "--gin.MAX_NEW_TOKENS=64", "--gin.TIMING_REPEATS=200", "--plain",
         f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'"], cwd=ROOT, stdout=follower,
        stderr=subprocess.PIPE, text=True, env=dict(env, TERM="xterm"))
  finally:
    if handler is not None:  # None: a handler not set from Python, left as it was
      signal.signal(signal.SIGINT, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
  os.close(follower)
  shown = []

  def drain():  # the terminal's output, read until the job has ended
    try:
      while chunk := os.read(leader, 4096):
        shown.append(chunk)
    except OSError:  # EIO: the job closed its terminal
      pass

  reader = threading.Thread(target=drain, daemon=True)
  reader.start()
  try:
    deadline = time.monotonic() + 300
    while (b"decoding" not in b"".join(shown) and proc.poll() is None
           and time.monotonic() < deadline):  # until its progress is drawn
      time.sleep(0.01)
    assert b"decoding" in b"".join(shown) and proc.poll() is None, b"".join(shown)[-2000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
    reader.join(timeout=10)
    os.close(leader)
  assert proc.returncode == 130, err[-2000:]
  assert err.strip().splitlines()[-1:] == ["specjax: interrupted"], (err, b"".join(shown))
  assert "Traceback" not in err and "Segmentation" not in err
  screen = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", b"".join(shown))  # no terminal codes
  # Python acts on SIGINT between bytecodes, so a signal sent while the example compiles or
  # decodes (one call into XLA) can be acted on only once that example is done, during the timed
  # passes: either count is the job's truth, and in both nothing may be written.
  assert re.search(rb"interrupted after [01] of 1 examples: nothing written", screen), screen
  out = tmp_path / "out"
  assert not (out / "results.jsonl").exists() and not (out / "summary.json").exists()


def test_an_interrupt_says_so_on_stderr_while_a_display_holds_it():
  # A Ctrl-C that lands while the progress display starts can leave sys.stderr redirected into
  # the display (rich's proxy, whose console writes to stdout): the message still goes to
  # the real stderr, and nothing to stdout.
  code = ("import sys\n"
          "from rich.console import Console\n"
          "from rich.file_proxy import FileProxy\n"
          "from specjax.command import exit_interrupted\n"
          "sys.stderr = FileProxy(Console(file=sys.stdout), sys.stderr)\n"
          "exit_interrupted()\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 130, result
  assert result.stderr.strip() == "specjax: interrupted" and result.stdout == "", result
