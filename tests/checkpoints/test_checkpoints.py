"""Tests for specjax.checkpoints: T5X legacy msgpack+zarr, Orbax, and writing.

Every fixture checkpoint here is written by the test itself: the legacy ones
with plain msgpack / tensorstore calls in T5X's exact layout (or flax's own
serializer), the Orbax ones with orbax-checkpoint.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import tracemalloc

import jax
import ml_dtypes
import msgpack
import numpy as np
import pytest
import tensorstore as ts

from specjax.checkpoints import _commit as _ckpt_commit
from specjax.checkpoints import _io as _ckpt_io
from specjax import checkpoints
from specjax.checkpoints import t5x as t5x_format
from specjax.params import flatten

BF16 = np.dtype(ml_dtypes.bfloat16)
KERNEL = "encoder/layers_0/mlp/wi_0/kernel"


def _tree(rng, dtype_of=lambda name: np.float32):
  shapes = {
      "encoder/layers_0/attention/query/kernel": (8, 4),
      KERNEL: (8, 16),
      "encoder/layers_0/pre_attention_layer_norm/scale": (8,),
      "encoder/encoder_norm/scale": (8,),
      "decoder/layers_0/mlp/wo/kernel": (16, 8),
      "decoder/decoder_norm/scale": (8,),
      "decoder/logits_dense/kernel": (8, 32),
      "token_embedder/embedding": (32, 8),
  }
  out = {}
  for name, shape in shapes.items():
    node = out
    *parents, leaf = name.split("/")
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = rng.normal(size=shape).astype(dtype_of(name))
  return out


@pytest.fixture(scope="module")
def params():
  """float32 parameters with T5X names."""
  return _tree(np.random.default_rng(0))


@pytest.fixture(scope="module")
def mixed():
  """Parameters stored half in float32, half in bfloat16 (the kernels)."""
  return _tree(np.random.default_rng(1),
               lambda name: BF16 if name.endswith("kernel") else np.float32)


def _cast(tree, dtype):
  return {k: _cast(v, dtype) if isinstance(v, dict) else v.astype(dtype)
          for k, v in tree.items()}


def assert_same(got, want):
  got, want = dict(flatten(got)), dict(flatten(want))
  assert sorted(got) == sorted(want)
  for name in want:
    assert isinstance(got[name], np.ndarray), name
    assert got[name].dtype == np.asarray(want[name]).dtype, name
    np.testing.assert_array_equal(got[name], np.asarray(want[name]), err_msg=name)


# ---------------------------------------------------------------------------
# Independent writers of T5X's legacy layout (no specjax code involved)


def flax_ndarray(arr, dtype_name=None, data=None):
  """flax serialization's msgpack extension 1: (shape, dtype name, bytes)."""
  payload = msgpack.packb(
      (arr.shape, dtype_name or arr.dtype.name,
       arr.tobytes() if data is None else data), use_bin_type=True)
  return msgpack.ExtType(1, payload)


def t5x_spec(rel, arr, chunks, kvstore_driver="file"):
  """The tensorstore spec T5X puts in the msgpack in place of an array."""
  kvstore = {"driver": kvstore_driver, "path": rel}
  if kvstore_driver == "gcs":
    kvstore["bucket"] = "t5x-dummy-bucket"
  return {"driver": "zarr", "dtype": arr.dtype.name, "kvstore": kvstore,
          "metadata": {"chunks": list(chunks), "compressor": {"id": "gzip"},
                       "shape": list(arr.shape)}}


def write_zarr(folder, arr, chunks):
  store = ts.open({"driver": "zarr", "dtype": arr.dtype.name,
                   "kvstore": {"driver": "file", "path": str(folder)},
                   "metadata": {"shape": list(arr.shape), "chunks": list(chunks),
                                "compressor": {"id": "gzip"}}},
                  create=True).result()
  store.write(arr).result()


