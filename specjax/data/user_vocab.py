"""The vocabulary a run names, whatever its kind, and the check that two are the same.

`resolve_vocabulary(spec)` turns what gin binds to `VOCABULARY` into one interface
(`vocab_size`, `eos_id`, `encode`, `decode`, `pieces`):

  'bundled:specjax_8k'                the bundled 8k model (the bundled pairs' vocabulary)
  '/path/to/sentencepiece.model'      a SentencePiece model file (no seqio needed)
  @Vocab() / a `specjax.data.Vocab`   the same with `extra_ids`
  @seqio.SentencePieceVocabulary()    any seqio.Vocabulary (T5X's gin), used through its own
                                      encode/decode

`vocabulary_difference(a, b)` says how two vocabularies differ (size, special ids, the
first differing piece), or None when they are the same.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import sentencepiece as spm

from specjax.data._errors import library_error
from specjax.data.vocab import DEFAULT_MODEL, MODEL_NAME, PAD_ID, Vocab, load_vocab

BUNDLED = "bundled:" + MODEL_NAME
"""The name of the bundled vocabulary in gin (`VOCABULARY = 'bundled:specjax_8k'`)."""


class ForeignVocab:
  """A seqio.Vocabulary (or any object with its interface) behind specjax's vocab interface.

  encode/decode are the wrapped vocabulary's own (for seqio: ids past its size decode as
  UNK, decoding stops at EOS), so predictions read exactly as T5X's infer.py writes them.
  """

  def __init__(self, vocabulary: Any):
    for name in ("encode", "decode", "vocab_size", "eos_id"):
      if not _has(vocabulary, name):
        raise ValueError(f"VOCABULARY must be a SentencePiece model path or a "
                         f"seqio.Vocabulary; {type(vocabulary).__name__} has no '{name}'")
    # seqio reads its model file on first use: read it now, so that a bad path is one line
    # here instead of a TensorFlow traceback in the middle of the run.
    try:
      int(vocabulary.vocab_size)
      eos_id = vocabulary.eos_id
    except Exception as e:  # the library's own error types (tensorflow's NotFoundError)
      raise library_error(f"vocabulary {type(vocabulary).__name__} cannot read its model", e
                          ) from e
    if eos_id is None:
      raise ValueError(f"vocabulary {type(vocabulary).__name__} has no EOS id: decoding needs "
                       "one to stop")
    self.vocabulary = vocabulary

  @property
  def vocab_size(self) -> int:
    return int(self.vocabulary.vocab_size)

  @property
  def eos_id(self) -> int:
    return int(self.vocabulary.eos_id)

  @property
  def pad_id(self) -> int:
    return int(getattr(self.vocabulary, "pad_id", PAD_ID))

  def encode(self, text: str) -> List[int]:
    """Token ids of `text`, without EOS."""
    return [int(i) for i in self.vocabulary.encode(text)]

  def decode(self, ids) -> str:
    """Text of `ids`, through the first EOS (the wrapped vocabulary's own rules)."""
    return self.vocabulary.decode([int(i) for i in ids])

  def pieces(self) -> Optional[List[str]]:
    """Every id's piece for a SentencePiece-based vocabulary (seqio's `sp_model`), else None."""
    proto = getattr(self.vocabulary, "sp_model", None)
    if not proto:
      return None
    sp = spm.SentencePieceProcessor(model_proto=proto)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]

  def __str__(self) -> str:
    return str(self.vocabulary)


def _has(obj: Any, name: str) -> bool:
  """Whether `obj` has the attribute `name`, without running a property (which may load a
  file and fail with the library's own error, which `hasattr` would not catch)."""
  return hasattr(type(obj), name) or name in getattr(obj, "__dict__", {})


def resolve_vocabulary(spec: Any):
  """What gin binds to VOCABULARY -> a vocabulary with encode/decode/eos_id/vocab_size.

  Args:
    spec: 'bundled:specjax_8k', a SentencePiece model path, a `Vocab`, or a
      seqio.Vocabulary (any object with encode, decode, vocab_size and eos_id).
  Raises:
    ValueError / FileNotFoundError naming the problem.
  """
  if isinstance(spec, (Vocab, ForeignVocab)):
    return spec
  if isinstance(spec, Path):
    spec = str(spec)
  if isinstance(spec, str):
    if spec.startswith("bundled:"):
      if spec != BUNDLED:
        raise ValueError(f"unknown bundled vocabulary {spec!r}; the bundled one is {BUNDLED!r}")
      return load_vocab(DEFAULT_MODEL)
    if spec.startswith("gs://"):
      return load_vocab(spec)  # read in place
    path = Path(spec).expanduser()
    if path.is_dir():
      raise IsADirectoryError(f"VOCABULARY {spec} is a folder: name its SentencePiece model "
                              "file (e.g. spm.model or sentencepiece.model in it)")
    if not path.is_file():
      raise FileNotFoundError(f"SentencePiece model not found: {spec}")
    return load_vocab(path)
  if spec is None:
    raise ValueError("no vocabulary given: bind VOCABULARY")
  return ForeignVocab(spec)


def describe(vocab: Any) -> str:
  """A short name for messages: the model file and size."""
  if isinstance(vocab, Vocab):
    extra = f" + {vocab.extra_ids} extra ids" if vocab.extra_ids else ""
    return f"SentencePiece model {vocab.model_path}{extra} ({vocab.vocab_size} ids)"
  return f"{vocab} ({vocab.vocab_size} ids)"


def vocabulary_difference(a: Any, b: Any) -> Optional[str]:
  """None when `a` and `b` are the same vocabulary, else what differs (for an error message).

  SentencePiece-based vocabularies (specjax's or seqio's) are compared piece by piece, so
  two copies of one model file are the same and two models of equal size are not; other
  seqio vocabularies by seqio's own equality.
  """
  if a.vocab_size != b.vocab_size:
    return f"{a.vocab_size} ids vs {b.vocab_size} ids"
  if a.eos_id != b.eos_id:
    return f"EOS id {a.eos_id} vs {b.eos_id}"
  pieces_a, pieces_b = a.pieces(), b.pieces()
  if pieces_a is None or pieces_b is None:
    inner_a, inner_b = getattr(a, "vocabulary", a), getattr(b, "vocabulary", b)
    return None if inner_a == inner_b else f"{inner_a} vs {inner_b}"
  for i, (x, y) in enumerate(zip(pieces_a, pieces_b)):
    if x != y:
      return f"id {i} is {x!r} in one and {y!r} in the other"
  return None
