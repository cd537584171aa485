"""The speculative decode: Algorithm 1's loop (`round.SpeculativeLoop`) under the one runner.

`speculative_decode` checks its arguments once (`inputs.check_decode`), then hands the loop to
`runner.decode`: the 'auto' policy settled once (`calibration.decide`; the autoregressive loop
when the policy would never speculate), one padded batch or the inputs streamed through slots.

Rows advance independently (each by its own n + 1 per round), finish at their own EOS or
budget, and draw randomness from keys tied to (row, absolute position, stream), so a row's
output does not depend on its batch. `max_new_tokens` and γ ≤ `drafter.max_gamma` are traced
data: changing them does not recompile.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

import jax

from specjax.decode import auto, runner
from specjax.decode.auto import calibration
from specjax.decode.config import DecodeConfig
from specjax.decode.chain_checks import check_chain
from specjax.decode.round import SpeculativeLoop
from specjax.decode.state import DecodeResult, LoopParams
from specjax.decode.stream import Streaming
from specjax.draft import Drafter
from specjax.models import DecodingModel
from specjax.runtime.sharding import Partitioner


def speculative_decode(target: DecodingModel, target_params: Any, drafter: Drafter,
                       draft_params: Any, inputs, *, max_new_tokens: int,
                       gamma: Optional[int] = None, rng: jax.Array,
                       config: DecodeConfig = DecodeConfig(), prompt_lengths=None,
                       partitioner: Optional[Partitioner] = None,
                       costs: Optional[auto.CostTable] = None,
                       slots: Union[int, Streaming, None] = None,
                       on_progress: Optional[Callable[[int, int], None]] = None
                       ) -> DecodeResult:
  """Speculative decoding (Algorithm 1 in a loop), exact for the target's distribution.

  Each round the drafter proposes γ guesses with their standardized q, the target
  scores all γ+1 positions in ONE `decode` call, `verify` accepts n of them and
  draws one more token, and the row advances by n + 1.

  Args:
    target: the target `DecodingModel`.
    target_params: its parameters.
    drafter: a `specjax.draft` drafter (its `max_gamma` sizes the static buffers).
    draft_params: the drafter's parameters (its model's params or n-gram tables; None if unused).
    inputs: int32 [B, L]: encoder inputs (T5) or left-aligned prompts (decoder-only), 0-padded.
    max_new_tokens: generation budget per row (data).
    gamma: guesses per round, 1 ≤ γ ≤ drafter.max_gamma (data: no recompile); the first
      round's γ for 'heuristic' / 'optimal'; for 'auto' the largest γ the policy may pick
      (its γ cap; default max_gamma).
    rng: one PRNG key, or one key per row [B].
    config: static settings.
    prompt_lengths: optional int [B] for decoder-only prompts.
    partitioner: as for `autoregressive_decode` (drafter params are placed too).
    costs: 'auto' only: the `auto.CostTable` to decide with. None: calibrated on these
      inputs on the first call for these models, batch size and cache length, then reused
      (`calibration.CALIBRATED`, bounded). Decisions are a pure function of the table and
      the decode state, so the same table and seed reproduce the tokens.
      Streaming: calibrated at batch `slots` on the first `slots` inputs.
    slots: stream the B inputs through this many slots (in-flight batching,
      `specjax.decode.stream`): a finished row takes the next input, its encoder / prefill and
      drafter state start for that slot. None: one padded batch.
      A `specjax.decode.Streaming` sets refill rows and the tail shrink too.
    on_progress: streaming: called as on_progress(done, B) after every `slots` finished inputs.
  Returns:
    A `DecodeResult` with tokens [B, max_new_tokens], per-row statistics, in input order
    (streaming: with `rounds` and `slot_rounds`, see `DecodeResult.slot_utilization`) and,
    under 'auto', the cost table it used.
  """
  auto_policy = config.gamma_policy == "auto"
  if gamma is None and not auto_policy:
    raise ValueError(f"gamma is required for gamma_policy={config.gamma_policy!r}")
  if costs is not None and not auto_policy:
    raise ValueError(f"a cost table is for gamma_policy='auto', not {config.gamma_policy!r}")
  entry = runner.enter(target, config, inputs, max_new_tokens, prompt_lengths, slots,
                       partitioner, drafter=drafter, gamma=gamma)
  check_chain(drafter.max_gamma, [target, *drafter.models], entry.rows, entry.checked.cache_len,
              target.vocab_size, entry.checked.cache_size, partitioner)
  return runner.decode(SpeculativeLoop(target, drafter, entry.config),
                       LoopParams(target=target_params, drafter=draft_params), entry.checked,
                       rng, streaming=entry.streaming, partitioner=partitioner,
                       on_progress=on_progress, costs=costs)


def calibrate_costs(target: DecodingModel, target_params: Any, drafter: Drafter,
                    draft_params: Any, inputs, *, max_new_tokens: int,
                    config: DecodeConfig = DecodeConfig(gamma_policy="auto"), prompt_lengths=None,
                    partitioner: Optional[Partitioner] = None, rng: Optional[jax.Array] = None,
                    rounds: int = 6, repeats: int = 5) -> auto.CostTable:
  """Measures the 'auto' policy's `CostTable` for these models, batch and cache length.

  Runs the compiled speculative loop on `inputs` (the same executable the decode uses:
  no extra compile), each run forcing one round variant (γ = 0 or a bucket) for R ≥
  `rounds` rolled-back rounds, beside runs of 0 rounds for the fixed part, interleaved and
  repeated, then checked on real rounds (`auto.time_rounds`, `specjax.decode.auto.timing`):
  about repeats × (len(buckets) + 2) runs holding repeats × (len(buckets) + 1) × R rounds,
  and 3 × 3 runs of the check (more when it disagrees), milliseconds on an accelerator,
  seconds on a loaded CPU at large batch (reported as `calibration_s`). Arguments as for
  `speculative_decode`; config must use gamma_policy='auto'.
  """
  if config.gamma_policy != "auto":
    raise ValueError(f"calibrate_costs needs gamma_policy='auto', got {config.gamma_policy!r}")
  rng = jax.random.PRNGKey(0) if rng is None else rng
  prepared = prepare_decode(target, target_params, drafter, draft_params, inputs,
                            max_new_tokens=max_new_tokens, rng=rng, config=config,
                            prompt_lengths=prompt_lengths, partitioner=partitioner)
  return calibration.measure(prepared, rounds, repeats)


def prepare_decode(target: DecodingModel, target_params: Any, drafter: Drafter,
                   draft_params: Any, inputs, *, max_new_tokens: int, rng: jax.Array,
                   config: DecodeConfig = DecodeConfig(), prompt_lengths=None,
                   partitioner: Optional[Partitioner] = None) -> calibration.PreparedDecode:
  """A checked padded-batch decode whose `run(max_new_tokens, gamma, control)` runs the
  compiled loop with an explicit 'auto' control (`auto.AutoControl`: forced schedules,
  rollback), as calibration does; it returns (DecodeResult, nan bool [B]). Arguments as
  for `speculative_decode`."""
  entry = runner.enter(target, config, inputs, max_new_tokens, prompt_lengths, None,
                       partitioner, drafter=drafter)
  return runner.prepare(SpeculativeLoop(target, drafter, entry.config),
                        LoopParams(target=target_params, drafter=draft_params), entry.checked,
                        slice(None), rng, partitioner)
