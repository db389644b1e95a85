"""A model and a data set defined outside lsexp, trained through `_target_`:

    PYTHONPATH=examples python -m lsexp model._target_=my_pkg.MyNet +model.depth=4 \\
        dataset._target_=my_pkg.make_data

lsexp passes the model node's keys to the class (num_class, num_channel and image_size from the data
set, plus any you add with +model.<key>=...) and the dataset node's keys to the function. The
network then gets the same amp levels, loss-scale strategies, injection and tracking as lsexp's own.
"""

import numpy as np
from mindspore import nn


class MyNet(nn.Cell):
    """`depth` 3x3 convolutions with ReLU and a 2x2 max-pool, then one Dense layer."""

    def __init__(self, num_class: int, num_channel: int, image_size: int = 32, depth: int = 2,
                 width: int = 8):
        super().__init__()
        layers = []
        for i in range(depth):
            layers += [nn.Conv2d(num_channel if i == 0 else width, width, 3, pad_mode="same"), nn.ReLU()]
        self.features = nn.SequentialCell(layers + [nn.MaxPool2d(2, 2), nn.Flatten()])
        self.head = nn.Dense(width * (image_size // 2) ** 2, num_class)

    def construct(self, x):
        return self.head(self.features(x))


def make_data(num_samples=1024, num_classes=10, num_channel=1, image_size=32, seed=1, **_):
    """Bright squares whose position gives the class, on noise: (x, y, x_val, y_val), int labels.
    Return a mindspore.dataset.Dataset of (image, label) instead to stream data of your own."""
    rng = np.random.default_rng(seed)
    n = num_samples + num_samples // 4
    labels = rng.integers(0, num_classes, size=n)
    x = rng.normal(0, 0.5, size=(n, num_channel, image_size, image_size)).astype(np.float32)
    cell = image_size // num_classes
    for i, c in enumerate(labels):
        x[i, :, c * cell:(c + 1) * cell, :cell] += 2.0
    return x[:num_samples], labels[:num_samples], x[num_samples:], labels[num_samples:]


def make_dataset(num_samples=1024, num_classes=10, num_channel=1, image_size=32, seed=1, **_):
    """The same data as a (train, eval) pair of mindspore.dataset pipelines of (image, int label);
    lsexp adds the one-hot labels and the batches."""
    import mindspore.dataset as ds

    x, y, x_val, y_val = make_data(num_samples, num_classes, num_channel, image_size, seed)
    columns = ["image", "label"]
    return (ds.NumpySlicesDataset((x, y.astype(np.int32)), column_names=columns, shuffle=False),
            ds.NumpySlicesDataset((x_val, y_val.astype(np.int32)), column_names=columns, shuffle=False))
