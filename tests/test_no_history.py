"""The project speaks of itself only: no tracked file cites a tracker's numbers or tells its own
work history by sessions (the flagged examples below are put together at run time, so that
this file passes its own scan).

History lives in git and CHANGELOG.md, which names what changed without tracker numbers. The
patterns are tight on purpose: the bundled corpora's "login session", pytest's
`scope="session"` and a markdown heading's `#` stay legal (the second test holds both sides).
"""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HISTORY = re.compile(
    r"\bissues?[ -]*#?\d+\b"                       # the word, then a number
    r"|\(#\d+\)"                                   # a bare number in parentheses
    r"|\b(?:PR|pull request) *#?\d+\b"             # a pull request's number
    r"|\b(?:first|second|third|fourth|fifth|this|previous|earlier|later|next|last|another"
    r"|each|every) sessions?\b"                    # an ordinal before the word
    r"|\bsessions? \d+\b"                          # the word, then a number
    r"|\b(?:helper|agent)s?'? sessions?\b",        # who worked in it
    re.IGNORECASE)


def tracked_files():
  """The repository's tracked files (`git ls-files`); outside a git checkout, every file
  under the root but hidden folders and caches."""
  try:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                         timeout=60).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]
  except (OSError, subprocess.CalledProcessError):
    return [p for p in ROOT.rglob("*") if p.is_file() and not any(
        part.startswith(".") or part == "__pycache__" for part in p.relative_to(ROOT).parts)]


def history_hits(text):
  """[(line number, matched text)] of the history wording in `text`."""
  return [(i + 1, m.group(0)) for i, line in enumerate(text.splitlines())
          for m in HISTORY.finditer(line)]


def test_no_tracked_file_tells_work_history():
  files = tracked_files()
  assert len(files) > 100, "the file listing found too little to be the repository"
  hits = []
  for path in files:
    if not path.is_file():  # deleted in the work tree
      continue
    data = path.read_bytes()
    if b"\0" in data[:8192]:  # binary: images, checkpoints
      continue
    hits += [f"{path.relative_to(ROOT)}:{n}: {m!r}"
             for n, m in history_hits(data.decode("utf-8", "replace"))]
  assert not hits, "work history in the tree (move it to CHANGELOG.md, without numbers):\n" + \
      "\n".join(hits)


def test_the_pattern_catches_history_and_spares_content():
  word, number, sess = "issue", "#17", "session"
  flagged = [f"# The LM draft ({word} {number}): the shipped draft",
             f'"""{word.title()} #16 siblings',
             "fixed in (" + "#41)", f"#   2026-11-24  (third {sess}) shipped", "see PR" + " 12",
             f"written in a later {sess}", f"a helper {sess} wrote it", f"{sess} 4 measured"]
  spared = ['@pytest.fixture(scope="session")', "the end the session and logout the user",
            "Dancer::Session::Memcached implements a session engine", "## 2026-11-26",
            "one tiny pair per test session", "| 1 | 1.96× | 11-23 |", "see #anchor",
            "tissue 3 layers", "an issue with the cache"]
  assert all(history_hits(line) for line in flagged), [l for l in flagged if not history_hits(l)]
  assert not any(history_hits(line) for line in spared), [l for l in spared if history_hits(l)]
