"""A feature head's token ranking (token_ranking.npy beside its model.gin): every token id,
most frequent first in the head's training data; a `FeatureDrafter` with `vocab_limit` K
drafts over its first K.

The file is an .npy array, read through `specjax.files` (a regular file inside the head's
folder, at most the size a ranking of the head's vocabulary takes, parsed from its header
before any array is made: a header that claims 10^11 entries is refused, not allocated) and
written through it (a fresh temporary renamed into place, never through a planted link).
Every error names the file.
"""
from __future__ import annotations

import io
import os
from typing import Any, Optional

import numpy as np

from specjax import files

RANKING_FILE = "token_ranking.npy"

HEADER_BYTES = 4096
"""Room left for the .npy header beside the ids (numpy writes 128 bytes)."""


def ranking_path(folder: Any) -> str:
  """folder/token_ranking.npy, where `folder` is a head's folder or one checkpoint_N in it."""
  folder = os.fspath(folder).rstrip("/") or "/"
  if os.path.basename(folder).startswith("checkpoint_"):
    folder = os.path.dirname(folder)
  return os.path.join(folder, RANKING_FILE)


def _check_inside(path: str) -> None:
  """ValueError when `path` is a link that leads out of its own folder."""
  if not os.path.islink(path):
    return
  folder = os.path.realpath(os.path.dirname(path))
  if os.path.commonpath([folder, os.path.realpath(path)]) != folder:
    raise ValueError(f"the token ranking {path} is a link to {os.path.realpath(path)}, outside "
                     "the head's folder; refusing to read it")


def load_token_ranking(folder: Any, vocab_size: int) -> Optional[np.ndarray]:
  """The token ranking (int32 [vocab_size]) beside a head's model.gin, or None when the folder
  has none.

  Args:
    folder: the head's folder or one checkpoint_N in it.
    vocab_size: the head's vocabulary V; the ranking must list each of 0..V-1 once.
  Raises:
    ValueError naming the file: not a regular file (a FIFO, a device, a folder), a link out of
    the folder, larger than a ranking of V ids, not an .npy array, or not a permutation of
    0..V-1 (the wrong length included).
  """
  path = ranking_path(folder)
  if files.is_remote(path):  # an object has no links to follow
    from specjax import remote  # pylint: disable=import-outside-toplevel
    if not remote.exists(path):
      return None
  elif not os.path.lexists(path):
    return None
  else:
    _check_inside(path)
  data = files.read_bytes(path, HEADER_BYTES + 8 * int(vocab_size), "the token ranking")
  ranking = _parse_npy(data, path)
  if ranking.shape != (vocab_size,) or not np.issubdtype(ranking.dtype, np.integer):
    raise ValueError(f"the token ranking {path} must list the head's {vocab_size} token ids, "
                     f"got shape {ranking.shape}, dtype {ranking.dtype}")
  ranking = ranking.astype(np.int64)
  if not np.array_equal(np.sort(ranking), np.arange(vocab_size)):
    raise ValueError(f"the token ranking {path} must be a permutation of the token ids "
                     f"0..{vocab_size - 1}")
  return ranking.astype(np.int32)


def _parse_npy(data: bytes, path: str) -> np.ndarray:
  """The array in .npy bytes, its header checked against the bytes there before any array
  is made; ValueError naming `path` otherwise."""
  stream = io.BytesIO(data)
  try:
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
      shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
    else:
      shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
  except (ValueError, SyntaxError, TypeError) as e:
    raise ValueError(f"the token ranking {path} is not an .npy array: {e}") from None
  if dtype.hasobject or len(shape) != 1 or fortran:
    raise ValueError(f"the token ranking {path} must be a 1-D integer .npy array, got shape "
                     f"{shape}, dtype {dtype}")
  body = data[stream.tell():]
  if len(body) != shape[0] * dtype.itemsize:
    raise ValueError(f"the token ranking {path} claims {shape[0]} entries but holds "
                     f"{len(body)} bytes of data")
  return np.frombuffer(body, dtype=dtype)


def write_token_ranking(folder: str, ranking: np.ndarray) -> None:
  """Writes `ranking` (int32 [V]) as folder/token_ranking.npy through `files.write_file`."""
  stream = io.BytesIO()
  np.lib.format.write_array(stream, np.asarray(ranking, np.int32), allow_pickle=False)
  files.write_file(os.path.join(folder, RANKING_FILE), stream.getvalue())

