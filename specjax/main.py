"""The main job: decode with a target/draft pair, autoregressive vs speculative.

  python -m specjax.main                                   # the bundled default
  python -m specjax.main --gin_file=runs/decode.gin \\
      --gin.TARGET_CHECKPOINT="'/ckpt/t5_xxl'" --gin.TARGET_MODEL="'models/t5_1_1_xxl.gin'" \\
      --gin.DRAFT_CHECKPOINT="'/ckpt/t5_small'" --gin.DRAFT_MODEL="'models/t5_1_1_small.gin'" \\
      --prompt "translate English to German: The house is wonderful."

Prints the outputs, a Figure-1 trace of the first example and a summary table
(α, tokens per target call, walltimes, speedup, greedy identity); writes the
same as JSON lines to `output_dir`.

Many devices: `--gin.NUM_PARTITIONS=8` splits each model over 8 devices (the
'model' mesh axis; the rest of `jax.devices()` is the 'data' axis, see
`specjax.sharding`). Multi-host: call `jax.distributed.initialize()` first on
every host and run this same command on each (jax.devices() then spans all).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import gin
import jax
import numpy as np
from rich.console import Console
from rich.progress import Progress

from specjax import bundled, gin_config, report
from specjax.checkpoints import load_sharded, load_t5x_for_model
from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.decode.inputs import check_cache_size, check_count, drafter_models
from specjax.draft import ModelDrafter, PromptLookupDrafter
from specjax.models import build_model
from specjax.sampling import Sampling
from specjax.sharding import Partitioner
from specjax.verify import ReferenceVerifier, describe
from specjax.data import load_vocab


def load_model(checkpoint: Optional[str], scope: str, seed: int,
               partitioner: Optional[Partitioner] = None):
  """(model, params): the config bound under `scope`, weights from a T5X checkpoint.

  checkpoint None means random initialization (seeded): only for smoke runs;
  'bundled:PAIR/ROLE' is a shipped model (`specjax.bundled`).
  With a partitioner the params come back placed in their shardings.
  """
  model = build_model(gin_config.model_config(scope))
  return model, load_params(model, checkpoint, seed, partitioner)


def load_params(model, checkpoint: Optional[str], seed: int,
                partitioner: Optional[Partitioner] = None):
  """`model`'s params from a T5X checkpoint (None: random init; 'bundled:...': shipped)."""
  checkpoint = bundled.resolve(checkpoint, "checkpoint")
  if checkpoint is None:
    params = model.init(jax.random.PRNGKey(seed))
    return params if partitioner is None else partitioner.shard_params(params)
  if partitioner is not None:
    return load_sharded(checkpoint, model, partitioner, dtype="float32")
  return jax.tree.map(jax.numpy.asarray, load_t5x_for_model(checkpoint, model, dtype="float32"))


def encode_inputs(vocab, texts: Sequence[str], encoder_decoder: bool, max_len: int) -> np.ndarray:
  """Texts -> int32 [B, L] (0-padded). Encoder inputs end with EOS; LM prompts do not.

  A text longer than `max_len` tokens is cut to its first max_len - 1 tokens + EOS (T5) or
  first max_len tokens (LM), with a logged warning naming the example.
  """
  rows = []
  keep = max_len - 1 if encoder_decoder else max_len
  for index, text in enumerate(texts):
    ids = vocab.encode(text)
    if len(ids) > keep:
      logging.warning("input %d has %d tokens, more than max_input_len=%d: keeping its first %d "
                      "tokens%s and dropping the last %d", index, len(ids), max_len, keep,
                      " + EOS" if encoder_decoder else "", len(ids) - keep)
      ids = ids[:keep]
    rows.append(ids + [vocab.eos_id] if encoder_decoder else ids)
  width = max(len(r) for r in rows)
  out = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out


