"""The manual cannot rot: its snippets run, its generated pages match the code, its rules hold.

- every ```python block of README.md and docs/*.md runs in a fresh subprocess (unless the line
  before it is `<!-- no-run -->`), and every `python -m specjax` / `specjax ` line of a ```bash
  block marked `<!-- fast -->` runs too, each with a timeout, from an empty folder;
- a page's recipe runs as written, in one empty folder, in page order: each block marked
  `<!-- file: PATH -->` is written to PATH and each ```bash block marked `<!-- recipe -->`
  runs whole (`set -euo pipefail`), so the files and commands a reader copies work together;
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


RECIPE = "<!-- recipe -->"
FILE_MARKER = re.compile(r"^<!-- file: (\S+) -->$")
RECIPE_TIMEOUT_S = 900


def recipe_steps(text):
  """[(kind, path, text)] of a page's recipe, in page order: ('file', PATH, content) for a
  block marked `<!-- file: PATH -->`, ('bash', None, script) for a ```bash block marked
  `<!-- recipe -->`."""
  steps = []
  for language, _, code, marker in code_blocks(text):
    file_marker = FILE_MARKER.match(marker)
    if file_marker:
      steps.append(("file", file_marker.group(1), code + "\n"))
    elif marker == RECIPE and language == "bash":
      steps.append(("bash", None, code))
  return steps


def run_recipe(steps, cwd, timeout=RECIPE_TIMEOUT_S):
  """Writes the recipe's files and runs its scripts in `cwd`, in order; `python` is this
  interpreter and `specjax` this checkout's command. The failing step's result, else None."""
  env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  prelude = (f"set -euo pipefail\npython() {{ {sys.executable} \"$@\"; }}\n"
             "specjax() { python -m specjax.main \"$@\"; }\n")
  for kind, path, text in steps:
    if kind == "file":
      (cwd / path).parent.mkdir(parents=True, exist_ok=True)
      (cwd / path).write_text(text)
      continue
    result = subprocess.run(["bash", "-c", prelude + text], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
      return result
  return None


RECIPE_PAGES = [p for p in PAGES if recipe_steps(p.read_text())]


@pytest.mark.e2e
@pytest.mark.parametrize("page", RECIPE_PAGES, ids=lambda p: p.name)
def test_recipe_runs_as_written(page, tmp_path):
  failed = run_recipe(recipe_steps(page.read_text()), tmp_path)
  assert failed is None, _failure(failed)


def test_a_recipe_is_its_files_and_scripts_in_order(tmp_path):
  """The recipe runner is not a no-op: files land where marked, scripts see them, and a failing
  step fails the run."""
  page = ("<!-- file: conf/a.gin -->\n```\nX = 1\n```\n\n<!-- recipe -->\n```bash\n"
          "grep -q 'X = 1' conf/a.gin\npython -c 'print(2)' > two.txt\n```\n\n"
          "```bash\nexit 3\n```\n")
  steps = recipe_steps(page)
  assert [(k, p) for k, p, _ in steps] == [("file", "conf/a.gin"), ("bash", None)]
  assert run_recipe(steps, tmp_path, timeout=60) is None
  assert (tmp_path / "two.txt").read_text() == "2\n"
  failed = run_recipe([*steps, ("bash", None, "false\necho not reached > late.txt")], tmp_path,
                      timeout=60)
  assert failed is not None and failed.returncode != 0 and not (tmp_path / "late.txt").exists()
  assert RECIPE_PAGES  # the manual has a recipe to run


def _failure(result):
  return f"exit status {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.mark.e2e
@pytest.mark.parametrize("kind,code", [s[1:] for s in snippets()], ids=[s[0] for s in snippets()])
def test_snippet_runs(kind, code, tmp_path):
  result = run_snippet(kind, code, tmp_path)
  assert result.returncode == 0, _failure(result)


@pytest.mark.e2e
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


def _build():
  """docs/build.py as a module."""
  spec = importlib.util.spec_from_file_location("specjax_docs_build", ROOT / "docs" / "build.py")
  build = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(build)
  return build


def test_generated_pages_are_current():
  stale = _build().stale_pages()
  assert not stale, f"{sorted(str(p) for p in stale)} out of date: run python docs/build.py"


