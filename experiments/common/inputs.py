"""What the experiments decode and how they score it: the bundled evaluation examples, n-gram
training corpora, generated ids, BLEU and perplexity."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import jax
import numpy as np

from experiments.common.pairs import Pair
from specjax.app import encode_inputs
from specjax.checks import check_int
from specjax.data import load_bundled, load_vocab

@dataclasses.dataclass
class Examples:
  """Bundled evaluation examples of a pair's task, padded to one width."""
  inputs: np.ndarray  # int32 [N, W]: encoder inputs (T5) or left-aligned prompts, 0-padded
  texts: List[str]  # the source sentences / prompts
  references: List[Optional[str]]  # German references (translation) or None


def load_examples(pair: Pair, num: int, max_input_len: int = 32, prompt_words: int = 8,
             skip: int = 0) -> Examples:
  """The first `num` examples (after `skip`) of the pair's bundled split."""
  check_int("num examples", num, low=1)
  vocab = load_vocab()
  data = load_bundled(pair.task)[skip: skip + num]
  if pair.task == "lm_ddtp_en":
    texts, refs = [" ".join(d.split()[:prompt_words]) for d in data], [None] * len(data)
  else:
    texts, refs = [s for s, _ in data], [t for _, t in data]
  inputs = encode_inputs(vocab, texts, pair.target.is_encoder_decoder, max_input_len)
  padded = np.zeros((len(texts), max_input_len), np.int32)
  padded[:, :inputs.shape[1]] = inputs
  return Examples(padded, texts, refs)


def ngram_corpus(pair: Pair, limit: int = 2000) -> Tuple[List[List[int]], str]:
  """Token lists to fit unigram/bigram drafts on: the task's train split when
  data/ is prepared, else bundled examples 500.. (disjoint from the evaluated ones)."""
  vocab = load_vocab()
  root = Path(__file__).resolve().parents[2] / "data" / pair.task
  train = root / ("train.txt" if pair.task == "lm_ddtp_en" else "train.tsv")
  if train.exists():
    with open(train, encoding="utf-8") as f:
      lines = [next(f, "") for _ in range(limit)]
    texts = [l.rstrip("\n").split("\t")[-1] for l in lines if l.strip()]
    where = f"{train} (first {len(texts)} lines)"
  else:
    data = load_bundled(pair.task)[500:500 + limit]
    texts = [d if isinstance(d, str) else d[1] for d in data]
    where = f"bundled {pair.task} examples 500..{500 + len(texts)}"
  return [vocab.encode(t) + [vocab.eos_id] for t in texts], where


def pad_rows(rows: np.ndarray, batch: int) -> np.ndarray:
  """rows [n, W] padded to [batch, W] by repeating the first row (one compiled shape)."""
  if len(rows) == batch:
    return rows
  return np.concatenate([rows, np.repeat(rows[:1], batch - len(rows), 0)])


def output_ids(tokens: np.ndarray, length: int, eos_id: int = 1) -> List[int]:
  """Generated ids up to (excluding) the first EOS."""
  ids = [int(t) for t in np.asarray(tokens)[:length]]
  return ids[:ids.index(eos_id)] if eos_id in ids else ids


def bleu(references: Sequence[str], hypotheses: Sequence[str]) -> float:
  """Corpus BLEU (sacrebleu, 13a) in [0, 100]."""
  import sacrebleu  # pylint: disable=import-outside-toplevel
  return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def perplexity(pair: Pair, inputs: np.ndarray, outputs: Sequence[Sequence[int]]) -> float:
  """exp(mean NLL) of generated tokens under the target, teacher forced.

  inputs: int32 [N, W] as decoded; outputs: N id lists (EOS already cut: an EOS is
  appended and scored for the encoder-decoder, whose outputs end there).
  """
  total, count = 0.0, 0
  model, params = pair.target, pair.target_params
  for row, out in zip(inputs, outputs):
    if model.is_encoder_decoder:
      target = list(out) + [1]
      dec = np.array([[0] + target[:-1]], np.int32)
      logp = jax.nn.log_softmax(model.logits(params, row[None], dec)[0], -1)
      nll = -np.asarray(logp)[np.arange(len(target)), target]
    else:
      if not out:
        continue
      prompt = [int(t) for t in row if t != 0]
      seq = np.array([prompt + list(out)], np.int32)
      logp = np.asarray(jax.nn.log_softmax(model.logits(params, seq)[0], -1))
      pos = np.arange(len(prompt) - 1, len(prompt) - 1 + len(out))
      nll = -logp[pos, np.asarray(out)]
    total, count = total + float(nll.sum()), count + len(nll)
  return float(np.exp(total / max(count, 1)))
