"""optimizer=adam: mindspore.nn.Adam (L2 weight decay added to the gradients)."""

from __future__ import annotations

from dataclasses import dataclass

from lsexp.config.schema import ScaledOptimizerConfig
from lsexp.optimizers.betas import problems  # noqa: F401  (this family's checks)


@dataclass
class AdamConfig(ScaledOptimizerConfig):
    _target_: str = "mindspore.nn.Adam"
    learning_rate: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    use_nesterov: bool = False
    use_amsgrad: bool = False


SCHEMA = AdamConfig
