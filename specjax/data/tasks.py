"""seqio Tasks over the prepared Debian corpora (needs the `seqio` extra).

Importing this module registers three tasks:

  specjax_lm_ddtp_en       English package descriptions; `targets` only (decoder-only)
  specjax_translate_en_de  English -> German; `inputs` / `targets`
  specjax_summarize_ddtp   long description -> synopsis; `inputs` / `targets`

They read `train` / `validation` / `test` from the directory written by
`python -m specjax.data prepare --out DIR` when a data dir is given (the
`SPECJAX_DATA_DIR` environment variable at import, or `register_tasks(data_dir)`),
and otherwise only the `validation` split bundled in `specjax/assets/eval/`.
Preprocessing: parse the line, tokenize with the specjax vocabulary, append EOS.
"""
from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Union

import sacrebleu
import seqio
import tensorflow as tf

from specjax.data import splits as data_lib
from specjax.data import vocab as vocab_lib

# seqio task name -> task folder / bundled file stem in specjax.data.
TASKS = {
    "specjax_lm_ddtp_en": "lm_ddtp_en",
    "specjax_translate_en_de": "translate_en_de",
    "specjax_summarize_ddtp": "summarize_ddtp",
}
DATA_DIR_ENV = "SPECJAX_DATA_DIR"


def split_files(task: str, data_dir: Optional[Union[str, Path]] = None) -> Dict[str, str]:
  """Split name -> file of a specjax.data task ('lm_ddtp_en', ...).

  Args:
    task: a key of `specjax.data.TASK_FILES`.
    data_dir: a prepared data directory; None for the bundled validation split.

  Raises:
    ValueError: for an unknown task. FileNotFoundError: for a missing split file.
  """
  if task not in data_lib.TASK_FILES:
    raise ValueError(f"unknown task {task!r}; expected one of {sorted(data_lib.TASK_FILES)}")
  ext = data_lib.TASK_FILES[task]
  if data_dir is None:
    files = {"validation": data_lib.BUNDLED_DIR / f"{task}.{ext}"}
  else:
    files = {s: Path(data_dir) / task / f"{s}.{ext}" for s in data_lib.SPLITS}
  for split, path in files.items():
    if not path.is_file():
      raise FileNotFoundError(f"{task}: {split} split missing at {path} "
                              "(run `python -m specjax.data prepare --out DIR`)")
  return {s: str(p) for s, p in files.items()}


@seqio.map_over_dataset
def parse_tsv(line: tf.Tensor) -> Dict[str, tf.Tensor]:
  """'source<TAB>target' -> {'inputs', 'targets'} (string scalars)."""
  inputs, targets = tf.io.decode_csv(line, record_defaults=["", ""], field_delim="\t",
                                     use_quote_delim=False)
  return {"inputs": inputs, "targets": targets}


@seqio.map_over_dataset
def parse_document(line: tf.Tensor) -> Dict[str, tf.Tensor]:
  """A document line -> {'targets'} (string scalar)."""
  return {"targets": line}


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> Dict[str, float]:
  """Corpus BLEU (sacrebleu defaults, 13a tokenization) in [0, 100]."""
  if len(targets) != len(predictions):
    raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")
  return {"bleu": sacrebleu.corpus_bleu(list(predictions), [list(targets)]).score}


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
  row = [0] * (len(b) + 1)
  for x in a:
    prev = 0
    for j, y in enumerate(b):
      prev, row[j + 1] = row[j + 1], prev + 1 if x == y else max(row[j + 1], row[j])
  return row[-1]


def rouge_l(targets: Sequence[str], predictions: Sequence[str]) -> Dict[str, float]:
  """Mean ROUGE-L F1 (longest common subsequence of lowercased words) in [0, 100]."""
  if len(targets) != len(predictions):
    raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")
  scores = []
  for t, p in zip(targets, predictions):
    tw, pw = t.lower().split(), p.lower().split()
    lcs = _lcs(tw, pw)
    scores.append(0.0 if lcs == 0 else 2 * lcs / (len(tw) + len(pw)))
  return {"rougeL": 100.0 * sum(scores) / max(len(scores), 1)}


def register_tasks(data_dir: Optional[Union[str, Path]] = None,
                   vocab_path: Optional[Union[str, Path]] = None) -> Dict[str, seqio.Task]:
  """(Re-)registers the three specjax tasks; returns them by name.

  Args:
    data_dir: prepared data directory; defaults to $SPECJAX_DATA_DIR, and without
      either the tasks read the bundled validation split only.
    vocab_path: SentencePiece model; defaults to the bundled 8k vocabulary.
  """
  data_dir = data_dir or os.environ.get(DATA_DIR_ENV) or None
  vocab = vocab_lib.seqio_vocab(vocab_path)
  seq2seq = collections.OrderedDict(
      inputs=seqio.Feature(vocab, add_eos=True),
      targets=seqio.Feature(vocab, add_eos=True))
  lm = {"targets": seqio.Feature(vocab, add_eos=True)}
  tokenize = [seqio.preprocessors.tokenize, seqio.preprocessors.append_eos]
  specs = {
      "specjax_lm_ddtp_en": (lm, parse_document, []),
      "specjax_translate_en_de": (seq2seq, parse_tsv, [bleu]),
      "specjax_summarize_ddtp": (seq2seq, parse_tsv, [rouge_l]),
  }
  tasks = {}
  for name, (features, parse, metrics) in specs.items():
    source = seqio.TextLineDataSource(split_files(TASKS[name], data_dir))
    seqio.TaskRegistry.remove(name)
    tasks[name] = seqio.TaskRegistry.add(
        name, source=source, output_features=features,
        preprocessors=[parse, *tokenize], metric_fns=metrics)
  return tasks


def get_task(name: str) -> seqio.Task:
  """A registered specjax task by its seqio name."""
  if name not in TASKS:
    raise ValueError(f"unknown specjax task {name!r}; expected one of {sorted(TASKS)}")
  return seqio.get_mixture_or_task(name)


def output_features(name: str) -> Mapping[str, seqio.Feature]:
  """The output features of a registered specjax task."""
  return get_task(name).output_features


register_tasks()
