"""gin files compose as a T5X user expects: a settings file (any `decoding/*.gin`, a user's file
of bindings) given alone applies on top of the default run; a run file (one that includes
`runs/decode.gin`) replaces it. Nothing here compiles: the job is stopped where it would
build the first model, after every setting was checked."""
import gin
import pytest

from specjax.app import gin_config, run
from specjax.app.main import DEFAULT_GIN

pytestmark = pytest.mark.usefixtures("gin_cleared")

DECODING = sorted(f"decoding/{p.name}" for p in (gin_config.GIN_DIR / "decoding").glob("*.gin"))
BEAM = ["decoding/beam.gin", "decoding/beam_speculative.gin"]  # for Python callers; refused


class _Built(Exception):
  """Raised where the job would build its first model: the plan was accepted."""


@pytest.fixture
def stop_at_build(monkeypatch):
  def stop(*args, **kwargs):
    raise _Built()
  monkeypatch.setattr("specjax.app.plan.build_model", stop)


def test_a_settings_file_goes_on_top_of_the_default_run():
  assert gin_config.run_files(["decoding/tree.gin"], DEFAULT_GIN) == [DEFAULT_GIN,
                                                                      "decoding/tree.gin"]
  assert gin_config.run_files([], DEFAULT_GIN) == [DEFAULT_GIN]


@pytest.mark.parametrize("files", [["runs/bundled_translate.gin"], ["runs/decode.gin"],
                                   ["runs/random_tiny.gin", "decoding/sampling.gin"],
                                   ["decoding/sampling.gin", "runs/bundled_lm.gin"]])
def test_a_run_file_replaces_the_default_run(files):
  assert gin_config.run_files(files, DEFAULT_GIN) == files


def test_a_users_run_file_is_found_through_its_includes(tmp_path, monkeypatch):
  (tmp_path / "base.gin").write_text("include 'runs/bundled_lm.gin'\nGAMMA = 3\n")
  (tmp_path / "mine.gin").write_text("# mine\ninclude 'base.gin'\n")
  (tmp_path / "bindings.gin").write_text("GAMMA = 2\ninclude 'decoding/greedy.gin'\n")
  monkeypatch.chdir(tmp_path)
  assert gin_config.run_files(["mine.gin"], DEFAULT_GIN) == ["mine.gin"]
  assert gin_config.run_files(["bindings.gin"], DEFAULT_GIN) == [DEFAULT_GIN, "bindings.gin"]


def test_a_sampled_run_keeps_the_default_pair_and_inputs():
  gin_config.parse(gin_config.run_files(["decoding/sampling.gin"], DEFAULT_GIN), [])
  assert gin.query_parameter("Sampling.temperature") == 1.0
  assert gin_config.query_macro("TARGET_CHECKPOINT") == "bundled:lm/target"
  assert gin_config.query_macro("DEFAULT_TASK") == "lm_ddtp_en"
  assert gin_config.query_macro("MAX_NEW_TOKENS") == 128


@pytest.mark.parametrize("name", sorted(set(DECODING) - set(BEAM)))
def test_every_decoding_file_alone_is_a_valid_run(name, stop_at_build, tmp_path):
  """`specjax --gin_file=decoding/X.gin` reads the default inputs and passes every check."""
  with pytest.raises(_Built):
    run([f"--gin_file={name}", "--plain", f"--gin.OUTPUT_DIR='{tmp_path}'"])


@pytest.mark.parametrize("name", BEAM)
def test_the_beam_search_files_are_refused_before_any_model_is_built(name, stop_at_build,
                                                                     tmp_path):
  """The main job does not run beam search: its files would only replace GAMMA silently."""
  assert name in DECODING
  with pytest.raises(ValueError, match=r"configure (speculative_)?beam_search .* which the main "
                                       r"job does not run"):
    run([f"--gin_file={name}", "--plain", f"--gin.OUTPUT_DIR='{tmp_path}'"])


def test_a_tree_run_takes_one_flag(stop_at_build, tmp_path):
  with pytest.raises(_Built):
    run(["--gin_file=decoding/tree.gin", f"--gin.OUTPUT_DIR='{tmp_path}'"])
  assert gin_config.query_macro("TREE") is not None
  assert gin_config.query_macro("TARGET_MODEL") == "bundled:lm/target"
