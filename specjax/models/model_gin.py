"""model.gin: the model config beside a checkpoint, written by specjax and read back safely.

A model folder holds `model.gin` with one binding per config field
(`DecoderOnlyConfig.emb_dim = 384`). Such a file may come with downloaded
weights, so it is never given to gin (which can import modules and so run
code): `parse_model_file` reads it with a restricted parser that accepts only
`T5Config.<field> = <literal>` / `DecoderOnlyConfig.<field> = <literal>`
bindings, comments and `include`s of other such files. `specjax.app.gin_config`
reads TARGET_MODEL / DRAFT_MODEL files with the same parser.
"""
from __future__ import annotations

import ast
import dataclasses
import io
import os
import re
import tokenize
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from specjax import files
from specjax.models.decoder_only import DecoderOnlyConfig
from specjax.models.feature_head import FeatureHeadConfig
from specjax.models.t5 import T5Config

MODEL_GIN = "model.gin"
MODEL_CLASSES = {"T5Config": T5Config, "DecoderOnlyConfig": DecoderOnlyConfig,
                 "FeatureHeadConfig": FeatureHeadConfig}
"""The configurables a model gin file may bind, by their gin name."""
_CLASS_NAMES = ", ".join(MODEL_CLASSES)

Resolver = Callable[[str, Optional[str]], str]
"""(file name as written, the file that includes it or None) -> the path to open."""
MODEL_GIN_BYTES = files.MIB
"""Largest model gin file read (specjax writes a few hundred bytes)."""
MAX_INCLUDE_DEPTH = 16
"""Deepest chain of includes followed from the file named by the user."""

_BINDING = re.compile(r"^([A-Za-z_]\w*)\.([A-Za-z_]\w*)\s*=(.*)$", re.S)
_INCLUDE = re.compile(r"""^include\s+(['"])([^'"]+)\1\s*(#.*)?$""")
_LITERALS = (bool, int, float, str, type(None))


WRITTEN_WHEN_SET = frozenset({"prompt_convention", "inputs_bidirectional_attention",
                              "attention_impl"})
"""Fields added after model.gin files were first written: written only when they differ
from their default, so the model.gin of an older folder still matches its config."""


def model_gin_text(config: Any) -> str:
  """gin bindings that rebuild `config` (e.g. `DecoderOnlyConfig.emb_dim = 384`)."""
  name = type(config).__name__
  lines = [f"# {name} of the checkpoints in this folder (written by specjax)."]
  lines += [f"{name}.{f.name} = {getattr(config, f.name)!r}"
            for f in dataclasses.fields(config)
            if f.name not in WRITTEN_WHEN_SET or getattr(config, f.name) != f.default]
  return "\n".join(lines) + "\n"


def _is_plain_literal(value: Any) -> bool:
  if isinstance(value, (tuple, list)):
    return all(_is_plain_literal(v) for v in value)
  if isinstance(value, dict):
    return all(isinstance(k, _LITERALS) and _is_plain_literal(v) for k, v in value.items())
  return isinstance(value, _LITERALS)


def _statements(text: str) -> List[Tuple[int, str]]:
  """(first line number, text) of each statement: lines joined while brackets are open."""
  out, lines, i = [], text.splitlines(), 0
  while i < len(lines):
    start, chunk = i, lines[i]
    i += 1
    while i < len(lines):
      try:
        list(tokenize.generate_tokens(io.StringIO(chunk + "\n").readline))
        break
      except tokenize.TokenError:  # an open bracket or string: the value goes on
        chunk += "\n" + lines[i]
        i += 1
      except (SyntaxError, ValueError):  # refused below with the line shown
        break
    out.append((start + 1, chunk))
  return out


def resolve_local(name: str, including: Optional[str]) -> str:
  """`name` as is when absolute (or top-level), else beside the file that includes it."""
  path = name if os.path.isabs(name) or including is None else os.path.join(
      os.path.dirname(including), name)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"model gin file '{name}' not found" + (
        f" (included by {including})" if including else ""))
  return path


def _within(root: str, real: str) -> bool:
  return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _open_include(name: str, resolve: Resolver, roots: Sequence[str],
                  chain: Tuple[str, ...]) -> str:
  """The real path of `name` as included by chain[-1] (None: the file the user named).

  An include must resolve inside `roots` or the folder of the file the user named, must
  not be a file of `chain` (a cycle) and may be at most MAX_INCLUDE_DEPTH deep.
  """
  including = chain[-1] if chain else None
  real = os.path.realpath(resolve(name, including))
  if not chain:
    return real
  if len(chain) > MAX_INCLUDE_DEPTH:
    raise ValueError(f"{including}: includes nested more than {MAX_INCLUDE_DEPTH} deep "
                     f"(from {chain[0]})")
  if real in chain:
    raise ValueError(f"{including}: include cycle: "
                     + " -> ".join(os.path.basename(c) for c in (*chain, real)))
  allowed = [os.path.realpath(r) for r in roots] + [os.path.dirname(chain[0])]
  if not any(_within(root, real) for root in allowed):
    raise ValueError(f"{including}: include '{name}' resolves to {real}, outside the gin "
                     f"search paths and the model's folder {os.path.dirname(chain[0])}; "
                     "refusing to read it")
  return real


