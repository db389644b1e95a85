from dataclasses import dataclass
from typing import List

from lsexp.config.schema import ImageModelConfig


@dataclass
class LeNet5Config(ImageModelConfig):
    _target_: str = "lsexp.models.lenet5.LeNet5"


SCHEMA = LeNet5Config
# Two valid 5x5 convolutions and two 2x2 pools leave nothing of an image smaller than this.
MIN_IMAGE_SIZE = 14


def problems(cfg) -> List[str]:
    size = cfg.model.image_size
    if size < MIN_IMAGE_SIZE:
        return [
            f"model.image_size={size}: LeNet5's two 5x5 convolutions and 2x2 pools need images of at "
            f"least {MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE}; raise dataset.image_size (MNIST and CIFAR-10 resize)"
        ]
    return []
