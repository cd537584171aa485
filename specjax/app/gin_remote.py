"""gin files at gs:// paths: `--gin_file`, `--gin_search_paths` and the includes they hold, read
in place (`specjax.remote`); local paths keep the file system's answers.

The helpers answer `specjax.app.gin_config`'s and `specjax.app.gin_files`' questions about a
path (gin itself reads every run file through `gin_files.GinFiles`, gs:// objects included).
"""
from __future__ import annotations

import os

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
