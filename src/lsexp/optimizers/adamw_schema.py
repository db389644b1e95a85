"""optimizer=adamw: mindspore.nn.AdamWeightDecay (decoupled weight decay). It takes no loss_scale: under
fixed_nodrop the train step divides the gradients by the scale before the update."""

from __future__ import annotations

from dataclasses import dataclass

from lsexp.config.schema import AdamFamilyConfig
from lsexp.optimizers.betas import problems  # noqa: F401  (this family's checks)


@dataclass
class AdamWeightDecayConfig(AdamFamilyConfig):
    _target_: str = "mindspore.nn.AdamWeightDecay"

# train.mean_over_tokens: with gradients K times smaller, eps / K keeps m / (sqrt(v) + eps), the update
MEAN_OVER_TOKENS = "eps"

SCHEMA = AdamWeightDecayConfig
