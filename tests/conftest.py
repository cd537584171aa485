"""Suite-wide settings and fixtures.

Each XLA:CPU executable keeps its JIT code in memory mappings of its own, and a process may hold
at most vm.max_map_count (65530 by default) of them. The whole suite in one process compiles
enough loops to pass that (measured: about 1,000 more mappings every 20 s of compiling; 47k in
one of two xdist workers), and the next compile then aborts the interpreter ("Fatal Python
error: Aborted" inside backend_compile_and_load). So when a test module ends with more than
`MAX_MAPS` mappings, the executables compiled so far are dropped (module-scoped fixtures share
theirs within their module; a later module compiles again what it needs).
"""
import gc
import importlib.metadata
import os
import re
import subprocess
import sys


def _accelerator() -> bool:
  """Whether jax will run on a GPU or TPU here: JAX_PLATFORMS names one first, or (unset) a
  GPU or TPU plugin of jax is installed."""
  platforms = os.environ.get("JAX_PLATFORMS", "")
  if platforms:
    return platforms.split(",")[0].strip() not in ("cpu", "")
  plugin = re.compile(r"jax[-_](cuda|rocm)\d*[-_]plugin|libtpu(-nightly)?", re.IGNORECASE)
  return any(plugin.fullmatch(d.metadata["Name"] or "")
             for d in importlib.metadata.distributions())


_ACCELERATOR = _accelerator()

# Set before any test initializes a backend; subprocesses of the tests inherit them.
# On a GPU, JAX otherwise reserves 75% of the device's memory per process at start, so
# parallel workers (pytest -n) run out of memory: each takes only what it uses.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Compiles dominate this suite's time on a 2-core CPU: LLVM's optimization passes are skipped
# (-18% walltime measured on two end-to-end tests; the tiny test models run fast either way).
# Not on an accelerator, whose kernels would be compiled unoptimized too.
if not _ACCELERATOR and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_backend_optimization_level=0").strip()


def _xla_accepts(flag: str) -> bool:
  """Whether this jaxlib's XLA knows `flag`, tried in a fresh process (an unknown flag in
  XLA_FLAGS aborts the process that starts a backend)."""
  env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip(),
             JAX_PLATFORMS="cpu")
  probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                         capture_output=True, timeout=120, check=False)
  return probe.returncode == 0


# XLA:CPU's classic (elemental) fusion emitters, not its newer MLIR fusion emitters: they fuse
# and generate code differently (the same functions computed) and compile the suite's loops in
# about half the time (the tiny T5 pair's speculative and autoregressive loops: 7.3 -> 4.0 s;
# tests/app/test_main.py, test_first_run, test_user_path, test_main_tree, decode/test_stream,
# test_experiments and models/test_models together: 320 -> 185 s). Their code runs slower, which
# the few tests whose run time outweighs their compiles pay (a 200k-sample test: 13 -> 18 s).
# Tests that count the ops of a compiled program exactly compile it as a user's process does
# (the `default_cpu_emitters` fixture). Each test process starts with the flag already set (the
# first process tries it once, so a jaxlib without it runs with its defaults).
FUSION_EMITTERS_OFF = "--xla_cpu_use_fusion_emitters=false"
if (not _ACCELERATOR and "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", "")
    and _xla_accepts(FUSION_EMITTERS_OFF)):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FUSION_EMITTERS_OFF}".strip()

SAMPLER_OPTIONS = ({} if _ACCELERATOR else {
    "xla_backend_optimization_level": 2,
    **({"xla_cpu_use_fusion_emitters": True}
       if FUSION_EMITTERS_OFF in os.environ.get("XLA_FLAGS", "") else {})})
"""`jax.jit(f, compiler_options=SAMPLER_OPTIONS)` for a test's own sampler of hundreds of
thousands of rows, whose run outweighs its compile: optimized code with XLA:CPU's default
emitters (tests/verify/test_step.py: 31 -> 13 s). The same function is computed."""

# PyPI's torch for Python 3.12 and 3.13 is a CUDA build whose `triton` package loads an LLVM of
# its own; imported (transformers -> torch._dynamo -> triton) into a test process that already
# holds jaxlib's, it crashed xdist workers with a segmentation fault inside triton's import. The
# HuggingFace tests run torch on the CPU, which needs no triton, and torch takes a triton that
# cannot be imported as absent. specjax's own Triton kernels are lowered by jaxlib, not by it.
sys.modules.setdefault("triton", None)

# The suite compiles afresh and writes nothing to the user's cache folder: specjax's commands
# (run by tests in fresh processes) read SPECJAX_COMPILATION_CACHE, off here unless it is set.
# Set to a folder, the test processes and their commands share that persistent cache, which
# pays on a rerun (tests/decode: 5:00 -> 3:05 on 2 cores, every program read back), not within
# one run: the suite's programs differ from test to test (the same run with a fresh folder
# took 5:09). The tests of the cache itself set their own folder.
os.environ.setdefault("SPECJAX_COMPILATION_CACHE", "off")

