"""Speculative decoding at the gin model sizes: step costs beside the memory roofline.

    python -m experiments.bench.scale --sizes xxl --families decoder_only \\
        [--batches 1 8] [--gamma 4] [--new_tokens 128] [--repeats 5] [--dtype bfloat16] \\
        [--attention specjax xla] [--xla_preset default] [--hlo] --output_dir DIR
    python -m experiments.bench.scale --fast --hlo   # CPU smoke run (tiny sizes, float32)

What it runs, its columns and settings: docs/experiments.md, section "bench.scale".
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import xla_bridge

from specjax.aot import hlo as hlo_stats
from specjax.aot.report import read_weights
from experiments.common.checks import check_counts
from experiments.common.cli import parse_cli
from experiments.common.output import Output, markdown_table
from experiments.reference_decoder import reference_decode
from specjax import timing
from specjax.analysis import expected_tokens
from specjax.app.gin_config import model_config_from_file
from specjax.command import run_cli
from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.draft import FeatureDrafter, ModelDrafter
from specjax.models import FeatureHead, FeatureHeadConfig, build_model
from specjax.models.layers import ATTENTION_IMPLEMENTATIONS
from specjax.params import cast_kernels, count_params
from specjax.sampling import Sampling

XLA_PRESETS = {
    "default": "",
    "no_command_buffer": "--xla_gpu_enable_command_buffer=",
    "while_command_buffer": ("--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL "
                             "--xla_gpu_graph_min_graph_size=1"),
    "while_unrolled": ("--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL "
                       "--xla_gpu_graph_min_graph_size=1 "
                       "--xla_gpu_command_buffer_unroll_loops=true"),
}
"""XLA_FLAGS presets: XLA:GPU's defaults; command buffers off; the while loops and
conditionals taken into command buffers (CUDA graphs: no per-iteration predicate copy to the
host); the same with loops of known trip count unrolled inside the command buffer."""
FAMILIES = {"decoder_only": "decoder_only_{}.gin", "t5": "t5_1_1_{}.gin"}
SIZES = {"tiny": "tiny", "large": "small", "xl": "small", "xxl": "small"}
"""Target size -> draft size (the smoke run's drafts are tiny too)."""
ALPHAS = (0.6, 0.75, 0.9)


def set_xla_flags(flags: str) -> None:
  """Appends `flags` to XLA_FLAGS; ValueError once JAX's backend is up (flags are read then)."""
  if not flags:
    return
  if xla_bridge.backends_are_initialized():
    raise ValueError("XLA flags must be set before JAX starts its backend: run bench_scale in a "
                     "fresh process (python -m experiments.bench.scale ...)")
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()


def model_config(family: str, size: str, *, dtype: str, attention: str, tied: bool):
  """The gin file's config for `family` at `size`, with the run's dtype, attention
  implementation and logits tied to the embedding or not."""
  config = model_config_from_file("models/" + FAMILIES[family].format(size))
  return dataclasses.replace(config, dtype=dtype, attention_impl=attention,
                             logits_via_embedding=tied)


def step_bytes(model, params, batch: int, cache_len: int, input_len: int) -> int:
  """Bytes one autoregressive step reads: the decoder's weights that it reads, as stored
  (`specjax.aot.report.read_weights`: the embedding only when the logits use it, no T5
  cross-attention key and value kernels), every KV-cache buffer and, for T5, the encoded
  inputs."""
  cfg = model.config
  weights = sum(int(np.prod(v.shape)) * v.dtype.itemsize for v in read_weights(params))
  itemsize = np.dtype(model.init_cache(1, 1).keys[0].dtype).itemsize
  layers = cfg.num_layers if hasattr(cfg, "num_layers") else cfg.num_decoder_layers
  per_slot = 2 * layers * batch * cfg.num_heads * cfg.head_dim * itemsize
  return weights + per_slot * (cache_len + (input_len if model.is_encoder_decoder else 0))


def copy_gbps(megabytes: int, repeats: int) -> float:
  """Device bandwidth in GB/s: bytes read + written per second by a jitted copy of a
  `megabytes` float32 array into a new buffer on the same device."""
  x = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
  copy = jax.jit(jnp.copy)
  t = timing.interleaved({"copy": lambda: copy(x)}, repeats)
  return 2 * x.nbytes / t.median("copy") / 1e9


def build_models(family: str, size: str, args) -> Dict[str, Any]:
  """attention implementation -> ((target, params), (tied draft, params), (untied draft,
  params), (feature head, params)): random init, weights cast to --dtype; one parameter set
  per model, shared by the implementations (they read the same tree)."""
  roles = ((size, True, 0), (SIZES[size], True, 1), (SIZES[size], False, 2))
  models = {att: [build_model(model_config(family, s, dtype=args.dtype, attention=att, tied=t))
                  for s, t, _ in roles] for att in args.attention}
  for att, ms in models.items():  # a feature head for the target (EAGLE-style)
    ms.append(feature_head(ms[0], att, args.dtype))
  params = []
  for model, seed in zip(models[args.attention[0]], (0, 1, 2, 3)):
    p = model.init(seed)
    params.append(cast_kernels(p, jnp.bfloat16) if args.dtype == "bfloat16" else p)
  return {att: tuple(zip(ms, params)) for att, ms in models.items()}


def feature_head(target, attention: str, dtype: str) -> FeatureHead:
  """A feature head (`specjax.models.FeatureHead`: one decoder layer) at the target's width,
  heads and MLP size, random init: its step cost at scale, not its α."""
  cfg = target.config
  return FeatureHead(FeatureHeadConfig(
      vocab_size=cfg.vocab_size, emb_dim=cfg.emb_dim, num_heads=cfg.num_heads,
      head_dim=cfg.head_dim, mlp_dim=cfg.mlp_dim, mlp_activations=cfg.mlp_activations,
      dtype=dtype, attention_impl=attention))


def setting_rows(family: str, size: str, batch: int, args, gbps: float, built: Dict[str, Any]
                 ) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
  """One row per attention implementation of this family, size and batch (runs interleaved),
  and with --hlo the target step's HLO counts per implementation (`hlo_stats`).

  built: `build_models(family, size, args)`.
  """

  n, gamma = args.new_tokens, args.gamma
  cache_len = args.prompt_len + n + gamma + 1
  config = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=-1, cache_len=cache_len)
  common = dict(max_new_tokens=n, rng=jax.random.PRNGKey(0), config=config)
  vocab = built[args.attention[0]][0][0].vocab_size
  prompts = np.random.default_rng(batch).integers(2, vocab, (batch, args.prompt_len),
                                                  dtype=np.int32)
  runs = {}
  for att in args.attention:
    (target, tparams), (tied, tied_p), (untied, untied_p), (head, head_p) = built[att]
    runs[f"{att}:target"] = functools.partial(autoregressive_decode, target, tparams, prompts,
                                              **common)
    runs[f"{att}:draft"] = functools.partial(autoregressive_decode, tied, tied_p, prompts,
                                             **common)
    for name, draft, dparams in (("spec_tied", tied, tied_p), ("spec_untied", untied, untied_p)):
      runs[f"{att}:{name}"] = functools.partial(
          speculative_decode, target, tparams, ModelDrafter(draft, gamma), dparams, prompts,
          gamma=gamma, **common)
    feature = FeatureDrafter(target, head, gamma)
    runs[f"{att}:spec_feature"] = functools.partial(
        speculative_decode, target, tparams, feature, feature.params(head_p, tparams), prompts,
        gamma=gamma, **common)
    if family == "decoder_only":
      runs[f"{att}:reference"] = functools.partial(reference_decode, target.config, tparams,
                                                   prompts, n, cache_len)
  t = timing.interleaved(runs, args.repeats)
  rows, steps = [], {}
  for att in args.attention:
    target, tparams = built[att][0]
    if args.hlo:
      encoded = target.encode(tparams, prompts) if target.is_encoder_decoder else None
      steps[att] = hlo_stats.decode_step_stats(target, tparams, batch, cache_len, encoded)
    rows.append(_row(t, att, built[att], family, size, batch, args,
                     1e3 * step_bytes(target, tparams, batch, cache_len, args.prompt_len)
                     / (gbps * 1e9)))
  return rows, steps