def check_settings(*, drafter: str, gamma: Any, max_gamma: Any, max_new_tokens: Any,
                   batch_size: Any, max_input_len: Any, seed: Any) -> int:
  """ValueError naming the first bad setting of `decode_job` (nothing loaded yet).

  Returns max_gamma (gamma when None)."""
  if drafter not in ("model", "prompt_lookup"):
    raise ValueError(f"drafter must be 'model' or 'prompt_lookup', got {drafter!r}")
  gamma = check_count("gamma", gamma)
  max_gamma = gamma if max_gamma is None else check_count("max_gamma", max_gamma)
  if gamma > max_gamma:
    raise ValueError(f"gamma must be in [1, max_gamma={max_gamma}], got {gamma}")
  check_count("max_new_tokens", max_new_tokens)
  check_count("batch_size", batch_size)
  if check_count("max_input_len", max_input_len) < 2:
    raise ValueError(f"max_input_len must be >= 2 (a token and EOS), got {max_input_len}")
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
    raise ValueError(f"seed must be an integer, got {seed!r}")
  return max_gamma


def prepare_output_dir(output_dir: Optional[str]) -> None:
  """Creates `output_dir` and checks a file can be written there (before any decoding)."""
  if not output_dir:
    return
  probe = os.path.join(output_dir, ".specjax_write_test")
  try:
    os.makedirs(output_dir, exist_ok=True)
    with open(probe, "w", encoding="utf-8") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ValueError(f"output_dir '{output_dir}' is not writable: {e}") from e


def _timed(fn):
  start = time.perf_counter()
  out = fn()
  jax.block_until_ready(out.tokens)
  return out, time.perf_counter() - start


