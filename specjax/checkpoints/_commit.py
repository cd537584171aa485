"""Putting a finished checkpoint folder in place atomically, and cleaning up after crashes.

A checkpoint is written into a sibling folder `checkpoint_N.tmp-TOKEN` and then
renamed to `checkpoint_N` in one step, so readers see it absent or complete.
TOKEN is `UUID-PID-HOST`: the writing process and machine, so a later writer
can tell a dead writer's leftovers from a live one's.

- Without overwrite the rename must fail if `checkpoint_N` appeared meanwhile
  (another writer): `renameat2(RENAME_NOREPLACE)` through ctypes (Linux >= 3.15,
  glibc >= 2.28), race-free in the kernel. Where it is missing or the file
  system refuses it (EINVAL: NFS and others), the fallback claims the name with
  `os.mkdir` (atomic, fails if it exists) and renames onto the empty claim
  (POSIX allows replacing an empty folder; a non-empty one fails). A crash
  between those two leaves an empty `checkpoint_N` that readers skip and that
  is removed once older than STALE_SECONDS.
- Overwriting renames the old folder aside to `checkpoint_N.old-TOKEN`, then
  renames the new one in (no-replace again; another writer that committed in
  between is replaced in turn: the last writer wins). A crash between the two
  renames leaves no `checkpoint_N`: readers then read the `.old-` folder (see
  `old_folders`) and the next save renames it back (`recover`).
- Folders that go away (replaced or pruned checkpoints) are first renamed to
  `checkpoint_N.del-TOKEN`, then deleted, so a half-deleted folder never keeps
  a checkpoint's name.
- Readers and writers of one folder take turns through `flock`s on the folder itself:
  a reader holds a shared lock on the checkpoint folder it reads from (`reading`)
  and checks, once it holds it, that the name still names that folder; every
  rename or deletion of a checkpoint folder (`commit` overwriting, `discard`,
  `recover`) holds an exclusive lock on it. A reader therefore reads one save
  from start to end and never a mix of two; a save that replaces the folder a
  reader is reading waits for that reader. Where the file system has no
  `flock` the renames still happen, unlocked.
- `recover` (run by every save) removes the `.tmp-`/`.old-`/`.del-` folders of
  writers that are gone: same host and the PID no longer runs (or it is this
  process and the folder is no longer in use), or (another host, or a name
  without a PID) older than STALE_SECONDS.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import socket
import time
import uuid
from typing import Callable, Dict, Iterator, List, Optional

STALE_SECONDS = 24 * 3600
"""Leftovers of writers whose liveness cannot be checked are removed after this."""
LEFTOVER = re.compile(r"checkpoint_(\d+)\.(tmp|old|del)-([0-9a-f]{32}(?:-\d+-[A-Za-z0-9._]+)?)")
"""A writer's own leftover: its token is a UUID (older writers) or UUID-PID-HOST; a user's
folder such as `checkpoint_5.old-backup` never matches, so it is never read, moved or
deleted."""
_TOKEN = re.compile(r"[0-9a-f]{32}-(\d+)-([A-Za-z0-9._]+)")
_STEP_DIR = re.compile(r"checkpoint_(\d+)")
_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:64] or "host"
_ACTIVE: set = set()  # basenames of this process's folders still in use
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def _load_renameat2() -> Optional[Callable[..., int]]:
  try:
    fn = ctypes.CDLL(None, use_errno=True).renameat2
  except (AttributeError, OSError):  # not glibc >= 2.28 / not Linux
    return None
  fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
  fn.restype = ctypes.c_int
  return fn


_renameat2 = _load_renameat2()


def new_name(final: str, kind: str) -> str:
  """`final.KIND-UUID-PID-HOST`, a unique sibling of `final` owned by this process.

  It counts as in use (never stale) until `release`d.
  """
  name = f"{final}.{kind}-{uuid.uuid4().hex}-{os.getpid()}-{_HOST}"
  _ACTIVE.add(os.path.basename(name))
  return name


def release(path: str) -> None:
  """This process is done with `path`: if it is still there, it is a leftover."""
  _ACTIVE.discard(os.path.basename(path))


def fsync_dir(path: str) -> None:
  """Makes renames inside `path` durable (best effort where folders cannot be opened)."""
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def rename_noreplace(src: str, dst: str) -> None:
  """Renames `src` to `dst`; FileExistsError if `dst` exists, even if it appears meanwhile."""
  if _renameat2 is not None:
    if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst),
                  _RENAME_NOREPLACE) == 0:
      return
    err = ctypes.get_errno()
    if err in (errno.EEXIST, errno.ENOTEMPTY):
      raise FileExistsError(err, os.strerror(err), dst)
    if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
      raise OSError(err, os.strerror(err), src)
  os.mkdir(dst)  # the claim: atomic, FileExistsError if dst exists
  try:
    os.rename(src, dst)  # replaces only the empty claim
  except BaseException:
    try:
      os.rmdir(dst)
    except OSError:
      pass
    raise


def _same(path: str, fd: int) -> bool:
  """Whether `path` (followed) is the open file `fd` and still linked."""
  try:
    st = os.stat(path)
  except OSError:
    return False
  held = os.fstat(fd)
  return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino) and held.st_nlink > 0


def _flock(fd: int, mode: int) -> None:
  try:
    fcntl.flock(fd, mode)
  except OSError as e:  # no flock on this file system: go on unlocked
    if e.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOLCK, errno.EINVAL,
                       errno.EBADF):
      raise


@contextlib.contextmanager
def held(path: str, shared: bool) -> Iterator[bool]:
  """Holds a shared (reader) or exclusive (writer) lock on the folder `path`.

  Yields whether `path` still names the locked folder once the lock is held
  (False: it was renamed or removed meanwhile, or it does not exist). When it
  exists but cannot be opened (no permission), nothing is locked and True is
  yielded: the caller's own access then fails with its own error. Opened with
  O_NONBLOCK, so a FIFO under the name cannot make it wait.
  """
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
  except (FileNotFoundError, NotADirectoryError):
    yield False
    return
  except OSError:
    yield True
    return
  try:
    _flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
    yield _same(path, fd)
  finally:
    os.close(fd)  # releases the lock


def reading(folder: str) -> "contextlib.AbstractContextManager[bool]":
  """A reader's hold on a checkpoint folder: while held (and True), no save renames or
  deletes it; False when the name moved before the lock was taken (resolve it again)."""
  return held(folder, shared=True)


def _rename_held(src: str, dst: str) -> bool:
  """Renames the folder `src` to `dst` once no reader reads it; False if `src` moved."""
  with held(src, shared=False) as same:
    if not same:
      return False
    os.rename(src, dst)
    return True


def discard(path: str) -> None:
  """Removes a folder: renamed to `.del-` first (once no reader holds it), so it loses its
  name in one step."""
  match = LEFTOVER.fullmatch(os.path.basename(path)) or _STEP_DIR.fullmatch(
      os.path.basename(path))
  target = path
  if match is not None:
    base = os.path.join(os.path.dirname(path), f"checkpoint_{match.group(1)}")
    target = new_name(base, "del")
    try:
      moved = _rename_held(path, target)
    except FileNotFoundError:
      moved = False
    if not moved:
      if os.path.lexists(path) and not os.path.isdir(path):
        os.rename(path, target)  # a stray file or dangling link under the name
      else:
        release(target)
        return
  try:
    shutil.rmtree(target, ignore_errors=True)
  finally:
    release(target)


def commit(tmp: str, final: str, overwrite: bool) -> None:
  """Renames the finished folder `tmp` to `final` (see the module docstring).

  Raises:
    FileExistsError: `final` exists (or appeared while `tmp` was written) and
      `overwrite` is False.
  """
  parent = os.path.dirname(final)
  if not overwrite:
    rename_noreplace(tmp, final)
    fsync_dir(parent)
    return
  for _ in range(100):
    old = None
    try:
      # Both renames under the old folder's exclusive lock: a reader of it finishes first,
      # and no reader finds the step between the two.
      with held(final, shared=False) as same:
        if os.path.lexists(final):
          if not same and os.path.isdir(final):
            continue  # another overwriting writer replaced it meanwhile: lock the new one
          old = new_name(final, "old")
          try:
            os.rename(final, old)
          except FileNotFoundError:  # another overwriting writer moved it first
            release(old)
            old = None
        try:
          rename_noreplace(tmp, final)
        except FileExistsError:  # another writer committed meanwhile: replace it in turn
          committed = False
        except BaseException:  # interrupted or failed: put the previous one back
          if old is not None and not os.path.lexists(final):
            try:
              rename_noreplace(old, final)
            except OSError:
              pass  # readers still find it as `.old-`; the next save restores it
          raise
        else:
          committed = True
      if old is not None:
        discard(old)
      if not committed:
        continue
      fsync_dir(parent)
      return
    finally:
      if old is not None:
        release(old)
  raise FileExistsError(f"{final} kept reappearing while overwriting it")


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  try:  # a killed child its parent has not reaped yet is a zombie: gone
    with open(f"/proc/{pid}/stat", "rb") as f:
      return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
  except (OSError, IndexError):
    return True


def _age(path: str) -> float:
  try:
    return time.time() - os.lstat(path).st_mtime
  except OSError:
    return 0.0


def is_stale(path: str) -> bool:
  """Whether a `.tmp-`/`.old-`/`.del-` folder's writer is gone (see the module docstring)."""
  match = LEFTOVER.fullmatch(os.path.basename(path))
  if match is None:
    return False
  if _age(path) > STALE_SECONDS:
    return True
  owner = _TOKEN.fullmatch(match.group(3))
  if owner is None or owner.group(2) != _HOST:
    return False
  pid = int(owner.group(1))
  if pid == os.getpid():
    return os.path.basename(path) not in _ACTIVE
  return not _alive(pid)


