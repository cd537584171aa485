"""The paths of a checkpoint being read: a local folder or a gs:// one, asked the same way.

A local path keeps every check of `specjax.checkpoints._io` (symlinks resolved inside the
checkpoint folder, regular files only, chunk files large enough for their compressor). A
gs:// folder is a key prefix of a bucket, read in place through tensorstore's `gcs` kvstore
(`specjax.remote`): it has no symlinks or special files to refuse, and its objects are
listed rather than scanned; object sizes are not listed, so a truncated chunk is found when
it is decoded (an error naming the parameter), not before.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, Set

from specjax.files import is_remote

__all__ = ["is_remote", "absolute", "dirname", "is_file", "is_dir", "list_files", "kvstore",
           "context"]


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


def context(specs: Iterable[Any]) -> Dict[str, Any]:
  """The tensorstore context for opening `specs` (tensorstore specs or paths): bounded gs://
  retries where any is remote, else tensorstore's defaults."""
  def remote(spec):
    return is_remote(spec) if isinstance(spec, str) else '"gcs"' in json.dumps(spec)
  return _remote().context() if any(remote(s) for s in specs) else {}


def prefetch_metadata(folder: str, where: str) -> None:
  """Lists the gs:// checkpoint `folder` once and reads every array's `.zarray` in it
  concurrently (within `specjax.remote.cached()`, so the checks that follow find them)."""
  remote = _remote()
  keys = remote.list_folder(folder, "the checkpoint folder")
  remote.prefetch([remote.join(folder, k) for k in sorted(keys) if k.endswith("/.zarray")],
                  METADATA_BYTES, f"{where}: the .zarray file")


METADATA_BYTES = 256 * 2**20
"""Largest JSON metadata file read (.zarray, Orbax _METADATA)."""
