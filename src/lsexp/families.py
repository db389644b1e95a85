"""Finds the model and data set families: each `<family>_schema.py` in lsexp/models and lsexp/datasets.

Adding a family is adding its module, its schema module and its YAML; nothing here names them.
A schema module holds SCHEMA (a dataclass, registered as the option `base_<family>`) and may hold
`problems(cfg) -> list[str]` and, for data sets, `num_train(dataset_cfg) -> int`.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache
from types import ModuleType
from typing import Dict, Optional

PACKAGES = {"model": "lsexp.models", "dataset": "lsexp.datasets"}
SUFFIX = "_schema"


@lru_cache(maxsize=None)
def schemas(group: str) -> Dict[str, ModuleType]:
    """Family name -> its schema module."""
    package = importlib.import_module(PACKAGES[group])
    return {info.name[:-len(SUFFIX)]: importlib.import_module(f"{package.__name__}.{info.name}")
            for info in pkgutil.iter_modules(package.__path__) if info.name.endswith(SUFFIX)}


def of(group: str, target: str) -> Optional[ModuleType]:
    """The schema module of the family whose class or function `target` names; None for a user's own."""
    for module in schemas(group).values():
        if module.SCHEMA._target_ == target:
            return module
    return None
