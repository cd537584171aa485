"""The manual cannot rot: its snippets run, its generated pages match the code, its rules hold.

- every ```python block of README.md and docs/*.md runs in a fresh subprocess (unless the line
  before it is `<!-- no-run -->`), and every `python -m specjax` / `specjax ` line of a ```bash
  block marked `<!-- fast -->` runs too, each with a timeout, from an empty folder;
- docs/api.md and the gin macro table of docs/main_job.md equal what `docs/build.py` writes;
- every class and function a subpackage exports in `__all__` has a docstring;
- README.md: at most 400 lines, a table of contents, lines of at most 100 characters; README,
  CHANGELOG and docs carry no work-process words and no broken relative links.
"""
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
SNIPPET_TIMEOUT_S = 240
NO_RUN, FAST = "<!-- no-run -->", "<!-- fast -->"
# Pages the manual links to that are written beside it (token trees, multi-process runs): a link
# to one of them may precede the page itself.
WRITTEN_BESIDE = {"trees.md", "distributed.md"}


def code_blocks(text):
  """[(language, first line number, code, marker)] of the fenced blocks of a markdown text.

  `marker` is the last non-blank line before the opening fence (an HTML comment or prose).
  """
  blocks, lines, i = [], text.splitlines(), 0
  while i < len(lines):
    match = re.match(r"^```(\w*)\s*$", lines[i])
    if not match:
      i += 1
      continue
    before = [l.strip() for l in lines[:i] if l.strip()]
    marker = before[-1] if before else ""
    end = i + 1
    while end < len(lines) and not lines[end].startswith("```"):
      end += 1
    blocks.append((match.group(1), i + 1, "\n".join(lines[i + 1:end]), marker))
    i = end + 1
  return blocks


def snippets(pages=PAGES):
  """[(id, kind, code)]: the python blocks to run and the fast specjax command lines."""
  found = []
  for page in pages:
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
    for language, line, code, marker in code_blocks(page.read_text()):
      if language == "python" and marker != NO_RUN:
        found.append((f"{name}:{line}", "python", code))
      elif language == "bash" and marker == FAST:
        for offset, command in enumerate(code.splitlines()):
          if command.startswith(("python -m specjax", "specjax ")):
            found.append((f"{name}:{line + 1 + offset}", "bash", command))
  return found


def run_snippet(kind, code, cwd, timeout=SNIPPET_TIMEOUT_S):
  """Runs one snippet in a fresh process with this checkout first on the path."""
  env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  if kind == "python":
    argv = [sys.executable, "-c", code]
  else:
    # `specjax ...` is the installed console command; run this checkout's module instead.
    if code.startswith("specjax "):
      code = f"{sys.executable} -m specjax.main " + code[len("specjax "):]
    else:
      code = sys.executable + code[len("python"):]
    argv = ["bash", "-c", code]
  return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _failure(result):
  return f"exit status {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.mark.parametrize("kind,code", [s[1:] for s in snippets()], ids=[s[0] for s in snippets()])
def test_snippet_runs(kind, code, tmp_path):
  result = run_snippet(kind, code, tmp_path)
  assert result.returncode == 0, _failure(result)


def test_a_broken_snippet_fails(tmp_path):
  """The runner is not a no-op: a page with one broken snippet yields a failing run."""
  page = tmp_path / "page.md"
  page.write_text("```python\nprint('fine')\n```\n\n<!-- no-run -->\n```python\nraise SystemExit(3)"
                  "\n```\n\n<!-- fast -->\n```bash\npython -m specjax.main --no_such_flag\n```\n")
  found = snippets([page])
  assert [(i, k) for i, k, _ in found] == [("page.md:1", "python"), ("page.md:12", "bash")]
  assert run_snippet("python", found[0][2], tmp_path).returncode == 0
  assert run_snippet("python", "import specjax\nspecjax.no_such_name", tmp_path).returncode != 0
  assert run_snippet("bash", found[1][2], tmp_path, timeout=120).returncode != 0


def test_generated_pages_are_current():
  spec = importlib.util.spec_from_file_location("specjax_docs_build", ROOT / "docs" / "build.py")
  build = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(build)
  stale = build.stale_pages()
  assert not stale, f"{sorted(str(p) for p in stale)} out of date: run python docs/build.py"


