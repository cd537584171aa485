"""The main job end to end: gin parsing, checkpoints, both decoders, the report."""
import argparse
import dataclasses
import glob
import json
import logging
import os
import signal

import gin
import numpy as np
import pytest

from rich.console import Console

from specjax import app as main
from specjax.app import bundled, gin_config
from specjax.data import load_vocab
from specjax.checkpoints import load_t5x_for_model, save_t5x
from specjax.app import run

TINY = "runs/random_tiny.gin"  # a random-init tiny pair: checkpoints can be made from it


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_default_run_writes_outputs_and_is_greedy_identical(tmp_path):
  summary = run(["--prompt", "The package provides a library.", "--prompt", "Hello world",
                 "--gin.MAX_NEW_TOKENS=6", "--gin.BATCH_SIZE=2", "--plain",
                 f"--gin.OUTPUT_DIR='{tmp_path}'"])
  assert summary["greedy_identical"] is True
  assert summary["examples"] == 2 and summary["tokens_per_target_call"] >= 1.0
  lines = (tmp_path / "results.jsonl").read_text().splitlines()
  assert len(lines) == 2 and json.loads(lines[0])["input"] == "The package provides a library."
  assert json.loads((tmp_path / "summary.json").read_text())["gamma"] == 4
  # Each decode timed 3 times, interleaved: medians, and the per-pass ratios' range.
  assert summary["timing_repeats"] == 3
  if isinstance(summary["speedup"], str):  # every round at γ = 0: no speedup, and why
    assert summary["speedup"].startswith("n/a") and "speculation_off" in summary
  else:
    low, high = map(float, summary["speedup_range"].split("-"))
    assert low <= round(summary["speedup"], 2) <= high


def test_checkpoints_round_trip_through_the_job(tmp_path, tiny_t5_pair):
  # The shared tiny pair is the random-init pair of TINY (seed 0 for the target).
  target, params = tiny_t5_pair.target, tiny_t5_pair.target_params
  save_t5x(params, str(tmp_path / "target"), step=3, dtype="float32")
  loaded = load_t5x_for_model(str(tmp_path / "target"), target)
  inputs = np.array([[5, 6, 7, 1]], np.int32)
  decoder_in = np.array([[0, 9, 10]], np.int32)
  np.testing.assert_allclose(target.logits(loaded, inputs, decoder_in),
                             target.logits(params, inputs, decoder_in), atol=1e-6)
  gin.clear_config()
  # The same weights from the checkpoint give the random-init run's outputs (seed 0).
  common = [f"--gin_file={TINY}", "--prompt", "Hello world", "--gin.MAX_NEW_TOKENS=5", "--plain",
            "--gin.BATCH_SIZE=1", "--gin.GAMMA_POLICY='constant'",  # 'auto': test_main_auto
            f"--gin.OUTPUT_DIR='{tmp_path / 'a'}'"]
  run(common)
  gin.clear_config()
  run(common[:-1] + [f"--gin.OUTPUT_DIR='{tmp_path / 'b'}'",
                     f"--gin.TARGET_CHECKPOINT='{tmp_path / 'target'}'"])
  a = json.loads((tmp_path / "a" / "results.jsonl").read_text())
  b = json.loads((tmp_path / "b" / "results.jsonl").read_text())
  assert a["autoregressive"] == b["autoregressive"]


def test_required_macros_and_bad_checkpoint_are_named(tmp_path, tiny_t5_pair):
  with pytest.raises(ValueError, match="TARGET_MODEL"):
    run(["--gin_file=runs/decode.gin", "--prompt", "x"])
  gin.clear_config()
  with pytest.raises(FileNotFoundError, match="checkpoint path does not exist: .*nothing"):
    run(["--prompt", "x", f"--gin.TARGET_CHECKPOINT='{tmp_path / 'nothing'}'"])
  gin.clear_config()
  # A checkpoint whose shapes do not match the model config names the parameter.
  save_t5x(tiny_t5_pair.draft_params, str(tmp_path / "draft"), dtype="float32")
  with pytest.raises(ValueError, match="missing parameter|unexpected parameter|has shape"):
    run([f"--gin_file={TINY}", "--prompt", "x",
         f"--gin.TARGET_CHECKPOINT='{tmp_path / 'draft'}'"])


