"""The package layout: no import cycles, private modules stay private, the wheel is complete."""
import ast
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specjax"


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
  return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: pathlib.Path, name: str, known):
  """Every specjax module `path` imports (anywhere in the file, lazy imports included)."""
  out = set()
  package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names if a.name.startswith("specjax")}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] +
                        ([base] if base else []))
      if not base.startswith("specjax"):
        continue
      if not (name + ".").startswith(base + "."):  # an ancestor package is initialized first
        out.add(base)
      out |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}
  return {m for m in out if m in known}


def test_no_import_cycles():
  known = _modules()
  graph = {name: _imports(path, name, known) - {name} for name, path in known.items()}
  # Tarjan's strongly connected components: any component of size > 1 is a cycle.
  index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        cycles.append(sorted(comp))

  sys.setrecursionlimit(10000)
  for v in graph:
    if v not in index:
      visit(v)
  assert not cycles, f"import cycles: {cycles}"


def test_private_modules_stay_in_their_subpackage():
  known = _modules()
  offenders = []
  for name, path in known.items():
    for target in _imports(path, name, known):
      parts = target.split(".")
      private = [i for i, p in enumerate(parts) if p.startswith("_")]
      if private and not name.startswith(".".join(parts[:private[0]]) + "."):
        offenders.append((name, target))
  assert not offenders, f"modules importing another subpackage's private module: {offenders}"


ENTRY_SCRIPTS = {"specjax.main", "specjax.train.__main__", "specjax.aot.__main__"}
"""Commands kept at their documented paths (`python -m specjax.main`, `python -m
specjax.train`): each only hands over to the application layer."""


def test_only_the_application_layer_imports_it():
  known = _modules()
  offenders = sorted(
      (name, target) for name, path in known.items()
      if not (name == "specjax.app" or name.startswith("specjax.app.")) and name not in ENTRY_SCRIPTS
      for target in _imports(path, name, known)
      if target == "specjax.app" or target.startswith("specjax.app."))
  assert not offenders, f"modules below the application layer importing it: {offenders}"


def test_entry_scripts_only_hand_over():
  for name in ENTRY_SCRIPTS:
    path = _modules()[name]
    assert len(path.read_text().splitlines()) <= 12, f"{name} should only call specjax.app"


def test_no_function_over_80_lines():
  long = []
  for path in PACKAGE.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > 80:
          long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
  assert not long, f"functions over 80 lines: {long}"


def test_cycle_check_sees_a_cycle(tmp_path):
  """The checker itself sees both sides of a cycle, the lazy (in-function) import included."""
  pkg = tmp_path / "specjax"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "a.py").write_text("from specjax import b\n")
  (pkg / "b.py").write_text("def f():\n  from specjax.a import x\n")
  known = {"specjax": pkg / "__init__.py", "specjax.a": pkg / "a.py", "specjax.b": pkg / "b.py"}
  global ROOT  # pylint: disable=global-statement
  saved, ROOT = ROOT, tmp_path
  try:
    assert _imports(pkg / "a.py", "specjax.a", known) == {"specjax.b"}
    assert _imports(pkg / "b.py", "specjax.b", known) == {"specjax.a"}
  finally:
    ROOT = saved


def _named_settings(node) -> bool:
  name = (node.id if isinstance(node, ast.Name)
          else node.attr if isinstance(node, ast.Attribute) else "")
  return "settings" in name.lower()


