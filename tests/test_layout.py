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


ENTRY_SCRIPTS = {"specjax.main", "specjax.train.__main__"}
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
      if module == "experiments":
        out |= {f"experiments.{a.name}" for a in node.names}
      elif module.startswith("experiments."):
        out.add(module)
  return out


def test_experiment_scripts_import_no_other_script():
  """experiments/common.py is the shared module (and the scale benchmark's two helpers, no
  scripts themselves); no script imports another script."""
  shared = {"experiments.common", "experiments.hlo_stats", "experiments.reference_decoder"}
  offenders = {}
  for path in sorted((ROOT / "experiments").glob("*.py")):
    own = f"experiments.{path.stem}"
    others = _experiment_imports(path) - shared - {own}
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
