"""Tests for specjax.checkpoints: T5X legacy msgpack+zarr, Orbax, and writing.

Every fixture checkpoint here is written by the test itself: the legacy ones
with plain msgpack / tensorstore calls in T5X's exact layout (or flax's own
serializer), the Orbax ones with orbax-checkpoint.
"""
import json
import os
import shutil
import subprocess
import sys

import jax
import ml_dtypes
import msgpack
import numpy as np
import pytest
import tensorstore as ts

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
                  "ocdbt_zarr3": (True, True)}


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
