"""gs:// paths against a GCS API server on this machine (gcp-storage-emulator on 127.0.0.1, a free
port, in memory; `specjax.testing_gcs`): checkpoints of both formats read in place give the local
read's arrays and the local run's tokens, outputs land in the bucket, and every fault is one line
naming the object."""
import json
import os
import socket
import threading

import gin
import numpy as np
import pytest

pytest.importorskip("gcp_storage_emulator")

from specjax import checkpoints, files, remote, testing_gcs  # noqa: E402
from specjax.app import records, run  # noqa: E402
from specjax.app.bundled import model_dir  # noqa: E402
from specjax.params import flatten  # noqa: E402

BUCKET = "gs://specjax-test"
TINY = "runs/random_tiny.gin"


@pytest.fixture(scope="session")
def gcs(tmp_path_factory, tiny_t5_pair):
  """The emulator, with the tiny pair's target as a legacy checkpoint and its draft as an Orbax
  (OCDBT) one, each on local disk and in the bucket; the bundled EN->DE draft besides."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  saved = {k: os.environ.get(k) for k in (remote.TIMEOUT_ENV, remote.RETRIES_ENV)}
  os.environ[remote.TIMEOUT_ENV], os.environ[remote.RETRIES_ENV] = "5", "1"
  server = testing_gcs.Emulator().start()
  root = tmp_path_factory.mktemp("gcs")
  checkpoints.save_t5x(tiny_t5_pair.target_params, str(root / "target"), step=3, dtype="float32")
  ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True)).save(
      str(root / "draft" / "checkpoint_7" / "state"),
      {"version": 3, "optimizer": {"target": tiny_t5_pair.draft_params,
                                   "state": {"step": np.int32(7)}}})
  for name in ("target", "draft"):
    testing_gcs.upload(str(root / name), f"{BUCKET}/{name}")
  testing_gcs.upload(str(model_dir("translate", "draft")), f"{BUCKET}/bundled_draft")
  yield server, root
  server.restore()
  for k, v in saved.items():
    os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _same(a, b):
  a, b = dict(flatten(a)), dict(flatten(b))
  assert a.keys() == b.keys()
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("name,fmt", [("target", checkpoints.LEGACY),
                                      ("draft", checkpoints.ORBAX),
                                      ("bundled_draft", checkpoints.LEGACY)])
def test_a_checkpoint_in_the_bucket_reads_as_from_local_disk(gcs, name, fmt):
  _, root = gcs
  local = str(root / name) if name != "bundled_draft" else str(model_dir("translate", "draft"))
  location = checkpoints.find_checkpoint(f"{BUCKET}/{name}")
  assert location.format == fmt and location.path.startswith(f"{BUCKET}/{name}/checkpoint_")
  _same(checkpoints.load_t5x(f"{BUCKET}/{name}"), checkpoints.load_t5x(local))


def test_a_checkpoint_read_asks_each_object_and_byte_range_of_the_bucket_once(gcs):
  """One context per read: the OCDBT manifest is fetched once (not once per array), an array's
  .zarray once (checked, then given to its open), no data byte range twice, and an OCDBT data
  file's ranges merged (fewer requests than arrays). Before, the tiny draft's read fetched the
  manifest once per array and every .zarray twice, so each count below fails."""
  server, root = gcs
  for name, arrays in (("draft", len(list(flatten(checkpoints.load_t5x(str(root / "draft")))))),
                       ("target", None)):
    checkpoints.load_t5x(f"{BUCKET}/{name}")
    del server.requests[:]
    checkpoints.load_t5x(f"{BUCKET}/{name}")
    media = [(r.path, r.range) for r in server.requests
             if "alt=json" not in r.query.split("&") and not r.path.endswith("/o")]
    assert len(media) == len(set(media)) + (1 if name == "draft" else 0), media
    if name == "draft":  # the b-tree root: once by the listing, once at the arrays' open
      assert sum(p.endswith("manifest.ocdbt") for p, _ in media) == 1, media
      data = [p for p, _ in media if "ocdbt.process_" in p]
      assert 0 < len(data) < arrays, (len(data), arrays)
    else:
      stored = sum(n == ".zarray" for _, _, ns in os.walk(root / name) for n in ns)
      assert stored and sum(p.endswith(".zarray") for p, _ in media) == stored, media


def test_a_checkpoint_saved_to_the_bucket_appears_whole(gcs, tiny_t5_pair, monkeypatch):
  """save_t5x into gs://: read back as the local save reads; its `checkpoint` object is written
  last, so a save that fails before it leaves no checkpoint (and its arrays are removed), and
  the next save of that step succeeds; an existing checkpoint is never replaced."""
  _, root = gcs
  params, url = tiny_t5_pair.target_params, f"{BUCKET}/saved"
  written = []
  real_write = remote.write_objects

  def failing(outputs, what="the output"):
    written.extend(outputs)
    if any(u.endswith("/checkpoint") for u in outputs):
      raise ValueError("the server went away")
    return real_write(outputs, what)
  monkeypatch.setattr(remote, "write_objects", failing)
  with pytest.raises(ValueError, match="went away"):
    checkpoints.save_t5x(params, url, step=5, dtype="float32", extra_files={"opt": b"x"})
  assert written[-1] == f"{url}/checkpoint_5/checkpoint"  # the msgpack comes last
  assert remote.list_folder(url) == set()  # the arrays and extra file removed again
  with pytest.raises(FileNotFoundError):
    checkpoints.find_checkpoint(url)
  monkeypatch.setattr(remote, "write_objects", real_write)
  out = checkpoints.save_t5x(params, url, step=5, dtype="float32", extra_files={"opt": b"x"})
  assert out == f"{url}/checkpoint_5"
  assert remote.read_bytes(f"{out}/opt", 10, "the extra file") == b"x"
  checkpoints.save_t5x(params, str(root / "saved_local"), step=5, dtype="float32")
  _same(checkpoints.load_t5x(url), checkpoints.load_t5x(str(root / "saved_local")))
  with pytest.raises(FileExistsError, match="already exists"):
    checkpoints.save_t5x(params, url, step=5)
  with pytest.raises(ValueError, match="no rename"):
    checkpoints.save_t5x(params, url, step=5, overwrite=True)


def test_the_job_decodes_from_the_bucket_the_tokens_it_decodes_from_disk(gcs, tmp_path):
  """Greedy, target (legacy) and draft (Orbax) from the bucket, results written to the bucket:
  the same tokens as the run from local disk; a second run keeps the first's under earlier/."""
  _, root = gcs
  common = [f"--gin_file={TINY}", "--prompt", "Hello world", "--gin.MAX_NEW_TOKENS=5", "--plain",
            "--gin.BATCH_SIZE=1", "--gin.GAMMA_POLICY='constant'"]
  run(common + [f"--gin.TARGET_CHECKPOINT='{root / 'target'}'",
                f"--gin.DRAFT_CHECKPOINT='{root / 'draft'}'", f"--gin.OUTPUT_DIR='{tmp_path}'"])
  gin.clear_config()
  out = f"{BUCKET}/runs/one"
  run(common + [f"--gin.TARGET_CHECKPOINT='{BUCKET}/target'",
                f"--gin.DRAFT_CHECKPOINT='{BUCKET}/draft/checkpoint_7'", f"--gin.OUTPUT_DIR='{out}'"])
  local = json.loads((tmp_path / "results.jsonl").read_text())
  there = json.loads(files.read_bytes(f"{out}/results.jsonl", 2**20, "results"))
  for key in ("autoregressive_tokens", "prediction_tokens", "input_tokens"):
    assert there[key] == local[key], key
  first = files.read_bytes(f"{out}/summary.json", 2**20, "summary")
  kept = records.write(out, [{"x": 1}], {"y": 2})
  assert kept and kept.startswith(f"{out}/earlier/")
  assert files.read_bytes(f"{kept}/summary.json", 2**20, "summary") == first
  assert remote.list_folder(out) >= {"results.jsonl", "summary.json"}


