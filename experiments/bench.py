"""Benchmark: autoregressive vs speculative walltime on the bundled pairs, with an HF peer.

  python -m experiments.bench [--pair lm --pair translate] [--fast]
      [--gin_file=experiments/bench.gin]

Streaming (in-flight batching, `slots=`): `stream_inputs` bundled inputs through `slots`
slots, with real EOS and with EOS ignored (every row runs the full budget), against today's
padded batches of the same size (each runs until its slowest row is done): walltime, the
ratio to streaming autoregressive (median and range of the per-repeat ratios, interleaved),
and slot utilization = useful rounds / rounds run.

For each pair and batch size: compile (+ first run) time apart from steady-state
time, the median of `repeats` interleaved runs, greedy. Peer, in the same run and
on the SAME translation weights: HuggingFace transformers assisted generation
(PyTorch CPU, `generate(assistant_model=...)`, greedy, constant γ), on the target
and draft exported by `specjax.app.export_hf` (the export is checked by matching
logits first). HF assisted generation takes batch 1 only, so its batch-8 cells are
"n/a". Without torch/transformers installed the peer is skipped with a loud message.
"""
from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from typing import Dict, List, Optional, Sequence, Union

import gin
import jax
import numpy as np

from experiments import common
from specjax.decode import DecodeResult, Streaming, autoregressive_decode, speculative_decode
from specjax.data import load_vocab

FAST = dict(batches=(1,), max_new_tokens=6, repeats=1, gamma=2, stream_inputs=3, slots=1,
            stream_modes=("forced",), min_slots=None)  # padded: the batch-1 loops above
PEER_MISSING = ("WARNING: HF PEER SKIPPED: torch/transformers are not installed "
                "(pip install torch==2.13.0 transformers)")


def _median_times(runs: Dict, repeats: int) -> Dict:
  """name -> (compile + first run seconds, median seconds, first output), interleaved."""
  compile_s, times, outs = _interleaved(runs, repeats)
  return {name: (compile_s[name], statistics.median(times[name]), outs[name]) for name in runs}


