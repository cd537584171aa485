"""Benchmark: autoregressive vs speculative walltime on the bundled pairs, with an HF peer.

  python -m experiments.bench.speedup [--pair lm --pair translate] [--fast]
      [--gin_file=experiments/bench.gin]

What it runs, its columns and settings: docs/experiments.md, section "bench.speedup".
"""
from __future__ import annotations

import functools
from typing import Dict, List, Optional, Sequence, Tuple, Union

import gin
import jax
import numpy as np

from experiments.common.checks import check_counts
from experiments.common.cli import Cli, cli_main
from experiments.common.compare import batched
from experiments.common.decoding import Decoders, decode_config, in_batches, model_drafter
from experiments.common.inputs import Examples, load_examples, pad_rows
from experiments.common.output import header, markdown_table, write
from experiments.common.pairs import Pair
from specjax import timing
from specjax.command import run_cli
from specjax.decode import DecodeResult, Streaming
from specjax.data import load_vocab

FAST = dict(batches=(1,), max_new_tokens=6, repeats=1, gamma=2, stream_inputs=3, slots=1,
            stream_modes=("forced",), min_slots=None)  # padded: the batch-1 loops above
AR = "specjax autoregressive"
PEER_MISSING = ("WARNING: HF PEER SKIPPED: torch/transformers are not installed "
                "(pip install torch==2.13.0 transformers)")


