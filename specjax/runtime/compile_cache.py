"""JAX's persistent compilation cache for specjax's commands: a run compiles each loop once, and
every later run with the same shapes, settings and jax version reads the compiled loop from disk.

Where the cache lives, first match wins:

  --no_compilation_cache               off for this run
  --compilation_cache=DIR              DIR
  $SPECJAX_COMPILATION_CACHE=DIR       DIR ('off' turns it off)
  $JAX_COMPILATION_CACHE_DIR=DIR       DIR (JAX's own setting)
  $XDG_CACHE_HOME/specjax/jax          else ~/.cache/specjax/jax

The cache is trusted code: JAX runs whatever executable it finds under an entry's key. So a
folder is used only when it, and every parent up to the home folder (or the root), is owned
by the current user (or root) and writable by no one else, as ssh's StrictModes asks of
~/.ssh; a parent with the sticky bit (such as /tmp) may be writable by all, since no one else
can rename or delete what is ours inside it. Any other folder is refused with one line and
the run goes on uncached. A folder the user may read but not write is read, and nothing new
is written to it (one line says so).

Entries are written under a fresh temporary name and renamed into place (`files.write_file`:
never through a link planted there, never torn), so any number of the owner's processes may
share the folder, and it may be deleted at any time. An entry found empty, torn (it does not
decompress), or not a regular file is removed and compiled again, once. A write that fails
(a full disk) is said in one line, and the run goes on writing nothing more.
"""
from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

import jax

from specjax import files

ENV = "SPECJAX_COMPILATION_CACHE"
"""The environment variable naming the cache folder ('off': no cache)."""

OFF = "off"

MIN_COMPILE_S = 0.0
"""Compiles at least this long are written (JAX's default, 1 s, would leave out the many
short compiles that together still cost seconds per run)."""


def default_folder(environ: Mapping[str, str] = os.environ) -> Path:
  """$XDG_CACHE_HOME/specjax/jax, or ~/.cache/specjax/jax when XDG_CACHE_HOME is unset."""
  base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
  return Path(base).expanduser() / "specjax" / "jax"


def choose_folder(flag: Optional[str] = None, off: bool = False,
                  environ: Mapping[str, str] = os.environ) -> Optional[Path]:
  """The cache folder for a run (the order of the module docstring), or None for no cache.

  Args:
    flag: --compilation_cache's value (None: not given).
    off: --no_compilation_cache.
    environ: the environment to read.
  """
  if off:
    return None
  for value in (flag, environ.get(ENV), environ.get("JAX_COMPILATION_CACHE_DIR")):
    if value:
      return None if value.strip().lower() == OFF else Path(value).expanduser()
  return default_folder(environ)


def untrusted(folder: Path, uid: Optional[int] = None) -> Optional[str]:
  """Why `folder` (an existing folder) may not hold a compilation cache, or None when it may:
  it and each parent up to the home folder (or the root) must be owned by `uid` (default the
  current user) or root, and writable by neither group nor others, except a parent with the
  sticky bit. Links are followed (the folder they lead to is the one checked)."""
  uid = os.geteuid() if uid is None else uid
  path = Path(os.path.realpath(folder))
  home = Path(os.path.realpath(Path.home()))
  for current in (path, *path.parents):
    st = os.stat(current)
    if st.st_uid not in (uid, 0):
      return f"{current} is owned by another user (uid {st.st_uid})"
    sticky_parent = current != path and st.st_mode & stat.S_ISVTX
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_parent:
      return f"{current} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'}"
    if current == home:
      break
  return None


def _make_folder(folder: Path) -> None:
  """Creates `folder` and its missing parents, each mode 0755 at most (whatever the umask:
  a group-writable new folder would be refused)."""
  missing = []
  for current in (folder, *folder.parents):
    if current.exists():
      break
    missing.append(current)
  for current in reversed(missing):
    os.mkdir(current, 0o755)  # less the umask: never group- or world-writable


def _off(reason: str) -> None:
  print(f"specjax: compilation cache off: {reason}", file=sys.stderr, flush=True)
  jax.config.update("jax_enable_compilation_cache", False)


def enable(folder: Optional[Path]) -> Optional[Path]:
  """Points JAX's persistent compilation cache at `folder` (created if missing), or turns it
  off for None. Call before the first compile: JAX decides once per process whether to use
  the cache. A folder that cannot be created or is not trusted (`untrusted`) turns the cache
  off with one line on stderr. Returns the folder in use (None if off)."""
  if folder is None:
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  folder = Path(folder)
  try:
    _make_folder(folder)
    reason = untrusted(folder) if folder.is_dir() else f"{folder} is not a folder"
  except OSError as e:  # a read-only home: run without the cache rather than fail the job
    _off(f"cannot create or read {folder}: {e.strerror}")
    return None
  if reason is not None:
    _off(f"{folder} is not safe to run compiled code from: {reason}")
    return None
  writable = os.access(folder, os.W_OK | os.X_OK)
  if not _install_entries(writable):
    _off("this jax's cache writer cannot be wrapped (entries would not be written atomically)")
    return None
  if not writable:
    print(f"specjax: compilation cache {folder} is read-only for this user: compiled loops "
          "are read from it, none written", file=sys.stderr, flush=True)
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", str(folder))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
  return folder


