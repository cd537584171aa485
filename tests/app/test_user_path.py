"""The T5X user's path end to end: own checkpoints, own vocabulary, gin only.

A tiny SentencePiece model (300 pieces, trained here from the repo's text: not the bundled
8k one) and T5X-layout checkpoints (legacy and Orbax) of a small encoder-decoder pair and a
small decoder-only prefix-LM pair are written to a temporary folder; the main job then
decodes them through gin files and --gin bindings only (`specjax.main.cli`, in-process):
--prompt, --input_file and a seqio task registered by a user module. Checked: the input
tokens are the user's vocabulary's (T5X's framing: EOS, and BOS for the decoder-only
model), the JSONL fields (T5X infer.py's and specjax's), the decoded text, greedy identity
and the tokens of a greedy loop over teacher-forced `logits()`, the scores; and that user
errors end in one line with exit status 2.
"""
import json
import subprocess
import sys
from pathlib import Path

import gin
import jax
import numpy as np
import pytest
import sentencepiece as spm

from specjax import app as main
from specjax.app import gin_config
from specjax.checkpoints import save_t5x
from specjax.data import BUNDLED_VOCABULARY, load_bundled, resolve_vocabulary, vocab as vocab_lib
from specjax.data import vocabulary_difference
from specjax.models import build_model

REPO = Path(__file__).resolve().parents[2]
PIECES, EXTRA_IDS = 300, 20  # the seqio vocabulary has 320 ids; the T5 models' logits 384
LENGTHS = "{'inputs': 16, 'targets': 6}"  # TASK_FEATURE_LENGTHS of every run (one compile each)
TASK_MODULE = "specjax_user_path_tasks"
PROMPT = "The package provides a library."

