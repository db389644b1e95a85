"""lr_schedule=constant: optimizer.learning_rate at every step, the default."""

from __future__ import annotations

from dataclasses import dataclass

from lsexp.config.schema import LrScheduleConfig


@dataclass
class ConstantConfig(LrScheduleConfig):
    _target_: str = "lsexp.schedules.cells.constant"


SCHEMA = ConstantConfig