def hf_peer(pair: common.Pair, ex: common.Examples, gamma: int, max_new_tokens: int,
            repeats: int, specjax_greedy: List[List[int]]) -> Dict:
  """HF greedy and assisted generation on exported weights, batch 1 per example."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    return {"error": PEER_MISSING}
  from specjax.app import export_hf  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  target = export_hf.to_hf(pair.target.config, pair.target_params)
  draft = export_hf.to_hf(pair.draft.config, pair.draft_params)
  rows = [torch.from_numpy(r[r != 0][None].astype(np.int64)) for r in ex.inputs]
  # the export, checked: logits of the first example's greedy continuation
  ids = [0] + specjax_greedy[0][:max_new_tokens - 1]
  with torch.no_grad():
    hf_logits = target(input_ids=rows[0], decoder_input_ids=torch.tensor([ids])).logits.numpy()
  ours = np.asarray(pair.target.logits(pair.target_params, ex.inputs[:1], np.array([ids])))
  max_diff = float(np.abs(hf_logits - ours).max())

  def generate(assisted: bool):
    outs = []
    for row in rows:
      kwargs = dict(assistant_model=draft, num_assistant_tokens=gamma,
                    num_assistant_tokens_schedule="constant",
                    assistant_confidence_threshold=0.0) if assisted else {}
      with torch.no_grad():
        outs.append(target.generate(input_ids=row, attention_mask=torch.ones_like(row),
                                    do_sample=False, max_new_tokens=max_new_tokens,
                                    min_new_tokens=max_new_tokens, **kwargs))
    return outs

  result = {"logits_max_abs_diff": max_diff}
  for name, assisted in (("hf_greedy", False), ("hf_assisted", True)):
    start = time.perf_counter()
    outs = generate(assisted)
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      generate(assisted)
      times.append(time.perf_counter() - start)
    hf_ids = [o[0, 1:].tolist() for o in outs]
    # specjax runs past EOS (every decoder does the same work) and emits EOS as a token;
    # HF's min_new_tokens forbids EOS instead, so the two agree up to the first EOS.
    eos = load_vocab().eos_id
    upto = [s.index(eos) if eos in s else len(s) for s in specjax_greedy]
    same = sum(h[:n] == s[:n] for h, s, n in zip(hf_ids, specjax_greedy, upto))
    result[name] = {"first_s": first, "steady_s": statistics.median(times),
                    "same_as_specjax": f"{same}/{len(rows)}"}
  return result


def _padded_batches(decode, inputs: np.ndarray, keys, batch: int) -> DecodeResult:
  """`decode(rows, keys)` over consecutive batches of `batch` rows (the last padded by
  repeating its last row: one compiled shape), joined; `rounds` = Σ the batches' slowest row
  (each batch runs until its slowest row is done), over `batch` rows each."""
  outs, rounds = [], 0
  for start in range(0, len(inputs), batch):
    rows, row_keys = inputs[start:start + batch], keys[start:start + batch]
    pad = batch - len(rows)
    if pad:
      rows = np.concatenate([rows, np.repeat(rows[-1:], pad, 0)])
      row_keys = jax.numpy.concatenate([row_keys, jax.numpy.repeat(row_keys[-1:], pad, 0)])
    out = decode(rows, row_keys)
    rounds += int(np.max(out.target_calls))
    outs.append(jax.tree.map(lambda x: x[:batch - pad], out))
  joined = jax.tree.map(lambda *x: jax.numpy.concatenate(x), *outs)
  return joined.replace(rounds=jax.numpy.int32(rounds),
                        slot_rounds=jax.numpy.int32(rounds * batch))


def stream_rows(pair: common.Pair, *, inputs: int, slots: int, max_new_tokens: int,
                gammas: Sequence[Union[int, str]], repeats: int, max_input_len: int,
                modes: Sequence[str] = ("eos", "forced"),
                min_slots: Optional[int] = 1) -> List[Dict]:
  """Padded batches vs streaming, autoregressive and speculative, with real EOS ('eos') and
  with EOS ignored ('forced': every row runs max_new_tokens); streaming with B slots
  throughout and, unless min_slots is None, with the tail shrink down to min_slots.
  Speculative rows for each of `gammas`: a fixed γ (its own drafter of max_gamma = γ, so a
  round's target call is γ + 1 wide) or 'auto' (the cost-aware policy, up to AUTO_MAX_GAMMA;
  its calibration runs in the untimed first call)."""
  ex = common.examples(pair, inputs, max_input_len)
  keys = jax.random.split(jax.random.PRNGKey(0), inputs)
  widest = max(AUTO_MAX_GAMMA if g == "auto" else int(g) for g in gammas)
  streams = {"stream": Streaming(slots)}
  if min_slots is not None and len(Streaming(slots, min_slots=min_slots).sizes()) > 1:
    streams[f"stream+shrink to {min_slots}"] = Streaming(slots, min_slots=min_slots)
  rows = []
  for mode in modes:
    if mode not in ("eos", "forced"):
      raise ValueError(f"stream modes are 'eos' and 'forced', got {mode!r}")
    eos_id = load_vocab().eos_id if mode == "eos" else -1
    # One cache length for every decoder: the same attention work per call.
    config = common.decode_config(0.0, max_input_len + max_new_tokens + widest + 1, eos_id=eos_id)
    ar = lambda x, k, **kw: autoregressive_decode(pair.target, pair.target_params, x,
                                                  max_new_tokens=max_new_tokens, rng=k,
                                                  config=config, **kw)
    runs = {"padded autoregressive": lambda: _padded_batches(ar, ex.inputs, keys, slots)}
    specs = {g: _speculative(pair, g, config, max_new_tokens) for g in gammas}
    for g, spec in specs.items():
      runs[f"padded speculative γ={g}"] = functools.partial(_padded_batches, spec, ex.inputs,
                                                            keys, slots)
    for kind, streaming in streams.items():
      runs[f"{kind} autoregressive"] = functools.partial(ar, ex.inputs, keys, slots=streaming)
      for g, spec in specs.items():
        runs[f"{kind} speculative γ={g}"] = functools.partial(spec, ex.inputs, keys,
                                                              slots=streaming)
    compile_s, times, outs = _interleaved(runs, repeats)
    for name, out in outs.items():
      kind = (name.split(" autoregressive")[0].split(" speculative")[0]
              if name.startswith("stream") else "stream")
      ratios = [b / t for b, t in zip(times[f"{kind} autoregressive"], times[name])]
      tokens = int(np.sum(out.lengths))
      rows.append({
          "pair": pair.name, "mode": mode, "inputs": inputs, "slots": slots, "decoder": name,
          "compile_s": compile_s[name], "steady_s": statistics.median(times[name]),
          "ms_per_token": 1e3 * statistics.median(times[name]) / tokens,
          "vs_stream_ar": statistics.median(ratios),
          "vs_stream_ar_range": f"{min(ratios):.2f}–{max(ratios):.2f}",
          "slot_utilization": out.slot_utilization, "tokens": tokens,
          "tokens_per_call": tokens / max(int(np.sum(out.target_calls)), 1),
          "alpha": (float(np.sum(out.alpha_sum) / max(np.sum(out.alpha_count), 1))
                    if "speculative" in name else None),
          "same_tokens": bool(np.array_equal(out.tokens, outs["padded autoregressive"].tokens))})
  return rows


AUTO_MAX_GAMMA = 4
"""The largest γ the streaming bench's 'auto' rows may pick."""


