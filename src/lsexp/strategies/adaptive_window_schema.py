"""loss_scale=adaptive_window: MindFormers' AdaptiveLossScaleUpdateCell (adaptive_window.py), its keys
as MindFormers names them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from lsexp.config.schema import LossScaleConfig
from lsexp.strategies import Strategy, scale_ok


@dataclass
class AdaptiveLossScaleConfig(LossScaleConfig):
    _target_: str = "lsexp.strategies.adaptive_window.AdaptiveLossScaleManager"
    loss_scale_value: float = 2.0**32
    scale_factor: int = 2
    scale_window: int = 20  # the window it starts with: one of the list, else the shortest
    max_scale_window: int = 1000
    min_scale_window: int = 20


STATE = ("scale_window", "window_code", "current_iterator_step", "last_overflow_iterator_step")


class AdaptiveWindow(Strategy):
    name = "adaptive_window"
    changes = True

    @property
    def scale(self) -> float:
        return float(self.config.loss_scale_value)

    @property
    def floor(self) -> Optional[float]:
        return 1.0  # MindFormers' minimum_loss_scale

    def problems(self, cfg) -> List[str]:
        ls, p = self.config, []
        if not scale_ok(ls.loss_scale_value):
            p.append(f"loss_scale.loss_scale_value={ls.loss_scale_value}: must be a finite number >= 1; "
                     f"e.g. 65536")
        if ls.scale_factor <= 1:
            p.append(f"loss_scale.scale_factor={ls.scale_factor}: must be > 1, or the scale never recovers; "
                     f"e.g. 2")
        if ls.min_scale_window < 1:
            p.append(f"loss_scale.min_scale_window={ls.min_scale_window}: must be >= 1 step; e.g. 20")
        elif ls.max_scale_window <= ls.min_scale_window:
            p.append(f"loss_scale.max_scale_window={ls.max_scale_window}: must be greater than "
                     f"loss_scale.min_scale_window={ls.min_scale_window} (MindFormers refuses it); e.g. 1000")
        if ls.scale_window < 1:
            p.append(f"loss_scale.scale_window={ls.scale_window}: must be >= 1 step; e.g. 20")
        return p + super().problems(cfg)

    def scaler(self):
        from hydra.utils import instantiate

        return instantiate(self.config).get_loss_scaler()

    def state_names(self, engine: str) -> Tuple[str, ...]:
        return (("scale_value",) if engine == "functional" else ("scale_sense",)) + STATE


SCHEMA, STRATEGY = AdaptiveLossScaleConfig, AdaptiveWindow
