"""Tests for specjax.tasks: the seqio tasks yield tokenized bundled examples.

Needs the `seqio` extra (`pip install -e '.[seqio]'`). seqio (and TensorFlow with it) is imported
by the first test that uses it, not when the suite is collected (seconds in every pytest process).
"""
import importlib

import numpy as np
import pytest

from specjax import data
from specjax.data import vocab as vocab_lib


class _OnFirstUse:
  """A module imported when one of its attributes is first read."""

  def __init__(self, name):
    self._name = name

  def __getattr__(self, attr):
    if attr.startswith("__"):  # what collection asks of any object (`__test__`, ...)
      raise AttributeError(attr)
    return getattr(importlib.import_module(self._name), attr)


seqio = _OnFirstUse("seqio")
tasks = _OnFirstUse("specjax.data.tasks")
TASK_NAMES = ("specjax_lm_ddtp_en", "specjax_summarize_ddtp", "specjax_translate_en_de")


def test_the_parametrized_names_are_every_task():
  assert TASK_NAMES == tuple(sorted(tasks.TASKS))


def _examples(name, split="validation", **kwargs):
  ds = tasks.get_task(name).get_dataset(sequence_length=None, split=split, shuffle=False,
                                        **kwargs)
  return list(ds.as_numpy_iterator())


@pytest.fixture(scope="module")
def bundled_examples():
  tasks.register_tasks()  # bundled split, whatever an earlier test registered
  return {name: _examples(name) for name in tasks.TASKS}


def _check_ids(ids, vocab_size):
  assert ids.dtype == np.int32 and ids.ndim == 1 and len(ids) >= 2
  assert ids.min() >= 0 and ids.max() < vocab_size
  assert ids[-1] == vocab_lib.EOS_ID
  assert vocab_lib.EOS_ID not in ids[:-1] and vocab_lib.PAD_ID not in ids


@pytest.mark.parametrize("name", TASK_NAMES)
def test_bundled_task_yields_tokenized_examples(name, bundled_examples):
  examples = bundled_examples[name]
  lines = data.load_bundled(tasks.TASKS[name])
  assert len(examples) == len(lines) > 0
  vocab = vocab_lib.load_vocab()
  sq_vocab = tasks.output_features(name)["targets"].vocabulary
  assert sq_vocab.vocab_size == vocab.vocab_size == 8192
  differ = 0
  for ex, line in zip(examples, lines):
    if name == "specjax_lm_ddtp_en":
      assert set(ex) == {"targets", "targets_pretokenized"}
      texts = {"targets": line}
    else:
      texts = {"inputs": line[0], "targets": line[1]}
    for feature, text in texts.items():
      ids = ex[feature]
      _check_ids(ids, vocab.vocab_size)
      assert ex[f"{feature}_pretokenized"].decode("utf-8") == text
      assert vocab.decode(ids) == text
      assert sq_vocab.decode(ids.tolist()) == text
      # TF's SentencePiece op may break exact score ties (e.g. '0'+'00' vs '00'+'0')
      # unlike the Python one; both decode to the text, and ties are rare.
      differ += list(ids[:-1]) != vocab.encode(text)
  assert differ <= 0.01 * len(lines)


def test_output_features():
  lm = tasks.output_features("specjax_lm_ddtp_en")
  assert list(lm) == ["targets"] and lm["targets"].add_eos
  for name in ("specjax_translate_en_de", "specjax_summarize_ddtp"):
    feats = tasks.output_features(name)
    assert list(feats) == ["inputs", "targets"]
    assert all(f.add_eos for f in feats.values())
  with pytest.raises(ValueError, match="unknown specjax task"):
    tasks.get_task("specjax_nope")


def test_feature_converter_batches(bundled_examples):
  ds = seqio.get_dataset(
      "specjax_translate_en_de", task_feature_lengths={"inputs": 32, "targets": 32},
      dataset_split="validation", shuffle=False,
      feature_converter=seqio.EncDecFeatureConverter(pack=False))
  first = next(ds.as_numpy_iterator())
  raw = bundled_examples["specjax_translate_en_de"][0]
  n = min(len(raw["targets"]), 32)
  assert first["decoder_target_tokens"].shape == (32,)
  np.testing.assert_array_equal(first["decoder_target_tokens"][:n], raw["targets"][:n])
  np.testing.assert_array_equal(first["decoder_input_tokens"][1:n], raw["targets"][:n - 1])
  assert first["decoder_input_tokens"][0] == 0


@pytest.fixture
def prepared_dir(tmp_path):
  for task, ext in data.TASK_FILES.items():
    for i, split in enumerate(data.SPLITS):
      if ext == "txt":
        exs = [(f"Document {split} number {k} about widgets.", None) for k in range(3 + i)]
      else:
        exs = [(f"Open the {split} file {k}.", f"Öffne die Datei {k}.") for k in range(3 + i)]
      data.write_split(tmp_path / task / f"{split}.{ext}", exs)
  yield tmp_path
  tasks.register_tasks()  # back to the bundled split for the other tests


def test_register_tasks_with_data_dir(prepared_dir, monkeypatch):
  monkeypatch.setenv(tasks.DATA_DIR_ENV, str(prepared_dir))
  tasks.register_tasks()
  for name in tasks.TASKS:
    for i, split in enumerate(data.SPLITS):
      exs = _examples(name, split=split)
      assert len(exs) == 3 + i
      key = "targets" if name == "specjax_lm_ddtp_en" else "inputs"
      texts = sorted(e[f"{key}_pretokenized"].decode() for e in exs)
      assert all(split in t for t in texts)
      assert all(e[key][-1] == vocab_lib.EOS_ID for e in exs)
  out = _examples("specjax_translate_en_de", split="train")
  assert {e["targets_pretokenized"].decode() for e in out} == {
      f"Öffne die Datei {k}." for k in range(3)}


def test_split_files_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="train split missing"):
    tasks.split_files("lm_ddtp_en", tmp_path)
  with pytest.raises(ValueError, match="unknown task"):
    tasks.split_files("nope")
  assert set(tasks.split_files("summarize_ddtp")) == {"validation"}


def test_metrics():
  assert tasks.bleu(["Das ist ein Haus."], ["Das ist ein Haus."])["bleu"] == pytest.approx(100)
  assert tasks.bleu(["Das ist ein Haus."], ["Völlig anders hier"])["bleu"] < 5
  assert tasks.rouge_l(["a b c d"], ["a x c d"])["rougeL"] == pytest.approx(75.0)
  assert tasks.rouge_l(["a b", "c d"], ["a b", "e f"])["rougeL"] == pytest.approx(50.0)
  with pytest.raises(ValueError, match="predictions"):
    tasks.bleu(["a"], [])
