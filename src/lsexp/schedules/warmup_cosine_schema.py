"""lr_schedule=warmup_cosine: a linear warm-up to optimizer.learning_rate, then a cosine decay to
min_learning_rate at total_steps."""

from __future__ import annotations

from dataclasses import dataclass

from lsexp.config.schema import WarmupScheduleConfig


@dataclass
class WarmupCosineConfig(WarmupScheduleConfig):
    _target_: str = "lsexp.schedules.cells.warmup_cosine"
    min_learning_rate: float = 0.0


SCHEMA = WarmupCosineConfig
