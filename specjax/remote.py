"""gs:// objects read and written in place, through tensorstore's `gcs` kvstore.

The same client reads a checkpoint's arrays (tensorstore's zarr driver over the `gcs`
kvstore, the spec T5X writes) and every small object (a `checkpoint` msgpack, Orbax
`_METADATA`, a gin file, a SentencePiece model, an input file) and writes outputs, so one
set of credentials, retries and endpoint settings covers them all and nothing beyond
tensorstore is needed. tensorstore finds credentials as Google's libraries do
(GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth application-default login`, a VM's metadata
server; a public bucket reads without any) and its endpoint in TENSORSTORE_GCS_HTTP_URL
(an emulator, e.g. `http://127.0.0.1:9023`).

Every request is bounded: SPECJAX_GCS_RETRIES retries (default 4, with backoff) of a failed
request, and SPECJAX_GCS_TIMEOUT seconds (default 120) without progress end a request (a
stalled server is then a timeout naming the object, never a hang). Failures are one line
naming the object: OSError for a missing object (FileNotFoundError) or a timeout
(TimeoutError), ValueError for a refused request (no credentials, no permission) or a
server that cannot be reached.

An object appears only once its upload is complete (GCS commits an upload whole), so an
output written here is its old content or the whole new one, as `specjax.files`'s local
renames give.
"""
from __future__ import annotations

import contextlib
import math
import os
import posixpath
import re
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Set, Tuple

SCHEME = "gs://"
TIMEOUT_ENV = "SPECJAX_GCS_TIMEOUT"
RETRIES_ENV = "SPECJAX_GCS_RETRIES"
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_RETRIES = 4
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,221}[a-z0-9]")
_CURL_ENV = ("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES")


def is_remote(path: Any) -> bool:
  """Whether `path` is a gs:// URL (a str or PathLike)."""
  try:
    path = os.fspath(path)
  except TypeError:
    return False
  return isinstance(path, str) and path.startswith(SCHEME)


def split(url: str, what: str = "the path") -> Tuple[str, str]:
  """'gs://bucket/a/b' -> ('bucket', 'a/b'); ValueError naming `url` if it is not one."""
  rest = url[len(SCHEME):]
  bucket, _, key = rest.partition("/")
  if not _BUCKET.fullmatch(bucket) or "\x00" in key or any(
      part in (".", "..") for part in key.split("/")):
    raise ValueError(f"{what} {url} is not a gs://BUCKET/OBJECT path (bucket names are 3-222 "
                     "lowercase letters, digits, '.', '_' or '-'; no '.' or '..' parts)")
  return bucket, key.lstrip("/")


def join(url: str, *parts: str) -> str:
  """posixpath.join for URLs ('gs://b/a', 'c' -> 'gs://b/a/c')."""
  return posixpath.join(url.rstrip("/") if url != SCHEME else url, *parts)


def dirname(url: str) -> str:
  """The URL of the folder that holds `url` ('gs://b/a/c' -> 'gs://b/a')."""
  bucket, key = split(url)
  return f"{SCHEME}{bucket}/{posixpath.dirname(key.rstrip('/'))}".rstrip("/")


def timeout_s() -> float:
  """SPECJAX_GCS_TIMEOUT: the seconds a request may go without progress (default 120)."""
  return _positive(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, float)


def retries() -> int:
  """SPECJAX_GCS_RETRIES: how often a failed request is retried (default 4)."""
  return int(_positive(RETRIES_ENV, DEFAULT_RETRIES, int, zero=True))


def _positive(name: str, default, kind, zero: bool = False):
  raw = os.environ.get(name, "").strip()
  if not raw:
    return default
  try:
    value = kind(raw)
  except ValueError:
    value = -1
  if value < 0 or (value == 0 and not zero):
    raise ValueError(f"{name}={raw!r} must be a {'non-negative' if zero else 'positive'} "
                     "number")
  return value


def context() -> Dict[str, Any]:
  """The tensorstore context of every gs:// request: bounded retries with backoff (its
  max_retries counts attempts)."""
  _configure_transport()
  return {"gcs_request_retries": {"max_retries": retries() + 1, "initial_delay": "0.2s",
                                  "max_delay": "5s"}}


def _configure_transport() -> None:
  """A transfer slower than 1 byte/s for timeout_s() is ended (and retried) by tensorstore's
  HTTP transport; its settings are read when it starts, so they are set before the first
  request (a value the user set is kept)."""
  os.environ.setdefault(_CURL_ENV[0], str(max(1, int(round(timeout_s())))))
  os.environ.setdefault(_CURL_ENV[1], "1")