def test_a_vocabulary_and_a_model_gin_with_its_include_from_the_bucket(gcs, tmp_path):
  from specjax.data import Vocab, resolve_vocabulary  # pylint: disable=import-outside-toplevel
  from specjax.data.vocab import DEFAULT_MODEL  # pylint: disable=import-outside-toplevel
  from specjax.models import read_model_gin  # pylint: disable=import-outside-toplevel
  remote.write_objects({f"{BUCKET}/vocab/spm.model": DEFAULT_MODEL.read_bytes()})
  vocab = resolve_vocabulary(f"{BUCKET}/vocab/spm.model")
  assert vocab.encode("Hello world") == Vocab(DEFAULT_MODEL).encode("Hello world")
  gin_text = (model_dir("translate", "draft") / "model.gin").read_text()
  remote.write_objects({f"{BUCKET}/gin/base.gin": gin_text.encode(),
                        f"{BUCKET}/gin/model.gin": b"include 'base.gin'\n"})
  assert read_model_gin(f"{BUCKET}/gin") == read_model_gin(str(model_dir("translate", "draft")))
  remote.write_objects({f"{BUCKET}/gin2/model.gin": b"include '../../elsewhere.gin'\n"})
  with pytest.raises((ValueError, FileNotFoundError), match="elsewhere.gin"):
    read_model_gin(f"{BUCKET}/gin2")


