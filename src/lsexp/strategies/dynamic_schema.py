"""loss_scale=dynamic (and dynamic_seed_blog): MindSpore's DynamicLossScaleManager. On overflow the
update is skipped and the scale divided by scale_factor, down to 1; after scale_window clean steps it is
multiplied by scale_factor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from lsexp.config.schema import LossScaleConfig
from lsexp.strategies import Strategy, scale_ok


@dataclass
class DynamicLossScaleConfig(LossScaleConfig):
    _target_: str = "mindspore.amp.DynamicLossScaleManager"
    init_loss_scale: float = 2.0**24
    scale_factor: int = 2
    scale_window: int = 2000


def dynamic_problems(ls) -> List[str]:
    """The keys every dynamic scaler shares, as MindSpore's managers and DeepSpeed's name them."""
    p = []
    if not scale_ok(ls.init_loss_scale):
        p.append(
            f"loss_scale.init_loss_scale={ls.init_loss_scale}: must be a finite number >= 1 (MindSpore's "
            f"managers refuse less); e.g. 65536"
        )
    if ls.scale_factor <= 1:
        p.append(
            f"loss_scale.scale_factor={ls.scale_factor}: must be > 1, or the scale never recovers; e.g. 2"
        )
    if ls.scale_window < 1:
        p.append(f"loss_scale.scale_window={ls.scale_window}: must be >= 1 step; e.g. 2000")
    return p


class Dynamic(Strategy):
    name = "dynamic"
    changes = True

    @property
    def scale(self) -> float:
        return float(self.config.init_loss_scale)

    @property
    def floor(self) -> Optional[float]:
        return 1.0  # MindSpore's managers and scalers never go below 1

    def problems(self, cfg) -> List[str]:
        return dynamic_problems(self.config) + super().problems(cfg)

    def scaler(self):
        from mindspore.amp import DynamicLossScaler

        ls = self.config
        return DynamicLossScaler(float(ls.init_loss_scale), int(ls.scale_factor), int(ls.scale_window))

    def state_names(self, engine: str) -> Tuple[str, ...]:
        if engine == "functional":
            return ("scale_value", "counter")  # the LossScaler's own Parameters
        return ("scale_sense", "current_iterator_step", "last_overflow_iterator_step")


SCHEMA, STRATEGY = DynamicLossScaleConfig, Dynamic
