"""A GCS API server on this machine, for tests and measurements of gs:// paths.

Not for decoding: imported only by the tests and `experiments.bench.gcs_read`.

`Emulator` starts `gcp-storage-emulator` (PyPI; the `test` extra) on 127.0.0.1 at a free
port, in memory, and points the clients at it the documented way: tensorstore through
TENSORSTORE_GCS_HTTP_URL (its `gcs` kvstore spec has no endpoint field), Google's Python
clients through STORAGE_EMULATOR_HOST; GOOGLE_AUTH_TOKEN_FOR_TESTING stands in for
credentials. `upload` copies a local folder into a bucket, object by object.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from typing import Dict, Iterator, List, NamedTuple, Optional

ENDPOINT_ENV = ("TENSORSTORE_GCS_HTTP_URL", "STORAGE_EMULATOR_HOST")
TOKEN_ENV = "GOOGLE_AUTH_TOKEN_FOR_TESTING"


class Request(NamedTuple):
  """One request the emulator served."""
  method: str  # 'GET', 'POST', ...
  path: str  # the URL path ('/download/storage/v1/b/BUCKET/o/KEY')
  query: str  # the query string ('alt=media&...'; alt=json: the object's metadata)
  range: Optional[str]  # the Range header ('bytes=0-99'), None for a whole object
  bytes: int  # the response body's length
  seconds: float  # the time the emulator took to answer it (its handler, under its lock)
  waited: float  # the time it waited for the lock (other requests being answered)


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _serving_thread():
  """The emulator's server thread, serving each connection on a thread of its own from a
  listen backlog of 128. The emulator's own serves one connection at a time from a backlog of
  5: tensorstore's concurrent connections then wait for one another, and connections past the
  backlog for a SYN retry (about 1 s each), which no real GCS endpoint does. Requests are still
  handled one at a time (letting downloads run side by side showed no clear gain on 2 cores: the
  handler is Python, and its threads share one interpreter lock). Each request served is recorded
  (`Emulator.requests`)."""
  from functools import partial  # pylint: disable=import-outside-toplevel
  from http import server as http_server  # pylint: disable=import-outside-toplevel
  from gcp_storage_emulator import server as emulator_server  # pylint: disable=import-outside-toplevel

  class Threaded(http_server.ThreadingHTTPServer):
    request_queue_size = 128
    daemon_threads = True

  lock = threading.Lock()  # its in-memory store is not safe for concurrent requests

  class Handler(emulator_server.RequestHandler):
    def send_header(self, keyword, value):
      if keyword.lower() == "content-length":
        self._sent = int(value)  # pylint: disable=attribute-defined-outside-init
      super().send_header(keyword, value)

  for method in ("do_GET", "do_POST", "do_PUT", "do_PATCH", "do_DELETE", "do_HEAD"):
    if hasattr(emulator_server.RequestHandler, method):
      def locked(self, _name=method):
        arrived = time.perf_counter()
        with lock:
          start = time.perf_counter()
          getattr(emulator_server.RequestHandler, _name)(self)
          seconds = time.perf_counter() - start
        if self.server.requests is not None:
          self.server.requests.append(Request(
              self.command, *self.path.partition("?")[::2], self.headers.get("range"),
              getattr(self, "_sent", 0), seconds, start - arrived))
      setattr(Handler, method, locked)

  class Thread(emulator_server.APIThread):
    def run(self):
      self._httpd = Threaded((self._host, self._port), partial(Handler, self._storage))
      self._httpd.requests = self.requests
      self.is_running.set()
      self._httpd.serve_forever()
  return Thread


def _send_generations() -> None:
  """Makes the emulator's object downloads carry `x-goog-generation`, as GCS's do (the emulator
  leaves it out): tensorstore's OCDBT driver reads an object's generation to check that the
  database did not change under it, and fails with 'Malformed StorageGeneration' without it."""
  from gcp_storage_emulator import server as emulator_server  # pylint: disable=import-outside-toplevel
  from gcp_storage_emulator.handlers import objects  # pylint: disable=import-outside-toplevel

  original = objects.download
  if getattr(original, "adds_generation", False):
    return

  def download(request, response, storage, *args, **kwargs):
    original(request, response, storage, *args, **kwargs)
    try:
      obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except Exception:  # pylint: disable=broad-except  (a missing object: already a 404)
      return
    response["x-goog-generation"] = obj["generation"]
    response["x-goog-metageneration"] = obj.get("metageneration", "1")
  download.adds_generation = True
  objects.download = download  # `get` with alt=media calls it by this name
  for _, handlers in emulator_server.HANDLERS:
    if handlers.get("GET") is original:
      handlers["GET"] = download


class Emulator:
  """gcp-storage-emulator in this process (a thread), in memory, on 127.0.0.1.

  `start()` sets the endpoint variables of this process (and so of its subprocesses),
  `stop()` stops the server (a later request fails to connect) and `restore()` puts the
  variables back.
  """

  def __init__(self, buckets=("specjax-test",)):
    from gcp_storage_emulator.server import create_server  # pylint: disable=import-outside-toplevel
    _send_generations()
    logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)  # "not found" is an answer
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self._server = create_server("127.0.0.1", self.port, in_memory=True,
                                 default_bucket=buckets[0])
    self._server._api = _serving_thread()("127.0.0.1", self.port,  # pylint: disable=protected-access
                                          self._server._storage)  # pylint: disable=protected-access
    self.requests: List[Request] = []  # every request served, in order (`del requests[:]` clears it)
    self._server._api.requests = self.requests  # pylint: disable=protected-access
    self._extra = buckets[1:]
    self._saved: Dict[str, Optional[str]] = {}
    self.running = False

  def start(self) -> "Emulator":
    """Serves, and points this process's clients at the server."""
    self._server.start()
    self.running = True
    for name in (*ENDPOINT_ENV, TOKEN_ENV):
      self._saved[name] = os.environ.get(name)
    os.environ[ENDPOINT_ENV[0]] = self.url
    os.environ[ENDPOINT_ENV[1]] = self.url
    os.environ[TOKEN_ENV] = "emulator"
    for bucket in self._extra:
      self.create_bucket(bucket)
    return self

  def create_bucket(self, name: str) -> None:
    """A new empty bucket."""
    from gcp_storage_emulator.handlers.buckets import create_bucket  # pylint: disable=import-outside-toplevel
    create_bucket(name, self._server._storage)  # pylint: disable=protected-access

  def stop(self) -> None:
    """Stops serving (requests then fail to connect)."""
    if self.running:
      self._server.stop()
      self.running = False

  def restore(self) -> None:
    """Stops, and puts the endpoint variables back as they were."""
    self.stop()
    for name, value in self._saved.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value


@contextlib.contextmanager
def emulator(buckets=("specjax-test",)) -> Iterator[Emulator]:
  """An `Emulator`, started for the block and stopped after."""
  server = Emulator(buckets).start()
  try:
    yield server
  finally:
    server.restore()


def upload(folder: str, url: str) -> int:
  """Copies every file below the local `folder` to the objects below `url`; returns the bytes
  copied."""
  from specjax import remote  # pylint: disable=import-outside-toplevel
  total, objects = 0, {}
  for dirpath, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(dirpath, name)
      rel = os.path.relpath(path, folder).replace(os.sep, "/")
      with open(path, "rb") as f:
        objects[remote.join(url, rel)] = f.read()
      total += len(objects[remote.join(url, rel)])
  remote.write_objects(objects)
  return total
