"""Shared plumbing of the experiment modules: pairs, inputs, timing, output files.

Where a pair comes from (in this order):
1. gin: `TARGET_MODEL` / `DRAFT_MODEL` (model gin files) and `TARGET_CHECKPOINT` /
   `DRAFT_CHECKPOINT` (T5X checkpoints, or None for random init), as in runs/decode.gin;
   the run then uses that one pair, named 'gin'.
2. a preset, `--pair lm|translate`: the bundled pair (`specjax.app.bundled`,
   `specjax/assets/pairs/NAME/{target,draft}/`, made by experiments/train_bundled.py);
3. while those are not shipped: a random-init tiny pair of the preset's family, labelled
   "random init: numbers are meaningless" in every output.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import functools
import io
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import gin
import jax
import jax.numpy as jnp
import numpy as np

from specjax import timing
from specjax.checks import check_bool, check_int  # noqa: F401  (experiments' argument checks)
from specjax.app import bundled, gin_config
from specjax.data import load_bundled
from specjax.app import build_model, encode_inputs, load_model
from specjax.models.decoder_only import DecoderOnlyConfig
from specjax.models.t5 import T5Config
from specjax.data import load_vocab
from specjax.params import WEIGHTS_DTYPES, cast_kernels

RANDOM_NOTE = "random init: numbers are meaningless"
V = 8192  # the bundled SentencePiece vocabulary
RANDOM_CONFIGS = {  # tiny stand-ins with the real vocabulary
    "lm": (DecoderOnlyConfig(vocab_size=V, emb_dim=64, num_heads=4, num_layers=2, head_dim=16,
                             mlp_dim=128),
           DecoderOnlyConfig(vocab_size=V, emb_dim=32, num_heads=2, num_layers=1, head_dim=16,
                             mlp_dim=64)),
    "translate": (T5Config(vocab_size=V, emb_dim=64, num_heads=4, num_encoder_layers=2,
                           num_decoder_layers=2, head_dim=16, mlp_dim=128),
                  T5Config(vocab_size=V, emb_dim=32, num_heads=2, num_encoder_layers=1,
                           num_decoder_layers=1, head_dim=16, mlp_dim=64)),
}


@dataclasses.dataclass
class Pair(bundled.BundledPair):
  """A target/draft pair and where it came from ('gin' pairs as well as the bundled ones)."""
  source: str
  """Human-readable origin (checkpoint paths, or RANDOM_NOTE)."""

  @property
  def random_init(self) -> bool:
    return self.source.startswith("random init")

  @property
  def label(self) -> str:
    return f"{self.name} ({self.source})"


def pair_from_gin(seed: int) -> Pair:
  """The pair gin names: TARGET_MODEL / DRAFT_MODEL, TARGET_CHECKPOINT / DRAFT_CHECKPOINT
  (None: random init) and PAIR_TASK (default: by model family)."""
  target_ckpt = gin_config.query_macro("TARGET_CHECKPOINT")
  draft_ckpt = gin_config.query_macro("DRAFT_CHECKPOINT")
  for name, value in (("TARGET_CHECKPOINT", target_ckpt), ("DRAFT_CHECKPOINT", draft_ckpt)):
    if value is not None and not isinstance(value, str):
      raise ValueError(f"{name} must be a checkpoint path or None, got {value!r}")
  target, target_params = load_model(target_ckpt, "target", seed)
  draft, draft_params = load_model(draft_ckpt, "draft", seed + 1)
  task = gin_config.query_macro("PAIR_TASK") or (
      "translate_en_de" if target.is_encoder_decoder else "lm_ddtp_en")
  source = (f"target {target_ckpt}, draft {draft_ckpt}" if target_ckpt and draft_ckpt
            else RANDOM_NOTE)
  return Pair("gin", task, target, target_params, draft, draft_params, source)


def with_weights(pair: Pair, weights_dtype: str, draft_weights_dtype: str = "float32") -> Pair:
  """The pair with the target's weights (dense kernels and token embedding,
  `cast_kernels`) cast to `weights_dtype` and the draft's to `draft_weights_dtype`
  (labelled in source)."""
  target_params, draft_params, notes = pair.target_params, pair.draft_params, []
  if weights_dtype != "float32":
    target_params = cast_kernels(target_params, WEIGHTS_DTYPES[weights_dtype])
    notes.append(f"target weights {weights_dtype}")
  if draft_weights_dtype != "float32":
    draft_params = cast_kernels(draft_params, WEIGHTS_DTYPES[draft_weights_dtype])
    notes.append(f"draft weights {draft_weights_dtype}")
  if not notes:
    return pair
  return dataclasses.replace(pair, target_params=target_params, draft_params=draft_params,
                             source="; ".join([pair.source] + notes))


def load_pair(name: str, seed: int = 0) -> Pair:
  """A preset pair: the bundled trained checkpoints when shipped, else random init (labelled)."""
  if name not in bundled.PAIRS:
    raise ValueError(f"unknown pair {name!r}; expected one of {sorted(bundled.PAIRS)}")
  if bundled.available(name, "target") and bundled.available(name, "draft"):
    target, tp = bundled.load(name, "target")
    draft, dp = bundled.load(name, "draft")
    source = ", ".join(str(bundled.checkpoint_dir(name, r).relative_to(bundled.PAIRS_DIR.parent))
                       for r in ("target", "draft"))
    return Pair(name, bundled.PAIRS[name], target, tp, draft, dp, f"trained: {source}")
  target_cfg, draft_cfg = RANDOM_CONFIGS[name]
  target, draft = build_model(target_cfg), build_model(draft_cfg)
  return Pair(name, bundled.PAIRS[name], target, target.init(jax.random.PRNGKey(seed)), draft,
              draft.init(jax.random.PRNGKey(seed + 1)), RANDOM_NOTE)


def tiny_model(pair: Pair, seed: int = 7):
  """(model, params) of the small third model of hierarchical drafting, or None.

  The bundled PAIR/tiny for a trained pair; a random-init one beside a random-init
  pair (smoke runs); None when a trained pair has none shipped.
  """
  if not pair.random_init and bundled.available(pair.name, "tiny"):
    return bundled.load(pair.name, "tiny")
  if pair.random_init:
    family = "lm" if not pair.target.is_encoder_decoder else "translate"
    small = dataclasses.replace(RANDOM_CONFIGS[family][1], emb_dim=16, mlp_dim=32)
    model = build_model(small)
    return model, model.init(jax.random.PRNGKey(seed))
  return None


# ------------------------------------------------------------------ command line


@dataclasses.dataclass
class Cli:
  pairs: List[Pair]
  output_dir: Path
  fast: bool
  flags: Dict[str, Any] = dataclasses.field(default_factory=dict)
  """The module's own flags (`parse_cli`'s `flags`), by destination name."""


def parse_cli(argv: Optional[Sequence[str]], description: str, name: str,
              default_pairs: Sequence[str] = ("lm", "translate"),
              needs_pairs: Union[bool, Callable[[Dict[str, Any]], bool]] = True,
              flags: Optional[Dict[str, Dict[str, Any]]] = None) -> Cli:
  """gin flags (T5X style) plus --pair (repeatable), --fast and --output_dir.

  `--fast` asks for the module's FAST settings (tests, smoke runs); they win over
  gin. Pairs are loaded before the experiment's own gin settings are parsed
  again, since a preset pair parses its own model gin files.
  flags: the module's own flags, '--name' -> `argparse.add_argument` keywords (in Cli.flags);
  needs_pairs: whether pairs are loaded, or a function of those flags that says so.
  """
  argv = sys.argv[1:] if argv is None else list(argv)
  files, bindings, paths, rest = gin_config.split_gin_args(argv)
  parser = argparse.ArgumentParser(description=description,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--pair", action="append", choices=sorted(bundled.PAIRS),
                      help="a preset pair (repeatable; default: both)")
  parser.add_argument("--fast", action="store_true", help="tiny settings (tests, smoke runs)")
  parser.add_argument("--output_dir", default=f"out/experiments/{name}")
  parser.add_argument("--seed", type=int, default=0)
  add_weights_flags(parser)
  actions = [parser.add_argument(flag, **kwargs) for flag, kwargs in (flags or {}).items()]
  args = parser.parse_args(rest)
  own = {action.dest: getattr(args, action.dest) for action in actions}
  if callable(needs_pairs):
    needs_pairs = needs_pairs(own)

  def reparse():
    gin.clear_config()
    gin_config.parse(files, bindings, paths)

  reparse()
  pairs = []
  if needs_pairs:
    if isinstance(gin_config.query_macro("TARGET_MODEL"), str):
      if args.pair:
        raise ValueError("give either --pair or TARGET_MODEL/DRAFT_MODEL in gin, not both")
      pairs = [pair_from_gin(args.seed)]
    else:
      for pair_name in args.pair or default_pairs:
        pairs.append(load_pair(pair_name, args.seed))
      reparse()
  pairs = [with_weights(pair, args.weights_dtype, args.draft_weights_dtype) for pair in pairs]
  return Cli(pairs=pairs, output_dir=Path(args.output_dir), fast=args.fast, flags=own)


def add_weights_flags(parser: argparse.ArgumentParser, default: str = "float32") -> None:
  """--weights_dtype (the target's, default `default`) and --draft_weights_dtype: the dtypes
  the pair's dense kernels and embedding run in (`with_weights`)."""
  parser.add_argument("--weights_dtype", choices=sorted(WEIGHTS_DTYPES), default=default,
                      help="run the target's dense kernels and embedding in this dtype "
                      "(cast once)")
  parser.add_argument("--draft_weights_dtype", choices=sorted(WEIGHTS_DTYPES),
                      default="float32", help="the same for the draft model")


def cli_main(run: Callable[..., Any], name: str, description: str, fast: Dict[str, Any],
             **parse_kwargs: Any) -> Callable[[Optional[Sequence[str]]], Any]:
  """The `main(argv=None)` of a gin-configured experiment: `parse_cli(argv, description, name,
  **parse_kwargs)`, then `run(cli)`, with the `fast` settings under --fast."""
  def main(argv: Optional[Sequence[str]] = None) -> Any:
    cli = parse_cli(argv, description, name, **parse_kwargs)
    return run(cli, **(fast if cli.fast else {}))
  return main


def gin_overrides(argv: Optional[Sequence[str]], runs: str) -> Tuple[List[str], List[str]]:
  """(--gin.NAME=VALUE bindings, the other arguments) of a module whose gin run files are
  fixed (`runs` names them in the error); ValueError on --gin_file."""
  files, bindings, _, rest = gin_config.split_gin_args(sys.argv[1:] if argv is None else argv)
  if files:
    raise ValueError(f"the run files are fixed ({runs}); pass --gin.NAME=VALUE overrides only")
  return list(bindings), list(rest)


# ------------------------------------------------------------------------ inputs


@dataclasses.dataclass
class Examples:
  """Bundled evaluation examples of a pair's task, padded to one width."""
  inputs: np.ndarray  # int32 [N, W]: encoder inputs (T5) or left-aligned prompts, 0-padded
  texts: List[str]  # the source sentences / prompts
  references: List[Optional[str]]  # German references (translation) or None


def examples(pair: Pair, num: int, max_input_len: int = 32, prompt_words: int = 8,
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
  root = Path(__file__).resolve().parent.parent / "data" / pair.task
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


# ------------------------------------------------------------------------ checks


def check_counts(**named: Any) -> None:
  """Each keyword an integer >= 1, or a tuple / list of them (`check_int`)."""
  for name, value in named.items():
    for item in (value if isinstance(value, (tuple, list)) else (value,)):
      check_int(name, item, low=1)


# ------------------------------------------------------------------------ timing


def passes_for(seconds_per_pass: float, min_seconds: float, *, low: int = 1,
               high: Optional[int] = None) -> int:
  """Timed passes that hold at least `min_seconds` when one takes `seconds_per_pass`,
  clipped to [low, high]."""
  passes = max(int(np.ceil(min_seconds / max(seconds_per_pass, 1e-9))), low)
  return passes if high is None else min(passes, high)


def time_interleaved(runs: Dict[str, Callable[[np.ndarray], Any]], inputs: np.ndarray,
                     repeats: int) -> Tuple[Dict[str, float], Dict[str, float], Dict[str, Dict]]:
  """Batch-1 timings of several decoders over the rows of `inputs`, interleaved.

  runs: name -> fn(row int32 [1, W]) returning a DecodeResult. Each row is decoded by every
  decoder in `repeats` passes (`specjax.timing.interleaved`; the first row's warm-up compiles),
  and the per-row medians are summed.
  Returns (compile seconds: the first row's warm-up less its median run, summed median
  seconds, per-name totals of one run of each row: tokens, target_calls, alpha_sum,
  alpha_count).
  """
  compile_s: Dict[str, float] = {}
  seconds = {name: 0.0 for name in runs}
  stats = {name: dict(tokens=0, target_calls=0, alpha_sum=0.0, alpha_count=0) for name in runs}
  for i in range(len(inputs)):
    row = inputs[i:i + 1]
    t = timing.interleaved({name: functools.partial(fn, row) for name, fn in runs.items()},
                           repeats, warmup=i == 0)
    compile_s = compile_s or dict(t.compile_s)
    for name in runs:
      seconds[name] += t.median(name)
      out, st = t.outputs[name], stats[name]
      st["tokens"] += int(out.lengths[0])
      st["target_calls"] += int(out.target_calls[0])
      st["alpha_sum"] += float(out.alpha_sum[0])
      st["alpha_count"] += int(out.alpha_count[0])
  return compile_s, seconds, stats


Run = Tuple[Callable[[], Any], int]
"""(a zero-argument call, the model calls / steps it makes): `decode_loop`, `propose_loop`,
`verify_loop`."""


def ms_per_call(runs: Dict[str, Run], repeats: int) -> Tuple[Dict[str, float], timing.Timings]:
  """Median ms per model call of each run (`specjax.timing.interleaved`, warm-up apart), and the
  timings themselves (the runs' outputs among them)."""
  t = timing.interleaved({name: fn for name, (fn, _) in runs.items()}, repeats)
  return {name: 1e3 * t.median(name) / calls for name, (_, calls) in runs.items()}, t


def decode_loop(model, params, batch: int, cache_len: int, k: int, *, encoded: Any = None,
                position: int = 20, calls: int = 40) -> Run:
  """`calls` k-token `model.decode` calls at `batch` rows, in one jitted `fori_loop` with the
  cache carried: the calls as the decode loops make them (loop-invariant work hoisted out of
  the loop, dispatch not counted). Rows sit at slots `position` + 0..7, apart; results are
  folded into the carry so that XLA cannot drop them. Compiles on its first call."""
  cache = model.init_cache(batch, cache_len)

  @jax.jit
  def loop(params, cache, encoded):
    def body(i, carry):
      cache, acc = carry
      positions = position + (i + jnp.arange(batch, dtype=jnp.int32)) % 8
      logits, cache = model.decode(params, cache, jnp.full((batch, k), 5, jnp.int32),
                                   positions, encoded)
      return cache, acc + jnp.argmax(logits[:, -1], -1).sum().astype(jnp.float32)
    return jax.lax.fori_loop(0, calls, body, (cache, 0.0))[1]

  return (lambda: loop(params, cache, encoded)), calls


def propose_loop(drafter, params, prompts: np.ndarray, cache_len: int, gamma: int,
                 n: int = 30) -> Run:
  """n drafter proposals of `gamma` guesses per row (catch-up window included), greedy, in one
  jitted loop. prompts: int32 [B, W]. Compiles on its first call."""
  from specjax.sampling import Sampling  # pylint: disable=import-outside-toplevel
  batch = prompts.shape[0]
  seq = np.zeros((batch, cache_len), np.int32)
  seq[:, :prompts.shape[1]] = prompts
  length = jnp.full((batch,), prompts.shape[1], jnp.int32)
  gammas = jnp.full((batch,), gamma, jnp.int32)

  @jax.jit
  def loop(params, seq, length):
    state = drafter.init(params, jnp.asarray(prompts), seq, length, cache_len)
    keys = jax.random.split(jax.random.PRNGKey(0), batch)

    def body(i, carry):
      state, acc = carry
      proposal, state = drafter.propose(params, state, seq, length + i, gammas, keys,
                                       Sampling(temperature=0.0))
      state = drafter.update(state, jnp.full((batch,), 2, jnp.int32), gammas)
      return state, acc + proposal.probs[:, 0, 0].sum() + proposal.tokens[:, 0].sum()
    return jax.lax.fori_loop(0, n, body, (state, 0.0))[1]
  return (lambda: loop(params, seq, length)), n


def verify_loop(config, batch: int, gamma: int, vocab: int, n: int = 50) -> Run:
  """n verification steps (Algorithm 1 on γ+1 target and γ draft distributions per row) of
  `config`'s verifier, in one jitted loop. Compiles on its first call."""
  from specjax.verify import verify_batch  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(batch, gamma + 1, vocab)).astype(np.float32))
  q = jax.nn.softmax(jnp.asarray(rng.normal(size=(batch, gamma, vocab)).astype(np.float32)), -1)
  guesses = jnp.zeros((batch, gamma), jnp.int32)
  keys = jax.random.split(jax.random.PRNGKey(0), batch)

  @jax.jit
  def loop(logits, q):
    def body(i, acc):
      n_acc, _, overlap = verify_batch(config.sampling, config.verifier, config.lenience, keys,
                                       jnp.full((batch,), 10 + i, jnp.int32), guesses, q,
                                       logits + acc, jnp.full((batch,), gamma, jnp.int32))
      return acc + 1e-6 * n_acc.sum().astype(jnp.float32) + overlap[0, 0]
    return jax.lax.fori_loop(0, n, body, 0.0)
  return (lambda: loop(logits, q)), n


