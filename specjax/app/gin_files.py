"""Where a run's gin files come from: the rules that keep specjax's own files its own.

gin itself looks for a file (and every `include`) in the working folder first, then on each
search path, and runs what it finds there (gin files import modules and call them). specjax
resolves the files a run parses itself, with these rules:

- A file specjax ships (under `GIN_DIR`) is always specjax's own: its includes resolve
  inside `GIN_DIR` only, whatever the working folder or the search paths hold.
- A name the user wrote (`--gin_file`, a `--gin.` include, or an include inside the user's
  own file) resolves as written: an absolute path as it is; a relative one beside the file
  that includes it, in the working folder, or among specjax's gin files. Found in two of
  those places, it is refused in one line naming both.
- `--gin_search_paths` folders are never searched for these files: they hold model gin
  files, which only the restricted parser of `specjax.models.model_gin` reads (never run).
- Only regular files of at most `GIN_FILE_BYTES` are read, an include cycle is refused, and
  one parse reads at most `MAX_FILES_READ` files and `MAX_BYTES_READ` bytes in all (so
  files that include each other many times over cannot hang the job).

`GinFiles.reading()` installs these rules as gin's file reader for the length of one parse.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Set

import gin

from specjax import files
from specjax.app import gin_remote


def _gin_dir() -> Path:
  """specjax's gin files: inside the installed package (`specjax/gin`, a wheel) or, in a
  checkout, the repository's top-level `gin/` (setup.py installs it as `specjax/gin`)."""
  package = Path(__file__).resolve().parents[1]  # specjax/
  for candidate in (package / "gin", package.parent / "gin"):
    if (candidate / "runs").is_dir():
      return candidate
  return package / "gin"


GIN_DIR = _gin_dir()
GIN_FILE_BYTES = files.MIB
"""Largest gin file read (specjax's run files are a few KB)."""
MAX_FILES_READ = 256
"""Most gin files one parse opens, includes counted each time they are read."""
MAX_BYTES_READ = 8 * files.MIB
"""Most bytes of gin one parse reads, over all the files it opens."""

INCLUDE = re.compile(r"""^\s*include\s+['"](.+)['"]\s*$""")
"""An include line, as specjax's own scan of a file's includes finds it."""


def within(root: str, path: str) -> bool:
  """Whether the real path `path` lies in the folder `root` (both real paths)."""
  return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def shipped(path: str) -> bool:
  """Whether `path` is one of the gin files specjax ships."""
  return not files.is_remote(path) and within(os.path.realpath(GIN_DIR), os.path.realpath(path))


def check_search_paths(paths: Sequence[str]) -> List[str]:
  """`paths` if each is an existing folder; ValueError naming the first that is not."""
  for path in paths:
    if files.is_remote(path):
      continue  # a bucket's folder is a prefix: an include under it that is missing is named
    if not os.path.isdir(path):
      what = "does not exist" if not os.path.exists(path) else "is not a folder"
      raise ValueError(f"--gin_search_paths: {path} {what} (a folder of model gin files)")
  return list(paths)


def locate(name: str, including: Optional[str] = None,
           search_paths: Sequence[str] = ()) -> str:
  """The path of the run gin file `name`, by the module's rules.

  Args:
    name: the file as written (in a --gin_file flag or an include line).
    including: the file whose include names it (None: named by the user).
    search_paths: the run's --gin_search_paths, only to say so when the file is there.
  Returns:
    The path to open (a regular file).
  Raises:
    FileNotFoundError: nowhere the rules allow; says where it looked.
    ValueError: found in two places (naming both), or not a regular file.
  """
  if including is not None and shipped(including):
    candidates = [] if os.path.isabs(name) else [os.path.join(GIN_DIR, name)]
    where = f"specjax's gin files ({GIN_DIR}), where a file specjax ships finds its includes"
  elif os.path.isabs(name) or files.is_remote(name):
    candidates, where = [name], "that path"
  else:
    beside = [] if including is None else [os.path.join(os.path.dirname(including), name)]
    candidates = [*beside, os.path.join(os.getcwd(), name), os.path.join(GIN_DIR, name)]
    where = ("beside the including file, " if including else "") + (
        f"in the working folder ({os.getcwd()}) or among specjax's gin files ({GIN_DIR})")
  found: List[str] = []
  for candidate in candidates:
    present = (gin_remote.exists(candidate) if files.is_remote(candidate)
               else os.path.lexists(candidate))
    if present and gin_remote.real(candidate) not in map(gin_remote.real, found):
      found.append(candidate)
  by = f" (included by {including})" if including else ""
  if len(found) > 1:
    raise ValueError(f"gin file '{name}'{by} is both {found[0]} and {found[1]}: refusing to "
                     "guess which one to run; name it by its path, or remove the other")
  if not found:
    hint = [p for p in search_paths if os.path.exists(os.path.join(p, name))]
    also = (f"; it is in --gin_search_paths folder {hint[0]}, which holds model gin files only "
            "(read, never run): pass a run file by its path") if hint else ""
    raise FileNotFoundError(f"gin file '{name}'{by} not found {where}{also}")
  path = found[0]
  if files.is_remote(path):
    return path  # an object, read whole within the size bound by `GinFiles.text`
  if os.path.isdir(path):
    raise IsADirectoryError(f"gin file '{path}' is a folder, not a gin file (a trained model "
                            "folder's config is its model.gin)")
  files.check_regular(path, "the gin file")
  return path


