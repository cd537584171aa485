"""The quickstart notebook runs headless, top to bottom, on the bundled LM pair.

nbclient executes every cell in a fresh kernel (any exception fails the test; the
notebook itself asserts greedy speculative == autoregressive), then the outputs
are checked: the install cell found this checkout, the trace printed, and the
theory-vs-measurement plot rendered. Its Colab section names extras setup.py has.
"""
import importlib.util
import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "experiments" / "notebooks" / "quickstart.ipynb"


def _outputs(cell):
  return cell.get("outputs", [])


@pytest.fixture(scope="module")
def executed():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  with pytest.MonkeyPatch.context() as mp:  # the kernel imports this checkout's specjax
    mp.setenv("PYTHONPATH", str(ROOT), prepend=os.pathsep)
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
  return nb


@pytest.mark.e2e
def test_notebook_runs_and_shows_trace_and_plot(executed):
  code = [c for c in executed.cells if c.cell_type == "code"]
  assert all(c.get("execution_count") for c in code)
  installed = "".join(o.get("text", "") for o in _outputs(code[0]))
  assert f"specjax from {ROOT}\n" in installed, installed
  assert not [o for c in code for o in _outputs(c) if o.get("output_type") == "error"]
  text = "".join(o.get("text", "") for c in code for o in _outputs(c)
                 if o.get("output_type") == "stream")
  assert "target calls, autoregressive:" in text and "alpha per gamma:" in text
  assert "[*" in text and "[+" in text  # the plain trace marks corrections and accepted runs
  assert "[+x+] accepted, [-x-] rejected, [*x*] the target's correction" in text
  # its own inputs fit the max_input_len it gives them: no cut-input warning on any stream
  everything = "".join(o.get("text", "") for c in code for o in _outputs(c))
  assert "max_input_len" not in everything, everything
  html = [o for c in code for o in _outputs(c) if "text/html" in o.get("data", {})]
  assert html and "color:green" in html[0]["data"]["text/html"]
  pngs = [o for c in code for o in _outputs(c) if "image/png" in o.get("data", {})]
  assert len(pngs) == 1


def test_the_notebook_names_setups_jax_range_and_its_headless_route():
  spec = importlib.util.spec_from_file_location("specjax_docs_build", ROOT / "docs" / "build.py")
  build = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(build)
  text = NOTEBOOK.read_text()
  named = set(build.JAX_RANGE_TEXT.findall(text))
  assert named == {f"`jax{build.jax_range()}`"}, named  # generated: docs/build.py
  assert build.with_jax_range(text.replace(named.pop(), "`jax>=0.10.0,<0.12`")) == text
  colab = nbformat.read(NOTEBOOK, as_version=4).cells[0].source
  assert "jupyter nbconvert --to notebook --execute" in colab
  setup = (ROOT / "setup.py").read_text()
  experiments = re.search(r'"experiments": \[(.*?)\]', setup, re.S).group(1)
  assert all(f'"{p}>=' in experiments for p in ("nbconvert", "nbclient", "ipykernel"))


def test_the_colab_route_installs_from_one_source_variable_and_checks_the_device():
  install = next(c for c in nbformat.read(NOTEBOOK, as_version=4).cells
                 if c.cell_type == "code").source
  assert re.search(r'^SOURCE = ""', install, re.M)  # one variable: a wheel or git URL
  assert 'f"specjax[{extras}] @ {SOURCE}"' in install  # pip's direct reference to it
  assert "jax.devices()[0].platform" in install and "raise SystemExit" in install


def test_the_install_cell_and_colab_section_name_what_exists():
  """No placeholder in the install cell; each extra the Colab section names is one of
  setup.py's, and the README's first screen links the notebook."""
  nb = nbformat.read(NOTEBOOK, as_version=4)
  install = next(c for c in nb.cells if c.cell_type == "code").source
  assert not re.search(r"<[^>]*>", install), install  # e.g. `git clone <the repository>`
  colab = nb.cells[0].source
  named = set(re.findall(r'`"(\w+)"` on a', colab))
  assert named == {"cuda12", "tpu"}, named
  setup = (ROOT / "setup.py").read_text()
  assert all(f'"{extra}": ["jax[{extra}]"' in setup for extra in named)
  readme_head = "\n".join((ROOT / "README.md").read_text().splitlines()[:30])
  assert "experiments/notebooks/quickstart.ipynb" in readme_head
