"""gin's statement syntax as text, for the restricted model gin reader (nothing is evaluated).

`statements(text)` cuts a gin file into statements (a value may span lines while a bracket
or string is open) and tells each kind apart, block bindings included:

  import x.y / from x import y       Import      (never run: the reader skips it)
  include 'file.gin'                 Include
  NAME = value                       Macro       (T5X: DROPOUT_RATE = %gin.REQUIRED)
  [scope/]a.b.Class.field = value    Binding
  [scope/]a.b.Class:                 a block: each indented `field = value` below it is a
      field = value                  Binding of that selector (gin's block syntax)

`gin_value(text)` reads a value as gin writes it: a Python literal, `%MACRO`, `@name()` /
`@name`, or a tuple / list / dict of them. Anything else is a `Refused` line, named by
its file line, never echoed.
"""
from __future__ import annotations

import ast
import dataclasses
import io
import re
import tokenize
from typing import Any, List, Optional, Tuple, Union

_NAME = r"[A-Za-z_]\w*"
_DOTTED = rf"{_NAME}(?:\.{_NAME})*"
_SELECTOR = rf"(?:({_DOTTED}(?:/{_DOTTED})*)/)?({_DOTTED})"
_IMPORT = re.compile(rf"^(?:from\s+{_DOTTED}\s+)?import\s+{_DOTTED}(?:\s+as\s+{_NAME})?"
                     r"\s*(?:#.*)?$")
_INCLUDE = re.compile(r"""^include\s+(['"])([^'"]+)\1\s*(?:#.*)?$""")
_MACRO = re.compile(rf"^({_NAME})\s*=(.*)$", re.S)
_BINDING = re.compile(rf"^{_SELECTOR}\.({_NAME})\s*=(.*)$", re.S)
_BLOCK = re.compile(rf"^{_SELECTOR}\s*:\s*(?:#.*)?$")
_FIELD = re.compile(rf"^({_NAME})\s*=(.*)$", re.S)


@dataclasses.dataclass(frozen=True)
class Import:
  """An import line (`from __gin__ import dynamic_registration`, `import seqio`)."""
  line: int


@dataclasses.dataclass(frozen=True)
class Include:
  """`include 'name'`."""
  line: int
  name: str


@dataclasses.dataclass(frozen=True)
class Macro:
  """`NAME = value` (value: the text after '=')."""
  line: int
  name: str
  value: str


@dataclasses.dataclass(frozen=True)
class Binding:
  """`[scope/]selector.field = value`, or a `field = value` line of a `selector:` block."""
  line: int
  scope: Optional[str]
  selector: str  # 'network.T5Config'
  field: str
  value: str

  @property
  def configurable(self) -> str:
    """The last part of the selector: 'T5Config' of 'network.T5Config'."""
    return self.selector.rsplit(".", 1)[-1]


@dataclasses.dataclass(frozen=True)
class Refused:
  """A line that is none of the above (or a block without bindings)."""
  line: int
  why: str


Statement = Union[Import, Include, Macro, Binding, Refused]


@dataclasses.dataclass(frozen=True)
class MacroRef:
  """A value that is `%NAME` alone (`%gin.REQUIRED` included)."""
  name: str


class Reference:
  """Stands for an `@name()` / `@name` or a `%MACRO` inside a container: not a literal."""

  def __repr__(self) -> str:
    return "Reference()"


_OPENERS, _CLOSERS = "([{", ")]}"


def _chunks(text: str) -> List[Tuple[int, str, Optional[str]]]:
  """(first line number, text, what is left open) of each statement: lines joined while a
  bracket, a string or a backslash continuation is open. One pass over the text (a file
  with an unclosed bracket is one statement, read once); what is left open is None, or says
  what is never closed (the last statement's)."""
  out: List[Tuple[int, str, Optional[str]]] = []
  lines = text.splitlines()
  depth, quote, opened_on = 0, "", 0  # open brackets; the open string's quote; its line
  start, chunk = 0, []
  for i, line in enumerate(lines):
    if not chunk:
      start = i
    chunk.append(line)
    j, n, continued = 0, len(line), False
    while j < n:
      ch = line[j]
      if quote:
        if ch == "\\":
          j += 2
          continue
        if line.startswith(quote, j):
          j += len(quote)
          quote = ""
          continue
      elif ch == "#":
        break
      elif ch in "'\"":
        quote = ch * 3 if line.startswith(ch * 3, j) else ch
        opened_on = i
        j += len(quote)
        continue
      elif ch in _OPENERS:
        depth, opened_on = depth + 1, (i if depth == 0 else opened_on)
      elif ch in _CLOSERS:
        depth = max(depth - 1, 0)
      elif ch == "\\" and j == n - 1:
        continued = True
      j += 1
    if quote and len(quote) == 1 and not line.endswith("\\"):
      quote = ""  # a one-quote string ends with its line (the value is refused later)
    if not (depth or quote or continued):
      out.append((start + 1, "\n".join(chunk), None))
      chunk = []
  if chunk:
    what = "a string" if quote else "a bracket" if depth else "a line continuation"
    out.append((start + 1, "\n".join(chunk), f"{what} opened on line {opened_on + 1} "
                "that is never closed"))
  return out


