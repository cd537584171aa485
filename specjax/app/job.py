"""The main job as four steps a test can call: plan -> load -> measure -> report.

  plan     every setting checked, models built, inputs framed (`plan.make_plan`)
  load     the weights from the T5X checkpoints (`measure.load`)
  measure  autoregressive and speculative decodes timed side by side (`measure.measure`)
  report   outputs, Figure-1 trace and summary printed; results.jsonl and summary.json
           written (`report`, `records`)
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import gin
from rich.console import Console

from specjax import distributed
from specjax.app import display, records, report
from specjax.app.measure import load, measure
from specjax.app.plan import make_plan
from specjax.app.scoring import sequence_scores
from specjax.app.settings import JobSettings, feature_lengths, job_verifier
from specjax.decode import DecodeConfig
from specjax.sampling import Sampling
from specjax.sharding import Partitioner
from specjax.verify import describe


@gin.register(module="specjax.main")
def decode_job(texts: Sequence[Any], *, target_checkpoint: Optional[str] = None,
               draft_checkpoint: Optional[str] = None, drafter: str = "model",
               drafter_options: Optional[Mapping[str, Any]] = None, gamma: int = 4,
               tree: Any = None, max_gamma: Optional[int] = None, max_new_tokens: int = 32,
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
    drafter: a name in `specjax.draft.DRAFTERS`: 'model' (the draft checkpoint; with a TREE it
      drafts the tree), 'prompt_lookup', 'prompt_lookup_tree', ...; drafter_options: more
      fields of its class (e.g. {'max_ngram': 4}).
    gamma: guesses per round ('auto': the largest γ it may pick); max_gamma: its bound.
    tree: TREE: a token tree drafted every round (`tree_decode`); None: a chain of gamma.
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
    draft_vocabulary / task_vocabulary: DRAFT_VOCABULARY and the inputs' seqio task's, checked
      to be the run's (None: shared).
    task_feature_lengths: TASK_FEATURE_LENGTHS: 'inputs' sets max_input_len and 'targets'
      max_new_tokens (T5X's lengths), when given.
    write_scores: WRITE_SCORES: add each prediction's log-likelihood under the target.
    weights_dtype / draft_weights_dtype: WEIGHTS_DTYPE / DRAFT_WEIGHTS_DTYPE: 'float32', or
      'bfloat16' to run that model's dense layers and vocabulary product with bfloat16
      weights, sums in float32 (`specjax.params.cast_kernels`), for both decodes alike.
    timing_repeats: TIMING_REPEATS: each decode is timed this many times, the two
      interleaved (order alternating); the summary reports the medians ('speedup' is their
      ratio) and the range of the per-pass ratios. Compile time is reported apart.
    on_batch: a progress hook, on_batch(examples_done, examples_total) after every
      batch_size examples of the first speculative decode; Ctrl-C between two stops the job.
  The settings become one `specjax.app.settings.JobSettings` (checked as it is made); the
  vocabulary, the output folder and the caches' size are checked before any weights load.
  Returns the summary dict.
  """
  console = console or Console()
  if not distributed.is_writer():  # many processes: process 0 alone prints and writes
    console, output_dir = Console(quiet=True), None
  lengths = feature_lengths(task_feature_lengths)  # T5X's lengths, when given, win
  settings = JobSettings(
      decoding=DecodeConfig(sampling=sampling, lenience=lenience, gamma_policy=gamma_policy,
                            verifier=job_verifier(verifier, drafter, tree, sampling,
                                                  lenience)),
      drafter=drafter, drafter_options={} if drafter_options is None else drafter_options,
      gamma=gamma, max_gamma=gamma if max_gamma is None else max_gamma,
      tree=tree, max_new_tokens=lengths.get("targets", max_new_tokens),
      batch_size=batch_size, max_input_len=lengths.get("inputs", max_input_len), seed=seed,
      target_checkpoint=target_checkpoint, draft_checkpoint=draft_checkpoint,
      weights_dtype=weights_dtype, draft_weights_dtype=draft_weights_dtype,
      partitioner=partitioner, vocabulary=vocabulary, draft_vocabulary=draft_vocabulary,
      task_vocabulary=task_vocabulary, cost_table=cost_table, output_dir=output_dir,
      timing_repeats=timing_repeats, write_scores=write_scores, plain=plain)
  plan = make_plan(texts, settings)
  loaded = load(plan)
  verifier = plan.settings.decoding.verifier
  if not verifier.exact:
    console.print(f"[bold red]WARNING:[/bold red] {describe(verifier)}: "
                  "speculative outputs are NOT distributed as the target's")
  measured = measure(plan, loaded, console, on_batch)
  scores = (sequence_scores(plan.target, loaded.target_params, plan.inputs, plan.prompt_lengths,
                            measured.spec.tokens, measured.spec.lengths)
            if settings.write_scores else None)
  recs = report.example_records(plan, measured, scores)
  summary = report.summarize(plan, measured)
  if settings.output_dir:  # written before anything is shown: a display problem cannot lose them
    records.write(settings.output_dir, recs, summary)
  report.print_run(console, plan, measured, recs, summary, settings.plain)
  if settings.output_dir:
    console.print(display.text(f"wrote {settings.output_dir}/results.jsonl and summary.json"))
  return summary