class GinFiles:
  """One parse's gin files: where each is found, the include chain open now, and the work
  done so far (files and bytes read), bounded."""

  def __init__(self, search_paths: Sequence[str] = ()):
    self.search_paths = list(search_paths)
    self.chain: List[str] = []  # real paths of the files being parsed, outermost first
    self.files_read = 0
    self.bytes_read = 0

  def locate(self, name: str) -> str:
    """`locate` for a name gin meets now: an include of the innermost open file, or a
    file named by the user when none is open."""
    return locate(name, self.chain[-1] if self.chain else None, self.search_paths)

  def text(self, path: str) -> str:
    """The text of `path` (a located file), counted against the parse's bounds."""
    real = gin_remote.real(path)
    if real in self.chain:
      cycle = [*self.chain[self.chain.index(real):], real]
      raise ValueError("gin include cycle: " + " -> ".join(cycle))
    self.files_read += 1
    if self.files_read > MAX_FILES_READ:
      raise ValueError(f"gin files: more than {MAX_FILES_READ} files read in one parse "
                       f"(reading {path}, included by {self.chain[-1] if self.chain else '-'}"
                       "): an include tree that large is refused")
    try:
      data = files.read_bytes(path, GIN_FILE_BYTES, "the gin file")
    except OSError as e:
      raise OSError(f"the gin file {path} cannot be read: {e.strerror or e}") from e
    self.bytes_read += len(data)
    if self.bytes_read > MAX_BYTES_READ:
      raise ValueError(f"gin files: more than {MAX_BYTES_READ // files.MIB} MiB of gin read in "
                       f"one parse (reading {path}): an include tree that large is refused")
    try:
      return data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark is not gin
    except UnicodeDecodeError as e:
      raise ValueError(f"the gin file {path} is not UTF-8 text (byte {e.start}): is it a gin "
                       "file?") from None

  @contextlib.contextmanager
  def opened(self, name: str) -> Iterator[io.StringIO]:
    """gin's reader: the located file's text, open as the innermost file while gin parses it
    (its includes are found from it)."""
    path = self.locate(name)
    handle = io.StringIO(self.text(path))
    handle.name = path  # gin names the file in its syntax errors
    self.chain.append(gin_remote.real(path))
    try:
      yield handle
    finally:
      self.chain.pop()

  def _exists(self, name: str) -> bool:
    """gin's existence check: always True, so that `opened` raises the rules' own error."""
    del name
    return True

  @contextlib.contextmanager
  def reading(self) -> Iterator["GinFiles"]:
    """Within: gin finds and reads files only through `opened` (no working-folder or
    search-path lookups of its own)."""
    readers = gin.config._FILE_READERS  # pylint: disable=protected-access
    prefixes = gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access
    saved = list(readers), list(prefixes)
    readers[:], prefixes[:] = [(self.opened, self._exists)], [""]
    try:
      yield self
    finally:
      readers[:], prefixes[:] = saved

  def included(self, name: str) -> Set[str]:
    """The real paths of the file `name` and of every file it includes, transitively (by an
    include line scan, without gin); an include that cannot be found is left to the parse,
    which reports it."""
    try:
      path = self.locate(name)
    except FileNotFoundError:
      if self.chain:
        return set()
      raise
    real = gin_remote.real(path)
    if real in self.chain:
      return set()  # a cycle: the parse names it
    found = {real}
    text = self.text(path)
    self.chain.append(real)
    try:
      for match in map(INCLUDE.match, text.splitlines()):
        if match:
          found |= self.included(match.group(1))
    finally:
      self.chain.pop()
    return found
