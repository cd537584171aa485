"""Writes the generated parts of the manual: docs/api.md, the gin macro table of main_job.md,
the sentence on what `python -m specjax.main` runs with no flags (README.md, main_job.md) and
the JAX range (setup.py's) where README and the quickstart notebook name it; and,
asked, the README's first-run block from a real run of the main job.

  python docs/build.py           rewrite them from the docstrings and the gin files
  python docs/build.py --check   exit 1, naming the stale file, if one is out of date
  python docs/build.py --first_run [--dry_run]   run the job, rewrite (print) the first-run block

`tests/test_docs.py` runs the check, so a docstring or a macro that changes without the manual
fails the tests until this script is rerun. The first-run block holds `python -m specjax.main
--plain`'s output (the README's first command's job): its first `--keep` output lines, a "..."
line where the rest are cut, the trace and the summary unchanged, and a line naming the command,
the machine and the date. Run it on a quiet machine: the summary's timings are what it gave.
"""
import argparse
import dataclasses
import datetime
import importlib
import inspect
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's specjax, not another installed copy

API_PAGE = ROOT / "docs" / "api.md"
MAIN_JOB_PAGE = ROOT / "docs" / "main_job.md"
DECODE_GIN = ROOT / "gin" / "runs" / "decode.gin"
README = ROOT / "README.md"
NOTEBOOK = ROOT / "experiments" / "notebooks" / "quickstart.ipynb"
SETUP = ROOT / "setup.py"
JAX_RANGE_TEXT = re.compile(r"`jax>=[0-9.]+,<[0-9.]+`")
MACROS_START, MACROS_END = "<!-- gin-macros:start -->", "<!-- gin-macros:end -->"
DEFAULT_RUN_START, DEFAULT_RUN_END = "<!-- default-run:start -->", "<!-- default-run:end -->"
FIRST_RUN_START, FIRST_RUN_END = "<!-- first-run:start -->", "<!-- first-run:end -->"
FIRST_RUN_COMMAND = ["-m", "specjax.main", "--plain"]
TRACE_HEAD = "Figure-1 trace"

# The reference covers these subpackages' `__all__` (plus single names), in this order.
API_SECTIONS = (
    ("specjax.decode", "The decode loops", None),
    ("specjax.draft", "Drafters", None),
    ("specjax.verify", "Verifiers and Algorithm 1", None),
    ("specjax.sampling", "Sampling", ("Sampling",)),
    ("specjax.checkpoints", "T5X checkpoints", None),
    ("specjax.app.generate", "Strings in, texts out", None),
)

# What each macro of gin/runs/decode.gin means; a macro missing here still gets its row.
MACRO_MEANING = {
    "CHECKPOINT_PATH": "T5X infer.gin's name for `TARGET_CHECKPOINT` (bind either)",
    "TARGET_CHECKPOINT": "the target's T5X checkpoint (legacy or Orbax), `'bundled:NAME'`, or "
                         "None for random weights (smoke runs)",
    "DRAFT_CHECKPOINT": "the draft's checkpoint, as `TARGET_CHECKPOINT`",
    "TARGET_MODEL": "the target's model gin file (read under the scope `target/`)",
    "DRAFT_MODEL": "the draft's model gin file (read under the scope `draft/`), or a feature "
                   "head's (`decode_job.drafter = 'feature'`)",
    "GAMMA": "guesses per round (capped at MAX_NEW_TOKENS); under `'auto'` the largest γ the "
             "policy may pick",
    "GAMMA_POLICY": "`'auto'`, `'constant'`, `'heuristic'` or `'optimal'`",
    "AUTO_BUCKETS": "'auto' only: the γ of the wide rounds compiled beside γ = 0; `()` = 1, "
                    "2, 4, ... and GAMMA",
    "TREE": "None: a chain of `GAMMA` guesses; a token tree (`decoding/tree.gin`) has the draft "
            "guess a tree each round, verified in one target call ([trees.md](trees.md))",
    "COST_TABLE": "`'auto'`: a JSON cost table, reused if the file exists, else written",
    "MAX_NEW_TOKENS": "generation budget per input",
    "IGNORE_EOS": "True: every input decodes `MAX_NEW_TOKENS` tokens past its EOS (both decodes; "
                  "the texts still stop at EOS), a fixed workload per input; "
                  "`runs/bundled_lm_eagle.gin` sets it",
    "BATCH_SIZE": "decode slots the inputs stream through",
    "INFER_OUTPUT_DIR": "T5X infer.gin's name for `OUTPUT_DIR` (bind either)",
    "OUTPUT_DIR": "where `results.jsonl` and `summary.json` go; an earlier run's pair there is "
                  "moved to `earlier/` first ([Output](#output))",
    "VERIFIER": "None: block verification at T > 0 (exact), reference otherwise",
    "NUM_PARTITIONS": "devices per model replica (the `model` mesh axis)",
    "VOCABULARY": "the checkpoints' vocabulary (path, seqio vocabulary or `@Vocab()`)",
    "DRAFT_VOCABULARY": "the draft's vocabulary if it has its own; compared piece by piece",
    "MIXTURE_OR_TASK_NAME": "a seqio task or mixture to read inputs from (`'task:split'`)",
    "MIXTURE_OR_TASK_MODULE": "a module to import that registers that task",
    "TASK_FEATURE_LENGTHS": "`{'inputs': N, 'targets': M}`: input cut and generation budget",
    "WRITE_SCORES": "add the target's log-likelihood of each prediction to the records",
    "WEIGHTS_DTYPE": "`'bfloat16'` casts the target's dense kernels and embedding once",
    "DRAFT_WEIGHTS_DTYPE": "the same for the draft",
    "TIMING_REPEATS": "interleaved timed passes per decode; the summary reports medians",
    "NOTE": "a run file's word to its reader, printed as the run's first line (e.g. why its "
            "speedup is below 1); None: none",
}


