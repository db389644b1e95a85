"""MNIST through mindspore.dataset.MnistDataset: the train split to train on, the test split to evaluate."""

import numpy as np

from lsexp.data import Pipeline
from lsexp.datasets.mnist_schema import SIDE, _counts

MEAN, STD = 0.1307, 0.3081  # of the MNIST training images, as MindSpore's LeNet tutorial normalises


def mnist(path, image_size=32, num_classes=10, num_parallel_workers=1, **_) -> Pipeline:
    counts = _counts(str(path))

    def source(usage):
        def build(sampler):
            import mindspore as ms
            import mindspore.dataset as ds
            from mindspore.dataset import transforms, vision

            images = [vision.Resize((image_size, image_size))] if image_size != SIDE else []
            images += [vision.Rescale(1.0 / (255 * STD), -MEAN / STD), vision.HWC2CHW()]
            dataset = ds.MnistDataset(str(path), usage=usage, sampler=sampler)
            dataset = dataset.map(images, input_columns="image", num_parallel_workers=num_parallel_workers)
            return dataset.map([transforms.OneHot(num_classes), transforms.TypeCast(ms.float32)],
                               input_columns="label")
        return build

    return Pipeline(source("train"), np.arange(counts["train"]), source("test"), np.arange(counts["test"]))
