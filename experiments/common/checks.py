"""Argument checks of the experiment scripts' settings."""
from __future__ import annotations

from typing import Any

from specjax.checks import check_int

def check_counts(**named: Any) -> None:
  """Each keyword an integer >= 1, or a tuple / list of them (`check_int`)."""
  for name, value in named.items():
    for item in (value if isinstance(value, (tuple, list)) else (value,)):
      check_int(name, item, low=1)
