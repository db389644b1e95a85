"""optimizer=sgd: mindspore.nn.SGD."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from lsexp.config.schema import ScaledOptimizerConfig


@dataclass
class SGDConfig(ScaledOptimizerConfig):
    _target_: str = "mindspore.nn.SGD"
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False


def problems(cfg) -> List[str]:
    o, p = cfg.optimizer, []
    if o.momentum < 0:
        p.append(f"optimizer.momentum={o.momentum}: must be >= 0; e.g. 0.9")
    if o.nesterov and (o.momentum <= 0 or o.dampening != 0):
        p.append(f"optimizer.nesterov=true with momentum={o.momentum}, dampening={o.dampening}: Nesterov "
                 f"needs momentum > 0 and dampening 0 (nn.SGD's rule)")
    return p


SCHEMA = SGDConfig
