"""A training set written by a teacher: the target's own outputs on the train inputs.

DistillSpec (Zhou et al., ICLR 2024) finds that a draft distilled on text the target
generated accepts more of its guesses than one distilled on the dataset: speculative
decoding only ever asks the draft to continue the target's own outputs. This module
decodes a prepared train split with a trained model and writes the result as a data
folder that `DataConfig.data_dir` reads like the prepared one:

  translate / summarize  each train source with the teacher's greedy (T = 0) or
                         sampled output as its target, `train.tsv`;
  lm                     each train document's first `prompt_tokens` tokens followed
                         by the teacher's continuation (up to EOS or the budget),
                         `train.txt`; with `past_eos` the whole budget, the documents
                         the teacher wrote after its EOS on the lines that follow.

The validation and test splits are copied unchanged, so held-out figures stay
comparable with a run on the original data. Decoding streams the inputs through
`batch` slots (`specjax.decode.stream`), in chunks of `chunk` examples written under
OUT/.parts/: an interrupted run resumes at the first missing chunk, and a chunk's
tokens depend only on (seed, example index), not on where the run stopped.

OUT/.parts/manifest.json records everything the chunks depend on: the teacher's
config and a hash of its weights, the sampling (temperature, seed), the limit, the
chunk size, the length settings, and content hashes of the source splits and the
vocabulary. Chunks written under another manifest are discarded and decoded again
(a warning names what changed), never reused. Every output is written under a
temporary name and renamed into place, and an --out that would write over an input
(the --data_dir's split files) is refused before any work.

  python -m specjax.train.teacher_data --teacher specjax/assets/pairs/translate/target \\
      --task translate --data_dir data/ --out data_kd/translate --limit 40000
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from specjax import checkpoints
from specjax import files
from specjax import command
from specjax.data import load_vocab
from specjax.data import splits as data_lib
from specjax.decode import DecodeConfig, autoregressive_decode
from specjax.data.inputs import cut_rows
from specjax.data.vocab import DEFAULT_MODEL as VOCAB_MODEL
from specjax.models import build_model
from specjax.params import flatten
from specjax.sampling import Sampling
from specjax.train.batches import TASKS, check_task
from specjax.train.checkpoints import read_trained_folder

log = logging.getLogger(__name__)


def load_folder_model(folder: str):
  """(model, float32 params) of a folder written by specjax.train (or a checkpoint_N)."""
  folder, config = read_trained_folder(folder, "teacher")
  model = build_model(config)
  return model, checkpoints.load_t5x_for_model(folder, model, dtype="float32")


def _clean(text: str) -> str:
  """One line of a split file: tabs and newlines become spaces."""
  return " ".join(text.replace("\t", " ").split())


def model_inputs(task: str, examples: Sequence, vocab, *, encoder_decoder: bool,
                 inputs_length: int, prompt_tokens: int) -> Tuple[np.ndarray, List[List[int]]]:
  """(int32 [N, L] decode inputs, the token ids each output is written after).

  Seq2seq: the source, cut to `inputs_length` with EOS kept; nothing is written before
  the output. LM: the first `prompt_tokens` tokens of the document (shorter documents
  whole), which the written document starts with.
  """
  if task == "lm":
    rows = [vocab.encode(doc)[:prompt_tokens] for doc in examples]
    rows = [r if r else [vocab.eos_id] for r in rows]
    heads = [list(r) for r in rows]
  else:
    rows = [vocab.encode(src) + [vocab.eos_id] for src, _ in examples]
    rows = cut_rows(rows, inputs_length, vocab.eos_id)
    heads = [[] for _ in rows]
  out = np.zeros((len(rows), max(len(r) for r in rows)), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out, heads


def _texts(task: str, examples: Sequence, heads: List[List[int]], tokens: np.ndarray,
           vocab, past_eos: bool = False) -> List[Tuple[str, Optional[str]]]:
  """Split-file examples from decoded tokens [N, T] (`vocab.decode` stops at the first EOS).
  LM with `past_eos`: the continuation cut at each EOS, one document per piece in order
  (training packs documents with EOS between them, in file order, so the packed stream is
  the decode's own, up to the vocabulary's decode-encode round trip and one EOS after the
  budget's last token)."""
  out = []
  for ex, head, row in zip(examples, heads, tokens):
    ids = head + [int(t) for t in row]
    if task == "lm" and past_eos:
      pieces, start = [], 0
      for i, t in enumerate(ids + [vocab.eos_id]):
        if t == vocab.eos_id:
          pieces.append(ids[start:i])
          start = i + 1
      out += [(text, None) for text in (_clean(vocab.decode(p)) for p in pieces) if text]
      continue
    text = _clean(vocab.decode(ids))
    if task == "lm":
      if text:
        out.append((text, None))
    elif text:
      out.append((_clean(ex[0]), text))
  return out


MANIFEST = "manifest.json"
MANIFEST_BYTES = files.MIB


def params_sha256(params: Any) -> str:
  """A sha256 over every parameter's name, dtype, shape and bytes (order-independent)."""
  digest = hashlib.sha256()
  for name, leaf in sorted(flatten(params), key=lambda item: item[0]):
    arr = np.ascontiguousarray(np.asarray(leaf))
    digest.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
    digest.update(arr.tobytes())
  return digest.hexdigest()


def check_out(src_dir: Path, out_dir: Path, ext: str) -> None:
  """ValueError if writing `out_dir` would write over an input split file (checked first)."""
  if out_dir.resolve() == src_dir.resolve():
    raise ValueError(f"--out would write {out_dir}, the folder of the input split files "
                     f"({src_dir}); give another --out (inputs are never overwritten)")
  inputs = [src_dir / f"{split}.{ext}" for split in data_lib.SPLITS]
  for split in data_lib.SPLITS:
    dest = out_dir / f"{split}.{ext}"
    for path in inputs:
      if dest.exists() and path.exists() and os.path.samefile(dest, path):
        raise ValueError(f"--out would write {dest}, which is the input {path}; give "
                         "another --out (inputs are never overwritten)")


def _reuse_parts(parts: Path, manifest: Dict[str, Any]) -> None:
  """Keeps the chunks under `parts` only if they were written under `manifest`."""
  path = parts / MANIFEST
  old = None
  if path.is_file():
    try:
      old = files.read_json(str(path), MANIFEST_BYTES, "the chunk manifest")
    except (OSError, ValueError):
      old = None
  if old == manifest:
    return
  if parts.exists():
    changed = (sorted(k for k in set(old) | set(manifest) if old.get(k) != manifest.get(k))
               if isinstance(old, dict) else ["no manifest"])
    log.warning("%s: discarding chunks of another run (it differs in %s)", parts,
                ", ".join(changed))
    shutil.rmtree(parts)
  parts.mkdir(parents=True)
  files.write_file(path, json.dumps(manifest, indent=1, sort_keys=True))


def check_settings(*, limit: Optional[int], batch: int, chunk: int, temperature: float,
                   inputs_length: int, max_new_tokens: int, prompt_tokens: int) -> None:
  """ValueError naming the first setting out of range (checked before any work)."""
  for name, value in (("limit", limit), ("batch", batch), ("chunk", chunk),
                      ("inputs_length", inputs_length), ("max_new_tokens", max_new_tokens),
                      ("prompt_tokens", prompt_tokens)):
    if value is None and name == "limit":
      continue
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f"--{name} must be a whole number of at least 1, got {value!r}")
  if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
          and temperature >= 0):
    raise ValueError(f"--temperature must be a finite number >= 0, got {temperature!r}")


