"""What the main job decodes: prompts, lines of a file, or examples of a task.

A `DecodeInput` is a text and, for a seqio task, the token ids its preprocessors made (its
vocabulary, its EOS). `task_inputs` reads a bundled split ('translate_en_de') or any
registered seqio task or mixture ('specjax_translate_en_de:validation', or a user's own,
registered by importing its module: `import_modules`), the way T5X's infer.py reads
MIXTURE_OR_TASK_NAME with TASK_FEATURE_LENGTHS.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from specjax import files
from specjax.data._errors import library_error
from specjax.data.seqio_import import import_seqio, seqio_imported
from specjax.data.splits import TASK_FILES, load_bundled

LM_TASKS = ("lm_ddtp_en", "specjax_lm_ddtp_en")
"""Tasks whose documents are cut to their first words to serve as prompts."""


@dataclasses.dataclass(frozen=True)
class DecodeInput:
  """One example to decode."""

  text: str
  """The input text (printed, and written as `inputs_pretokenized`)."""
  ids: Optional[Tuple[int, ...]] = None
  """Token ids from a seqio task's preprocessors (its EOS included); None: encode `text`."""
  pretokenized: Tuple[Tuple[str, str], ...] = ()
  """The task's `*_pretokenized` features, as T5X's infer.py writes them under `inputs`."""


INPUT_FILE_BYTES = 64 * files.MIB
"""Largest --input_file read (the job decodes every line of it in one run)."""


def read_input_file(path: str, limit: int = INPUT_FILE_BYTES) -> List[str]:
  """The non-blank lines of a UTF-8 file (LF, CRLF or CR alone, a BOM dropped); ValueError
  naming a bad byte, a file with no input at all (the job must not fall back to a default
  task), or a path that is not a regular file of at most `limit` bytes (/dev/zero, a FIFO)."""
  try:
    raw = files.read_bytes(path, limit, "--input_file")
  except OSError as e:  # missing, unreadable: named by its flag, not a bare [Errno N]
    raise type(e)(f"--input_file '{path}': {e.strerror or e}") from e
  try:
    text = raw.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    raise ValueError(f"--input_file '{path}' is not UTF-8: byte {e.start} "
                     f"({raw[e.start:e.start + 1]!r}) cannot be decoded ({e.reason})") from e
  lines = [line for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
           if line.strip()]
  if not lines:
    raise ValueError(f"--input_file '{path}' holds no input: it is empty or only blank lines")
  return lines


def import_modules(modules: Any) -> None:
  """Imports MIXTURE_OR_TASK_MODULE (a module name or a list), which registers tasks."""
  for name in [modules] if isinstance(modules, str) else list(modules or ()):
    try:
      importlib.import_module(name)
    except ImportError as e:
      raise ValueError(f"MIXTURE_OR_TASK_MODULE: cannot import {name!r}: {e}") from e


def _first_words(text: str, words: int) -> str:
  return " ".join(text.split()[:words])


def task_inputs(task: str, num_examples: int, prompt_words: int = 12,
                feature_lengths: Optional[Mapping[str, int]] = None
                ) -> Tuple[List[DecodeInput], Any]:
  """The first `num_examples` inputs of `task` ('NAME' or 'NAME:SPLIT', default validation).

  Args:
    task: a bundled split name ('translate_en_de', 'summarize_ddtp', 'lm_ddtp_en') or a
      registered seqio task or mixture.
    num_examples: how many.
    prompt_words: a language-modelling document (a task with `targets` only) is cut to its
      first `prompt_words` words, which become the prompt.
    feature_lengths: TASK_FEATURE_LENGTHS, passed to seqio (which trims the features).
  Returns:
    (inputs, the task's vocabulary, or None for a bundled split).
  """
  name, _, split = task.partition(":")
  if name in TASK_FILES:
    if split not in ("", "validation"):
      raise ValueError(f"the bundled split {name!r} has only 'validation', got {split!r} (the "
                       f"seqio task specjax_{name} reads prepared data: SPECJAX_DATA_DIR)")
    found = [e[0] if isinstance(e, (tuple, list)) else e for e in load_bundled(name)]
    if name in LM_TASKS:
      found = [_first_words(t, prompt_words) for t in found]
    return [DecodeInput(t) for t in found[:num_examples]], None
  return _seqio_inputs(name, split or "validation", num_examples, prompt_words, feature_lengths)


