"""Tests for specjax.runtime.sharding: the decode loops on 8 forced host devices.

XLA's device count is fixed when JAX starts, so the multi-device work runs once
in a subprocess (this file run as a script with
`XLA_FLAGS=--xla_force_host_platform_device_count=8`), which prints its
measurements as JSON; the tests assert on them. Rule-level checks run here on
abstract meshes.
"""
import collections
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

from specjax.runtime import sharding
from specjax.runtime.sharding import STANDARD_RULES, logical_to_spec, param_logical_axes

MESHES = {"8x1": 1, "1x8": 8, "4x2": 2}  # name -> num_partitions on 8 devices
# Sharded runs (mesh, loop) per family, compared with the family's single-device
# speculative run (greedy: equal to its autoregressive output, tests/decode/test_decoding_models.py).
# Every mesh is covered; each family runs model-parallel; compiles are kept few (2-core CI).
RUNS = {"t5": (("8x1", "spec"), ("4x2", "spec")),
        "decoder_only": (("1x8", "spec"), ("4x2", "spec"), ("4x2", "ar"), ("4x2", "stream"),
                         ("4x2", "tree"))}
STREAM_SLOTS = 6  # "stream": the batch streamed through 6 slots, rounded up to 8 on 'data' 4
V = 64
BATCH = 12  # not a multiple of 8: the data axis needs padding
NEW = 10
TABLE_V, TABLE_ROWS, STEPS = 4, 200_000, 3
_CHILD = "--sharding-child"


# ------------------------------------------------------------ the 8-device child


def _models():
  # pylint: disable=import-outside-toplevel
  from specjax.models.decoder_only import DecoderOnlyConfig, DecoderOnlyModel
  from specjax.models.t5 import T5Config, T5Model

  def t5(heads, head_dim, mlp, seed):
    model = T5Model(T5Config(vocab_size=V, emb_dim=16, num_heads=heads, num_encoder_layers=1,
                             num_decoder_layers=1, head_dim=head_dim, mlp_dim=mlp))
    return model, model.init(seed)

  def lm(heads, head_dim, mlp, seed):
    model = DecoderOnlyModel(DecoderOnlyConfig(vocab_size=V, emb_dim=16, num_heads=heads,
                                               num_layers=1, head_dim=head_dim, mlp_dim=mlp,
                                               logits_via_embedding=False))
    return model, model.init(seed)

  return {"t5": (t5(8, 4, 32, 0), t5(8, 2, 16, 1)), "decoder_only": (lm(8, 4, 32, 2),
                                                                      lm(8, 2, 16, 3))}


def _shard_report(partitioner, params):
  """Per-parameter spec and first-shard shape; total and per-device bytes."""
  placed = partitioner.shard_params(params)
  flat = dict(sharding.flatten(placed))
  return {
      "specs": {k: str(v.sharding.spec) for k, v in flat.items()},
      "shard_shapes": {k: list(v.addressable_shards[0].data.shape) for k, v in flat.items()},
      "shapes": {k: list(v.shape) for k, v in flat.items()},
      "total_bytes": int(sum(v.nbytes for v in flat.values())),
      "device_bytes": sharding.per_device_bytes(placed),
  }