def _train_examples(src_dir: Path, ext: str, task: str, limit: Optional[int]) -> List[Any]:
  """The first `limit` (all: None) train examples: (source, target) pairs, LM documents."""
  examples = data_lib.read_split(src_dir / f"train.{ext}")
  if task == "lm":
    examples = [s for s, _ in examples]
  if limit is not None:
    examples = examples[:limit]
  if not examples:
    raise ValueError(f"{src_dir}: the train split is empty")
  return examples


def write_teacher_split(teacher: str, task: str, data_dir: str, out: str, *,
                        limit: Optional[int] = None, batch: int = 32, chunk: int = 2048,
                        temperature: float = 0.0, seed: int = 0, inputs_length: int = 64,
                        max_new_tokens: int = 64, prompt_tokens: int = 16,
                        past_eos: bool = False) -> Path:
  """Decodes the train split of `task` under `data_dir` with `teacher`; returns the new
  train file. See the module docstring for the layout, chunks and resumption.

  Args:
    teacher: a model folder (model.gin + checkpoint_N/) of the task's family.
    task: 'lm', 'translate' or 'summarize'.
    data_dir: a folder written by `python -m specjax.data prepare`.
    out: the new data folder (created; its train split is replaced at the end, atomically).
    limit: decode only the first `limit` train examples (None: all).
    batch: decode slots.
    chunk: examples per written chunk.
    temperature: 0 greedy; otherwise sampled with one key per example (seed, index).
    seed: the sampling seed.
    inputs_length: seq2seq source length cap (as training's).
    max_new_tokens: output budget per example.
    prompt_tokens: LM: tokens of each document kept as the prompt.
    past_eos: LM: decode the whole budget past EOS (as a decode with EOS ignored does, e.g.
      the bundled feature-head runs) and write the continuation as the documents it holds,
      in order (`_texts`); a head then learns the target after its own EOS too.
  """
  check_settings(limit=limit, batch=batch, chunk=chunk, temperature=temperature,
                 inputs_length=inputs_length, max_new_tokens=max_new_tokens,
                 prompt_tokens=prompt_tokens)
  for name, path in (("--teacher", teacher), ("--data_dir", data_dir), ("--out", out)):
    files.check_local(path, name)
  check_task(task)
  if past_eos and task != "lm":
    raise ValueError(f"--past_eos is for the lm task (a document stream); {task!r} writes one "
                     "output per source")
  folder = TASKS[task]
  ext = data_lib.TASK_FILES[folder]
  src_dir, out_dir = Path(data_dir) / folder, Path(out) / folder
  check_out(src_dir, out_dir, ext)
  model, params = load_folder_model(teacher)
  if (task == "lm") == model.is_encoder_decoder:
    family = "an encoder-decoder" if model.is_encoder_decoder else "a decoder-only"
    raise ValueError(f"teacher {teacher} is {family} model; task {task!r} needs the other "
                     "family")
  examples = _train_examples(src_dir, ext, task, limit)
  vocab = load_vocab()
  config = DecodeConfig(sampling=Sampling(temperature=float(temperature)),
                        eos_id=-1 if past_eos else vocab.eos_id,
                        cache_len=prompt_tokens + max_new_tokens + 2 if task == "lm"
                        else max_new_tokens + 2)
  parts = out_dir / ".parts"
  _reuse_parts(parts, {
      "teacher_config": repr(model.config), "teacher_params_sha256": params_sha256(params),
      "task": task, "temperature": float(temperature), "seed": int(seed), "limit": limit,
      "chunk": int(chunk), "inputs_length": int(inputs_length),
      "max_new_tokens": int(max_new_tokens), "prompt_tokens": int(prompt_tokens),
      **({"past_eos": True} if past_eos else {}),
      "vocab_sha256": files.sha256(Path(VOCAB_MODEL)),
      "sources_sha256": {p.name: files.sha256(p) for p in sorted(src_dir.glob(f"*.{ext}"))
                         if p.stem in data_lib.SPLITS}})
  key = jax.random.PRNGKey(seed)
  t_start, done = time.perf_counter(), 0
  for start in range(0, len(examples), chunk):
    part = parts / f"part_{start:08d}.{ext}"
    if part.is_file():
      continue
    piece = examples[start:start + chunk]
    inputs, heads = model_inputs(task, piece, vocab, encoder_decoder=model.is_encoder_decoder,
                                 inputs_length=inputs_length, prompt_tokens=prompt_tokens)
    # One key per example, from its absolute index: chunks and slots never change a draw.
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(np.arange(start, start + len(piece)))
    result = autoregressive_decode(model, params, inputs, max_new_tokens=max_new_tokens,
                                   rng=keys, config=config, slots=min(batch, len(piece)))
    rows = _texts(task, piece, heads, np.asarray(result.tokens), vocab, past_eos)
    data_lib.write_split(part, rows)  # written under a temporary name, renamed into place
    done += len(piece)
    rate = done / max(time.perf_counter() - t_start, 1e-9)
    log.warning("%s: %d / %d examples (%.1f / s)", out_dir, start + len(piece), len(examples),
                rate)
  return _join_parts(parts, len(examples), chunk, src_dir, out_dir, ext)


