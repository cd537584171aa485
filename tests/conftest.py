"""Suite-wide settings and fixtures.

Each XLA:CPU executable keeps its JIT code in memory mappings of its own, and a process may hold
at most vm.max_map_count (65530 by default) of them. The whole suite in one process compiles
enough loops to pass that (measured: about 1,000 more mappings every 20 s of compiling; 47k in
one of two xdist workers), and the next compile then aborts the interpreter ("Fatal Python
error: Aborted" inside backend_compile_and_load). So when a test module ends with more than
`MAX_MAPS` mappings, the executables compiled so far are dropped (module-scoped fixtures share
theirs within their module; a later module compiles again what it needs).
"""
import atexit
import gc
import os
import shutil
import tempfile

# Compiles dominate this suite's time on a 2-core CPU: LLVM's optimization passes are skipped
# (-18% walltime measured on two end-to-end tests; the tiny test models run fast either way).
# Set before any test initializes a backend; subprocesses of the tests inherit it.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_backend_optimization_level=0").strip()

# A persistent compilation cache shared by every process of one run: the pytest process, its
# xdist workers and the subprocesses the tests start (all inherit these variables; the workers
# start after this file is first imported, by the process that made the folder). The suite
# compiles the same loops in many processes and again after `jax.clear_caches` below: a cache
# hit loads the executable instead. The folder is made for this run and removed when the
# process that made it exits; a folder the caller names in JAX_COMPILATION_CACHE_DIR is used as
# it is. Entries are kept whatever their size or compile time (both minimums 0).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="specjax-jax-cache-")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # pylint: disable=wrong-import-position
import pytest  # pylint: disable=wrong-import-position

MAX_MAPS = 30_000


def _maps() -> int:
  try:
    with open(f"/proc/{os.getpid()}/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:  # not Linux: no such limit to watch
    return 0


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_executables():
  yield
  if _maps() > MAX_MAPS:
    jax.clear_caches()
    gc.collect()
