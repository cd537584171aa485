"""Vocabulary and task errors keep the command's contract: one line `specjax: error: ...` naming
the problem and exit status 2, whichever library (SentencePiece, seqio, TensorFlow) raised it.
Every case fails before any weight is read (`load` fails the test if reached)."""
import re
import sys
from pathlib import Path

import pytest

from specjax.app.main import cli
from specjax.data._errors import library_error

ROOT = Path(__file__).resolve().parents[2]
TINY = "runs/random_tiny.gin"
pytestmark = pytest.mark.usefixtures("gin_cleared")


@pytest.fixture(autouse=True)
def _no_weights(monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError("weights were read: the error came too late")
  monkeypatch.setattr("specjax.app.job.load", fail)


def _one_line_error(capsys, argv):
  """Runs the command; asserts exit status 2 and one error line; returns that line."""
  assert cli(argv) == 2
  err = capsys.readouterr().err
  lines = [l for l in err.splitlines() if l.startswith("specjax: error: ")]
  assert len(lines) == 1 and "Traceback" not in err, err
  return lines[0]


def _readme_example():
  text = (ROOT / "README.md").read_text()
  found = re.search(r"<!-- example: own-t5x -->\s*```[a-z]*\n(.*?)```", text, re.S)
  assert found, "README.md lost its own-T5X-checkpoints example (marker example: own-t5x)"
  return found.group(1)


def test_the_readme_example_with_a_wrong_vocabulary_path_is_one_line(capsys, tmp_path):
  pytest.importorskip("seqio")  # the example imports seqio; CI installs the extra
  (tmp_path / "my_t5.gin").write_text(_readme_example())  # its /path/to/ paths do not exist
  line = _one_line_error(capsys, [f"--gin_file={tmp_path / 'my_t5.gin'}", "--prompt", "x"])
  assert "/path/to/cc_all.32000/spm.model" in line and "No such file" in line, line


def _seqio_run(tmp_path, binding):
  run_file = tmp_path / "run.gin"
  run_file.write_text("from __gin__ import dynamic_registration\nimport seqio\n"
                      f"include '{TINY}'\nVOCABULARY = @seqio.SentencePieceVocabulary()\n"
                      f"{binding}\n")
  return [f"--gin_file={run_file}", "--prompt", "x", f"--gin.OUTPUT_DIR='{tmp_path / 'o'}'"]


@pytest.mark.parametrize("content,message", [
    (None, "is a directory"),
    (b"not a SentencePiece model", "cannot read its model: DecodeError"),
])
def test_a_seqio_vocabulary_on_a_bad_file_is_one_line(capsys, tmp_path, content, message):
  pytest.importorskip("seqio")
  bad = tmp_path / "spm.model"
  if content is None:
    bad.mkdir()
  else:
    bad.write_bytes(content)
  argv = _seqio_run(tmp_path, f"seqio.SentencePieceVocabulary.sentencepiece_model_file = "
                              f"'{bad}'")
  line = _one_line_error(capsys, argv)
  assert message.lower() in line.lower(), line


def test_a_seqio_vocabulary_without_its_file_names_the_binding(capsys, tmp_path):
  pytest.importorskip("seqio")
  line = _one_line_error(capsys, _seqio_run(tmp_path, ""))
  assert "SentencePieceVocabulary.sentencepiece_model_file" in line, line


@pytest.mark.parametrize("binding,message", [
    ("--gin.VOCABULARY=@Vocab()", "bind Vocab.model_path"),
    ("--gin.VOCABULARY='{tmp}'", "is a folder: name its SentencePiece model file"),
    ("--gin.VOCABULARY='{tmp}/none.model'", "SentencePiece model not found"),
    ("--gin.DRAFT_VOCABULARY='{tmp}/none.model'", "SentencePiece model not found"),
])
def test_a_bad_vocabulary_binding_is_one_line(capsys, tmp_path, binding, message):
  line = _one_line_error(capsys, [f"--gin_file={TINY}", "--prompt", "x",
                                  binding.format(tmp=tmp_path)])
  assert message in line, line


_TASK_MODULE = """
import seqio
from specjax.data import vocab

@seqio.map_over_dataset
def _pair(line):
  return {"inputs": line, "targets": line}

seqio.TaskRegistry.remove("errors_test_missing_file")
seqio.TaskRegistry.add(
    "errors_test_missing_file",
    source=seqio.TextLineDataSource({"validation": %r}),
    output_features={k: seqio.Feature(vocab.seqio_vocab()) for k in ("inputs", "targets")},
    preprocessors=[_pair, seqio.preprocessors.tokenize])
"""


@pytest.mark.parametrize("lengths,message", [
    (None, "reading its examples: {missing}; No such file or directory"),
    ("{'inputs': 'x'}", "TypeError: "),
])
def test_a_user_task_that_cannot_be_read_is_one_line(capsys, tmp_path, monkeypatch, lengths,
                                                     message):
  pytest.importorskip("seqio")
  missing = tmp_path / "missing.txt"
  (tmp_path / "errors_test_tasks.py").write_text(_TASK_MODULE % str(missing))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "errors_test_tasks", raising=False)
  argv = [f"--gin_file={TINY}", "--task", "errors_test_missing_file",
          "--gin.MIXTURE_OR_TASK_MODULE='errors_test_tasks'"]
  if lengths:
    argv.append(f"--gin.TASK_FEATURE_LENGTHS={lengths}")
  line = _one_line_error(capsys, argv)
  assert "task 'errors_test_missing_file', split 'validation'" in line, line
  assert message.format(missing=missing) in line, line


class NotFoundError(Exception):
  """Stands in for tensorflow.errors.NotFoundError (matched by name: no TensorFlow here)."""


def test_library_errors_read_as_one_line():
  error = library_error("task 't'", NotFoundError(
      "{{function_node __wrapped__IteratorGetNext_device_/job:localhost/CPU:0}} /d/x.txt; No "
      "such file or directory [Op:IteratorGetNext] name: "))
  assert isinstance(error, FileNotFoundError)
  assert str(error) == "task 't': /d/x.txt; No such file or directory"
  error = library_error("task 't'", TypeError("in user code:\n\n  File \"f.py\", line 3\n\n"
                                              "  TypeError: bad index 'x'\n"))
  assert isinstance(error, ValueError) and str(error) == "task 't': TypeError: bad index 'x'"
  assert str(library_error("v", RuntimeError())) == "v: RuntimeError"
