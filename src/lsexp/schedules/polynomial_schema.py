"""lr_schedule=polynomial: nn.PolynomialDecayLR from optimizer.learning_rate to end_learning_rate at
total_steps, after an optional linear warm-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lsexp.config.schema import WarmupScheduleConfig


@dataclass
class PolynomialConfig(WarmupScheduleConfig):
    _target_: str = "lsexp.schedules.cells.polynomial"
    warmup_steps: Optional[int] = 0
    end_learning_rate: float = 0.0001
    power: float = 1.0


SCHEMA = PolynomialConfig