def statements(text: str) -> List[Statement]:
  """The statements of a gin file's text, blocks expanded into their bindings; blank and
  comment lines dropped. A `Refused` names its line; the caller decides what to do."""
  out: List[Statement] = []
  block: Optional[Tuple[Optional[str], str, int]] = None  # (scope, selector, header line)
  block_bindings = 0
  for lineno, chunk, unclosed in _chunks(text):
    line = chunk.strip()
    if not line or line.startswith("#"):
      continue
    if unclosed:
      out.append(Refused(lineno, f"starts a statement with {unclosed}"))
      continue
    indented = chunk[:1].isspace()
    if block is not None and indented:
      field = _FIELD.match(line)
      if field is None:
        out.append(Refused(lineno, f"is not 'field = value' inside the block {block[1]}:"))
      else:
        out.append(Binding(lineno, block[0], block[1], field.group(1), field.group(2)))
        block_bindings += 1
      continue
    if block is not None and not block_bindings:
      out.append(Refused(block[2], f"opens the block {block[1]}: with no indented bindings"))
    block = None
    out.append(_statement(lineno, line))
    header = _BLOCK.match(line)
    if header:
      block, block_bindings = (header.group(1), header.group(2), lineno), 0
      out.pop()
  if block is not None and not block_bindings:
    out.append(Refused(block[2], f"opens the block {block[1]}: with no indented bindings"))
  return out


def _statement(lineno: int, line: str) -> Statement:
  if _IMPORT.match(line):
    return Import(lineno)
  inc = _INCLUDE.match(line)
  if inc:
    return Include(lineno, inc.group(2))
  m = _MACRO.match(line)
  if m:
    return Macro(lineno, m.group(1), m.group(2))
  m = _BINDING.match(line)
  if m:
    return Binding(lineno, m.group(1), m.group(2), m.group(3), m.group(4))
  return Refused(lineno, "is not an import, include, macro or binding")


def _tokens(text: str) -> List[tokenize.TokenInfo]:
  skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
          tokenize.ENDMARKER)
  return [t for t in tokenize.generate_tokens(io.StringIO(text.strip() + "\n").readline)
          if t.type not in skip]


def _name_end(toks: List[tokenize.TokenInfo], i: int) -> int:
  """The index after a dotted (and '/'-scoped) name starting at toks[i]."""
  if i >= len(toks) or toks[i].type != tokenize.NAME:
    raise ValueError("a name must follow '@' or '%'")
  i += 1
  while i + 1 < len(toks) and toks[i].string in (".", "/") and toks[i + 1].type == tokenize.NAME:
    i += 2
  return i


_LITERALS = (bool, int, float, str, type(None))


def _is_plain(value: Any) -> bool:
  if isinstance(value, (tuple, list)):
    return all(_is_plain(v) for v in value)
  if isinstance(value, dict):
    return all(isinstance(k, _LITERALS) and _is_plain(v) for k, v in value.items())
  return isinstance(value, _LITERALS)


def gin_value(text: str) -> Any:
  """A gin value's text -> a `MacroRef` when it is `%NAME` alone, else the literal with a
  `Reference` in place of each `@...` / `%...` inside it.

  Raises:
    ValueError: not a gin value (names, calls, operators, sets, ...).
  """
  try:
    toks = _tokens(text)
  except (tokenize.TokenError, SyntaxError) as e:
    raise ValueError("unbalanced brackets or quotes") from e
  if len(toks) >= 2 and toks[0].string == "%" and _name_end(toks, 1) == len(toks):
    return MacroRef("".join(t.string for t in toks[1:]))
  parts, i = [], 0
  while i < len(toks):
    tok = toks[i]
    if tok.string in ("@", "%"):
      i = _name_end(toks, i + 1)
      if tok.string == "@" and i + 1 < len(toks) and toks[i].string == "(" \
          and toks[i + 1].string == ")":
        i += 2
      parts.append("__reference__")
      continue
    parts.append(tok.string)
    i += 1
  source = " ".join(parts)
  try:
    tree = ast.parse(source, mode="eval")
  except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
    raise ValueError("not a gin value") from e
  value = _literal(tree.body)
  if not _is_plain_or_reference(value):
    raise ValueError(f"a {type(value).__name__} is not a gin value")
  return value


def _literal(node: ast.AST) -> Any:
  """ast.literal_eval's grammar, with the name `__reference__` read as a `Reference`."""
  if isinstance(node, ast.Name) and node.id == "__reference__":
    return Reference()
  if isinstance(node, (ast.Tuple, ast.List)):
    items = [_literal(e) for e in node.elts]
    return tuple(items) if isinstance(node, ast.Tuple) else items
  if isinstance(node, ast.Dict):
    if any(k is None for k in node.keys):
      raise ValueError("not a gin value")
    return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
  try:
    return ast.literal_eval(node)
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
    raise ValueError("not a gin value") from e


def _is_plain_or_reference(value: Any) -> bool:
  if isinstance(value, Reference):
    return True
  if isinstance(value, (tuple, list)):
    return all(_is_plain_or_reference(v) for v in value)
  if isinstance(value, dict):
    return all(isinstance(k, _LITERALS) and _is_plain_or_reference(v)
               for k, v in value.items())
  return isinstance(value, _LITERALS)


def is_literal(value: Any) -> bool:
  """Whether a `gin_value` holds no reference: a number, string, bool, None, or a tuple /
  list / dict of them."""
  return _is_plain(value)
