from dataclasses import dataclass
from typing import List

from lsexp.config.schema import ImageModelConfig


@dataclass
class ResNetConfig(ImageModelConfig):
    _target_: str = "lsexp.models.resnet.ResNet"
    depth: int = 20  # 6n+2: 20, 32, 44, 56, 110; 8 for quick runs
    width: int = 1  # multiplies the 16/32/64 channels of the three stages


SCHEMA = ResNetConfig
# Two stride-2 stages halve the image twice, so an image needs at least 4 pixels a side.
MIN_IMAGE_SIZE = 4


def problems(cfg) -> List[str]:
    m, p = cfg.model, []
    if m.depth < 8 or (m.depth - 2) % 6:
        p.append(
            f"model.depth={m.depth}: a CIFAR ResNet has 6n+2 layers with n >= 1; use 8, 20, 32, 44, 56 or 110"
        )
    if m.width < 1:
        p.append(f"model.width={m.width}: must be >= 1 (it multiplies the 16/32/64 channels)")
    if m.image_size < MIN_IMAGE_SIZE:
        p.append(
            f"model.image_size={m.image_size}: the ResNet's two stride-2 stages need images of at least "
            f"{MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE}; raise dataset.image_size"
        )
    return p
