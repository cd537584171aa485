"""The main job's measurement: the weights loaded, then the autoregressive and speculative
decodes of the same inputs timed side by side (`specjax.timing`: interleaved passes, medians,
compile reported apart)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional

import jax
from rich.console import Console

from specjax import timing
from specjax.app.loading import load_params
from specjax.app.plan import Plan
from specjax.app.progress import FirstRuns
from specjax.app.settings import JobSettings
from specjax.decode import DecodeResult, autoregressive_decode, speculative_decode, tree_decode
from specjax.params import DRAFT_WEIGHTS_DTYPES, WEIGHTS_DTYPES, cast_kernels


@dataclasses.dataclass(frozen=True)
class Loaded:
  """The plan's weights (placed on the partitioner's mesh when there is one)."""

  target_params: Any
  draft_params: Any  # None for prompt lookup


@dataclasses.dataclass(frozen=True)
class Measured:
  """Both decodes' outputs and timings."""

  ar: DecodeResult
  spec: DecodeResult  # with a trace
  timings: timing.Timings  # 'ar' and 'spec' passes
  compile_s: Dict[str, float]  # the first run of each less its median pass (calibration apart)
  costs: Any  # the 'auto' cost table the speculative decode used (None otherwise)
  draft_cost: Optional[float] = None  # c, measured only when most rounds did not speculate


def load(plan: Plan) -> Loaded:
  """The target's and the draft's weights, cast to the plan's weight dtypes."""
  return load_weights(plan.settings, plan.target, plan.draft, plan.drafter, plan.checkpoints,
                      plan.token_ranking)


def load_weights(settings: JobSettings, target, draft, drafter, checkpoints: Dict[str, Any],
                 token_ranking=None) -> Loaded:
  """The weights of `target` and `draft` (None: no draft model) from `checkpoints` ({role:
  path, 'bundled:...' or None for random init}), cast to the settings' weight dtypes; a
  feature drafter's params read the target's too (with `token_ranking`, int32 [V])."""
  seed, partitioner = settings.seed, settings.partitioner
  target_params = load_params(target, checkpoints["target"], seed, partitioner)
  draft_params = (load_params(draft, checkpoints["draft"], seed + 1, partitioner)
                  if draft is not None else None)
  if settings.weights_dtype != "float32":
    target_params = cast_kernels(target_params, WEIGHTS_DTYPES[settings.weights_dtype])
  if settings.draft_weights_dtype != "float32" and draft_params is not None:
    draft_params = cast_kernels(draft_params,
                                DRAFT_WEIGHTS_DTYPES[settings.draft_weights_dtype])
  if drafter.wants_features:  # a feature head reads the target's own params too
    draft_params = drafter.params(draft_params, target_params, token_ranking=token_ranking)
  return Loaded(target_params=target_params, draft_params=draft_params)


def decoders(plan: Plan, loaded: Loaded, costs, trace: bool = True
             ) -> Dict[str, Callable[..., DecodeResult]]:
  """{'ar': ..., 'spec': ...}: each decodes every input (keyword: on_progress) through
  min(batch_size, inputs) slots (in-flight batching), one key per example; the speculative
  one records its Figure-1 trace when `trace`."""
  settings = plan.settings
  keys = jax.random.split(jax.random.PRNGKey(settings.seed), len(plan.examples))
  stream = dict(rng=keys, partitioner=settings.partitioner, slots=plan.slots,
                prompt_lengths=plan.prompt_lengths, max_new_tokens=settings.max_new_tokens)
  spec_config = dataclasses.replace(settings.decoding, trace=trace)
  if plan.drafter.tree is not None:  # TREE, or a drafter that drafts its own tree
    spec = lambda **kw: tree_decode(plan.target, loaded.target_params, plan.drafter,
                                    loaded.draft_params, plan.inputs, config=spec_config,
                                    costs=costs, **stream, **kw)
  else:
    spec = lambda **kw: speculative_decode(plan.target, loaded.target_params, plan.drafter,
                                           loaded.draft_params, plan.inputs,
                                           gamma=settings.gamma, config=spec_config,
                                           costs=costs, **stream, **kw)
  return {"ar": lambda **kw: autoregressive_decode(plan.target, loaded.target_params,
                                                   plan.inputs, config=settings.decoding, **stream,
                                                   **kw),
          "spec": spec}


def measure(plan: Plan, loaded: Loaded, console: Console,
            on_batch: Optional[Callable[[int, int], None]] = None) -> Measured:
  """Both decodes once, saying what compiles and how far they got (`progress.FirstRuns`; 'auto'
  calibrates), then TIMING_REPEATS interleaved passes. Ctrl-C during the first runs (between two chunks of
  batch_size examples) says how far it got and propagates: nothing is written."""
  total = len(plan.examples)
  costs, done = plan.costs, [0]
  try:
    with FirstRuns(console) as runs:
      ar_progress = runs.loop("autoregressive", total)
      fns = decoders(plan, loaded, costs)
      ar_first, ar_first_s = timing.timed(lambda: fns["ar"](on_progress=ar_progress))
      spec_hook = runs.loop("speculative", total)

      def spec_progress(finished, count):  # after every batch_size finished examples
        done[0] = finished
        spec_hook(finished, count)
        if on_batch is not None:
          on_batch(finished, count)

      spec_first, spec_first_s = timing.timed(lambda: fns["spec"](on_progress=spec_progress))
      runs.timing(plan.settings.timing_repeats)
  except KeyboardInterrupt:
    console.print(f"interrupted after {done[0]} of {total} examples: nothing written")
    raise
  calibrated_s = 0.0
  if plan.settings.decoding.gamma_policy == "auto" and costs is None:  # calibrated in that run
    costs = spec_first.cost_table
    calibrated_s = costs.calibration_s
    if plan.settings.cost_table:
      costs.save(plan.settings.cost_table)
    fns = decoders(plan, loaded, costs)
  timings = timing.interleaved(fns, plan.settings.timing_repeats, warmup=False)
  compile_s = {"ar": max(ar_first_s - timings.median("ar"), 0.0),
               "spec": max(spec_first_s - timings.median("spec") - calibrated_s, 0.0)}
  spec = timings.outputs["spec"]
  by_gamma = spec.gamma_hist.sum(0)
  cost = draft_cost(plan, loaded) if by_gamma[1:].sum() < 0.5 * by_gamma.sum() else None
  return Measured(ar=timings.outputs["ar"], spec=spec, timings=timings, compile_s=compile_s,
                  costs=costs, draft_cost=cost)


def draft_cost(plan: Plan, loaded: Loaded, tokens: int = 16) -> Optional[float]:
  """c: the draft model's autoregressive time per token over the target's, on the first
  input (a short decode each, compiled once, three interleaved passes); None for a drafter
  without a model of its own (prompt lookup, a feature head)."""
  if plan.draft is None or plan.drafter.wants_features:  # no model of its own to time
    return None
  first, lengths = plan.inputs[:1], None
  if plan.prompt_lengths is not None:
    lengths = plan.prompt_lengths[:1]
  budget = min(tokens, plan.settings.max_new_tokens)
  run = lambda model, params: lambda: autoregressive_decode(
      model, params, first, max_new_tokens=budget, rng=jax.random.PRNGKey(0),
      config=dataclasses.replace(plan.settings.decoding, eos_id=-1, cache_len=None),
      prompt_lengths=lengths,
      partitioner=plan.settings.partitioner)
  timings = timing.interleaved({"draft": run(plan.draft, loaded.draft_params),
                                "target": run(plan.target, loaded.target_params)}, 3)
  return timings.ratio("draft", "target")[0]