@gin.register(module="specjax.main")
def decode_job(texts: Sequence[str], *, target_checkpoint: Optional[str] = None,
               draft_checkpoint: Optional[str] = None, drafter: str = "model", gamma: int = 4,
               max_gamma: Optional[int] = None, max_new_tokens: int = 32,
               sampling: Sampling = Sampling(temperature=0.0), lenience: float = 1.0,
               batch_size: int = 8, max_input_len: int = 128, seed: int = 0,
               verifier=ReferenceVerifier(),
               output_dir: Optional[str] = "out/decode", plain: bool = False,
               partitioner: Optional[Partitioner] = None,
               console: Optional[Console] = None,
               on_batch: Optional[Callable[[int, int], None]] = None) -> Dict[str, Any]:
  """Runs autoregressive and speculative decoding on `texts`; prints and writes a report.

  Args:
    texts: the inputs (source sentences for T5, prompts for a decoder-only LM).
    target_checkpoint / draft_checkpoint: T5X checkpoints (None: random init, smoke runs only).
    drafter: 'model' (the draft checkpoint) or 'prompt_lookup'.
    gamma: guesses per round; max_gamma: the static buffer (default gamma).
    max_new_tokens: generation budget per example.
    sampling: standardization for both models; lenience: l in (0, 1] (1 = exact).
    batch_size: decode slots: the examples stream through this many rows (in-flight
      batching: a finished example's slot takes the next input).
    verifier: a `specjax.verify` verifier; the sigmoid one is NOT exact (flagged in output).
    output_dir: where `results.jsonl` and `summary.json` go (None: nowhere).
    partitioner: a `specjax.sharding.Partitioner` (gin: NUM_PARTITIONS) to decode on a
      device mesh; None: one device.
    on_batch: called as on_batch(examples_done, examples_total) after every batch_size
      examples finish the speculative decode (which runs after the autoregressive one): a
      progress hook. Ctrl-C (KeyboardInterrupt) between two such chunks stops the job with a
      message.
  Every setting, the output folder and the caches' size are checked before any model loads.
  Returns:
    The summary dict.
  """
  console = console or Console()
  max_gamma = check_settings(drafter=drafter, gamma=gamma, max_gamma=max_gamma,
                             max_new_tokens=max_new_tokens, batch_size=batch_size,
                             max_input_len=max_input_len, seed=seed)
  if not texts:
    raise ValueError("no inputs to decode")
  prepare_output_dir(output_dir)
  vocab = load_vocab()
  config = DecodeConfig(sampling=sampling, eos_id=vocab.eos_id, lenience=lenience,
                        verifier=verifier,
                        cache_len=max_input_len + max_new_tokens + max_gamma + 1)
  target = build_model(gin_config.model_config("target"))
  if drafter == "model":
    draft = build_model(gin_config.model_config("draft"))
    the_drafter = ModelDrafter(draft, max_gamma=max_gamma)
  else:
    the_drafter = PromptLookupDrafter(vocab=target.vocab_size, max_gamma=max_gamma)
  check_cache_size([target, *drafter_models(the_drafter)], batch_size, config.cache_len,
                   partitioner)
  target_params = load_params(target, target_checkpoint, seed, partitioner)
  draft_params = (load_params(draft, draft_checkpoint, seed + 1, partitioner)
                  if drafter == "model" else None)
  if not verifier.exact:
    console.print(f"[bold red]WARNING:[/bold red] {describe(verifier)}: speculative outputs are "
                  "NOT distributed as the target's")
  inputs = encode_inputs(vocab, texts, target.is_encoder_decoder, max_input_len)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(texts))  # one key per example
  spec_config = DecodeConfig(**{**config.__dict__, "trace": True})
  # In-flight batching: batch_size slots; a finished example's slot takes the next input.
  stream = dict(rng=keys, partitioner=partitioner, slots=batch_size)
  ar = lambda budget, **kw: autoregressive_decode(target, target_params, inputs,
                                                  max_new_tokens=budget, config=config,
                                                  **stream, **kw)
  spec = lambda budget, **kw: speculative_decode(target, target_params, the_drafter, draft_params,
                                                 inputs, max_new_tokens=budget, gamma=gamma,
                                                 config=spec_config, **stream, **kw)
  done = [0]
  try:
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
      task = progress.add_task("decoding", total=2 * len(texts))

      def spec_progress(finished, total):  # after every batch_size finished examples
        done[0] = finished
        progress.update(task, completed=total + finished)
        if on_batch is not None:
          on_batch(finished, total)

      # Compile (and warm up: one token per input) apart from the timed runs; the budget is
      # data, so the timed runs reuse the compiled loops.
      compile_s = {"ar": _timed(lambda: ar(1))[1], "spec": _timed(lambda: spec(1))[1]}
      ar_out, ar_s = _timed(lambda: ar(max_new_tokens, on_progress=lambda d, t: progress.update(
          task, completed=d)))
      spec_out, spec_s = _timed(lambda: spec(max_new_tokens, on_progress=spec_progress))
  except KeyboardInterrupt:
    console.print(f"interrupted after {done[0]} of {len(texts)} examples: nothing written")
    raise
  records: List[Dict[str, Any]] = []
  identical = True
  for i, text in enumerate(texts):
    ar_ids = np.asarray(ar_out.tokens[i, :int(ar_out.lengths[i])]).tolist()
    sp_ids = np.asarray(spec_out.tokens[i, :int(spec_out.lengths[i])]).tolist()
    identical &= ar_ids == sp_ids
    records.append({"input": text, "autoregressive": vocab.decode(ar_ids),
                    "speculative": vocab.decode(sp_ids),
                    "target_calls": int(spec_out.target_calls[i]), "tokens": len(sp_ids),
                    "alpha": float(spec_out.alpha[i])})
  first_trace = report.trace_rounds(spec_out, 0)

  for record in records:
    console.print(f"[bold]>[/bold] {record['input']}", markup=True, highlight=False)
    console.print(f"  {record['speculative']}", markup=False, highlight=False)
  console.print("\nFigure-1 trace of the first example (green accepted, red rejected, "
                "blue correction; one line per target call):")
  piece = lambda t: vocab.decode([t]) if t != vocab.eos_id else "</s>"
  report.print_trace(console, first_trace, lambda t: piece(t) + " ", plain)
  summary = {
      "examples": len(texts), "gamma": gamma, "drafter": drafter,
      "verifier": describe(verifier),
      "temperature": sampling.temperature, "lenience": lenience,
      "alpha": float(np.sum(spec_out.alpha_sum) / max(int(np.sum(spec_out.alpha_count)), 1)),
      "tokens_per_target_call": float(np.sum(spec_out.lengths)
                                      / max(int(np.sum(spec_out.target_calls)), 1)),
      "autoregressive_s": ar_s, "speculative_s": spec_s,
      "speedup": ar_s / max(spec_s, 1e-9),
      "compile_ar_s": compile_s["ar"], "compile_spec_s": compile_s["spec"],
      "greedy_identical": (identical if sampling.greedy and lenience == 1.0
                           and verifier.exact else "n/a (sampling or not exact)"),
      "slot_utilization": spec_out.slot_utilization,
  }
  console.print(report.summary_table(summary))
  if output_dir:
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "results.jsonl"), "w", encoding="utf-8") as f:
      for record in records:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
    with open(os.path.join(output_dir, "summary.json"), "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=1)
    console.print(f"wrote {output_dir}/results.jsonl and summary.json")
  return summary


def read_texts(args) -> List[str]:
  """Inputs from --prompt (repeatable), --input_file (one per line) or --task NAME[:split].

  --task takes a bundled split name ('translate_en_de', 'summarize_ddtp', 'lm_ddtp_en')
  or a registered seqio task ('specjax_translate_en_de:validation'; needs the seqio extra).
  Language-modelling documents are cut to their first `--prompt_words` words.
  """
  texts = list(args.prompt or [])
  if args.input_file:
    with open(args.input_file, "rb") as f:
      raw = f.read()
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(f"--input_file '{args.input_file}' is not UTF-8: byte {e.start} "
                       f"({raw[e.start:e.start + 1]!r}) cannot be decoded ({e.reason})") from e
    texts += [line for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
  if args.task:
    name, _, split = args.task.partition(":")
    if name.startswith("specjax_"):
      from specjax.data import tasks  # pylint: disable=import-outside-toplevel
      dataset = tasks.get_task(name).get_dataset(split=split or "validation", shuffle=False)
      key = "inputs_pretokenized" if "inputs" in tasks.output_features(name) else \
          "targets_pretokenized"
      found = [ex[key].decode("utf-8") for ex in dataset.take(args.num_examples).as_numpy_iterator()]
    else:
      from specjax.data import load_bundled  # pylint: disable=import-outside-toplevel
      found = [e[0] if isinstance(e, (tuple, list)) else e
               for e in load_bundled(name)[: args.num_examples]]
    if name.endswith("lm_ddtp_en"):
      found = [" ".join(t.split()[: args.prompt_words]) for t in found]
    texts += found
  return texts


DEFAULT_GIN = "runs/default.gin"


def run(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """Command-line entry point (`python -m specjax.main`)."""
  argv = sys.argv[1:] if argv is None else list(argv)
  gin_files, bindings, paths, rest = gin_config.split_gin_args(argv)
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--prompt", action="append", help="an input text (repeatable)")
  parser.add_argument("--input_file", help="a text file, one input per line")
  parser.add_argument("--task", help="a bundled task split, e.g. translate_en_de")
  parser.add_argument("--num_examples", type=int, default=16)
  parser.add_argument("--prompt_words", type=int, default=12,
                      help="words of each language-modelling document used as its prompt")
  parser.add_argument("--plain", action="store_true", help="no colours in the trace")
  args = parser.parse_args(rest)
  for name in ("num_examples", "prompt_words"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
  gin_config.parse(gin_files or [DEFAULT_GIN], bindings, paths)
  texts = read_texts(args)
  if not texts and gin_config.query_macro("DEFAULT_TASK"):
    args.task = gin_config.query_macro("DEFAULT_TASK")
    texts = read_texts(args)
  if not texts:
    raise SystemExit("no inputs: give --prompt, --input_file or --task")
  return gin.get_configurable(decode_job)(texts, plain=args.plain)


if __name__ == "__main__":
  run()