def _row(t, att: str, models, family: str, size: str, batch: int, args,
         floor_ms: float) -> Dict[str, Any]:
  """The table row of one attention implementation from the interleaved timings `t`."""
  n, gamma = args.new_tokens, args.gamma
  ms = lambda name: 1e3 * t.median(f"{att}:{name}") / n  # per step (one token per row)
  spread = lambda name: [round(1e3 * s / n, 4) for s in t.spread(f"{att}:{name}")]
  out = lambda name: t.outputs[f"{att}:{name}"]
  ar_tokens = np.asarray(out("target").tokens)
  same = lambda name: bool(np.array_equal(np.asarray(out(name).tokens), ar_tokens))
  per_call = {d: float(np.mean(out(f"spec_{d}").tokens_per_call)) for d in ("tied", "untied")}
  round_ms = ms("spec_untied") * per_call["untied"]  # time per round of γ draft steps + 1 call
  row = {
      "family": family, "size": size, "batch": batch, "attention": att, "dtype": args.dtype,
      "xla_preset": args.xla_preset, "gamma": gamma,
      "target_params_M": count_params(models[0][1]) / 1e6,
      "draft_params_M": count_params(models[1][1]) / 1e6,
      "target_ms_per_token": ms("target") / batch, "target_step_ms": ms("target"),
      "target_step_spread_ms": spread("target"),
      "draft_ms_per_token": ms("draft") / batch, "draft_step_ms": ms("draft"),
      "c": ms("draft") / ms("target"),
      "spec_tied_ms_per_token": ms("spec_tied") / batch,
      "spec_tied_spread_ms_per_step": spread("spec_tied"),
      "speedup_tied": ms("target") / ms("spec_tied"),
      "tokens_per_call_tied": per_call["tied"],
      "alpha_tied": float(np.mean(out("spec_tied").alpha)),
      "spec_untied_ms_per_token": ms("spec_untied") / batch,
      "speedup_untied": ms("target") / ms("spec_untied"),
      "tokens_per_call_untied": per_call["untied"],
      "alpha_untied": float(np.mean(out("spec_untied").alpha)),
      "round_ms": round_ms,
      "spec_feature_ms_per_token": ms("spec_feature") / batch,
      "speedup_feature": ms("target") / ms("spec_feature"),
      "tokens_per_call_feature": float(np.mean(out("spec_feature").tokens_per_call)),
      "feature_round_ms": ms("spec_feature") * float(np.mean(out("spec_feature").tokens_per_call)),
      "greedy_equal_feature": same("spec_feature"),
      "step_floor_ms": floor_ms, "roofline_fraction": floor_ms / ms("target"),
      "greedy_equal_tied": same("spec_tied"), "greedy_equal_untied": same("spec_untied"),
      "compile_s": {name.split(":", 1)[1]: s for name, s in t.compile_s.items()
                    if name.startswith(f"{att}:")},
  }
  for alpha in ALPHAS:
    row[f"predicted_speedup_{alpha}"] = (float(expected_tokens(alpha, gamma)) * ms("target")
                                         / round_ms)
  if family == "decoder_only":
    row["reference_step_ms"] = ms("reference")
    row["target_vs_reference"] = ms("reference") / ms("target")
    row["greedy_equal_reference"] = bool(np.array_equal(np.asarray(out("reference")), ar_tokens))
  return row


