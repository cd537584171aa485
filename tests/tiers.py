"""The suite's two tiers: the core set (the README's test command, under 12 minutes on 2 cores)
and the extended set (`.ci/run` runs it after the core set; every test runs on every CI run).

A test is extended when one measured run of the whole suite took `THRESHOLD_S` seconds or
more for it (setup, call and teardown; the junit XML of `pytest --junitxml`), unless it is in
`CORE`: the one test per law or capability that the core set keeps whatever it costs. The
extended tests are listed in tests/extended.txt, one pytest node id per line;
tests/conftest.py marks them `extended` at collection. Regenerate the list after a change in
the suite's costs (two runs, the fast set and the e2e set, then this command):

  python -m pytest -q -n 2 --dist loadfile -m "not e2e" tests --junitxml=/tmp/fast.xml
  python -m pytest -q -n 2 --dist loadfile -m e2e tests --junitxml=/tmp/e2e.xml
  python -m tests.tiers /tmp/fast.xml /tmp/e2e.xml [more runs' XML: a test's largest time counts]

A module-scoped fixture's setup is charged to the first test that uses it; when that test
goes to the extended set, the next one pays it in the core set (the reason to time the core
set again after regenerating).
"""
import os
import sys
import xml.etree.ElementTree as ET
from typing import Dict, Iterable, List

THRESHOLD_S = 6.0
"""Tests that took this long or longer in the measured run are extended (unless in CORE)."""

LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "extended.txt")

CORE = (
    # The sampling laws, each once: the step's first token over several blocks; the chain loop's
    # joint of its first three tokens; a tree's; a feature head's chain.
    "tests/verify/test_step.py::test_first_token_is_distributed_as_target_over_several_blocks",
    "tests/decode/test_decoding.py::test_joint_of_first_three_tokens_matches_target[temperature]",
    "tests/decode/test_tree_decode.py::"
    "test_sampled_tree_joint_of_first_three_tokens_matches_target[static]",
    "tests/draft/test_feature_drafter.py::"
    "test_joint_of_first_three_tokens_matches_target_at_temperature_one[lm]",
    "tests/verify/test_verifiers.py::test_first_token_is_distributed_as_target[fused]",
    # Greedy identity with autoregressive decoding: a T5 pair's chain, a feature head (EAGLE-1
    # and fused layers), a Gemma pair.
    "tests/decode/test_decoding_models.py::test_greedy_speculative_equals_autoregressive[t5-model]",
    "tests/draft/test_feature_drafter.py::"
    "test_greedy_equals_autoregressive_and_rounds_read_true_features[lm]",
    "tests/draft/test_feature_layers_exactness.py::test_greedy_equals_autoregressive_chain_and_trees[lm]",
    "tests/models/test_gemma_model.py::test_greedy_speculative_decode_is_the_argmax_of_the_forward",
    # The main job on the bundled default.
    "tests/app/test_main.py::test_default_run_writes_outputs_and_is_greedy_identical",
)

WHOLE = (
    # Their ids are a file's line numbers, which any edit above a snippet moves: every
    # parametrization is extended (written `test[*]`).
    "tests/test_docs.py::test_snippet_runs",
    "tests/test_docs.py::test_recipe_runs_as_written",
    # Modules whose shared fixtures cost more than the threshold (a pair trained, the
    # benchmark's models compiled, several devices started): the first test that uses one pays
    # its setup in a measured run, the next one when that test is extended.
    "tests/experiments/test_bench_scale.py",
    "tests/runtime/test_sharding.py",
    "tests/train/test_distill.py",
)
"""Whole tests (every parametrization) or whole modules that are extended, measured or not."""


def durations(paths: Iterable[str]) -> Dict[str, float]:
  """{pytest node id: seconds} from junit XML files (setup + call + teardown; a test in several
  files, e.g. a whole run and a core-set run: its largest)."""
  seconds: Dict[str, float] = {}
  for path in paths:
    for case in ET.parse(path).iter("testcase"):
      module = case.get("classname") or ""
      if not module:  # a module skipped at collection
        continue
      node = module.replace(".", "/") + ".py::" + case.get("name")
      seconds[node] = max(seconds.get(node, 0.0), float(case.get("time") or 0.0))
  return seconds


def matches(node: str, entry: str) -> bool:
  """Whether pytest node id `node` is selected by a line of tests/extended.txt: the same id, a
  module (`path.py`: its every test), or `test[*]` (every parametrization of a test)."""
  if entry.endswith("[*]"):
    return node.startswith(entry[:-2])
  if entry.endswith(".py"):
    return node.startswith(entry + "::")
  return node == entry


def is_extended(node: str, entries: Iterable[str]) -> bool:
  """Whether any of `entries` (lines of tests/extended.txt) selects `node`."""
  return any(matches(node, entry) for entry in entries)


def extended(seconds: Dict[str, float], threshold: float = THRESHOLD_S) -> List[str]:
  """The lines of tests/extended.txt for the measured `seconds` (of one or more runs: the
  largest of each test's): `WHOLE`'s entries, then the node ids that took `threshold` or more
  and are neither in `CORE` nor under a `WHOLE` entry, sorted."""
  unknown = [node for node in CORE if node not in seconds]
  if unknown:
    raise ValueError(f"CORE names tests the measured run does not have: {unknown}")
  whole = [entry if entry.endswith(".py") else entry + "[*]" for entry in WHOLE]
  single = sorted(node for node, s in seconds.items() if s >= threshold and node not in CORE
                  and not is_extended(node, whole))
  return whole + single


def read_list(path: str = LIST) -> List[str]:
  """The node ids listed in `path` (comments and blank lines skipped)."""
  with open(path, encoding="utf-8") as f:
    return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def write_list(entries: List[str], path: str = LIST) -> None:
  """Writes tests/extended.txt (to a temporary file, renamed into place)."""
  header = ("# The extended tests, written by `python -m tests.tiers` (tests/tiers.py says how):\n"
            "# a node id, a module (every test in it) or test[*] (every parametrization).\n")
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(header + "".join(entry + "\n" for entry in entries))
  os.replace(tmp, path)


def main(argv: List[str]) -> int:
  if not argv:
    print(__doc__)
    return 2
  seconds = durations(argv)
  entries = extended(seconds)
  write_list(entries)
  chosen = {node for node in seconds if is_extended(node, entries)}
  core = sum(s for node, s in seconds.items() if node not in chosen)
  print(f"{len(chosen)} extended tests of {len(seconds)} ({len(entries)} lines) written to "
        f"{LIST}; the core set measured {core:.0f} worker-seconds of {sum(seconds.values()):.0f}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