def unknown_task(name: str) -> str:
  """The message for a task that is neither a bundled split nor a registered seqio task."""
  close = difflib.get_close_matches(name, [*TASK_FILES, *(f"specjax_{t}" for t in TASK_FILES)],
                                    1)
  return (f"unknown task {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "") +
          f": neither a bundled split ({sorted(TASK_FILES)}) nor a registered seqio task or "
          "mixture (register yours by importing its module: MIXTURE_OR_TASK_MODULE or an "
          "`import` in your gin file)")


def _seqio_inputs(name: str, split: str, num_examples: int, prompt_words: int,
                  feature_lengths: Optional[Mapping[str, int]]) -> Tuple[List[DecodeInput], Any]:
  if not name.startswith("specjax_") and not seqio_imported():
    # No module that registers seqio tasks was imported (each imports seqio), so no task of
    # this name can exist: said at once, without the seconds of importing TensorFlow.
    raise ValueError(unknown_task(name))
  try:
    seqio = import_seqio()
  except ImportError as e:
    raise ValueError(f"task {name!r} is not a bundled split ({sorted(TASK_FILES)}); reading a "
                     f"seqio task needs seqio (pip install specjax[seqio]): {e}") from e
  if name.startswith("specjax_"):
    from specjax.data import tasks  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  try:
    provider = seqio.get_mixture_or_task(name)
  except ValueError as e:
    raise ValueError(unknown_task(name)) from e
  features = provider.output_features
  key = "inputs" if "inputs" in features else "targets"
  try:
    dataset = provider.get_dataset(sequence_length=dict(feature_lengths or {}) or None,
                                   split=split, shuffle=False, num_epochs=1)
  except (ValueError, KeyError, FileNotFoundError) as e:
    splits = getattr(provider, "splits", None)
    known = (f"; its splits are {sorted(splits)}" if splits and split not in splits else "")
    raise ValueError(f"task {name!r}, split {split!r}: "
                     f"{'no such split' if known else e}{known}") from e
  except Exception as e:  # seqio's and tensorflow's own error types
    raise library_error(f"task {name!r}, split {split!r}", e) from e
  try:
    examples = list(dataset.take(num_examples).as_numpy_iterator())
  except Exception as e:  # a missing source file, a failing preprocessor (tensorflow's types)
    raise library_error(f"task {name!r}, split {split!r}: reading its examples", e) from e
  vocabulary = features[key].vocabulary
  out = []
  for ex in examples:
    pretokenized = tuple((k, _text(v)) for k, v in sorted(ex.items())
                         if k.endswith("_pretokenized"))
    ids = tuple(int(i) for i in ex[key])
    text = dict(pretokenized).get(f"{key}_pretokenized")
    if text is None:
      text = vocabulary.decode(list(ids))
    if key == "targets":  # a language-modelling task: its documents' first words prompt
      out.append(DecodeInput(_first_words(text, prompt_words),
                             pretokenized=(("inputs_pretokenized",
                                            _first_words(text, prompt_words)),)))
    else:
      out.append(DecodeInput(text, ids, pretokenized))
  return out, vocabulary


def _text(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def as_inputs(items: Sequence[Any]) -> List[DecodeInput]:
  """Strings (or DecodeInputs) -> DecodeInputs."""
  out = []
  for item in items:
    if isinstance(item, DecodeInput):
      out.append(item)
    elif isinstance(item, str):
      out.append(DecodeInput(item))
    else:
      raise ValueError(f"an input must be a str, got {type(item).__name__}")
  return out


def cut_rows(rows: Sequence[Sequence[int]], max_len: int, eos_id: int) -> List[List[int]]:
  """Each row cut to `max_len` tokens; a row ending with EOS keeps it (first max_len - 1
  tokens + EOS). Logs a warning naming each example that was cut."""
  out = []
  for index, row in enumerate(rows):
    row = [int(t) for t in row]
    eos = len(row) > 0 and row[-1] == eos_id
    n = len(row) - eos
    keep = max_len - 1 if eos else max_len
    if n > keep:
      logging.warning("input %d has %d tokens, more than max_input_len=%d: keeping its first %d "
                      "tokens%s and dropping the last %d", index, n, max_len, keep,
                      " + EOS" if eos else "", n - keep)
      row = row[:keep] + ([eos_id] if eos else [])
    out.append(row)
  return out