def test_an_input_file_and_a_cost_table_in_the_bucket(gcs):
  from specjax.app.plan import cost_table_file  # pylint: disable=import-outside-toplevel
  from specjax.data.inputs import read_input_file  # pylint: disable=import-outside-toplevel
  remote.write_objects({f"{BUCKET}/in.txt": "Hello world\n\nA b c\n".encode()})
  assert read_input_file(f"{BUCKET}/in.txt") == ["Hello world", "A b c"]
  with pytest.raises(ValueError, match=f"{BUCKET}/in.txt is more than the 8 bytes accepted"):
    read_input_file(f"{BUCKET}/in.txt", limit=8)
  with pytest.raises(FileNotFoundError, match=f"--input_file {BUCKET}/none.txt does not exist"):
    read_input_file(f"{BUCKET}/none.txt")
  assert cost_table_file(f"{BUCKET}/costs.json") is None  # written there after the run
  remote.write_objects({f"{BUCKET}/costs.json": b"not json"})
  with pytest.raises(ValueError, match=f"{BUCKET}/costs.json"):
    cost_table_file(f"{BUCKET}/costs.json")


def _copy(src: str, dst: str) -> None:
  for key in remote.list_folder(src):
    remote.write_objects({f"{dst}/{key}": files.read_bytes(f"{src}/{key}", 2**30, "x")})


