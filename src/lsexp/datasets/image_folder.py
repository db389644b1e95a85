"""A folder of class folders through mindspore.dataset.ImageFolderDataset, decoded and resized; a
seeded val_fraction of the images is held out."""

import numpy as np

from lsexp.data import Pipeline
from lsexp.datasets.image_folder_schema import EXTENSIONS, scan


def image_folder(path, val_fraction=0.2, image_size=32, num_channel=3, num_classes=2, seed=1,
                 num_parallel_workers=1, **_) -> Pipeline:
    total = sum(n for _, n in scan(str(path)))
    order = np.random.default_rng(seed).permutation(total)
    n_val = int(round(total * val_fraction))

    def build(sampler):
        import mindspore as ms
        import mindspore.dataset as ds
        from mindspore.dataset import transforms, vision

        images = [vision.Resize((image_size, image_size))]
        if num_channel == 1:
            images += [vision.ConvertColor(vision.ConvertMode.COLOR_RGB2GRAY), lambda img: img[..., None]]
        images += [vision.Rescale(1.0 / 255, 0.0), vision.HWC2CHW()]
        dataset = ds.ImageFolderDataset(str(path), decode=True, extensions=EXTENSIONS, sampler=sampler)
        dataset = dataset.map(images, input_columns="image", num_parallel_workers=num_parallel_workers)
        return dataset.map([transforms.OneHot(num_classes), transforms.TypeCast(ms.float32)], input_columns="label")

    return Pipeline(build, np.sort(order[n_val:]), build, np.sort(order[:n_val]))
