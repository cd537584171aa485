"""User text as data on a terminal: never markup, never control sequences.

Inputs, outputs and messages can hold anything: `[/b]` (which rich would read as markup
and refuse), or raw ESC and other control bytes (which a terminal would obey: move the
cursor, recolour, retitle the window). `printable` replaces each control character, and
the bidirectional overrides that reorder what a reader sees, by a visible escape
(`\\x1b`, `\\n`, `\\u202e`); `text` wraps the result in a rich `Text`, which is never
parsed as markup. A text longer than `specjax.command.SHOWN_CHARS` is shown as its head
and tail with the count of characters left out (a 1 MB prompt is not echoed whole). Only
what is shown changes: results.jsonl keeps the exact text. (`printable` and `shorten`
live in `specjax.command`, which every command uses.)
"""
from __future__ import annotations

from rich.text import Text

from specjax.command import printable, shorten  # noqa: F401 (the app's names for them)


def text(value: object, style: str = "") -> Text:
  """`printable(shorten(value))` as a rich Text (shown literally, `[...]` included)."""
  return Text(printable(shorten(value)), style=style)