def _child() -> dict:
  """Runs on 8 host devices; returns everything the tests check."""
  # pylint: disable=import-outside-toplevel
  import jax
  from specjax.decode import beam_search
  from specjax import checkpoints
  from specjax.checkpoints import save_t5x
  from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
  from specjax.decode import stream as stream_module
  from specjax.decode import tree_decode
  from specjax.draft import ModelDrafter, StaticTree
  from specjax.sampling import Sampling
  from specjax.testing import TableModel, exact_joint, random_table

  out = {"devices": jax.device_count()}
  parts = {name: sharding.Partitioner(num_partitions=n) for name, n in MESHES.items()}
  greedy = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=1, cache_len=32)
  rng = np.random.default_rng(0)
  inputs = rng.integers(2, V, size=(BATCH, 6)).astype(np.int32)
  key = jax.random.PRNGKey(0)
  models = _models()
  for family, ((target, tparams), (draft, dparams)) in models.items():
    drafter = ModelDrafter(draft, max_gamma=3)
    spec = lambda p: speculative_decode(target, tparams, drafter, dparams, inputs,
                                        max_new_tokens=NEW, gamma=3, rng=key, config=greedy,
                                        partitioner=p)
    ar = lambda p: autoregressive_decode(target, tparams, inputs, max_new_tokens=NEW, rng=key,
                                         config=greedy, partitioner=p)
    # Streaming (in chunks: progress after every 8 finished rows) through 8 slots.
    stream = lambda p: speculative_decode(target, tparams, drafter, dparams, inputs,
                                          max_new_tokens=NEW, gamma=3, rng=key, config=greedy,
                                          partitioner=p, slots=STREAM_SLOTS,
                                          on_progress=lambda done, total: None)
    # A spine tree (greedy: the same tokens as the chain and autoregressive decoding).
    tree = lambda p: tree_decode(target, tparams, draft, dparams, inputs, max_new_tokens=NEW,
                                 rng=key, config=greedy, tree=StaticTree.from_spines((3, 1)),
                                 partitioner=p)
    runs = {"single/spec": spec(None)}
    compiled = stream_module._run._cache_size()
    for mesh, loop in RUNS[family]:
      runs[f"{mesh}/{loop}"] = {"spec": spec, "ar": ar, "stream": stream,
                                "tree": tree}[loop](parts[mesh])
    out[f"{family}_stream_compiles"] = stream_module._run._cache_size() - compiled
    out[family] = {k: {"tokens": np.asarray(r.tokens).tolist(),
                       "lengths": np.asarray(r.lengths).tolist(),
                       "target_calls": np.asarray(r.target_calls).tolist()}
                   for k, r in runs.items()}
    if family == "t5":  # beam search on a mixed mesh, against one device
      beams = lambda p: beam_search(target, tparams, inputs, beam_size=2, max_new_tokens=NEW,
                                    partitioner=p)
      single, mixed = beams(None), beams(parts["4x2"])
      out["beam"] = {"sequences": np.array_equal(single.sequences, mixed.sequences),
                     "scores": float(np.max(np.abs(np.asarray(single.scores) -
                                                   np.asarray(mixed.scores)))),
                     "rows": int(mixed.sequences.shape[0])}
    out[family]["params"] = {name: _shard_report(p, tparams) for name, p in parts.items()}
    cache = parts["4x2"].state_shardings(target.init_cache(16, 32))
    out[family]["cache_spec"] = str(cache.keys[0].spec)

  # Checkpoints load straight into their shardings.
  (target, tparams), _ = models["t5"]
  with tempfile.TemporaryDirectory() as folder:
    save_t5x(tparams, folder, dtype="float32")
    loaded = checkpoints.load_sharded(folder, target, parts["1x8"])
  want = parts["1x8"].param_shardings(target.param_shapes())
  pairs = zip(sharding.flatten(loaded), sharding.flatten(tparams), sharding.flatten(want))
  out["checkpoint"] = {name: {"equal": bool(np.array_equal(np.asarray(a), np.asarray(b))),
                              "spec": str(a.sharding.spec), "want": str(w.spec),
                              "shard": list(a.addressable_shards[0].data.shape)}
                       for (name, a), (_, b), (_, w) in pairs}

  # Sampling on a data-parallel mesh: the joint law of the first 3 tokens.
  target_table, draft_table = random_table(1, TABLE_V), random_table(2, TABLE_V, sharpness=1.0)
  sampling = Sampling(top_k=3)
  config = DecodeConfig(sampling=sampling, eos_id=-1, cache_len=16)
  prompt = np.array([[2, 3]] * TABLE_ROWS, np.int32)
  result = speculative_decode(TableModel(TABLE_V), target_table,
                              ModelDrafter(TableModel(TABLE_V), max_gamma=2), draft_table, prompt,
                              max_new_tokens=STEPS, gamma=2, rng=jax.random.PRNGKey(4),
                              config=config, partitioner=parts["8x1"])
  counts = collections.Counter(map(tuple, np.asarray(result.tokens)[:, :STEPS].tolist()))
  tv = lambda law: 0.5 * sum(abs(counts.get(k, 0) / TABLE_ROWS - p) for k, p in law.items())
  out["distribution"] = {
      "rows": int(result.tokens.shape[0]),
      "tv_target": tv(exact_joint(np.asarray(target_table), sampling, [2, 3], STEPS)),
      "tv_draft": tv(exact_joint(np.asarray(draft_table), sampling, [2, 3], STEPS)),
      "token_spec": str(result.tokens.sharding.spec)}
  return out


