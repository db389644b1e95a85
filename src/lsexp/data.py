"""The data sets, held in memory as numpy arrays and served as batches in a seeded order.

Both data sets are a few MB, so a MindSpore dataset pipeline (worker threads competing with the
training step for two cores) buys nothing. Keeping the order a pure function of (seed, epoch) is
what lets a resumed run see exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

import numpy as np

# scikit-learn's bundled copy of the UCI digits; its size is part of the package, not a download.
DIGITS_SAMPLES = 1797


@dataclass
class Data:
    x: np.ndarray  # float32, (N, C, H, W)
    y: np.ndarray  # float32 one-hot, (N, num_classes)
    x_val: Optional[np.ndarray] = None
    y_val: Optional[np.ndarray] = None  # int labels


def _one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    return np.eye(num_classes, dtype=np.float32)[labels]


def synthetic(num_samples=1024, num_classes=10, num_channel=1, image_size=32, seed=1, **_) -> Data:
    """The seed article's data: N(0,1) images with uniform random labels, one-hot."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((num_samples, num_channel, image_size, image_size), dtype=np.float32)
    labels = rng.integers(0, num_classes, size=num_samples)
    return Data(x, _one_hot(labels, num_classes))


def digits(val_fraction=0.2, num_classes=10, num_channel=1, image_size=32, seed=1, **_) -> Data:
    """scikit-learn's 8x8 digits, nearest-neighbour upscaled to image_size and standardised."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    assert len(bunch.target) == DIGITS_SAMPLES
    reps = image_size // 8
    images = bunch.images.astype(np.float32).repeat(reps, axis=1).repeat(reps, axis=2)
    pad = image_size - images.shape[1]
    images = np.pad(images, ((0, 0), (pad // 2, pad - pad // 2), (pad // 2, pad - pad // 2)))
    images = (images - images.mean()) / images.std()
    x = np.repeat(images[:, None], num_channel, axis=1)
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = int(round(len(x) * val_fraction))
    val, train = order[:n_val], order[n_val:]
    labels = bunch.target
    return Data(x[train], _one_hot(labels[train], num_classes), x[val], labels[val].astype(np.int32))


def num_train_samples(dataset_cfg) -> int:
    """The training-set size a config implies, without building the data."""
    if "num_samples" in dataset_cfg:
        return int(dataset_cfg.num_samples)
    return DIGITS_SAMPLES - int(round(DIGITS_SAMPLES * dataset_cfg.val_fraction))


def batches(data: Data, batch_size: int, epoch: int, *, shuffle: bool, drop_remainder: bool, seed: int,
            start: int = 0) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """The batches of one epoch (0-based), from batch index `start` on."""
    n = len(data.x)
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    stop = n - n % batch_size if drop_remainder else n
    for lo in range(start * batch_size, stop, batch_size):
        idx = order[lo:lo + batch_size]
        yield data.x[idx], data.y[idx]