def write_legacy(ckpt_dir, tree, optimizer_state=None, version=3):
  """A T5X checkpoint_N: every array a zarr folder named by its dotted path.

  Arrays are spread over T5X's spec variants: 'file', 'gfile' and 'gcs'
  kvstores, the pre-0.1.14 spec with 'path' beside 'kvstore', and several
  chunks per array.
  """
  os.makedirs(ckpt_dir)
  variants = ["file", "gfile", "gcs", "old"]

  def convert(node, prefix, counter):
    out = {}
    for key, value in node.items():
      name = f"{prefix}.{key}"
      if isinstance(value, dict):
        out[key] = convert(value, name, counter)
        continue
      chunks = [max(1, value.shape[0] // 2)] + list(value.shape[1:])
      write_zarr(os.path.join(ckpt_dir, name), value, chunks)
      variant = variants[counter[0] % len(variants)]
      counter[0] += 1
      if variant == "old":
        spec = t5x_spec(name, value, chunks)
        spec["path"] = spec["kvstore"].pop("path")
      else:
        spec = t5x_spec(name + "/", value, chunks, variant)
      out[key] = spec
    return out

  target = convert(tree, "target", [0])
  state = optimizer_state or {"step": flax_ndarray(np.asarray(10, np.int32))}
  blob = msgpack.packb({"version": version,
                        "optimizer": {"target": target, "state": state}},
                       use_bin_type=True)
  with open(os.path.join(ckpt_dir, "checkpoint"), "wb") as f:
    f.write(blob)
  return target


def read_msgpack(ckpt_dir):
  with open(os.path.join(ckpt_dir, "checkpoint"), "rb") as f:
    return msgpack.unpackb(f.read(), raw=False)


def write_msgpack(ckpt_dir, contents):
  with open(os.path.join(ckpt_dir, "checkpoint"), "wb") as f:
    f.write(msgpack.packb(contents, use_bin_type=True))


@pytest.fixture(scope="module")
def legacy_dir(tmp_path_factory, mixed):
  """A model folder: checkpoint_2 (zeros), checkpoint_10 (the real one), an
  incomplete checkpoint_11 and a leftover temporary folder."""
  root = tmp_path_factory.mktemp("legacy")
  write_legacy(str(root / "checkpoint_2"),
               {"token_embedder": {"embedding": np.zeros((32, 8), np.float32)}})
  # The optimizer state names arrays that do not exist and carries an
  # extension type the reader refuses: loading works only if it is skipped.
  state = {"step": flax_ndarray(np.asarray(10, np.int32)),
           "param_states": {"encoder": {
               "v": t5x_spec("state.param_states.encoder.v/",
                             np.zeros((8, 16), np.float32), (8, 16)),
               "blob": msgpack.ExtType(42, b"\x80\x04not a pickle")}}}
  ckpt = str(root / "checkpoint_10")
  write_legacy(ckpt, mixed, optimizer_state=state)
  # One array inline, as T5X does for unpartitioned ones.
  contents = read_msgpack(ckpt)
  scale = mixed["encoder"]["encoder_norm"]["scale"]
  contents["optimizer"]["target"]["encoder"]["encoder_norm"]["scale"] = (
      flax_ndarray(scale))
  shutil.rmtree(os.path.join(ckpt, "target.encoder.encoder_norm.scale"))
  write_msgpack(ckpt, contents)
  # A copied checkpoint may lose .zarray: it is rebuilt from the msgpack spec.
  os.remove(os.path.join(ckpt, "target.decoder.logits_dense.kernel", ".zarray"))
  os.makedirs(root / "checkpoint_11")  # incomplete: no `checkpoint` file
  os.makedirs(root / "checkpoint_12.tmp-1234")
  (root / "checkpoint_12.tmp-1234" / "checkpoint").write_bytes(b"garbage")
  return root


# ---------------------------------------------------------------------------
# Legacy format: reading


@pytest.mark.parametrize("which", ["model_dir", "step_dir", "file"])
def test_legacy_fixture_loads_the_in_memory_params(legacy_dir, mixed, which):
  path = {"model_dir": legacy_dir, "step_dir": legacy_dir / "checkpoint_10",
          "file": legacy_dir / "checkpoint_10" / "checkpoint"}[which]
  assert_same(checkpoints.load_t5x(str(path)), mixed)


def test_latest_step_is_numeric_and_skips_incomplete(legacy_dir):
  location = checkpoints.find_checkpoint(str(legacy_dir))
  assert location.format == checkpoints.LEGACY
  assert location.step == 10
  assert location.path.endswith(os.path.join("checkpoint_10", "checkpoint"))
  older = checkpoints.load_t5x(str(legacy_dir / "checkpoint_2"))
  assert list(flatten(older))[0][0] == "token_embedder/embedding"


def test_load_casts_floating_arrays(legacy_dir, mixed):
  as_f32 = checkpoints.load_t5x(str(legacy_dir), dtype="float32")
  assert_same(as_f32, _cast(mixed, np.float32))
  as_bf16 = checkpoints.load_t5x(str(legacy_dir), dtype=jax.numpy.bfloat16)
  assert_same(as_bf16, _cast(mixed, BF16))


def test_flax_serialized_inline_checkpoint_loads(tmp_path, params):
  from flax import serialization
  ckpt = tmp_path / "checkpoint_1"
  ckpt.mkdir()
  blob = serialization.msgpack_serialize(
      {"version": 3, "optimizer": {"target": params,
                                   "state": {"step": np.int32(1)}}})
  (ckpt / "checkpoint").write_bytes(blob)
  assert_same(checkpoints.load_t5x(str(tmp_path)), params)


# ---------------------------------------------------------------------------
# Writing


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_save_load_round_trip(tmp_path, params, dtype):
  jax_params = jax.tree_util.tree_map(jax.numpy.asarray, params)
  out = checkpoints.save_t5x(jax_params, str(tmp_path), step=7, dtype=dtype)
  assert out == os.path.join(str(tmp_path), "checkpoint_7")
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_7"]  # no temporary left
  assert_same(checkpoints.load_t5x(str(tmp_path)), _cast(params, np.dtype(dtype)))


def test_save_keeps_dtypes_with_none_and_never_casts_integers(tmp_path, mixed):
  tree = dict(mixed, counts=np.arange(5, dtype=np.int32), bias=np.float32(0.5))
  checkpoints.save_t5x(tree, str(tmp_path), dtype=None)
  assert_same(checkpoints.load_t5x(str(tmp_path)), tree)
  checkpoints.save_t5x(tree, str(tmp_path / "b"), dtype="bfloat16")
  loaded = checkpoints.load_t5x(str(tmp_path / "b"))
  assert loaded["counts"].dtype == np.int32
  assert loaded["bias"].dtype == BF16
  assert loaded["token_embedder"]["embedding"].dtype == BF16


def test_saved_layout_is_what_t5x_restores(tmp_path, params):
  """Reads save_t5x's output the way t5x/checkpoints.py does."""
  from flax import serialization
  ckpt = checkpoints.save_t5x(params, str(tmp_path), step=3, dtype="bfloat16")
  with open(os.path.join(ckpt, "checkpoint"), "rb") as f:
    contents = serialization.msgpack_restore(f.read())
  assert set(contents) == {"version", "optimizer"}
  assert contents["version"] == 3
  assert int(contents["optimizer"]["state"]["step"]) == 3
  specs = {}

  def collect(node, prefix):
    for key, value in node.items():
      name = f"{prefix}/{key}" if prefix else key
      if "driver" in value:
        specs[name] = value
      else:
        collect(value, name)

  collect(contents["optimizer"]["target"], "")
  want_flat = dict(flatten(params))
  assert sorted(specs) == sorted(want_flat)
  for name, node in specs.items():
    assert node["kvstore"]["path"].rstrip("/") == "target." + name.replace("/", ".")
    assert node["metadata"]["compressor"]["id"] == "gzip"
    spec = ts.Spec(node).to_json()  # a valid tensorstore spec
    del spec["metadata"]["chunks"], spec["metadata"]["compressor"]
    spec["kvstore"]["path"] = os.path.join(ckpt, spec["kvstore"]["path"])
    arr = ts.open(spec, open=True).result().read().result()
    np.testing.assert_array_equal(arr, want_flat[name].astype(BF16))
    with open(os.path.join(ckpt, node["kvstore"]["path"], ".zarray")) as f:
      zarray = json.load(f)
    assert zarray["dtype"] == "bfloat16" and zarray["compressor"]["id"] == "gzip"


def test_chunk_shape_divides_and_fits_64mib():
  assert t5x_format._chunk_shape((8, 16), 4) == [8, 16]
  chunk = t5x_format._chunk_shape((1024, 20480), 4)
  assert chunk == [1024, 10240]
  chunk = t5x_format._chunk_shape((32128, 4096), 2)
  assert np.prod(chunk) * 2 <= 64 * 2**20
  assert 32128 % chunk[0] == 0 and 4096 % chunk[1] == 0
  assert t5x_format._chunk_shape((0, 3), 4) == [1, 3]


def test_save_refuses_to_overwrite_unless_asked(tmp_path, params):
  checkpoints.save_t5x(params, str(tmp_path), step=1)
  with pytest.raises(FileExistsError, match="checkpoint_1 .*overwrite=True"):
    checkpoints.save_t5x(params, str(tmp_path), step=1)
  doubled = _cast(params, np.float32)
  doubled["token_embedder"]["embedding"] = (
      2 * params["token_embedder"]["embedding"])
  checkpoints.save_t5x(doubled, str(tmp_path), step=1, dtype="float32",
                       overwrite=True)
  assert_same(checkpoints.load_t5x(str(tmp_path)), doubled)
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_1"]


def test_failed_save_leaves_no_checkpoint(tmp_path, params, monkeypatch):
  def boom(tree):
    raise RuntimeError("disk full")
  monkeypatch.setattr(_ckpt_io, "encode", boom)
  with pytest.raises(RuntimeError, match="disk full"):
    checkpoints.save_t5x(params, str(tmp_path), step=4)
  assert os.listdir(tmp_path) == []  # zarr folders were written, then removed


@pytest.mark.parametrize("tree, message", [
    ({}, "non-empty nested dict"),
    ([np.ones(3)], "non-empty nested dict"),
    ({"a/b": np.ones(3)}, "invalid parameter name 'a/b'"),
    ({"a": {1: np.ones(3)}}, "invalid parameter name 1 under 'a'"),
    ({"a": {"b": np.array(["x"])}}, "parameter 'a/b' has unsupported dtype"),
    ({"a": {"b": object()}}, "parameter 'a/b' has unsupported dtype"),
    ({"a.b": np.ones(3), "a": {"b": np.ones(3)}}, "share the array folder"),
])
def test_save_rejects_bad_params(tmp_path, tree, message):
  with pytest.raises(ValueError, match=message):
    checkpoints.save_t5x(tree, str(tmp_path))
  assert not [p for p in os.listdir(tmp_path) if p.startswith("checkpoint")]


@pytest.mark.parametrize("kwargs, message", [
    ({"step": -1}, "step must be an integer"),
    ({"step": 1.5}, "step must be an integer"),
    ({"dtype": "int32"}, "floating-point"),
    ({"dtype": "no_such_type"}, "unknown dtype"),
])
def test_save_rejects_bad_arguments(tmp_path, params, kwargs, message):
  with pytest.raises(ValueError, match=message):
    checkpoints.save_t5x(params, str(tmp_path), **kwargs)


# ---------------------------------------------------------------------------
# Orbax


ORBAX_VARIANTS = {"ocdbt": (True, False), "plain": (False, False),
                  "ocdbt_zarr3": (True, True), "plain_zarr3": (False, True)}


@pytest.fixture(scope="module")
def orbax_dir(tmp_path_factory, mixed):
  """checkpoint_5/state/ as T5X writes it with orbax, one model per variant."""
  import orbax.checkpoint as ocp
  root = tmp_path_factory.mktemp("orbax")
  state = {"version": 3, "optimizer": {
      "target": mixed,
      "state": {"step": np.int32(5),
                "param_states": {"m": np.zeros((8, 16), np.float32)}}}}
  for variant, (use_ocdbt, use_zarr3) in ORBAX_VARIANTS.items():
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt,
                                          use_zarr3=use_zarr3)
    ocp.Checkpointer(handler).save(
        str(root / variant / "checkpoint_5" / "state"), state)
  # Older T5X saved the Orbax item straight into checkpoint_N.
  ocp.Checkpointer(ocp.PyTreeCheckpointHandler()).save(
      str(root / "flat" / "checkpoint_6"), state)
  return root


@pytest.mark.parametrize("variant", list(ORBAX_VARIANTS) + ["flat"])
def test_orbax_checkpoint_loads_the_in_memory_params(orbax_dir, mixed, variant):
  location = checkpoints.find_checkpoint(str(orbax_dir / variant))
  assert location.format == checkpoints.ORBAX
  assert location.step == (6 if variant == "flat" else 5)
  assert_same(checkpoints.load_t5x(str(orbax_dir / variant)), mixed)


def test_orbax_read_does_not_import_orbax(orbax_dir):
  code = ("import sys; from specjax.checkpoints import load_t5x; "
          f"p = load_t5x({str(orbax_dir / 'ocdbt')!r}); "
          "assert p['token_embedder']['embedding'].shape == (32, 8); "
          "print(sorted(m for m in sys.modules if m.split('.')[0] in "
          "('orbax', 'jax', 'flax')))")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))), timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "[]"


