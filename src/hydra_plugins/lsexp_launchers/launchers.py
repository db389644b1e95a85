"""lsexp's launchers as Hydra plugins: Hydra instantiates a launcher only from the `hydra_plugins`
package, and imports every module of that package at start-up, in every Hydra app of the
environment. So these classes import nothing optional: each hands the sweep to its implementation
in `lsexp.launchers` (on hydra-ray-launcher or hydra-submitit-launcher), imported once used.
"""

from __future__ import annotations

import importlib
from typing import Any, Sequence

from hydra.plugins.launcher import Launcher


class _Delegate(Launcher):
    IMPL = ""

    def __init__(self, **params: Any) -> None:
        module, _, name = self.IMPL.rpartition(".")
        self.impl = getattr(importlib.import_module(module), name)(**params)

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        self.impl.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        return self.impl.launch(job_overrides, initial_job_idx)


class RayLauncher(_Delegate):
    IMPL = "lsexp.scaleout.launchers.ray.RayLauncher"


class SubmititLocalLauncher(_Delegate):
    IMPL = "lsexp.scaleout.launchers.submitit.LocalLauncher"


class SubmititSlurmLauncher(_Delegate):
    IMPL = "lsexp.scaleout.launchers.submitit.SlurmLauncher"
