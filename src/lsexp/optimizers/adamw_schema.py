"""optimizer=adamw: mindspore.nn.AdamWeightDecay (decoupled weight decay). It takes no loss_scale: under
fixed_nodrop the train step divides the gradients by the scale before the update."""

from __future__ import annotations

from dataclasses import dataclass

from lsexp.config.schema import AdamFamilyConfig
from lsexp.optimizers.betas import problems  # noqa: F401  (this family's checks)


@dataclass
class AdamWeightDecayConfig(AdamFamilyConfig):
    _target_: str = "mindspore.nn.AdamWeightDecay"


SCHEMA = AdamWeightDecayConfig
