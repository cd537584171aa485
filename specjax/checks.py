"""Argument checks shared by every layer: integers (bools refused), booleans, real ranges,
one of a set of names, sequences of integers. Every value gin can set goes through one of
these before it is used, so a value of the wrong type (a list where a name belongs, a dict,
None) is named with the setting and what it may be, never met later as a TypeError.

Each check raises a ValueError that names the argument and shows the value it got, and
returns the value converted (`int`, `bool`, `float`), so a caller writes
`count = check_int("max_new_tokens", count, low=1)`.
"""
from __future__ import annotations

import math
from typing import Any, Collection, Optional, Tuple

import numpy as np


def is_int(value: Any) -> bool:
  """Whether `value` is a Python or NumPy integer (bools are not)."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
  """Whether `value` is a Python or NumPy int or float (bools are not)."""
  return (isinstance(value, (int, float, np.integer, np.floating))
          and not isinstance(value, (bool, np.bool_)))


def check_int(name: str, value: Any, *, low: Optional[int] = None, high: Optional[int] = None,
              allow_none: bool = False, expected: Optional[str] = None) -> Optional[int]:
  """`value` as int; ValueError naming `name` unless it is an integer in [low, high].

  Either bound may be None (open). `expected` replaces what the message says the value must
  be (e.g. "an integer in [1, max_gamma=4]", "None or an integer >= 1"); None is accepted
  (and returned) when `allow_none`.
  """
  if value is None and allow_none:
    return None
  if (not is_int(value) or (low is not None and value < low)
      or (high is not None and value > high)):
    if expected is None:
      if low is not None and high is not None:
        expected = f"an integer in [{low}, {high}]"
      elif low is not None:
        expected = f"an integer >= {low}"
      else:
        expected = "an integer" if high is None else f"an integer <= {high}"
      expected += " or None" if allow_none else ""
    raise ValueError(f"{name} must be {expected}, got {value!r}")
  return int(value)


def check_count(name: str, value: Any) -> int:
  """`value` as int; ValueError naming `name` unless it is an integer >= 1."""
  return check_int(name, value, low=1)


def check_bool(name: str, value: Any) -> bool:
  """`value` as bool; ValueError naming `name` unless it is True or False (NumPy's too)."""
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name} must be True or False, got {value!r}")
  return bool(value)


def check_real(name: str, value: Any, low: float = -math.inf, high: float = math.inf, *,
               low_open: bool = False, high_open: bool = True, allow_none: bool = False,
               what: str = "") -> Optional[float]:
  """`value` as float; ValueError naming `name` unless it is a finite number in the
  interval from `low` to `high` (ends open or closed as given); `what` is appended to the
  message's description of the range."""
  if value is None and allow_none:
    return None
  ok = is_real(value) and math.isfinite(value) and (
      low < value if low_open else low <= value) and (value < high if high_open else value <= high)
  if not ok:
    if math.isfinite(high):
      span = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif math.isfinite(low):
      span = f"{'>' if low_open else '>='} {low:g}"
    else:
      span = ""
    text = f"a finite number {span}".rstrip()
    raise ValueError(f"{name} must be {text}{' or None' if allow_none else ''}{what}, "
                     f"got {value!r}")
  return float(value)


def check_choice(name: str, value: Any, allowed: Collection[str]) -> str:
  """`value` when it is one of the names `allowed` (a dict's keys, a set, a tuple);
  ValueError naming `name` and the allowed names otherwise, whatever `value`'s type (a list
  or dict is refused, not met as 'unhashable')."""
  if not isinstance(value, str) or value not in allowed:
    shown = sorted(allowed) if not isinstance(allowed, (tuple, list)) else list(allowed)
    raise ValueError(f"{name} must be one of {shown}, got {value!r}")
  return value


def check_int_sequence(name: str, value: Any, *, low: Optional[int] = None,
                       increasing: bool = False, expected: Optional[str] = None
                       ) -> Tuple[int, ...]:
  """`value` (a tuple or list of integers, each >= `low`; strictly increasing when
  `increasing`) as a tuple of ints; ValueError naming `name` otherwise (an int, None, a
  string or a dict included)."""
  ok = isinstance(value, (tuple, list)) and all(
      is_int(v) and (low is None or v >= low) for v in value)
  if ok and increasing:
    ok = all(a < b for a, b in zip(value, value[1:]))
  if not ok:
    if expected is None:
      expected = "a tuple of " + ("increasing " if increasing else "") + "integers" + (
          f" >= {low}" if low is not None else "")
    raise ValueError(f"{name} must be {expected}, got {value!r}")
  return tuple(int(v) for v in value)
