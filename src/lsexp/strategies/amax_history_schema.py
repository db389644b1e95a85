"""loss_scale=amax_history: a scale predicted from a history of the gradients' amax (amax_history.py),
after Transformer Engine's DelayedScaling recipe; its keys as TE and DeepSpeed name them where they
have them (margin, amax_compute_algo; init_loss_scale, min_loss_scale, max_loss_scale)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from lsexp.config.schema import LossScaleConfig
from lsexp.strategies import Strategy, finite_positive, scale_ok

ALGOS = ("max", "most_recent")  # TE's amax_compute_algo, as strings
STATE = ("lsexp_amax_history", "lsexp_amax_ceiling", "lsexp_amax_calm")


@dataclass
class AmaxHistoryConfig(LossScaleConfig):
    _target_: str = "lsexp.strategies.amax_history.AmaxHistoryLossScaleManager"
    init_loss_scale: float = 2.0**16  # until the history has its first entry
    history_len: int = 16  # TE's amax_history_len
    amax_compute_algo: str = "max"  # or most_recent
    margin: int = 0  # powers of two kept free below float16's largest value
    backoff_factor: float = 2.0  # the scale is divided by it on overflow
    min_loss_scale: float = 1.0
    max_loss_scale: float = 2.0**24


class AmaxHistory(Strategy):
    name = "amax_history"
    changes = True
    measures_amax = True

    @property
    def scale(self) -> float:
        return float(self.config.init_loss_scale)

    @property
    def floor(self) -> Optional[float]:
        return float(self.config.min_loss_scale)

    def problems(self, cfg) -> List[str]:
        ls, p = self.config, []
        if not scale_ok(ls.init_loss_scale):
            p.append(f"loss_scale.init_loss_scale={ls.init_loss_scale}: must be a finite number >= 1; "
                     f"e.g. 65536")
        if ls.history_len < 1:
            p.append(f"loss_scale.history_len={ls.history_len}: must be >= 1 step; e.g. 16")
        if ls.amax_compute_algo not in ALGOS:
            p.append(f"loss_scale.amax_compute_algo={ls.amax_compute_algo}: must be one of "
                     f"{', '.join(ALGOS)}; e.g. max")
        if ls.margin < 0:
            p.append(f"loss_scale.margin={ls.margin}: must be >= 0 (powers of two kept free below float16's "
                     f"largest value); e.g. 0 or 2")
        if not (finite_positive(ls.backoff_factor) and ls.backoff_factor > 1):
            p.append(f"loss_scale.backoff_factor={ls.backoff_factor}: must be > 1, or an overflow does not "
                     f"lower the scale; e.g. 2")
        if not scale_ok(ls.min_loss_scale):
            p.append(f"loss_scale.min_loss_scale={ls.min_loss_scale}: must be a finite number >= 1; e.g. 1")
        if not scale_ok(ls.max_loss_scale):
            p.append(f"loss_scale.max_loss_scale={ls.max_loss_scale}: must be a finite number >= 1; "
                     f"e.g. 16777216")
        elif scale_ok(ls.min_loss_scale) and ls.min_loss_scale > ls.max_loss_scale:
            p.append(f"loss_scale.min_loss_scale={ls.min_loss_scale}: must be <= loss_scale.max_loss_scale="
                     f"{ls.max_loss_scale}; e.g. 1")
        return p + super().problems(cfg)

    def scaler(self):
        from hydra.utils import instantiate

        return instantiate(self.config).get_loss_scaler()

    def state_names(self, engine: str) -> Tuple[str, ...]:
        return (("scale_value",) if engine == "functional" else ("scale_sense",)) + STATE


SCHEMA, STRATEGY = AmaxHistoryConfig, AmaxHistory