def _untyped_settings(source: str):
  """Lines of `source` that pack locals() (or vars()) into a dict, build a dict named
  *settings* (a variable, attribute or keyword argument), or read a *settings* object by a
  string key (`s["gamma"]`, `s.get("gamma")`)."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and (node.func.id == "locals" or (node.func.id == "vars" and not node.args))):
      found.append(node.lineno)
    elif (isinstance(node, ast.Subscript) and _named_settings(node.value)
          and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
      found.append(node.lineno)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == "get" and _named_settings(node.func.value)):
      found.append(node.lineno)
    elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.keyword)):
      targets = (node.targets if isinstance(node, ast.Assign) else
                 [node.target] if isinstance(node, ast.AnnAssign) else [ast.Name(node.arg or "")])
      value = node.value
      is_dict = isinstance(value, (ast.Dict, ast.DictComp)) or (
          isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
          and value.func.id == "dict")
      if is_dict and any(_named_settings(t) for t in targets):
        found.append(value.lineno)
  return sorted(set(found))


def test_app_settings_are_typed_fields():
  """The main job's settings travel as typed fields (`specjax.app.settings.JobSettings`):
  no locals() packed into a dict, no settings read back by string keys."""
  offenders = {str(path.relative_to(ROOT)): lines
               for path in sorted((PACKAGE / "app").rglob("*.py"))
               if (lines := _untyped_settings(path.read_text()))}
  assert not offenders, f"untyped settings (file: lines): {offenders}"


def test_untyped_settings_check_sees_every_form():
  source = ("def f(a, b):\n  settings = {k: v for k, v in locals().items()}\n"
            "  x = plan.settings['gamma']\n  y = settings.get('tree')\n"
            "  self.settings = dict(a=a)\n  job_settings: dict = {'a': a}\n  z = vars()\n"
            "  ok = plan.settings.gamma + vars(plan)['x'] + table['gamma']\n"
            "  return Plan(settings=dict(a, b=b))\n")
  assert _untyped_settings(source) == [2, 3, 4, 5, 6, 7, 9]


@pytest.fixture(scope="module")
def wheel_file(tmp_path_factory):
  # Built from a fresh copy of the sources: a build/ folder left in the checkout by an earlier
  # build would otherwise lend the wheel files that the packaging itself leaves out.
  out, source = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source")
  for name in ("setup.py", "README.md", "MANIFEST.in"):
    if (ROOT / name).is_file():
      shutil.copy(ROOT / name, source / name)
  for name in ("specjax", "gin"):
    shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "-q", "-w", str(out), str(source)], check=True, capture_output=True,
                 timeout=600, cwd=str(source))
  (path,) = out.glob("specjax-*.whl")
  return path


@pytest.fixture(scope="module")
def wheel(wheel_file):
  with zipfile.ZipFile(wheel_file) as z:
    return z.namelist()


@pytest.mark.e2e
def test_wheel_ships_gin_files_inside_the_package(wheel):
  gin_files = {n for n in wheel if n.startswith("specjax/gin/") and n.endswith(".gin")}
  for name in ("specjax/gin/runs/default.gin", "specjax/gin/models/t5_1_1_xxl.gin",
               "specjax/gin/decoding/greedy.gin"):
    assert name in gin_files
  assert len(gin_files) == sum(1 for _ in (ROOT / "gin").rglob("*.gin"))


@pytest.mark.e2e
def test_wheel_has_no_top_level_experiments_package(wheel):
  tops = {n.split("/")[0] for n in wheel}
  assert "experiments" not in tops
  assert "specjax" in tops
  assert "specjax/assets/spm/specjax_8k.model" in wheel


def test_wheel_ships_every_asset_file_dotfiles_included(wheel):
  # Each array of a bundled T5X checkpoint keeps its zarr metadata in a `.zarray` dotfile; a
  # wheel without them fails T5X's loader (NOT_FOUND .zarray) on the installed checkpoints.
  source = {p.relative_to(ROOT).as_posix() for p in (PACKAGE / "assets").rglob("*") if p.is_file()}
  assert any(name.endswith("/.zarray") for name in source)
  assert source - set(wheel) == set()


def test_wheel_checkpoint_arrays_open_as_zarr(wheel_file, wheel, tmp_path):
  # Read one bundled array back from the wheel's files the way T5X does: a zarr driver on a file
  # kvstore, which needs the array's .zarray beside its chunks.
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorstore as ts  # pylint: disable=import-outside-toplevel
  zarray = sorted(n for n in wheel if n.startswith("specjax/assets/pairs/lm/target/")
                  and n.endswith("/.zarray"))[0]
  folder = zarray[:-len("/.zarray")]
  with zipfile.ZipFile(wheel_file) as z:
    z.extractall(tmp_path, [n for n in wheel if n.startswith(folder + "/")])
  array = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(tmp_path / folder)}},
                  open=True).result().read().result()
  source = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(ROOT / folder)}},
                   open=True).result().read().result()
  np.testing.assert_array_equal(np.asarray(array), np.asarray(source))


def _experiment_imports(path: pathlib.Path):
  """The experiments.* modules a file imports (anywhere in it, lazy imports included)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names if a.name.startswith("experiments.")}
    elif isinstance(node, ast.ImportFrom):
      # `from . import x` / `from .x import y` inside experiments/ name experiments.x
      module = ("experiments" + (f".{node.module}" if node.module else "") if node.level == 1
                else node.module or "")
      if module in ("experiments", "experiments.bench", "experiments.paper"):  # packages
        out |= {f"{module}.{a.name}" for a in node.names}
      elif module.startswith("experiments."):
        out.add(module)
  return out


