"""gin files at gs:// paths: `--gin_file`, `--gin_search_paths` and the includes they hold, read
in place (`specjax.remote`); local paths keep the file system's answers.

`register()` adds a file reader to gin for gs:// objects (gin tries its readers in turn, and
finds an include on every search path through them), so a run file in a bucket is parsed by gin
as a local one is; the helpers answer `specjax.app.gin_config`'s questions about a path.
"""
from __future__ import annotations

import contextlib
import io
import os

import gin

from specjax import files
from specjax.models.model_gin import MODEL_GIN_BYTES

GIN_FILE_BYTES = MODEL_GIN_BYTES
"""Largest gin file read from gs://."""


def exists(path: str) -> bool:
  """os.path.exists, or whether the gs:// object exists."""
  if files.is_remote(path):
    from specjax import remote  # pylint: disable=import-outside-toplevel
    return remote.exists(path)
  return os.path.exists(path)


def is_file(path: str) -> bool:
  """os.path.isfile, or whether the gs:// object exists."""
  return exists(path) if files.is_remote(path) else os.path.isfile(path)


def real(path: str) -> str:
  """os.path.realpath; a gs:// URL as it is."""
  return path if files.is_remote(path) else os.path.realpath(path)


def read_text(path: str) -> str:
  """The text of a gin file (a gs:// object of at most GIN_FILE_BYTES, or a local file)."""
  if files.is_remote(path):
    return files.read_text(path, GIN_FILE_BYTES, "the gin file")
  with open(path, encoding="utf-8") as f:
    return f.read()


@contextlib.contextmanager
def _open(path: str):
  yield io.StringIO(read_text(path))


def _readable(path: str) -> bool:
  return files.is_remote(path) and exists(path)


def register() -> None:
  """Lets gin parse gs:// gin files and find includes on gs:// search paths (once)."""
  gin.config.register_file_reader(_open, _readable)