COLUMNS = ["family", "size", "batch", "attention", "target_ms_per_token", "draft_ms_per_token",
           "c", "spec_tied_ms_per_token", "speedup_tied", "tokens_per_call_tied",
           "spec_untied_ms_per_token", "speedup_untied", "round_ms", "feature_round_ms",
           "speedup_feature", "roofline_fraction",
           "predicted_speedup_0.6", "predicted_speedup_0.75", "predicted_speedup_0.9",
           "target_vs_reference", "greedy_equal_tied", "greedy_equal_untied",
           "greedy_equal_feature", "greedy_equal_reference"]


FLAGS = {"--sizes": dict(nargs="+", default=["xxl"], choices=sorted(SIZES)),
         "--families": dict(nargs="+", default=["decoder_only"], choices=sorted(FAMILIES)),
         "--batches": dict(type=int, nargs="+", default=[1, 8]),
         "--gamma": dict(type=int, default=4), "--prompt_len": dict(type=int, default=16),
         "--new_tokens": dict(type=int, default=128), "--repeats": dict(type=int, default=5),
         "--dtype": dict(default="bfloat16", choices=["float32", "bfloat16"],
                         help="weights and activations (float32 for exact greedy comparisons)"),
         "--attention": dict(nargs="+", default=["specjax"],
                             choices=sorted(ATTENTION_IMPLEMENTATIONS),
                             help="attention implementations to compare"),
         "--xla_preset": dict(default="default", choices=sorted(XLA_PRESETS)),
         "--xla_flags": dict(default="", help="more XLA_FLAGS for this run"),
         "--copy_mb": dict(type=int, default=1024,
                           help="size of the bandwidth probe's copy (MB)"),
         "--hlo": dict(action="store_true",
                       help="count ops of the compiled loops (specjax.aot.hlo)")}
