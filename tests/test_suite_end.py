"""The test session frees its compiled executables before it ends (tests/conftest.py), so an xdist
worker's last garbage collections are short and execnet's shutdown SIGINT (sent to a worker still
busy 5 s after it is asked to end) never lands in jax's gc callback."""
import jax
import jax.numpy as jnp

from tests import conftest


def test_the_session_end_hook_frees_compiled_executables():
  f = jax.jit(lambda x: x * 2 + 1)
  f(jnp.arange(3))
  assert f._cache_size() == 1  # pylint: disable=protected-access
  conftest.pytest_sessionfinish(None, 0)
  assert f._cache_size() == 0  # pylint: disable=protected-access