def test_split_gin_args():
  files, bindings, paths, rest = gin_config.split_gin_args(
      ["--gin_file=a.gin", "--gin_file", "b.gin", "--gin.X=1", "--prompt", "hi",
       "--gin_search_paths=/x,/y"])
  assert files == ["a.gin", "b.gin"] and bindings == ["X=1"] and paths == ["/x", "/y"]
  assert rest == ["--prompt", "hi"]


def test_inputs_from_a_seqio_task_split(tmp_path):
  summary = run(["--task", "specjax_translate_en_de:validation", "--num_examples", "2",
                 "--gin.MAX_NEW_TOKENS=3", "--plain", "--gin.GAMMA_POLICY='constant'",
                 f"--gin.OUTPUT_DIR='{tmp_path}'"])
  from specjax.data import load_bundled
  first = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[0])
  assert first["input"] == load_bundled("translate_en_de")[0][0]
  assert summary["examples"] == 2


def test_bfloat16_target_and_int8_draft_run_through_the_job(tmp_path):
  summary = run([f"--gin_file={TINY}", "--prompt", "Hello world", "--prompt", "A b c d",
                 "--gin.MAX_NEW_TOKENS=5", "--plain", "--gin.BATCH_SIZE=2",
                 "--gin.WEIGHTS_DTYPE='bfloat16'", "--gin.DRAFT_WEIGHTS_DTYPE='int8'",
                 f"--gin.OUTPUT_DIR='{tmp_path}'"])
  assert summary["weights_dtype"] == "bfloat16" and summary["greedy_identical"] is True
  assert summary["draft_weights_dtype"] == "int8"


# ------------------------------------------------- settings checked up front


def _no_models(monkeypatch):
  """Makes building or loading any model fail: a check that fires first never gets there."""
  def fail(*args, **kwargs):
    raise AssertionError("a model was built or loaded before the settings were checked")
  monkeypatch.setattr(main, "build_model", fail)


@pytest.mark.parametrize("bindings,message", [
    (["--gin.decode_job.max_gamma=4", "--gin.GAMMA=5"], r"gamma must be in \[1, max_gamma=4\]"),
    (["--gin.GAMMA=0"], "gamma must be an integer >= 1, got 0"),
    (["--gin.GAMMA=2.5"], "gamma must be an integer >= 1, got 2.5"),
    (["--gin.BATCH_SIZE=0"], "batch_size must be an integer >= 1, got 0"),
    (["--gin.MAX_NEW_TOKENS=True"], "max_new_tokens must be an integer >= 1, got True"),
    (["--gin.TIMING_REPEATS=0"], "timing_repeats must be an integer >= 1, got 0"),
    (["--gin.WEIGHTS_DTYPE='float16'"], "weights_dtype must be one of .*got 'float16'"),
    (["--gin.DRAFT_WEIGHTS_DTYPE='float16'"], "draft_weights_dtype must be one of .*'int8'"),
    (["--gin.WEIGHTS_DTYPE='int8'"], "weights_dtype 'int8' is for drafts only"),
])
def test_settings_are_checked_before_any_model_loads(monkeypatch, tmp_path, bindings, message):
  _no_models(monkeypatch)
  with pytest.raises(ValueError, match=message):
    run([f"--gin_file={TINY}", "--prompt", "x", f"--gin.OUTPUT_DIR='{tmp_path}'", *bindings])


def test_unwritable_output_dir_is_found_before_decoding(monkeypatch, tmp_path):
  _no_models(monkeypatch)
  (tmp_path / "a_file").write_text("x")
  with pytest.raises(ValueError, match="output_dir '.*a_file/out' is not writable"):
    run([f"--gin_file={TINY}", "--prompt", "x", f"--gin.OUTPUT_DIR='{tmp_path}/a_file/out'"])


def test_a_cache_beyond_memory_is_refused_before_loading_weights(monkeypatch, tmp_path):
  def fail(*args, **kwargs):
    raise AssertionError("weights were loaded before the cache size was checked")
  monkeypatch.setattr("specjax.app.measure.load_params", fail)
  monkeypatch.setattr(main, "load_model", fail)
  with pytest.raises(ValueError, match=r"KV caches would take [\d.]+ GiB .* above the limit"):
    run([f"--gin_file={TINY}", "--prompt", "x", f"--gin.OUTPUT_DIR='{tmp_path}'",
         f"--gin.MAX_NEW_TOKENS={10**9}"])


