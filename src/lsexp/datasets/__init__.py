"""The dataset group: one module per data set (what its `_target_` calls) and its schema beside it
(`<name>_schema.py`, imports nothing heavy: the keys, the file checks, the training-set size).

A data set tells the model its shapes and class count through its keys (`${dataset.num_classes}`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import MISSING


@dataclass
class DatasetConfig:
    _target_: str = MISSING
    batch_size: int = 32
    drop_remainder: bool = True
    shuffle: bool = True
    num_classes: int = 10
    seed: int = "${train.seed}"  # type: ignore[assignment]


@dataclass
class ImageDatasetConfig(DatasetConfig):
    num_channel: int = 1
    image_size: int = 32


@dataclass
class FileDatasetConfig(DatasetConfig):
    path: Optional[str] = None
    # mindspore.dataset map workers; 1 leaves the other core to MindSpore's executor (see README, Performance).
    num_parallel_workers: int = 1


@dataclass
class ImageFileDatasetConfig(FileDatasetConfig, ImageDatasetConfig):
    """Images read by one of MindSpore's loaders (MnistDataset, Cifar10Dataset, ImageFolderDataset)."""

    # memory: the loader's uint8 records are read once and each batch is made from them, because the
    # pipeline's per-row cost is a large part of a small network's step; stream: the pipeline reads
    # every epoch, for sets that do not fit; auto: memory when the records take <= cache_max_mb.
    cache: str = "auto"
    cache_max_mb: int = 1024
