"""Settings a user can give the main job that gave tracebacks, hung or lost results: a value of
the wrong type for a setting read by code, a tree too large to build or deeper than the budget,
cuDNN attention on a host without a GPU, and two runs writing one OUTPUT_DIR at once. Each is
refused in one line before any weights load (or, for the race, handled: nothing is lost)."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from specjax.app import gin_config, measure
from specjax.app.main import cli
from specjax.app.settings import check_path
from specjax.draft.tree import MAX_TREE_NODES, DynamicTree, StaticTree, cap_depth
from tests.test_hostile import _clear_gin  # pylint: disable=unused-import (autouse fixture)

TINY = "runs/random_tiny.gin"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def no_weights(monkeypatch):
  monkeypatch.setattr(measure, "load_params", lambda *a, **k: pytest.fail("weights loaded"))


def _error(capsys, tmp_path, *bindings):
  """The one line `specjax` prints for a run of the tiny pair with `bindings` (exit 2)."""
  status = cli([f"--gin_file={TINY}", "--prompt", "x", f"--gin.OUTPUT_DIR='{tmp_path}'",
                *[f"--gin.{b}" for b in bindings]])
  err = capsys.readouterr().err.strip()
  assert status == 2 and "\n" not in err and "Traceback" not in err, err
  return err


@pytest.mark.parametrize("binding, message", [
    ("COST_TABLE=5", r"COST_TABLE must be a path \(a quoted string\) or None, got int 5"),
    ("MIXTURE_OR_TASK_NAME=['translate_en_de']", "MIXTURE_OR_TASK_NAME must be a task name"),
    ("MIXTURE_OR_TASK_MODULE=5", "MIXTURE_OR_TASK_MODULE must be a module name or a list"),
    ("TARGET_MODEL=5", r"TARGET_MODEL must be a model gin file name \(a quoted string\), got int"),
    ("DRAFT_VOCABULARY=5", "DRAFT_VOCABULARY must be a SentencePiece model path"),
    ("WRITE_SCORES='no'", "write_scores must be True or False, got 'no'"),
    ("OUTPUT_DIR='a\\x00b'", "OUTPUT_DIR contains a NUL byte"),
    ("TREE=@specjax.draft.tree_spines()\n tree_spines.lengths=(100000,)",
     f"spine lengths \\(100000,\\) makes a tree of 100000 nodes, more than {MAX_TREE_NODES}"),
    ("TREE=@specjax.draft.tree_branching()\n tree_branching.branching=(64,64,64,64,64)",
     "makes a tree of at least 4160 nodes"),
    ("target/T5Config.attention_impl='cudnn'", "attention_impl 'cudnn' runs on an NVIDIA GPU "
     "only, and this job runs on cpu"),
])
def test_a_bad_setting_is_one_line(binding, message, tmp_path, capsys, no_weights):
  if binding.startswith("target/"):  # cuDNN needs a half-precision model to get this far
    binding = [binding, "target/T5Config.dtype='bfloat16'"]
  err = _error(capsys, tmp_path, *([binding] if isinstance(binding, str) else binding))
  assert re.search(message, err), err


def test_a_prompt_is_never_empty(tmp_path, capsys, no_weights):
  assert cli([f"--gin_file={TINY}", "--prompt", "  ", f"--gin.OUTPUT_DIR='{tmp_path}'"]) == 2
  assert "--prompt 1 is empty" in capsys.readouterr().err


def test_a_tilde_in_a_path_is_the_home_folder():
  # OUTPUT_DIR='~/x' made a folder named '~' while printing ~/x.
  assert check_path("output_dir", "~/x") == os.path.join(os.path.expanduser("~"), "x")
  assert check_path("target_checkpoint", "bundled:lm/target") == "bundled:lm/target"


def test_a_tree_is_cut_at_the_budget_as_gamma_is():
  # A (5000,) spine with 4 new tokens compiled for over 200 s.
  spine = StaticTree.from_spines((2000, 3, 1))
  cut = cap_depth(spine, 4)
  assert cut.levels == (3, 2, 2, 1) and cut.parents == spine.parents[:8]
  assert cap_depth(spine, 5000) is spine
  grown = DynamicTree(branch=3, expand=2, max_depth=6, keep=20)
  assert cap_depth(grown, 2) == DynamicTree(branch=3, expand=2, max_depth=2, keep=9)


def test_unused_bindings_and_feature_lengths_are_said(tmp_path, capsys):
  # Bindings to configurables the job never calls, and TASK_FEATURE_LENGTHS keys it never
  # reads, were ignored silently.
  assert cli([f"--gin_file={TINY}", "--prompt", "x", f"--gin.OUTPUT_DIR='{tmp_path}'",
              "--gin.MAX_NEW_TOKENS=2", "--gin.TIMING_REPEATS=1",
              "--gin.tree_paths.iid=True",
              "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 2, 'extra': 3}"]) == 0
  err = capsys.readouterr().err
  assert "--gin.tree_paths.iid=True changed nothing: this run never called " \
         "tree_paths" in err
  assert "TASK_FEATURE_LENGTHS['extra'] sets no length here" in err
  assert "--gin.MAX_NEW_TOKENS" not in err


WRITER = """
import sys
from specjax.app import records
for i in range({writes}):
  records.write(sys.argv[1], [{{"prediction": f"{{sys.argv[2]}}-{{i}}"}}] * 3,
                {{"run": f"{{sys.argv[2]}}-{{i}}"}})
"""


def test_two_runs_writing_one_output_dir_lose_nothing(tmp_path):
  # 200 writes by two runs: 49 results vanished with no error, one folder held half a pair.
  writes = 60
  procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER.format(writes=writes)),
                             str(tmp_path), name], cwd=ROOT) for name in ("a", "b")]
  assert [p.wait(timeout=300) for p in procs] == [0, 0]
  folders = [tmp_path] + sorted((tmp_path / "earlier").iterdir())
  runs = []
  for folder in folders:  # every folder a whole pair, the summary matching its results
    summary = json.loads((folder / "summary.json").read_text())["run"]
    lines = (folder / "results.jsonl").read_text().splitlines()
    assert [json.loads(l)["prediction"] for l in lines] == [summary] * 3
    runs.append(summary)
  assert sorted(runs) == sorted(f"{n}-{i}" for n in "ab" for i in range(writes))


def test_environment_settings_are_checked(monkeypatch):
  # An unknown SPECJAX_NORM_KERNEL silently meant 'fused'; SPECJAX_LOCAL_DEVICES=100000
  # segfaulted after 74 s.
  from specjax.models import fused  # pylint: disable=import-outside-toplevel
  from specjax.runtime import distributed  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv(fused.ENV, "triton")
  with pytest.raises(ValueError, match="SPECJAX_NORM_KERNEL='triton' is not one of fused, xla"):
    fused.enabled()
  monkeypatch.setenv(fused.ENV, "xla")
  assert not fused.enabled()
  with pytest.raises(ValueError, match=r"SPECJAX_LOCAL_DEVICES\) must be in \[1, 1024\]"):
    distributed.resolve(local_device_count=100000)
