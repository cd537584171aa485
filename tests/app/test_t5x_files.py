"""A T5X user's own files, as they are: model gin files written for T5X (imports, `network.T5Config:`
blocks, includes through --gin_search_paths, T5X's other bindings, macros), T5X infer.gin's macro
names, the vocabulary a model gin file names, and earlier results kept in OUTPUT_DIR.

The model gin files are the ones docs/own_t5x.md shows (its recipe decodes with them in the e2e
set); here they are read and compared with the bundled EN->DE pair's own configs."""
import gin
import pytest

from specjax.app import bundled, gin_config, records
from specjax.app.loading import check_checkpoints, job_vocabulary
from specjax.data import Vocab
from specjax.data.vocab import DEFAULT_MODEL
from specjax.models import DecoderOnlyConfig, read_model_gin
from tests.test_docs import ROOT, recipe_steps

PAGE = ROOT / "docs" / "own_t5x.md"


@pytest.fixture
def t5x_files(tmp_path, monkeypatch):
  """The page's files in an empty working folder (its vocabulary copied in)."""
  for kind, path, text in recipe_steps(PAGE.read_text()):
    if kind == "file":
      (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
      (tmp_path / path).write_text(text)
  (tmp_path / "vocab").mkdir()
  (tmp_path / "vocab" / "sentencepiece.model").write_bytes(DEFAULT_MODEL.read_bytes())
  monkeypatch.chdir(tmp_path)
  return tmp_path


def test_t5x_model_gin_files_are_the_bundled_pair(t5x_files):
  """Imports, a network.T5Config: block and an include of base.gin found on --gin_search_paths
  describe exactly the bundled target and draft; T5X's other bindings are skipped and named."""
  gin_config.parse(["my_run.gin"], [], [str(t5x_files / "t5x_configs")])
  for role in ("target", "draft"):
    assert gin_config.model_config(role) == read_model_gin(str(bundled.model_dir("translate",
                                                                                  role)))
  assert gin_config.model_vocabulary("target") == {
      "sentencepiece_model_file": "vocab/sentencepiece.model", "extra_ids": 0}
  note = gin_config.model_notes()[0]
  for skipped in ("target model gin file my_models/translate_target.gin", "5 import(s)",
                  "DROPOUT_RATE", "OPTIMIZER", "MODEL", "adafactor.Adafactor",
                  "models.EncoderDecoderModel", "network.Transformer", "T5Config.dropout_rate"):
    assert skipped in note, skipped
  with pytest.raises(FileNotFoundError, match="'t5_1_1/base.gin' not found"):
    gin_config.parse(["my_run.gin"], [])  # base.gin is found only on the search path


def test_an_include_beside_the_including_file_comes_first(t5x_files):
  (t5x_files / "my_models" / "t5_1_1").mkdir()
  (t5x_files / "my_models" / "t5_1_1" / "base.gin").write_text(
      (t5x_files / "t5x_configs" / "t5_1_1" / "base.gin").read_text()
      .replace("mlp_activations = ('gelu', 'linear')", "mlp_activations = ('relu',)"))
  cls, values = gin_config.read_model_file("my_models/translate_target.gin",
                                           [str(t5x_files / "t5x_configs"), str(t5x_files)])
  assert cls == "T5Config" and values["mlp_activations"] == ("relu",)


DECODER_ONLY = """from __gin__ import dynamic_registration
from t5x import models
from t5x.examples.decoder_only import network

DROPOUT_RATE = %gin.REQUIRED
WIDTH = 64
MODEL = @models.DecoderOnlyModel()
models.DecoderOnlyModel:
  module = @network.DecoderWrapper()
  inputs_bidirectional_attention = True
network.DecoderWrapper.config = @network.TransformerConfig()
network.TransformerConfig:
  vocab_size = 512
  dtype = 'bfloat16'
  emb_dim = %WIDTH
  num_heads = 2
  num_layers = 2
  head_dim = 16
  mlp_dim = (  # a value over lines
      128)
  mlp_activations = ('gelu', 'linear')
  dropout_rate = %DROPOUT_RATE
  logits_via_embedding = True
WIDTH = 32  # gin: the last binding of a macro wins
"""


def test_a_t5x_decoder_only_file_reads_as_t5x_runs_it(tmp_path):
  """TransformerConfig is DecoderOnlyConfig with T5X's prompt convention; DecoderOnlyModel's
  prefix-LM flag is kept; dtype is honoured; a macro resolves to its last binding."""
  (tmp_path / "lm.gin").write_text(DECODER_ONLY)
  config = gin_config.model_config_from_file(str(tmp_path / "lm.gin"))
  assert config == DecoderOnlyConfig(
      vocab_size=512, emb_dim=32, num_heads=2, num_layers=2, head_dim=16, mlp_dim=128,
      logits_via_embedding=True, dtype="bfloat16", prompt_convention="t5x",
      inputs_bidirectional_attention=True)
  (tmp_path / "lm.gin").write_text(DECODER_ONLY.replace("%WIDTH", "%DROPOUT_RATE"))
  with pytest.raises(ValueError, match=r"lm.gin:15: .*emb_dim is %gin.REQUIRED through "
                     r"%DROPOUT_RATE \(.*lm.gin:5\)"):
    gin_config.model_config_from_file(str(tmp_path / "lm.gin"))


def test_the_model_gin_vocabulary_is_used_when_the_run_names_none(tmp_path):
  named = {"sentencepiece_model_file": str(DEFAULT_MODEL), "extra_ids": 4}
  vocab = job_vocabulary(None, None, None, [str(tmp_path / "ckpt")], named)
  assert isinstance(vocab, Vocab) and vocab.extra_ids == 4
  assert vocab.vocab_size == Vocab(DEFAULT_MODEL).vocab_size + 4
  bound = job_vocabulary(str(DEFAULT_MODEL), None, None, [str(tmp_path / "ckpt")],
                         dict(named, sentencepiece_model_file="/nowhere.model"))
  assert bound.extra_ids == 0  # the run's VOCABULARY wins
  remote = dict(named, sentencepiece_model_file="s3://t5-data/vocabs/cc_all/sp.model")
  with pytest.raises(ValueError, match="no vocabulary: .*names s3://t5-data/vocabs/cc_all/sp"
                     ".model, which is not a local or gs:// file"):
    job_vocabulary(None, None, None, [str(tmp_path / "ckpt")], remote)
  dev = dict(named, sentencepiece_model_file="/dev/zero")
  with pytest.raises(ValueError, match="/dev/zero, which cannot be read .*not a regular file"):
    job_vocabulary(None, None, None, [str(tmp_path / "ckpt")], dev)


def test_t5x_infer_macro_names_are_aliases(tmp_path):
  models = ["TARGET_MODEL = 'models/t5_1_1_tiny.gin'", "DRAFT_MODEL = 'models/t5_1_1_tiny.gin'"]
  gin_config.parse(["runs/decode.gin"], [*models, "CHECKPOINT_PATH = '/ckpts/xxl'",
                                         "INFER_OUTPUT_DIR = 'out/t5x'"])
  assert gin_config.query_macro("TARGET_CHECKPOINT") == "/ckpts/xxl"
  assert gin_config.query_macro("OUTPUT_DIR") == "out/t5x"
  gin_config.parse(["runs/decode.gin"], models)
  assert gin_config.query_macro("OUTPUT_DIR") == "out/decode"
  assert str(gin_config.query_macro("TARGET_CHECKPOINT")) == "%gin.REQUIRED"  # unbound
  with pytest.raises(ValueError, match="no target checkpoint: bind TARGET_CHECKPOINT \\(T5X's "
                     "CHECKPOINT_PATH\\)"):
    check_checkpoints({"target": gin.REQUIRED})
  with pytest.raises(ValueError, match="--gin.CHECKPOINT_PATH: this run binds TARGET_CHECKPOINT "
                     "itself, which T5X's CHECKPOINT_PATH stands for"):
    gin_config.parse(["runs/bundled_translate.gin"], ["CHECKPOINT_PATH = '/ckpts/xxl'"])


def test_an_earlier_runs_results_are_kept_not_overwritten(tmp_path):
  records.write(str(tmp_path), [{"prediction": "first"}], {"run": 1})
  assert records.write(str(tmp_path), [{"prediction": "first"}], {"run": 1}) is not None
  kept = records.write(str(tmp_path), [{"prediction": "third"}], {"run": 3})
  earlier = sorted((tmp_path / records.EARLIER).iterdir())
  assert len(earlier) == 2 and str(earlier[-1]) == kept  # same second: a -2 folder
  assert (earlier[0] / "results.jsonl").read_text() == '{"prediction": "first"}\n'
  assert (tmp_path / "results.jsonl").read_text() == '{"prediction": "third"}\n'
  assert records.write(str(tmp_path / "fresh"), [], {}) is None


def test_an_earlier_folder_that_is_a_link_is_refused_before_decoding(tmp_path):
  (tmp_path / "elsewhere").mkdir()
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / records.EARLIER).symlink_to(tmp_path / "elsewhere")
  with pytest.raises(ValueError, match="earlier is not a folder"):
    records.check_destinations(str(tmp_path / "out"))


def test_a_second_run_into_one_output_dir_says_it_kept_the_first(tmp_path, capsys):
  from specjax.app import run  # pylint: disable=import-outside-toplevel
  args = ["--gin_file=runs/random_tiny.gin", "--prompt", "Hello", "--gin.MAX_NEW_TOKENS=3",
          "--gin.GAMMA_POLICY='constant'", "--gin.TIMING_REPEATS=1", "--plain",
          f"--gin.INFER_OUTPUT_DIR='{tmp_path}'"]
  for _ in range(2):
    gin.clear_config()
    run(args)
  gin.clear_config()
  out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
  assert out.count("held an earlier run's results: kept them in") == 1, out[-600:]
  assert len(list((tmp_path / "earlier").iterdir())) == 1
  assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier", "results.jsonl",
                                                        "summary.json"]
