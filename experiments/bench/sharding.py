"""Throughput of the decode loops on 1 vs N devices.

  python -m experiments.bench.sharding                  # 1 vs 8 forced host (CPU) devices
  python -m experiments.bench.sharding --devices 8 --num_partitions 2

What it runs, its columns and settings: docs/experiments.md, section "bench.sharding".
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from experiments.common.checks import check_counts
from experiments.common.cli import parse_cli
from experiments.common.decoding import decode_config
from experiments.common.output import write
from specjax.command import run_cli


def _measure(args) -> list:
  """Runs in the child: times AR and speculative decoding on a random-init decoder-only pair."""
  # pylint: disable=import-outside-toplevel
  import jax
  import numpy as np
  from specjax import timing
  from specjax.decode import autoregressive_decode, speculative_decode
  from specjax.draft import ModelDrafter
  from specjax.models.decoder_only import DecoderOnlyConfig, DecoderOnlyModel
  from specjax.runtime.sharding import Partitioner

  def build(layers, emb, seed):
    model = DecoderOnlyModel(DecoderOnlyConfig(vocab_size=512, emb_dim=emb, num_heads=8,
                                               num_layers=layers, head_dim=emb // 8,
                                               mlp_dim=4 * emb))
    return model, model.init(seed)

  target, target_params = build(args.layers, args.emb, 0)
  draft, draft_params = build(1, args.emb // 2, 1)
  partitioner = Partitioner(num_partitions=args.num_partitions) if args.sharded else None
  if partitioner is not None:
    target_params = partitioner.shard_params(target_params)
    draft_params = partitioner.shard_params(draft_params)
  prompts = np.random.default_rng(0).integers(2, 512, size=(args.batch, 16)).astype(np.int32)
  config = decode_config(0.0, 16 + args.new_tokens + 8)
  key = jax.random.PRNGKey(0)
  loops = {
      "autoregressive": lambda: autoregressive_decode(
          target, target_params, prompts, max_new_tokens=args.new_tokens, rng=key,
          config=config, partitioner=partitioner),
      "speculative": lambda: speculative_decode(
          target, target_params, ModelDrafter(draft, max_gamma=4), draft_params, prompts,
          max_new_tokens=args.new_tokens, gamma=4, rng=key, config=config,
          partitioner=partitioner),
  }
  mesh = "none" if partitioner is None else "x".join(map(str, partitioner.mesh.shape.values()))
  t = timing.interleaved(loops, args.repeats)
  return [{"devices": jax.device_count(), "platform": jax.devices()[0].platform, "mesh": mesh,
           "loop": name, "batch": args.batch,
           "tokens_per_s": float(np.asarray(t.outputs[name].lengths).sum()) / t.median(name)}
          for name in loops]


FLAGS = {"--devices": dict(type=int, default=8, help="forced host devices (CPU)"),
         "--num_partitions": dict(type=int, default=1, help="'model' mesh axis"),
         "--batch": dict(type=int, default=32), "--new_tokens": dict(type=int, default=32),
         "--layers": dict(type=int, default=2), "--emb": dict(type=int, default=128),
         "--repeats": dict(type=int, default=1, help="timed runs of each loop (median)"),
         "--child": dict(action="store_true", help=argparse.SUPPRESS),
         "--sharded": dict(action="store_true", help=argparse.SUPPRESS)}
FAST = dict(devices=2, batch=2, new_tokens=4, layers=1, emb=32)


def main(argv=None):
  cli = parse_cli(argv, __doc__, "bench_sharding", needs_pairs=False, flags=FLAGS, fast=FAST,
                  weights_dtype=None)
  args = cli.args
  check_counts(devices=args.devices, num_partitions=args.num_partitions, batch=args.batch,
               new_tokens=args.new_tokens, layers=args.layers, emb=args.emb,
               repeats=args.repeats)
  if args.child:
    print(json.dumps(_measure(args)))
    return None
  rows = []
  for devices, sharded in ((1, False), (args.devices, True)):
    env = dict(os.environ)
    if devices > 1:
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                          f" --xla_force_host_platform_device_count={devices}").strip()
    cmd = ([sys.executable, "-m", "experiments.bench.sharding", "--child",
           "--num_partitions", str(args.num_partitions if sharded else 1), "--batch",
           str(args.batch), "--new_tokens", str(args.new_tokens), "--layers", str(args.layers),
           "--emb", str(args.emb), "--repeats", str(args.repeats)]
           + (["--sharded"] if sharded else []))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
      raise SystemExit(proc.stderr[-3000:])
    rows += json.loads(proc.stdout.strip().splitlines()[-1])
  return write(cli, "bench_sharding", rows, "Decode throughput on 1 vs N devices", [
      f"a random-init decoder-only pair ({args.layers} layers, width {args.emb}), batch "
      f"{args.batch}, {args.new_tokens} new tokens; tokens_per_s over the median of "
      f"{args.repeats} runs",
      *(["CPU host devices share the same cores: a smoke test of the sharded path, not a "
         "scaling measurement"] if rows[0]["platform"] == "cpu" else [])], pairs=[])


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
