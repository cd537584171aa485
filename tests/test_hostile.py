"""Hostile inputs for the main job (docs/results/hostile_probe.md): every case here is
refused with a message naming it before any weights load (`load_params` fails the test if
reached), so nothing here compiles or decodes."""
import gin
import pytest

from specjax import app as main
from specjax.data import inputs as inputs_lib
from specjax.decode import inputs as decode_inputs
from specjax.app import run

TINY = "runs/random_tiny.gin"  # a random-init tiny T5 pair (no checkpoint needed)


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.fixture
def no_weights(monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError("weights were loaded or initialized before the check")
  monkeypatch.setattr("specjax.app.measure.load_params", fail)


def _run(tmp_path, *args, gin_file=TINY, prompt=("--prompt", "x")):
  return run([f"--gin_file={gin_file}", *prompt, f"--gin.OUTPUT_DIR='{tmp_path}/out'", *args])


@pytest.mark.parametrize("binding, error, message", [
    # The draft checkpoint was looked for only after the target's weights were read.
    ("--gin.DRAFT_CHECKPOINT='{tmp}/nope'", FileNotFoundError,
     "the draft checkpoint: checkpoint path does not exist: .*nope"),
    ("--gin.TARGET_CHECKPOINT=3", ValueError,
     "the target checkpoint must be a path .*got 3"),
    ("--gin.TARGET_CHECKPOINT=''", ValueError, "the target checkpoint must be a path .*got ''"),
    # Target and draft vocabularies differing were found by speculative_decode, after loading.
    ("--gin.draft/T5Config.vocab_size=9000", ValueError,
     r"target and draft vocab_size differ \(8192 vs 9000\)"),
    # A random init of 700 GiB of parameters ran into the allocator.
    ("--gin.target/T5Config.emb_dim=10000000", ValueError,
     r"float32 parameters \([\d.]+ GiB over 2 model\(s\)\) and KV caches .* would not fit"),
    ("--gin.OUTPUT_DIR=3", ValueError, "output_dir must be a folder path .*got 3"),
    ("--gin.decode_job.sampling=None", ValueError, "sampling must be a specjax Sampling, got None"),
    ("--gin.Sampling.temperature=None", ValueError, "temperature must be a finite number"),
    ("--gin.Sampling.temperature=1e999", ValueError, "temperature must be a finite number .*inf"),
    ("--gin.decode_job.lenience='0.5'", ValueError, "lenience must be a number in"),
    ("--gin.VERIFIER='fused'", ValueError, "verifier must be a specjax.verify verifier"),
    ("--gin.target/T5Config.logits_via_embedding='yes'", ValueError,
     "logits_via_embedding must be True or False"),
    # A list, dict, int or None where a name or a tuple belongs reached a TypeError.
    ("--gin.WEIGHTS_DTYPE=['bfloat16']", ValueError,
     r"weights_dtype must be one of \['bfloat16', 'float32'\], got \['bfloat16'\]"),
    ("--gin.DRAFT_WEIGHTS_DTYPE={{'int8':1}}", ValueError,
     r"draft_weights_dtype must be one of \[.*'int8', 'auto'\], got \{'int8': 1\}"),
    ("--gin.decode_job.drafter=['model']", ValueError, r"drafter must be one of \[.*'model'"),
    ("--gin.AUTO_BUCKETS=4", ValueError, "auto_buckets must be a tuple of increasing integers"),
    ("--gin.AUTO_BUCKETS=None", ValueError, "auto_buckets must be a tuple of increasing integer"),
    ("--gin.AUTO_BUCKETS={{1:2}}", ValueError, r"auto_buckets must be .*got \{1: 2\}"),
    ("--gin.decode_job.partitioner=4", ValueError, "partitioner must be a specjax.runtime.sharding"),
    # A feature head with a bogus attention_impl was not checked at all.
    ("--gin_file=runs/bundled_lm_eagle.gin --gin.draft/FeatureHeadConfig.attention_impl='bogus'",
     ValueError, r"FeatureHeadConfig.attention_impl must be one of \['cudnn', 'specjax', 'xla'\]"),
    # The feature drafter built a random head, then met None as the ranking's folder.
    ("--gin_file=runs/bundled_lm_eagle.gin --gin.DRAFT_CHECKPOINT=None", ValueError,
     "drafter 'feature' drafts with a trained feature head: DRAFT_CHECKPOINT must be its folder"),
    # The head's run with beam_speculative.gin ran without beam search, GAMMA silently 4.
    ("--gin_file=decoding/beam_speculative.gin", ValueError,
     r"the gin files configure speculative_beam_search \(decoding/beam\*.gin\), which the main "
     "job does not run"),
    # GAMMA 10000 passed every check, then the kernel's OOM killer ended the job (18.5 GB).
    ("--gin.GAMMA=10000 --gin.MAX_NEW_TOKENS=10000", ValueError,
     r"a chain round of γ = 10000 needs about [\d.]+ GiB .*: lower GAMMA \(and MAX_GAMMA\)"),
])
def test_bad_settings_are_named_before_weights_load(tmp_path, no_weights, binding, error,
                                                    message, monkeypatch):
  monkeypatch.setattr(decode_inputs, "device_memory", lambda partitioner=None: 16 * 2**30)
  with pytest.raises(error, match=message):
    _run(tmp_path, *binding.format(tmp=tmp_path).split())


def test_gamma_is_capped_at_the_budget(tmp_path, monkeypatch):
  # GAMMA 1000 with a 16-token budget drafted 1000 guesses a round.
  plans = []

  def stop(plan):
    plans.append(plan)
    raise KeyboardInterrupt
  monkeypatch.setattr("specjax.app.job.load", stop)
  with pytest.raises(KeyboardInterrupt):
    _run(tmp_path, "--gin.GAMMA=1000", "--gin.MAX_NEW_TOKENS=16")
  settings = plans[0].settings
  assert (settings.gamma, settings.max_gamma, plans[0].drafter.max_gamma) == (16, 16, 16)


def test_an_empty_prompt_of_a_decoder_only_model_is_named_before_loading(tmp_path, no_weights):
  with pytest.raises(ValueError, match=r"--prompt 2 is empty"):
    _run(tmp_path, gin_file="runs/bundled_lm.gin", prompt=("--prompt", "x", "--prompt", " "))


@pytest.mark.parametrize("content", [b"", b"\n  \n\t\r\n"])
def test_an_empty_input_file_is_an_error_not_the_default_task(tmp_path, no_weights, content):
  # random_tiny.gin binds DEFAULT_TASK: an empty --input_file silently decoded that task.
  path = tmp_path / "inputs.txt"
  path.write_bytes(content)
  with pytest.raises(ValueError, match="--input_file .*inputs.txt' holds no input: it is empty "
                                       "or only blank lines"):
    _run(tmp_path, prompt=("--input_file", str(path)))


def test_a_byte_order_mark_is_not_part_of_the_first_input(tmp_path):
  path = tmp_path / "inputs.txt"
  path.write_bytes("\ufeffHello\nWorld\n".encode("utf-8"))
  assert inputs_lib.read_input_file(str(path)) == ["Hello", "World"]


def test_a_folder_as_gin_file_is_named(tmp_path):
  with pytest.raises(IsADirectoryError, match="gin file '.*' is a folder, not a gin file"):
    run([f"--gin_file={tmp_path}", "--prompt", "x"])


def test_an_unknown_seqio_split_lists_the_splits(monkeypatch):
  # seqio's own KeyError said only 'nosplit'. A stand-in provider keeps tensorflow unimported.
  import sys
  import types

  class Provider:
    splits = ("train", "validation")
    output_features = {"inputs": None}

    def get_dataset(self, **kwargs):
      raise KeyError(kwargs["split"])
  fake = types.SimpleNamespace(get_mixture_or_task=lambda name: Provider())
  monkeypatch.setitem(sys.modules, "seqio", fake)
  with pytest.raises(ValueError, match=r"task 'my_task', split 'nosplit': no such split; its "
                                       r"splits are \['train', 'validation'\]"):
    inputs_lib.task_inputs("my_task:nosplit", 2)


def test_the_memory_check_counts_parameters_and_caches(monkeypatch):
  class Model:
    def param_shapes(self):
      import jax
      return {"w": jax.ShapeDtypeStruct((1000, 1000), "float32")}
  monkeypatch.setattr(decode_inputs, "device_memory", lambda partitioner=None: 8 * 10**6)
  assert decode_inputs.check_memory([Model()], 4 * 10**6) == 8 * 10**6  # exactly full: fits
  with pytest.raises(ValueError, match=r"\([\d.]+ GiB over 2 model\(s\)\) and KV caches "
                                       r"\(0.00 GiB\)"):
    decode_inputs.check_memory([Model(), Model()], 1)