def gin_macros(path=DECODE_GIN):
  """[(name, default text)] of the top-level `NAME = value` bindings of a gin file, in order."""
  macros = []
  for line in Path(path).read_text().splitlines():
    match = re.match(r"^([A-Z][A-Z0-9_]*)\s*=\s*(.+?)\s*(#.*)?$", line)
    if match:
      macros.append((match.group(1), match.group(2)))
  return macros


def default_run_values():
  """{macro: value} of the run `python -m specjax.main` makes with no flags, read by gin, plus
  'temperature' and 'num_examples' (the command's default count of task examples)."""
  import gin  # pylint: disable=import-outside-toplevel
  from specjax.app import gin_config  # pylint: disable=import-outside-toplevel
  from specjax.app.main import DEFAULT_GIN  # pylint: disable=import-outside-toplevel
  gin.clear_config()
  try:
    gin_config.parse([DEFAULT_GIN], [])
    values = {name: gin_config.query_macro(name) for name, _ in gin_macros()}
    values["DEFAULT_TASK"] = gin_config.query_macro("DEFAULT_TASK")
    values["temperature"] = gin.query_parameter("Sampling.temperature")
  finally:
    gin.clear_config()
  parser = importlib.import_module("specjax.app.cli").build_parser(None)
  values["num_examples"] = parser.get_default("num_examples")
  return values


def default_run_sentence():
  """What `python -m specjax.main` runs with no flags, as one sentence of the manual."""
  from specjax.app.main import DEFAULT_GIN  # pylint: disable=import-outside-toplevel
  v = default_run_values()
  target, draft = v["TARGET_CHECKPOINT"], v["DRAFT_CHECKPOINT"]
  pair = target.split(":", 1)[1].split("/")[0] if str(target).startswith("bundled:") else None
  models = (f"the bundled `{pair}` pair (`{target}`, `{draft}`)" if pair
            else f"the target `{target}` with the draft `{draft}`")
  sampling = "greedy" if v["temperature"] == 0 else f"sampled at temperature {v['temperature']}"
  return textwrap.fill(
      f"With no flags it runs `{DEFAULT_GIN}`: {models} on the first {v['num_examples']} "
          f"examples of the bundled `{v['DEFAULT_TASK']}` split, batch size {v['BATCH_SIZE']}, "
          f"{sampling}, up to {v['MAX_NEW_TOKENS']} new tokens, γ = {v['GAMMA']} under the "
          f"`{v['GAMMA_POLICY']}` policy, the target's weights in {v['WEIGHTS_DTYPE']} and the "
          f"draft's in {v['DRAFT_WEIGHTS_DTYPE']}, each decode timed {v['TIMING_REPEATS']} times.",
      width=96, break_long_words=False, break_on_hyphens=False)


def macro_table(path=DECODE_GIN):
  """The markdown table of every macro of `path` with its default, its value in the run with
  no flags where that differs, and its meaning."""
  no_flags = default_run_values()
  rows = ["| macro | default | with no flags | meaning |", "|---|---|---|---|"]
  for name, default in gin_macros(path):
    value = repr(no_flags[name])
    unbound = no_flags[name] is None and default == "%gin.REQUIRED"
    differs = f"`{value}`" if value != default and not unbound else ""
    default = "required" if default == "%gin.REQUIRED" else f"`{default}`"
    rows.append(f"| `{name}` | {default} | {differs} | {MACRO_MEANING.get(name, '')} |")
  return "\n".join(rows)


