"""A user's own images, one folder per class, read by mindspore.dataset.ImageFolderDataset."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import List, Tuple

from omegaconf import OmegaConf

from lsexp.config.schema import ImageFileDatasetConfig
from lsexp.datasets.files import cache_problems, folder, problem

EXTENSIONS = [".png", ".jpg", ".jpeg", ".PNG", ".JPG", ".JPEG"]
EXPECTED = "one subfolder per class (its name is the class), each holding PNG or JPEG images"
SOURCE = "your own images; e.g. path/cat/1.png, path/dog/7.jpg"


@lru_cache(maxsize=8)
def scan(path: str) -> Tuple[Tuple[str, int], ...]:
    """(class folder, image count) for each class, in ImageFolderDataset's (sorted) class order."""
    root = Path(path).expanduser()
    if not root.is_dir():
        return ()
    classes = sorted(p for p in root.iterdir() if p.is_dir())
    return tuple((c.name, sum(1 for f in c.iterdir() if f.suffix in EXTENSIONS)) for c in classes)


# The class count is the folder's, known before anything is built: ${dataset.num_classes} follows it.
OmegaConf.register_new_resolver("lsexp.image_folder_classes", lambda path: len(scan(str(path))), replace=True)


@dataclass
class ImageFolderConfig(ImageFileDatasetConfig):
    _target_: str = "lsexp.datasets.image_folder.image_folder"
    num_classes: int = "${lsexp.image_folder_classes:${dataset.path}}"  # type: ignore[assignment]
    num_channel: int = 3  # RGB; 1 converts to grayscale
    image_size: int = 32  # every image is resized to image_size x image_size
    val_fraction: float = 0.2


SCHEMA = ImageFolderConfig


def num_train(d) -> int:
    total = sum(n for _, n in scan(str(d.path)))
    return total - int(round(total * d.val_fraction))


def record_bytes(path: str, image_size: int, num_channel: int) -> int:
    """What the images take in memory once decoded and resized (uint8), with a 4-byte label each."""
    return sum(n for _, n in scan(path)) * (num_channel * image_size * image_size + 4)


def problems(cfg) -> List[str]:
    d = cfg.dataset
    p = _file_problems(d)
    return p + cache_problems(d, None if p else record_bytes(str(d.path), d.image_size, d.num_channel))


def _file_problems(d) -> List[str]:
    root, p = folder(d.path, EXPECTED, SOURCE)
    if p:
        return p
    classes = scan(str(root))
    if not classes:
        return [problem(d.path, "it has no subfolders", EXPECTED, SOURCE)]
    empty = [name for name, n in classes if n == 0]
    if empty:
        return [problem(d.path, f"class folder(s) {empty[:3]} hold no PNG or JPEG image", EXPECTED, SOURCE)]
    if not 0 <= d.val_fraction < 1:
        return [f"dataset.val_fraction={d.val_fraction}: must be in [0, 1); e.g. 0.2"]
    if d.num_channel not in (1, 3):
        return [f"dataset.num_channel={d.num_channel}: images are read as RGB (3) or grayscale (1)"]
    return []
