"""lr_schedule=warmup_cosine: a linear warm-up to optimizer.learning_rate, then a cosine decay to
min_learning_rate at total_steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lsexp.config.schema import LrScheduleConfig


@dataclass
class WarmupCosineConfig(LrScheduleConfig):
    _target_: str = "lsexp.schedules.cells.warmup_cosine"
    warmup_steps: Optional[int] = None  # None: a tenth of total_steps
    total_steps: Optional[int] = None  # None: the run's optimizer steps
    min_learning_rate: float = 0.0


SCHEMA = WarmupCosineConfig
