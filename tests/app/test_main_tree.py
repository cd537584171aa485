"""The main job with TREE: the draft model drafts a token tree every round (`tree_decode`);
settings a tree cannot take are refused before any model loads."""
import json

import pytest

from specjax.app import run

TINY = "runs/random_tiny.gin"
pytestmark = pytest.mark.usefixtures("gin_cleared")


def test_default_run_with_a_tree_is_greedy_identical(tmp_path):
  summary = run(["--gin_file=runs/default.gin", "--gin_file=decoding/tree.gin",
                 "--prompt", "The package provides a library.", "--prompt", "Hello world", "--gin.MAX_NEW_TOKENS=8", "--gin.BATCH_SIZE=2",
                 "--gin.TIMING_REPEATS=1", "--plain", f"--gin.OUTPUT_DIR='{tmp_path}'"])
  assert summary["greedy_identical"] is True
  assert summary["tree"] == "StaticTree, nodes per level 2/1/1/1/1/1"
  assert summary["rounds_by_gamma"].startswith("6: ")  # every round a tree of depth 6
  assert json.loads((tmp_path / "summary.json").read_text())["gamma"] == "n/a: a tree"


def assert_refused_before(monkeypatch, step, what, argv, message):
  """`run(argv)` raises ValueError matching `message` before `step` (a dotted name the job
  calls, replaced by one that fails the test) runs; `what` names that step."""
  def fail(*args, **kwargs):
    raise AssertionError(f"{what} before the settings were checked")
  monkeypatch.setattr(step, fail)
  with pytest.raises(ValueError, match=message):
    run(argv)


@pytest.mark.parametrize("bindings,message", [
    (["--gin.TREE=3"], "TREE must be a StaticTree or DynamicTree"),
    (["--gin.decode_job.drafter='prompt_lookup'"], "TREE needs the draft model"),
    (["--gin.GAMMA_POLICY='heuristic'"], "TREE takes GAMMA_POLICY 'constant' or 'auto'"),
    (["--gin.VERIFIER=@specjax.verify.BlockVerifier()"], "TREE verifies with the tree rule"),
])
def test_settings_a_tree_cannot_take_are_refused_first(monkeypatch, tmp_path, bindings,
                                                      message):
  assert_refused_before(monkeypatch, "specjax.app.plan.build_model", "a model was built",
                        [f"--gin_file={TINY}", "--gin_file=decoding/tree.gin", "--prompt", "x",
                         f"--gin.OUTPUT_DIR='{tmp_path}'", *bindings], message)


def test_a_registered_tree_drafter_runs_by_name(tmp_path):
  # Prompt lookup drafting its own tree (2 branches, depth 3): no TREE, no draft model.
  summary = run([f"--gin_file={TINY}", "--prompt", "Hello world", "--gin.MAX_NEW_TOKENS=6",
                 "--gin.BATCH_SIZE=1", "--gin.TIMING_REPEATS=1", "--plain",
                 "--gin.decode_job.drafter='prompt_lookup_tree'",
                 "--gin.decode_job.drafter_options={'depth': 3}",
                 f"--gin.OUTPUT_DIR='{tmp_path}'"])
  assert summary["drafter"] == "prompt_lookup_tree"
  assert summary["tree"] == "StaticTree, nodes per level 2/2/2"
  assert summary["greedy_identical"] is True


@pytest.mark.parametrize("bindings,message", [
    (["--gin.decode_job.drafter='no_such'"], r"drafter must be one of \[.*'prompt_lookup'"),
    (["--gin.decode_job.drafter='ngram'"], "'ngram' drafts from params fitted in Python"),
    (["--gin.decode_job.drafter_options={'nope': 1}"],
     r"drafter 'model' has no field 'nope'; its fields are \['model', 'max_gamma'"),
])
def test_drafter_settings_are_refused_before_any_model(monkeypatch, tmp_path, bindings, message):
  assert_refused_before(monkeypatch, "specjax.app.plan.build_model", "a model was built",
                        [f"--gin_file={TINY}", "--prompt", "x", f"--gin.OUTPUT_DIR='{tmp_path}'",
                         *bindings], message)


@pytest.mark.parametrize("bindings,message", [
    # The drafter's own tree is known once it is built (its vocabulary is the target's).
    (["--gin.decode_job.drafter='prompt_lookup_tree'", "--gin.GAMMA_POLICY='heuristic'"],
     "TREE takes GAMMA_POLICY 'constant' or 'auto'"),
    (["--gin.decode_job.drafter='prompt_lookup_tree'",
      "--gin.decode_job.drafter_options={'branches': 9000}"],
     r"spine lengths \(4, 4, .*\(9000 in all\) makes a tree of 36000 nodes, more than 2048"),
])
def test_a_drafter_tree_is_refused_before_any_weights_load(monkeypatch, tmp_path, bindings,
                                                           message):
  assert_refused_before(monkeypatch, "specjax.app.measure.load_params", "weights were loaded",
                        [f"--gin_file={TINY}", "--prompt", "x", f"--gin.OUTPUT_DIR='{tmp_path}'",
                         *bindings], message)