def cost_ratios(pair: Pair, inputs: np.ndarray, gammas: Sequence[int], cache_len: int,
                repeats: int, calls: int = 40) -> Dict:
  """c = draft step / target step (k = 1) and r(γ) = target (γ+1)-token call / 1-token call,
  from in-loop `decode` calls at batch 1 (`decode_loop`), all interleaved, medians of `repeats`.

  inputs: int32 [1, W] (encoded once per model for an encoder-decoder); the k tokens sit in a
  generation's middle: at W // 2 (+ 0..7) for an LM, at 8 for an encoder-decoder's decoder.
  Returns {'c', 'target_step_s', 'draft_step_s', 'r': {γ: r(γ)}}.
  """
  position = 8 if pair.target.is_encoder_decoder else inputs.shape[1] // 2

  def loop(model, params, k):
    encoded = model.encode(params, jnp.asarray(inputs)) if model.is_encoder_decoder else None
    return decode_loop(model, params, 1, cache_len, k, encoded=encoded, position=position,
                       calls=calls)

  ks = sorted({1, *[g + 1 for g in gammas]})
  runs = {f"target k={k}": loop(pair.target, pair.target_params, k) for k in ks}
  runs["draft k=1"] = loop(pair.draft, pair.draft_params, 1)
  ms, _ = ms_per_call(runs, repeats)
  target = {k: ms[f"target k={k}"] / 1e3 for k in ks}
  draft = ms["draft k=1"] / 1e3
  return {"c": draft / target[1], "target_step_s": target[1], "draft_step_s": draft,
          "r": {g: target[g + 1] / target[1] for g in gammas}}