def test_orbax_nested_metadata_of_older_orbax(orbax_dir, mixed, tmp_path):
  item = tmp_path / "checkpoint_5" / "state"
  shutil.copytree(orbax_dir / "plain" / "checkpoint_5" / "state", item)
  meta = json.loads((item / "_METADATA").read_text())
  nested = {}
  for entry in meta["tree_metadata"].values():
    node = nested
    keys = [k["key"] for k in entry["key_metadata"]]
    for key in keys[:-1]:
      node = node.setdefault(key, {})
    node[keys[-1]] = entry["value_metadata"]
  (item / "_METADATA").write_text(json.dumps(nested))
  assert_same(checkpoints.load_t5x(str(tmp_path)), mixed)


def test_orbax_aggregated_values_come_from_the_msgpack_file(orbax_dir, mixed,
                                                            tmp_path):
  item = tmp_path / "state"
  shutil.copytree(orbax_dir / "plain" / "checkpoint_5" / "state", item)
  meta = json.loads((item / "_METADATA").read_text())
  key = "('optimizer', 'target', 'encoder', 'encoder_norm', 'scale')"
  meta["tree_metadata"][key]["value_metadata"]["skip_deserialize"] = True
  (item / "_METADATA").write_text(json.dumps(meta))
  shutil.rmtree(item / "optimizer.target.encoder.encoder_norm.scale")
  scale = mixed["encoder"]["encoder_norm"]["scale"]
  (item / "checkpoint").write_bytes(msgpack.packb(
      {"optimizer": {"target": {"encoder": {"encoder_norm": {
          "scale": flax_ndarray(scale)}}}}}, use_bin_type=True))
  assert_same(checkpoints.load_t5x(str(item)), mixed)


