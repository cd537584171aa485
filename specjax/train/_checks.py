"""Field checks shared by the training configs (ValueError naming `Class.field` and value)."""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np


def check_int(config: Any, field: str, low: int, allow_none: bool = False) -> None:
  """`config.field` must be an integer >= low (bools refused; None when `allow_none`)."""
  value = getattr(config, field)
  if value is None and allow_none:
    return
  if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
      or value < low):
    raise ValueError(f"{type(config).__name__}.{field} must be an integer >= {low}"
                     f"{' or None' if allow_none else ''}, got {value!r}")


def check_real(config: Any, field: str, low: float, high: float = math.inf, *,
               low_open: bool = False, high_open: bool = True,
               allow_none: bool = False, what: Optional[str] = None) -> None:
  """`config.field` must be a finite number in the interval [low, high) (ends as given)."""
  value = getattr(config, field)
  if value is None and allow_none:
    return
  number = (isinstance(value, (int, float, np.integer, np.floating))
            and not isinstance(value, (bool, np.bool_)))
  ok = number and math.isfinite(value) and (low < value if low_open else low <= value) and (
      value < high if high_open else value <= high)
  if not ok:
    span = (f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            if math.isfinite(high) else f"{'>' if low_open else '>='} {low:g}")
    raise ValueError(f"{type(config).__name__}.{field} must be a finite number "
                     f"{'in ' if math.isfinite(high) else ''}{span}"
                     f"{' or None' if allow_none else ''}{what or ''}, got {value!r}")
