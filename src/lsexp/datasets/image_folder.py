"""A folder of class folders through mindspore.dataset.ImageFolderDataset, decoded and resized; a
seeded val_fraction of the images is held out."""

import numpy as np

from lsexp.datasets.image_folder_schema import EXTENSIONS, record_bytes, scan
from lsexp.datasets.kinds import Reading, file_data


def _add_channel(img):
    return img[..., None]  # ConvertColor to gray drops the channel axis; HWC2CHW wants it


def image_folder(path, val_fraction=0.2, image_size=32, num_channel=3, num_classes=2, seed=1,
                 num_parallel_workers=1, cache="auto", cache_max_mb=1024, **_):
    total = sum(n for _, n in scan(str(path)))
    order = np.random.default_rng(seed).permutation(total)
    n_val = int(round(total * val_fraction))

    def loader(usage, sampler):
        import mindspore.dataset as ds

        return ds.ImageFolderDataset(str(path), decode=True, extensions=EXTENSIONS, sampler=sampler,
                                     shuffle=None if sampler is not None else False)

    def images():
        from mindspore.dataset import vision

        # Images come in any size: resized (and grayed) per sample, so records in memory stack.
        once = [vision.Resize((image_size, image_size))]
        if num_channel == 1:
            once += [vision.ConvertColor(vision.ConvertMode.COLOR_RGB2GRAY), _add_channel]
        return once, [vision.Rescale(1.0 / 255, 0.0)]

    # One loader holds both splits (usage None): its records, read once, serve training and evaluation.
    return file_data(
        loader,
        images,
        num_classes,
        (None, np.sort(order[n_val:])),
        (None, np.sort(order[:n_val])),
        Reading(cache=cache, cache_max_mb=cache_max_mb,
                record_bytes=record_bytes(str(path), image_size, num_channel),
                num_parallel_workers=num_parallel_workers),
    )
