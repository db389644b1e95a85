"""optimizer=momentum: mindspore.nn.Momentum, the seed's optimizer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from lsexp.config.schema import ScaledOptimizerConfig


@dataclass
class MomentumConfig(ScaledOptimizerConfig):
    _target_: str = "mindspore.nn.Momentum"
    momentum: float = 0.9
    use_nesterov: bool = False


def problems(cfg) -> List[str]:
    if cfg.optimizer.momentum < 0:
        return [f"optimizer.momentum={cfg.optimizer.momentum}: must be >= 0; e.g. 0.9"]
    return []


SCHEMA = MomentumConfig