def kvstore(url: str, what: str = "the path") -> Dict[str, Any]:
  """The tensorstore kvstore spec of the folder `url` (its objects are keys below it)."""
  bucket, key = split(url, what)
  return {"driver": "gcs", "bucket": bucket, "path": key.strip("/") + "/" if key else ""}


def _ts():
  import tensorstore as ts  # pylint: disable=import-outside-toplevel
  return ts


_STORES: Dict[str, Any] = {}


def _bucket_store(bucket: str):
  """The opened kvstore of a bucket's root (one per bucket and endpoint)."""
  key = f"{os.environ.get('TENSORSTORE_GCS_HTTP_URL', '')} {bucket} {retries()}"
  if key not in _STORES:
    ts = _ts()
    spec = {"driver": "gcs", "bucket": bucket, "context": context()}
    _STORES[key] = wait(ts.KvStore.open(spec), f"{SCHEME}{bucket}", "open the bucket")
  return _STORES[key]


def wait(future: Any, url: str, action: str, seconds: Optional[float] = None) -> Any:
  """`future.result()` within a deadline; failures as one line naming `url`.

  Args:
    future: a tensorstore Future.
    url: the object or folder the request is about, for the message.
    action: what it does ('read', 'write', 'list', 'open the array of ...').
    seconds: the deadline (default: timeout_s() for each try of the request; math.inf: none,
      for a large array, whose transfer the transport ends once it stalls).
  """
  limit = seconds if seconds is not None else timeout_s() * (retries() + 2)
  try:
    return future.result(timeout=None if math.isinf(limit) else limit)
  except TimeoutError:
    raise TimeoutError(f"cannot {action} {url}: no answer from the storage server within "
                       f"{limit:g} s (a stalled server; {TIMEOUT_ENV} sets the seconds a "
                       "request may go without progress)") from None
  except Exception as e:  # tensorstore reports every failure as ValueError and friends
    raise error(e, url, action) from e


def error(e: Exception, url: str, action: str) -> Exception:
  """A tensorstore failure of a gs:// request as one line naming `url`."""
  text = " ".join(str(e).split())
  if any(s in text for s in ("PERMISSION_DENIED", "UNAUTHENTICATED", "HTTP response code: 401",
                             "HTTP response code: 403")):
    return ValueError(f"cannot {action} {url}: the request was refused (no credentials, or "
                      "none that may read it: run `gcloud auth application-default login` or "
                      f"set GOOGLE_APPLICATION_CREDENTIALS): {text}")
  if "retry attempts failed" in text or "CURL error" in text:
    return ValueError(f"cannot {action} {url}: the storage server cannot be reached "
                      f"(after {retries()} retries): {text}")
  if "NOT_FOUND" in text:
    return FileNotFoundError(f"cannot {action} {url}: it does not exist (no such object, "
                             f"or no bucket {split(url)[0]!r}): {text}")
  return ValueError(f"cannot {action} {url}: {text}")


class _Cache:
  """What one `cached()` block has listed and read."""

  def __init__(self):
    self.listings: Dict[str, Set[str]] = {}  # folder URL -> its relative keys
    self.objects: Dict[str, bytes] = {}  # object URL -> its bytes


_cache: Optional[_Cache] = None


@contextlib.contextmanager
def cached() -> Iterator[None]:
  """Within the block, a folder listed once answers every listing below it, and objects read
  by `prefetch` are not read again (one checkpoint read as one: its objects are written once)."""
  global _cache  # pylint: disable=global-statement
  outer, _cache = _cache, _cache or _Cache()
  try:
    yield
  finally:
    _cache = outer


def prefetch(urls: Iterable[str], limit: int, what: str) -> None:
  """Reads the objects `urls` whole, concurrently, into the `cached()` block's store, so
  `read_bytes` finds those of at most `limit` bytes; no-op outside one. For objects that a
  reader fetches whole anyway (tensorstore reads an array's .zarray whole when it opens it)."""
  if _cache is None:
    return
  pending = [(u, _bucket_store(split(u, what)[0]).read(split(u)[1]))
             for u in urls if u not in _cache.objects]
  for url, future in pending:
    result = wait(future, url, f"read {what}")
    if result.state == "value" and len(result.value) <= limit:
      _cache.objects[url] = bytes(result.value)


