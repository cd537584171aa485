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

from specjax.runtime import distributed
from specjax.app import display, greedy_check, records, report
from specjax.app.measure import load, measure
from specjax.app.plan import make_plan
from specjax.app.scoring import sequence_scores
from specjax.app.settings import JobSettings, feature_lengths, job_verifier
from specjax.decode import DecodeConfig
from specjax.sampling import Sampling
from specjax.runtime.sharding import Partitioner
from specjax.verify import describe


@gin.register(module="specjax.main")
def decode_job(texts: Sequence[Any], *, target_checkpoint: Optional[str] = None,
               draft_checkpoint: Optional[str] = None, drafter: str = "model",
               drafter_options: Optional[Mapping[str, Any]] = None, gamma: int = 4,
               tree: Any = None, max_gamma: Optional[int] = None, max_new_tokens: int = 32,
               ignore_eos: bool = False,
               sampling: Sampling = Sampling(temperature=0.0), lenience: float = 1.0,
               batch_size: int = 8, max_input_len: int = 128, seed: int = 0,
               verifier=None, gamma_policy: str = "auto", auto_buckets: Sequence[int] = (),
               cost_table: Optional[str] = None,
               output_dir: Optional[str] = "out/decode", plain: bool = False,
               partitioner: Optional[Partitioner] = None,
               vocabulary: Any = None, draft_vocabulary: Any = None,
               task_vocabulary: Any = None, task_feature_lengths: Optional[Mapping] = None,
               write_scores: bool = False, timing_repeats: int = 3,
               weights_dtype: str = "float32", draft_weights_dtype: str = "float32",
               note: Optional[str] = None, console: Optional[Console] = None,
               on_batch: Optional[Callable[[int, int], None]] = None,
               settings_only: bool = False) -> Any:
  """Runs autoregressive and speculative decoding on `texts`; prints and writes a report.

  Args:
    texts: the inputs: strings (source sentences for T5, prompts for a decoder-only LM) or
      `specjax.data.DecodeInput`s (a seqio task's examples, with its token ids).
    sampling, lenience, verifier (None: the reference verifier for a tree, else
      `specjax.verify.default_verifier`), gamma_policy, auto_buckets (the 'auto' policy's
      wide rounds; () its default): become the `DecodeConfig` `JobSettings.decoding`.
    max_gamma: None is gamma. task_feature_lengths: TASK_FEATURE_LENGTHS: 'inputs' sets
      max_input_len and 'targets' max_new_tokens (T5X's lengths), when given.
    every other setting: the `specjax.app.settings.JobSettings` field of its name, documented
      there (the defaults are here: gin binds `decode_job.NAME`).
    note: NOTE: a run file's word to its reader, printed first (why its speedup is below 1).
    console: where the report is printed (None: a new rich Console).
    on_batch: a progress hook, on_batch(examples_done, examples_total) after every
      batch_size examples of the first speculative decode; Ctrl-C between two stops the job.
    settings_only: return the checked `JobSettings` and run nothing (`texts` unread): how
      `specjax.app.generate` reads the settings the parsed gin binds.
  The settings become one `JobSettings` (checked as it is made); the vocabulary, the output
  folder and the caches' size are checked before any weights load. Returns the summary dict.
  """
  console = console or Console()
  if not distributed.is_writer():  # many processes: process 0 alone prints and writes
    console, output_dir = Console(quiet=True), None
  lengths = feature_lengths(task_feature_lengths)  # T5X's lengths, when given, win
  settings = JobSettings(
      decoding=DecodeConfig(sampling=sampling, lenience=lenience, gamma_policy=gamma_policy,
                            auto_buckets=auto_buckets,
                            verifier=job_verifier(verifier, drafter, tree, sampling,
                                                  lenience)),
      drafter=drafter, drafter_options={} if drafter_options is None else drafter_options,
      gamma=gamma, max_gamma=gamma if max_gamma is None else max_gamma,
      tree=tree, max_new_tokens=lengths.get("targets", max_new_tokens), ignore_eos=ignore_eos,
      batch_size=batch_size, max_input_len=lengths.get("inputs", max_input_len), seed=seed,
      target_checkpoint=target_checkpoint, draft_checkpoint=draft_checkpoint,
      weights_dtype=weights_dtype, draft_weights_dtype=draft_weights_dtype,
      partitioner=partitioner, vocabulary=vocabulary, draft_vocabulary=draft_vocabulary,
      task_vocabulary=task_vocabulary, cost_table=cost_table, output_dir=output_dir,
      timing_repeats=timing_repeats, write_scores=write_scores, plain=plain)
  if settings_only:
    return settings
  return run_job(texts, settings, console, on_batch, note)


def run_job(texts: Sequence[Any], settings: JobSettings, console: Console,
            on_batch: Optional[Callable[[int, int], None]] = None,
            note: Optional[str] = None) -> Dict[str, Any]:
  """`decode_job` once its settings are made: prints `note` first, then plans, loads, measures
  and reports (printed on `console`, written to the settings' output_dir). The summary dict."""
  if note is not None:
    if not isinstance(note, str):
      raise ValueError(f"NOTE must be a string or None, got {note!r}")
    console.print(display.text(f"Note: {note}"))
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
  summary = greedy_check.explained(report.summarize(plan, measured), plan, loaded, measured)
  kept = None
  if settings.output_dir:  # written before anything is shown: a display problem cannot lose them
    kept = records.write(settings.output_dir, recs, summary)
  report.print_run(console, plan, measured, recs, summary, settings.plain)
  if kept:
    console.print(display.text(f"{settings.output_dir} held an earlier run's results: kept "
                               f"them in {kept}/"))
  if settings.output_dir:
    console.print(display.text(f"wrote {settings.output_dir}/results.jsonl and summary.json"))
  return summary
