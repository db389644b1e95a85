"""CIFAR-10 in its binary version, read by mindspore.dataset.Cifar10Dataset."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from lsexp.config.schema import ImageFileDatasetConfig
from lsexp.datasets.files import cache_problems, folder, problem

TRAIN = [f"data_batch_{i}.bin" for i in range(1, 6)]
TEST = ["test_batch.bin"]
SIDE = 32
RECORDS, RECORD_BYTES = 10000, 1 + 3 * SIDE * SIDE  # MindSpore 2.10 reads whole 10 000-record files only
FOLDER = "cifar-10-batches-bin"
EXPECTED = f"the folder {FOLDER}/ (or its parent) with {', '.join(TRAIN + TEST)}"
SOURCE = "unpack cifar-10-binary.tar.gz, the binary version from https://www.cs.toronto.edu/~kriz/cifar.html"


@dataclass
class Cifar10Config(ImageFileDatasetConfig):
    _target_: str = "lsexp.datasets.cifar10.cifar10"
    num_channel: int = 3
    image_size: int = SIDE


SCHEMA = Cifar10Config


def batches_dir(path: str) -> Optional[Path]:
    p = Path(path).expanduser()
    return p / FOLDER if (p / FOLDER).is_dir() else p


def num_train(d) -> int:
    return len(TRAIN) * RECORDS


def record_bytes(image_size: int) -> int:
    """What the training and test records take in memory (uint8 images at image_size, a 4-byte label each)."""
    return len(TRAIN + TEST) * RECORDS * (3 * image_size * image_size + 4)


def problems(cfg) -> List[str]:
    d = cfg.dataset
    p = _file_problems(d)
    return p + cache_problems(d, None if p else record_bytes(d.image_size))


def _file_problems(d) -> List[str]:
    _, p = folder(d.path, EXPECTED, SOURCE)
    if p:
        return p
    root = batches_dir(d.path)
    for name in TRAIN + TEST:
        f = root / name
        if not f.is_file():
            return [problem(d.path, f"{name} is missing", EXPECTED, SOURCE)]
        if f.stat().st_size != RECORDS * RECORD_BYTES:
            return [
                problem(
                    d.path,
                    f"{name} has {f.stat().st_size} bytes, not the {RECORDS * RECORD_BYTES} of "
                    f"{RECORDS} records",
                    EXPECTED,
                    SOURCE,
                )
            ]
    if d.num_channel != 3:
        return [f"dataset.num_channel={d.num_channel}: CIFAR-10 images have 3 channels; leave it at 3"]
    return []
