"""The deviceless tests' fixtures: this process's backend the CPU, the tiny model's pieces."""
import pytest

from specjax.aot import targets
from tests.aot.pieces import tiny_pieces


@pytest.fixture(scope="module", autouse=True)
def _cpu_host():
  targets.cpu_host()


@pytest.fixture(scope="module")
def lm_pieces():
  """`tiny_pieces()`: the tiny model's steps and loops, shapes only."""
  return tiny_pieces()