T5_MODEL = """include 'models/t5_1_1_base.gin'
T5Config.vocab_size = 384
T5Config.emb_dim = 32
T5Config.num_heads = 2
T5Config.num_encoder_layers = {layers}
T5Config.num_decoder_layers = {layers}
T5Config.head_dim = 16
T5Config.mlp_dim = 64
"""
LM_MODEL = """include 'models/decoder_only_base.gin'
DecoderOnlyConfig.vocab_size = 320
DecoderOnlyConfig.emb_dim = 32
DecoderOnlyConfig.num_heads = 2
DecoderOnlyConfig.num_layers = {layers}
DecoderOnlyConfig.head_dim = 16
DecoderOnlyConfig.mlp_dim = 64
DecoderOnlyConfig.logits_via_embedding = False
DecoderOnlyConfig.inputs_bidirectional_attention = True
"""
T5_RUN = """from __gin__ import dynamic_registration
import seqio

include 'runs/decode.gin'
TARGET_MODEL = '{d}/t5_target.gin'
DRAFT_MODEL = '{d}/t5_draft.gin'
TARGET_CHECKPOINT = '{d}/ckpt/t5_target'
DRAFT_CHECKPOINT = '{d}/ckpt/t5_draft'
VOCABULARY = @seqio.SentencePieceVocabulary()
seqio.SentencePieceVocabulary.sentencepiece_model_file = '{spm}'
seqio.SentencePieceVocabulary.extra_ids = {extra}
TASK_FEATURE_LENGTHS = {lengths}
GAMMA = 3
BATCH_SIZE = 2
"""
LM_RUN = """include 'runs/decode.gin'
TARGET_MODEL = '{d}/lm_target.gin'
DRAFT_MODEL = '{d}/lm_draft.gin'
TARGET_CHECKPOINT = '{d}/ckpt/lm_target'
DRAFT_CHECKPOINT = '{d}/ckpt/lm_draft'
VOCABULARY = '{spm}'
TASK_FEATURE_LENGTHS = {lengths}
WRITE_SCORES = True
GAMMA = 3
BATCH_SIZE = 2
"""
TASKS = """import seqio
from specjax.data.tasks import parse_tsv

VOCABULARY = seqio.SentencePieceVocabulary({spm!r}, extra_ids={extra})
seqio.TaskRegistry.remove("user_translate")
seqio.TaskRegistry.add(
    "user_translate", source=seqio.TextLineDataSource({{"validation": {tsv!r}}}),
    preprocessors=[parse_tsv, seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
    output_features={{"inputs": seqio.Feature(VOCABULARY), "targets": seqio.Feature(VOCABULARY)}})
"""


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _save_orbax(params, path):
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  state = {"version": 3, "optimizer": {"target": jax.tree.map(np.asarray, params),
                                       "state": {"step": np.int32(1)}}}
  ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True)).save(
      str(Path(path) / "checkpoint_1" / "state"), state)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """The user's folder: vocabulary, model gin files, checkpoints, run files, task module."""
  d = tmp_path_factory.mktemp("user")
  pairs = load_bundled("translate_en_de")
  lines = [s for s, _ in pairs] + [t for _, t in pairs]
  lines += (REPO / "README.md").read_text(encoding="utf-8").splitlines()
  model_file = vocab_lib.train_vocab(lines, d, vocab_size=PIECES, model_name="user")
  fmt = dict(d=d, spm=model_file, extra=EXTRA_IDS, lengths=LENGTHS)
  for name, text in (("t5_target", T5_MODEL.format(layers=2)),
                     ("t5_draft", T5_MODEL.format(layers=1)),
                     ("lm_target", LM_MODEL.format(layers=2)),
                     ("lm_draft", LM_MODEL.format(layers=1)),
                     ("t5_run", T5_RUN.format(**fmt)), ("lm_run", LM_RUN.format(**fmt))):
    (d / f"{name}.gin").write_text(text)
  (d / "validation.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs[:3]))
  (d / f"{TASK_MODULE}.py").write_text(TASKS.format(spm=str(model_file), extra=EXTRA_IDS,
                                                     tsv=str(d / "validation.tsv")))
  (d / "inputs.txt").write_text(f"Hello world\n\n{pairs[5][0]}\n")
  models, params = {}, {}
  for family in ("t5", "lm"):
    gin_config.parse([str(d / f"{family}_run.gin")], [])
    for seed, role in enumerate(("target", "draft")):
      models[family, role] = build_model(gin_config.model_config(role))
      params[family, role] = models[family, role].init(jax.random.PRNGKey(seed))
    gin.clear_config()
  # T5X's two layouts: the legacy msgpack + zarr one and Orbax, one of each per pair.
  save_t5x(params["t5", "target"], str(d / "ckpt" / "t5_target"), step=1, dtype="float32")
  _save_orbax(params["t5", "draft"], d / "ckpt" / "t5_draft")
  _save_orbax(params["lm", "target"], d / "ckpt" / "lm_target")
  save_t5x(params["lm", "draft"], str(d / "ckpt" / "lm_draft"), step=1, dtype="float32")
  sp = spm.SentencePieceProcessor(model_file=str(model_file))
  return dict(dir=d, spm=model_file, sp=sp, models=models, params=params)


def _run(world, name, out, *args):
  """`specjax --gin_file=<name>.gin --gin.OUTPUT_DIR=out ARGS` in-process; its records."""
  # A fixed γ: the 'auto' policy's calibration and compiles are tested in test_main_auto.py.
  code = main.cli([f"--gin_file={world['dir'] / (name + '.gin')}", "--plain",
                   "--gin.GAMMA_POLICY='constant'", f"--gin.OUTPUT_DIR='{out}'", *args])
  assert code == 0
  records = [json.loads(l) for l in (out / "results.jsonl").read_text().splitlines()]
  return records, json.loads((out / "summary.json").read_text())


def _seqio_vocab(world):
  import seqio  # pylint: disable=import-outside-toplevel
  return seqio.SentencePieceVocabulary(str(world["spm"]), extra_ids=EXTRA_IDS)


def _greedy_t5(model, params, input_tokens, steps=6):
  """Greedy tokens from teacher-forced logits (decoder input: 0, then the tokens so far)."""
  inputs, out = np.array([input_tokens], np.int32), []
  for _ in range(steps):
    dec = np.zeros((1, steps), np.int32)
    dec[0, 1:len(out) + 1] = out[:steps - 1]
    token = int(np.argmax(np.asarray(model.logits(params, inputs, dec))[0, len(out)]))
    out.append(token)
    if token == 1:
      break
  return out


def _lm_logits(model, params, prompt, generated, width=24):
  seq = np.zeros((1, width), np.int32)
  seq[0, :len(prompt) + len(generated)] = list(prompt) + list(generated)
  return np.asarray(model.logits(params, seq, np.array([len(prompt)], np.int32)))[0]


def _greedy_lm(model, params, prompt, steps=6):
  """Greedy tokens of a prefix LM from teacher-forced logits over [BOS, inputs, ...]."""
  out = []
  for _ in range(steps):
    token = int(np.argmax(_lm_logits(model, params, prompt, out)[len(prompt) + len(out) - 1]))
    out.append(token)
    if token == 1:
      break
  return out


def _check_record(rec, text, input_tokens, vocabulary):
  assert rec["inputs"]["inputs_pretokenized"] == rec["input"] == text
  assert rec["input_tokens"] == input_tokens
  assert rec["prediction_tokens"] == rec["autoregressive_tokens"]  # greedy identity
  assert rec["prediction"] == rec["speculative"] == vocabulary.decode(rec["prediction_tokens"])
  assert rec["autoregressive"] == rec["prediction"]
  assert 1 <= len(rec["prediction_tokens"]) <= 6 and rec["target_calls"] >= 1


def test_the_users_vocabulary_is_not_the_bundled_one(world, tmp_path):
  user = resolve_vocabulary(str(world["spm"]))
  assert user.vocab_size == PIECES
  assert vocabulary_difference(user, resolve_vocabulary(BUNDLED_VOCABULARY)) == \
      f"{PIECES} ids vs 8192 ids"
  copy = tmp_path / "copy.model"
  copy.write_bytes(world["spm"].read_bytes())
  assert vocabulary_difference(user, resolve_vocabulary(str(copy))) is None
  # The same size with one piece changed is another vocabulary.
  from sentencepiece import sentencepiece_model_pb2 as pb2  # pylint: disable=import-outside-toplevel
  proto = pb2.ModelProto.FromString(world["spm"].read_bytes())
  proto.pieces[100].piece = "▁zzzz"
  (tmp_path / "other.model").write_bytes(proto.SerializeToString())
  assert "id 100 is" in vocabulary_difference(user, resolve_vocabulary(
      str(tmp_path / "other.model")))
  # A plain path with extra ids (specjax's Vocab) is seqio's vocabulary, piece for piece.
  with_extra = resolve_vocabulary(vocab_lib.Vocab(world["spm"], extra_ids=EXTRA_IDS))
  assert vocabulary_difference(with_extra, resolve_vocabulary(_seqio_vocab(world))) is None


def test_encoder_decoder_prompt_and_input_file(world, tmp_path, caplog):
  records, summary = _run(world, "t5_run", tmp_path, "--prompt", PROMPT,
                          "--input_file", str(world["dir"] / "inputs.txt"))
  assert summary["greedy_identical"] is True and summary["examples"] == 3
  sp, vocabulary = world["sp"], _seqio_vocab(world)
  texts = [PROMPT, "Hello world", load_bundled("translate_en_de")[5][0]]
  long_ids = sp.encode(texts[2])
  assert len(long_ids) > 15  # cut to TASK_FEATURE_LENGTHS['inputs'] - 1 tokens + EOS
  assert "input 2 has" in caplog.text
  for rec, text in zip(records, texts):
    _check_record(rec, text, sp.encode(text)[:15] + [1], vocabulary)
    model, params = world["models"]["t5", "target"], world["params"]["t5", "target"]
    assert rec["prediction_tokens"] == _greedy_t5(model, params, rec["input_tokens"])
  assert "score" not in records[0]


def test_encoder_decoder_registered_seqio_task(world, tmp_path, monkeypatch):
  monkeypatch.syspath_prepend(str(world["dir"]))
  records, summary = _run(world, "t5_run", tmp_path, "--num_examples", "2",
                          "--gin.MIXTURE_OR_TASK_NAME='user_translate:validation'",
                          f"--gin.MIXTURE_OR_TASK_MODULE='{TASK_MODULE}'")
  assert summary["greedy_identical"] is True and len(records) == 2
  vocabulary = _seqio_vocab(world)
  for rec, (src, tgt) in zip(records, load_bundled("translate_en_de")):
    # The task's own preprocessing: its tokens + EOS, trimmed by seqio to 16.
    _check_record(rec, src, (vocabulary.encode(src) + [1])[:16], vocabulary)
    assert rec["inputs"]["targets_pretokenized"] == tgt


def test_decoder_only_t5x_convention_with_a_plain_vocabulary_path(world, tmp_path):
  records, summary = _run(world, "lm_run", tmp_path, "--prompt", PROMPT,
                          "--input_file", str(world["dir"] / "inputs.txt"))
  assert summary["greedy_identical"] is True and len(records) == 3
  sp, vocabulary = world["sp"], resolve_vocabulary(str(world["spm"]))
  model, params = world["models"]["lm", "target"], world["params"]["lm", "target"]
  for rec in records:
    # T5X's DecoderOnlyModel: BOS 0, then the inputs (the text's tokens + EOS).
    _check_record(rec, rec["input"], [0] + sp.encode(rec["input"])[:15] + [1], vocabulary)
    assert rec["prediction_tokens"] == _greedy_lm(model, params, rec["input_tokens"])
    logits = _lm_logits(model, params, rec["input_tokens"], rec["prediction_tokens"])
    start = len(rec["input_tokens"]) - 1
    log_p = jax.nn.log_softmax(logits[start:start + len(rec["prediction_tokens"])])
    want = sum(float(log_p[j, t]) for j, t in enumerate(rec["prediction_tokens"]))
    assert rec["score"] == pytest.approx(want, rel=1e-4, abs=1e-4)


def test_decoder_only_task_with_specjax_vocab_and_extra_ids(world, tmp_path, monkeypatch):
  monkeypatch.syspath_prepend(str(world["dir"]))
  records, _ = _run(world, "lm_run", tmp_path, "--task", "user_translate", "--num_examples", "2",
                    f"--gin.MIXTURE_OR_TASK_MODULE='{TASK_MODULE}'", "--gin.VOCABULARY=@Vocab()",
                    f"--gin.Vocab.model_path='{world['spm']}'", f"--gin.Vocab.extra_ids={EXTRA_IDS}")
  vocabulary = _seqio_vocab(world)
  model, params = world["models"]["lm", "target"], world["params"]["lm", "target"]
  for rec, (src, _) in zip(records, load_bundled("translate_en_de")):
    _check_record(rec, src, [0] + (vocabulary.encode(src) + [1])[:16], vocabulary)
    assert rec["prediction_tokens"] == _greedy_lm(model, params, rec["input_tokens"])


@pytest.mark.parametrize("name,args,message", [
    ("lm_run", ["--gin.VOCABULARY='/no/such/spm.model'"], "SentencePiece model not found"),
    ("lm_run", ["--gin.DRAFT_VOCABULARY='bundled:specjax_8k'"],
     "vocabulary mismatch: DRAFT_VOCABULARY .* differs .*: 300 ids vs 8192 ids"),
    ("lm_run", ["--task", "user_translate"],
     r"vocabulary mismatch: the task's vocabulary .* 300 ids vs 320 ids"),
    ("lm_run", ["--gin.target/DecoderOnlyConfig.vocab_size=256"],
     "the target model's vocab_size 256 is smaller than the vocabulary's 300 ids"),
    ("lm_run", ["--gin.VOCABULARY=None"], "no vocabulary: bind VOCABULARY"),
    ("lm_run", ["--gin.GAMMA=0"], "gamma must be an integer >= 1, got 0"),
    ("lm_run", ["--gin.decode_job.no_such_setting=1"], "no_such_setting"),
    ("missing", [], "gin file '.*missing.gin' not found"),
    ("lm_run", ["--task", "no_such_task"], "unknown task 'no_such_task'"),
])
def test_user_errors_are_one_line_with_status_2(world, capsys, monkeypatch, name, args, message):
  monkeypatch.syspath_prepend(str(world["dir"]))
  monkeypatch.setattr("specjax.app.measure.load_params",
                      lambda *a, **k: pytest.fail("weights were loaded"))
  argv = [f"--gin_file={world['dir'] / (name + '.gin')}", "--prompt", "x",
          f"--gin.MIXTURE_OR_TASK_MODULE='{TASK_MODULE}'", *args]
  assert main.cli(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("specjax: error: "), err
  import re  # pylint: disable=import-outside-toplevel
  assert re.search(message, err[0]), err[0]
  gin.clear_config()
  assert main.cli(argv + ["--verbose"]) == 2
  assert "Traceback" in capsys.readouterr().err


def test_help_lists_the_flags_and_the_bundled_gin_files(capsys):
  with pytest.raises(SystemExit) as exit_info:
    main.cli(["--help"])
  assert exit_info.value.code == 0
  out = capsys.readouterr().out
  for flag in ("--prompt", "--input_file", "--task", "--verbose", "--gin_file", "--gin.NAME"):
    assert flag in out
  for name in ("runs/decode.gin", "runs/default.gin", "t5_1_1_xxl.gin", "decoder_only_small.gin",
               "greedy.gin", "VOCABULARY", "MIXTURE_OR_TASK_NAME"):
    assert name in out


def test_gin_includes_log_no_path_errors(world, caplog):
  # gin probes each search path for an include and logs 'Path not found' for the misses.
  gin_config.parse([str(world["dir"] / "lm_run.gin")], [])
  assert "Path not found" not in caplog.text and "runs/decode.gin" not in caplog.text


def test_a_plain_vocabulary_path_needs_no_seqio(world):
  code = ("import sys, specjax.main; from specjax.data import resolve_vocabulary; "
          f"v = resolve_vocabulary({str(world['spm'])!r}); assert v.decode(v.encode('ab')) == 'ab'; "
          "print(sorted(m for m in ('seqio', 'tensorflow') if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=str(REPO), env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
  assert out.stdout.strip() == "[]"
