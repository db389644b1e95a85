"""optimizer=lamb: mindspore.nn.Lamb (layer-wise trust ratio; its bias correction reads the optimizer's
global_step). It takes no loss_scale: under fixed_nodrop the train step divides the gradients by the
scale before the update. MindSpore 2.10's nn.Lamb runs its fused Lamb primitive, which has no CPU
kernel ("Unsupported op [Lamb] on CPU" when the step compiles), so on CPU it is refused before anything
is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from lsexp.config.schema import AdamFamilyConfig
from lsexp.optimizers import betas


@dataclass
class LambConfig(AdamFamilyConfig):
    _target_: str = "mindspore.nn.Lamb"


def problems(cfg) -> List[str]:
    from lsexp.runtime.device import resolve_target

    p = betas.problems(cfg)
    try:
        target = resolve_target(cfg.device.device_target)
    except KeyError:  # an unknown target is device_problems' to name
        return p
    if target == "CPU":
        p.append("optimizer=lamb on device_target=CPU: MindSpore's nn.Lamb runs its fused Lamb kernel, "
                 "which has no CPU kernel; use optimizer=adamw on CPU, or device=gpu or device=ascend")
    return p


SCHEMA = LambConfig
