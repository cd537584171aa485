"""The bundled tasks' split files: names, format, reading and writing."""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from specjax import files

TASK_FILES = {
    "lm_ddtp_en": "txt",
    "translate_en_de": "tsv",
    "summarize_ddtp": "tsv",
}
"""Task name -> split file extension (txt: a document per line; tsv: source<TAB>target)."""
SPLITS = ("train", "validation", "test")
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
BUNDLED_DIR = ASSETS_DIR / "eval"

Example = Tuple[str, Optional[str]]  # (source or LM document, target or None)


def write_split(path: Path, examples: Sequence[Example]) -> None:
  """Writes one split: a document per line, or 'source<TAB>target' lines.

  Written under a temporary name in the same folder and renamed into place, so
  `path` is the old file or the whole new one, never a torn mix.
  """
  lines = []
  for src, tgt in examples:
    if "\t" in src or "\n" in src or (tgt is not None and ("\t" in tgt or "\n" in tgt)):
      raise ValueError(f"example text must be cleaned (tab/newline): {src[:60]!r}")
    lines.append(src + "\n" if tgt is None else f"{src}\t{tgt}\n")
  Path(path).parent.mkdir(parents=True, exist_ok=True)
  files.write_atomic({str(path): "".join(lines).encode("utf-8")})


def copy_split(src: Path, dst: Path) -> None:
  """Copies a split file to `dst` the way `write_split` writes (temporary name, rename)."""
  if Path(dst).exists() and os.path.samefile(src, dst):
    raise ValueError(f"cannot copy {src} onto itself")
  Path(dst).parent.mkdir(parents=True, exist_ok=True)
  files.write_atomic({str(dst): Path(src).read_bytes()})


def read_split(path: Path) -> List[Example]:
  """Reads a file written by `write_split` (.txt: documents, .tsv: pairs)."""
  if not Path(path).is_file():
    raise FileNotFoundError(f"split file not found: {path}")
  with open(path, "rb") as f:
    raw = f.read()
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    line = raw.count(b"\n", 0, e.start) + 1
    raise ValueError(f"{path}:{line}: not UTF-8: byte {e.start} "
                     f"({raw[e.start:e.start + 1]!r}) cannot be decoded ({e.reason})") from e
  lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # as text-mode reads
  if lines[-1] == "":
    lines.pop()
  out: List[Example] = []
  for n, line in enumerate(lines):
    if str(path).endswith(".tsv"):
      fields = line.split("\t")
      if len(fields) != 2:
        raise ValueError(f"{path}:{n + 1}: expected 'source<TAB>target', got "
                         f"{len(fields)} fields")
      out.append((fields[0], fields[1]))
    else:
      out.append((line, None))
  return out


def load_bundled(task: str) -> List:
  """The bundled evaluation split of `task` (no apt, no seqio needed).

  Args:
    task: 'lm_ddtp_en', 'translate_en_de' or 'summarize_ddtp'.

  Returns:
    A list of documents (str) for the LM task, else a list of (source, target).
  """
  if task not in TASK_FILES:
    raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASK_FILES)}")
  examples = read_split(BUNDLED_DIR / f"{task}.{TASK_FILES[task]}")
  return [s for s, _ in examples] if task == "lm_ddtp_en" else examples