def test_orbax_errors(orbax_dir, tmp_path):
  item = tmp_path / "checkpoint_5" / "state"
  shutil.copytree(orbax_dir / "plain" / "checkpoint_5" / "state", item)
  shutil.rmtree(item / "optimizer.target.encoder.layers_0.mlp.wi_0.kernel")
  with pytest.raises(ValueError, match=f"parameter '{KERNEL}' is missing"):
    checkpoints.load_t5x(str(tmp_path))
  meta = json.loads((item / "_METADATA").read_text())
  meta["tree_metadata"] = {k: v for k, v in meta["tree_metadata"].items()
                           if "target" not in k}
  (item / "_METADATA").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="no 'optimizer/target'"):
    checkpoints.load_t5x(str(tmp_path))
  (item / "_METADATA").write_text("{not json")
  with pytest.raises(ValueError, match="unreadable Orbax metadata"):
    checkpoints.load_t5x(str(tmp_path))


def test_orbax_names_that_escape_are_refused(orbax_dir, tmp_path):
  item = tmp_path / "state"
  shutil.copytree(orbax_dir / "plain" / "checkpoint_5" / "state", item)
  meta = json.loads((item / "_METADATA").read_text())
  entry = meta["tree_metadata"].pop(
      "('optimizer', 'target', 'token_embedder', 'embedding')")
  entry["key_metadata"][-1]["key"] = ".."
  meta["tree_metadata"]["x"] = entry
  (item / "_METADATA").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="invalid parameter name component '..'"):
    checkpoints.load_t5x(str(item))


# ---------------------------------------------------------------------------
# Bad input when reading


