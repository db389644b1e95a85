"""lr_schedule=warmup_linear: a linear warm-up to optimizer.learning_rate, then a linear decay to
end_learning_rate at total_steps (transformers' linear schedule)."""

from __future__ import annotations

from dataclasses import dataclass

from lsexp.config.schema import WarmupScheduleConfig


@dataclass
class WarmupLinearConfig(WarmupScheduleConfig):
    _target_: str = "lsexp.schedules.cells.warmup_linear"
    end_learning_rate: float = 0.0


SCHEMA = WarmupLinearConfig