def read_bytes(url: str, limit: int, what: str) -> bytes:
  """The bytes of the object `url`, at most `limit` of them (only limit + 1 are fetched).

  Raises:
    FileNotFoundError: no such object (or bucket); the message names `what` and `url`.
    ValueError: larger than `limit`, or a refused or failed request.
    TimeoutError: a stalled server.
  """
  bucket, key = split(url, what)
  if not key or key.endswith("/"):
    raise ValueError(f"{what} {url} names a bucket or folder, not an object")
  if _cache is not None and url in _cache.objects and len(_cache.objects[url]) <= limit:
    return _cache.objects[url]
  store = _bucket_store(bucket)
  try:  # the first limit + 1 bytes: there are that many only in an object that is too large
    head = wait(store.read(key, byte_range=slice(0, limit + 1)), url, f"read {what}")
  except ValueError as e:  # OUT_OF_RANGE: smaller than the range; read whole below
    if "OUT_OF_RANGE" not in str(e):
      raise
    head = None
  if head is not None and head.state == "value":
    raise ValueError(f"{what} {url} is more than the {_size(limit)} accepted")
  result = head if head is not None else wait(store.read(key), url, f"read {what}")
  if result.state == "missing":
    if is_folder(url):
      raise ValueError(f"{what} {url} is a folder, not an object to read")
    raise FileNotFoundError(f"{what} {url} does not exist (no such object, or no bucket "
                            f"{bucket!r})")
  if len(result.value) > limit:  # it grew in between
    raise ValueError(f"{what} {url} is more than the {_size(limit)} accepted")
  return bytes(result.value)


def exists(url: str) -> bool:
  """Whether the object `url` exists (a folder prefix does not count); within a `cached()`
  block, from a listing of a folder above it where one was made."""
  bucket, key = split(url)
  if not key:
    return False
  if _cache is not None:
    for folder, keys in _cache.listings.items():
      if url.startswith(folder + "/"):
        return url[len(folder) + 1:] in keys
  result = wait(_bucket_store(bucket).read(key, byte_range=slice(0, 0)), url, "look up")
  return result.state != "missing"


def list_folder(url: str, what: str = "the folder") -> Set[str]:
  """The keys of every object below the folder `url`, relative to it ('a/b', '/'-separated)."""
  bucket, key = split(url, what)
  url = url.rstrip("/")
  if _cache is not None:
    for folder, keys in _cache.listings.items():
      if url == folder or url.startswith(folder + "/"):
        below = url[len(folder) + 1:] + "/" if url != folder else ""
        return {k[len(below):] for k in keys if k.startswith(below) and len(k) > len(below)}
  prefix = key.strip("/") + "/" if key.strip("/") else ""
  ts = _ts()
  keys = wait(_bucket_store(bucket).list(
      ts.KvStore.KeyRange(inclusive_min=prefix, exclusive_max=_after(prefix)) if prefix else None),
      url, f"list {what}")
  names = (k.decode("utf-8", errors="replace") for k in keys)
  found = {k[len(prefix):] for k in names if k.startswith(prefix) and len(k) > len(prefix)}
  if _cache is not None:
    _cache.listings[url] = found
  return found


def _after(prefix: str) -> str:
  """The first key past every key that starts with `prefix` (which ends in '/')."""
  return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def is_folder(url: str) -> bool:
  """Whether any object lies below `url` (GCS folders are key prefixes)."""
  try:
    return bool(list_folder(url))
  except FileNotFoundError:
    return False


def children(url: str) -> Set[str]:
  """The names directly below the folder `url` (objects and sub-folders alike)."""
  return {k.split("/", 1)[0] for k in list_folder(url)}


def write_objects(outputs: Mapping[str, bytes], what: str = "the output") -> None:
  """Uploads {url: bytes}, each object whole: it appears only once its upload is complete, so a
  failure leaves it as it was (objects written before the failure stay written)."""
  for url, payload in outputs.items():
    bucket, key = split(url, what)
    if not key or key.endswith("/"):
      raise ValueError(f"{what} {url} names a bucket or folder, not an object to write")
    wait(_bucket_store(bucket).write(key, bytes(payload)), url, f"write {what}")


def delete(url: str, what: str = "the object") -> None:
  """Removes the object `url` (nothing if it is not there)."""
  bucket, key = split(url, what)
  wait(_bucket_store(bucket).write(key, None), url, f"delete {what}")  # None: delete


def check_destination(url: str, what: str) -> None:
  """ValueError if `url` cannot be written as an object (a folder prefix, a bad name)."""
  bucket, key = split(url, what)
  if not key or key.endswith("/") or is_folder(url):
    raise ValueError(f"{what} {url} is a folder, not a file to write")
  del bucket


def _size(n: int) -> str:
  mib = 2**20
  return f"{n // mib} MiB" if n >= mib and n % mib == 0 else f"{n} bytes"