@pytest.fixture(scope="module")
def child():
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  # The suite's XLA flags (tests/conftest.py) stay; 8 host devices are added.
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()
  env = dict(os.environ, XLA_FLAGS=flags,
             JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
                 [root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), _CHILD], env=env, cwd=root,
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ on 8 devices


@pytest.mark.parametrize("family", ["t5", "decoder_only"])
def test_greedy_identical_to_single_device(child, family):
  assert child["devices"] == 8
  runs = child[family]
  single = runs["single/spec"]
  assert len({tuple(t) for t in single["tokens"]}) > BATCH // 2  # rows differ: the test has power
  sharded = [f"{mesh}/{loop}" for mesh, loop in RUNS[family]]
  for name in sharded:
    assert runs[name]["tokens"] == single["tokens"], name
    assert runs[name]["lengths"] == single["lengths"], name
    assert len(runs[name]["tokens"]) == BATCH  # the padding rows are dropped
    if name.endswith(("/spec", "/stream")):
      assert runs[name]["target_calls"] == single["target_calls"], name
  # One compile per streamed family, chunks included (their state keeps its shardings).
  assert child[f"{family}_stream_compiles"] == sum(loop == "stream" for _, loop in RUNS[family])
  assert {mesh for runs in RUNS.values() for mesh, _ in runs} == set(MESHES)