def test_faults_in_the_bucket_are_one_line_naming_the_object(gcs, tiny_t5_pair, monkeypatch):
  _copy(f"{BUCKET}/target/checkpoint_3", f"{BUCKET}/bad/checkpoint_3")
  chunks = sorted(k for k in remote.list_folder(f"{BUCKET}/bad/checkpoint_3")
                  if k.startswith("target.") and not k.endswith(".zarray"))
  name, chunk = chunks[0].split("/", 1)
  param = name[len("target."):].replace(".", "/")
  data = files.read_bytes(f"{BUCKET}/bad/checkpoint_3/{chunks[0]}", 2**30, "x")
  remote.write_objects({f"{BUCKET}/bad/checkpoint_3/{chunks[0]}": data[:len(data) // 2]})
  with pytest.raises(ValueError, match=f"gs://specjax-test/bad.*'{param}'"):
    checkpoints.load_t5x(f"{BUCKET}/bad")  # a truncated chunk
  remote.delete(f"{BUCKET}/bad/checkpoint_3/{chunks[0]}")
  with pytest.raises(ValueError, match=f"'{param}' is missing chunk file.*{chunk}"):
    checkpoints.load_t5x(f"{BUCKET}/bad")
  with pytest.raises(ValueError, match="missing parameter|unexpected parameter|has shape"):
    checkpoints.load_t5x_for_model(f"{BUCKET}/target", tiny_t5_pair.draft)
  monkeypatch.setenv("SPECJAX_MAX_ARRAY_BYTES", "20000")  # above the msgpack, below an array
  with pytest.raises(ValueError, match="declares .* bytes .*more than the 20000 allowed"):
    checkpoints.load_t5x(f"{BUCKET}/target")
  monkeypatch.delenv("SPECJAX_MAX_ARRAY_BYTES")
  with pytest.raises(FileNotFoundError, match="gs://specjax-test/nothing"):
    checkpoints.find_checkpoint(f"{BUCKET}/nothing")
  with pytest.raises((FileNotFoundError, ValueError), match="gs://no-such-bucket/ckpt"):
    checkpoints.find_checkpoint("gs://no-such-bucket/ckpt")
  with pytest.raises(ValueError, match="s3://x/y is a remote path that is not gs://"):
    checkpoints.load_t5x("s3://x/y")


class _Stub:
  """An HTTP endpoint on 127.0.0.1 that refuses every request (403), or accepts connections and
  never answers (stall)."""

  def __init__(self, stall: bool):
    self.sock = socket.socket()
    self.sock.bind(("127.0.0.1", 0))
    self.sock.listen(64)
    self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
    self.open = []
    if not stall:
      threading.Thread(target=self._refuse, daemon=True).start()

  def _refuse(self):
    while True:
      try:
        conn, _ = self.sock.accept()
      except OSError:
        return
      conn.recv(65536)
      body = b'{"error": {"code": 403, "message": "forbidden"}}'
      conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
      conn.close()

  def close(self):
    self.sock.close()


def test_a_refused_request_and_a_stalled_server_are_named(gcs, monkeypatch):
  for stall, error, message in ((False, ValueError, "was refused"),
                                (True, TimeoutError, "no answer from the storage server")):
    stub = _Stub(stall)
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", stub.url)
    monkeypatch.setenv(remote.TIMEOUT_ENV, "1")
    try:
      with pytest.raises(error, match=f"gs://specjax-test/target.*{message}"):
        checkpoints.find_checkpoint(f"{BUCKET}/target")
    finally:
      stub.close()


def test_a_server_stopped_mid_read_is_one_error_naming_the_object(gcs, tmp_path):
  """A second emulator stops after a few requests of a read: the read fails with one line naming
  the checkpoint, and so does an output written after it."""
  server = testing_gcs.Emulator()
  server.start()
  try:
    testing_gcs.upload(str(gcs[1] / "target"), f"{BUCKET}/t")
    served = []
    original = remote.wait

    def wait(future, url, action, seconds=None):
      served.append(url)
      if len(served) == 3:
        server.stop()
      return original(future, url, action, seconds)
    remote_wait = pytest.MonkeyPatch()
    remote_wait.setattr(remote, "wait", wait)
    try:
      with pytest.raises((ValueError, OSError), match="gs://specjax-test/t"):
        checkpoints.load_t5x(f"{BUCKET}/t")
      with pytest.raises((ValueError, OSError), match="gs://specjax-test/out/results.jsonl"):
        records.write(f"{BUCKET}/out", [{"x": 1}], {"y": 2})
    finally:
      remote_wait.undo()
  finally:
    server.restore()


def test_gin_files_search_paths_and_model_gin_files_in_the_bucket(gcs):
  """--gin_file and --gin_search_paths at gs:// (gin parses the bucket's run file and the include
  beside it; TARGET_MODEL names a model gin file found on the bucket's search path, which holds
  model gin files only)."""
  from specjax.app import gin_config  # pylint: disable=import-outside-toplevel
  from specjax.models import read_model_gin  # pylint: disable=import-outside-toplevel
  draft = model_dir("translate", "draft")
  remote.write_objects({
      f"{BUCKET}/runs/my_run.gin": (f"include '{TINY}'\ninclude 'more.gin'\n"
                                    "TARGET_MODEL = 'my_model.gin'\n").encode(),
      f"{BUCKET}/runs/more.gin": b"MAX_NEW_TOKENS = 3\n",
      f"{BUCKET}/paths/my_model.gin": (draft / "model.gin").read_bytes()})
  gin_config.parse([f"{BUCKET}/runs/my_run.gin"], [], [f"{BUCKET}/paths"])
  assert gin_config.query_macro("MAX_NEW_TOKENS") == 3
  assert gin_config.model_config("target") == read_model_gin(str(draft))
  gin.clear_config()
  with pytest.raises(FileNotFoundError, match="gin file 'gs://specjax-test/runs/none.gin' not found"):
    gin_config.parse([f"{BUCKET}/runs/none.gin"], [])
