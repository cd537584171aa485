"""The main job: decode with a target/draft pair, autoregressive vs speculative.

  python -m specjax.main                                   # the bundled default
  python -m specjax.main --gin_file=runs/decode.gin \\
      --gin.TARGET_CHECKPOINT="'/ckpt/t5_xxl'" --gin.TARGET_MODEL="'models/t5_1_1_xxl.gin'" \\
      --gin.DRAFT_CHECKPOINT="'/ckpt/t5_small'" --gin.DRAFT_MODEL="'models/t5_1_1_small.gin'" \\
      --gin.VOCABULARY="'/vocabs/cc_all.32000/sentencepiece.model'" \\
      --prompt "translate English to German: The house is wonderful."

Your own T5X checkpoints bring their own vocabulary: bind VOCABULARY (a SentencePiece
model path, or T5X's `@seqio.SentencePieceVocabulary()`); inputs may also come from any
registered seqio task (--task, or MIXTURE_OR_TASK_NAME with TASK_FEATURE_LENGTHS). See
runs/decode.gin and the README's "Use your own T5X checkpoints".

Prints the outputs, a Figure-1 trace of the first example and a summary table
(α, tokens per target call, walltimes, speedup, greedy identity); writes the
same to `output_dir`: results.jsonl with T5X infer.py's fields (`inputs`,
`prediction`, `prediction_tokens`, `score` when asked) and specjax's, and
summary.json. As the `specjax` command (`cli`), a user's error is one line on
stderr and exit status 2 (`--verbose` adds the traceback).

Many devices: `--gin.NUM_PARTITIONS=8` splits each model over 8 devices (the
'model' mesh axis; the rest of `jax.devices()` is the 'data' axis, see
`specjax.sharding`). Multi-host: call `jax.distributed.initialize()` first on
every host and run this same command on each (jax.devices() then spans all).
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import gin
import jax
import numpy as np
from rich.console import Console
from rich.progress import Progress

from specjax import bundled, gin_config, records as records_lib, report
from specjax import cli as cli_lib
from specjax.checkpoints import find_checkpoint, load_sharded, load_t5x_for_model
from specjax.data import Vocab
from specjax.data import inputs as inputs_lib
from specjax.data.user_vocab import BUNDLED, describe as describe_vocab
from specjax.data.user_vocab import resolve_vocabulary, vocabulary_difference
from specjax.decode import (GAMMA_POLICIES, CostTable, DecodeConfig, autoregressive_decode,
                            speculative_decode)
from specjax.decode import prompts
from specjax.decode.inputs import (check_cache_size, check_count, check_inputs, check_memory,
                                   drafter_models, prefix_lengths)
from specjax.decode.scoring import sequence_scores
from specjax.draft import ModelDrafter, PromptLookupDrafter
from specjax.models import build_model
from specjax.params import WEIGHTS_DTYPES, cast_kernels
from specjax.sampling import Sampling
from specjax.sharding import Partitioner
from specjax.verify import default_verifier, describe

gin_config.register(Vocab, "specjax.data")  # VOCABULARY = @Vocab() (model_path, extra_ids)


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
  first max_len tokens (LM), with a logged warning naming the example. (The bundled
  pairs' framing; `specjax.decode.prompts.frame` frames for any model's convention.)
  """
  rows = [vocab.encode(t) + ([vocab.eos_id] if encoder_decoder else []) for t in texts]
  rows = prompts.cut(rows, max_len, vocab.eos_id)
  out = np.zeros((len(rows), max(len(r) for r in rows)), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out


def _is_bundled(checkpoint: Any) -> bool:
  return isinstance(checkpoint, str) and checkpoint.startswith(bundled.PREFIX)


def job_vocabulary(vocabulary: Any, draft_vocabulary: Any, task_vocabulary: Any,
                   checkpoints: Sequence[Any]):
  """The run's vocabulary: VOCABULARY, else the task's, else the bundled one for the bundled
  pairs (all `checkpoints` 'bundled:...'); ValueError when none applies or two differ."""
  if vocabulary is not None:
    vocab = resolve_vocabulary(vocabulary)
  elif task_vocabulary is not None:
    vocab = resolve_vocabulary(task_vocabulary)
  elif checkpoints and all(_is_bundled(c) for c in checkpoints):
    vocab = resolve_vocabulary(BUNDLED)
  else:
    raise ValueError(
        "no vocabulary: bind VOCABULARY to the checkpoints' own (a SentencePiece model path, "
        "e.g. --gin.VOCABULARY=\"'/path/sentencepiece.model'\", or @seqio.SentencePieceVocabulary() "
        f"as in T5X's gin); the bundled vocabulary ({BUNDLED!r}) is the default only for the "
        "bundled pairs")
  for what, other in (("the task's vocabulary", task_vocabulary),
                      ("DRAFT_VOCABULARY", draft_vocabulary)):
    if other is None or other is vocabulary:
      continue
    other = resolve_vocabulary(other)
    difference = vocabulary_difference(vocab, other)
    if difference:
      raise ValueError(f"vocabulary mismatch: {what} ({describe_vocab(other)}) differs from "
                       f"the run's ({describe_vocab(vocab)}): {difference}; target, draft and "
                       "inputs must share one vocabulary")
  return vocab


def check_models(vocab: Any, models: Dict[str, Any]) -> None:
  """ValueError unless every model's logits cover the vocabulary (a larger vocab_size is fine,
  as T5's 32128 for 32100 ids) and all frame prompts alike."""
  for role, model in models.items():
    if model.vocab_size < vocab.vocab_size:
      raise ValueError(f"the {role} model's vocab_size {model.vocab_size} is smaller than the "
                       f"vocabulary's {vocab.vocab_size} ids ({describe_vocab(vocab)}): "
                       "wrong VOCABULARY or model gin file?")
  if "draft" in models and models["draft"].vocab_size != models["target"].vocab_size:
    raise ValueError(f"target and draft vocab_size differ ({models['target'].vocab_size} vs "
                     f"{models['draft'].vocab_size}): speculative decoding needs one shared "
                     "vocabulary; check the model gin files")
  conventions = {role: prompts.convention(m) for role, m in models.items()}
  if len(set(conventions.values())) > 1:
    raise ValueError(f"target and draft frame prompts differently ({conventions}): give both "
                     "the same DecoderOnlyConfig.prompt_convention")


def check_checkpoints(checkpoints: Dict[str, Any]) -> None:
  """Finds every checkpoint before any loads ({role: path, 'bundled:...' or None for random
  init}): a missing draft checkpoint is named before the target's weights are read."""
  for role, checkpoint in checkpoints.items():
    path = bundled.resolve(checkpoint, "checkpoint")
    if path is None:
      continue
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
      raise ValueError(f"the {role} checkpoint must be a path (or None for random weights), "
                       f"got {checkpoint!r}")
    try:
      find_checkpoint(path)
    except FileNotFoundError as e:
      raise FileNotFoundError(f"the {role} checkpoint: {e}") from e


def check_settings(*, drafter: str, gamma: Any, max_gamma: Any, max_new_tokens: Any,
                   batch_size: Any, max_input_len: Any, seed: Any,
                   timing_repeats: Any = 1) -> int:
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
  check_count("timing_repeats", timing_repeats)
  if check_count("max_input_len", max_input_len) < 2:
    raise ValueError(f"max_input_len must be >= 2 (a token and EOS), got {max_input_len}")
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
    raise ValueError(f"seed must be an integer, got {seed!r}")
  return max_gamma


def prepare_output_dir(output_dir: Optional[str]) -> None:
  """Creates `output_dir` and checks a file can be written there (before any decoding)."""
  if not output_dir:
    return
  if not isinstance(output_dir, (str, os.PathLike)):
    raise ValueError(f"output_dir must be a folder path (or None), got {output_dir!r}")
  probe = os.path.join(output_dir, ".specjax_write_test")
  try:
    os.makedirs(output_dir, exist_ok=True)
    with open(probe, "w", encoding="utf-8") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ValueError(f"output_dir '{output_dir}' is not writable: {e}") from e


def _cost_table_file(path: Optional[str], gamma_policy: str) -> Optional[CostTable]:
  """The saved table at `path` if it exists (checked before any model loads), else None."""
  if not path:
    return None
  if gamma_policy != "auto":
    raise ValueError(f"cost_table is for gamma_policy='auto', not {gamma_policy!r}")
  if os.path.exists(path):
    return CostTable.load(path)
  folder = os.path.dirname(path) or "."
  if not os.path.isdir(folder):
    raise ValueError(f"cost_table '{path}': folder '{folder}' does not exist")
  return None


def _timed(fn):
  start = time.perf_counter()
  out = fn()
  jax.block_until_ready(out.tokens)
  return out, time.perf_counter() - start


def _feature_lengths(task_feature_lengths: Any) -> Dict[str, int]:
  """TASK_FEATURE_LENGTHS checked: a dict of feature name -> length >= 1 (None: {})."""
  if task_feature_lengths is None:
    return {}
  if not isinstance(task_feature_lengths, Mapping):
    raise ValueError("TASK_FEATURE_LENGTHS must be a dict such as {'inputs': 64, 'targets': 32}, "
                     f"got {task_feature_lengths!r}")
  return {k: check_count(f"TASK_FEATURE_LENGTHS['{k}']", v)
          for k, v in task_feature_lengths.items()}


@gin.register(module="specjax.main")
def decode_job(texts: Sequence[Any], *, target_checkpoint: Optional[str] = None,
               draft_checkpoint: Optional[str] = None, drafter: str = "model", gamma: int = 4,
               max_gamma: Optional[int] = None, max_new_tokens: int = 32,
               sampling: Sampling = Sampling(temperature=0.0), lenience: float = 1.0,
               batch_size: int = 8, max_input_len: int = 128, seed: int = 0,
               verifier=None, gamma_policy: str = "auto", cost_table: Optional[str] = None,
               output_dir: Optional[str] = "out/decode", plain: bool = False,
               partitioner: Optional[Partitioner] = None,
               vocabulary: Any = None, draft_vocabulary: Any = None,
               task_vocabulary: Any = None, task_feature_lengths: Optional[Mapping] = None,
               write_scores: bool = False, timing_repeats: int = 3,
               weights_dtype: str = "float32", draft_weights_dtype: str = "float32",
               console: Optional[Console] = None,
               on_batch: Optional[Callable[[int, int], None]] = None) -> Dict[str, Any]:
  """Runs autoregressive and speculative decoding on `texts`; prints and writes a report.

  Args:
    texts: the inputs: strings (source sentences for T5, prompts for a decoder-only LM) or
      `specjax.data.DecodeInput`s (a seqio task's examples, with its token ids).
    target_checkpoint / draft_checkpoint: T5X checkpoints (None: random init, smoke runs only).
    drafter: 'model' (the draft checkpoint) or 'prompt_lookup'.
    gamma: guesses per round ('auto': the largest γ it may pick); max_gamma: the static
      buffer (default gamma).
    gamma_policy: 'auto' (default: per round and row, γ in [0, gamma] from measured costs;
      γ = 0 is a plain target step, so speculation switches off where it does not pay),
      'constant', 'heuristic' or 'optimal' (`DecodeConfig.gamma_policy`).
    cost_table: 'auto' only: a JSON cost table (`specjax.decode.auto.CostTable`). If the
      file exists it is used as is (same table + same seed = same tokens); otherwise the
      table is calibrated on the first batch and written there. None: calibrate, keep.
    max_new_tokens: generation budget per example.
    sampling: standardization for both models; lenience: l in (0, 1] (1 = exact).
    batch_size: decode slots: the examples stream through this many rows (in-flight
      batching: a finished example's slot takes the next input).
    max_input_len: input tokens kept per example (EOS included; a BOS comes on top).
    verifier: a `specjax.verify` verifier; the sigmoid one is NOT exact (flagged in output).
      None: `specjax.verify.default_verifier` (block at T > 0 and lenience 1, else reference).
    output_dir: where `results.jsonl` and `summary.json` go (None: nowhere).
    partitioner: a `specjax.sharding.Partitioner` (gin: NUM_PARTITIONS) to decode on a
      device mesh; None: one device.
    vocabulary: VOCABULARY: a SentencePiece model path, 'bundled:specjax_8k', a `Vocab` or a
      seqio.Vocabulary. None: the task's vocabulary, or the bundled one when both
      checkpoints are bundled pairs; otherwise an error.
    draft_vocabulary: DRAFT_VOCABULARY, checked to be the same vocabulary (None: shared).
    task_vocabulary: the vocabulary of the seqio task the inputs came from (checked too).
    task_feature_lengths: TASK_FEATURE_LENGTHS: 'inputs' sets max_input_len and 'targets'
      max_new_tokens (T5X's lengths), when given.
    write_scores: WRITE_SCORES: add each prediction's log-likelihood under the target.
    weights_dtype: WEIGHTS_DTYPE: 'float32', or 'bfloat16' to run the target's dense
      layers and vocabulary product with bfloat16 weights (cast once after loading,
      `specjax.params.cast_kernels`; inputs rounded to bfloat16, sums in float32, as a T5X
      model with dtype bfloat16): half the weight bytes per step, for both decodes alike.
    draft_weights_dtype: DRAFT_WEIGHTS_DTYPE: the same for the draft model. float32 by
      default: a small draft's step is per-op cost, which bfloat16's input conversions add
      to (the bundled LM draft's step is ~20% slower in bfloat16 on the CPU).
    timing_repeats: TIMING_REPEATS: each decode is timed this many times, the two
      interleaved (order alternating); the summary reports the medians ('speedup' is their
      ratio) and the range of the per-pass ratios. Compile time is reported apart.
    on_batch: called as on_batch(examples_done, examples_total) after every batch_size
      examples finish the speculative decode (which runs after the autoregressive one): a
      progress hook. Ctrl-C (KeyboardInterrupt) between two such chunks stops the job with a
      message.
  Every setting, the vocabulary, the output folder and the caches' size are checked before
  any weights load.
  Returns:
    The summary dict.
  """
  console = console or Console()
  lengths = _feature_lengths(task_feature_lengths)
  max_input_len = lengths.get("inputs", max_input_len)
  max_new_tokens = lengths.get("targets", max_new_tokens)
  max_gamma = check_settings(drafter=drafter, gamma=gamma, max_gamma=max_gamma,
                             max_new_tokens=max_new_tokens, batch_size=batch_size,
                             max_input_len=max_input_len, seed=seed,
                             timing_repeats=timing_repeats)
  examples = inputs_lib.as_inputs(texts)
  if not examples:
    raise ValueError("no inputs to decode")
  prepare_output_dir(output_dir)
  for name, value in (("weights_dtype", weights_dtype),
                      ("draft_weights_dtype", draft_weights_dtype)):
    if value not in WEIGHTS_DTYPES:
      raise ValueError(f"{name} must be one of {sorted(WEIGHTS_DTYPES)}, got {value!r}")
  if gamma_policy not in GAMMA_POLICIES:
    raise ValueError(f"gamma_policy must be one of {GAMMA_POLICIES}, got {gamma_policy!r}")
  costs = _cost_table_file(cost_table, gamma_policy)
  target = build_model(gin_config.model_config("target"))
  models = {"target": target}
  if drafter == "model":
    draft = models["draft"] = build_model(gin_config.model_config("draft"))
    the_drafter = ModelDrafter(draft, max_gamma=max_gamma)
  else:
    the_drafter = PromptLookupDrafter(vocab=target.vocab_size, max_gamma=max_gamma)
  vocab = job_vocabulary(vocabulary, draft_vocabulary, task_vocabulary,
                         [target_checkpoint] + ([draft_checkpoint] if drafter == "model" else []))
  check_models(vocab, models)
  rows = [list(e.ids) if e.ids is not None else prompts.text_ids(vocab, e.text, target)
          for e in examples]
  inputs, prompt_lengths = prompts.frame(target, rows, max_len=max_input_len,
                                         eos_id=vocab.eos_id, round_to=16)
  prefix_lengths(target, check_inputs(target, inputs), prompt_lengths)  # empty prompts, ids
  bos = int(prompts.convention(target) == "t5x")
  if verifier is None:
    verifier = default_verifier(sampling, lenience)
  config = DecodeConfig(sampling=sampling, eos_id=vocab.eos_id, lenience=lenience,
                        verifier=verifier, gamma_policy=gamma_policy,
                        cache_len=max_input_len + bos + max_new_tokens + max_gamma + 1)
  cache_size = check_cache_size([target, *drafter_models(the_drafter)], batch_size,
                                config.cache_len, partitioner)
  check_checkpoints({"target": target_checkpoint,
                     **({"draft": draft_checkpoint} if drafter == "model" else {})})
  check_memory(list(models.values()), cache_size, partitioner)
  target_params = load_params(target, target_checkpoint, seed, partitioner)
  draft_params = (load_params(draft, draft_checkpoint, seed + 1, partitioner)
                  if drafter == "model" else None)
  if weights_dtype != "float32":
    target_params = cast_kernels(target_params, WEIGHTS_DTYPES[weights_dtype])
  if draft_weights_dtype != "float32" and draft_params is not None:
    draft_params = cast_kernels(draft_params, WEIGHTS_DTYPES[draft_weights_dtype])
  if not verifier.exact:
    console.print(f"[bold red]WARNING:[/bold red] {describe(verifier)}: speculative outputs are "
                  "NOT distributed as the target's")
  keys = jax.random.split(jax.random.PRNGKey(seed), len(examples))  # one key per example
  spec_config = DecodeConfig(**{**config.__dict__, "trace": True})
  # In-flight batching: batch_size slots; a finished example's slot takes the next input.
  stream = dict(rng=keys, partitioner=partitioner, slots=batch_size,
                prompt_lengths=prompt_lengths)
  ar = lambda budget, **kw: autoregressive_decode(target, target_params, inputs,
                                                  max_new_tokens=budget, config=config,
                                                  **stream, **kw)
  spec = lambda budget, **kw: speculative_decode(target, target_params, the_drafter, draft_params,
                                                 inputs, max_new_tokens=budget, gamma=gamma,
                                                 config=spec_config, costs=costs, **stream, **kw)
  done = [0]
  try:
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
      task = progress.add_task("decoding", total=2 * len(examples))

      def spec_progress(finished, total):  # after every batch_size finished examples
        done[0] = finished
        progress.update(task, completed=total + finished)
        if on_batch is not None:
          on_batch(finished, total)

      # Compile apart from the timed runs: autoregressive with one token per input (the budget
      # is data, so the timed runs reuse the loop); speculative with the whole budget, since
      # under 'auto' the budget decides which loop runs (a table that never speculates at
      # it runs the autoregressive one) and the cost table is calibrated here.
      compile_s = {"ar": _timed(lambda: ar(1))[1]}
      warm, warm_s = _timed(lambda: spec(max_new_tokens))
      calibrated_s = 0.0
      if gamma_policy == "auto" and costs is None:  # calibrated during the warm-up
        costs = warm.cost_table
        calibrated_s = costs.calibration_s
        if cost_table:
          costs.save(cost_table)
      ar_out, ar_s = _timed(lambda: ar(max_new_tokens, on_progress=lambda d, t: progress.update(
          task, completed=d)))
      spec_out, spec_s = _timed(lambda: spec(max_new_tokens, on_progress=spec_progress))
      times = {"ar": [ar_s], "spec": [spec_s]}
      for i in range(1, timing_repeats):  # interleaved, the order alternating: drift hits both
        for name in (("spec", "ar") if i % 2 else ("ar", "spec")):
          times[name].append(_timed(lambda: (ar if name == "ar" else spec)(max_new_tokens))[1])
      ar_s, spec_s = float(np.median(times["ar"])), float(np.median(times["spec"]))
      compile_s["spec"] = max(warm_s - spec_s - calibrated_s, 0.0)  # the warm-up less a run
      ratios = np.asarray(times["ar"]) / np.maximum(times["spec"], 1e-9)
  except KeyboardInterrupt:
    console.print(f"interrupted after {done[0]} of {len(examples)} examples: nothing written")
    raise
  scores = (sequence_scores(target, target_params, inputs, prompt_lengths, spec_out.tokens,
                            spec_out.lengths) if write_scores else None)
  records: List[Dict[str, Any]] = []
  identical = True
  for i, example in enumerate(examples):
    ar_ids = np.asarray(ar_out.tokens[i, :int(ar_out.lengths[i])]).tolist()
    sp_ids = np.asarray(spec_out.tokens[i, :int(spec_out.lengths[i])]).tolist()
    identical &= ar_ids == sp_ids
    width = (int(prompt_lengths[i]) if prompt_lengths is not None
             else int(np.count_nonzero(inputs[i])))
    records.append(records_lib.record(
        example, inputs[i, :width], ar_ids, sp_ids, vocab,
        target_calls=int(spec_out.target_calls[i]), alpha=float(spec_out.alpha[i]),
        score=None if scores is None else scores[i]))
  first_trace = report.trace_rounds(spec_out, 0)
  gamma_rounds = np.asarray(spec_out.gamma_hist).sum(0)

  for rec in records:
    console.print(f"[bold]>[/bold] {rec['input']}", markup=True, highlight=False)
    console.print(f"  {rec['speculative']}", markup=False, highlight=False)
  console.print("\nFigure-1 trace of the first example (green accepted, red rejected, "
                "blue correction; one line per target call):")
  piece = lambda t: vocab.decode([t]) if t != vocab.eos_id else "</s>"
  report.print_trace(console, first_trace, lambda t: piece(t) + " ", plain)
  summary = {
      "examples": len(examples), "gamma": gamma, "gamma_policy": gamma_policy,
      "drafter": drafter, "weights_dtype": weights_dtype,
      "draft_weights_dtype": draft_weights_dtype,
      "verifier": describe(verifier),
      "temperature": sampling.temperature, "lenience": lenience,
      "alpha": float(np.sum(spec_out.alpha_sum) / max(int(np.sum(spec_out.alpha_count)), 1)),
      "tokens_per_target_call": float(np.sum(spec_out.lengths)
                                      / max(int(np.sum(spec_out.target_calls)), 1)),
      "autoregressive_s": ar_s, "speculative_s": spec_s,
      "speedup": ar_s / max(spec_s, 1e-9),
      "timing_repeats": timing_repeats,
      "speedup_range": f"{ratios.min():.2f}-{ratios.max():.2f}",
      "compile_ar_s": compile_s["ar"], "compile_spec_s": compile_s["spec"],
      "slot_utilization": spec_out.slot_utilization,
      "slot_utilization_ar": ar_out.slot_utilization,
      "greedy_identical": (identical if sampling.greedy and lenience == 1.0
                           and verifier.exact else "n/a (sampling or not exact)"),
      "rounds_by_gamma": ", ".join(f"{g}: {int(n)}" for g, n in enumerate(gamma_rounds) if n),
      **(costs.summary() if costs is not None else {}),
  }
  console.print(report.summary_table(summary))
  if output_dir:
    records_lib.write(output_dir, records, summary)
    console.print(f"wrote {output_dir}/results.jsonl and summary.json")
  return summary


def read_inputs(args, feature_lengths: Optional[Mapping[str, int]] = None
                ) -> Tuple[List[inputs_lib.DecodeInput], Any]:
  """Inputs from --prompt (repeatable), --input_file (one per line) and --task NAME[:split].

  --task takes a bundled split ('translate_en_de', 'summarize_ddtp', 'lm_ddtp_en') or any
  registered seqio task or mixture ('specjax_translate_en_de:validation', or your own);
  language-modelling documents are cut to their first `--prompt_words` words.
  Returns (inputs, the task's vocabulary or None).
  """
  found = [inputs_lib.DecodeInput(p) for p in (args.prompt or [])]
  if args.input_file:
    found += [inputs_lib.DecodeInput(t) for t in inputs_lib.read_input_file(args.input_file)]
  task_vocabulary = None
  if args.task:
    task_found, task_vocabulary = inputs_lib.task_inputs(
        args.task, getattr(args, "num_examples", 16), getattr(args, "prompt_words", 12),
        feature_lengths)
    found += task_found
  return found, task_vocabulary


def read_texts(args) -> List[str]:
  """The texts of `read_inputs`."""
  return [i.text for i in read_inputs(args)[0]]


DEFAULT_GIN = "runs/default.gin"


def run(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """The main job from command-line arguments; errors propagate (see `cli` for the command)."""
  argv = sys.argv[1:] if argv is None else list(argv)
  gin_files, bindings, paths, rest = gin_config.split_gin_args(argv)
  parser = cli_lib.build_parser(__doc__)
  args = parser.parse_args(rest)
  cli_lib.check_counts(parser, args, ["num_examples", "prompt_words"])
  gin_config.parse(gin_files or [DEFAULT_GIN], bindings, paths)
  inputs_lib.import_modules(gin_config.query_macro("MIXTURE_OR_TASK_MODULE"))
  lengths = gin_config.query_macro("TASK_FEATURE_LENGTHS")
  examples, task_vocabulary = read_inputs(args, lengths)
  default_task = (gin_config.query_macro("MIXTURE_OR_TASK_NAME")
                  or gin_config.query_macro("DEFAULT_TASK"))
  if not examples and default_task:
    args.task = default_task
    examples, task_vocabulary = read_inputs(args, lengths)
  if not examples:
    raise ValueError("no inputs: give --prompt, --input_file or --task (or bind "
                     "MIXTURE_OR_TASK_NAME)")
  return gin.get_configurable(decode_job)(examples, plain=args.plain,
                                          task_vocabulary=task_vocabulary)


def cli(argv: Optional[Sequence[str]] = None) -> int:
  """The `specjax` command: `run`, with a user's error as one line on stderr and exit status
  2 (`--verbose`: the traceback too); Ctrl-C exits with 130."""
  argv = sys.argv[1:] if argv is None else list(argv)
  try:
    run(argv)
  except KeyboardInterrupt:
    print("specjax: interrupted", file=sys.stderr)
    return 130
  except cli_lib.USAGE_ERRORS as e:
    if "--verbose" in argv:
      traceback.print_exc()
    print(f"specjax: error: {cli_lib.one_line(e)}", file=sys.stderr)
    return cli_lib.EXIT_USAGE
  return 0


if __name__ == "__main__":
  sys.exit(cli())