def test_experiment_scripts_import_no_other_script():
  """experiments/common/ holds the shared modules, beside the scale benchmark's two helpers
  (no scripts themselves); no script imports another script."""
  helpers = {"experiments.reference_decoder"}
  offenders = {}
  for path in sorted((ROOT / "experiments").rglob("*.py")):
    if "common" in path.parts or path.name == "__init__.py":
      continue
    own = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    others = {m for m in _experiment_imports(path) - {own} - helpers
              if m != "experiments.common" and not m.startswith("experiments.common.")}
    if others:
      offenders[own] = sorted(others)
  assert not offenders, f"experiment scripts importing other scripts: {offenders}"


def test_experiment_import_check_sees_every_form(tmp_path):
  source = tmp_path / "x.py"
  source.write_text("import experiments.a\nfrom experiments import b, common\n"
                    "from experiments.c import f\ndef g():\n  from experiments.d import h\n"
                    "from . import e\nfrom .f import k\nfrom os import path\n")
  assert _experiment_imports(source) == {"experiments.a", "experiments.b", "experiments.common",
                                         "experiments.c", "experiments.d", "experiments.e",
                                         "experiments.f"}


def _jitted_loops(path: pathlib.Path):
  """Names of the functions in `path` under a `jax.jit` decorator whose own body runs a
  `while_loop` (the whole-loop functions)."""
  out = []
  for node in ast.walk(ast.parse(path.read_text())):
    if not isinstance(node, ast.FunctionDef):
      continue
    jitted = any("jax.jit" in ast.unparse(d) for d in node.decorator_list)
    loops = any(isinstance(n, ast.Call) and ast.unparse(n.func).endswith("while_loop")
                for n in ast.walk(node))
    if jitted and loops:
      out.append(node.name)
  return out


def test_one_whole_loop_runner_in_decode():
  """Every decode loop (autoregressive, chain, tree) runs through ONE jitted whole-loop
  function per mode: `runner.run_loop` (a padded batch) and `stream._run` (slots); beam search
  has its own loop."""
  found = {f"{path.stem}.{name}" for path in sorted((PACKAGE / "decode").glob("*.py"))
           if not path.stem.startswith("beam") for name in _jitted_loops(path)}
  assert found == {"runner.run_loop", "stream._run"}, found
  callers = sorted(f"{path.stem}:{node.lineno}" for path in (PACKAGE / "decode").glob("*.py")
                   for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(".rounds"))
  assert [c.split(":")[0] for c in callers] == ["runner", "stream"], callers


def test_every_exported_drafter_is_registered():
  import dataclasses  # pylint: disable=import-outside-toplevel
  import specjax.draft as draft  # pylint: disable=import-outside-toplevel
  exported = [getattr(draft, n) for n in draft.__all__]
  classes = {c for c in exported if isinstance(c, type) and dataclasses.is_dataclass(c)
             and hasattr(c, "propose")}
  assert len(classes) == 9 and classes == set(draft.DRAFTERS.values())


def test_no_duck_typed_drafters_in_decode():
  """Loops read drafters through the `Drafter` protocol, never `getattr(drafter, ...)`."""
  offenders = [f"{path.name}:{node.lineno}" for path in sorted((PACKAGE / "decode").glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "hasattr")
               and "drafter" in ast.unparse(node.args[0])]
  assert not offenders, offenders
