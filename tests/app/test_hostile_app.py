"""The main job against hostile text and output folders (docs/results/hostile_probe.md, second
part): user text shown as data (no markup, no control bytes), outputs never torn and their
destinations checked before decoding, slots and caches sized by the work, an unbound gin macro
and a Latin-1 argument as one clear line. One tiny decode (random_tiny.gin); the rest is
refused before any weights load."""
import json
import os
import subprocess
import sys

import pytest

from specjax.app import measure, run
from tests.test_hostile import _clear_gin  # pylint: disable=unused-import (autouse fixture)

TINY = "runs/random_tiny.gin"  # a random-init tiny T5 pair (no checkpoint needed)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def no_weights(monkeypatch):
  """Fails the test if the job reaches its weights (`measure.load` calls `load_params`)."""
  monkeypatch.setattr(measure, "load_params", lambda *a, **k: pytest.fail("weights loaded"))


def _run(out, *args, prompts=("x",)):
  return run([f"--gin_file={TINY}", *[a for p in prompts for a in ("--prompt", p)],
              f"--gin.OUTPUT_DIR='{out}'", *args])


def test_user_text_is_data_and_the_work_sizes_slots_and_caches(tmp_path, capsys, monkeypatch):
  # '[/b]' made rich raise MarkupError after decoding (exit 1, nothing written); ESC bytes
  # reached the terminal; BATCH_SIZE=4096 allocated 4096 slots for 2 inputs, and caches were
  # sized by max_input_len (128) for 2-word prompts.
  seen = []
  real = measure.autoregressive_decode

  def spy(*args, **kwargs):
    if "slots" in kwargs:  # the decodes, not the draft-cost probe of a run that did not speculate
      seen.append((kwargs["slots"], kwargs["config"].cache_len, args[2].shape[1]))
    return real(*args, **kwargs)
  monkeypatch.setattr(measure, "autoregressive_decode", spy)
  prompts = ("see [/b] here", "esc \x1b[31mred\x07 done")
  _run(tmp_path, "--gin.MAX_NEW_TOKENS=4", "--gin.BATCH_SIZE=4096", "--gin.TIMING_REPEATS=1",
       "--plain", prompts=prompts)
  out = capsys.readouterr().out
  assert "> see [/b] here" in out
  assert "> esc \\x1b[31mred\\x07 done" in out and "\x1b" not in out and "\x07" not in out
  lines = (tmp_path / "results.jsonl").read_text(encoding="utf-8").splitlines()
  assert [json.loads(l)["input"] for l in lines] == list(prompts)  # the exact text is kept
  slots, cache_len, width = seen[0]
  assert slots == 2
  assert width == 16 and cache_len == width + 4 + 4 + 1  # inputs + budget + max_gamma + 1


def test_a_planted_symlink_or_folder_is_refused_before_decoding(tmp_path, no_weights):
  # The target of a results.jsonl symlink was overwritten after decoding.
  target = tmp_path / "precious.txt"
  target.write_text("mine")
  out = tmp_path / "out"
  out.mkdir()
  (out / "results.jsonl").symlink_to(target)
  with pytest.raises(ValueError, match="the output file .*results.jsonl is a symlink"):
    _run(out)
  assert target.read_text() == "mine"
  (out / "results.jsonl").unlink()
  (out / "summary.json").mkdir()
  with pytest.raises(ValueError, match="the output file .*summary.json is a folder"):
    _run(out)


_WRITE_UNDER_LIMIT = """
import resource, sys
from specjax.app import records
out = sys.argv[1]
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
  records.write(out, [{"input": "x" * 100, "i": i} for i in range(200)], {"examples": 200})
except OSError as e:
  print(e)
  sys.exit(3)
"""


def test_a_write_error_leaves_the_previous_outputs_whole_and_names_the_file(tmp_path):
  # With `ulimit -f` a re-run left results.jsonl torn (the previous results gone) beside the
  # old summary.json, and the message did not name the file.
  from specjax.app import records  # pylint: disable=import-outside-toplevel
  records.write(str(tmp_path), [{"input": "old", "i": 0}], {"examples": 1})
  before = {n: (tmp_path / n).read_bytes() for n in ("results.jsonl", "summary.json")}
  result = subprocess.run([sys.executable, "-c", _WRITE_UNDER_LIMIT, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 3, result.stderr[-1500:]
  assert "cannot write" in result.stdout and "results.jsonl: File too large" in result.stdout
  assert {n: (tmp_path / n).read_bytes() for n in before} == before
  assert sorted(os.listdir(tmp_path)) == ["results.jsonl", "summary.json"]  # no temporary left


def test_an_unbound_gin_macro_is_one_line(tmp_path, no_weights):
  # gin said `macro() missing 1 required positional argument: 'value'` (a TypeError).
  with pytest.raises(ValueError, match="gin macro %NOPE is used but never bound"):
    _run(tmp_path, "--gin.decode_job.gamma=%NOPE")


def test_a_latin1_byte_in_a_prompt_is_named(tmp_path, no_weights):
  # A Latin-1 'é' reaches Python as the lone surrogate U+DCE9: sentencepiece's pybind11 layer
  # raised a RuntimeError.
  with pytest.raises(ValueError, match="--prompt 2 is not UTF-8: character 3 is the byte 0xe9"):
    _run(tmp_path, prompts=("fine", "caf\udce9"))