def test_every_macro_has_a_meaning():
  build = _build()
  names = [name for name, _ in build.gin_macros()]
  assert set(build.MACRO_MEANING) == set(names), set(build.MACRO_MEANING) ^ set(names)
  assert all(build.MACRO_MEANING[n].strip() for n in names)


README_TEST_COMMAND = ("pip install -e '.[test,seqio,experiments,hf]' \\\n"
                       "  && python -m pytest -q -n 2 --dist loadfile -m \"not e2e and not extended\" "
                       "tests \\\n"
                       "  && python -m pytest -q -n 2 --dist loadfile -m \"e2e and not extended\" tests")
EXTENDED_TEST_COMMAND = ("python -m pytest -q -n 2 --dist loadfile -m \"extended and not e2e\" tests \\\n"
                         "  && python -m pytest -q -n 2 --dist loadfile -m \"extended and e2e\" tests")


def test_ci_runs_the_readme_test_command_and_it_covers_every_test():
  """`.ci/run` runs the README's command (the core set) and then the extended set; the four
  parts select complementary sets (every test runs), and the markers they split on are
  registered."""
  ci = (ROOT / ".ci" / "run").read_text()
  assert README_TEST_COMMAND in ci and EXTENDED_TEST_COMMAND in ci
  assert ci.index(README_TEST_COMMAND) < ci.index(EXTENDED_TEST_COMMAND)
  assert EXTENDED_TEST_COMMAND in (ROOT / "README.md").read_text()
  parts = re.findall(r'-m "([^"]+)" tests', README_TEST_COMMAND + EXTENDED_TEST_COMMAND)
  assert parts == ["not e2e and not extended", "e2e and not extended", "extended and not e2e",
                   "extended and e2e"], parts
  for e2e in (False, True):  # each test, whatever its marks, runs in exactly one part
    for extended in (False, True):
      chosen = [p for p in parts if eval(p, {}, {"e2e": e2e, "extended": extended})]  # pylint: disable=eval-used
      assert len(chosen) == 1, (e2e, extended, chosen)
  ini = (ROOT / "pytest.ini").read_text()
  assert re.search(r"^markers\s*=\s*\n(\s+\w+:.*\n)*?\s+e2e:", ini, re.M)
  assert re.search(r"^\s+extended:", ini, re.M)


def _readme_sections_named(text):
  """The README sections a text sends its reader to: `README, "Title"` / `README's "Title"`."""
  return re.findall(r"README(?:'s)?,? \"([^\"]+)\"", text)


def test_the_code_names_only_readme_sections_that_exist():
  headings = {l.lstrip("#").strip() for l in (ROOT / "README.md").read_text().splitlines()
              if re.match(r"^#{1,6} ", l)}
  named = [(p.relative_to(ROOT), s) for p in sorted((ROOT / "specjax").rglob("*.py"))
           for s in _readme_sections_named(p.read_text())]
  assert named, "the check found no reference to check"
  assert all(s in headings for _, s in named), [n for n in named if n[1] not in headings]
  assert _readme_sections_named('(see README, "Use your own T5X checkpoints")') == [
      "Use your own T5X checkpoints"]  # the form --help used when it named a missing section


def _command_before_sample(text):
  """(the last specjax command named in the paragraph before the first-run block, the command
  in the block's caption)."""
  before = text[:text.index("<!-- first-run:start -->")].rstrip().split("\n\n")[-1]
  named = re.findall(r"`(python -m specjax\.main[^`]*)`", before)
  block = text[text.index("<!-- first-run:start -->"):text.index("<!-- first-run:end -->")]
  caption = re.findall(r"^`(python -m specjax\.main[^`]*)`", block, re.M)
  return (named[-1] if named else None), (caption[-1] if caption else None)


def test_the_sample_output_is_the_output_of_the_command_named_before_it():
  named, caption = _command_before_sample((ROOT / "README.md").read_text())
  assert caption and named == caption, (named, caption)
  wrong = ("is one flag away:\n`python -m specjax.main --gin_file=runs/bundled_translate.gin`. "
           "Its output with `--plain`:\n\n<!-- first-run:start -->\n```text\n```\n\n"
           "`python -m specjax.main --plain`, 2026-11-26.\n<!-- first-run:end -->\n")
  named, caption = _command_before_sample(wrong)
  assert named != caption


def summary_values(block):
  """{metric: value} of the summary table in a sample output (rich's box drawing)."""
  rows = re.findall(r"^│ (\w+)\s+│\s+(.*?) │$", block, re.M)
  return {name: value for name, value in rows}


