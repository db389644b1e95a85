"""MNIST through mindspore.dataset.MnistDataset: the train split to train on, the test split to evaluate."""

import numpy as np

from lsexp.datasets.kinds import Reading, file_data
from lsexp.datasets.mnist_schema import SIDE, record_bytes, record_counts

MEAN, STD = 0.1307, 0.3081  # of the MNIST training images, as MindSpore's LeNet tutorial normalises


def mnist(path, image_size=32, num_classes=10, num_parallel_workers=1, cache="auto", cache_max_mb=1024, **_):
    counts = record_counts(str(path))

    def loader(usage, sampler):
        import mindspore.dataset as ds

        return ds.MnistDataset(
            str(path), usage=usage, sampler=sampler, shuffle=None if sampler is not None else False
        )

    def images():
        from mindspore.dataset import vision

        once = [vision.Resize((image_size, image_size))] if image_size != SIDE else []
        return once, [vision.Rescale(1.0 / (255 * STD), -MEAN / STD)]

    return file_data(
        loader,
        images,
        num_classes,
        ("train", np.arange(counts["train"])),
        ("test", np.arange(counts["test"])),
        Reading(cache=cache, cache_max_mb=cache_max_mb, record_bytes=record_bytes(str(path), image_size),
                num_parallel_workers=num_parallel_workers),
    )
