"""The quickstart notebook runs headless, top to bottom, on the bundled LM pair.

nbclient executes every cell in a fresh kernel (any exception fails the test; the
notebook itself asserts greedy speculative == autoregressive), then the outputs
are checked: the trace printed, and the theory-vs-measurement plot rendered.
"""
import os
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
  assert not [o for c in code for o in _outputs(c) if o.get("output_type") == "error"]
  text = "".join(o.get("text", "") for c in code for o in _outputs(c)
                 if o.get("output_type") == "stream")
  assert "target calls, autoregressive:" in text and "alpha per gamma:" in text
  assert "[+" in text  # the plain trace has at least one correction
  html = [o for c in code for o in _outputs(c) if "text/html" in o.get("data", {})]
  assert html and "color:green" in html[0]["data"]["text/html"]
  pngs = [o for c in code for o in _outputs(c) if "image/png" in o.get("data", {})]
  assert len(pngs) == 1
