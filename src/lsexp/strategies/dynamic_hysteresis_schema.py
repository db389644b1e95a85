"""loss_scale=dynamic_hysteresis: DeepSpeed's and Megatron's dynamic scaler (dynamic_hysteresis.py):
back off only after `hysteresis` overflows, never below min_loss_scale, never above max_loss_scale
(Apex's 2^24; null: no cap)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

from lsexp.config.schema import LossScaleConfig
from lsexp.strategies import Strategy, finite_positive, scale_ok
from lsexp.strategies.dynamic_schema import Dynamic, dynamic_problems


@dataclass
class HysteresisLossScaleConfig(LossScaleConfig):
    _target_: str = "lsexp.strategies.dynamic_hysteresis.HysteresisLossScaleManager"
    init_loss_scale: float = 2.0**16
    hysteresis: int = 2  # overflows until a back-off; 1 is MindSpore's DynamicLossScaleManager
    consecutive_hysteresis: bool = False  # restore the tolerance after any clean step, not only at growth
    min_loss_scale: float = 1.0
    max_loss_scale: Optional[float] = 2.0**24
    scale_factor: int = 2
    scale_window: int = 1000


class Hysteresis(Dynamic):
    """Dynamic, with DeepSpeed's hysteresis and floor, Apex's cap, and its own scaler."""

    name = "dynamic_hysteresis"

    @property
    def floor(self) -> Optional[float]:
        return float(self.config.min_loss_scale)

    def problems(self, cfg) -> List[str]:
        ls, p = self.config, dynamic_problems(self.config)
        if ls.hysteresis < 1:
            p.append(
                f"loss_scale.hysteresis={ls.hysteresis}: must be >= 1 (1 backs off at every overflow); e.g. 2"
            )
        if not finite_positive(ls.min_loss_scale):
            p.append(f"loss_scale.min_loss_scale={ls.min_loss_scale}: must be a finite number > 0; e.g. 1")
        elif ls.max_loss_scale is not None and not (
            finite_positive(ls.max_loss_scale) and ls.max_loss_scale >= ls.min_loss_scale
        ):
            p.append(
                f"loss_scale.max_loss_scale={ls.max_loss_scale}: must be a finite number >= loss_scale."
                f"min_loss_scale={ls.min_loss_scale}, or null for no cap; e.g. 16777216"
            )
        elif scale_ok(ls.init_loss_scale) and not (
            ls.min_loss_scale <= ls.init_loss_scale <= (ls.max_loss_scale or math.inf)
        ):
            p.append(
                f"loss_scale.init_loss_scale={ls.init_loss_scale}: must lie between loss_scale."
                f"min_loss_scale={ls.min_loss_scale} and loss_scale.max_loss_scale={ls.max_loss_scale}"
            )
        return p + Strategy.problems(self, cfg)  # the optimizer.loss_scale check; the dynamic keys are above

    def scaler(self):
        from hydra.utils import instantiate

        return instantiate(self.config).get_loss_scaler()

    def state_names(self, engine: str) -> Tuple[str, ...]:
        names = ("lsexp_cur_hysteresis", "lsexp_hysteresis_iter", "lsexp_last_overflow_iter")
        return (("scale_value",) if engine == "functional" else ("scale_sense",)) + names


SCHEMA, STRATEGY = HysteresisLossScaleConfig, Hysteresis
