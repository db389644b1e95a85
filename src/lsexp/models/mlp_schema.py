from dataclasses import dataclass, field
from typing import List

from lsexp.config.schema import ImageModelConfig
from lsexp.models import scaling_problems


@dataclass
class MLPConfig(ImageModelConfig):
    _target_: str = "lsexp.models.mlp.MLP"
    hidden_units: List[int] = field(default_factory=lambda: [256, 128])
    scaling: str = "standard"  # or "unit": unit scaling (lsexp.models.unit), Blake et al. 2023


SCHEMA = MLPConfig


def problems(cfg) -> List[str]:
    units, p = list(cfg.model.hidden_units), []
    if any(u < 1 for u in units):
        p.append(f"model.hidden_units={units}: every hidden layer needs >= 1 unit; e.g. [256, 128], "
                 f"or [] for no hidden layer")
    return p + scaling_problems(cfg)
