"""User text as data on a terminal: never markup, never control sequences.

Inputs, outputs and messages can hold anything: `[/b]` (which rich would read as markup
and refuse), or raw ESC and other control bytes (which a terminal would obey: move the
cursor, recolour, retitle the window). `printable` replaces each control character, and
the bidirectional overrides that reorder what a reader sees, by a visible escape
(`\\x1b`, `\\n`, `\\u202e`); `text` wraps the result in a rich `Text`, which is never
parsed as markup. Only what is shown changes: results.jsonl keeps the exact text.
"""
from __future__ import annotations

import unicodedata

from rich.text import Text

_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _visible(ch: str) -> str:
  if ch == "\n":
    return "\\n"
  if ch == "\t":
    return "\\t"
  code = ord(ch)
  return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
  """str(value) with control characters (and bidi overrides) as visible escapes."""
  s = str(value)
  if s.isprintable():
    return s
  return "".join(_visible(ch) if unicodedata.category(ch) == "Cc" or ch in _BIDI
                 or 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in s)


def text(value: object, style: str = "") -> Text:
  """`printable(value)` as a rich Text (shown literally, `[...]` included)."""
  return Text(printable(value), style=style)