def test_missing_paths(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist: .*nope"):
    checkpoints.load_t5x(str(tmp_path / "nope"))
  with pytest.raises(FileNotFoundError, match="no T5X checkpoint in"):
    checkpoints.load_t5x(str(tmp_path))


@pytest.fixture
def one_ckpt(tmp_path, params):
  """A fresh independent legacy checkpoint to damage; returns its folder."""
  ckpt = str(tmp_path / "checkpoint_1")
  write_legacy(ckpt, params)
  return ckpt


@pytest.mark.parametrize("damage, message", [
    (lambda b: b"\x93\x01\x02\x03", "corrupt msgpack .*Unexpected type"),
    (lambda b: b[: len(b) // 2], "corrupt msgpack .*truncated"),
    (lambda b: b + b"\x00", "corrupt msgpack .*extra data"),
    (lambda b: msgpack.packb({"version": 3, "params": {}}),
     "not a T5X checkpoint: .*no 'optimizer'"),
    (lambda b: b"model_checkpoint_path: 'model.ckpt-1'", "TensorFlow checkpoint"),
])
def test_corrupt_msgpack(one_ckpt, damage, message):
  path = os.path.join(one_ckpt, "checkpoint")
  with open(path, "rb") as f:
    blob = f.read()
  with open(path, "wb") as f:
    f.write(damage(blob))
  with pytest.raises(ValueError, match=message):
    checkpoints.load_t5x(one_ckpt)


def _edit_target(ckpt, name, edit):
  contents = read_msgpack(ckpt)
  node = contents["optimizer"]["target"]
  *parents, leaf = name.split("/")
  for part in parents:
    node = node[part]
  node[leaf] = edit(node[leaf])
  write_msgpack(ckpt, contents)


@pytest.mark.parametrize("value, message", [
    (msgpack.ExtType(99, b"\x80\x04"), "unsupported msgpack extension type 99"),
    (flax_ndarray(np.ones(2), dtype_name="O"), "unsupported dtype 'O'"),
    (flax_ndarray(np.ones(2, np.float32), data=b"\x00" * 7), "needs 8 bytes"),
    ("a string", f"parameter '{KERNEL}' holds a str"),
])
def test_bad_inline_values(one_ckpt, value, message):
  _edit_target(one_ckpt, KERNEL, lambda old: value)
  with pytest.raises(ValueError, match=message):
    checkpoints.load_t5x(one_ckpt)


def test_missing_array_folder_names_the_parameter(one_ckpt):
  shutil.rmtree(os.path.join(one_ckpt, "target." + KERNEL.replace("/", ".")))
  with pytest.raises(ValueError, match=f"parameter '{KERNEL}' is missing"):
    checkpoints.load_t5x(one_ckpt)


def test_missing_chunk_file_is_an_error_not_zeros(one_ckpt):
  os.remove(os.path.join(one_ckpt, "target." + KERNEL.replace("/", "."), "1.0"))
  with pytest.raises(ValueError, match=f"'{KERNEL}' is missing chunk .*1.0"):
    checkpoints.load_t5x(one_ckpt)


def test_missing_zarray_without_metadata_to_rebuild_it(one_ckpt):
  folder = os.path.join(one_ckpt, "target." + KERNEL.replace("/", "."))
  os.remove(os.path.join(folder, ".zarray"))

  def drop_chunks(spec):
    del spec["metadata"]["chunks"]
    return spec

  _edit_target(one_ckpt, KERNEL, drop_chunks)
  with pytest.raises(ValueError, match=f"'{KERNEL}' has no .zarray .*'chunks'"):
    checkpoints.load_t5x(one_ckpt)


def test_declared_shape_must_match_the_stored_array(one_ckpt):
  def wrong_shape(spec):
    spec["metadata"]["shape"] = [16, 8]
    return spec

  _edit_target(one_ckpt, KERNEL, wrong_shape)
  with pytest.raises(ValueError, match=f"'{KERNEL}' has shape \\(8, 16\\) but "
                     "the checkpoint declares \\(16, 8\\)"):
    checkpoints.load_t5x(one_ckpt)


@pytest.mark.parametrize("rel", ["../outside/", "/tmp/outside", "a/../../x",
                                 "file:///tmp/outside", "."])
def test_array_paths_escaping_the_checkpoint_are_refused(one_ckpt, rel):
  # A real array outside the checkpoint folder must not be read either.
  outside = os.path.join(os.path.dirname(one_ckpt), "outside")
  if not os.path.exists(outside):
    write_zarr(outside, np.ones((8, 16), np.float32), (8, 16))

  def escape(spec):
    spec["kvstore"]["path"] = rel
    return spec

  _edit_target(one_ckpt, KERNEL, escape)
  with pytest.raises(ValueError, match=f"'{KERNEL}' has an array path "
                     f"'{rel}' that"):
    checkpoints.load_t5x(one_ckpt)


@pytest.mark.parametrize("field, value, message", [
    ("driver", "n5", "tensorstore driver 'n5'"),
    ("kvstore", {"driver": "http", "base_url": "http://x/"},
     "kvstore driver 'http'"),
])
def test_unsupported_tensorstore_specs(one_ckpt, field, value, message):
  def edit(spec):
    spec[field] = value
    return spec

  _edit_target(one_ckpt, KERNEL, edit)
  with pytest.raises(ValueError, match=message):
    checkpoints.load_t5x(one_ckpt)


@pytest.mark.parametrize("version", [1, 4])
def test_unsupported_versions(one_ckpt, version):
  contents = read_msgpack(one_ckpt)
  contents["version"] = version
  write_msgpack(one_ckpt, contents)
  with pytest.raises(ValueError, match=f"unsupported T5X checkpoint version "
                     f"{version}"):
    checkpoints.load_t5x(one_ckpt)


def test_version_2_uint16_bfloat16_is_refused(tmp_path):
  ckpt = str(tmp_path / "checkpoint_1")
  write_legacy(ckpt, {"w": np.ones((2, 2), np.uint16)}, version=2)
  with pytest.raises(ValueError, match="parameter 'w' is uint16"):
    checkpoints.load_t5x(ckpt)


def test_load_rejects_non_float_dtype(legacy_dir):
  with pytest.raises(ValueError, match="floating-point"):
    checkpoints.load_t5x(str(legacy_dir), dtype="int8")


# ---------------------------------------------------------------------------
# Matching a model config


class FakeModel:
  """Anything with `param_shapes()` (the model classes provide it)."""

  def __init__(self, tree):
    self._tree = tree

  def param_shapes(self):
    return jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype),
        self._tree)


def test_load_for_model_accepts_a_matching_config(legacy_dir, mixed):
  params = checkpoints.load_t5x_for_model(str(legacy_dir), FakeModel(mixed),
                                          dtype="float32")
  assert_same(params, _cast(mixed, np.float32))


def test_load_for_model_names_the_mismatching_parameter(legacy_dir, mixed):
  wrong = _cast(mixed, np.float32)
  wrong["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"] = np.zeros((8, 24))
  with pytest.raises(ValueError, match=f"parameter '{KERNEL}' has shape "
                     "\\(8, 16\\) but the model config expects \\(8, 24\\)"):
    checkpoints.load_t5x_for_model(str(legacy_dir), FakeModel(wrong))
  extra = dict(_cast(mixed, np.float32), lm_head={"kernel": np.zeros((8, 32))})
  with pytest.raises(ValueError, match="missing parameter 'lm_head/kernel'"):
    checkpoints.load_t5x_for_model(str(legacy_dir), FakeModel(extra))
  fewer = _cast(mixed, np.float32)
  del fewer["token_embedder"]
  with pytest.raises(ValueError, match="unexpected parameter "
                     "'token_embedder/embedding'"):
    checkpoints.load_t5x_for_model(str(legacy_dir), FakeModel(fewer))



# ---------------------------------------------------------------------------
# Every declared chunk must be stored

WI0 = "optimizer.target." + KERNEL.replace("/", ".")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _delete_ocdbt_key(item, key):
  kv = ts.KvStore.open({"driver": "ocdbt",
                        "base": {"driver": "file", "path": str(item) + "/"}}).result()
  assert key.encode() in kv.list().result()
  kv.delete_range(ts.KvStore.KeyRange(key.encode(), key.encode() + b"\x00")).result()


@pytest.mark.parametrize("variant, chunk", [
    ("plain_zarr3", "c/0/0"), ("ocdbt", "0.0"), ("ocdbt_zarr3", "c/0/0"),
    ("plain", "0.0")])
def test_orbax_missing_chunk_is_an_error_not_zeros(orbax_dir, tmp_path, variant, chunk):
  item = tmp_path / "checkpoint_5" / "state"
  shutil.copytree(orbax_dir / variant / "checkpoint_5" / "state", item)
  if variant.startswith("ocdbt"):
    _delete_ocdbt_key(item, f"{WI0}/{chunk}")
  else:
    os.remove(item / WI0 / chunk)
  with pytest.raises(ValueError, match=f"parameter '{KERNEL}' is missing (a )?chunk"):
    checkpoints.load_t5x(str(tmp_path))


def test_legacy_missing_chunk_with_a_fill_value_is_an_error(one_ckpt):
  folder = os.path.join(one_ckpt, "target." + KERNEL.replace("/", "."))
  zarray = json.loads(open(os.path.join(folder, ".zarray")).read())
  zarray["fill_value"] = 0.0  # tensorstore would read a missing chunk as 0.0
  with open(os.path.join(folder, ".zarray"), "w") as f:
    json.dump(zarray, f)
  assert np.all(checkpoints.load_t5x(one_ckpt)["encoder"]["layers_0"]["mlp"]["wi_0"]
                ["kernel"] != 0)
  os.remove(os.path.join(folder, "0.0"))
  with pytest.raises(ValueError, match=f"'{KERNEL}' is missing chunk file.*0.0"):
    checkpoints.load_t5x(one_ckpt)


def test_sharded_load_checks_chunks_too(one_ckpt, params):
  from specjax.runtime import sharding
  from specjax.checkpoints import sharded
  folder = os.path.join(one_ckpt, "target." + KERNEL.replace("/", "."))
  zarray = json.loads(open(os.path.join(folder, ".zarray")).read())
  zarray["fill_value"] = 0.0
  with open(os.path.join(folder, ".zarray"), "w") as f:
    json.dump(zarray, f)
  os.remove(os.path.join(folder, "1.0"))
  part = sharding.Partitioner()
  shapes = FakeModel(params).param_shapes()
  with pytest.raises(ValueError, match=f"'{KERNEL}' is missing chunk"):
    sharded.load_t5x_sharded(one_ckpt, part.param_shardings(shapes), expected=shapes)


def test_wrong_zarray_shape_is_a_shape_mismatch(one_ckpt):
  folder = os.path.join(one_ckpt, "target." + KERNEL.replace("/", "."))
  zarray = json.loads(open(os.path.join(folder, ".zarray")).read())
  zarray["shape"] = [16, 16]  # the msgpack declares (8, 16)
  with open(os.path.join(folder, ".zarray"), "w") as f:
    json.dump(zarray, f)
  with pytest.raises(ValueError, match=f"shape mismatch: .*'{KERNEL}' has shape "
                     r"\(16, 16\) but the checkpoint declares \(8, 16\)"):
    checkpoints.load_t5x(one_ckpt)


def test_orbax_wrong_shape_is_a_shape_mismatch_for_the_model(orbax_dir, tmp_path, mixed):
  item = tmp_path / "checkpoint_5" / "state"
  shutil.copytree(orbax_dir / "plain" / "checkpoint_5" / "state", item)
  zarray = json.loads((item / WI0 / ".zarray").read_text())
  zarray["shape"] = [8, 32]
  (item / WI0 / ".zarray").write_text(json.dumps(zarray))
  with pytest.raises(ValueError, match=f"shape mismatch: .*'{KERNEL}' has shape "
                     r"\(8, 32\) but the model config expects \(8, 16\)"):
    checkpoints.load_t5x_for_model(str(tmp_path), FakeModel(mixed))


@pytest.mark.parametrize("zshape, chunks, declared, message", [
    # A huge .zarray shape in tiny chunks: refused by the shape check first.
    ([4096, 1024], [1, 1], None, r"shape mismatch: .*has shape \(4096, 1024\) but the "
     r"checkpoint declares \(8, 16\)"),
    # The msgpack agrees, but 4M chunks is absurd: refused before the disk.
    ([4096, 1024], [1, 1], [4096, 1024], "declares 4194304 chunks .*more than"),
    ([8, 16], [0, 16], None, "invalid chunk grid"),
    ([8, 16], [8], None, "invalid chunk grid"),
])
def test_absurd_chunk_grids_cost_nothing(one_ckpt, zshape, chunks, declared, message):
  folder = os.path.join(one_ckpt, "target." + KERNEL.replace("/", "."))
  zarray = json.loads(open(os.path.join(folder, ".zarray")).read())
  zarray.update(shape=zshape, chunks=chunks)
  with open(os.path.join(folder, ".zarray"), "w") as f:
    json.dump(zarray, f)
  if declared is not None:
    def declare(spec):
      spec["metadata"]["shape"] = declared
      return spec
    _edit_target(one_ckpt, KERNEL, declare)
  tracemalloc.start()
  try:
    with pytest.raises(ValueError, match=f"'{KERNEL}'.*" + message if
                       not message.startswith("shape") else message):
      checkpoints.load_t5x(one_ckpt)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert peak < 4 * 2**20, peak  # no list of millions of chunk names


# ---------------------------------------------------------------------------
# Symlinks must not lead out of the checkpoint folder


def _outside_copy(src, tmp_path):
  """A copy of `src` outside the checkpoint folder."""
  dst = tmp_path / ("outside_" + os.path.basename(str(src)))
  if os.path.isdir(src):
    shutil.copytree(src, dst)
  else:
    shutil.copy(src, dst)
  return dst


@pytest.mark.parametrize("what", ["chunk", "folder", "zarray", "msgpack"])
def test_legacy_symlinks_out_of_the_checkpoint_are_refused(tmp_path, params, what):
  ckpt = tmp_path / "model" / "checkpoint_1"
  write_legacy(str(ckpt), params)
  name = "target." + KERNEL.replace("/", ".")
  link = {"chunk": ckpt / name / "0.0", "folder": ckpt / name,
          "zarray": ckpt / name / ".zarray", "msgpack": ckpt / "checkpoint"}[what]
  outside = _outside_copy(link, tmp_path)  # readable: only the link's target is wrong
  if os.path.isdir(link):
    shutil.rmtree(link)
  else:
    os.remove(link)
  os.symlink(outside, link)
  with pytest.raises(ValueError, match="outside the checkpoint folder"):
    checkpoints.load_t5x(str(tmp_path / "model"))


def test_symlinks_inside_the_checkpoint_are_fine(tmp_path, params):
  ckpt = tmp_path / "checkpoint_1"
  write_legacy(str(ckpt), params)
  name = "target." + KERNEL.replace("/", ".")
  shutil.move(str(ckpt / name), str(ckpt / "moved"))
  os.symlink("moved", ckpt / name)  # relative, stays inside
  assert_same(checkpoints.load_t5x(str(ckpt)), params)
  link = tmp_path / "linked_checkpoint_1"  # the checkpoint folder itself may be a link
  os.symlink(ckpt, link)
  assert_same(checkpoints.load_t5x(str(link)), params)


@pytest.mark.parametrize("variant, what", [
    ("plain", "folder"), ("plain", "chunk"), ("plain_zarr3", "chunk"),
    ("ocdbt", "data"), ("plain", "_METADATA")])
def test_orbax_symlinks_out_of_the_checkpoint_are_refused(orbax_dir, tmp_path, variant,
                                                          what):
  item = tmp_path / "checkpoint_5" / "state"
  shutil.copytree(orbax_dir / variant / "checkpoint_5" / "state", item)
  chunk = "c/0/0" if variant.endswith("zarr3") else "0.0"
  if what == "data":
    link = item / "d" / sorted(os.listdir(item / "d"))[0]
  else:
    link = {"folder": item / WI0, "chunk": item / WI0 / chunk,
            "_METADATA": item / "_METADATA"}[what]
  outside = _outside_copy(link, tmp_path)
  if os.path.isdir(link):
    shutil.rmtree(link)
  else:
    os.remove(link)
  os.symlink(outside, link)
  with pytest.raises(ValueError, match="outside the checkpoint folder"):
    checkpoints.load_t5x(str(tmp_path))


# ---------------------------------------------------------------------------
# Writers: no silent replacement, recovery from crashed saves


def _other(params, factor):
  out = _cast(params, np.float32)
  out["token_embedder"]["embedding"] = factor * params["token_embedder"]["embedding"]
  return out


@pytest.fixture(params=["renameat2", "mkdir_fallback"])
def commit_mode(request, monkeypatch):
  if request.param == "mkdir_fallback":
    monkeypatch.setattr(_ckpt_commit, "_renameat2", None)
  else:
    assert _ckpt_commit._renameat2 is not None  # Linux with glibc >= 2.28
  return request.param


def test_second_writer_of_a_step_fails_instead_of_replacing(tmp_path, params, monkeypatch,
                                                            commit_mode):
  first, second = _other(params, 2.0), _other(params, 3.0)
  real_write = t5x_format._write_zarr
  calls = []

  def write_then_race(writes):
    real_write(writes)
    if not calls:  # while the outer save writes, another writer commits step 1
      calls.append(1)
      checkpoints.save_t5x(first, str(tmp_path), step=1, dtype="float32")
  monkeypatch.setattr(t5x_format, "_write_zarr", write_then_race)
  with pytest.raises(FileExistsError, match="checkpoint_1 .*another writer"):
    checkpoints.save_t5x(second, str(tmp_path), step=1, dtype="float32")
  assert_same(checkpoints.load_t5x(str(tmp_path)), first)
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_1"]


def test_overwrite_replaces_a_checkpoint_committed_meanwhile(tmp_path, params, monkeypatch,
                                                             commit_mode):
  checkpoints.save_t5x(params, str(tmp_path), step=1, dtype="float32")
  real_write = t5x_format._write_zarr
  calls = []

  def write_then_race(writes):
    real_write(writes)
    if not calls:
      calls.append(1)
      checkpoints.save_t5x(_other(params, 2.0), str(tmp_path), step=1, dtype="float32",
                           overwrite=True)
  monkeypatch.setattr(t5x_format, "_write_zarr", write_then_race)
  checkpoints.save_t5x(_other(params, 3.0), str(tmp_path), step=1, dtype="float32",
                       overwrite=True)
  assert_same(checkpoints.load_t5x(str(tmp_path)), _other(params, 3.0))  # last one wins
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_1"]


def test_failed_overwrite_puts_the_previous_checkpoint_back(tmp_path, params, monkeypatch):
  checkpoints.save_t5x(params, str(tmp_path), step=1, dtype="float32")

  def refuse(src, dst):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(_ckpt_commit, "rename_noreplace", refuse)
  with pytest.raises(OSError, match="No space left"):
    checkpoints.save_t5x(_other(params, 2.0), str(tmp_path), step=1, dtype="float32",
                         overwrite=True)
  monkeypatch.undo()
  # rename_noreplace failed to put it back too: read from .old- until the next save.
  assert_same(checkpoints.load_t5x(str(tmp_path)), _cast(params, np.float32))
  checkpoints.save_t5x(params, str(tmp_path), step=2, dtype="float32")
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_1", "checkpoint_2"]
  assert_same(checkpoints.load_t5x(str(tmp_path / "checkpoint_1")), _cast(params, np.float32))


# The child saves once, then dies by SIGKILL at a chosen point of a second save.
_CRASH_CHILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from specjax import checkpoints
    from specjax.checkpoints import _commit as _ckpt_commit
    path, point = sys.argv[1], sys.argv[2]
    tree = lambda v: {"w": np.full((4, 3), v, np.float32), "b": np.full((3,), v, np.float32)}
    checkpoints.save_t5x(tree(1.0), path, step=5, dtype="float32")
    def die(*args):
      os.kill(os.getpid(), signal.SIGKILL)
    if point == "between_renames":  # the old folder is set aside, the new not yet in
      _ckpt_commit.rename_noreplace = lambda *a: die()
    elif point == "after_writing":  # the temporary folder is complete
      _ckpt_commit.commit = lambda *a: die()
    checkpoints.save_t5x(tree(2.0), path, step=5, dtype="float32", overwrite=True)
""")


def _crash(path, point):
  result = subprocess.run([sys.executable, "-c", _CRASH_CHILD, str(path), point],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode == -signal.SIGKILL, result.stderr


def _leftovers(path):
  return sorted(e for e in os.listdir(path) if _ckpt_commit.LEFTOVER.fullmatch(e))


@pytest.mark.parametrize("point", ["between_renames", "after_writing"])
def test_crashed_overwrite_is_recovered_on_load_and_save(tmp_path, point):
  _crash(tmp_path, point)
  kinds = sorted(e.split(".")[1].split("-")[0] for e in _leftovers(tmp_path))
  assert kinds == (["old", "tmp"] if point == "between_renames" else ["tmp"])
  # Load: the previous checkpoint, even with no checkpoint_5 in place.
  loaded = checkpoints.load_t5x(str(tmp_path))
  np.testing.assert_array_equal(loaded["w"], np.full((4, 3), 1.0, np.float32))
  assert checkpoints.find_checkpoint(str(tmp_path)).step == 5
  named = checkpoints.load_t5x(str(tmp_path / "checkpoint_5"))  # named directly
  np.testing.assert_array_equal(named["w"], loaded["w"])
  # The next save (of another step) puts it back and removes the leftovers.
  checkpoints.save_t5x({"w": np.zeros((4, 3), np.float32)}, str(tmp_path), step=6)
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_5", "checkpoint_6"]
  loaded = checkpoints.load_t5x(str(tmp_path / "checkpoint_5"))
  np.testing.assert_array_equal(loaded["w"], np.full((4, 3), 1.0, np.float32))


def test_stale_temporary_folders_are_cleaned_live_ones_kept(tmp_path, params):
  _crash(tmp_path, "after_writing")  # a dead writer's checkpoint_5.tmp-UUID-PID-HOST
  dead = _leftovers(tmp_path)
  sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    live = _ckpt_commit.new_name(str(tmp_path / "checkpoint_7"), "tmp").replace(
        f"-{os.getpid()}-", f"-{sleeper.pid}-")
    os.mkdir(live)  # a writer that is still running
    old_style_recent = tmp_path / ("checkpoint_8.tmp-" + "a" * 32)  # owner unknown
    old_style_stale = tmp_path / ("checkpoint_9.tmp-" + "b" * 32)
    os.mkdir(old_style_recent)
    os.mkdir(old_style_stale)
    day_ago = os.path.getmtime(old_style_stale) - 2 * _ckpt_commit.STALE_SECONDS
    os.utime(old_style_stale, (day_ago, day_ago))
    checkpoints.save_t5x(params, str(tmp_path), step=10)
    left = set(os.listdir(tmp_path))
    assert not set(dead) & left and old_style_stale.name not in left
    assert os.path.basename(live) in left and old_style_recent.name in left
    assert "checkpoint_5" in left and "checkpoint_10" in left
  finally:
    sleeper.kill()
    sleeper.wait()
  checkpoints.clean_model_dir(str(tmp_path))  # the sleeper is gone now
  assert os.path.basename(live) not in os.listdir(tmp_path)


def test_extra_files_are_committed_with_the_checkpoint(tmp_path, params):
  out = checkpoints.save_t5x(params, str(tmp_path), step=2,
                             extra_files={"notes.json": b'{"a": 1}'})
  assert open(os.path.join(out, "notes.json"), "rb").read() == b'{"a": 1}'
  for bad in ("checkpoint", "../x", "target.foo", ""):
    with pytest.raises(ValueError, match="invalid extra file name"):
      checkpoints.save_t5x(params, str(tmp_path), step=3, extra_files={bad: b""})