def _default_text(value):
  text = repr(value)
  if len(text) > 40:
    text = f"{type(value).__name__}(...)"
  return text


def _signature(name, obj):
  """`name(\n    param=default,\n ...)` with long defaults shortened."""
  try:
    sig = inspect.signature(obj)
  except (TypeError, ValueError):
    return None
  params, kw_marked = [], False
  for p in sig.parameters.values():
    if p.kind == p.KEYWORD_ONLY and not kw_marked:
      params.append("*")
      kw_marked = True
    if p.kind == p.VAR_POSITIONAL:
      kw_marked = True
      params.append(f"*{p.name}")
      continue
    if p.kind == p.VAR_KEYWORD:
      params.append(f"**{p.name}")
      continue
    text = p.name
    if p.default is not p.empty:
      text += f"={_default_text(p.default)}"
    params.append(text)
  if not params:
    return f"{name}()"
  return f"{name}(\n" + "".join(f"    {p},\n" for p in params) + ")"


def _fields(cls):
  """[(field, type, comment)] of a dataclass, the comments read from its source lines."""
  try:
    source = inspect.getsource(cls)
  except (OSError, TypeError):
    return []
  names = {f.name for f in dataclasses.fields(cls)}
  rows = []
  for line in source.splitlines():
    match = re.match(r"^  (\w+): ([^=#]+?)\s*(?:=[^#]*)?(?:#\s*(.*))?$", line)
    if match and match.group(1) in names:
      rows.append((match.group(1), match.group(2).strip(), (match.group(3) or "").strip()))
  return rows


def _entry(module_name, name, obj):
  lines = [f"### `{name}`", ""]
  kind = "class" if inspect.isclass(obj) else "function"
  lines.append(f"`{module_name}.{name}` ({kind}, defined in `{obj.__module__}`)")
  lines.append("")
  sig = _signature(name, obj)
  if sig and sig != f"{name}(\n    *args,\n    **kwargs,\n)":
    lines += ["```text", sig, "```", ""]
  doc = inspect.getdoc(obj) or ""
  if doc and not doc.startswith(f"{name}("):
    lines += [doc, ""]
  if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
    fields = _fields(obj)
    if fields:
      lines += ["| field | type | meaning |", "|---|---|---|"]
      lines += [f"| `{f}` | `{t}` | {c.replace('|', '/')} |" for f, t, c in fields]
      lines.append("")
    props = [(n, v) for n, v in vars(obj).items()
             if isinstance(v, property) and not n.startswith("_") and v.__doc__]
    for prop_name, prop in props:
      first = inspect.getdoc(prop).splitlines()[0]
      lines.append(f"- `.{prop_name}`: {first}")
    if props:
      lines.append("")
  if inspect.isclass(obj):
    methods = [(n, v) for n, v in vars(obj).items()
               if inspect.isfunction(v) and not n.startswith("_") and v.__doc__]
    for method_name, method in methods:
      params = ", ".join(p for p in inspect.signature(method).parameters if p != "self")
      first = inspect.getdoc(method).splitlines()[0]
      lines.append(f"- `.{method_name}({params})`: {first}")
    if methods:
      lines.append("")
  return lines


def _constant(module_name, name, value):
  return [f"### `{name}`", "", f"`{module_name}.{name}` = `{_default_text(value)}`", ""]


def api_page():
  """The text of docs/api.md, generated from the public names' signatures and docstrings."""
  lines = ["# API reference", "",
           "Generated by `python docs/build.py` from the docstrings; do not edit by hand",
           "(`tests/test_docs.py` fails when this page and the code disagree). Shapes are",
           "written `[B, L]` (batch, length); `V` is the vocabulary, `γ` the guesses per round.",
           "", "## Contents", ""]
  body = []
  for module_name, title, only in API_SECTIONS:
    module = importlib.import_module(module_name)
    names = only or module.__all__
    anchor = re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")
    lines.append(f"- [{title}](#{anchor}) (`{module_name}`)")
    body += [f"## {title}", ""]
    summary = (inspect.getdoc(module) or "").split("\n\n")[0]
    if summary and only is None:
      body += [summary, ""]
    for name in names:
      obj = getattr(module, name)
      if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isroutine(obj):
        body += _entry(module_name, name, obj)
      else:
        body += _constant(module_name, name, obj)
  return "\n".join(lines + [""] + body).rstrip() + "\n"


def _between(text, start_marker, end_marker, block):
  """`text` with what lies between the two markers replaced by `block`."""
  start, end = text.find(start_marker), text.find(end_marker)
  if start < 0 or end < start:
    raise ValueError(f"the page needs the markers {start_marker} and {end_marker}, in that order")
  return text[:start + len(start_marker)] + "\n" + block + "\n" + text[end:]


