"""optimizer=adamw: mindspore.nn.AdamWeightDecay (decoupled weight decay). It takes no loss_scale: under
fixed_nodrop the train step divides the gradients by the scale before the update."""

from __future__ import annotations

from dataclasses import dataclass

from lsexp.config.schema import OptimizerConfig
from lsexp.optimizers.betas import problems  # noqa: F401  (this family's checks)


@dataclass
class AdamWeightDecayConfig(OptimizerConfig):
    _target_: str = "mindspore.nn.AdamWeightDecay"
    learning_rate: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6


SCHEMA = AdamWeightDecayConfig
