"""seqio imported only where a task needs it, with TensorFlow's start-up logging quieted.

Importing seqio imports TensorFlow, whose C++ start-up writes its CUDA probes to the process's
stderr (`cudart_stub.cc: Could not find cuda drivers ...`, `All log messages before
absl::InitializeLog() ...`) and takes seconds. `import_seqio` sets TF_CPP_MIN_LOG_LEVEL (unless
the user set it) and sends file descriptor 2 to /dev/null while the import runs; an import that
fails still raises its ImportError, which is not written to stderr.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
  """File descriptor 2 (what C++ libraries write to) sent to /dev/null inside the block."""
  sys.stderr.flush()
  saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


def import_seqio() -> Any:
  """The seqio module, imported quietly the first time (see the module docstring)."""
  if "seqio" in sys.modules:
    return sys.modules["seqio"]
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  with quiet_stderr():
    import seqio  # pylint: disable=import-outside-toplevel
  return seqio


def seqio_imported() -> bool:
  """Whether seqio is imported already (by a task module, a gin file, this process's code):
  no seqio task can be registered before it is."""
  return "seqio" in sys.modules
