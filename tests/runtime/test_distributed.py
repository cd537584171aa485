"""Tests for specjax.runtime.distributed and specjax.runtime.launch: one job over 2 CPU processes.

The launcher starts 2 processes x 2 host devices (4 global devices, mesh data 2 x model 2)
joined by `jax.distributed` (gloo collectives). The decode check loads a T5X target
(legacy zarr) and draft (Orbax OCDBT) sharded and decodes; its tokens must equal a
one-device run of the same inputs in this process.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from specjax.runtime import distributed, launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Fewer decodes than distributed_check runs by default (each compiles in both processes);
# prompt lookup and beam search are checked the same way by `python -m specjax.app.distributed_check`.
DECODES = "ar_greedy,spec_greedy,spec_sampled"
CHECK_ARGS = ["--batch", "6", "--prompt_len", "4", "--new_tokens", "6", "--gamma", "2",
              "--seed", "3", "--decodes", DECODES]


def _tiny_config(seed_offset):
  from specjax.models.decoder_only import DecoderOnlyConfig  # pylint: disable=import-outside-toplevel
  return DecoderOnlyConfig(vocab_size=64, emb_dim=16, num_heads=2, num_layers=1, head_dim=8,
                           mlp_dim=32 + 16 * seed_offset, logits_via_embedding=False)


def _sharpened(params):
  # Random init is near-uniform: scaled logits make greedy rows differ (power, below).
  out = dict(params)
  out["decoder"] = dict(params["decoder"])
  out["decoder"]["logits_dense"] = {"kernel": np.asarray(
      params["decoder"]["logits_dense"]["kernel"]) * 8.0}
  return out


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
  """A tiny target (legacy T5X zarr) and draft (Orbax OCDBT), each with its model.gin."""
  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp
  from specjax.checkpoints import save_t5x
  from specjax.models import build_model
  from specjax.models.model_gin import MODEL_GIN, model_gin_text
  root = tmp_path_factory.mktemp("models")
  dirs = {}
  for offset, role in enumerate(("target", "draft")):
    config = _tiny_config(offset)
    params = _sharpened(build_model(config).init(offset))
    folder = root / role
    folder.mkdir()
    (folder / MODEL_GIN).write_text(model_gin_text(config))
    if role == "target":
      save_t5x(params, str(folder), step=2, dtype="float32")
    else:
      state = {"version": 3, "optimizer": {"target": params, "state": {"step": np.int32(1)}}}
      ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True)).save(
          str(folder / "checkpoint_1" / "state"), state)
    dirs[role] = str(folder)
  return dirs


@pytest.fixture(scope="module")
def two_process_run(model_dirs, tmp_path_factory):
  out_dir = tmp_path_factory.mktemp("out")
  out = out_dir / "tokens.json"
  command = [sys.executable, "-m", "specjax.runtime.launch", "--num_processes", "2", "--local_devices",
             "2", "--timeout", "400", "--", "specjax.app.distributed_check", "--target",
             model_dirs["target"], "--draft", model_dirs["draft"], "--num_partitions", "2",
             "--out", str(out)] + CHECK_ARGS
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=450,
                        check=False)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
  return {"record": json.loads(out.read_text()), "log": proc.stdout,
          "files": sorted(os.listdir(out_dir))}


@pytest.fixture(scope="module")
def single_run(model_dirs, tmp_path_factory):
  from specjax.app import distributed_check  # pylint: disable=import-outside-toplevel
  out = tmp_path_factory.mktemp("single") / "single.json"
  args = distributed_check.parse_args(["--target", model_dirs["target"], "--draft",
                                       model_dirs["draft"], "--single", "--out", str(out)]
                                      + CHECK_ARGS)
  return distributed_check.run(args)


@pytest.mark.e2e
def test_two_processes_decode_the_single_process_tokens(two_process_run, single_run):
  record = two_process_run["record"]
  assert record["processes"] == 2 and record["devices"] == 4
  assert record["mesh"] == {"data": 2, "model": 2}
  assert set(record["tokens"]) == set(DECODES.split(","))
  for name, tokens in single_run["tokens"].items():
    assert record["tokens"][name] == tokens, name
  # Power: rows differ, and sampling differs from greedy (a broken placement that fed every
  # process the same rows, or dropped the seed, would not reproduce these).
  greedy = single_run["tokens"]["ar_greedy"]
  assert len({tuple(r) for r in greedy}) >= 4
  assert single_run["tokens"]["spec_sampled"] != single_run["tokens"]["spec_greedy"]
  assert single_run["tokens"]["spec_greedy"] == greedy  # greedy speculative = autoregressive


@pytest.mark.e2e
def test_only_process_zero_writes(two_process_run):
  assert two_process_run["record"]["writer"] == 0
  assert two_process_run["files"] == ["tokens.json"]  # no temporary left, nothing else
  lines = two_process_run["log"].splitlines()
  assert any(l.startswith("[p0] ") and "wrote" in l for l in lines)
  assert any(l.startswith("[p1] ") for l in lines)
  assert not any(l.startswith("[p1] ") and "wrote" in l for l in lines)


@pytest.mark.e2e
def test_two_processes_read_one_checkpoint_from_a_bucket(model_dirs, single_run, tmp_path):
  """Target (legacy) and draft (Orbax) in one bucket of a GCS API server on 127.0.0.1, both
  processes reading their shards from it: the tokens one process decodes from local disk."""
  pytest.importorskip("gcp_storage_emulator")
  from specjax import testing_gcs  # pylint: disable=import-outside-toplevel
  out = tmp_path / "tokens.json"
  with testing_gcs.emulator():
    for role in ("target", "draft"):
      testing_gcs.upload(model_dirs[role], f"gs://specjax-test/{role}")
    command = [sys.executable, "-m", "specjax.runtime.launch", "--num_processes", "2",
               "--local_devices", "2", "--timeout", "400", "--", "specjax.app.distributed_check",
               "--target", "gs://specjax-test/target", "--draft", "gs://specjax-test/draft",
               "--num_partitions", "2", "--out", str(out)] + CHECK_ARGS
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=450,
                          check=False)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
  assert json.loads(out.read_text())["tokens"] == single_run["tokens"]


# ------------------------------------------------------------------ no JAX job needed


def test_launcher_returns_the_failure_and_prefixes_output(tmp_path_factory, capsys):
  good = tmp_path_factory.mktemp("launch") / "ok.json"
  good.write_text('{"a": 1}')
  assert launch.launch(["json.tool", str(good)], num_processes=2) == 0
  text = capsys.readouterr().out
  assert '[p0] {' in text and '[p1] {' in text
  assert launch.launch(["json.tool", str(good) + ".missing"], num_processes=2) != 0
  with pytest.raises(ValueError, match="no module"):
    launch.launch([], num_processes=2)


def test_launcher_environment():
  env = launch.process_env(1, 2, 1234, 3, base={"XLA_FLAGS": "--foo "
                                                "--xla_force_host_platform_device_count=8"})
  assert env[distributed.ENV_COORDINATOR] == "127.0.0.1:1234"
  assert (env[distributed.ENV_NUM_PROCESSES], env[distributed.ENV_PROCESS_ID]) == ("2", "1")
  assert env["XLA_FLAGS"] == "--foo --xla_force_host_platform_device_count=3"


def test_resolve_reads_arguments_then_environment():
  env = {distributed.ENV_COORDINATOR: "10.0.0.1:99", distributed.ENV_NUM_PROCESSES: "4",
         distributed.ENV_PROCESS_ID: "3"}
  assert distributed.resolve(environ=env) == {
      "coordinator_address": "10.0.0.1:99", "num_processes": 4, "process_id": 3,
      "local_device_count": None}
  assert distributed.resolve("h:1", 2, 0, 2, environ=env)["process_id"] == 0
  assert distributed.resolve(environ={})["num_processes"] is None
  with pytest.raises(ValueError, match="process_id must be in"):
    distributed.resolve(environ=dict(env, JAX_PROCESS_ID="4"))
  with pytest.raises(ValueError, match="must be an integer"):
    distributed.resolve(num_processes="two", environ={})
  with pytest.raises(ValueError, match="host:port"):
    distributed.resolve(coordinator_address="localhost", environ={})


def test_single_process_initialize_is_a_no_op(monkeypatch):
  for name in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES,
               distributed.ENV_PROCESS_ID):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(distributed, "_cluster_detected", lambda: False)
  assert distributed.initialize() == distributed.ProcessInfo(0, 1, None)
  assert distributed.is_writer()
  with pytest.raises(ValueError, match="process_id not given"):
    distributed.initialize(coordinator_address="127.0.0.1:1", num_processes=2)


def test_process_rows_tile_the_batch():
  for batch, count in ((7, 2), (8, 4), (3, 4)):
    parts = [distributed.process_rows(batch, i, count) for i in range(count)]
    covered = np.concatenate([np.arange(batch)[s] for s in parts])
    assert covered.tolist() == list(range(batch))
    assert max(s.stop - s.start for s in parts) - min(s.stop - s.start for s in parts) <= 1


# ------------------------------------------------------------------ training on 2 processes


def _launch_training(model_dir, *extra):
  command = [sys.executable, "-m", "specjax.runtime.launch", "--num_processes", "2", "--local_devices",
             "1", "--timeout", "300", "--", "tests.runtime.distributed_train_worker", "--model_dir",
             str(model_dir), "--num_steps", "4", "--checkpoint_every", "2", *extra]
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=360,
                        check=False)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
  return proc.stdout


@pytest.mark.e2e
def test_stopped_and_resumed_training_ends_bit_identical(tmp_path):
  from specjax.checkpoints import load_t5x  # pylint: disable=import-outside-toplevel
  from specjax.params import flatten  # pylint: disable=import-outside-toplevel
  whole, cut, split = tmp_path / "whole", tmp_path / "cut", tmp_path / "split"
  _launch_training(whole, "--sharded_copy", str(split))
  log = _launch_training(cut, "--stop_after", "2")
  assert "[p0] process 0: step 2" in log and "[p1] process 1: step 2" in log
  assert sorted(os.listdir(cut)) == ["checkpoint_2"]  # the stop left only step 2
  assert "[p1] process 1: step 4" in _launch_training(cut)  # resumed in fresh processes
  assert sorted(os.listdir(cut)) == sorted(os.listdir(whole)) == ["checkpoint_2", "checkpoint_4"]
  first = dict(flatten(load_t5x(str(whole / "checkpoint_2"), dtype="float32")))
  a = dict(flatten(load_t5x(str(whole / "checkpoint_4"), dtype="float32")))
  b = dict(flatten(load_t5x(str(cut / "checkpoint_4"), dtype="float32")))
  assert a.keys() == b.keys()
  for name in a:
    assert np.array_equal(a[name], b[name]), name  # bit for bit
  # Power: training moved the parameters between the checkpoints.
  assert any(not np.array_equal(a[n], first[n]) for n in a)
  for name in ("optimizer_state.npz", "train_state.json", "checkpoint"):
    assert (cut / "checkpoint_4" / name).is_file()
  # The copy split over a model axis across both processes: each wrote its own chunk.
  c = dict(flatten(load_t5x(str(split / "checkpoint_4"), dtype="float32")))
  assert all(np.array_equal(a[name], c[name]) for name in a)
  chunks = os.listdir(split / "checkpoint_4" / "target.decoder.layers_0.mlp.wi_0.kernel")
  assert sorted(chunks) == [".zarray", "0.0", "0.1"]  # [16, 32] in two [16, 16] chunks