def hf_peer(pair: Pair, ex: Examples, gamma: int, max_new_tokens: int,
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
  names = {"hf_greedy": False, "hf_assisted": True}
  t = timing.interleaved({name: functools.partial(generate, assisted)
                          for name, assisted in names.items()}, repeats)
  # specjax runs past EOS (every decoder does the same work) and emits EOS as a token;
  # HF's min_new_tokens forbids EOS instead, so the two agree up to the first EOS.
  eos = load_vocab().eos_id
  upto = [s.index(eos) if eos in s else len(s) for s in specjax_greedy]
  for name in names:
    hf_ids = [o[0, 1:].tolist() for o in t.outputs[name]]
    same = sum(h[:n] == s[:n] for h, s, n in zip(hf_ids, specjax_greedy, upto))
    result[name] = {"compile_s": t.compile_s[name], "steady_s": t.median(name),
                    "same_as_specjax": f"{same}/{len(rows)}"}
  return result


def peer_rows(pair: Pair, ex: Examples, t: timing.Timings, *, gamma: int,
              max_new_tokens: int, repeats: int, notes: List[str]) -> List[Dict]:
  """The HF rows of one batch (`hf_peer`; batch 1 only, an 'n/a' row otherwise) beside specjax's
  timings `t` of it; the export check, or why the peer was skipped, goes to `notes`."""
  batch = len(ex.inputs)
  if batch != 1:
    return [{"pair": pair.name, "batch": batch, "decoder": "HF assisted", "compile_s": "n/a",
             "steady_s": "n/a (HF assisted generation: batch 1 only)"}]
  greedy = [[int(x) for x in r] for r in np.asarray(t.outputs[AR].tokens)]
  hf = hf_peer(pair, ex, gamma, max_new_tokens, repeats, greedy)
  if "error" in hf:
    print(hf["error"])
    notes.append(hf["error"])
    return []
  notes.append(f"HF export check: max |logits_HF − logits_specjax| = "
               f"{hf['logits_max_abs_diff']:.2e}")
  rows = []
  for name in ("hf_greedy", "hf_assisted"):
    label = f"assisted γ={gamma}" if "assist" in name else "greedy"
    rows.append({"pair": pair.name, "batch": batch, "decoder": f"HF {label}",
                 "compile_s": hf[name]["compile_s"], "steady_s": hf[name]["steady_s"],
                 "ms_per_token": 1e3 * hf[name]["steady_s"] / max_new_tokens,
                 "speedup": t.median(AR) / hf[name]["steady_s"],
                 "same_as_specjax": hf[name]["same_as_specjax"]})
  return rows


def _padded_batches(decode, inputs: np.ndarray, keys, batch: int) -> DecodeResult:
  """`decode(rows, keys)` over consecutive batches of `batch` rows (`in_batches`: each runs
  until its slowest row is done)."""
  pad = lambda start: pad_rows(np.asarray(keys[start:start + batch]), batch)
  return in_batches(lambda rows, start: decode(rows, pad(start)), inputs, batch)


def stream_rows(pair: Pair, *, inputs: int, slots: int, max_new_tokens: int,
                gammas: Sequence[Union[int, str]], repeats: int, max_input_len: int,
                modes: Sequence[str] = ("eos", "forced"),
                min_slots: Optional[int] = 1) -> List[Dict]:
  """Padded batches vs streaming, autoregressive and speculative, with real EOS ('eos') and
  with EOS ignored ('forced': every row runs max_new_tokens); streaming with B slots
  throughout and, unless min_slots is None, with the tail shrink down to min_slots.
  Speculative rows for each of `gammas`: a fixed γ (its own drafter of max_gamma = γ, so a
  round's target call is γ + 1 wide) or 'auto' (the cost-aware policy, up to AUTO_MAX_GAMMA;
  its calibration runs in the untimed first call)."""
  ex = load_examples(pair, inputs, max_input_len)
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
    d = Decoders(pair, max_new_tokens,
                 decode_config(0.0, max_input_len + max_new_tokens + widest + 1, eos_id=eos_id))
    ar_decode = d.autoregressive()
    ar = lambda x, k, **kw: ar_decode(x, rng=k, **kw)
    runs = {"padded autoregressive": lambda: _padded_batches(ar, ex.inputs, keys, slots)}
    specs = {g: _speculative(d, g) for g in gammas}
    for g, spec in specs.items():
      runs[f"padded speculative γ={g}"] = functools.partial(_padded_batches, spec, ex.inputs,
                                                            keys, slots)
    for kind, streaming in streams.items():
      runs[f"{kind} autoregressive"] = functools.partial(ar, ex.inputs, keys, slots=streaming)
      for g, spec in specs.items():
        runs[f"{kind} speculative γ={g}"] = functools.partial(spec, ex.inputs, keys,
                                                              slots=streaming)
    t = timing.interleaved(runs, repeats)
    for name, out in t.outputs.items():
      kind = (name.split(" autoregressive")[0].split(" speculative")[0]
              if name.startswith("stream") else "stream")
      ratio, low, high = t.ratio(f"{kind} autoregressive", name)
      tokens = int(np.sum(out.lengths))
      rows.append({
          "pair": pair.name, "mode": mode, "inputs": inputs, "slots": slots, "decoder": name,
          "compile_s": t.compile_s[name], "steady_s": t.median(name),
          "ms_per_token": 1e3 * t.median(name) / tokens,
          "vs_stream_ar": ratio, "vs_stream_ar_range": f"{low:.2f}–{high:.2f}",
          "slot_utilization": out.slot_utilization, "tokens": tokens,
          "tokens_per_call": tokens / max(int(np.sum(out.target_calls)), 1),
          "alpha": out.pooled_alpha if "speculative" in name else None,
          "same_tokens": bool(np.array_equal(out.tokens,
                                             t.outputs["padded autoregressive"].tokens))})
  return rows


AUTO_MAX_GAMMA = 4
"""The largest γ the streaming bench's 'auto' rows may pick."""


def _speculative(d: Decoders, gamma: Union[int, str]):
  """decode(inputs, keys, **kw): speculative decoding at a fixed γ or under 'auto'."""
  decode = (d.auto().chain(*model_drafter(d.pair, AUTO_MAX_GAMMA), None) if gamma == "auto"
            else d.model_chain(int(gamma)))
  return lambda x, k, **kw: decode(x, rng=k, **kw)


STREAM_COLUMNS = ["pair", "mode", "inputs", "slots", "decoder", "compile_s", "steady_s",
                  "ms_per_token", "vs_stream_ar", "vs_stream_ar_range", "slot_utilization",
                  "tokens", "tokens_per_call", "alpha", "same_tokens"]


def batch_rows(pair: Pair, inputs: np.ndarray, *, gamma: int, max_new_tokens: int,
               repeats: int, config) -> Tuple[List[Dict], timing.Timings]:
  """One row per decoder, autoregressive and speculative with the pair's draft, on one batch of
  `inputs` [B, W], interleaved (`experiments.common.compare.batched`): the rows, the timings."""
  d = Decoders(pair, max_new_tokens, config)
  runs = {AR: functools.partial(d.autoregressive(), inputs),
          f"specjax speculative γ={gamma}": functools.partial(d.model_chain(gamma), inputs)}
  return batched(runs, repeats, reference=AR, pair=pair.name, batch=len(inputs))


@gin.configurable(module="bench")
def run(cli: Cli, *, batches: Sequence[int] = (1, 8), max_new_tokens: int = 32,
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
  check_counts(gamma=gamma, repeats=repeats, max_new_tokens=max_new_tokens,
                      batches=tuple(batches))
  rows, notes, streamed = [], [], []
  for pair in cli.pairs:
    config = decode_config(0.0, max_input_len + max_new_tokens + gamma + 1)
    for batch in batches:
      ex = load_examples(pair, batch, max_input_len)
      batch_table, t = batch_rows(pair, ex.inputs, gamma=gamma, max_new_tokens=max_new_tokens,
                                  repeats=repeats, config=config)
      rows += batch_table
      if pair.target.is_encoder_decoder and peer:
        rows += peer_rows(pair, ex, t, gamma=gamma, max_new_tokens=max_new_tokens,
                          repeats=repeats, notes=notes)
    if stream_inputs:
      streamed += stream_rows(pair, inputs=stream_inputs, slots=slots,
                              max_new_tokens=max_new_tokens,
                              gammas=tuple(stream_gammas or (gamma,)), repeats=repeats,
                              max_input_len=max_input_len, modes=stream_modes,
                              min_slots=min_slots)
  md = header("Benchmark: autoregressive vs speculative (greedy)", cli.pairs, [
      f"{max_new_tokens} new tokens per row, median of {repeats} interleaved runs; "
      "compile_s = the warm-up run less the median run", *notes])
  if rows:
    md += "\n" + markdown_table(rows, ["pair", "batch", "decoder", "compile_s", "steady_s",
                                              "ms_per_token", "speedup", "alpha",
                                              "tokens_per_call", "same_as_specjax"])
  if streamed:
    md += (f"\n\n## Streaming: {stream_inputs} inputs through {slots} slots vs padded batches of "
           f"{slots}\n\nvs_stream_ar: the time of streaming autoregressive (of the same kind: "
           "B slots throughout, or with the tail shrink; padded rows: B slots) / this time, median "
           "and range of the per-repeat ratios; slot_utilization: useful row-rounds / row-rounds "
           "run (padded: each batch runs as long as its slowest row); ms_per_token over the "
           "tokens generated (with EOS: up to each row's EOS); same_tokens: equal to padded "
           "autoregressive.\n\n"
           + markdown_table(streamed, STREAM_COLUMNS))
  return write(cli, "bench", rows + streamed, "", md=md, notes=notes)


main = cli_main(run, "bench", __doc__, FAST)


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
