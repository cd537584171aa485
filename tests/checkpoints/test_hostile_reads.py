"""Reading checkpoints that are hostile or changing (docs/results/hostile_probe.md, second
part): a save overwriting the step being read, declared sizes the bytes on disk cannot hold,
special files in place of chunks or metadata. Nothing here runs a model.
"""
import bz2
import gzip
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from specjax import checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_WRITER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from specjax import checkpoints
    path, stop = sys.argv[1], sys.argv[2]
    i, t0 = 0, time.time()
    while not os.path.exists(stop) and time.time() - t0 < 120:
      i += 1
      value = float(i % 2)
      params = {f"layer_{k}": {"kernel": np.full((64, 32), value, np.float32),
                               "scale": np.full((), value, np.float32)} for k in range(6)}
      checkpoints.save_t5x(params, path, step=1, dtype=None, overwrite=True)
    print(i)
""")


def _params(value):
  return {f"layer_{k}": {"kernel": np.full((64, 32), value, np.float32),
                         "scale": np.full((), value, np.float32)} for k in range(6)}


def test_a_reader_never_sees_two_saves_at_once(tmp_path):
  # A writer process overwrites checkpoint_1 in a loop, alternating all-0 and all-1 saves,
  # while this process loads it for 12 s. Before, 490 of 23,913 loads mixed arrays of both
  # saves (7 in 1,430 in 10 s on this machine) and others failed with a TypeError or a
  # "missing" array; now every load is one save (the folder is share-locked while it is read).
  path = str(tmp_path / "model")
  checkpoints.save_t5x(_params(0.0), path, step=1, dtype=None)
  stop = str(tmp_path / "stop")
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  writer = subprocess.Popen([sys.executable, "-c", _WRITER, path, stop], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  loads, mixed, errors = 0, 0, []
  try:
    deadline = time.time() + 12
    while time.time() < deadline:
      try:
        params = checkpoints.load_t5x(path)
      except ValueError as e:  # a clear error is allowed (counted), nothing else
        errors.append(str(e))
        continue
      values = {float(v) for layer in params.values() for leaf in layer.values()
                for v in (np.min(leaf), np.max(leaf))}
      loads += 1
      mixed += len(values) != 1
  finally:
    open(stop, "w").close()
    out, err = writer.communicate(timeout=120)
  assert writer.returncode == 0, err[-2000:]
  saves = int(out.split()[-1])
  assert saves >= 20, f"the writer saved only {saves} times: the test raced nothing"
  assert loads >= 100
  assert mixed == 0, f"{mixed} of {loads} loads mixed two saves"
  assert len(errors) <= loads // 100, errors[:3]


# ---------------------------------------------------------------------------
# Declared sizes against the bytes on disk and the ceiling


def _legacy(folder, shape, chunks, chunk_files, compressor=None, dtype="<f4"):
  """A hand-written legacy checkpoint_1 whose one parameter 'w' declares `shape` in `chunks`.

  Args:
    chunk_files: {chunk key: bytes} written into the array folder as they are.
  """
  from specjax.checkpoints import _io  # the msgpack writer, to build what no save writes
  ckpt = folder / "checkpoint_1"
  array = ckpt / "target.w"
  array.mkdir(parents=True)
  meta = {"chunks": chunks, "compressor": compressor, "shape": shape}
  spec = {"driver": "zarr", "dtype": np.dtype(dtype).name,
          "kvstore": {"driver": "file", "path": "target.w/"}, "metadata": meta}
  (ckpt / "checkpoint").write_bytes(_io.encode(
      {"version": 3, "optimizer": {"target": {"w": spec},
                                   "state": {"step": np.asarray(1, np.int32)}}}))
  (array / ".zarray").write_text(json.dumps(
      {"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype,
       "compressor": compressor, "fill_value": None, "order": "C", "filters": None}))
  for key, payload in chunk_files.items():
    (array / key).write_bytes(payload)
  return str(folder)


def _load_in_subprocess(path, timeout=90, env=None):
  code = ("import sys\nfrom specjax import checkpoints\ntry:\n"
          f"  checkpoints.load_t5x({path!r})\nexcept ValueError as e:\n"
          "  print('ValueError:', e); sys.exit(3)\nprint('loaded')\n")
  return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                        text=True, timeout=timeout, env=env)


def test_a_huge_declared_shape_with_a_tiny_chunk_is_refused_before_allocation(tmp_path):
  # One float32 parameter of shape [2**38] (1 TiB) in one 20-byte gzip chunk: the reader used
  # to allocate the whole array and die in std::bad_alloc (rc 134, no message).
  path = _legacy(tmp_path, [2**38], [2**38], {"0": gzip.compress(b"\0" * 16)},
                 compressor={"id": "gzip", "level": 1})
  result = _load_in_subprocess(path)
  assert result.returncode == 3, (result.returncode, result.stderr[-2000:])
  assert "parameter 'w' declares 1099511627776 bytes" in result.stdout
  assert "SPECJAX_MAX_ARRAY_BYTES" in result.stdout


def test_a_gzip_chunk_too_small_for_its_declared_size_is_refused(tmp_path):
  # 16 MiB declared (under the ceiling) in a 29-byte gzip chunk: deflate cannot hold more than
  # 1032 bytes per byte, so it is refused from the file sizes, before tensorstore allocates.
  path = _legacy(tmp_path, [2**22], [2**22], {"0": gzip.compress(b"\0" * 16)},
                 compressor={"id": "gzip", "level": 1})
  with pytest.raises(ValueError, match=r"parameter 'w' declares chunks of \(4194304,\) values, "
                     r"but its chunk file 0 holds \d+ bytes, too few"):
    checkpoints.load_t5x(path)


def test_the_ceiling_bounds_what_a_compressor_without_a_ratio_bound_may_declare(
    tmp_path, monkeypatch):
  # bz2 holds 8 MiB of zeros in ~50 bytes: only the configurable ceiling bounds it.
  path = _legacy(tmp_path, [2**21], [2**21], {"0": bz2.compress(b"\0" * 2**23)},
                 compressor={"id": "bz2", "level": 9})
  assert checkpoints.load_t5x(path)["w"].shape == (2**21,)  # under the default ceiling
  monkeypatch.setenv("SPECJAX_MAX_ARRAY_BYTES", str(2**22))
  with pytest.raises(ValueError, match=r"the array of parameter 'w' declares 8388608 bytes .* "
                     r"more than the 4194304 allowed"):
    checkpoints.load_t5x(path)
  monkeypatch.setenv("SPECJAX_MAX_ARRAY_BYTES", "lots")
  with pytest.raises(ValueError, match="SPECJAX_MAX_ARRAY_BYTES='lots' must be a positive"):
    checkpoints.load_t5x(path)


def test_the_ceiling_applies_to_orbax_arrays_too(tmp_path, monkeypatch):
  ocp = pytest.importorskip("orbax.checkpoint")
  item = tmp_path / "checkpoint_5" / "state"
  ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True)).save(
      str(item), {"optimizer": {"target": {"w": np.zeros((64, 64), np.float32)}}})
  monkeypatch.setenv("SPECJAX_MAX_ARRAY_BYTES", "1024")
  with pytest.raises(ValueError, match=r"parameter 'w' declares 16384 bytes"):
    checkpoints.load_t5x(str(tmp_path))
  monkeypatch.delenv("SPECJAX_MAX_ARRAY_BYTES")
  # A missing OCDBT manifest is named as such (it used to be reported as a missing array).
  os.remove(item / "manifest.ocdbt")
  with pytest.raises(ValueError, match="OCDBT database, but its manifest .* is missing"):
    checkpoints.load_t5x(str(tmp_path))


# ---------------------------------------------------------------------------
# Special files, nesting


@pytest.mark.parametrize("which", ["0.0", ".zarray", "checkpoint"])
def test_a_fifo_in_a_checkpoint_is_refused_not_waited_on(tmp_path, which):
  # A FIFO in place of a chunk file or the .zarray used to block load_t5x forever.
  path = str(tmp_path / "model")
  checkpoints.save_t5x(_params(0.0), path, step=1, dtype=None)
  folder = os.path.join(path, "checkpoint_1")
  target = os.path.join(folder, which if which == "checkpoint" else "target.layer_0.kernel",
                        "" if which == "checkpoint" else which)
  os.remove(target.rstrip("/"))
  os.mkfifo(target.rstrip("/"))
  load = (f"checkpoints.load_t5x({folder + '/checkpoint'!r})" if which == "checkpoint"
          else f"checkpoints.load_t5x({path!r})")
  code = ("import sys\nfrom specjax import checkpoints\ntry:\n"
          f"  {load}\nexcept ValueError as e:\n  print('ValueError:', e); sys.exit(3)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=30)
  assert result.returncode == 3, result.stderr[-2000:]
  assert "not a regular file" in result.stdout, result.stdout


def test_a_deeply_nested_msgpack_is_a_value_error(tmp_path):
  # 500 nested maps used to raise RecursionError; msgpack's own limit gave an empty message.
  import msgpack
  ckpt = tmp_path / "checkpoint_1"
  ckpt.mkdir()
  for depth, message in ((500, "nested more than 64 levels deep"), (3000, "nested too deep")):
    inner = b"\x81\xa1a" * depth + b"\x80"
    (ckpt / "checkpoint").write_bytes(
        b"\x82" + msgpack.packb("version") + msgpack.packb(3) + msgpack.packb("optimizer")
        + b"\x81" + msgpack.packb("target") + inner)
    with pytest.raises(ValueError, match=message):
      checkpoints.load_t5x(str(tmp_path))


# ---------------------------------------------------------------------------
# Folder names, casts


def test_which_of_two_spellings_of_a_step_wins_does_not_depend_on_listing_order(tmp_path):
  path = str(tmp_path / "model")
  checkpoints.save_t5x(_params(0.0), path, step=10, dtype=None)
  checkpoints.save_t5x(_params(1.0), path, step=11, dtype=None)
  os.rename(os.path.join(path, "checkpoint_11"), os.path.join(path, "checkpoint_010"))
  # checkpoint_10 (the name T5X writes) wins over checkpoint_010, whatever the listing order.
  assert checkpoints.list_checkpoint_dirs(path) == [(10, os.path.join(path, "checkpoint_10"))]
  assert float(checkpoints.load_t5x(path)["layer_0"]["kernel"][0, 0]) == 0.0
  os.rename(os.path.join(path, "checkpoint_10"), os.path.join(path, "checkpoint_0010"))
  with pytest.raises(ValueError, match="checkpoint_0010 and checkpoint_010 are both step 10"):
    checkpoints.load_t5x(path)


def test_a_users_folder_named_like_a_leftover_is_never_read_moved_or_deleted(tmp_path):
  # A user's checkpoint_9.old-backup was loaded as the newest step and later renamed.
  path = tmp_path / "model"
  checkpoints.save_t5x(_params(0.0), str(path), step=5, dtype=None)
  checkpoints.save_t5x(_params(1.0), str(path), step=9, dtype=None)
  os.rename(path / "checkpoint_9", path / "checkpoint_9.old-backup")
  day_ago = time.time() - 3 * 24 * 3600
  os.utime(path / "checkpoint_9.old-backup", (day_ago, day_ago))
  assert checkpoints.find_checkpoint(str(path)).step == 5
  checkpoints.save_t5x(_params(0.0), str(path), step=6, dtype=None)  # recovery runs here
  assert sorted(os.listdir(path)) == ["checkpoint_5", "checkpoint_6", "checkpoint_9.old-backup"]


def test_a_cast_that_overflows_is_warned_naming_the_parameter(tmp_path, caplog):
  params = {"big": {"kernel": np.array([1.0, 7e4, -1e5], np.float32)},
            "small": {"kernel": np.ones(3, np.float32)}}
  path = str(tmp_path / "model")
  checkpoints.save_t5x(params, path, step=1, dtype="float16")
  assert "save_t5x: casting to float16 turned finite values into inf in 1 parameter(s): " \
         "'big/kernel' (2 of 3)" in caplog.text
  caplog.clear()
  checkpoints.save_t5x(params, path, step=2, dtype="float32")
  loaded = checkpoints.load_t5x(path, dtype="float16")
  assert np.isinf(loaded["big"]["kernel"]).sum() == 2
  assert "casting to float16 turned finite values into inf in 1 parameter(s): 'big/kernel'" \
      in caplog.text
  caplog.clear()
  checkpoints.load_t5x(path, dtype="bfloat16")  # bfloat16 holds 1e5: nothing to say
  assert "casting" not in caplog.text
