from dataclasses import dataclass
from typing import List

from lsexp.config.schema import ImageDatasetConfig


@dataclass
class SyntheticConfig(ImageDatasetConfig):
    _target_: str = "lsexp.datasets.synthetic.synthetic"
    num_samples: int = 1024


SCHEMA = SyntheticConfig


def num_train(d) -> int:
    return int(d.num_samples)


def problems(cfg) -> List[str]:
    d = cfg.dataset
    if d.num_samples < max(d.batch_size, 1):
        return [f"dataset.num_samples={d.num_samples}: fewer than one batch of {d.batch_size}; raise it"]
    return []