import jax  # pylint: disable=wrong-import-position
import pytest  # pylint: disable=wrong-import-position

from specjax.runtime import compile_cache  # pylint: disable=wrong-import-position

compile_cache.enable(compile_cache.choose_folder())

MAX_MAPS = 30_000

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
  """Marks the tests that tests/extended.txt lists `extended` (tests/tiers.py: the tiers), before
  `-m` selects. When the whole suite is collected, a listed test that no longer exists is an
  error: the list would silently stop selecting."""
  del session
  from tests import tiers  # pylint: disable=import-outside-toplevel
  entries = tiers.read_list()
  used = set()
  for item in items:
    selecting = [entry for entry in entries if tiers.matches(item.nodeid, entry)]
    if selecting:
      item.add_marker(pytest.mark.extended)
      used.update(selecting)
  whole = [os.path.abspath(str(arg)) for arg in config.args] == [
      os.path.dirname(os.path.abspath(__file__))]
  if whole and not config.option.keyword:
    stale = sorted(set(entries) - used)
    if stale:
      raise pytest.UsageError(f"tests/extended.txt lists {len(stale)} tests that do not exist "
                              f"(renamed or removed? regenerate: python -m tests.tiers): "
                              f"{stale[:5]}")


def _maps() -> int:
  try:
    with open(f"/proc/{os.getpid()}/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:  # not Linux: no such limit to watch
    return 0


def pytest_sessionfinish(session, exitstatus):
  """Frees every compiled executable before the session ends (under xdist: before the worker
  reports that it is done). An xdist worker still busy 5 s after the controller asks it to end
  gets a SIGINT from execnet; freeing a session's thousands of XLA executables in the
  interpreter's last garbage collections took longer than that, so the SIGINT landed in jax's
  gc callback (`PytestUnraisableExceptionWarning: ... _jax.collect_garbage() KeyboardInterrupt`
  at the end of the run; `pytest -n 1 tests/app/test_main.py` showed it). Done here, the
  freeing is part of the run, and the worker ends at once."""
  del session, exitstatus
  jax.clear_caches()
  gc.collect()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_executables():
  yield
  if _maps() > MAX_MAPS:
    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="module")
def float32_matmuls():
  """Float32 matmuls at full float32 precision for a whole test module, its fixtures included
  (`pytestmark = pytest.mark.usefixtures("float32_matmuls")`).

  XLA's default float32 matmul is TF32 on NVIDIA Ampere and Hopper GPUs (a 10-bit
  significand: logits off by ~1e-3) and bfloat16 passes on TPUs. A module whose tests compare
  a network's float32 outputs with a reference computed another way (float64 numpy, another
  call shape or batch) tests the network or its cache, not the hardware's rounding, and runs
  under this. On a CPU, float32 matmuls are float32 already: it changes nothing there.
  """
  with jax.default_matmul_precision("highest"):
    yield


@pytest.fixture
def default_cpu_emitters(monkeypatch):
  """The test's `jax.jit(f).lower(...).compile()` calls compile with XLA:CPU's default fusion
  emitters, as a user's process does: `FUSION_EMITTERS_OFF` (the suite's flag) changes how
  XLA fuses and which loops it adds, so a test that counts the ops of a compiled program
  exactly reads the program a user runs."""
  if FUSION_EMITTERS_OFF not in os.environ.get("XLA_FLAGS", ""):
    return
  compile_ = jax.stages.Lowered.compile

  def compile_with_default_emitters(self, compiler_options=None, **kwargs):
    options = {"xla_cpu_use_fusion_emitters": True, **(compiler_options or {})}
    return compile_(self, compiler_options=options, **kwargs)

  monkeypatch.setattr(jax.stages.Lowered, "compile", compile_with_default_emitters)


@pytest.fixture
def gin_cleared():
  """An empty gin config for the test, cleared again after it."""
  import gin  # pylint: disable=import-outside-toplevel
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.fixture(scope="session")
def tiny_t5_pair():
  """The tiny random-init T5 pair of runs/random_tiny.gin (`specjax.testing.tiny_pair`), built
  once per session: tests that share it share its compiled loops. Read-only."""
  from specjax.testing import tiny_pair  # pylint: disable=import-outside-toplevel
  return tiny_pair("t5")


@pytest.fixture(scope="session")
def tiny_lm_pair():
  """The tiny random-init decoder-only pair (`specjax.testing.tiny_pair`), built once per
  session. Read-only."""
  from specjax.testing import tiny_pair  # pylint: disable=import-outside-toplevel
  return tiny_pair("lm")
