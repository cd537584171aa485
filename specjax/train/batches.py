"""Training batches for `specjax.train`: packed LM rows and padded seq2seq pairs.

Features use T5X's names. Every batch is a dict of numpy arrays:
  decoder_input_tokens   int32 [B, L_dec]
  decoder_target_tokens  int32 [B, L_dec]
  decoder_loss_weights   float32 [B, L_dec]  1 on real targets, 0 on padding
  encoder_input_tokens   int32 [B, L_in]     seq2seq tasks only

Tasks:
  lm         documents of `lm_ddtp_en`, each followed by EOS, concatenated into one
             stream and cut into rows of `seq_len` next-token pairs (no BOS: a
             decoder-only model in specjax decodes from its raw prompt, so
             `decoder_input_tokens[i]` is the token before `decoder_target_tokens[i]`).
  translate  `translate_en_de` pairs; inputs and targets each get EOS, truncated
             to their length limits with EOS kept; the decoder inputs are the
             targets shifted right with 0 as the start token (T5X convention).
  summarize  `summarize_ddtp` pairs, as `translate`.

Batch `step` is a pure function of (seed, step) — each epoch is a fresh
permutation — so a resumed run sees the batches the uninterrupted one would.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import gin
import numpy as np

from specjax.checks import check_choice
from specjax.data import splits as data_lib
from specjax.data import vocab as vocab_lib
from specjax.models.decoder_only import DecoderOnlyConfig
from specjax.models.t5 import T5Config
from specjax.train._checks import check_int

# Training task -> specjax.data task folder.
TASKS = {"lm": "lm_ddtp_en", "translate": "translate_en_de", "summarize": "summarize_ddtp"}
Batch = Dict[str, np.ndarray]


def check_task(task: str) -> str:
  """Returns `task`; ValueError unless it is 'lm', 'translate' or 'summarize'."""
  return check_choice("the training task", task, TASKS)


def load_split(task: str, split: str, data_dir: Optional[Union[str, Path]] = None,
               bundled_eval_fraction: float = 0.1) -> List:
  """Examples of one split: documents (lm) or (source, target) pairs.

  Args:
    task: 'lm', 'translate' or 'summarize'.
    split: 'train' or 'validation'.
    data_dir: a directory written by `python -m specjax.data prepare`; None uses
      the bundled split (a validation sample), whose first
      `1 - bundled_eval_fraction` examples serve as 'train' and the rest as
      'validation', so the two never overlap.
    bundled_eval_fraction: see `data_dir`, in (0, 1).

  Raises:
    ValueError: unknown task or split, a bad fraction, or an empty split.
    FileNotFoundError: a split file missing under `data_dir`.
  """
  folder = TASKS[check_task(task)]
  check_choice("split", split, ("train", "validation"))
  if data_dir is not None:
    path = Path(data_dir) / folder / f"{split}.{data_lib.TASK_FILES[folder]}"
    if not path.is_file():
      raise FileNotFoundError(f"{task}: {split} split missing at {path} (write it with "
                              "`python -m specjax.data prepare --out DIR`)")
    examples = data_lib.read_split(path)
    examples = [s for s, _ in examples] if task == "lm" else examples
  else:
    if not 0.0 < bundled_eval_fraction < 1.0:
      raise ValueError(f"bundled_eval_fraction must be in (0, 1), got {bundled_eval_fraction}")
    everything = data_lib.load_bundled(folder)
    cut = len(everything) - max(1, int(round(len(everything) * bundled_eval_fraction)))
    examples = everything[:cut] if split == "train" else everything[cut:]
  if not examples:
    raise ValueError(f"{task}: the {split} split holds no examples")
  texts = (e if isinstance(e, str) else " ".join(x for x in e if x) for e in examples)
  if not any(text.strip() for text in texts):
    raise ValueError(f"{task}: the {split} split holds {len(examples)} examples, all blank; "
                     "nothing to train on")
  return examples


def pack_lm(docs: Sequence[str], vocab, seq_len: int) -> Batch:
  """Packs documents (each + EOS) into rows of `seq_len` next-token pairs.

  Row r holds stream[r*seq_len : (r+1)*seq_len] as inputs and the stream
  shifted by one as targets, so every stream token but the first is a target
  exactly once; the last row is padded with 0 (weight 0).

  Returns:
    decoder_input_tokens / decoder_target_tokens int32 [N, seq_len] and
    decoder_loss_weights float32 [N, seq_len].
  """
  if seq_len < 1:
    raise ValueError(f"seq_len must be positive, got {seq_len}")
  pieces = []
  for doc in docs:
    pieces.append(np.asarray(vocab.encode(doc), np.int32))
    pieces.append(np.asarray([vocab.eos_id], np.int32))
  stream = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
  if stream.size < 2:
    raise ValueError("lm: the documents hold fewer than 2 tokens; nothing to train on")
  rows = -(-(stream.size - 1) // seq_len)
  padded = np.zeros(rows * seq_len + 1, np.int32)
  padded[:stream.size] = stream
  inputs = padded[:-1].reshape(rows, seq_len)
  targets = padded[1:].reshape(rows, seq_len)
  weights = np.zeros(rows * seq_len, np.float32)
  weights[:stream.size - 1] = 1.0
  return {"decoder_input_tokens": inputs, "decoder_target_tokens": targets,
          "decoder_loss_weights": weights.reshape(rows, seq_len)}


def _encode_trimmed(text: str, vocab, length: int) -> List[int]:
  """Tokens of `text` trimmed to `length - 1`, then EOS (seqio's append_eos_after_trim)."""
  return vocab.encode(text)[:length - 1] + [vocab.eos_id]


def encode_pairs(pairs: Sequence[Tuple[str, str]], vocab, inputs_length: int,
                 targets_length: int) -> Batch:
  """Tokenizes (source, target) pairs into padded T5X seq2seq features.

  Returns:
    encoder_input_tokens int32 [N, inputs_length]; decoder_input_tokens,
    decoder_target_tokens int32 [N, targets_length]; decoder_loss_weights
    float32 [N, targets_length].
  """
  if inputs_length < 2 or targets_length < 2:
    raise ValueError(f"inputs_length and targets_length must be at least 2 (a token and "
                     f"EOS), got {inputs_length} and {targets_length}")
  n = len(pairs)
  inputs = np.zeros((n, inputs_length), np.int32)
  targets = np.zeros((n, targets_length), np.int32)
  for i, (src, tgt) in enumerate(pairs):
    x = _encode_trimmed(src, vocab, inputs_length)
    y = _encode_trimmed(tgt, vocab, targets_length)
    inputs[i, :len(x)] = x
    targets[i, :len(y)] = y
  decoder_inputs = np.zeros_like(targets)
  decoder_inputs[:, 1:] = targets[:, :-1]
  return {"encoder_input_tokens": inputs, "decoder_input_tokens": decoder_inputs,
          "decoder_target_tokens": targets,
          "decoder_loss_weights": (targets != 0).astype(np.float32)}


def make_features(task: str, examples: Sequence, vocab, *, seq_len: int,
                  inputs_length: int, targets_length: int) -> Batch:
  """Features of all `examples` of `task` (see `pack_lm` and `encode_pairs`)."""
  if check_task(task) == "lm":
    return pack_lm(examples, vocab, seq_len)
  return encode_pairs(examples, vocab, inputs_length, targets_length)


def _take(features: Batch, rows: np.ndarray, width: Optional[int] = None) -> Batch:
  """Rows of every feature (row -1: all zeros, so weight 0), columns cut to `width`."""
  real = rows >= 0
  out = {}
  for k, v in features.items():
    x = v[np.where(real, rows, 0)]
    if width is not None and x.ndim == 2:
      x = x[:, :width]
    out[k] = np.where(real.reshape((-1,) + (1,) * (x.ndim - 1)), x, 0).astype(v.dtype)
  return out


class Batches:
  """Deterministic batches over a feature table: `batch(step)` and `eval_batches()`.

  Without length buckets, epoch e is the seeded permutation e of the N rows and
  batches run through the epochs back to back. With buckets, each row goes to
  the smallest bucket no shorter than its longest `*_tokens` feature (rows
  longer than every bucket form one more bucket at full width); an epoch is
  every bucket's rows, permuted and cut into batches (a bucket's last batch
  padded with weight-0 rows), in a permuted order; each batch's token features
  are cut to its bucket's width, so a jitted step compiles once per bucket.

  Attributes:
    features: dict of arrays sharing their first axis N (one row per example).
    batch_size: rows per batch.
    seed: shuffling seed.
    buckets: ascending bucket widths (empty: every batch at full width).
  """

  def __init__(self, features: Batch, batch_size: int, seed: int = 0,
               buckets: Sequence[int] = ()):
    sizes = {k: v.shape[0] for k, v in features.items()}
    if len(set(sizes.values())) != 1 or not next(iter(sizes.values()), 0):
      raise ValueError(f"features must be non-empty and share their first axis, got {sizes}")
    if batch_size < 1:
      raise ValueError(f"batch_size must be positive, got {batch_size}")
    if list(buckets) != sorted(set(buckets)) or any(b < 1 for b in buckets):
      raise ValueError(f"length buckets must be ascending positive widths, got {buckets}")
    self.features = features
    self.batch_size = int(batch_size)
    self.seed = int(seed)
    self.num_rows = next(iter(sizes.values()))
    self.buckets = tuple(int(b) for b in buckets)
    self._cache: Dict[int, Any] = {}
    self._bucket_rows: List[np.ndarray] = []
    if self.buckets:
      length = np.zeros(self.num_rows, np.int64)
      for k, v in features.items():
        if k.endswith("_tokens"):  # padding is at the end: length = last non-zero + 1
          nonzero = v != 0
          last = v.shape[1] - np.argmax(nonzero[:, ::-1], axis=1)
          length = np.maximum(length, np.where(nonzero.any(axis=1), last, 0))
      which = np.searchsorted(np.asarray(self.buckets), length)  # == len(buckets): full width
      self._bucket_rows = [np.flatnonzero(which == b) for b in range(len(self.buckets) + 1)]
      self.batches_per_epoch = sum(-(-len(r) // self.batch_size) for r in self._bucket_rows)

  def _epoch(self, epoch: int) -> Any:
    """The permutation (no buckets) or the batch plan [(width, rows)] of an epoch."""
    if epoch not in self._cache:
      if len(self._cache) > 2:
        self._cache.pop(min(self._cache))
      rng = np.random.default_rng([self.seed, epoch])
      if not self.buckets:
        self._cache[epoch] = rng.permutation(self.num_rows)
      else:
        plan = []
        for b, rows in enumerate(self._bucket_rows):
          width = self.buckets[b] if b < len(self.buckets) else None
          rows = rng.permutation(rows)
          for i in range(0, len(rows), self.batch_size):
            chunk = np.full(self.batch_size, -1)
            chunk[:len(rows[i:i + self.batch_size])] = rows[i:i + self.batch_size]
            plan.append((width, chunk))
        self._cache[epoch] = [plan[i] for i in rng.permutation(len(plan))]
    return self._cache[epoch]

  def batch_shapes(self) -> List[Dict[str, Tuple[Tuple[int, ...], np.dtype]]]:
    """(shape, dtype) of every feature, for each distinct batch shape `batch` returns."""
    widths = [None] if not self.buckets else [
        self.buckets[b] if b < len(self.buckets) else None
        for b, rows in enumerate(self._bucket_rows) if len(rows)]
    def shape(v, width):
      cut = v.shape[1:2] if width is None or v.ndim < 2 else (min(width, v.shape[1]),)
      return (self.batch_size,) + cut + v.shape[2:]
    return [{k: (shape(v, w), v.dtype) for k, v in self.features.items()} for w in widths]

  def batch(self, step: int) -> Batch:
    """Batch number `step` (0-based), a pure function of (seed, step)."""
    if self.buckets:
      epoch, index = divmod(step, self.batches_per_epoch)
      width, rows = self._epoch(epoch)[index]
      return _take(self.features, rows, width)
    flat = step * self.batch_size + np.arange(self.batch_size)
    epochs, pos = np.divmod(flat, self.num_rows)
    rows = np.array([self._epoch(int(e))[p] for e, p in zip(epochs, pos)])
    return _take(self.features, rows)

  def eval_batches(self, max_batches: Optional[int] = None) -> Iterator[Batch]:
    """The rows in order, in batches; the last one padded with weight-0 rows."""
    count = -(-self.num_rows // self.batch_size)
    if max_batches is not None:
      count = min(count, max_batches)
    for b in range(count):
      rows = np.arange(b * self.batch_size, (b + 1) * self.batch_size)
      yield _take(self.features, np.where(rows < self.num_rows, rows, -1))


@gin.register(module="specjax.train")
@dataclasses.dataclass(frozen=True)
class DataConfig:
  """What to train on (see `specjax._train_data` for the batch layout)."""
  task: str = "lm"
  """'lm' (decoder-only), 'translate' or 'summarize' (T5)."""
  data_dir: Optional[str] = None
  """Prepared data (`python -m specjax.data prepare`); None: the bundled split,
  its first 1 - bundled_eval_fraction for training, the rest for evaluation."""
  batch_size: int = 16
  """Rows per training and evaluation batch."""
  seq_len: int = 128
  """lm: tokens per packed row."""
  inputs_length: int = 128
  """translate / summarize: encoder tokens per example (EOS included)."""
  targets_length: int = 64
  """translate / summarize: decoder tokens per example (EOS included)."""
  length_buckets: Tuple[int, ...] = ()
  """translate / summarize: cut each training batch to the smallest of these widths
  that holds its examples (one compilation per bucket; see `Batches`); () pads
  every batch to inputs_length / targets_length."""
  bundled_eval_fraction: float = 0.1
  """Share of the bundled split held out for evaluation when data_dir is None."""
  vocab_path: Optional[str] = None
  """SentencePiece model; None: the bundled 8k vocabulary."""
  seed: int = 0
  """Shuffling seed."""

  def __post_init__(self):
    check_task(self.task)
    for name in ("batch_size", "seq_len", "inputs_length", "targets_length"):
      check_int(self, name, 1)
    check_int(self, "seed", 0)


def data_files(data: DataConfig) -> List[Path]:
  """The files `make_batches` reads for `data` besides the package's own: the train and
  validation split files under `data_dir`, and `vocab_path`."""
  out = []
  if data.data_dir is not None:
    folder = TASKS[check_task(data.task)]
    out += [Path(data.data_dir) / folder / f"{split}.{data_lib.TASK_FILES[folder]}"
            for split in ("train", "validation")]
  if data.vocab_path is not None:
    out.append(Path(data.vocab_path))
  return out


def make_batches(data: DataConfig, model_config: Any) -> List[Batches]:
  """[train, validation] batches of `data` for a model of `model_config`.

  Raises:
    ValueError: a model family that does not fit the task, or a model vocabulary
      smaller than the SentencePiece model's.
  """
  task = data.task
  need = DecoderOnlyConfig if task == "lm" else T5Config
  if not isinstance(model_config, need):
    raise ValueError(f"task {task!r} trains a {need.__name__}, got {type(model_config).__name__}")
  vocab = vocab_lib.load_vocab(data.vocab_path)
  if model_config.vocab_size < vocab.vocab_size:
    raise ValueError(f"model vocab_size {model_config.vocab_size} is smaller than the "
                     f"vocabulary's {vocab.vocab_size} pieces")
  out = []
  for split in ("train", "validation"):
    examples = load_split(task, split, data.data_dir, data.bundled_eval_fraction)
    feats = make_features(task, examples, vocab, seq_len=data.seq_len,
                          inputs_length=data.inputs_length, targets_length=data.targets_length)
    buckets = data.length_buckets if task != "lm" and split == "train" else ()
    rows = len(next(iter(feats.values())))
    if split == "train" and data.batch_size > rows:
      raise ValueError(f"DataConfig.batch_size {data.batch_size} is larger than the {rows} "
                       f"rows of the train split" + (f" (packed rows of seq_len={data.seq_len})"
                                                     if task == "lm" else "")
                       + ": every batch would repeat rows; lower the batch size or add data")
    out.append(Batches(feats, data.batch_size, data.seed, buckets))
  return out
