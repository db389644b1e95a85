"""optimizer=lamb: mindspore.nn.Lamb (layer-wise trust ratio; its bias correction reads the optimizer's
global_step). It takes no loss_scale: under fixed_nodrop the train step divides the gradients by the
scale before the update. MindSpore 2.10's nn.Lamb runs its fused Lamb primitive, which has no CPU
kernel, so on CPU the class built is lsexp.optimizers.lamb.CpuLamb, nn.Lamb with that primitive
written out as its GPU kernel computes it."""

from __future__ import annotations

from dataclasses import dataclass

from lsexp.config.schema import AdamFamilyConfig
from lsexp.optimizers.betas import problems  # noqa: F401  (this family's checks)


@dataclass
class LambConfig(AdamFamilyConfig):
    _target_: str = "mindspore.nn.Lamb"


# No MEAN_OVER_TOKENS: the trust ratio's denominator takes eps inside the root (sqrt(v + eps)) and the
# update outside it (sqrt(v) + eps), so with gradients K times smaller no one eps keeps both; lsexp
# refuses train.mean_over_tokens with lamb (tests/test_mean_over_tokens.py).
# device target -> the class built there instead of _target_'s, which has no kernel on it
CLASS_ON = {"CPU": "lsexp.optimizers.lamb.CpuLamb"}
SCHEMA = LambConfig
