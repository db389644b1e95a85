"""CIFAR-10 through mindspore.dataset.Cifar10Dataset: the five training batches, and the test batch to evaluate."""

import numpy as np

from lsexp.data import Pipeline
from lsexp.datasets.cifar10_schema import RECORDS, TEST, TRAIN, batches_dir

# Per-channel mean and std of the CIFAR-10 training images.
MEAN = [0.4914 * 255, 0.4822 * 255, 0.4465 * 255]
STD = [0.2470 * 255, 0.2435 * 255, 0.2616 * 255]


def cifar10(path, image_size=32, num_classes=10, num_parallel_workers=1, **_) -> Pipeline:
    root = str(batches_dir(path))

    def source(usage):
        def build(sampler):
            import mindspore as ms
            import mindspore.dataset as ds
            from mindspore.dataset import transforms, vision

            images = [vision.Resize((image_size, image_size))] if image_size != 32 else []
            images += [vision.Normalize(MEAN, STD), vision.HWC2CHW()]
            dataset = ds.Cifar10Dataset(root, usage=usage, sampler=sampler)
            dataset = dataset.map(images, input_columns="image", num_parallel_workers=num_parallel_workers)
            return dataset.map([transforms.OneHot(num_classes), transforms.TypeCast(ms.float32)],
                               input_columns="label")
        return build

    return Pipeline(source("train"), np.arange(len(TRAIN) * RECORDS), source("test"), np.arange(len(TEST) * RECORDS))
