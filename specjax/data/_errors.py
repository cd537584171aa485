"""Errors raised inside the libraries a user's vocabulary or task runs through (TensorFlow,
seqio, SentencePiece), turned into one line that names what failed.

Their own error types (`tensorflow.errors.NotFoundError`, a `TypeError` from a dataset
function) are no `OSError` or `ValueError`, and their messages carry graph-node names and
stack excerpts; the command reports a user's input as one line (`specjax: error: ...`).
"""
from __future__ import annotations

import re

_GRAPH_NODE = re.compile(r"\{\{function_node [^}]*\}\}\s*")
_OP_SUFFIX = re.compile(r"\s*\[Op:[^\]]*\].*$")


def library_error(what: str, error: BaseException) -> Exception:
  """`error` as FileNotFoundError (a file the library could not find) or ValueError, its
  message `what: <the library's own message on one line>`; chain it (`raise ... from error`)
  so that `--verbose` still shows the library's traceback."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  if lines and lines[0].startswith("in user code"):  # tf.data: the real error is the last line
    lines = lines[-1:]
  message = _OP_SUFFIX.sub("", _GRAPH_NODE.sub("", lines[0] if lines else "")).strip()
  if isinstance(error, FileNotFoundError) or type(error).__name__ == "NotFoundError":
    return FileNotFoundError(f"{what}: {message or 'file not found'}")
  kind = type(error).__name__
  if not message.startswith(kind):
    message = f"{kind}: {message}" if message else kind
  return ValueError(f"{what}: {message}")
