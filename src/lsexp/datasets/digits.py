"""scikit-learn's bundled 8x8 digits, upscaled to image_size and standardised, held in memory."""

import numpy as np

from lsexp.datasets.digits_schema import SAMPLES
from lsexp.datasets.kinds import Arrays, one_hot


def digits(val_fraction=0.2, num_classes=10, num_channel=1, image_size=32, seed=1, **_) -> Arrays:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    assert len(bunch.target) == SAMPLES
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
    return Arrays(x[train], one_hot(labels[train], num_classes), x[val], labels[val].astype(np.int32))
