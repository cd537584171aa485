"""Reading files that may be hostile: regular files only, never more than a stated size.

A path may name a FIFO (opening it for reading waits forever), a device such as
/dev/zero (endless), or a file far larger than the reader means to hold. `read_bytes`
opens without blocking, checks that what it opened is a regular file, and refuses one
larger than `limit` before reading it; the messages name the file and the limit.
"""
from __future__ import annotations

import hashlib
import os
import stat
from typing import Optional

MIB = 2**20


def _kind(mode: int) -> str:
  for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                     (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                     (stat.S_ISSOCK, "a socket")):
    if test(mode):
      return name
  return "not a regular file"


def check_regular(path: str, what: str) -> os.stat_result:
  """os.stat(path) (symlinks followed); ValueError unless it is a regular file."""
  st = os.stat(path)
  if not stat.S_ISREG(st.st_mode):
    raise ValueError(f"{what} {path} is {_kind(st.st_mode)}, not a regular file; refusing to "
                     "read it")
  return st


def read_bytes(path: str, limit: int, what: str) -> bytes:
  """The bytes of the regular file `path`, at most `limit` of them.

  Args:
    path: the file (symlinks are followed; the caller checks where they lead).
    limit: the largest size accepted, in bytes.
    what: how messages name the file ("the gin file", "the input file", ...).
  Raises:
    ValueError: `path` is a FIFO, device, socket or folder, or larger than `limit`.
    OSError: it cannot be opened (missing, no permission); the message names it.
  """
  fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of waiting
  with os.fdopen(fd, "rb") as f:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
      raise ValueError(f"{what} {path} is {_kind(st.st_mode)}, not a regular file; refusing "
                       "to read it")
    if st.st_size > limit:
      raise ValueError(f"{what} {path} is {st.st_size} bytes, more than the {_size(limit)} "
                       "accepted")
    data = f.read(st.st_size + 1)  # one byte more tells a file that grew meanwhile
  if len(data) > limit:  # it grew while it was read
    raise ValueError(f"{what} {path} is more than the {_size(limit)} accepted")
  return data


def read_text(path: str, limit: int, what: str, encoding: Optional[str] = "utf-8") -> str:
  """`read_bytes` decoded; ValueError naming the file and the byte offset if it does not
  decode (the file's content is not echoed)."""
  data = read_bytes(path, limit, what)
  try:
    return data.decode(encoding)
  except UnicodeDecodeError as e:
    raise ValueError(f"{what} {path} is not {encoding} text (byte {e.start})") from None


def sha256(path: str) -> str:
  """The sha256 of a regular file's bytes (hex), read in 1 MiB blocks."""
  check_regular(path, "the file")
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(MIB), b""):
      digest.update(block)
  return digest.hexdigest()


def _size(n: int) -> str:
  return f"{n // MIB} MiB" if n >= MIB and n % MIB == 0 else f"{n} bytes"
