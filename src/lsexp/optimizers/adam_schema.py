"""optimizer=adam: mindspore.nn.Adam (L2 weight decay added to the gradients)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lsexp.config.schema import AdamFamilyConfig
from lsexp.optimizers.betas import problems  # noqa: F401  (this family's checks)


@dataclass
class AdamConfig(AdamFamilyConfig):
    _target_: str = "mindspore.nn.Adam"
    eps: float = 1e-8
    loss_scale: Optional[float] = None  # as ScaledOptimizerConfig's
    use_nesterov: bool = False
    use_amsgrad: bool = False


SCHEMA = AdamConfig
