"""Finds the model, data set, loss-scale strategy, optimizer and lr-schedule families: each
`<family>_schema.py` in lsexp/models, lsexp/datasets, lsexp/strategies, lsexp/optimizers and
lsexp/schedules.

Adding a family is adding its module, its schema module and its YAML; nothing here names them.
A schema module holds SCHEMA (a dataclass, registered as the option `base_<family>`) and imports only
lsexp.config, so looking one up adds no import of a higher layer. It may hold
`problems(cfg) -> list[str]`, for data sets `num_train(dataset_cfg) -> int`, for strategies
STRATEGY, the object the engines ask (lsexp.strategies), and for optimizers CLASS_ON, the class to build
on a device target where MindSpore's has no kernel.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from functools import lru_cache
from types import ModuleType
from typing import Dict, Optional

PACKAGES = {
    "model": "lsexp.models",
    "dataset": "lsexp.datasets",
    "loss_scale": "lsexp.strategies",
    "optimizer": "lsexp.optimizers",
    "lr_schedule": "lsexp.schedules",
}
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


def beside(target: str) -> Optional[ModuleType]:
    """The schema module beside the module that `target` names (`pkg.mod.Class` -> `pkg.mod_schema`):
    how a family from outside lsexp, on PYTHONPATH, is found. None if there is none."""
    name = (target.rsplit(".", 1)[0] if "." in target else target) + SUFFIX
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:  # its package does not exist
        return None
    found = importlib.import_module(name) if spec is not None else None
    return found if hasattr(found, "SCHEMA") else None
