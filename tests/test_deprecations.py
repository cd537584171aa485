"""specjax's own calls raise no deprecation warning on the installed JAX and flax.

A fresh process imports specjax, runs a tiny speculative decode and a tiny training step with
every warning recorded, and reports the deprecation warnings (DeprecationWarning,
PendingDeprecationWarning, FutureWarning) whose source line is in specjax's own files. A JAX or
flax release that deprecates something specjax calls then fails here, on every Python and JAX
the suite runs on, instead of printing to users. A fresh process, because a warning raised at
import or while tracing is raised once: the suite's other tests would have consumed it.
"""
import json
import pathlib
import subprocess
import sys
import textwrap

import specjax

PACKAGE = pathlib.Path(specjax.__file__).resolve().parent

RUN = """
import jax, jax.numpy as jnp
from specjax import speculative_decode, testing, train
from specjax.draft import ModelDrafter
pair = testing.tiny_pair("lm")
result = speculative_decode(
    pair.target, pair.target_params, ModelDrafter(pair.draft, max_gamma=2), pair.draft_params,
    jnp.array([[5, 6, 7, 0]], jnp.int32), max_new_tokens=3, gamma=2, rng=jax.random.PRNGKey(0))
trainer = train.Trainer(pair.draft, train.OptimizerConfig(learning_rate=1e-2), 2)
batches = train.make_batches(train.DataConfig(task="lm", batch_size=2, seq_len=8),
                             testing.TINY_CONFIGS["lm"][1])
state, sums = trainer.train_step(trainer.init_state(pair.draft_params), batches[0].batch(0))
jax.block_until_ready((result, sums))
"""
"""A tiny speculative decode and a tiny training step of the shared tiny LM pair."""


def _script(body: str) -> str:
  """`body` run with every warning recorded; prints the deprecation warnings whose source
  line lies in specjax's files (a JSON list of lines)."""
  return "\n".join([
      "import inspect, json, pathlib, warnings",
      "with warnings.catch_warnings(record=True) as caught:",
      "  warnings.simplefilter('always')",
      "  import specjax",
      textwrap.indent(body.strip(), "  "),
      "package = pathlib.Path(specjax.__file__).resolve().parent",
      "kinds = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)",
      "print(json.dumps([f'{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}'",
      "                  for w in caught if issubclass(w.category, kinds)",
      "                  and pathlib.Path(w.filename).resolve().is_relative_to(package)]))"])


def _own_deprecations(script: str) -> list:
  """The deprecation warnings raised from specjax's files while `script` runs (a fresh
  process), one line each."""
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        check=False, cwd=PACKAGE.parent, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_decode_and_a_train_step_raise_no_deprecation_from_specjax():
  assert _own_deprecations(_script(RUN)) == []


def test_a_deprecated_call_made_by_specjax_is_reported():
  # The check itself: a function that warns its caller (as JAX's deprecated APIs do), called
  # from a specjax module, is reported with that module's line; one called from here is not.
  body = """
def deprecated(*args):
  warnings.warn("old API", DeprecationWarning, stacklevel=2)
  return inspect.Signature()
import specjax.compat
inspect.signature = deprecated
specjax.compat._parameters(len)
deprecated()
"""
  reported = _own_deprecations(_script(body))
  assert len(reported) == 1 and "compat.py" in reported[0] and "old API" in reported[0], reported
