"""What a `dataset` option becomes: batches in a seeded order, and a held-out split to evaluate on.

Three kinds, one contract:
- `Arrays`: numpy arrays in memory (the seed's synthetic data, scikit-learn's digits, a user's arrays);
  a few MB, where a pipeline's worker threads would only compete with the step for two cores.
- `Pipeline`: a `mindspore.dataset` pipeline (the built-in loaders, `GeneratorDataset`, `map`, `batch`)
  for real data, streamed so that no float32 copy of a whole data set is ever held.
- `Records`: a file data set's uint8 records, read once through its MindSpore loader
  (`dataset.cache`), each batch made from them by the transforms the pipeline would apply; for a small
  network the pipeline's per-row cost is a large part of the step.

In all, an epoch's sample order is `epoch_order(seed, epoch)`, applied as a `SubsetSampler` to the
pipeline's loader, so a run resumed mid-epoch sees exactly the batches an uninterrupted run would.
Labels are one-hot float32 (the seed's `SoftmaxCrossEntropyWithLogits(sparse=False)`), per sequence
or, for a language model, per position.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

CLASSIFY, LM = "classify", "lm"
MB = 2 ** 20
log = logging.getLogger("lsexp")


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)


def _epoch_slice(n: int, d, epoch: int, start: int, shard: Tuple[int, int]) -> np.ndarray:
    """The positions (into 0..n-1) of one epoch's samples, from batch `start` on. With data parallel
    (shard = (num_shards ranks, this rank's shard_id)), global step i takes the epoch's i-th run of
    num_shards batches and rank shard_id the shard_id-th batch of it: the ranks' batches together are
    the batch one process with num_shards times the batch size would take."""
    shards, shard = shard
    step = d.batch_size * shards
    stop = n - n % step if d.drop_remainder else n
    order = epoch_order(n, d.seed, epoch, d.shuffle)[start * step:stop]
    if shards == 1:
        return order
    whole = len(order) // step * step
    return order[:whole].reshape(-1, shards, d.batch_size)[:, shard].reshape(-1)


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    return np.eye(num_classes, dtype=np.float32)[labels]


@dataclass
class Arrays:
    x: np.ndarray  # (N, ...) model inputs
    y: np.ndarray  # float32 one-hot, (N, num_classes)
    x_val: Optional[np.ndarray] = None
    y_val: Optional[np.ndarray] = None  # int labels
    task: str = CLASSIFY
    reference_loss: Optional[float] = None
    cache = None  # dataset.cache's choice, for the data sets that have one

    @property
    def num_train(self) -> int:
        return len(self.x)

    @property
    def has_eval(self) -> bool:
        return self.x_val is not None

    def batches(
        self, d, epoch: int, start: int, shard: Tuple[int, int] = (1, 0)
    ) -> Iterator[Tuple[Any, Any]]:
        from mindspore import Tensor

        idx = _epoch_slice(len(self.x), d, epoch, start, shard)
        for lo in range(0, len(idx), d.batch_size):
            part = idx[lo : lo + d.batch_size]
            yield Tensor(self.x[part]), Tensor(self.y[part])

    def eval_batches(self, size: int) -> Iterator[Tuple[Any, np.ndarray]]:
        from mindspore import Tensor

        for lo in range(0, len(self.x_val), size):
            yield Tensor(self.x_val[lo : lo + size]), self.y_val[lo : lo + size]


@dataclass
class Pipeline:
    """`source(sampler)` is the unbatched, mapped pipeline over the records the sampler picks, with
    one-hot labels; `train_ids` / `eval_ids` are the records of each split."""

    source: Callable[[Any], Any]
    train_ids: np.ndarray
    eval_source: Optional[Callable[[Any], Any]] = None
    eval_ids: Optional[np.ndarray] = None
    task: str = CLASSIFY
    reference_loss: Optional[float] = None  # e.g. a text's unigram entropy, the loss to beat
    cache: Optional[str] = None  # "stream" where dataset.cache chose it

    @property
    def num_train(self) -> int:
        return len(self.train_ids)

    @property
    def has_eval(self) -> bool:
        return self.eval_source is not None and len(self.eval_ids) > 0

    def batches(
        self, d, epoch: int, start: int, shard: Tuple[int, int] = (1, 0)
    ) -> Iterator[Tuple[Any, Any]]:
        ids = self.train_ids[_epoch_slice(len(self.train_ids), d, epoch, start, shard)]
        if len(ids) == 0:
            return iter(())
        return _iterate(self.source, ids, d.batch_size, d.drop_remainder)

    def eval_batches(self, size: int) -> Iterator[Tuple[Any, np.ndarray]]:
        for x, y in _iterate(self.eval_source, self.eval_ids, size, False):
            yield x, y.asnumpy().argmax(axis=-1)


def _iterate(source, ids: np.ndarray, batch_size: int, drop_remainder: bool):
    import mindspore.dataset as ds

    dataset = source(ds.SubsetSampler(ids.tolist())).batch(batch_size, drop_remainder=drop_remainder)
    # A fresh one-epoch iterator per epoch: the sampler carries that epoch's order. Tensors, not
    # numpy, so the step takes the batch without another copy.
    return dataset.create_tuple_iterator(num_epochs=1, output_numpy=False, do_copy=False)


Split = Tuple[
    Optional[str], np.ndarray
]  # a loader's usage ("train", "test"; None: it has one) and record ids


@dataclass(frozen=True)
class Reading:
    """How a file data set is read: dataset.cache and cache_max_mb, what its records take in memory
    (record_bytes, known from the files' sizes and headers before anything is read), and the loader's
    workers."""

    cache: str
    cache_max_mb: int
    record_bytes: int
    num_parallel_workers: int = 1


def file_data(
    loader: Callable[[Optional[str], Any], Any],
    images: Callable[[], Tuple[List, List]],
    num_classes: int,
    train: Split,
    evaluate: Split,
    reading: Reading,
):
    """A data set that one of MindSpore's loaders reads: streamed as a Pipeline, or, as dataset.cache
    chooses, read once into Records. The decision takes reading.record_bytes.

    loader(usage, sampler) is the loader over one split (sampler None: its records in file order).
    images() gives the per-sample image transforms as (once, each); the pipeline maps
    once + each + HWC2CHW on every sample. `once` must be uint8 to uint8 and deterministic (Resize,
    ConvertColor), so Records apply it while reading and keep uint8; `each` (Rescale, Normalize)
    must map each channel's uint8 value on its own, so Records make a batch through a table of what
    those very objects make of every value, and the batches are the pipeline's bit for bit.
    """
    cache, cache_max_mb, workers = reading.cache, reading.cache_max_mb, reading.num_parallel_workers
    fits = reading.record_bytes <= cache_max_mb * MB
    chosen = ("memory" if fits else "stream") if cache == "auto" else cache
    why = f", {'under' if fits else 'over'} dataset.cache_max_mb={cache_max_mb}" if cache == "auto" else ""
    how = "read once into memory" if chosen == "memory" else "streamed from the files every epoch"
    log.info("dataset.cache=%s: %.1f MB of uint8 records%s: %s", cache, reading.record_bytes / MB, why, how)
    if chosen == "memory":
        return Records(
            lambda usage: _read(loader(usage, None), images()[0], workers),
            lambda: images()[1],
            num_classes,
            train,
            evaluate,
        )

    def source(usage):
        def build(sampler):
            import mindspore as ms
            from mindspore.dataset import transforms, vision

            once, each = images()
            dataset = loader(usage, sampler)
            dataset = dataset.map(
                once + each + [vision.HWC2CHW()],
                input_columns="image",
                num_parallel_workers=workers,
            )
            return dataset.map(
                [transforms.OneHot(num_classes), transforms.TypeCast(ms.float32)], input_columns="label"
            )

        return build

    return Pipeline(source(train[0]), train[1], source(evaluate[0]), evaluate[1], cache="stream")


READ_ROWS = 1024  # rows per batch while reading: few enough that MindSpore's queues stay small


def _read(dataset, once: List, num_parallel_workers: int) -> Tuple[np.ndarray, np.ndarray]:
    """A loader's (image, label) records, through `once`, into two arrays of the loader's dtypes."""
    if once:
        dataset = dataset.map(once, input_columns="image", num_parallel_workers=num_parallel_workers)
    n = dataset.get_dataset_size()
    images = labels = None
    lo = 0
    # Filled in place: concatenating the read batches would hold the set twice at the peak.
    for x, y in dataset.batch(READ_ROWS).create_tuple_iterator(num_epochs=1, output_numpy=True):
        if images is None:
            images, labels = np.empty((n, *x.shape[1:]), x.dtype), np.empty(n, y.dtype)
        images[lo : lo + len(x)], labels[lo : lo + len(y)] = x, y
        lo += len(x)
    return images, labels


def _lookup_table(each: List, channels: int) -> np.ndarray:
    """(channels, 256): what the transforms make of each uint8 value in each channel. They map a
    channel's value to a float32 whatever the rest of the image holds (Rescale, Normalize), so their
    own outputs on all 256 values are the whole transform: a lookup gives their results bit for bit,
    at a fraction of the cost of calling them on a batch beside MindSpore's runtime threads."""
    every = np.repeat(np.arange(256, dtype=np.uint8)[:, None], channels, axis=1).reshape(16, 16, channels)
    for op in each:
        every = op(every)
    return np.ascontiguousarray(np.asarray(every).reshape(256, channels).T)


class Records:
    """A file data set's records as its loader gives them (uint8 <N, H, W, C> images, integer labels),
    read on first use; each batch is the pipeline's, in the order its SubsetSampler would take them."""

    task = CLASSIFY
    reference_loss = None
    cache = "memory"

    def __init__(
        self,
        read: Callable[[Optional[str]], Tuple[np.ndarray, np.ndarray]],
        each: Callable[[], List],
        num_classes: int,
        train: Split,
        evaluate: Split,
    ):
        self._read, self._each_ops, self._eye = read, each, np.eye(num_classes, dtype=np.float32)
        (self.train_usage, self.train_ids), (self.eval_usage, self.eval_ids) = train, evaluate
        self._records: Dict[Optional[str], Tuple[np.ndarray, np.ndarray]] = {}
        self._table: Optional[np.ndarray] = None

    @property
    def num_train(self) -> int:
        return len(self.train_ids)

    @property
    def has_eval(self) -> bool:
        return self.eval_ids is not None and len(self.eval_ids) > 0

    def records(self, usage: Optional[str]) -> Tuple[np.ndarray, np.ndarray]:
        if usage not in self._records:  # a split read once serves both train and eval when they share it
            self._records[usage] = self._read(usage)
        return self._records[usage]

    def _images(self, batch: np.ndarray) -> np.ndarray:
        """The batch as the pipeline's `each` transforms and HWC2CHW would make it, by lookup."""
        n, h, w, c = batch.shape
        if self._table is None:
            self._table = _lookup_table(self._each_ops(), c)
        if c == 1:
            return self._table[0].take(batch.reshape(n, 1, h, w))
        out = np.empty((n, c, h, w), self._table.dtype)
        for ch in range(c):  # a channel at a time, HWC2CHW falls out of the lookup
            np.take(self._table[ch], batch[..., ch], out=out[:, ch], mode="wrap")
        return out

    def batches(
        self, d, epoch: int, start: int, shard: Tuple[int, int] = (1, 0)
    ) -> Iterator[Tuple[Any, Any]]:
        from mindspore import Tensor

        images, labels = self.records(self.train_usage)
        ids = self.train_ids[_epoch_slice(len(self.train_ids), d, epoch, start, shard)]
        for lo in range(0, len(ids), d.batch_size):
            part = ids[lo : lo + d.batch_size]
            # from_numpy shares the batch's fresh arrays: no copy, as the pipeline's do_copy=False
            yield Tensor.from_numpy(self._images(images[part])), Tensor.from_numpy(self._eye[labels[part]])

    def eval_batches(self, size: int) -> Iterator[Tuple[Any, np.ndarray]]:
        from mindspore import Tensor

        images, labels = self.records(self.eval_usage)
        for lo in range(0, len(self.eval_ids), size):
            part = self.eval_ids[lo : lo + size]
            yield Tensor.from_numpy(self._images(images[part])), labels[part].astype(np.int64)


class UserPipeline:
    """A `mindspore.dataset.Dataset` from a user's `dataset._target_`: (data, int label) per sample,
    in the order the user's own sampler gives; lsexp adds the one-hot labels and the batching."""

    task = CLASSIFY
    reference_loss = None
    cache = None

    def __init__(self, train, evaluate, num_classes: int):
        self.train, self.evaluate, self.num_classes = train, evaluate, num_classes
        self._batched = {}  # one chain per source and batch size: a pipeline node takes one consumer

    @property
    def num_train(self) -> int:
        return self.train.get_dataset_size()

    @property
    def has_eval(self) -> bool:
        return self.evaluate is not None

    def _chain(self, dataset, batch_size: int, drop_remainder: bool):
        key = (id(dataset), batch_size, drop_remainder)
        if key not in self._batched:
            import mindspore as ms
            from mindspore.dataset import transforms

            label = dataset.get_col_names()[-1]
            self._batched[key] = dataset.map(
                [transforms.OneHot(self.num_classes), transforms.TypeCast(ms.float32)], input_columns=label
            ).batch(batch_size, drop_remainder=drop_remainder)
        return self._batched[key]

    def batches(self, d, epoch: int, start: int, shard: Tuple[int, int] = (1, 0)):
        batches = self._chain(self.train, d.batch_size, d.drop_remainder)
        iterator = batches.create_tuple_iterator(num_epochs=1, output_numpy=False, do_copy=False)
        for _ in range(start):  # a resumed run skips the batches it has trained on
            next(iterator)
        return iterator

    def eval_batches(self, size: int):
        for x, y in self._chain(self.evaluate, size, False).create_tuple_iterator(
            num_epochs=1, output_numpy=False
        ):
            yield x, y.asnumpy().argmax(axis=-1)


def as_data(obj, d):
    """What a dataset `_target_` returned, as one of the kinds above: lsexp's own kinds pass through;
    a user's (x, y) or (x, y, x_val, y_val) int-labelled arrays become Arrays; a Dataset, or a
    (train, eval) pair of them, becomes a UserPipeline."""
    if isinstance(obj, (Arrays, Pipeline, Records, UserPipeline)):
        return obj
    import mindspore.dataset as ds

    if isinstance(obj, ds.Dataset):
        return UserPipeline(obj, None, d.num_classes)
    if isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(o, ds.Dataset) for o in obj):
        return UserPipeline(obj[0], obj[1], d.num_classes)
    if isinstance(obj, tuple) and len(obj) in (2, 4):
        x, y = np.asarray(obj[0], dtype=np.float32), np.asarray(obj[1])
        val = (
            (np.asarray(obj[2], dtype=np.float32), np.asarray(obj[3]).astype(np.int32))
            if len(obj) == 4
            else (None, None)
        )
        return Arrays(x, one_hot(y.astype(np.int64), d.num_classes), *val)
    raise TypeError(
        f"dataset._target_={d._target_} returned {type(obj).__name__}; return numpy arrays "
        f"(x, y) or (x, y, x_val, y_val), or a mindspore.dataset.Dataset (or a (train, eval) pair)"
    )