FAST = dict(sizes=["tiny"], batches=[1], new_tokens=4, repeats=1, dtype="float32", copy_mb=4)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
  """The command line (see the module docstring), its own flags and --output_dir."""
  cli = parse_cli(argv, __doc__, "bench_scale", needs_pairs=False, flags=FLAGS, fast=FAST,
                  weights_dtype=None)
  args = cli.args
  check_counts(gamma=args.gamma, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
               repeats=args.repeats, copy_mb=args.copy_mb, batches=args.batches)
  args.output_dir = str(cli.output_dir)
  return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """Runs the bench; writes bench_scale.json and bench_scale.md; returns the JSON object."""
  args = parse_args(argv)
  dump = tempfile.mkdtemp(prefix="bench_scale_hlo_") if args.hlo else None
  rows, hlo = [], {}
  try:
    set_xla_flags(" ".join(f for f in (XLA_PRESETS[args.xla_preset], args.xla_flags,
                                       hlo_stats.dump_flags(dump) if dump else "") if f))
    gbps = copy_gbps(args.copy_mb, args.repeats)
    for family in args.families:
      for size in args.sizes:
        built = build_models(family, size, args)
        for batch in args.batches:
          new, steps = setting_rows(family, size, batch, args, gbps, built)
          rows += new
          if dump:  # the loops as compiled last in this setting (the last attention variant)
            hlo[f"{family}/{size}/B{batch}"] = {
                "loops": {name: hlo_stats.loop_stats(text)
                          for name, text in hlo_stats.loop_modules(dump).items()},
                "decode_step": steps}
            shutil.rmtree(dump)
            os.mkdir(dump)
  finally:
    if dump:
      shutil.rmtree(dump, ignore_errors=True)
  result = {"device": str(jax.devices()[0].device_kind), "platform": jax.devices()[0].platform,
            "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "copy_gbps": gbps, "settings": vars(args), "rows": rows, "hlo": hlo}
  out = Path(args.output_dir)
  md = (f"# bench_scale\n\n- device: {result['device']} ({result['platform']}), jax "
        f"{result['jax']}, copy bandwidth {gbps:.1f} GB/s (read + written)\n"
        f"- greedy, {args.new_tokens} new tokens after {args.prompt_len}-token random prompts, "
        f"γ = {args.gamma}, {args.dtype}, median of {args.repeats} interleaved runs, compile "
        f"apart; XLA preset {args.xla_preset}\n\n" + markdown_table(rows, COLUMNS) + "\n")
  written = Output(out, "bench_scale")
  written.json(result)
  written.markdown(md)
  print(md)
  return result


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
