"""MNIST in its original IDX files, read by mindspore.dataset.MnistDataset."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, List

from lsexp.config.schema import ImageFileDatasetConfig
from lsexp.datasets.files import cache_problems, folder, problem

FILES = {  # split -> (images, labels), as MnistDataset names them
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
EXPECTED = "the four uncompressed IDX files " + ", ".join(f for pair in FILES.values() for f in pair)
SOURCE = "gunzip the four .gz files of https://yann.lecun.com/exdb/mnist/ or an official mirror into it"
SIDE = 28


@dataclass
class MnistConfig(ImageFileDatasetConfig):
    _target_: str = "lsexp.datasets.mnist.mnist"
    image_size: int = 32  # resized from 28, as MindSpore's LeNet tutorial does; 28 keeps them as they are


SCHEMA = MnistConfig


@lru_cache(maxsize=8)
def record_counts(path: str) -> Dict[str, int] | str:
    """Records per split from the IDX headers, or what is wrong with the files."""
    root, _ = folder(path, EXPECTED, SOURCE)
    counts = {}
    for split, (images, labels) in FILES.items():
        sizes = []
        for name, magic, header in ((images, 2051, 16), (labels, 2049, 8)):
            f = root / name
            if not f.is_file():
                gz = " (found it gzipped: gunzip it)" if Path(f"{f}.gz").is_file() else ""
                return f"{name} is missing{gz}"
            with open(f, "rb") as fh:
                head = fh.read(header)
            if len(head) < header or struct.unpack(">I", head[:4])[0] != magic:
                return f"{name} is not an IDX file (bad header)"
            n = struct.unpack(">I", head[4:8])[0]
            want = header + n * (SIDE * SIDE if magic == 2051 else 1)
            if f.stat().st_size != want:
                return f"{name} is truncated or padded ({f.stat().st_size} bytes, its header says {want})"
            sizes.append(n)
        if sizes[0] != sizes[1]:
            return f"{images} has {sizes[0]} images but {labels} has {sizes[1]} labels"
        counts[split] = sizes[0]
    return counts


def num_train(d) -> int:
    return record_counts(str(d.path))["train"]


def record_bytes(path: str, image_size: int) -> int:
    """What both splits take in memory as records (uint8 images at image_size, a 4-byte label each)."""
    return sum(record_counts(path).values()) * (image_size * image_size + 4)


def problems(cfg) -> List[str]:
    d = cfg.dataset
    p = _file_problems(d)
    return p + cache_problems(d, None if p else record_bytes(str(d.path), d.image_size))


def _file_problems(d) -> List[str]:
    root, p = folder(d.path, EXPECTED, SOURCE)
    if p:
        return p
    counts = record_counts(str(root))
    if isinstance(counts, str):
        return [problem(d.path, counts, EXPECTED, SOURCE)]
    if d.num_channel != 1:
        return [f"dataset.num_channel={d.num_channel}: MNIST images have 1 channel; leave it at 1"]
    return []