def old_folders(model_dir: str) -> Dict[int, List[str]]:
  """step -> its `checkpoint_N.old-*` folders, newest first."""
  out: Dict[int, List[str]] = {}
  for entry in os.listdir(model_dir):
    match = LEFTOVER.fullmatch(entry)
    if match and match.group(2) == "old":
      out.setdefault(int(match.group(1)), []).append(os.path.join(model_dir, entry))
  for paths in out.values():
    paths.sort(key=_age)
  return out


def recover(model_dir: str, holds_checkpoint: Callable[[str], bool]) -> List[str]:
  """Cleans the leftovers of dead writers in `model_dir`; returns what it changed.

  A stale `.old-` folder whose `checkpoint_N` is gone (a crash between the two
  renames of an overwrite) is renamed back to `checkpoint_N`; every other stale
  `.tmp-`/`.old-`/`.del-` folder is deleted, and so is an empty `checkpoint_N`
  older than STALE_SECONDS (the fallback's claim of a crashed writer).
  """
  changed = []
  for step, paths in sorted(old_folders(model_dir).items()):
    final = os.path.join(model_dir, f"checkpoint_{step}")
    for path in paths:
      if os.path.lexists(final) or not is_stale(path) or not holds_checkpoint(path):
        continue
      with held(path, shared=False) as same:  # a reader may be reading it as the step
        if not same:
          continue
        try:
          rename_noreplace(path, final)
          changed.append(f"restored {path} -> {final}")
        except FileExistsError:
          pass
  for entry in sorted(os.listdir(model_dir)):
    path = os.path.join(model_dir, entry)
    if LEFTOVER.fullmatch(entry) and os.path.lexists(path) and is_stale(path):
      discard(path)
      changed.append(f"removed {path}")
    elif (_STEP_DIR.fullmatch(entry) and os.path.isdir(path) and not os.path.islink(path)
          and not os.listdir(path) and _age(path) > STALE_SECONDS):
      try:
        os.rmdir(path)
        changed.append(f"removed {path}")
      except OSError:
        pass
  if changed:
    fsync_dir(model_dir)
  return changed
