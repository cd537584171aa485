"""Drafters by name (gin and the main job select them this way, as `VERIFIERS` verifiers)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from specjax.draft.base import Drafter
from specjax.draft.feature import FeatureDrafter, FeatureTreeDrafter
from specjax.draft.hierarchical import HierarchicalDrafter
from specjax.draft.lookup_tree import PromptLookupTreeDrafter
from specjax.draft.model import ModelDrafter, TreeModelDrafter
from specjax.draft.ngram import NGramDrafter, NGramTreeDrafter
from specjax.draft.prompt_lookup import PromptLookupDrafter

DRAFTERS = {
    "model": ModelDrafter,
    "ngram": NGramDrafter,
    "prompt_lookup": PromptLookupDrafter,
    "hierarchical": HierarchicalDrafter,
    "tree_model": TreeModelDrafter,
    "ngram_tree": NGramTreeDrafter,
    "prompt_lookup_tree": PromptLookupTreeDrafter,
    "feature": FeatureDrafter,
    "feature_tree": FeatureTreeDrafter,
}
"""Every shipped drafter class by its registry name."""


def register_drafter(name: str, cls: Optional[type] = None) -> Any:
  """Adds the drafter class `cls` to `DRAFTERS` under `name`, so that `get_drafter`, gin's
  `DRAFTER` name and the main job build it from its fields; `register_drafter(name)` alone is a
  class decorator. Returns `cls`.

  A drafter class is a frozen dataclass (hashable: the loops take it as a static argument)
  with the `Drafter` protocol's `init`, `propose` and `update` (docs/drafters_verifiers.md
  walks one through). ValueError naming what is missing, or the class already registered
  under `name`."""
  if cls is None:
    return lambda c: register_drafter(name, c)
  if not isinstance(name, str) or not name.isidentifier():
    raise ValueError(f"a drafter's registry name is an identifier, got {name!r}")
  what = getattr(cls, "__name__", repr(cls))
  if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
    raise ValueError(f"drafter {name!r}: {what} is not a dataclass (a drafter is static, "
                     "hashable configuration: @dataclasses.dataclass(frozen=True))")
  if not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
    raise ValueError(f"drafter {name!r}: {what} must be frozen (jit hashes it)")
  missing = [m for m in ("init", "propose", "update") if not callable(getattr(cls, m, None))]
  if missing:
    raise ValueError(f"drafter {name!r}: {what} has no {missing[0]}() (the Drafter protocol: "
                     "init, propose, update)")
  if DRAFTERS.get(name, cls) is not cls:
    raise ValueError(f"drafter name {name!r} is taken by {DRAFTERS[name].__name__}")
  DRAFTERS[name] = cls
  return cls


def drafter_fields(name: str) -> tuple:
  """The field names of the drafter class registered under `name` (its constructor's)."""
  return tuple(f.name for f in dataclasses.fields(_drafter_class(name)))


def get_drafter(name: str, offered: Optional[Mapping[str, Any]] = None, **fields) -> Drafter:
  """The drafter registered under `name`, built from its fields.

  Args:
    name: the registry name ('model' | 'ngram' | 'prompt_lookup' | 'hierarchical' |
      'tree_model' | 'ngram_tree' | 'prompt_lookup_tree' | 'feature' | 'feature_tree', or
      one added by `register_drafter`).
    offered: values a caller has for any drafter (e.g. the main job's {'model': the draft
      model, 'vocab': the target's vocabulary size, 'max_gamma': ..., 'tree': ...}); each is
      passed only when the class has a field of that name.
    **fields: fields of its dataclass, passed as given (an unknown one is a ValueError).
  Raises:
    ValueError naming the unknown name, an unknown field, or a required field not given.
  """
  cls = _drafter_class(name)
  known = drafter_fields(name)
  unknown = sorted(set(fields) - set(known))
  if unknown:
    raise ValueError(f"drafter {name!r} ({cls.__name__}) has no field {unknown[0]!r}; its "
                     f"fields are {list(known)}")
  given = {k: v for k, v in (offered or {}).items() if k in known}
  given.update(fields)
  missing = [f.name for f in dataclasses.fields(cls) if f.name not in given
             and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
  if missing:
    raise ValueError(f"drafter {name!r} ({cls.__name__}) needs {missing[0]!r}; its fields are "
                     f"{list(known)}")
  return cls(**given)


def _drafter_class(name: str) -> type:
  if name not in DRAFTERS:
    raise ValueError(f"unknown drafter {name!r}; choose one of {sorted(DRAFTERS)}")
  return DRAFTERS[name]
