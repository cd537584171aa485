"""The main job with a feature head (EAGLE-style) as its drafter: a chain, a tree, the bundled
head's run file, and the refusals of heads that do not fit."""
import json

import gin
import pytest

from specjax import app as main
from specjax.app import bundled, run
from specjax.checkpoints import save_t5x
from specjax.models import FeatureHead, FeatureHeadConfig, model_gin_text, read_model_gin

TINY_HEAD = dict(num_heads=2, head_dim=8, mlp_dim=32)


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _save(folder, config, params):
  """A model folder as specjax.train writes it: model.gin + checkpoint_1."""
  folder.mkdir()
  (folder / "model.gin").write_text(model_gin_text(config))
  save_t5x(params, str(folder), step=1, dtype="float32")
  return folder


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory, tiny_lm_pair):
  """The shared tiny LM target and a random feature head for it, saved as model folders."""
  root = tmp_path_factory.mktemp("feature_job")
  target = _save(root / "target", tiny_lm_pair.target.config, tiny_lm_pair.target_params)
  config = FeatureHeadConfig(vocab_size=tiny_lm_pair.target.vocab_size,
                             emb_dim=tiny_lm_pair.target.feature_dim, **TINY_HEAD)
  head = _save(root / "head", config, FeatureHead(config).init(3))
  return target, head


def _args(target, draft, *more):
  return ["--gin_file=runs/bundled_lm_eagle.gin", "--prompt", "This package provides",
          "--prompt", "A library", "--plain", "--gin.MAX_NEW_TOKENS=8", "--gin.GAMMA=3",
          f"--gin.TARGET_MODEL='{target}/model.gin'", f"--gin.TARGET_CHECKPOINT='{target}'",
          f"--gin.DRAFT_MODEL='{draft}/model.gin'", f"--gin.DRAFT_CHECKPOINT='{draft}'",
          "--gin.WEIGHTS_DTYPE='float32'", *more]


@pytest.mark.parametrize("tree", [None, "decoding/tree.gin"])
def test_a_feature_head_drafts_chains_and_trees_in_the_main_job(tiny_folders, tree):
  target, head = tiny_folders
  summary = run(_args(target, head, *([f"--gin_file={tree}"] if tree else [])))
  assert summary["greedy_identical"] is True
  assert summary["drafter"] == "feature"
  assert summary["speculating_rounds"].endswith("(100%)")


@pytest.mark.parametrize("role", ["eagle", "eagle3"])
def test_the_bundled_head_runs_from_its_run_file(tmp_path, role):
  # runs/bundled_lm_eagle.gin itself: the bundled LM target and bundled:lm/eagle; and
  # runs/bundled_lm_eagle3.gin: bundled:lm/eagle3, a head over three layers' features.
  assert bundled.available("lm", role)
  layers = read_model_gin(str(bundled.model_dir("lm", role))).feature_layers
  assert (layers is None) == (role == "eagle"), layers
  # The target ends this prompt at once (its first token is EOS); the run file ignores EOS,
  # so both decodes go on to the budget.
  prompt = "Shellingham detects what shell the current Python executable is running in."
  summary = run([f"--gin_file=runs/bundled_lm_{role}.gin", "--prompt", prompt,
                 "--plain", "--gin.MAX_NEW_TOKENS=12", f"--gin.OUTPUT_DIR='{tmp_path}'"])
  assert summary["greedy_identical"] is True and summary["drafter"] == "feature"
  assert summary["alpha"] > 0.3  # a trained head, not a random one (random: about 0)
  assert summary["eos"] == "ignored: every example decodes 12 tokens"
  assert summary["autoregressive_tokens_per_row"] == "12.0 (12-12)"
  assert summary["speculative_tokens_per_row"] == "12.0 (12-12)"
  # DRAFT_WEIGHTS_DTYPE 'auto': the machine's choice and its reason are in the summary.
  from specjax import machine
  chosen, why = machine.draft_weights_dtype("cpu")
  assert summary["draft_weights_dtype"] == chosen
  assert summary["draft_weights_dtype_why"] == f"'auto' chose {chosen}: {why}"
  record = json.loads((tmp_path / "results.jsonl").read_text())
  assert record["prediction_tokens"][0] == 1 and len(record["prediction_tokens"]) == 12


@pytest.mark.parametrize("role", ["eagle", "eagle3"])
def test_the_bundled_translation_head_runs_from_its_run_file(tmp_path, role):
  # runs/bundled_translate_eagle.gin: the bundled EN->DE target and bundled:translate/eagle,
  # a head whose layer also reads the source (cross_attention); runs/bundled_translate_eagle3.gin:
  # bundled:translate/eagle3, that head over all three decoder layers' features.
  assert bundled.available("translate", role)
  layers = read_model_gin(str(bundled.model_dir("translate", role))).feature_layers
  assert layers == (None if role == "eagle" else (0, 1, 3)), layers
  summary = run([f"--gin_file=runs/bundled_translate_{role}.gin", "--plain",
                 "--prompt", "The house is wonderful.", "--prompt", "Open the file.",
                 "--gin.MAX_NEW_TOKENS=12", f"--gin.OUTPUT_DIR='{tmp_path}'"])
  assert summary["drafter"] == "feature" and summary["gamma"] == 2
  assert summary["speculating_rounds"].endswith("(100%)")
  assert summary["alpha"] > 0.3  # a trained head, not a random one (random: about 0)
  # bfloat16 target: equal outputs, or differences only at near-ties (greedy_check).
  assert (summary["greedy_identical"] is True
          or summary["greedy_verdict"].startswith("differs only at near-ties"))


def _no_weights(monkeypatch):
  """Makes loading any weights fail: a refusal that fires first never gets there."""
  def fail(*args, **kwargs):
    raise AssertionError("weights were loaded before the head was checked")
  monkeypatch.setattr(main.measure, "load_params", fail)


def test_heads_that_do_not_fit_are_refused_before_any_weights_load(tiny_folders, tmp_path,
                                                                    monkeypatch, tiny_lm_pair):
  target, head = tiny_folders
  _no_weights(monkeypatch)
  # A draft model where a head belongs.
  with pytest.raises(ValueError, match=r"^drafter 'feature' drafts with a feature head .*got a "
                                       r"DecoderOnlyConfig"):
    run(_args(target, target))
  gin.clear_config()
  # A head trained for a target of another width: both shapes named.
  wide = FeatureHeadConfig(vocab_size=tiny_lm_pair.target.vocab_size, emb_dim=32, **TINY_HEAD)
  (tmp_path / "wide").mkdir()
  (tmp_path / "wide" / "model.gin").write_text(model_gin_text(wide))
  with pytest.raises(ValueError, match="feature head was built for a target with emb_dim 32 "
                                       "and vocab_size 8192, but this target has emb_dim 16"):
    run(_args(target, tmp_path / "wide"))
  gin.clear_config()
  # A head folder without its model.gin.
  (tmp_path / "bare").mkdir()
  with pytest.raises(FileNotFoundError, match="model.gin"):
    run(_args(target, tmp_path / "bare"))
  gin.clear_config()
  # A TREE with prompt lookup, whose drafter drafts its own tree: one line.
  with pytest.raises(ValueError, match="TREE needs the draft model .*or a feature head"):
    run(_args(target, head, "--gin_file=decoding/tree.gin",
              "--gin.decode_job.drafter='prompt_lookup'", "--gin.decode_job.drafter_options={}"))
