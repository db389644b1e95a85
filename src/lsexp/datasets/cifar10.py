"""CIFAR-10 through mindspore.dataset.Cifar10Dataset: the five training batches, and the test batch to
evaluate."""

import numpy as np

from lsexp.datasets.cifar10_schema import RECORDS, SIDE, TEST, TRAIN, batches_dir, record_bytes
from lsexp.datasets.kinds import Reading, file_data

# Per-channel mean and std of the CIFAR-10 training images.
MEAN = [0.4914 * 255, 0.4822 * 255, 0.4465 * 255]
STD = [0.2470 * 255, 0.2435 * 255, 0.2616 * 255]


def cifar10(
    path, image_size=32, num_classes=10, num_parallel_workers=1, cache="auto", cache_max_mb=1024, **_
):
    root = str(batches_dir(path))

    def loader(usage, sampler):
        import mindspore.dataset as ds

        return ds.Cifar10Dataset(
            root, usage=usage, sampler=sampler, shuffle=None if sampler is not None else False
        )

    def images():
        from mindspore.dataset import vision

        once = [vision.Resize((image_size, image_size))] if image_size != SIDE else []
        return once, [vision.Normalize(MEAN, STD)]

    return file_data(
        loader,
        images,
        num_classes,
        ("train", np.arange(len(TRAIN) * RECORDS)),
        ("test", np.arange(len(TEST) * RECORDS)),
        Reading(cache=cache, cache_max_mb=cache_max_mb, record_bytes=record_bytes(image_size),
                num_parallel_workers=num_parallel_workers),
    )
