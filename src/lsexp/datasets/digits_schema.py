from dataclasses import dataclass
from typing import List

from lsexp.config.schema import ImageDatasetConfig

# scikit-learn's bundled copy of the UCI digits; its size is part of the package, not a download.
SAMPLES = 1797


@dataclass
class DigitsConfig(ImageDatasetConfig):
    _target_: str = "lsexp.datasets.digits.digits"
    val_fraction: float = 0.2


SCHEMA = DigitsConfig


def num_train(d) -> int:
    return SAMPLES - int(round(SAMPLES * d.val_fraction))


def problems(cfg) -> List[str]:
    d = cfg.dataset
    if not 0 < d.val_fraction < 1:
        return [f"dataset.val_fraction={d.val_fraction}: must be between 0 and 1; e.g. 0.2"]
    if d.image_size < 8:
        return [f"dataset.image_size={d.image_size}: the digits are 8x8, so use 8 or more; e.g. 32"]
    return []