def _speculative(pair: common.Pair, gamma: Union[int, str], config, max_new_tokens: int):
  """decode(inputs, keys, **kw): speculative decoding at a fixed γ or under 'auto'."""
  if gamma == "auto":
    drafter, dparams = common.model_drafter(pair, AUTO_MAX_GAMMA)
    config = dataclasses.replace(config, gamma_policy="auto")
    gamma = None
  else:
    drafter, dparams = common.model_drafter(pair, int(gamma))
  return lambda x, k, **kw: speculative_decode(pair.target, pair.target_params, drafter, dparams,
                                               x, max_new_tokens=max_new_tokens, gamma=gamma,
                                               rng=k, config=config, **kw)


def _interleaved(runs: Dict, repeats: int):
  """(compile + first run seconds, all timed seconds, first outputs) per run, interleaved."""
  compile_s, outs = {}, {}
  for name, fn in runs.items():
    outs[name], compile_s[name] = common.timed(fn)
  times = {name: [] for name in runs}
  for _ in range(repeats):
    for name, fn in runs.items():
      times[name].append(common.timed(fn)[1])
  return compile_s, times, outs


STREAM_COLUMNS = ["pair", "mode", "inputs", "slots", "decoder", "compile_s", "steady_s",
                  "ms_per_token", "vs_stream_ar", "vs_stream_ar_range", "slot_utilization",
                  "tokens", "tokens_per_call", "alpha", "same_tokens"]


