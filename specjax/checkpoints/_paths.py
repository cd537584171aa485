"""The paths of a checkpoint being read: a local folder or a gs:// one, asked the same way.

A local path keeps every check of `specjax.checkpoints._io` (symlinks resolved inside the
checkpoint folder, regular files only, chunk files large enough for their compressor). A
gs:// folder is a key prefix of a bucket, read in place through tensorstore's `gcs` kvstore
(`specjax.remote`): it has no symlinks or special files to refuse, and its objects are
listed rather than scanned; object sizes are not listed, so a truncated chunk is found when
it is decoded (an error naming the parameter), not before.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import os
from typing import Any, Dict, Iterable, Iterator, Optional, Set

from specjax.files import is_remote

__all__ = ["is_remote", "absolute", "dirname", "is_file", "is_dir", "list_files", "kvstore",
           "context", "ocdbt_kvstore", "one_context", "open_context"]


def _remote():
  from specjax import remote  # pylint: disable=import-outside-toplevel
  return remote


def absolute(path: str) -> str:
  """os.path.abspath of a local path; a gs:// URL without its trailing '/'."""
  return path.rstrip("/") if is_remote(path) else os.path.abspath(path)


def dirname(path: str) -> str:
  """The folder that holds `path` (an absolute local path or a gs:// URL)."""
  return _remote().dirname(path) if is_remote(path) else os.path.dirname(path)


def is_file(path: str) -> bool:
  """os.path.isfile, or whether the gs:// object exists."""
  return _remote().exists(path) if is_remote(path) else os.path.isfile(path)


def is_dir(path: str) -> bool:
  """os.path.isdir, or whether any gs:// object lies below the prefix."""
  return _remote().is_folder(path) if is_remote(path) else os.path.isdir(path)


def list_files(folder: str, what: str) -> Set[str]:
  """The relative keys of the gs:// objects below `folder` ('a/b')."""
  return _remote().list_folder(folder, what)


def kvstore(folder: str) -> Dict[str, Any]:
  """The tensorstore kvstore spec of a folder: `file`, or `gcs` for a gs:// URL."""
  if is_remote(folder):
    return _remote().kvstore(folder)
  return {"driver": "file", "path": folder + "/"}


def ocdbt_kvstore(item_dir: str, path: str = "") -> Dict[str, Any]:
  """The tensorstore kvstore spec of the key prefix `path` ('' or 'a.b/') of the OCDBT
  database in `item_dir`.

  Its manifest and b-tree nodes are kept in their own cache pool (OCDBT_CACHE_BYTES, see
  `context`), so the arrays opened in one context read them once, while the arrays' chunks
  stay uncached. In a gs:// database the byte ranges one read asks of a data file are merged
  into fewer requests (tensorstore's read coalescing: gaps of at most COALESCE_GAP_BYTES,
  requests of at most COALESCE_MAX_BYTES, ranges asked within COALESCE_INTERVAL), since a
  request costs a round trip there; on local disk a range costs no more than its bytes.
  """
  spec: Dict[str, Any] = {"driver": "ocdbt", "base": kvstore(item_dir),
                          "cache_pool": OCDBT_CACHE_POOL}
  if path:
    spec["path"] = path
  if is_remote(item_dir):
    spec.update(experimental_read_coalescing_threshold_bytes=COALESCE_GAP_BYTES,
                experimental_read_coalescing_merged_bytes=COALESCE_MAX_BYTES,
                experimental_read_coalescing_interval=COALESCE_INTERVAL)
  return spec


OCDBT_CACHE_POOL = "cache_pool#ocdbt"
OCDBT_CACHE_BYTES = 64 * 2**20
"""The bytes of OCDBT manifests and b-tree nodes one checkpoint read keeps (a T5-XXL
database's nodes take a few MiB)."""
COALESCE_GAP_BYTES = 2**20
COALESCE_MAX_BYTES = 64 * 2**20
COALESCE_INTERVAL = "1ms"


def context(specs: Iterable[Any]) -> Dict[str, Any]:
  """The tensorstore context for opening `specs` (tensorstore specs or paths): bounded gs://
  retries where any is remote, and the OCDBT cache pool of `ocdbt_kvstore`."""
  def remote(spec):
    return is_remote(spec) if isinstance(spec, str) else '"gcs"' in json.dumps(spec)
  out = _remote().context() if any(remote(s) for s in specs) else {}
  return dict(out, **{OCDBT_CACHE_POOL: {"total_bytes_limit": OCDBT_CACHE_BYTES}})


_shared: contextvars.ContextVar[Optional[Dict[str, Any]]] = contextvars.ContextVar(
    "specjax_checkpoint_context", default=None)


@contextlib.contextmanager
def one_context() -> Iterator[None]:
  """Within the block, `open_context` gives one tensorstore context (per kind: local or
  gs://), so every open of one checkpoint read shares its caches: an OCDBT database's
  manifest and b-tree nodes are read once, not once per array. For a checkpoint that does not
  change while the block runs (`specjax.checkpoints.t5x.snapshot`)."""
  token = _shared.set({} if _shared.get() is None else _shared.get())
  try:
    yield
  finally:
    _shared.reset(token)


def open_context(specs: Iterable[Any]) -> Any:
  """The `tensorstore.Context` for opening `specs`: the `one_context` block's, else a new one
  (`context(specs)`)."""
  import tensorstore as ts  # pylint: disable=import-outside-toplevel
  specs = list(specs)
  resources = context(specs)
  shared = _shared.get()
  if shared is None:
    return ts.Context(resources)
  key = json.dumps(resources, sort_keys=True)
  if key not in shared:
    shared[key] = ts.Context(resources)
  return shared[key]


def prefetch_metadata(folder: str, where: str, names: Iterable[str] = ()) -> None:
  """Lists the gs:// checkpoint `folder` once and reads every array's `.zarray` in it, and
  the objects `names` below it that are there ('_METADATA'), concurrently (within
  `specjax.remote.cached()`, so the checks that follow find them, and whether an object
  exists is answered from the listing)."""
  remote = _remote()
  keys = remote.list_folder(folder, "the checkpoint folder")
  remote.prefetch([remote.join(folder, k) for k in sorted(keys)
                   if k.endswith("/.zarray") or k in set(names)],
                  METADATA_BYTES, f"{where}: the metadata")


METADATA_BYTES = 256 * 2**20
"""Largest JSON metadata file read (.zarray, Orbax _METADATA)."""
