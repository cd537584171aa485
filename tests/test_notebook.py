"""The quickstart notebook runs headless, top to bottom, on the bundled LM pair.

nbclient executes every cell in a fresh kernel (any exception fails the test; the
notebook itself asserts greedy speculative == autoregressive), then the outputs
are checked: the install cell found this checkout, the trace printed, and the
theory-vs-measurement plot rendered. Its Colab section names extras setup.py has.
"""
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
  assert "[+" in text  # the plain trace has at least one correction
  html = [o for c in code for o in _outputs(c) if "text/html" in o.get("data", {})]
  assert html and "color:green" in html[0]["data"]["text/html"]
  pngs = [o for c in code for o in _outputs(c) if "image/png" in o.get("data", {})]
  assert len(pngs) == 1


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
