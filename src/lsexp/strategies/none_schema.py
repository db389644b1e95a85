"""loss_scale=none: no loss scaling, MindSpore's plain TrainOneStepCell with sens 1, what ms.Model
builds without a loss-scale manager. Overflows are recorded and every update applied."""

from __future__ import annotations

from dataclasses import dataclass

from lsexp.config.schema import LossScaleConfig
from lsexp.strategies import Strategy


@dataclass
class NoLossScaleConfig(LossScaleConfig):
    _target_: str = "mindspore.nn.TrainOneStepCell"


class NoScaling(Strategy):
    name = "none"
    drops_overflow = False

    @property
    def scale(self) -> float:
        return 1.0

    def scaler(self):
        return None


SCHEMA, STRATEGY = NoLossScaleConfig, NoScaling
