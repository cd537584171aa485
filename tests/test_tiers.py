"""The split of the suite into the core and extended sets (tests/tiers.py, tests/extended.txt)."""
import pytest

from tests import tiers


def test_an_entry_selects_its_test_its_parametrizations_or_its_module():
  node = "tests/a/test_b.py::test_c[x-1]"
  assert tiers.matches(node, node)
  assert tiers.matches(node, "tests/a/test_b.py::test_c[*]")
  assert tiers.matches(node, "tests/a/test_b.py")
  assert not tiers.matches(node, "tests/a/test_b.py::test_c")  # an id is whole
  assert not tiers.matches(node, "tests/a/test_b.py::test_c[x-2]")
  assert not tiers.matches("tests/a/test_bb.py::test_c", "tests/a/test_b.py")


def test_slow_tests_are_extended_unless_core_and_whole_entries_come_first():
  seconds = {node: 100.0 for node in tiers.CORE}
  seconds.update({"tests/x/test_y.py::test_slow": tiers.THRESHOLD_S,
                  "tests/x/test_y.py::test_quick": tiers.THRESHOLD_S - 0.01,
                  "tests/test_docs.py::test_snippet_runs[README.md:9]": 30.0})
  entries = tiers.extended(seconds)
  whole = len(tiers.WHOLE)
  assert entries[whole:] == ["tests/x/test_y.py::test_slow"]
  assert "tests/test_docs.py::test_snippet_runs[*]" in entries[:whole]
  assert not any(tiers.is_extended(node, entries) for node in tiers.CORE)
  with pytest.raises(ValueError, match="CORE names tests"):
    tiers.extended({"tests/x/test_y.py::test_slow": 9.0})


def test_the_list_on_disk_holds_the_whole_entries_and_no_core_test():
  entries = tiers.read_list()
  assert entries[:len(tiers.WHOLE)] == [
      e if e.endswith(".py") else e + "[*]" for e in tiers.WHOLE]
  assert not any(tiers.is_extended(node, entries) for node in tiers.CORE)