def test_non_utf8_input_file_names_the_file_and_byte(monkeypatch, tmp_path):
  _no_models(monkeypatch)
  path = tmp_path / "inputs.txt"
  path.write_bytes(b"fine\n\xffbad\n")
  with pytest.raises(ValueError, match=r"inputs\.txt' is not UTF-8: byte 5"):
    run([f"--gin_file={TINY}", "--input_file", str(path)])


def test_input_file_lines_are_read(tmp_path):
  path = tmp_path / "inputs.txt"
  path.write_bytes("één\r\n\nzwei\n".encode("utf-8"))
  args = argparse.Namespace(prompt=None, input_file=str(path), task=None)
  assert main.read_texts(args) == ["één", "zwei"]


@pytest.mark.parametrize("flag", ["--num_examples", "--prompt_words"])
def test_non_positive_counts_are_refused(monkeypatch, capsys, flag):
  _no_models(monkeypatch)
  with pytest.raises(SystemExit):
    run([f"--gin_file={TINY}", "--task", "translate_en_de", flag, "-1"])
  assert f"{flag} must be >= 1, got -1" in capsys.readouterr().err


def test_overlong_inputs_are_cut_with_a_warning(caplog):
  vocab = load_vocab()
  long_text = "the house is wonderful and the garden is green " * 3
  n = len(vocab.encode(long_text))
  with caplog.at_level(logging.WARNING):
    out = main.encode_inputs(vocab, ["short", long_text], True, 6)
  assert out.shape == (2, 6) and out[1, -1] == vocab.eos_id
  assert out[1, :5].tolist() == vocab.encode(long_text)[:5]
  assert (f"input 1 has {n} tokens, more than max_input_len=6: keeping its first 5 tokens + EOS"
          in caplog.text)
  assert "input 0" not in caplog.text


@pytest.mark.parametrize("include", [False, True])
def test_gin_syntax_errors_name_the_file(tmp_path, include):
  bad = tmp_path / "bad.gin"
  bad.write_text("GAMMA = 3\ndecode_job.gamma = (\n")
  top = bad
  if include:
    top = tmp_path / "top.gin"
    top.write_text(f"include '{bad}'\n")
  with pytest.raises(ValueError, match=r"gin syntax error in '.*bad\.gin' \('\(' opened on "
                                       r"line 2 is never closed\)"):
    run([f"--gin_file={top}", "--prompt", "x"])


def test_gin_syntax_error_in_a_binding_is_named():
  with pytest.raises(ValueError, match=r"gin syntax error in --gin\.GAMMA=\(3"):
    run([f"--gin_file={TINY}", "--prompt", "x", "--gin.GAMMA=(3"])


def test_misspelled_macro_binding_is_one_line_naming_the_closest_macro():
  with pytest.raises(ValueError, match=r"^--gin\.GAMA: no binding reads the macro GAMA; "
                                       r"did you mean GAMMA\?$"):
    gin_config.parse([TINY], ["GAMA=3", "GAMMA=2", "DEFAULT_TASK='x'"])
  assert gin_config.unread_macros(["GAMA=3", "GAMMA=2", "DEFAULT_TASK='x'",
                                   "decode_job.seed=1"]) == ["GAMA"]


def test_ctrl_c_between_batches_stops_the_job(tmp_path):
  # The settings and input of test_checkpoints_round_trip_through_the_job: its compiled loops
  # are reused (same models, shapes and config), so this test compiles nothing new.
  gin_config.parse([TINY], ["MAX_NEW_TOKENS=5", "BATCH_SIZE=1", f"OUTPUT_DIR='{tmp_path}'"])
  calls = []

  def ctrl_c(done, total):  # a real SIGINT, delivered between two compiled calls
    calls.append((done, total))
    signal.raise_signal(signal.SIGINT)

  console = Console(record=True, width=200)
  # Python's own SIGINT handler, whatever an earlier test of this process left installed.
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with pytest.raises(KeyboardInterrupt):
      gin.get_configurable(main.decode_job)(["Hello world"] * 3, console=console,
                                            on_batch=ctrl_c)
  finally:
    signal.signal(signal.SIGINT, previous)
  assert calls == [(1, 3)]  # the second batch never started
  assert "interrupted after 1 of 3 examples" in console.export_text()
  assert not (tmp_path / "results.jsonl").exists()


# ----------------------------------------------------------------------------
# A model folder's model.gin is untrusted: read with a restricted parser

