"""loss_scale=megatron: Megatron-LM's DynamicGradScaler (dynamic_hysteresis.py), its arguments as
Megatron names them: back off by backoff_factor at the hysteresis-th overflow since the last growth,
grow by growth_factor on the growth_interval-th clean step in a row, never below min_scale, no cap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from lsexp.config.schema import LossScaleConfig
from lsexp.strategies import Strategy, finite_positive, scale_ok


@dataclass
class MegatronGradScalerConfig(LossScaleConfig):
    _target_: str = "lsexp.strategies.dynamic_hysteresis.MegatronGradScalerManager"
    initial_scale: float = 2.0**32
    min_scale: float = 1.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 1000
    hysteresis: int = 2


class Megatron(Strategy):
    name = "megatron"
    changes = True

    @property
    def scale(self) -> float:
        return float(self.config.initial_scale)

    @property
    def floor(self) -> Optional[float]:
        return float(self.config.min_scale)

    def problems(self, cfg) -> List[str]:
        ls, p = self.config, []  # Megatron's own asserts, each as one line
        if not scale_ok(ls.initial_scale):
            p.append(f"loss_scale.initial_scale={ls.initial_scale}: must be a finite number >= 1; e.g. 65536")
        if not finite_positive(ls.min_scale):
            p.append(f"loss_scale.min_scale={ls.min_scale}: must be a finite number > 0; e.g. 1")
        elif scale_ok(ls.initial_scale) and ls.min_scale > ls.initial_scale:
            p.append(f"loss_scale.min_scale={ls.min_scale}: must be <= loss_scale.initial_scale="
                     f"{ls.initial_scale}")
        if not (finite_positive(ls.growth_factor) and ls.growth_factor > 1):
            p.append(f"loss_scale.growth_factor={ls.growth_factor}: must be > 1; e.g. 2.0")
        if not (finite_positive(ls.backoff_factor) and ls.backoff_factor < 1):
            p.append(f"loss_scale.backoff_factor={ls.backoff_factor}: must lie between 0 and 1; e.g. 0.5")
        if ls.growth_interval < 1:
            p.append(f"loss_scale.growth_interval={ls.growth_interval}: must be >= 1 step; e.g. 1000")
        if ls.hysteresis < 1:
            p.append(f"loss_scale.hysteresis={ls.hysteresis}: must be >= 1 (1 backs off at every overflow); "
                     f"e.g. 2")
        return p + super().problems(cfg)

    def scaler(self):
        from hydra.utils import instantiate

        return instantiate(self.config).get_loss_scaler()

    def state_names(self, engine: str) -> Tuple[str, ...]:
        names = ("lsexp_cur_hysteresis", "lsexp_hysteresis_iter", "lsexp_last_overflow_iter")
        return (("scale_value",) if engine == "functional" else ("scale_sense",)) + names


SCHEMA, STRATEGY = MegatronGradScalerConfig, Megatron
