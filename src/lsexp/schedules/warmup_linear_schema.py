"""lr_schedule=warmup_linear: a linear warm-up to optimizer.learning_rate, then a linear decay to
end_learning_rate at total_steps (transformers' linear schedule)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lsexp.config.schema import LrScheduleConfig


@dataclass
class WarmupLinearConfig(LrScheduleConfig):
    _target_: str = "lsexp.schedules.cells.warmup_linear"
    warmup_steps: Optional[int] = None  # None: a tenth of total_steps
    total_steps: Optional[int] = None  # None: the run's optimizer steps
    end_learning_rate: float = 0.0


SCHEMA = WarmupLinearConfig
