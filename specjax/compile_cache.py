"""JAX's persistent compilation cache for specjax's commands: a run compiles each loop once, and
every later run with the same shapes, settings and jax version reads the compiled loop from disk.

Where the cache lives, first match wins:

  --no_compilation_cache               off for this run
  --compilation_cache=DIR              DIR
  $SPECJAX_COMPILATION_CACHE=DIR       DIR ('off' turns it off)
  $JAX_COMPILATION_CACHE_DIR=DIR       DIR (JAX's own setting)
  $XDG_CACHE_HOME/specjax/jax          else ~/.cache/specjax/jax

The folder may be shared by any number of processes at once (JAX writes each entry to a
temporary name and renames it into place) and deleted at any time. The main job enables it
from its flags (`enable_from(args)`); `python -m experiments.X` from the environment.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

import jax

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


def enable(folder: Optional[Path]) -> Optional[Path]:
  """Points JAX's persistent compilation cache at `folder` (created if missing), or turns it
  off for None. Call before the first compile: JAX decides once per process whether to use
  the cache. Returns the folder in use (None if off or the folder cannot be created)."""
  if folder is None:
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  try:
    folder.mkdir(parents=True, exist_ok=True)
  except OSError as e:  # a read-only home: run without the cache rather than fail the job
    print(f"specjax: compilation cache off: cannot create {folder}: {e.strerror}",
          file=sys.stderr)
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", str(folder))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
  return folder


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