def test_main_job_page_lists_every_macro():
  text = (ROOT / "docs" / "main_job.md").read_text()
  for line in (ROOT / "gin" / "runs" / "decode.gin").read_text().splitlines():
    match = re.match(r"^([A-Z][A-Z0-9_]*)\s*=", line)
    if match:
      assert f"| `{match.group(1)}` |" in text, match.group(1)


def _exported():
  import specjax  # pylint: disable=import-outside-toplevel
  names = []
  for info in pkgutil.iter_modules(specjax.__path__):
    if not info.ispkg:
      continue
    module = importlib.import_module(f"specjax.{info.name}")
    names += [(module.__name__, n, getattr(module, n)) for n in getattr(module, "__all__", [])]
  return names


def test_every_exported_class_and_function_has_a_docstring():
  """Constants and type aliases carry a comment beside them instead (they hold no docstring)."""
  missing = []
  for module, name, obj in _exported():
    if not (inspect.isclass(obj) or inspect.isroutine(obj)):
      continue
    doc = (obj.__doc__ or "").strip()
    if not doc or doc.startswith(f"{name}("):  # a dataclass's generated signature is no doc
      missing.append(f"{module}.{name}")
  assert not missing, f"no docstring: {missing}"


def test_readme_shape():
  lines = (ROOT / "README.md").read_text().splitlines()
  assert len(lines) <= 400, len(lines)
  assert any(l.strip().lower() == "## contents" for l in lines[:40]), "no table of contents"
  long_lines = [i + 1 for i, l in enumerate(lines) if len(l) > 100]
  assert not long_lines, f"README.md lines over 100 characters: {long_lines}"
  head = "\n".join(lines[:20])
  assert "pip install -e . && python -m specjax.main\n" in head
  assert "pip install -e '.[test,seqio,experiments,hf]' && python -m pytest -q -n 2 --dist " \
         "loadfile tests\n" in head
  text = "\n".join(lines)
  assert "<!-- first-run:start -->" in text and "<!-- first-run:end -->" in text


PROCESS_WORDS = re.compile(r"\bsessions?\b|(?<![\w&/])#\d+\b|\bissues?\b|\basked:", re.I)


@pytest.mark.parametrize("page", PAGES + [ROOT / "CHANGELOG.md"], ids=lambda p: p.name)
def test_no_process_talk_and_no_broken_links(page):
  text = page.read_text()
  hits = [(i + 1, m.group(0)) for i, line in enumerate(text.splitlines())
          for m in PROCESS_WORDS.finditer(line)]
  assert not hits, f"{page.name}: work-process words at {hits}"
  for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
    if "://" in target or Path(target).name in WRITTEN_BESIDE:
      continue
    path = page.parent / target if target else page
    assert path.exists(), f"{page.name}: broken link {target}"
    if anchor and path.suffix == ".md":
      assert anchor in heading_anchors(path.read_text()), f"{page.name}: no #{anchor} in {path.name}"


def heading_anchors(text):
  """The anchors GitHub gives a markdown text's headings (lower case, punctuation dropped)."""
  headings = [l.lstrip("#").strip() for l in text.splitlines() if re.match(r"^#{1,6} ", l)]
  return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_first_run_block_is_rewritten_between_the_markers():
  """readme_first_run's block on a made-up job output: outputs cut, trace and summary kept."""
  sys.path.insert(0, str(ROOT))
  try:
    first_run = importlib.import_module("experiments.readme_first_run")
  finally:
    sys.path.remove(str(ROOT))
  stdout = "".join(f"> in {i}\n  out {i}\n" for i in range(6)) + \
      "Figure-1 trace of the first example\n[+a +]\nspecjax summary\n| speedup | 1.0 |\n"
  block = first_run.block(stdout, keep=4, date="2026-01-02")
  assert "> in 1\n  out 1\n...\nFigure-1 trace" in block and "> in 2" not in block
  assert "| speedup | 1.0 |\n```" in block and "2026-01-02" in block
  text = f"top\n{first_run.START}\nold\n{first_run.END}\nbottom\n"
  new = first_run.replace_block(text, block)
  assert "old" not in new and new.startswith("top\n") and new.endswith(f"{first_run.END}\nbottom\n")
  with pytest.raises(ValueError, match="markers"):
    first_run.replace_block("no markers here", block)
  with pytest.raises(ValueError, match="Figure-1 trace"):
    first_run.cut_outputs("> a\n  b\n", keep=1)