TINY_LM = """# DecoderOnlyConfig of the checkpoints in this folder (written by specjax.train).
DecoderOnlyConfig.vocab_size = 8192
DecoderOnlyConfig.emb_dim = 16
DecoderOnlyConfig.num_heads = 2
DecoderOnlyConfig.num_layers = 1
DecoderOnlyConfig.head_dim = 8
DecoderOnlyConfig.mlp_dim = 32
"""


def _model_dir(tmp_path, text):
  folder = tmp_path / "model"
  folder.mkdir(exist_ok=True)
  (folder / "model.gin").write_text(text)
  return folder / "model.gin"


def test_model_gin_imports_are_skipped_never_run(tmp_path, monkeypatch):
  """T5X's model gin files open with imports: they are read past, never imported, and
  neither is a configurable they name called."""
  marker = tmp_path / "imported"
  (tmp_path / "evil_gin_payload.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                                "def run():\n  open('CALLED', 'w')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  path = _model_dir(tmp_path, "import evil_gin_payload\nfrom evil_gin_payload import run\n"
                    "PAYLOAD = @evil_gin_payload.run()\nevil_gin_payload.Thing.x = %PAYLOAD\n"
                    + TINY_LM)
  gin_config.parse([], [f"TARGET_MODEL='{path}'"])
  assert gin_config.model_config("target").emb_dim == 16
  assert not marker.exists() and not (tmp_path / "CALLED").exists()
  note = gin_config.model_notes()[0]
  assert "2 import(s)" in note and "PAYLOAD" in note and "evil_gin_payload.Thing" in note


REFUSED = ["import os; os.system('touch /tmp/x')", "os.system('touch /tmp/x')",
           "DecoderOnlyConfig.dtype = @os.system()", "DecoderOnlyConfig.dtype = @DecodeConfig()",
           "DecoderOnlyConfig.dtype = %DTYPE", "target/DecoderOnlyConfig.emb_dim = 8",
           "DecoderOnlyConfig.emb_dim = __import__('os').getpid()",
           "DecoderOnlyConfig.emb_dim = 8; import os", "DecodeConfig.max_gamma = print('x')"]
SKIPPED = ["from __gin__ import dynamic_registration", "import os",
           "os.system.command = 'touch /tmp/x'", "DecodeConfig.max_gamma = 3", "DTYPE = 'float32'"]


@pytest.mark.parametrize("line", REFUSED + SKIPPED)
def test_model_gin_accepts_only_literal_model_bindings_and_skips_the_rest(tmp_path, line):
  """Refused: what is not gin, references or unbound macros in a model field, scoped model
  bindings. Skipped (and said in the log): imports, macros and other configurables."""
  path = _model_dir(tmp_path, TINY_LM + line + "\n")
  if line in REFUSED:
    with pytest.raises(ValueError, match="model.gin:8: .*(not allowed in a model gin file|must "
                       "be a literal|no model gin file binds the macro DTYPE)"):
      gin_config.parse([], [f"TARGET_MODEL='{path}'"])
    return
  gin_config.parse([], [f"TARGET_MODEL='{path}'"])
  assert gin_config.model_config("target").emb_dim == 16
  assert gin_config.model_notes()  # said in the log


@pytest.mark.parametrize("text, message", [
    (TINY_LM + "DecoderOnlyConfig.no_such_field = 1\n", "has no field 'no_such_field'"),
    (TINY_LM + "T5Config.emb_dim = 8\n", "binds T5Config in a file that binds"),
    ("# nothing bound\n", "binds none of T5Config, DecoderOnlyConfig, FeatureHeadConfig"),
    (TINY_LM + "DecoderOnlyConfig.emb_dim = %gin.REQUIRED\n", "emb_dim is %gin.REQUIRED"),
    (TINY_LM + "DecoderOnlyConfig:\nDecoderOnlyConfig.emb_dim = 8\n", "with no indented"),
    (TINY_LM + "DecoderOnlyConfig:\n  include 'x.gin'\n", "is not 'field = value'"),
    (TINY_LM + "DecoderOnlyConfig.mlp_activations = {1, 2}\n", "must be a literal .*a set is not"),
    (TINY_LM + "DecoderOnlyConfig.emb_dim = (8,\n", "model.gin:8: .*a bracket opened on line 8 "
     "that is never closed"),
])
def test_model_gin_errors_are_clear(tmp_path, text, message):
  with pytest.raises(ValueError, match=message):
    gin_config.read_model_file(str(_model_dir(tmp_path, text)))


def test_model_gin_include_cycle_is_refused(tmp_path):
  (tmp_path / "a.gin").write_text("include 'b.gin'\n")
  (tmp_path / "b.gin").write_text("include 'a.gin'\n")
  with pytest.raises(ValueError, match="include cycle"):
    gin_config.read_model_file("a.gin", [str(tmp_path)])


def test_model_gin_of_a_folder_drives_the_job(tmp_path):
  text = TINY_LM + "DecoderOnlyConfig.mlp_activations = (  # gated\n    'gelu',\n    'linear')\n"
  path = _model_dir(tmp_path, text)
  gin_config.parse([], [f"TARGET_MODEL='{path}'", "target/DecoderOnlyConfig.num_heads = 4"])
  config = gin_config.model_config("target")
  assert (config.emb_dim, config.num_heads, config.mlp_activations) == (16, 4, ("gelu", "linear"))


def _gin_model_files():
  files = sorted(glob.glob(os.path.join(gin_config.GIN_DIR, "models", "*.gin")))
  return files + [str(bundled.model_dir(p, r) / "model.gin") for p in bundled.PAIRS
                  for r in bundled.ROLES if bundled.available(p, r)]


@pytest.mark.parametrize("path", _gin_model_files(), ids=os.path.basename)
def test_shipped_model_files_read_as_gin_reads_them(path):
  """The restricted parser gives what gin itself gives for every shipped model file."""
  config = gin_config.model_config_from_file(path)
  gin.add_config_file_search_path(str(gin_config.GIN_DIR))
  gin.parse_config_file(path)
  assert config == gin.get_configurable(type(config).__name__)()
  assert dataclasses.is_dataclass(config)


def test_read_model_gin_of_a_folder_uses_the_restricted_parser(tmp_path):
  """What distill, bundled and training read: the same parser, includes found beside the file."""
  from specjax.models import read_model_gin  # pylint: disable=import-outside-toplevel
  path = _model_dir(tmp_path, "include 'base.gin'\nDecoderOnlyConfig.num_heads = 4\n")
  (path.parent / "base.gin").write_text(TINY_LM)
  config = read_model_gin(str(path.parent))
  assert (config.emb_dim, config.num_heads) == (16, 4)
  path.write_text(TINY_LM + "os.system('x')\n")
  with pytest.raises(ValueError, match="model.gin:8: this line is not allowed"):
    read_model_gin(str(path.parent))


def test_the_shared_tiny_pair_is_the_random_tiny_run(tiny_t5_pair):
  from specjax.testing import tiny_pair  # pylint: disable=import-outside-toplevel
  assert tiny_pair("t5") is tiny_t5_pair  # built once per process
  gin_config.parse([TINY], [])
  assert gin_config.model_config("target") == tiny_t5_pair.target.config
  assert gin_config.model_config("draft") == tiny_t5_pair.draft.config
  with pytest.raises(ValueError, match="family must be one of"):
    tiny_pair("gpt")


def test_job_settings_are_one_frozen_typed_object():
  from specjax.app.settings import JobSettings  # pylint: disable=import-outside-toplevel
  from specjax.decode import DecodeConfig  # pylint: disable=import-outside-toplevel
  names = {f.name for f in dataclasses.fields(JobSettings)}
  # Sampling, lenience, verifier and γ policy live in the DecodeConfig alone.
  assert not names & {"sampling", "temperature", "lenience", "verifier", "gamma_policy"}
  settings = JobSettings(
      decoding=DecodeConfig(), drafter="model", drafter_options={}, gamma=2, max_gamma=4,
      tree=None, max_new_tokens=8, ignore_eos=False, batch_size=1, max_input_len=16, seed=0,
      target_checkpoint=None, draft_checkpoint=None, weights_dtype="float32",
      draft_weights_dtype="float32", partitioner=None, vocabulary=None, draft_vocabulary=None,
      task_vocabulary=None, cost_table=None, output_dir=None, timing_repeats=1,
      write_scores=False, plain=True)
  assert settings.gamma == 2 and settings.drafter_class == "model"
  with pytest.raises(dataclasses.FrozenInstanceError):
    settings.gamma = 3
  with pytest.raises(ValueError, match=r"gamma must be in \[1, max_gamma=1\]"):
    dataclasses.replace(settings, max_gamma=1)
  with pytest.raises(ValueError, match="ignore_eos must be True or False, got 'yes'"):
    dataclasses.replace(settings, ignore_eos="yes")
