"""Files that may be hostile, read safely; outputs written so they are never torn.

A path may name a FIFO (opening it for reading waits forever), a device such as
/dev/zero (endless), or a file far larger than the reader means to hold. `read_bytes`
opens without blocking, checks that what it opened is a regular file, and refuses one
larger than `limit` before reading it; the messages name the file and the limit.

`write_atomic` writes each output under a temporary name in its own folder and renames
it into place, so a destination is its old content or the whole new one (never torn by a
full disk or a file size limit), and a symlink planted under its name is replaced, not
followed. `check_destination` refuses such a name (a link, a folder) before the work that
produces the output.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from typing import Mapping, Optional

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


def check_destination(path: str, what: str) -> None:
  """ValueError naming `path` if an output cannot replace it: a symlink or a folder."""
  if os.path.islink(path):
    raise ValueError(f"{what} {path} is a symlink; refusing to write through it (remove it)")
  if os.path.isdir(path):
    raise ValueError(f"{what} {path} is a folder, not a file to write")


def write_atomic(outputs: Mapping[str, bytes]) -> None:
  """Writes {path: bytes}: every file under a temporary name first, then each renamed into
  place, so a failure leaves every destination as it was.

  Raises:
    OSError: naming the destination that could not be written (its temporary is removed).
  """
  done = {}
  try:
    for path, payload in outputs.items():
      folder = os.path.dirname(os.path.abspath(path))
      fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                 dir=folder)
      done[path] = tmp
      try:
        with os.fdopen(fd, "wb") as f:
          f.write(payload)
          f.flush()
          os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide an ordinary output
      except OSError as e:
        raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from e
    for path, tmp in done.items():
      os.replace(tmp, path)
  finally:
    for tmp in done.values():
      with contextlib.suppress(OSError):
        os.unlink(tmp)  # a temporary not renamed into place


def _size(n: int) -> str:
  return f"{n // MIB} MiB" if n >= MIB and n % MIB == 0 else f"{n} bytes"