def main_job_page(text):
  """main_job.md's text with the macro table and the default run's sentence regenerated."""
  text = _between(text, MACROS_START, MACROS_END, macro_table())
  return _between(text, DEFAULT_RUN_START, DEFAULT_RUN_END, default_run_sentence())


def jax_range(setup=SETUP):
  """setup.py's JAX_RANGE (e.g. '>=0.10.0,<0.13')."""
  return re.search(r'^JAX_RANGE = "([^"]+)"', setup.read_text(), re.M).group(1)


def with_jax_range(text):
  """`text` with every `jax>=A,<B` naming setup.py's range."""
  return JAX_RANGE_TEXT.sub(f"`jax{jax_range()}`", text)


def readme_page(text):
  """README.md's text with the default run's sentence and the JAX range regenerated."""
  return with_jax_range(_between(text, DEFAULT_RUN_START, DEFAULT_RUN_END,
                                 default_run_sentence()))


def stale_pages():
  """{path: wanted text} for every generated page whose text on disk differs."""
  wanted = {API_PAGE: api_page(), MAIN_JOB_PAGE: main_job_page(MAIN_JOB_PAGE.read_text()),
            README: readme_page(README.read_text()),
            NOTEBOOK: with_jax_range(NOTEBOOK.read_text())}
  return {p: t for p, t in wanted.items() if not p.exists() or p.read_text() != t}


def write_atomic(path, text):
  """Writes beside `path` under a temporary name, then renames into place."""
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def cut_outputs(stdout, keep):
  """The job's stdout with the outputs before the trace cut to `keep` lines and a '...' line."""
  lines = stdout.rstrip("\n").splitlines()
  at = next((i for i, line in enumerate(lines) if line.startswith(TRACE_HEAD)), None)
  if at is None:
    raise ValueError(f"the job's output has no line starting {TRACE_HEAD!r}; is it the main job?")
  outputs, rest = lines[:at], lines[at:]
  if len(outputs) > keep:
    outputs = outputs[:keep] + ["..."]
  return "\n".join(outputs + rest)


def first_run_block(stdout, keep, date=None):
  """The markdown between the first-run markers: the cut output in a text fence, then the
  command and the date (UTC), and the machine (`specjax.machine.describe`)."""
  from specjax import machine  # pylint: disable=import-outside-toplevel
  date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
  return (f"```text\n{cut_outputs(stdout, keep)}\n```\n\n"
          f"`python {' '.join(FIRST_RUN_COMMAND)}`, {date},\non {machine.describe()}.")


def run_main_job(timeout_s):
  """stdout of the main job, run from an empty folder with this checkout first on the path."""
  env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  with tempfile.TemporaryDirectory() as cwd:
    result = subprocess.run([sys.executable] + FIRST_RUN_COMMAND, cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=timeout_s)
  if result.returncode != 0:
    raise RuntimeError(f"the main job failed ({result.returncode}):\n{result.stderr[-2000:]}")
  return result.stdout


def first_run(keep, timeout_s, dry_run):
  """Runs the main job and rewrites README.md's first-run block (prints it under dry_run)."""
  text = README.read_text()
  _between(text, FIRST_RUN_START, FIRST_RUN_END, "")  # the markers exist before the job runs
  block = first_run_block(run_main_job(timeout_s), keep)
  if dry_run:
    print(block)
  else:
    write_atomic(README, _between(text, FIRST_RUN_START, FIRST_RUN_END, block))
    print(f"rewrote the first-run block of {README.relative_to(ROOT)}")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="only report stale pages")
  parser.add_argument("--first_run", action="store_true",
                      help="run the main job and rewrite the README's first-run block")
  parser.add_argument("--dry_run", action="store_true", help="--first_run: print the block")
  parser.add_argument("--keep", type=int, default=8, help="--first_run: output lines kept")
  parser.add_argument("--timeout_s", type=int, default=1800, help="--first_run: job timeout")
  args = parser.parse_args(argv)
  if args.keep < 0:
    parser.error(f"--keep must be >= 0, got {args.keep}")
  if args.first_run:
    first_run(args.keep, args.timeout_s, args.dry_run)
    return 0
  stale = stale_pages()
  for path, text in stale.items():
    if args.check:
      print(f"{path.relative_to(ROOT)} is out of date: run python docs/build.py")
    else:
      write_atomic(path, text)
      print(f"wrote {path.relative_to(ROOT)}")
  return 1 if (args.check and stale) else 0


if __name__ == "__main__":
  sys.exit(main())
