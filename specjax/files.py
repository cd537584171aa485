"""Files that may be hostile, read safely; outputs written so they are never torn.

A path may name a FIFO (opening it for reading waits forever), a device such as
/dev/zero (endless), or a file far larger than the reader means to hold. `read_bytes`
opens without blocking, checks that what it opened is a regular file, and refuses one
larger than `limit` before reading it; the messages name the file and the limit.

`write_atomic` (and `write_file`, `write_json` for one file) is how every side file the
project writes gets written: under a fresh temporary name in its own folder, created with
O_EXCL | O_NOFOLLOW (never through a link planted there, never onto a FIFO), fsynced, then
renamed into place, so a destination is its old content or the whole new one (never torn
by a full disk or a file size limit), and a symlink under the destination's name is
replaced, not followed. `check_destination` refuses such a name (a link, a folder) before
the work that produces the output.

A gs:// URL is read and written in place through `specjax.remote` (imported only then): an
object of at most `limit` bytes, an output uploaded whole (it appears only once complete).
Other remote URLs (s3://, http://, ...) are refused with one line.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import stat
from typing import Any, Mapping, Optional, Union

MIB = 2**20


def _kind(mode: int) -> str:
  for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                     (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                     (stat.S_ISSOCK, "a socket")):
    if test(mode):
      return name
  return "not a regular file"


_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_remote(path: Any) -> bool:
  """Whether `path` is a gs:// URL (read and written through `specjax.remote`)."""
  return isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith("gs://")


def _remote():
  from specjax import remote  # pylint: disable=import-outside-toplevel
  return remote


def check_local(path: Any, what: str) -> str:
  """`path` as a str; ValueError if it is a remote URL (gs://, s3://, http://, ...), which
  this code reads and writes only through the local file system."""
  path = os.fspath(path)
  if isinstance(path, str) and _REMOTE.match(path):
    raise ValueError(f"{what} {path} is a remote path; remote paths are not supported here "
                     "(copy it to a local or mounted folder first)")
  return path


def check_path(path: Any, what: str) -> str:
  """`path` as a str; ValueError if it is a remote URL other than gs:// (s3://, http://,
  ...): a gs:// URL or a local path is read in place."""
  path = os.fspath(path)
  if is_remote(path):
    _remote().split(path, what)
    return path
  if isinstance(path, str) and _REMOTE.match(path):
    raise ValueError(f"{what} {path} is a remote path that is not gs://; only gs:// URLs and "
                     "local paths are read (copy it to a local folder first)")
  return path


def check_regular(path: str, what: str) -> os.stat_result:
  """os.stat(path) (symlinks followed); ValueError unless it is a regular file."""
  st = os.stat(check_local(path, what))
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
  if is_remote(path):
    return _remote().read_bytes(os.fspath(path), limit, what)
  check_path(path, what)
  fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of waiting
  st = os.fstat(fd)
  if not stat.S_ISREG(st.st_mode):  # checked before fdopen, which names a folder by its fd
    os.close(fd)
    raise ValueError(f"{what} {path} is {_kind(st.st_mode)}, not a regular file; refusing "
                     "to read it")
  with os.fdopen(fd, "rb") as f:
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


def read_json(path: str, limit: int, what: str) -> Any:
  """The JSON value of a regular UTF-8 file of at most `limit` bytes; ValueError naming the
  file if it is not one or does not parse."""
  text = read_text(path, limit, what)
  try:
    return json.loads(text)
  except ValueError as e:
    raise ValueError(f"{what} {path} is not JSON: {e}") from None


def check_destination(path: str, what: str) -> None:
  """ValueError naming `path` if an output cannot replace it: a remote URL other than gs://,
  a symlink or a folder (a gs:// folder prefix)."""
  if is_remote(path):
    _remote().check_destination(os.fspath(path), what)
    return
  check_path(path, what)
  if os.path.islink(path):
    raise ValueError(f"{what} {path} is a symlink; refusing to write through it (remove it)")
  if os.path.isdir(path):
    raise ValueError(f"{what} {path} is a folder, not a file to write")


def _create_temporary(path: str):
  """(fd, name) of a new file beside `path`, opened O_EXCL | O_NOFOLLOW (never through a link
  or onto anything that is already there), mode 0666 less the umask."""
  folder = os.path.dirname(os.path.abspath(path))
  flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
  for _ in range(100):
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    try:
      return os.open(tmp, flags, 0o666), tmp
    except FileExistsError:
      continue
  raise FileExistsError(f"cannot create a temporary file beside {path}")


def write_atomic(outputs: Mapping[str, bytes]) -> None:
  """Writes {path: bytes}: every file under a temporary name first (O_EXCL | O_NOFOLLOW,
  fsynced), then each renamed into place, so a failure leaves every destination as it was.

  A gs:// destination is uploaded whole (`specjax.remote.write_objects`), after the local
  ones are in place.

  Raises:
    ValueError: a destination is a remote URL other than gs://, or a folder.
    OSError: naming the destination that could not be written (its temporary is removed).
  """
  uploads = {os.fspath(p): v for p, v in outputs.items() if is_remote(p)}
  outputs = {p: v for p, v in outputs.items() if not is_remote(p)}
  done = {}
  try:
    for path, payload in outputs.items():
      path = check_local(path, "the output")
      if os.path.isdir(path) and not os.path.islink(path):
        raise ValueError(f"the output {path} is a folder, not a file to write")
      try:
        fd, tmp = _create_temporary(path)
        done[path] = tmp
        with os.fdopen(fd, "wb") as f:
          f.write(payload)
          f.flush()
          os.fsync(f.fileno())
      except OSError as e:
        raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from e
    for path, tmp in done.items():
      try:
        os.replace(tmp, path)  # a link under `path` is replaced, never followed
      except OSError as e:
        raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from e
    done = {}
  finally:
    for tmp in done.values():
      with contextlib.suppress(OSError):
        os.unlink(tmp)  # a temporary not renamed into place
  if uploads:
    _remote().write_objects(uploads)


def write_file(path: Union[str, "os.PathLike[str]"], data: Union[bytes, str]) -> None:
  """`write_atomic` of one file; a str is written as UTF-8."""
  payload = data.encode("utf-8") if isinstance(data, str) else data
  write_atomic({os.fspath(path): payload})


def write_json(path: Union[str, "os.PathLike[str]"], value: Any, indent: int = 1) -> None:
  """`value` as JSON (sorted keys kept as given), written with `write_file`."""
  write_file(path, json.dumps(value, indent=indent) + "\n")


def _size(n: int) -> str:
  return f"{n // MIB} MiB" if n >= MIB and n % MIB == 0 else f"{n} bytes"
