"""Compile a decoder-only step at the code of an older checkout, for the step-time model's fit.

    git archive COMMIT | tar -x -C SRC
    JAX_PLATFORMS=cpu python experiments/bench/aot_records.py SRC models/decoder_only_large.gin \
        bfloat16 h200.txtpb OUT.txt     # in an environment with that run's JAX and CUDA plugin

The step is `specjax.aot.report.step_piece`'s (4 one-token decodes in a fori_loop, batch 1, 88
cache slots), built with SRC's own models, compiled for the GPU that the GpuTargetConfigProto
file describes (no GPU needed), its optimized HLO written to OUT.txt for
`specjax.aot.cost.estimate` (docs/aot.md, "The step-time model").

    python experiments/bench/aot_records.py --fit h200:1.6289:large.txt h200:0.3622:small.txt \
        h100:4.656:xxl.txt      # the launch cost fitted to those programs and measured ms
"""
import dataclasses
import os
import sys
import time
if sys.argv[1] == "--fit":
  os.environ["JAX_PLATFORMS"] = "cpu"
  from specjax.aot import cost
  points = []
  for arg in sys.argv[2:]:
    name, measured, path = arg.split(":", 2)
    with open(path, encoding="utf-8") as f:
      e = cost.estimate(f.read(), name, constants=cost.Constants(0.0, 0.0))
    points.append((e.roofline_ms, e.launches, e.round_trips, float(measured)))
  launch = cost.fit_launch_us(points, cost.FITTED.round_trip_us)
  print(f"launch {launch:.3f} us (round trip {cost.FITTED.round_trip_us} us)")
  for (r, n, t, y), arg in zip(points, sys.argv[2:]):
    pred = r + (n * launch + t * cost.FITTED.round_trip_us) * 1e-3
    print(f"{arg}: measured {y} ms, predicted {pred:.3f} ms ({100 * (pred - y) / y:+.1f}%)")
  sys.exit(0)
src, gin, dtype, config, out = sys.argv[1:6]
sys.path.insert(0, src); os.chdir(src)
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp
from jax.experimental import topologies
from specjax.app.gin_config import model_config_from_file
from specjax.models import build_model
from specjax import params as P
assert P.__file__.startswith(src), P.__file__
cfg = model_config_from_file(gin)
model = build_model(dataclasses.replace(cfg, dtype=dtype))
params = jax.eval_shape(lambda: P.cast_kernels(model.init(0), jnp.bfloat16) if dtype == "bfloat16" else model.init(0))
cache = jax.eval_shape(lambda: model.init_cache(1, 88))
def decode_steps(params, cache, tokens):
  def body(i, carry):
    cache, tokens = carry
    logits, cache = model.decode(params, cache, tokens, jnp.full((1,), i, jnp.int32))
    return cache, jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32)
  return jax.lax.fori_loop(0, 4, body, (cache, tokens))
topo = topologies.get_topology_desc("cuda", "cuda", target_config=open(config).read(), topology="1x1x1")
mesh = jax.sharding.Mesh(topo.devices[:1], ("x",))
sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
place = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), t)
t = time.time()
text = jax.jit(decode_steps, donate_argnums=(1,)).lower(*place((params, cache, jax.ShapeDtypeStruct((1, 1), jnp.int32)))).compile().as_text()
open(out, "w").write(text)
print(out, "compiled in", round(time.time() - t, 1), "s", jax.__version__)