def parse_model_file(path: str, resolve: Resolver = resolve_local, roots: Sequence[str] = ()
                     ) -> Tuple[str, Dict[str, Any]]:
  """Parses a model gin file without gin: (class name, {field: value}).

  The restricted grammar, so a model.gin that came with downloaded weights
  cannot run code: blank lines, comments, `include 'other.gin'` (parsed the
  same way), and `T5Config.<field> = <literal>` or `DecoderOnlyConfig.<field> =
  <literal>` where the literal is a Python number, string, bool, None, or a
  tuple / list / dict of them (read with `ast.literal_eval`). Imports,
  registrations, `@references`, `%macros`, scopes and other configurables are
  refused. Later bindings win, as in gin.

  Files are read only when they are regular files of at most MODEL_GIN_BYTES;
  an include must lie in `roots` or the folder of `path` (nothing else on the
  machine is read), at most MAX_INCLUDE_DEPTH deep and without a cycle.
  Messages name the file and line, never the text of a line.

  Args:
    path: the file.
    resolve: finds it and its includes (`resolve_local`: beside the including
      file; `specjax.app.gin_config` passes one that searches the gin paths).
    roots: folders besides the model's own that includes may come from (the gin
      search paths).
  Raises:
    ValueError: naming the file, line and what is wrong.
    FileNotFoundError: the file or an include is not found.
  """
  return _parse(path, resolve, tuple(roots), ())


def _parse(path: str, resolve: Resolver, roots: Tuple[str, ...], chain: Tuple[str, ...]
           ) -> Tuple[str, Dict[str, Any]]:
  full = _open_include(path, resolve, roots, chain)
  cls, values = None, {}
  text = files.read_text(full, MODEL_GIN_BYTES, "the model gin file")
  for lineno, stmt in _statements(text):
    line = stmt.strip()
    if not line or line.startswith("#"):
      continue
    where = f"{full}:{lineno}"
    inc = _INCLUDE.match(line)
    if inc:
      inner_cls, inner = _parse(inc.group(2), resolve, roots, (*chain, full))
      if cls not in (None, inner_cls):
        raise ValueError(f"{where}: includes a {inner_cls} file into a {cls} file")
      cls = inner_cls
      values.update(inner)
      continue
    m = _BINDING.match(line)
    if m is None or m.group(1) not in MODEL_CLASSES:
      bound = f" (it binds {m.group(1)})" if m is not None else ""
      raise ValueError(
          f"{where}: this line is not allowed in a model gin file{bound}; it is read "
          "with a restricted parser that accepts only '<Config>.<field> = <literal>' bindings "
          f"of {_CLASS_NAMES}, comments and includes of such "
          "files (no imports, registrations, scopes, macros or references; put those in a "
          "--gin_file you trust)")
    name, field = m.group(1), m.group(2)
    if cls not in (None, name):
      raise ValueError(f"{where}: binds {name} in a file that binds {cls}; a model gin "
                       "file describes one model")
    allowed = {f.name for f in dataclasses.fields(MODEL_CLASSES[name])}
    if field not in allowed:
      raise ValueError(f"{where}: {name} has no field {field!r} (fields: {sorted(allowed)})")
    try:
      value = ast.literal_eval(m.group(3).strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
      raise ValueError(f"{where}: the value of {name}.{field} must be a literal (number, "
                       "string, bool, None, or a tuple/list/dict of them)") from e
    if not _is_plain_literal(value):
      raise ValueError(f"{where}: the value of {name}.{field} must be a number, string, "
                       f"bool, None, or a tuple/list/dict of them, got {type(value).__name__}")
    cls = name
    values[field] = value
  if cls is None:
    raise ValueError(f"model gin file '{path}' ({full}) binds none of {_CLASS_NAMES}")
  return cls, values


def config_from_model_file(path: str, resolve: Resolver = resolve_local,
                           roots: Sequence[str] = ()) -> Any:
  """The T5Config / DecoderOnlyConfig a model gin file describes (`parse_model_file`)."""
  cls, values = parse_model_file(path, resolve, roots)
  try:
    return MODEL_CLASSES[cls](**values)
  except (TypeError, ValueError) as e:
    raise ValueError(f"model gin file '{path}': {e}") from e


def read_model_gin(path: str) -> Any:
  """The model config a `model.gin` describes, read with the restricted parser.

  Only `T5Config.<field> = <literal>` / `DecoderOnlyConfig.<field> = <literal>`
  bindings, comments and includes of such files (found beside the including
  file) are accepted: nothing is imported, registered or evaluated.

  Args:
    path: a model.gin file, or the folder that holds one.
  Returns:
    A DecoderOnlyConfig or T5Config.
  Raises:
    ValueError naming the offending line, or a field the class does not accept.
  """
  if os.path.isdir(path):
    path = os.path.join(path, MODEL_GIN)
  return config_from_model_file(path)
