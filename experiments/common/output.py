"""An experiment's output: markdown tables and headers, and the output folder's files
(NAME.md, NAME.csv, NAME.json, PNG plots)."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from experiments.common.pairs import RANDOM_NOTE, Pair
from specjax import machine


def fmt(value: Any) -> str:
  """Table cell: floats to 3 significant digits."""
  if isinstance(value, (float, np.floating)):
    return f"{float(value):.3g}"
  return str(value)


def markdown_table(rows: Sequence[Dict[str, Any]], columns: Optional[Sequence[str]] = None,
                   cell: Optional[Callable[[Any], str]] = None) -> str:
  """A GitHub markdown table of dict rows (columns: the first row's keys by default; cells
  written by `cell`, default `fmt`)."""
  cell = cell or fmt
  if not rows:
    raise ValueError("markdown_table needs at least one row")
  columns = list(columns or rows[0].keys())
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
  return "\n".join(lines)


class Output:
  """An experiment's output folder: NAME.md, NAME.csv, NAME.json and PNG plots."""

  def __init__(self, folder: os.PathLike, name: str):
    self.folder, self.name = Path(folder), name
    self.folder.mkdir(parents=True, exist_ok=True)
    self.written: List[Path] = []

  def path(self, filename: str) -> Path:
    path = self.folder / filename
    self.written.append(path)
    return path

  def _text(self, filename: str, text: str) -> None:
    """Writes `text` to a temporary name beside the file, then renames it into place (a file
    is never left half-written)."""
    path = self.path(filename)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)

  def markdown(self, text: str, filename: Optional[str] = None) -> None:
    self._text(filename or f"{self.name}.md", text.rstrip() + "\n")

  def csv(self, rows: Sequence[Dict[str, Any]], filename: Optional[str] = None) -> None:
    if not rows:
      raise ValueError("no rows to write")
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    self._text(filename or f"{self.name}.csv", buf.getvalue())

  def json(self, obj: Any, filename: Optional[str] = None) -> None:
    self._text(filename or f"{self.name}.json",
               json.dumps(obj, indent=1, ensure_ascii=False, default=_json_default))

  def tables(self, md: str, rows: Sequence[Dict[str, Any]], pairs, **extra: Any) -> None:
    """Writes NAME.md, NAME.csv and NAME.json (rows, the pairs' sources and `extra`)."""
    self.markdown(md)
    self.csv(rows)
    self.json({"pairs": {p.name: p.source for p in pairs}, **extra, "rows": rows})

  def png(self, figure, filename: str) -> None:
    figure.savefig(self.path(filename), dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    plt.close(figure)

  @contextlib.contextmanager
  def figure(self, filename: str, figsize: Tuple[float, float], ncols: int = 1):
    """A new figure's axes (one, or a tuple of `ncols`), saved as `filename` on exit."""
    fig, axes = pyplot().subplots(1, ncols, figsize=figsize)
    yield axes
    self.png(fig, filename)

  def announce(self) -> None:
    """Prints the files written so far."""
    print(f"wrote {', '.join(str(p) for p in self.written)}")


def _json_default(x):
  if isinstance(x, (np.integer,)):
    return int(x)
  if isinstance(x, (np.floating,)):
    return float(x)
  if isinstance(x, np.ndarray):
    return x.tolist()
  return str(x)


def pyplot():
  """matplotlib.pyplot on the Agg backend (extra: `pip install matplotlib`)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def header(title: str, pairs: Sequence[Pair], notes: Sequence[str] = ()) -> str:
  """Markdown title with each pair's origin; a loud line for random-init pairs."""
  lines = [f"# {title}", ""]
  for pair in pairs:
    lines.append(f"- pair **{pair.name}** ({pair.task}): {pair.source}")
  if any(p.random_init for p in pairs):
    lines += ["", f"**WARNING: {RANDOM_NOTE}** (trained pairs are not shipped yet)"]
  device = jax.devices()[0]
  where = machine.describe() if device.platform == "cpu" else device.device_kind
  lines += [""] * bool(pairs) + [f"- device: {device.platform} ({where}), jax {jax.__version__}"]
  lines += [f"- {n}" for n in notes]
  return "\n".join(lines) + "\n"


def write(cli, name: str, rows: Sequence[Dict[str, Any]], title: str,
          notes: Sequence[str] = (), columns: Optional[Sequence[str]] = None,
          more: str = "", pairs: Optional[Sequence[Pair]] = None,
          plot: Optional[Callable[[Output], None]] = None, md: Optional[str] = None,
          **extra: Any) -> Sequence[Dict[str, Any]]:
  """An experiment's usual ending: NAME.md (`header` of `title`, the pairs and `notes`, the
  rows' table with `columns`, then `more`; or `md` as given), NAME.csv and NAME.json (with
  `extra`) in `cli.output_dir`, the plot (`plot(output)`) when given; prints the markdown and
  the files written, returns the rows. pairs: default `cli.pairs`."""
  pairs = cli.pairs if pairs is None else pairs
  if md is None:
    md = header(title, pairs, notes) + "\n" + markdown_table(rows, columns) + more
  out = Output(cli.output_dir, name)
  out.tables(md, rows, pairs, **extra)
  if plot is not None:
    plot(out)
  print(md)
  out.announce()
  return rows