# ------------------------------------------------------------------------ output


def fmt(value: Any) -> str:
  """Table cell: floats to 3 significant digits."""
  if isinstance(value, (float, np.floating)):
    return f"{float(value):.3g}"
  return str(value)


def markdown_table(rows: Sequence[Dict[str, Any]], columns: Optional[Sequence[str]] = None,
                   cell: Optional[Callable[[Any], str]] = None) -> str:
  """A GitHub markdown table of dict rows (columns: the first row's keys by default; cells
  written by `cell`, default `fmt`)."""
  cell = cell or fmt
  if not rows:
    raise ValueError("markdown_table needs at least one row")
  columns = list(columns or rows[0].keys())
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
  return "\n".join(lines)


class Output:
  """An experiment's output folder: NAME.md, NAME.csv, NAME.json and PNG plots."""

  def __init__(self, folder: os.PathLike, name: str):
    self.folder, self.name = Path(folder), name
    self.folder.mkdir(parents=True, exist_ok=True)
    self.written: List[Path] = []

  def path(self, filename: str) -> Path:
    path = self.folder / filename
    self.written.append(path)
    return path

  def markdown(self, text: str, filename: Optional[str] = None) -> None:
    self.path(filename or f"{self.name}.md").write_text(text.rstrip() + "\n", encoding="utf-8")

  def csv(self, rows: Sequence[Dict[str, Any]], filename: Optional[str] = None) -> None:
    if not rows:
      raise ValueError("no rows to write")
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    self.path(filename or f"{self.name}.csv").write_text(buf.getvalue(), encoding="utf-8")

  def json(self, obj: Any, filename: Optional[str] = None) -> None:
    self.path(filename or f"{self.name}.json").write_text(
        json.dumps(obj, indent=1, ensure_ascii=False, default=_json_default), encoding="utf-8")

  def tables(self, md: str, rows: Sequence[Dict[str, Any]], pairs, **extra: Any) -> None:
    """Writes NAME.md, NAME.csv and NAME.json (rows, the pairs' sources and `extra`)."""
    self.markdown(md)
    self.csv(rows)
    self.json({"pairs": {p.name: p.source for p in pairs}, **extra, "rows": rows})

  def report(self, md: str, rows: Sequence[Dict[str, Any]], pairs,
             plot: Optional[Callable[[], None]] = None) -> Sequence[Dict[str, Any]]:
    """The tables (`tables`), the plot when given, the announcement; returns the rows."""
    self.tables(md, rows, pairs)
    if plot is not None:
      plot()
    self.announce()
    return rows

  def png(self, figure, filename: str) -> None:
    figure.savefig(self.path(filename), dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    plt.close(figure)

  @contextlib.contextmanager
  def figure(self, filename: str, figsize: Tuple[float, float], ncols: int = 1):
    """A new figure's axes (one, or a tuple of `ncols`), saved as `filename` on exit."""
    fig, axes = pyplot().subplots(1, ncols, figsize=figsize)
    yield axes
    self.png(fig, filename)

  def announce(self) -> None:
    """Prints the files written so far."""
    print(f"wrote {', '.join(str(p) for p in self.written)}")


def _json_default(x):
  if isinstance(x, (np.integer,)):
    return int(x)
  if isinstance(x, (np.floating,)):
    return float(x)
  if isinstance(x, np.ndarray):
    return x.tolist()
  return str(x)


def pyplot():
  """matplotlib.pyplot on the Agg backend (extra: `pip install matplotlib`)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def header(title: str, pairs: Sequence[Pair], notes: Sequence[str] = ()) -> str:
  """Markdown title with each pair's origin; a loud line for random-init pairs."""
  lines = [f"# {title}", ""]
  for pair in pairs:
    lines.append(f"- pair **{pair.name}** ({pair.task}): {pair.source}")
  if any(p.random_init for p in pairs):
    lines += ["", f"**WARNING: {RANDOM_NOTE}** (trained pairs are not shipped yet)"]
  lines += ["", f"- device: {jax.devices()[0].platform}, jax {jax.__version__}"]
  lines += [f"- {n}" for n in notes]
  return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- decoding


def decode_config(temperature: float, cache_len: int, lenience: float = 1.0,
                  trace: bool = False, eos_id: int = -1):
  """DecodeConfig for experiments. eos_id -1 (default) generates the full budget, so
  timings compare equal lengths; texts are cut at the first EOS afterwards."""
  from specjax.decode import DecodeConfig  # pylint: disable=import-outside-toplevel
  from specjax.sampling import Sampling  # pylint: disable=import-outside-toplevel
  return DecodeConfig(sampling=Sampling(temperature=float(temperature)), eos_id=eos_id,
                      lenience=lenience, trace=trace, cache_len=cache_len)


def model_drafter(pair: Pair, max_gamma: int):
  """(ModelDrafter of the pair's draft, its params)."""
  from specjax.draft import ModelDrafter  # pylint: disable=import-outside-toplevel
  return ModelDrafter(pair.draft, max_gamma=max_gamma), pair.draft_params