@pytest.mark.parametrize("family", ["t5", "decoder_only"])
def test_parameters_really_split(child, family):
  report = child[family]["params"]["1x8"]
  for name, spec in report["specs"].items():
    shape, shard = report["shapes"][name], report["shard_shapes"][name]
    if name.endswith(("query/kernel", "key/kernel", "value/kernel", "wi_0/kernel", "wi_1/kernel")):
      assert spec == str(PartitionSpec(None, "model")), name
      assert shard == [shape[0], shape[1] // 8], name
    elif name.endswith(("out/kernel", "wo/kernel", "token_embedder/embedding",
                        "rel_embedding")):
      assert spec == str(PartitionSpec("model")), name
      assert shard == [shape[0] // 8] + shape[1:], name
    elif name.endswith("logits_dense/kernel"):
      assert shard == [shape[0], shape[1] // 8], name
    else:
      assert name.endswith("scale") and spec == str(PartitionSpec()) and shard == shape, name
  data_parallel = child[family]["params"]["8x1"]
  assert all(s == str(PartitionSpec()) for s in data_parallel["specs"].values())
  assert child[family]["cache_spec"] == str(PartitionSpec("data", "model"))  # [B, H, L, D]


@pytest.mark.parametrize("family", ["t5", "decoder_only"])
@pytest.mark.parametrize("mesh", ["8x1", "1x8", "4x2"])
def test_per_device_bytes_shrink_by_model_axis(child, family, mesh):
  report = child[family]["params"][mesh]
  model = MESHES[mesh]
  replicated = sum(4 * int(np.prod(report["shapes"][k])) for k, s in report["specs"].items()
                   if s == str(PartitionSpec()))
  total = report["total_bytes"]
  assert report["device_bytes"] == (total - replicated) // model + replicated
  if model > 1:
    assert replicated < 0.1 * total
    assert report["device_bytes"] <= total / model * 1.1
  else:
    assert report["device_bytes"] == total


def test_beam_search_on_a_mixed_mesh_matches_one_device(child):
  assert child["beam"]["sequences"] and child["beam"]["rows"] == BATCH
  assert child["beam"]["scores"] < 1e-5


def test_checkpoint_loads_into_shardings(child):
  loaded = child["checkpoint"]
  assert loaded and all(v["equal"] for v in loaded.values())
  assert all(v["spec"] == v["want"] for v in loaded.values())
  kernel = loaded["decoder/layers_0/mlp/wi_0/kernel"]
  assert kernel["spec"] == str(PartitionSpec(None, "model")) and kernel["shard"] == [16, 4]


def test_sampling_distribution_on_a_data_parallel_mesh(child):
  dist = child["distribution"]
  assert dist["rows"] == TABLE_ROWS
  assert dist["tv_target"] < 0.01
  assert dist["tv_draft"] > 0.05  # power: the draft's own law is far off


# ------------------------------------------------------------- rules (1 device)


def test_param_logical_axes_follow_t5x_names():
  params = {"decoder": {"token_embedder": {"embedding": np.zeros((8, 4))},
                        "layers_0": {"self_attention": {"query": {"kernel": np.zeros((4, 6))},
                                                        "out": {"kernel": np.zeros((6, 4))}},
                                     "mlp": {"wo": {"kernel": np.zeros((5, 4))}},
                                     "pre_mlp_layer_norm": {"scale": np.zeros(4)}},
                        "relpos_bias": {"rel_embedding": np.zeros((2, 32))}},
            "counts": np.zeros((3, 3))}
  axes = dict(sharding.flatten(param_logical_axes(params)))
  assert axes["decoder/token_embedder/embedding"] == ("vocab", "embed")
  assert axes["decoder/layers_0/self_attention/query/kernel"] == ("embed", "joined_kv")
  assert axes["decoder/layers_0/self_attention/out/kernel"] == ("joined_kv", "embed")
  assert axes["decoder/layers_0/mlp/wo/kernel"] == ("mlp", "embed")
  assert axes["decoder/layers_0/pre_mlp_layer_norm/scale"] == ("embed",)
  assert axes["decoder/relpos_bias/rel_embedding"] == ("heads", "relpos_buckets")
  assert axes["counts"] is None


def test_logical_to_spec_falls_back_to_replication():
  mesh = AbstractMesh((2, 4), ("data", "model"))
  assert logical_to_spec(("embed", "mlp"), (16, 32), mesh) == PartitionSpec(None, "model")
  assert logical_to_spec(("embed", "mlp"), (16, 30), mesh) == PartitionSpec()  # 30 % 4
  assert logical_to_spec(("batch", None, "heads", None), (6, 9, 8, 2), mesh) == \
      PartitionSpec("data", None, "model")
  # A mesh axis is used once per array.
  assert logical_to_spec(("vocab", "mlp"), (8, 8), mesh) == PartitionSpec("model")
  with pytest.raises(ValueError, match="logical axes"):
    logical_to_spec(("embed",), (4, 4), mesh)
  with pytest.raises(ValueError, match="no such mesh axis"):
    logical_to_spec(("embed",), (4,), mesh, rules=(("embed", "tensor"),) + STANDARD_RULES)


def test_create_mesh_checks_num_partitions():
  import jax  # pylint: disable=import-outside-toplevel
  count = jax.device_count()
  with pytest.raises(ValueError, match="does not divide"):
    sharding.create_mesh(count + 1)
  with pytest.raises(ValueError, match="positive integer"):
    sharding.create_mesh(0)
  partitioner = sharding.Partitioner()
  assert partitioner.mesh.axis_names == ("data", "model")
  assert (partitioner.data_size, partitioner.model_size) == (count, 1)
  assert partitioner == sharding.Partitioner() and hash(partitioner) == hash(sharding.Partitioner())


def test_partitioner_is_gin_configurable():
  import gin  # pylint: disable=import-outside-toplevel
  import specjax.app.gin_config  # noqa: F401  registers Partitioner (the test must not rely on order)
  with gin.unlock_config():
    gin.parse_config("Partitioner.num_partitions = 1")
  try:
    assert gin.get_configurable("Partitioner")().num_partitions == 1
  finally:
    gin.clear_config()


if __name__ == "__main__" and sys.argv[1:] == [_CHILD]:
  print(json.dumps(_child()))
