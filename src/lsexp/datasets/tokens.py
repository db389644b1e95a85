"""Token sequences held in memory as numpy, served through mindspore.dataset.GeneratorDataset."""

from __future__ import annotations

import numpy as np

from lsexp.datasets.kinds import Pipeline


class _Source:
    """Random access, so the epoch's SubsetSampler decides the order."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y = x, y

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)


def token_pipeline(x: np.ndarray, y: np.ndarray, n_train: int, num_classes: int, task: str,
                   reference_loss=None) -> Pipeline:
    source = _Source(x, y)

    def build(sampler):
        import mindspore as ms
        import mindspore.dataset as ds
        from mindspore.dataset import transforms

        dataset = ds.GeneratorDataset(source, column_names=["tokens", "label"], sampler=sampler,
                                      num_parallel_workers=1, python_multiprocessing=False)
        return dataset.map(
            [transforms.OneHot(num_classes), transforms.TypeCast(ms.float32)], input_columns="label"
        )

    ids = np.arange(len(x))
    return Pipeline(build, ids[:n_train], build, ids[n_train:], task=task, reference_loss=reference_loss)
