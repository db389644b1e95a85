"""loss_scale=fixed_drop and fixed_nodrop: MindSpore's FixedLossScaleManager, a constant scale.
Overflowed updates are skipped (drop_overflow_update: true) or applied, with the optimizer's own
loss_scale dividing the gradients, as ms.Model builds it (false)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from lsexp.config.schema import LossScaleConfig
from lsexp.strategies import Strategy, finite_positive, scale_ok


@dataclass
class FixedLossScaleConfig(LossScaleConfig):
    _target_: str = "mindspore.amp.FixedLossScaleManager"
    loss_scale: float = 128.0
    drop_overflow_update: bool = True


class Fixed(Strategy):
    @property
    def name(self) -> str:
        return "fixed_drop" if self.drops_overflow else "fixed_nodrop"

    @property
    def drops_overflow(self) -> bool:
        return bool(self.config.drop_overflow_update)

    @property
    def scale(self) -> float:
        return float(self.config.loss_scale)

    @property
    def optimizer_loss_scale(self) -> float:
        # What ms.Model builds for drop_overflow_update=False: the gradients reach the optimizer scaled.
        return 1.0 if self.drops_overflow else self.scale

    def problems(self, cfg) -> List[str]:
        ls, opt = self.config, cfg.optimizer.get("loss_scale")
        p = []
        if not scale_ok(ls.loss_scale):
            p.append(
                f"loss_scale.loss_scale={ls.loss_scale}: must be a finite number >= 1 (MindSpore's managers "
                f"refuse less); e.g. 1024"
            )
        if self.drops_overflow or opt is None or not finite_positive(opt):
            return p + super().problems(cfg)
        if finite_positive(ls.loss_scale) and opt != ls.loss_scale:
            p.append(
                f"optimizer.loss_scale={opt} with loss_scale={self.name} (loss_scale.loss_scale="
                f"{ls.loss_scale}): every update would be scaled by {ls.loss_scale / opt:g}; "
                f"set optimizer.loss_scale={ls.loss_scale} or leave it unset"
            )
        return p

    def scaler(self):
        from mindspore.amp import StaticLossScaler

        return StaticLossScaler(self.scale)

    def state_names(self, engine: str) -> Tuple[str, ...]:
        return ()  # a constant: the config restores it


SCHEMA, STRATEGY = FixedLossScaleConfig, Fixed
