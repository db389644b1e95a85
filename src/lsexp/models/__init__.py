"""The model group: one module per family (the nn.Cell) and its schema beside it (`<family>_schema.py`).

A schema module imports nothing heavy, so every config can be composed and checked before MindSpore
is imported; it holds `SCHEMA` (the typed keys, registered as `base_<family>`) and may hold
`problems(cfg)`, the checks a type cannot express. lsexp.families finds them; nothing central lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING


@dataclass
class ModelConfig:
    _target_: str = MISSING
    num_class: int = "${dataset.num_classes}"  # type: ignore[assignment]


@dataclass
class ImageModelConfig(ModelConfig):
    num_channel: int = "${dataset.num_channel}"  # type: ignore[assignment]
    image_size: int = "${dataset.image_size}"  # type: ignore[assignment]