@gin.configurable(module="bench")
def run(cli: common.Cli, *, batches: Sequence[int] = (1, 8), max_new_tokens: int = 32,
        gamma: int = 4, repeats: int = 5, max_input_len: int = 48, peer: bool = True,
        stream_inputs: int = 64, slots: int = 8,
        stream_modes: Sequence[str] = ("eos", "forced"),
        min_slots: Optional[int] = 1,
        stream_gammas: Optional[Sequence[Union[int, str]]] = None) -> List[Dict]:
  """Writes bench.{md,csv,json}; returns the rows (one per pair, batch and decoder, then the
  streaming rows: one per pair, EOS mode and decoder).

  Args:
    cli: pairs and output folder.
    batches: batch sizes (each batch: the first B bundled examples).
    max_new_tokens: tokens per row (EOS ignored so every decoder does the same work).
    gamma: guesses per round; repeats: timed runs (median, interleaved, ≥ 5 for results).
    peer: run the HF assisted-generation peer on the translation pair.
    stream_inputs, slots: the streaming comparison: N bundled inputs through B slots (and in
      padded batches of B); 0 inputs: skipped. stream_modes: 'eos' (real EOS) and/or 'forced'.
    min_slots: also stream with the tail shrink (B, B/2, ... ≥ min_slots slots); None: not.
    stream_gammas: the streaming comparison's speculative decoders: fixed γ values and/or
      'auto'; None: (gamma,).
  """
  rows, notes, streamed = [], [], []
  for pair in cli.pairs:
    key = jax.random.PRNGKey(0)
    config = common.decode_config(0.0, max_input_len + max_new_tokens + gamma + 1)
    drafter, dparams = common.model_drafter(pair, gamma)
    for batch in batches:
      ex = common.examples(pair, batch, max_input_len)
      runs = {
          "specjax autoregressive": lambda: autoregressive_decode(
              pair.target, pair.target_params, ex.inputs, max_new_tokens=max_new_tokens,
              rng=key, config=config),
          f"specjax speculative γ={gamma}": lambda: speculative_decode(
              pair.target, pair.target_params, drafter, dparams, ex.inputs,
              max_new_tokens=max_new_tokens, gamma=gamma, rng=key, config=config)}
      timing = _median_times(runs, repeats)
      base = timing["specjax autoregressive"][1]
      for name, (compile_s, steady, out) in timing.items():
        rows.append({"pair": pair.name, "batch": batch, "decoder": name,
                     "compile_s": compile_s, "steady_s": steady,
                     "ms_per_token": 1e3 * steady / (batch * max_new_tokens),
                     "vs_ar": base / steady,
                     "alpha": float(np.mean(out.alpha)) if "speculative" in name else None})
      if pair.target.is_encoder_decoder and peer:
        if batch != 1:
          rows.append({"pair": pair.name, "batch": batch, "decoder": "HF assisted",
                       "compile_s": "n/a", "steady_s": "n/a (HF assisted generation: batch 1 only)"})
          continue
        greedy = [[int(t) for t in r] for r in np.asarray(timing["specjax autoregressive"][2].tokens)]
        hf = hf_peer(pair, ex, gamma, max_new_tokens, repeats, greedy)
        if "error" in hf:
          print(hf["error"])
          notes.append(hf["error"])
          continue
        notes.append(f"HF export check: max |logits_HF − logits_specjax| = "
                     f"{hf['logits_max_abs_diff']:.2e}")
        for name in ("hf_greedy", "hf_assisted"):
          rows.append({"pair": pair.name, "batch": batch,
                       "decoder": f"HF {'assisted γ=' + str(gamma) if 'assist' in name else 'greedy'}",
                       "compile_s": hf[name]["first_s"], "steady_s": hf[name]["steady_s"],
                       "ms_per_token": 1e3 * hf[name]["steady_s"] / max_new_tokens,
                       "vs_ar": base / hf[name]["steady_s"],
                       "same_as_specjax": hf[name]["same_as_specjax"]})
    if stream_inputs:
      streamed += stream_rows(pair, inputs=stream_inputs, slots=slots,
                              max_new_tokens=max_new_tokens,
                              gammas=tuple(stream_gammas or (gamma,)), repeats=repeats,
                              max_input_len=max_input_len, modes=stream_modes,
                              min_slots=min_slots)
  out = common.Output(cli.output_dir, "bench")
  md = common.header("Benchmark: autoregressive vs speculative (greedy)", cli.pairs, [
      f"{max_new_tokens} new tokens per row, median of {repeats} interleaved runs; "
      "compile_s = compile + first run (HF: first run)", *notes])
  if rows:
    md += "\n" + common.markdown_table(rows, ["pair", "batch", "decoder", "compile_s", "steady_s",
                                              "ms_per_token", "vs_ar", "alpha",
                                              "same_as_specjax"])
  if streamed:
    md += (f"\n\n## Streaming: {stream_inputs} inputs through {slots} slots vs padded batches of "
           f"{slots}\n\nvs_stream_ar: the time of streaming autoregressive (of the same kind: "
           "B slots throughout, or with the tail shrink; padded rows: B slots) / this time, median "
           "and range of the per-repeat ratios; slot_utilization: useful row-rounds / row-rounds "
           "run (padded: each batch runs as long as its slowest row); ms_per_token over the "
           "tokens generated (with EOS: up to each row's EOS); same_tokens: equal to padded "
           "autoregressive.\n\n"
           + common.markdown_table(streamed, STREAM_COLUMNS))
  out.tables(md, rows + streamed, cli.pairs, notes=notes)
  print(md)
  return rows + streamed


def main(argv: Optional[Sequence[str]] = None) -> List[Dict]:
  cli = common.parse_cli(argv, __doc__, "bench")
  return run(cli, **(FAST if cli.fast else {}))


if __name__ == "__main__":
  main()