def _join_parts(parts: Path, count: int, chunk: int, src_dir: Path, out_dir: Path,
                ext: str) -> Path:
  """Writes the chunks under `parts` as out_dir's train split, in order, and copies the
  held-out splits unchanged; returns the train file."""
  written = []
  for start in range(0, count, chunk):
    written += data_lib.read_split(parts / f"part_{start:08d}.{ext}")
  train = out_dir / f"train.{ext}"
  data_lib.write_split(train, written)
  for split in ("validation", "test"):
    path = src_dir / f"{split}.{ext}"
    if path.is_file():
      data_lib.copy_split(path, out_dir / f"{split}.{ext}")
  return train


def main(argv: Optional[Sequence[str]] = None) -> int:
  """CLI; see the module docstring."""
  p = command.ArgumentParser(prog="python -m specjax.train.teacher_data",
                             description=__doc__.split("\n")[0])
  p.add_argument("--teacher", required=True)
  p.add_argument("--task", required=True, choices=sorted(TASKS))
  p.add_argument("--data_dir", required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--limit", type=int, default=None)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--chunk", type=int, default=2048)
  p.add_argument("--temperature", type=float, default=0.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--inputs_length", type=int, default=64)
  p.add_argument("--max_new_tokens", type=int, default=64)
  p.add_argument("--prompt_tokens", type=int, default=16)
  p.add_argument("--past_eos", action="store_true",
                 help="lm: decode the whole budget past EOS, written as the documents it holds")
  args = p.parse_args(argv)
  logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
  train = write_teacher_split(args.teacher, args.task, args.data_dir, args.out,
                              limit=args.limit, batch=args.batch, chunk=args.chunk,
                              temperature=args.temperature, seed=args.seed,
                              inputs_length=args.inputs_length,
                              max_new_tokens=args.max_new_tokens,
                              prompt_tokens=args.prompt_tokens, past_eos=args.past_eos)
  print(train)
  return 0


def cli(argv: Optional[Sequence[str]] = None) -> int:
  """The command: `main` with the project's error contract (`specjax: error: ...`, exit 2;
  130 on Ctrl-C)."""
  return command.run_cli(main, argv)


if __name__ == "__main__":
  sys.exit(cli())
