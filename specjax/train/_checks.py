"""Field checks shared by the training configs (ValueError naming `Class.field` and value)."""
from __future__ import annotations

import math
from typing import Any, Optional

from specjax import checks


def check_int(config: Any, field: str, low: int, allow_none: bool = False) -> None:
  """`config.field` must be an integer >= low (bools refused; None when `allow_none`)."""
  checks.check_int(f"{type(config).__name__}.{field}", getattr(config, field), low=low,
                   allow_none=allow_none)


def check_real(config: Any, field: str, low: float, high: float = math.inf, *,
               low_open: bool = False, high_open: bool = True,
               allow_none: bool = False, what: Optional[str] = None) -> None:
  """`config.field` must be a finite number in the interval [low, high) (ends as given)."""
  checks.check_real(f"{type(config).__name__}.{field}", getattr(config, field), low, high,
                    low_open=low_open, high_open=high_open, allow_none=allow_none,
                    what=what or "")