def test_the_sample_speedup_is_the_ratio_of_its_printed_milliseconds():
  """A reader who divides the sample's printed ms per token gets its printed speedup (to the
  printed digits), and the speedup lies inside its printed range."""
  text = (ROOT / "README.md").read_text()
  values = summary_values(text[text.index("<!-- first-run:start -->"):
                               text.index("<!-- first-run:end -->")])
  ratio = (float(values["autoregressive_ms_per_token"])
           / float(values["speculative_ms_per_token"]))
  speedup = float(values["speedup"])
  assert abs(ratio - speedup) <= 0.006 * speedup + 0.005, (ratio, speedup)
  low, high = map(float, values["speedup_range"].split("-"))
  assert low <= speedup <= high
  # The sample this check was written against: 7.44 / 4.74 = 1.57, printed as 1.67.
  wrong = {"autoregressive_ms_per_token": 7.44, "speculative_ms_per_token": 4.74, "speedup": 1.67}
  assert abs(wrong["autoregressive_ms_per_token"] / wrong["speculative_ms_per_token"]
             - wrong["speedup"]) > 0.006 * wrong["speedup"] + 0.005


PAIR_WORDS = {"lm": ("LM pair", "decoder-only LM pair"),
              "translate": ("EN→DE", "EN->DE", "translation pair")}
"""Words that name a bundled pair in the manual."""
DEFAULT_CLAIM = re.compile(r"main job's (?:\S+ )?default|with no flags|bundled default", re.I)


def wrong_default_claims(text, pair, policy):
  """Sentences of `text` that say the run with no flags uses another pair than `pair`, or call
  another γ policy than `policy` the main job's default."""
  found = []
  for sentence in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text)):
    if not DEFAULT_CLAIM.search(sentence):
      continue
    others = [w for p, words in PAIR_WORDS.items() if p != pair for w in words]
    if any(w in sentence for w in others) and "--gin_file=" not in sentence:
      found.append(sentence)
    claimed = re.findall(r"`'?(constant|heuristic|optimal|auto)'?`[^`]*?main job's default",
                         sentence)
    if any(c != policy for c in claimed):
      found.append(sentence)
  return found


def test_no_page_misstates_the_run_with_no_flags():
  values = _build().default_run_values()
  pair = values["TARGET_CHECKPOINT"].split(":")[1].split("/")[0]
  policy = values["GAMMA_POLICY"]
  for page in PAGES:
    assert not wrong_default_claims(page.read_text(), pair, policy), page.name
  # The mistakes this catches, as the manual once made them (the run with no flags: LM pair,
  # 'constant'):
  for wrong in ["With no flags it runs the bundled EN→DE pair (`gin/runs/default.gin`).",
                "the main job's default (`gin/runs/default.gin`) is the translation pair.",
                "This is what the main job's EN→DE default does.",
                "`auto` (γ from measured costs; the main job's default)"]:
    assert wrong_default_claims(wrong, "lm", "constant"), wrong


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
  head = "\n".join(lines[:25])
  assert "pip install -e . && python -m specjax.main\n" in head
  assert f"{README_TEST_COMMAND}\n" in head
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
  """docs/build.py's first-run block on a made-up job output: outputs cut, trace and summary
  kept, put between the README's markers."""
  build = _build()
  stdout = "".join(f"> in {i}\n  out {i}\n" for i in range(6)) + \
      "Figure-1 trace of the first example\n[+a +]\nspecjax summary\n| speedup | 1.0 |\n"
  block = build.first_run_block(stdout, keep=4, date="2026-01-02")
  assert "> in 1\n  out 1\n...\nFigure-1 trace" in block and "> in 2" not in block
  assert "| speedup | 1.0 |\n```" in block and "2026-01-02" in block
  start, end = build.FIRST_RUN_START, build.FIRST_RUN_END
  new = build._between(f"top\n{start}\nold\n{end}\nbottom\n", start, end, block)
  assert "old" not in new and new.startswith("top\n") and new.endswith(f"{end}\nbottom\n")
  readme = (ROOT / "README.md").read_text()
  assert start in readme and end in readme
  with pytest.raises(ValueError, match="markers"):
    build._between("no markers here", start, end, block)
  with pytest.raises(ValueError, match="Figure-1 trace"):
    build.cut_outputs("> a\n  b\n", keep=1)
