"""The specjax SentencePiece vocabulary: training and loading.

T5 conventions: pad 0, eos 1, unk 2, no bos; a unigram model of 8192 pieces in all,
trained on equal amounts of English and German text from the prepared train splits
(`python -m specjax.data vocab --data data/ --out specjax/assets/spm`).
`load_vocab()` needs only `sentencepiece`; `seqio_vocab()` wraps the same file as a
`seqio.SentencePieceVocabulary` and imports seqio (and TensorFlow) only when called.
"""
from __future__ import annotations

import functools
import random
import tempfile
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Union

import sentencepiece as spm

from specjax import files
from specjax.checks import check_int
from specjax.data.splits import read_split

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "assets" / "spm" / "specjax_8k.model"
MODEL_NAME = "specjax_8k"
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
MODEL_BYTES = 64 * files.MIB
"""Largest SentencePiece model read from gs:// (cc_all.32000's is 0.8 MiB)."""


MAX_EXTRA_IDS = 65536
"""Most sentinel pieces a vocabulary may add (T5's vocabularies add 100; each is a piece
held in memory, so a count such as 10**9 would exhaust it)."""


class Vocab:
  """A SentencePiece model with T5's special ids; no TensorFlow needed.

  `extra_ids` appends sentinel pieces `<extra_id_N>` after the model's pieces, as
  seqio.SentencePieceVocabulary does (the last id is `<extra_id_0>`): T5 1.1's
  `cc_all.32000` model with extra_ids=100 has 32100 ids.
  """

  def __init__(self, model_path: Union[str, Path], extra_ids: int = 0):
    if files.is_remote(model_path):  # read in place (`specjax.remote`)
      path = str(model_path)
      check_int("extra_ids", extra_ids, low=0, high=MAX_EXTRA_IDS)
      data = files.read_bytes(path, MODEL_BYTES, "the SentencePiece model")
    else:
      path = Path(model_path)
      if not path.is_file():
        raise FileNotFoundError(f"SentencePiece model not found: {path}")
      check_int("extra_ids", extra_ids, low=0, high=MAX_EXTRA_IDS)
      data = path.read_bytes()
    self.model_path = path
    self.extra_ids = extra_ids
    try:
      self._sp = spm.SentencePieceProcessor(
          model_proto=_with_extra_ids(data, extra_ids))
    except (RuntimeError, OSError) as e:
      raise ValueError(f"{path} is not a SentencePiece model: {e}") from e
    ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id())
    if ids != (PAD_ID, EOS_ID, UNK_ID):
      raise ValueError(f"{path}: expected T5 ids pad=0 eos=1 unk=2, got "
                       f"pad={ids[0]} eos={ids[1]} unk={ids[2]}")

  @property
  def vocab_size(self) -> int:
    """Number of ids: pieces, special ids and extra ids included."""
    return self._sp.get_piece_size()

  @property
  def pad_id(self) -> int:
    return PAD_ID

  @property
  def eos_id(self) -> int:
    return EOS_ID

  @property
  def unk_id(self) -> int:
    return UNK_ID

  def pieces(self) -> List[str]:
    """The piece of every id, in id order (what two vocabularies are compared by)."""
    return [self._sp.id_to_piece(i) for i in range(self.vocab_size)]

  def encode(self, text: str) -> List[int]:
    """Token ids of `text`, without EOS."""
    if not isinstance(text, str):
      raise ValueError(f"encode expects a str, got {type(text).__name__}")
    return self._sp.encode(text)

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids` (int list or 1-D int array); stops at the first EOS, skips pads.

    Ids past the vocabulary decode as UNK (seqio's rule: a model's vocab_size may exceed
    its vocabulary's, as T5's 32128 does 32100); negative ids are refused.
    """
    out = []
    for i in (int(i) for i in ids):
      if i == EOS_ID:
        break
      if i < 0:
        raise ValueError(f"token id {i} outside the vocabulary [0, {self.vocab_size})")
      if i != PAD_ID:
        out.append(i if i < self.vocab_size else UNK_ID)
    return self._sp.decode(out)


def _with_extra_ids(proto: bytes, extra_ids: int) -> bytes:
  """The serialized model with `extra_ids` user-defined pieces `▁<extra_id_N>` appended,
  N from extra_ids - 1 down to 0 (seqio's order). Needs protobuf only when extra_ids > 0."""
  if not extra_ids:
    return proto
  from sentencepiece import sentencepiece_model_pb2 as model_pb2  # pylint: disable=import-outside-toplevel
  model = model_pb2.ModelProto.FromString(proto)
  for n in reversed(range(extra_ids)):
    model.pieces.add(piece=f"\u2581<extra_id_{n}>", score=0.0,
                     type=model_pb2.ModelProto.SentencePiece.USER_DEFINED)
  return model.SerializeToString()


@functools.lru_cache(maxsize=8)
def load_vocab(model_path: Optional[Union[str, Path]] = None) -> Vocab:
  """The bundled vocabulary (or the model at `model_path`), cached."""
  return Vocab(model_path or DEFAULT_MODEL)


def seqio_vocab(model_path: Optional[Union[str, Path]] = None):
  """`seqio.SentencePieceVocabulary` on the same file (needs the `seqio` extra)."""
  from specjax.data.seqio_import import import_seqio  # pylint: disable=import-outside-toplevel
  return import_seqio().SentencePieceVocabulary(str(model_path or DEFAULT_MODEL), extra_ids=0)


def balanced_sample(english: Iterable[str], german: Iterable[str],
                    max_chars: int = 6_000_000, seed: int = 0) -> List[str]:
  """Equal numbers of characters of English and German lines, randomly chosen."""
  pools = [list(english), list(german)]
  if not pools[0] or not pools[1]:
    raise ValueError("need English and German text to train a vocabulary")
  budget = min(max_chars, *(sum(map(len, p)) for p in pools))
  rng = random.Random(seed)
  out = []
  for pool in pools:
    rng.shuffle(pool)
    total = 0
    for line in pool:
      if total >= budget:
        break
      out.append(line)
      total += len(line)
  rng.shuffle(out)
  return out


def train_vocab(lines: Sequence[str], out_dir: Union[str, Path],
                vocab_size: int = 8192, model_name: str = MODEL_NAME,
                character_coverage: float = 0.9999, num_threads: int = 1) -> Path:
  """Trains a T5-style unigram SentencePiece model; returns the .model path.

  Args:
    lines: training text, one sentence or document per line.
    out_dir: where `{model_name}.model` is written (the .vocab file is not kept).
    vocab_size: pieces in all, pad/eos/unk included.
    character_coverage: share of characters covered; rarer ones become unk.
    num_threads: trainer threads.
  """
  if vocab_size < 8:
    raise ValueError(f"vocab_size must be at least 8, got {vocab_size}")
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    text = Path(tmp) / "train.txt"
    text.write_text("".join(line.replace("\n", " ") + "\n" for line in lines),
                    encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(Path(tmp) / model_name),
        model_type="unigram", vocab_size=vocab_size,
        character_coverage=character_coverage,
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        max_sentence_length=1 << 16, input_sentence_size=2_000_000,
        shuffle_input_sentence=True, num_threads=num_threads, minloglevel=2)
    model = out_dir / f"{model_name}.model"
    model.write_bytes((Path(tmp) / f"{model_name}.model").read_bytes())
  load_vocab.cache_clear()
  return model


def train_from_data(data_dir: Union[str, Path], out_dir: Union[str, Path],
                    vocab_size: int = 8192) -> Path:
  """Trains on the prepared train splits: LM documents and both translation sides."""
  data_dir = Path(data_dir)
  lm = read_split(data_dir / "lm_ddtp_en" / "train.txt")
  pairs = read_split(data_dir / "translate_en_de" / "train.tsv")
  english = [s for s, _ in lm] + [s for s, _ in pairs]
  german = [t for _, t in pairs]
  return train_vocab(balanced_sample(english, german), out_dir, vocab_size=vocab_size)
