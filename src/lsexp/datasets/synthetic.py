"""The seed article's data: N(0,1) images with uniform random labels, held in memory."""

import numpy as np

from lsexp.datasets.kinds import Arrays, one_hot


def synthetic(num_samples=1024, num_classes=10, num_channel=1, image_size=32, seed=1, **_) -> Arrays:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((num_samples, num_channel, image_size, image_size), dtype=np.float32)
    labels = rng.integers(0, num_classes, size=num_samples)
    return Arrays(x, one_hot(labels, num_classes))