SUFFIX = "-cache"
"""The ending of an entry's file name (JAX's LRU cache: `<key>-cache`)."""


def _install_entries(writable: bool) -> bool:
  """Makes JAX's file cache read and write its entries through `Entries` (JAX builds its cache
  once, through `compilation_cache.get_file_cache`, in jax 0.10 through 0.12); False when
  this jax has no such hook."""
  try:
    from jax._src import compilation_cache as jcc  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  original = getattr(jcc, "get_file_cache", None)
  if original is None or not hasattr(jcc, "decompress_executable"):
    return False
  original = getattr(original, "wrapped", original)

  def get_file_cache(path, *args, **kwargs):
    made = original(path, *args, **kwargs)
    if made is None:
      return None
    cache, where = made
    if hasattr(cache, "_base_cache"):  # jax_compilation_cache_check_contents' wrapper
      cache._base_cache = Entries(cache._base_cache, writable, jcc.decompress_executable)  # pylint: disable=protected-access
      return cache, where
    return Entries(cache, writable, jcc.decompress_executable), where

  get_file_cache.wrapped = original
  jcc.get_file_cache = get_file_cache
  if getattr(jcc, "_cache", None) is not None:  # built before: build it again through ours
    jcc.reset_cache()
  return True


class Entries:
  """JAX's file cache with safe entries: read only from regular files (no links), an empty or
  torn entry removed (JAX then compiles it again), and written through a temporary renamed
  into place (`files.write_file`), replacing what was there (JAX writes only after a miss
  or an entry it could not load). Eviction, when JAX's cache has a size limit, stays JAX's.

  Args:
    base: JAX's cache (an `LRUCache`): its folder (`_path`) and eviction.
    writable: False for a folder this user may only read (nothing is written).
    decompress: JAX's `decompress_executable` (an entry that fails it is torn).
  """

  def __init__(self, base: Any, writable: bool, decompress: Any):
    self._base = base
    self._path = base._path  # pylint: disable=protected-access
    self._folder = os.fspath(base._path)  # pylint: disable=protected-access
    self._writable = writable
    self._decompress = decompress

  def _file(self, key: str) -> str:
    if not key or "/" in key:
      raise ValueError(f"a compilation cache key must be a plain name, got {key!r}")
    return os.path.join(self._folder, key + SUFFIX)

  def get(self, key: str) -> Optional[bytes]:
    """The entry's bytes, or None (a miss; an unusable entry is removed first)."""
    path = self._file(key)
    try:
      fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
      return None
    except OSError:  # a link (ELOOP) or no permission
      return self._discard(path)
    with os.fdopen(fd, "rb") as f:
      if not stat.S_ISREG(os.fstat(fd).st_mode):
        return self._discard(path)
      data = f.read()
    try:
      if not data:
        raise ValueError("an empty entry")
      self._decompress(data)
    except Exception:  # pylint: disable=broad-except  (zlib.error, zstd's own errors, ...)
      return self._discard(path)
    if getattr(self._base, "eviction_enabled", False):
      self._base.get(key)  # JAX's access-time bookkeeping
    return data

  def _discard(self, path: str) -> None:
    if self._writable:
      try:
        os.unlink(path)
      except OSError:
        pass
    return None

  def put(self, key: str, value: bytes) -> None:
    """Writes the entry atomically (a failure says so once, and writing stops)."""
    if not self._writable:
      return
    path = self._file(key)
    try:
      evict = getattr(self._base, "_evict_if_needed", None)
      if getattr(self._base, "eviction_enabled", False) and evict is not None:
        with self._base.lock:
          evict(additional_size=len(value))
          files.write_file(path, value)
          files.write_file(os.path.join(self._folder, key + "-atime"),
                           time.time_ns().to_bytes(8, "little"))  # as JAX's LRU cache does
      else:
        files.write_file(path, value)
    except (OSError, ValueError) as e:
      self._writable = False
      print(f"specjax: compilation cache {self._folder} cannot be written ({e}): compiled "
            "loops from here on are not saved", file=sys.stderr, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
  """Adds --compilation_cache=DIR and --no_compilation_cache to an argparse parser."""
  parser.add_argument("--compilation_cache", metavar="DIR", default=None,
                      help=f"JAX's persistent compilation cache folder (default ${ENV}, else "
                      "$XDG_CACHE_HOME/specjax/jax or ~/.cache/specjax/jax)")
  parser.add_argument("--no_compilation_cache", action="store_true",
                      help="compile everything afresh, reading and writing no cache")
  return parser


def enable_from(args: Any) -> Optional[Path]:
  """`enable` from the flags of `add_arguments` (an argparse namespace) and the environment."""
  return enable(choose_folder(getattr(args, "compilation_cache", None),
                              bool(getattr(args, "no_compilation_cache", False))))


def enable_for_module_run() -> Optional[Path]:
  """`enable` from the environment when Python is starting a module as a script
  (`python -m experiments.X`: sys.argv[0] is '-m' while its package is imported); an import
  from a test or a notebook changes nothing. Returns the folder in use."""
  if sys.argv[:1] != ["-m"]:
    return None
  return enable(choose_folder())
